"""Tiny random transformers models of every supported family, for the parity tests and the README
table (tests/*/test_families*.py, benchmarks/families_table.py). Needs torch and transformers,
imported when called.

Each family's case sets the features that make it that family (Mistral's sliding window, Gemma's
soft-capping and sliding / global layers, ...) at sizes small enough that prompt + 64 new tokens
cross the windows. Every weight is random (biases and norms too: transformers initialises those to
constants, which would hide a dropped bias), and the tokenizer is a byte-level one of 256 tokens.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 256
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
CASES = {  # model_type -> the config fields of its tiny case beyond TINY
    "llama": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(sliding_window=16),
    "qwen2": dict(),
    "qwen3": dict(),
    "gemma2": dict(sliding_window=16, query_pre_attn_scalar=32, attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "gemma3_text": dict(sliding_window=16, query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "phi3": dict(),
}
PROMPT = "The quick brown fox"  # 19 byte tokens: with 64 new ones, past the 16-token windows


def hf_config(model_type: str, **fields):
    """A transformers config of ``model_type``: TINY, the family's case, then ``fields``."""
    from transformers import AutoConfig

    kwargs = {**TINY, **CASES[model_type], **fields}
    if model_type in ("gemma2", "gemma3_text"):
        kwargs["pad_token_id"] = 0  # Gemma's embedding has a padding row
    return AutoConfig.for_model(model_type, **kwargs)


def randomize(model, std: float = 0.1, seed: int = 0):
    """Every parameter random: matrices N(0, std); norm weights N(1, std) (N(0, std) where the norm adds 1)."""
    import torch

    offset = model.config.model_type.startswith("gemma")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            mean = 1.0 if "norm" in name and not offset else 0.0
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    return model


def hf_model(model_type: str, seed: int = 0, **fields):
    """A tiny random transformers causal LM (float32, eager attention, eval mode)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model_type, **fields)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return randomize(model, seed=seed).eval()


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges: one token per byte, ids 0-255."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def save_case(model_type: str, path: Path, seed: int = 0, **fields):
    """Save the tiny model and the byte tokenizer to ``path``; returns the transformers model."""
    model = hf_model(model_type, seed, **fields)
    model.save_pretrained(str(path))
    byte_tokenizer().save_pretrained(str(path))
    return model


def hf_greedy(model, ids: list[int], new: int = 64) -> list[int]:
    """transformers' greedy continuation of ``ids`` (``generate(do_sample=False)``), new tokens only."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def engine_logits(engine, ids: list[int]) -> "np.ndarray":  # [T, V] float32: the engine's target on ids
    import numpy as np

    model, t = engine.target.model, len(ids)
    if engine.backend_name == "torch":
        import torch

        dev = model.embed.weight.device
        with torch.inference_mode():
            z = model(torch.tensor([ids], device=dev), torch.arange(t, device=dev)[None], model.new_cache(1, t), t)
        return z[0].cpu().numpy()
    z, _ = model(np.asarray([ids]), np.arange(t)[None], model.new_cache(1, t))
    return np.asarray(z[0])


def parity(model_type: str, backend: str, path: Path, hf, new: int = 64, device: str = "cpu") -> dict:
    """FlashSpec (``backend``, the model directory ``path``) against transformers' ``hf`` of the same
    weights: max |logits difference| over the prompt + ``new`` tokens of transformers' greedy
    continuation, and whether greedy decoding, and greedy speculation with the n-gram draft (and,
    for torch, a layer-skipping draft), give transformers' ``new`` tokens. The engine runs in float32 on
    ``device`` (on a GPU: its default path, CUDA graphs included); transformers on the CPU."""
    import numpy as np
    import torch

    from .engine import engine_class

    drafts = ("ngram", "layerskip:1") if backend == "torch" else ("ngram",)
    dtype = torch.float32 if backend == "torch" else "float32"  # jnp.dtype accepts the name
    engine = engine_class(backend)(str(path), drafts, policy="thompson-token", device=device, dtype=dtype)
    ids = engine.encode(PROMPT, chat=False)
    want = hf_greedy(hf, ids, new)
    with torch.no_grad():
        ref = hf(torch.tensor([ids + want])).logits[0].numpy()
    err = float(np.abs(engine_logits(engine, ids + want) - ref).max())
    common = dict(temperature=0.0, max_new_tokens=new, chat=False)
    plain = engine.generate(PROMPT, speculation=False, **common)
    spec = engine.generate(PROMPT, speculation=True, gamma=4, **common)
    return {"family": model_type, "backend": backend, "logits_max_error": err, "greedy_identical": plain["tokens"] == want,
            "speculation_identical": spec["tokens"] == want, "drafts": list(drafts),
            "accepted_per_step": spec["steps"] and (new - spec["steps"]) / spec["steps"]}
