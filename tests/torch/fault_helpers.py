"""A tiny random Llama with a character tokenizer, wrapped as an Engine target, and NaN poisoning."""

import copy

import torch

from flashspec_torch.model import Llama, LlamaConfig
from flashspec_torch.weights import LoadedModel

VOCAB = 64


class CharTokenizer:
    """Just what Engine uses of a transformers tokenizer: ids 4..63 for printable characters."""

    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [4 + (ord(c) - 32) % (VOCAB - 4) for c in text]}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) -> str:
        return "".join(chr(32 + (i - 4) % (VOCAB - 4)) for i in ids if i >= 4)


def tiny_target(seed: int = 0) -> LoadedModel:
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, tie_word_embeddings=False, max_position_embeddings=256)
    torch.manual_seed(seed)
    m = Llama(cfg).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.4)
    return LoadedModel(m, CharTokenizer(), "tiny")


def poisoned(loaded: LoadedModel, token: int) -> LoadedModel:
    """A copy whose embedding of ``token`` is NaN: logits turn NaN once the model is fed that token
    (the embeddings are untied, so the logit of ``token`` itself stays finite before that)."""
    bad = copy.deepcopy(loaded)
    bad.model.embed.weight[token] = float("nan")
    return bad


def first_new_token(tokens: list[int], prompt_ids: list[int], at_least: int) -> int:
    """The index of the first generated token at or after ``at_least`` that did not occur before."""
    for k in range(at_least, len(tokens)):
        if tokens[k] not in prompt_ids and tokens[k] not in tokens[:k]:
            return k
    raise AssertionError(f"no new token after index {at_least} in {tokens}")
