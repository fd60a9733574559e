"""The real drafts: NF4 (as draft and as target), layer-skip's default, other models sharing the
tokenizer (model directories, transformers objects, other architectures), and their errors."""

import sys

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.testing import chi_square_test
from torch_helpers import next_token_law

PROMPTS = ["def fibonacci(n):", "The capital of France is", "Give me three tips for better sleep.",
           "import os\nimport sys\n\ndef main():"]
GREEDY = dict(temperature=0.0, max_new_tokens=12, chat=False)


@pytest.fixture(scope="module")
def target():
    from flashspec_torch.weights import load

    return load(None)


def tiny_llama(vocab: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab: int, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=512)).eval()


def assert_greedy_exact(engine, prompts=PROMPTS):
    plain = engine.generate(prompts, speculation=False, **GREEDY)
    spec = engine.generate(prompts, speculation=True, gamma=3, **GREEDY)
    for prompt, a, b in zip(prompts, plain["tokens"], spec["tokens"]):
        assert a == b, f"{prompt!r}: speculative {b} != autoregressive {a}"
    return spec


# -- NF4


def test_nf4_linear_equals_its_dequantized_reference():
    from flashspec_torch.nf4 import NF4Linear

    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(128, 96, bias=False)
    lin.weight.data = torch.randn(96, 128, generator=g)
    q = NF4Linear(lin)
    x = torch.randn(3, 5, 128, generator=g)
    ref = torch.nn.functional.linear(x, q.dequantized())
    torch.testing.assert_close(q(x), ref, rtol=1e-5, atol=1e-5)
    w = q.dequantized()
    assert not torch.equal(w, lin.weight)  # really quantized: 16 levels per block
    err = (w - lin.weight).abs() / lin.weight.abs().amax(1, keepdim=True)
    assert err.max() < 0.2 and err.mean() < 0.06


def test_nf4_model_logits_are_close_to_fp32(target):
    """Measured on this text: mean |z_nf4 - z| = 0.26 standard deviations of the
    fp32 logits, the argmaxes agree at 80% of positions, mean KL(p || p_nf4) = 0.23 nats. A
    135M-parameter model loses more to 4 bits than a large one; the bounds leave some room."""
    from flashspec_torch.nf4 import dequantize_nf4, is_nf4, quantize_nf4

    m = target.model
    q = quantize_nf4(m)
    assert is_nf4(q) and not is_nf4(m) and q.embed is m.embed  # the copy shares what it keeps in fp32
    assert q.rope_tables(m.embed.weight) is m.rope_tables(m.embed.weight)  # and the RoPE tables
    text = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
            "The quick brown fox jumps over the lazy dog. Photosynthesis is the process by which plants")
    ids = torch.tensor([target.tokenizer(text)["input_ids"]])
    t = ids.shape[1]
    pos = torch.arange(t)[None]
    with torch.inference_mode():
        z = m(ids, pos, m.new_cache(1, t), t)[0]
        zq = q(ids, pos, q.new_cache(1, t), t)[0]
        zr = dequantize_nf4(q)(ids, pos, m.new_cache(1, t), t)[0]
    torch.testing.assert_close(zq, zr, rtol=1e-4, atol=1e-3)  # bitsandbytes == the plain reference
    rel = ((zq - z).abs().mean() / z.std()).item()
    agree = (zq.argmax(-1) == z.argmax(-1)).float().mean().item()
    lp, lq = z.log_softmax(-1), zq.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
    print(f"NF4 vs fp32: mean abs error / std = {rel:.3f}, argmax agreement = {agree:.3f}, KL = {kl:.3f}")
    assert 0 < rel < 0.35 and agree > 0.65 and kl < 0.4


@pytest.fixture(scope="module")
def nf4_engine(target):
    from flashspec_torch.engine import Engine

    return Engine(target, ("nf4", "ngram"), policy="thompson-token", device="cpu")


def test_nf4_draft_is_exact_under_greedy(nf4_engine):
    spec = assert_greedy_exact(nf4_engine, PROMPTS[:2])
    assert set(spec["arm_pulls"]) == {"nf4", "ngram"}


def test_nf4_target_is_exact_under_greedy(target, nf4_engine):
    """--target nf4: the NF4 model is the target; speculation reproduces ITS greedy output."""
    from flashspec_torch.engine import Engine
    from flashspec_torch.nf4 import is_nf4
    from flashspec_torch.weights import LoadedModel

    nf4 = nf4_engine.drafts[0].model
    eng = Engine(LoadedModel(nf4, target.tokenizer, "nf4"), ("nf4", "ngram", "layerskip"), device="cpu")
    assert is_nf4(eng.target.model) and eng.drafts[0].model is nf4  # already NF4: the draft is the target
    spec = assert_greedy_exact(eng, PROMPTS[:2])
    fp32 = Engine(target, ("ngram",), device="cpu").generate(PROMPTS[:2], speculation=False, **GREEDY)
    assert spec["tokens"] != fp32["tokens"]  # it really decoded with the NF4 model


