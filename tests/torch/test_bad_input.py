"""Bad input to the torch engine, the generate API and its loaders: a ValueError (TypeError for a
wrong kind of object, FileNotFoundError for a missing file) naming the argument and what is allowed."""

import json
import os

import numpy as np
import pytest
import torch
from fault_helpers import tiny_target

import flashspec.engine
from flashspec_torch.engine import Engine
from flashspec_torch.weights import load, load_directory


@pytest.fixture(scope="module")
def tiny():
    return tiny_target()


@pytest.fixture(scope="module")
def eng(tiny):
    return Engine(tiny, ("ngram",), device="cpu")


@pytest.mark.parametrize("kw,error,needle", [
    (dict(prompt=""), ValueError, "prompt"),
    (dict(prompt=[]), ValueError, "prompt must be a string or a non-empty list"),
    (dict(prompt=None), ValueError, "prompt must be a string"),
    (dict(prompt=["ok", 3]), ValueError, "prompt"),
    (dict(prompt={"a": 1}), ValueError, "got dict"),
    (dict(prompt="x" * 300), ValueError, "exceeds the model's context of 256 tokens"),
    (dict(max_new_tokens=252), ValueError, "exceeds the model's context"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens=0 must be an integer >= 1"),
    (dict(max_new_tokens=-3), ValueError, "max_new_tokens"),
    (dict(max_new_tokens=2.0), ValueError, "max_new_tokens"),
    (dict(gamma=0), ValueError, "gamma=0 must be an integer in [1, 64]"),
    (dict(gamma=True), ValueError, "gamma"),
    (dict(temperature=-0.5), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature=1e-30), ValueError, "temperature=1e-30 must be 0 (greedy) or >= 1e-06"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(seed=-1), ValueError, "seed must be an int in [0, 2**63)"),
    (dict(seed=True), ValueError, "seed"),
    (dict(seed=1.5), ValueError, "seed"),
    (dict(seed=[1, 2]), ValueError, "one per prompt (1)"),
    (dict(seed=2**63), ValueError, "seed"),
    (dict(speculation="no"), TypeError, "speculation='no' must be a bool"),
    (dict(chat=1), TypeError, "chat=1 must be a bool"),
    (dict(on_step=5), TypeError, "on_step"),
])
def test_generate_rejects_bad_requests(eng, kw, error, needle):
    kw = {"prompt": "hello", "max_new_tokens": 4, "chat": False, **kw}
    with pytest.raises(error) as info:
        eng.generate(kw.pop("prompt"), **kw)
    assert needle in str(info.value)


def test_numpy_seeds_are_ints(eng):
    a = eng.generate("hello", max_new_tokens=4, seed=np.int64(3), chat=False)["tokens"]
    assert a == eng.generate("hello", max_new_tokens=4, seed=3, chat=False)["tokens"]


@pytest.mark.parametrize("kw,error,needle", [
    (dict(policy="greedy-bandit"), ValueError, "policy='greedy-bandit' is unknown"),
    (dict(drafts=()), ValueError, "drafts must name at least one draft"),
    (dict(drafts="ngram"), TypeError, "must be a sequence of draft names"),
    (dict(drafts=("ngram", 3)), TypeError, "draft names"),
    (dict(drafts=("no-such-draft",)), ValueError, "draft 'no-such-draft' is unknown"),
    (dict(drafts=("ngram:0",)), ValueError, "ngram:N with N >= 1"),
    (dict(drafts=("layerskip:7",)), ValueError, "layerskip:7 must name layers in [0, 3)"),
    (dict(drafts=("layerskip:0-2",)), ValueError, "skips every layer"),
    (dict(objective="speed"), ValueError, "objective='speed' must be one of acceptance, throughput"),
    (dict(device="tpu"), ValueError, "device='tpu' is not a torch device"),
    (dict(device="meta"), ValueError, "runs on 'cpu' or 'cuda'"),
    (dict(dtype=torch.int32), ValueError, "floating-point torch dtype"),
    (dict(verify_impl="fast"), ValueError, "verify_impl='fast' must be one of"),
])
def test_engine_rejects_bad_settings(tiny, kw, error, needle):
    kw = {"drafts": ("ngram",), "device": "cpu", **kw}
    with pytest.raises(error) as info:
        Engine(tiny, kw.pop("drafts"), **kw)
    assert needle in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="CUDA is not available"):
        Engine(tiny, device="cuda")


def test_engine_rejects_a_target_of_the_wrong_kind(tiny):
    with pytest.raises(TypeError, match="target must be None"):
        Engine(42, device="cpu")
    bare = tiny_target()
    bare.tokenizer = None
    with pytest.raises(ValueError, match="has no tokenizer"):
        Engine(bare, device="cpu")


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match=r"backend='tf' is unknown; choose one of \('torch', 'jax'\)"):
        flashspec.engine.engine("tf")
    with pytest.raises(TypeError, match="unexpected keyword argument 'temp'"):
        flashspec.engine.generate("hi", temp=0.5)


# ----------------------------------------------------------------------------- model files


def write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name,data,needle", [
    ("garbage.gguf", os.urandom(4096), "GGUF magic invalid"),
    ("empty.gguf", b"", "empty"),
    ("magic.gguf", b"GGUF" + bytes(range(256)) * 8, "corrupt, truncated"),
])
def test_corrupt_gguf_is_one_value_error(tmp_path, monkeypatch, name, data, needle):
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / name, data)
    with pytest.raises(ValueError, match=f"cannot read {path}") as info:
        load(path)
    assert needle in str(info.value)
    left = sorted(f.name for f in (tmp_path / "cache").iterdir()) if (tmp_path / "cache").exists() else []
    assert left in ([], [f"{name.removesuffix('.gguf')}-{len(data)}.lock"]), left  # no half cache left (the empty lock file may stay)


def test_truncated_embedded_gguf_is_one_value_error(tmp_path, monkeypatch):
    from flashspec.weights import embedded_gguf

    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    with open(embedded_gguf(), "rb") as f:
        head = f.read(300_000)  # the header and part of the tensor index
    path = write(tmp_path / "truncated.gguf", head)
    with pytest.raises(ValueError, match="corrupt, truncated"):
        load(path)


def test_missing_model_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Engine(str(tmp_path), device="cpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(str(tmp_path / "absent.gguf"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="lacks or mistypes 'num_attention_heads'"):
        load_directory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a JSON object"):
        load_directory(tmp_path)


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    """A draft must share the target's tokenizer (the vocabulary sizes differ here)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocabulary size 97 but the target has 64"):
        Engine(tiny_target(), (str(tmp_path),), device="cpu")
