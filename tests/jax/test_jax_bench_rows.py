"""benchmarks/verify_variants.py's JAX rows check their tokens: whatever variants are named, the jnp
reference runs first at the same shape, and each row's ``ok`` is its tokens equal to the reference's
(the H200 run of 2026-12-05 named only Pallas variants and reported ``ok: False`` for all of them)."""

from __future__ import annotations

from benchmark_modules import load_benchmark


def test_named_jax_variants_are_checked_against_the_reference():
    bench = load_benchmark("verify_variants")
    shape = dict(B=3, G=2, V=700, dtype="float32", temperature=0.7, draft="logprobs")
    rows = bench.run_jax_shape(shape, ["pallas-v2", "pallas-v2-no-prune"], unroll_sets=4)
    by = {r["impl"]: r for r in rows}
    assert list(by)[0] == "reference", list(by)
    assert {"pallas-v2", "pallas-v2-no-prune"} <= set(by), list(by)
    assert not [r for r in rows if "error" in r], [r["error"] for r in rows if "error" in r]
    assert all(r["ok"] for r in rows), [(r["impl"], r["ok"]) for r in rows]
