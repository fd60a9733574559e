"""Our Llama against transformers' on tiny random models; loaders; per-row positions."""


import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashspec_torch.model import LlamaConfig  # noqa: E402
from flashspec_torch.weights import from_transformers, load, load_directory  # noqa: E402


def tiny_hf(rope_scaling=None, tie=False, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=tie,
        rope_parameters=rope, eos_token_id=2, bos_token_id=1,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kw", [{}, {"rope_scaling": True}, {"tie": True}, {"kv_heads": 4}, {"kv_heads": 1}])
def test_logits_match_transformers(kw):
    hf = tiny_hf(**kw)
    ours = from_transformers(hf).model
    ids = torch.randint(0, 97, (2, 150))
    with torch.no_grad():
        want = hf(ids).logits
    got = ours(ids, torch.arange(150).expand(2, -1), ours.new_cache(2, 160), 150)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_incremental_decoding_with_per_row_positions():
    """Rows at different lengths continue from their own positions; stale cache slots never leak."""
    hf = tiny_hf(seed=1)
    m = from_transformers(hf).model
    a, b = torch.randint(0, 97, (1, 30)), torch.randint(0, 97, (1, 30))
    with torch.no_grad():
        want_a = hf(a).logits[0, 20:25]
        want_b = hf(b).logits[0, 12:17]
    cache = m.new_cache(2, 64)
    tokens = torch.cat([a[:, :20], b[:, :20]])
    m(tokens, torch.arange(20).expand(2, -1), cache, 20, logits_last=0)  # row b's slots 12-19 now stale
    step = torch.stack([a[0, 20:25], b[0, 12:17]])
    pos = torch.stack([torch.arange(20, 25), torch.arange(12, 17)])
    got = m(step, pos, cache, 25)
    torch.testing.assert_close(got[0], want_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want_b, rtol=1e-4, atol=1e-4)


def test_load_directory_roundtrip(tmp_path):
    hf = tiny_hf(seed=2)
    hf.save_pretrained(tmp_path)
    loaded = load(str(tmp_path))
    assert loaded.tokenizer is None  # a bare model directory is enough for a draft
    m = loaded.model
    ids = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        want = hf(ids).logits
    torch.testing.assert_close(m(ids, torch.arange(40)[None], m.new_cache(1, 40), 40), want, rtol=1e-4, atol=1e-4)


def test_corrupt_or_missing_model_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_directory(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_directory(tmp_path)
    hf = tiny_hf()
    hf.config.to_json_file(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_directory(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="corrupt"):
        load_directory(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither"):
        load(str(tmp_path / "nothing-here"))


def test_config_validation():
    with pytest.raises(ValueError, match="num_kv_heads"):
        LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="model_type"):
        LlamaConfig.from_hf({"model_type": "gpt2"})
