"""The host side of one jitted decode step call (issue #37): what the Python / C++ dispatch costs per
call, against the number of pytree leaves, on the CPU (no GPU needed: dispatch is asynchronous, so a
loop of calls whose device work is trivial runs at the host's pace).

    python benchmarks/jax_host_dispatch.py --out benchmarks/results/cpu_jax_host_dispatch.json

Parts (each the median over ``--reps`` loops of ``--calls`` calls, one call per loop iteration, each
call taking the previous call's output, as decoding does; blocked once at the end of a loop):

* ``leaves``: a jitted ``f(weights, state)`` returning ``state`` with one leaf + 1, where ``weights``
  is a list of N small arrays (N = 1 .. 1024; undonated) and ``state`` 10 arrays (donated or not):
  microseconds per call against N, and the per-leaf slope;
* ``engine``: ``JaxBackend.decode_one`` (what ``flashspec.loop.decode`` calls per step: its seeds,
  the jitted step with the state donated, the start of the device-to-host copy) on a model with
  SmolLM2-135M's pytree (30 layers stacked: one weight array per field) at a tiny width, its jitted
  step swapped for a trivial one of the same signature, against a trivial jit over the same leaves
  already flattened, and the pytree flatten alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from flashspec.config import SamplingConfig

SMOL_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=30, num_heads=9, num_kv_heads=3,
                 head_dim=16, rope_theta=100000.0, tie_word_embeddings=True)  # SmolLM2-135M's pytree, tiny widths


def loop_us(call, first, calls: int, reps: int) -> float:
    """Median over ``reps`` of the microseconds per call of ``calls`` chained calls (x = call(x))."""
    x = jax.block_until_ready(call(first))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            x = call(x)
        jax.block_until_ready(x)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def leaves_part(counts: list[int], calls: int, reps: int) -> dict:
    rows = []
    for donate in (False, True):
        for n in counts:
            weights = [jnp.full((4,), i, jnp.float32) for i in range(n)]
            state = tuple(jnp.zeros((4,), jnp.float32) for _ in range(10))
            f = jax.jit(lambda w, s: (s[0] + w[0][0], *s[1:]), donate_argnums=(1,) if donate else ())
            rows.append(dict(leaves=n + 10, weight_leaves=n, donated=donate,
                             us_per_call=loop_us(lambda s, f=f, w=weights: f(w, s), state, calls, reps)))
    slope = {}
    for donate in (False, True):
        r = [x for x in rows if x["donated"] == donate]
        fit = np.polyfit([x["leaves"] for x in r], [x["us_per_call"] for x in r], 1)
        slope["donated" if donate else "not_donated"] = dict(us_per_leaf=float(fit[0]), us_at_zero=float(fit[1]))
    return dict(rows=rows, fit=slope)


def engine_part(calls: int, reps: int) -> dict:
    """``JaxBackend.decode_one`` with its jitted step swapped for one of the same signature (weights,
    state donated, static cfg and rows) whose device work is trivial: the engine's host cost per step."""
    from flashspec_jax.backend import JaxBackend, packed
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.steps import StepOut
    from flashspec_jax.weights import random_model

    m = random_model(LlamaConfig(**SMOL_TINY, max_position_embeddings=512), dtype=jnp.float32)
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    greedy = SamplingConfig(0.0)
    backend.prefill([[1] * 16], 64)
    seed = np.zeros(1, np.uint64)

    def trivial(weights, state, cfg, seeds, offset, rows=1):
        seqs = state.seqs
        state = state._replace(seqs=seqs._replace(length=seqs.length + 1))
        return state, StepOut(seqs.length, ~seqs.done, seqs.done)

    backend.decode_jit = jax.jit(packed(trivial), static_argnames=("cfg", "rows"), donate_argnames=("state",))
    engine_us = loop_us(lambda _: backend.decode_one(greedy, seed, 0).packed, None, calls, reps)
    flat, tree = jax.tree.flatten((backend.weights, backend.state))
    n_w = len(jax.tree.leaves(backend.weights))
    seeds = backend.seeds(seed)
    raw = jax.jit(lambda w, s, seeds, offset: (s[0], s[1] + 1, *s[2:]), donate_argnums=(1,))
    state = tuple(flat[n_w:])
    raw_us = loop_us(lambda s: raw(flat[:n_w], s, seeds, 0), state, calls, reps)
    tree_us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            jax.tree.flatten((backend.weights, backend.state))
        tree_us.append((time.perf_counter() - t0) / calls * 1e6)
    return dict(config=SMOL_TINY, weight_leaves=n_w, state_leaves=len(flat) - n_w,
                weight_tree=str(jax.tree.structure(backend.weights))[:300],
                decode_one_trivial_step_us=engine_us, flat_leaves_trivial_jit_us=raw_us,
                tree_flatten_us=statistics.median(tree_us))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu_jax_host_dispatch.json"))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--counts", default="1,4,16,64,256,1024")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    result = dict(script="benchmarks/jax_host_dispatch.py", argv=sys.argv[1:], platform=jax.default_backend(),
                  device=str(jax.devices()[0]), cpu=platform.processor() or platform.machine(),
                  versions=dict(jax=jax.__version__, python=platform.python_version()),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  leaves=leaves_part([int(c) for c in args.counts.split(",")], args.calls, args.reps),
                  engine=engine_part(args.calls, args.reps))
    result["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