def test_target_nf4_spelling(monkeypatch, target):
    from flashspec_torch import engine as engine_module
    from flashspec_torch.nf4 import is_nf4

    monkeypatch.setattr(engine_module, "load", lambda spec, dtype, device: target if spec is None else None)
    loaded = engine_module.load_target("nf4", torch.float32, "cpu")
    assert is_nf4(loaded.model) and loaded.tokenizer is target.tokenizer and "nf4" in loaded.name


def test_missing_bitsandbytes_names_the_extra(monkeypatch, target):
    from flashspec_torch.nf4 import quantize_nf4

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ImportError, match=r"flashspec\[torch\]"):
        quantize_nf4(target.model)


# -- layer skip


def test_layerskip_without_argument_is_the_searched_default(target):
    from flashspec_torch.engine import Engine

    eng = Engine(target, ("layerskip",), policy="fixed", device="cpu")
    assert eng.drafts[0].skip == {25}  # benchmarks/results/drafts_layerskip_search.json
    assert 0 < len(eng.drafts[0].skip) < target.model.config.num_layers
    assert_greedy_exact(eng, PROMPTS[:2])


# -- other models sharing the tokenizer


def test_model_directory_and_transformers_object_drafts_are_exact(target, tmp_path):
    from flashspec_torch.engine import Engine

    hf = tiny_llama(target.model.config.vocab_size)
    hf.save_pretrained(tmp_path / "tiny")
    eng = Engine(target, (str(tmp_path / "tiny"), hf), policy="thompson-token", device="cpu")
    spec = assert_greedy_exact(eng, PROMPTS[:2])
    assert sum(spec["arm_pulls"].values()) == spec["steps"]


def test_a_gguf_file_draft(target):
    """The embedded GGUF itself as a draft: the same weights, so greedy drafts are all accepted."""
    from flashspec_torch.engine import Engine
    from flashspec.weights import embedded_gguf

    eng = Engine(target, (str(embedded_gguf()),), policy="fixed", device="cpu")
    assert eng.drafts[0].model is not target.model
    spec = assert_greedy_exact(eng, PROMPTS[:1])
    assert spec["acceptance"] == 1.0


def test_other_architectures_draft_through_transformers(target, tmp_path):
    from flashspec_torch.drafts import TransformersDraft
    from flashspec_torch.engine import Engine

    gpt2 = tiny_gpt2(target.model.config.vocab_size)
    gpt2.save_pretrained(tmp_path / "gpt2")
    eng = Engine(target, (str(tmp_path / "gpt2"), gpt2), policy="thompson-token", device="cpu")
    assert all(isinstance(d, TransformersDraft) for d in eng.drafts)
    assert_greedy_exact(eng, PROMPTS[:3])  # rows of different lengths in one batch


def test_a_random_draft_keeps_the_target_distribution():
    """q far from p (a random transformers model as the draft): the first emitted token still follows the
    target. On the tiny random target (tests/torch/fault_helpers.py), the same engine and model-draft code
    as the embedded model's (the tests above draft for it), 400 rows."""
    from fault_helpers import tiny_target

    from flashspec_torch.engine import Engine

    prompt, n = "The capital of France is", 400
    sampling = SamplingConfig(temperature=1.0, top_k=8)
    tiny = tiny_target(seed=3)
    eng = Engine(tiny, (tiny_llama(tiny.model.config.vocab_size, seed=3),), policy="fixed", device="cpu")
    p = next_token_law(tiny.model, eng.encode(prompt, chat=False), sampling)
    out = eng.generate([prompt] * n, seed=list(range(n)), temperature=1.0, top_k=8, max_new_tokens=1, gamma=2, chat=False)
    first = np.array([t[0] for t in out["tokens"]])
    _, p_value, note = chi_square_test(np.bincount(first, minlength=p.size), p)
    assert p_value > 1e-3, note


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_a_different_vocabulary_is_a_clear_error(target, tmp_path, make):
    from flashspec_torch.engine import Engine

    other = make(1000)
    other.save_pretrained(tmp_path / "other")
    eng = Engine(target, ("ngram",), device="cpu")
    for spec in (str(tmp_path / "other"), other):
        with pytest.raises(ValueError, match="vocabulary size 1000 but the target has 49152"):
            eng.make_draft(spec)


def test_a_non_model_draft_is_a_clear_error(target):
    from flashspec_torch.engine import Engine

    eng = Engine(target, ("ngram",), device="cpu")
    with pytest.raises(ValueError, match="draft"):
        eng.make_draft(42)


def test_cli_takes_several_real_drafts(capsys):
    import json

    from flashspec.cli import main

    assert main(["generate", "def add(a, b):", "--no-chat", "--max-new-tokens", "6", "--temperature", "0",
                 "--draft", "ngram", "--draft", "nf4", "--draft", "layerskip", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["arm_pulls"]) == {"plain", "ngram", "nf4", "layerskip"}
    assert 1 <= out["new_tokens"] <= 6
