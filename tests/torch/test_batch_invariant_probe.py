"""benchmarks/batch_invariant_probe_gpu.py on the CPU (Triton interpreter, the tiny shape): with the engine's
product no op gives a request's rows other bits in a batch of 3 than alone; with a product that splits K
in two above one row at the down projection, the probe names that op in the decode pass, as the first
call to differ in isolation and the first to diverge from the request's run alone."""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import batch_invariant_probe_gpu as P  # noqa: E402
from flashspec_torch import invariant_matmul as I  # noqa: E402


def probe(monkeypatch, product) -> list[dict]:
    monkeypatch.setattr(I, "invariant_matmul", product)
    m = P.random_model(P.LlamaConfig(**P.SHAPES["tiny"], max_position_embeddings=128), "cpu")
    m.batch_invariant = True
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 64, int(rng.integers(8, 12))).tolist() for _ in range(3)]
    extra = [rng.integers(0, 64, 4).tolist() for _ in prompts]
    with torch.inference_mode():
        return P.probe_batch(m, prompts, extra, [0, 2], "cpu")


def test_the_probe_finds_nothing_with_the_engines_product(monkeypatch):
    runs = probe(monkeypatch, I.invariant_matmul)
    assert [r["pass"] for r in runs] == ["prefill"] * 2 + ["decode"] * 2 + ["scoring"] * 2
    assert [(r["isolated_first"], r["first_diverging"], r["repeat_diverging"]) for r in runs] == [(None, None, None)] * 6


def test_the_probe_names_a_product_that_splits_k_by_rows(monkeypatch):
    real, k = I.invariant_matmul, 64  # the tiny shape's down projection: K = its intermediate size

    def split_k(x, w, pdl=False):
        if x.numel() // x.shape[-1] == 1 or x.shape[-1] != k:
            return real(x, w, pdl)
        parts = [real(x[..., s].contiguous(), w[:, s].contiguous()).float() for s in (slice(0, k // 3), slice(k // 3, k))]
        return (parts[0] + parts[1]).to(x.dtype)

    runs = probe(monkeypatch, split_k)
    decode = [r for r in runs if r["pass"] == "decode"]
    assert [(r["isolated_first"], r["first_diverging"]) for r in decode] == [("layer 0 down", "layer 0 down")] * 2
    assert all(r["isolated_by_op"] == {"down": 1} and r["repeat_diverging"] is None for r in decode)
