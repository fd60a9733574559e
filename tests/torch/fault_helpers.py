"""A tiny random Llama with a character tokenizer, wrapped as an Engine target, and NaN poisoning."""

import copy

import torch

from flashspec_torch.model import Llama, LlamaConfig
from flashspec_torch.weights import LoadedModel

from serving_checks import VOCAB, CharTokenizer  # noqa: F401  (re-exported: the torch tests import it here)


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
