"""GGUF files of every supported family (flashspec.gguf_cases: written as llama.cpp's converter writes
them, from the tiny transformers models of flashspec.family_cases).

(a) transformers 5.17 loads each file and gives the logits of the original model with the fields its
GGUF reader drops reset to what it assumes instead (TRANSFORMERS_DROPS): the file follows the
conventions transformers shares with llama.cpp. (b) FlashSpec's torch engine loads it and gives the
original's fp32 logits within 1e-4 and its greedy tokens with and without speculation; the JAX engine
likewise on two families only, the GGUF reading being shared NumPy code (flashspec.gguf_read) that the
torch tests cover for all: llama (rope_freqs, un-permuted q/k) and gemma3 (norms, window pattern, two
RoPE bases). Its per-family forward is tested from HF directories in tests/jax/test_jax_families.py,
and the JAX engine costs 4-8 s a family here. 24 new tokens keep the file cheap (prompt of 19 tokens: past
the 16-token windows). Unknown metadata keys and tensors are refused naming them.
"""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from flashspec.family_cases import CASES, hf_model, parity  # noqa: E402
from flashspec.gguf_cases import GGUF_FIELDS, save_gguf_case  # noqa: E402

NEW = 24
# fields transformers' GGUF reader does not read, and the values its config classes assume instead
TRANSFORMERS_DROPS = {
    "llama": dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),  # rope_freqs
    "mistral": dict(sliding_window=None),  # llama.attention.sliding_window
    "gemma2": dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256),
    "gemma3_text": dict(query_pre_attn_scalar=256, layer_types=None, rope_parameters=None),  # pattern, scaling
    "phi3": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),  # rope_factors_*
}
JAX_FAMILIES = ("llama", "gemma3_text")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return root, {m: (root / f"{m}.gguf", save_gguf_case(m, root / f"{m}.gguf")) for m in CASES}


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path_factory.getbasetemp() / "gguf-cache"))


@pytest.mark.parametrize("model_type", list(CASES))
def test_transformers_reads_the_file(files, model_type):
    from transformers import AutoModelForCausalLM

    root, cases = files
    path, _ = cases[model_type]
    loaded = AutoModelForCausalLM.from_pretrained(str(root), gguf_file=path.name, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    ref = hf_model(model_type, **{**GGUF_FIELDS.get(model_type, {}), **TRANSFORMERS_DROPS.get(model_type, {})})
    ids = torch.arange(40)[None]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref(ids).logits)


@pytest.mark.parametrize("model_type", list(CASES))
def test_torch_engine_reads_the_file(files, model_type):
    path, hf = files[1][model_type]
    row = parity(model_type, "torch", path, hf, new=NEW)
    assert row["logits_max_error"] < 1e-4, row
    assert row["greedy_identical"] and row["speculation_identical"], row


@pytest.mark.parametrize("model_type", JAX_FAMILIES)
def test_jax_engine_reads_the_file(files, model_type):
    pytest.importorskip("jax")
    path, hf = files[1][model_type]
    row = parity(model_type, "jax", path, hf, new=NEW)
    assert row["logits_max_error"] < 1e-4, row
    assert row["greedy_identical"] and row["speculation_identical"], row


def test_unknown_metadata_and_tensors_are_refused():
    from flashspec import gguf_read

    base = {"general.architecture": "qwen2", "qwen2.block_count": 2, "qwen2.embedding_length": 64,
            "qwen2.attention.head_count": 4, "qwen2.context_length": 64}
    assert gguf_read.config_dict(base, set(), {})["model_type"] == "qwen2"
    for key, value in (("qwen2.attn_logit_softcapping", 5.0), ("qwen2.rope.dimension_count", 8),
                       ("qwen2.rope.scaling.type", "yarn"), ("qwen2.expert_count", 8), ("qwen2.new_feature", 1),
                       ("qwen2.attention.sliding_window", 16)):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            gguf_read.config_dict({**base, key: value}, set(), {})
    with pytest.raises(ValueError, match="general.architecture='gpt2'"):
        gguf_read.config_dict({**base, "general.architecture": "gpt2"}, set(), {})
    with pytest.raises(ValueError, match=r"blk\.0\.attn_qkv\.weight"):
        gguf_read.hf_name("blk.0.attn_qkv.weight", "qwen2")  # fused qkv is Phi-3's
    with pytest.raises(ValueError, match="rope_factors_long"):
        gguf_read.hf_name("rope_factors_long.weight", "llama")
    with pytest.raises(ValueError, match="rope_freqs"):
        gguf_read.hf_name("rope_freqs.weight", "qwen2")
    gemma = {"general.architecture": "gemma2", "gemma2.block_count": 46, "gemma2.embedding_length": 4608,
             "gemma2.attention.head_count": 32, "gemma2.attention.key_length": 128}
    c = gguf_read.config_dict(gemma, set(), {})  # llama.cpp's 27B rule and soft-capping defaults
    assert (c["query_pre_attn_scalar"], c["attn_logit_softcapping"], c["final_logit_softcapping"]) == (144, 50.0, 30.0)
    assert gguf_read.config_dict({**gemma, "gemma2.block_count": 42}, set(), {})["query_pre_attn_scalar"] == 128
    assert gguf_read.hf_name("blk.1.ffn_norm.weight", "gemma2") == "model.layers.1.pre_feedforward_layernorm.weight"
    assert gguf_read.hf_name("blk.1.ffn_up.weight", "phi3") == "model.layers.1.mlp.gate_up_proj.weight"
