"""The core's NumPy conversion of the embedded GGUF gives exactly what transformers' GGUF loading
(torch) gives after our fused layout: every tensor bit for bit, and the same config and tokenizer files."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from flashspec.weights import convert_gguf, embedded_gguf  # noqa: E402
from flashspec_torch.weights import fused  # noqa: E402


@pytest.fixture
def parse_once(monkeypatch):
    """``gguf.GGUFReader`` parsing each file once: transformers' GGUF loading parses the file again for the config,
    the weights, the tokenizer's config and the tokenizer (its 49k-token vocabulary: about 8 s a parse), and
    ``convert_gguf`` once more; the parse is a read-only view of the same bytes each time, so one serves them all."""
    import gguf

    readers = {}
    parse = gguf.GGUFReader

    def cached(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    monkeypatch.setattr(gguf, "GGUFReader", cached)
    return readers


@pytest.mark.slow  # about 40 s of CPU (two de-quantizations of 272 tensors)
def test_numpy_conversion_equals_transformers_gguf_loading(tmp_path, parse_once):
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashspec.config import LlamaConfig

    gguf = embedded_gguf()
    out = tmp_path / "converted"
    convert_gguf(gguf, out)
    ours = load_file(str(out / "model.safetensors"))

    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    expected = fused({k: v.detach() for k, v in hf.state_dict().items()}, LlamaConfig.from_hf(hf.config))
    assert sorted(ours) == sorted(expected)
    for name, tensor in expected.items():
        want = tensor.contiguous().numpy()
        assert ours[name].dtype == want.dtype == np.float32 and ours[name].shape == want.shape, name
        assert np.array_equal(ours[name].view(np.uint32), want.view(np.uint32)), name  # bit for bit

    hf_config = hf.config.to_dict()
    hf_config.pop("quantization_config", None)
    assert (out / "config.json").read_text() == json.dumps(hf_config, indent=1, default=str)
    reference = tmp_path / "tokenizer"
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(reference))
    files = sorted(f.name for f in reference.iterdir())
    assert files == sorted(f.name for f in out.iterdir() if f.name not in ("model.safetensors", "config.json"))
    for name in files:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
