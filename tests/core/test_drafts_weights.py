"""The core's draft names and the NumPy pieces of the weight conversion (no backend needed)."""

import numpy as np
import pytest

from flashspec.config import LlamaConfig
from flashspec.drafts import (BACKEND_DRAFTS, DRAFT_KINDS, DraftSpec, layerskip_layers, not_implemented,
                              parse_draft, parse_layers)
from flashspec.gguf_read import unpermute_rows
from flashspec.weights import convert_state_dict


@pytest.mark.parametrize("spec, expected", [
    ("ngram", DraftSpec("ngram", "ngram", max_n=3)),
    ("ngram:5", DraftSpec("ngram:5", "ngram", max_n=5)),
    ("layerskip", DraftSpec("layerskip", "layerskip", layers="")),
    ("layerskip:20-29,5", DraftSpec("layerskip:20-29,5", "layerskip", layers="20-29,5")),
    ("nf4", DraftSpec("nf4", "nf4")),
    ("self", DraftSpec("self", "self")),
    ("head", DraftSpec("head", "head", path="")),
    ("head:/heads/mine", DraftSpec("head:/heads/mine", "head", path="/heads/mine")),
    ("head@4096", DraftSpec("head@4096", "head", path="", top=4096)),
    ("head:/heads/a@b@2048", DraftSpec("head:/heads/a@b@2048", "head", path="/heads/a@b", top=2048)),
    ("head:/heads/a@b", DraftSpec("head:/heads/a@b", "head", path="/heads/a@b")),
    ("head-tree", DraftSpec("head-tree", "head-tree", path="", tree=16, branch=4)),
    ("head-tree/32", DraftSpec("head-tree/32", "head-tree", path="", tree=32, branch=4)),
    ("head-tree/16x4@4096", DraftSpec("head-tree/16x4@4096", "head-tree", path="", top=4096, tree=16, branch=4)),
    ("head-tree/8:/h/a@b/9@100", DraftSpec("head-tree/8:/h/a@b/9@100", "head-tree", path="/h/a@b/9", top=100, tree=8)),
    ("head-tree:/h/32", DraftSpec("head-tree:/h/32", "head-tree", path="/h/32", tree=16)),
    ("/models/small", DraftSpec("/models/small", "path", path="/models/small")),
    ("draft.gguf", DraftSpec("draft.gguf", "path", path="draft.gguf")),
])
def test_parse_draft(spec, expected):
    assert parse_draft(spec) == expected


@pytest.mark.parametrize("spec", ["ngram:0", "ngram:-2", "ngram:x"])
def test_a_bad_ngram_is_refused(spec):
    with pytest.raises(ValueError, match="ngram:N with N >= 1"):
        parse_draft(spec)


@pytest.mark.parametrize("spec", ["head@0", "head@x", "head:/h@0", "head@"])
def test_a_bad_head_vocabulary_size_is_refused(spec):
    with pytest.raises(ValueError, match=r"head\[:DIR\]@N with N >= 1"):
        parse_draft(spec)


@pytest.mark.parametrize("spec", ["head-tree/0", "head-tree/65", "head-tree/x", "head-tree/16x", "head-tree/16x0",
                                  "head-treex", "head-tree/16y", "head-tree@0", "head-tree/8@x"])
def test_a_bad_head_tree_is_refused(spec):
    with pytest.raises(ValueError, match=r"head-tree\[/N"):
        parse_draft(spec)


def test_parse_layers():
    assert parse_layers("20-22,5", 30) == {5, 20, 21, 22}
    for text, needle in [("a-b", "like 20-29,5"), ("30", r"in \[0, 30\)"), ("", r"in \[0, 30\)"), ("0-29", "every layer")]:
        with pytest.raises(ValueError, match=needle):
            parse_layers(text, 30)


def test_not_implemented_names_the_draft_and_the_backend():
    text = str(not_implemented(parse_draft("nf4"), "jax"))
    assert "'nf4' is not implemented by the jax backend" in text and "use --backend torch" in text
    assert "nf4" not in text.split("builds")[1].split(";")[0]  # the list it gives is true for jax


def test_both_backends_take_the_same_draft_names():
    """One list: every draft kind is built by some backend, and layerskip needs no layers on either."""
    assert set(DRAFT_KINDS) == {k for kinds in BACKEND_DRAFTS.values() for k in kinds}
    assert set(BACKEND_DRAFTS) == {"torch", "jax"}
    assert layerskip_layers(parse_draft("layerskip"), 30) == {25}  # the embedded model's searched default
    assert layerskip_layers(parse_draft("layerskip"), 2) == {1}
    assert layerskip_layers(parse_draft("layerskip:0"), 2) == {0}


def llama_cpp_permute(w, heads):  # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_rows_undoes_llama_cpp_and_matches_transformers(heads):
    w = np.random.default_rng(heads).standard_normal((heads * 8, 5)).astype(np.float32)
    assert np.array_equal(unpermute_rows(llama_cpp_permute(w, heads), heads), w)
    processors = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    expected = processors.LlamaTensorProcessor()._reverse_permute_weights(w, heads, heads)
    assert np.array_equal(unpermute_rows(w, heads), expected)


def test_convert_state_dict_fuses_qkv_and_gate_up():
    config = LlamaConfig(vocab_size=7, hidden_size=4, intermediate_size=6, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=2)
    rng = np.random.default_rng(0)
    shapes = {"q_proj": (4, 4), "k_proj": (2, 4), "v_proj": (2, 4), "o_proj": (4, 4)}
    hf = {f"model.layers.0.self_attn.{n}.weight": rng.standard_normal(s) for n, s in shapes.items()}
    hf |= {f"model.layers.0.mlp.{n}.weight": rng.standard_normal(s)
           for n, s in {"gate_proj": (6, 4), "up_proj": (6, 4), "down_proj": (4, 6)}.items()}
    hf |= {"model.embed_tokens.weight": rng.standard_normal((7, 4)), "model.norm.weight": np.ones(4),
           "model.layers.0.input_layernorm.weight": np.ones(4), "model.layers.0.post_attention_layernorm.weight": np.ones(4)}
    out = convert_state_dict(hf, config)
    a = "model.layers.0.self_attn."
    assert np.array_equal(out["layers.0.qkv.weight"], np.concatenate([hf[a + "q_proj.weight"], hf[a + "k_proj.weight"], hf[a + "v_proj.weight"]]))
    m = "model.layers.0.mlp."
    assert np.array_equal(out["layers.0.gate_up.weight"], np.concatenate([hf[m + "gate_proj.weight"], hf[m + "up_proj.weight"]]))
    assert np.array_equal(out["lm_head.weight"], hf["model.embed_tokens.weight"])  # untied, no lm_head: the embedding
    del hf[a + "v_proj.weight"]
    with pytest.raises(ValueError, match="v_proj.weight' is missing"):
        convert_state_dict(hf, config)
