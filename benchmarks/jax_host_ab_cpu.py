"""The JAX engine's host work per decode step in one source tree, on the CPU, for comparing two trees
(issue #37: did the code since dc5b818 add host time to SmolLM2's step?).

    git worktree add /tmp/old dc5b818
    for r in 1 2 3 4; do for t in /tmp/old $PWD; do for m in scan unrolled; do
      TREE=$t python benchmarks/jax_host_ab_cpu.py --loop $m --trivial; done; done; done

``TREE`` (default: this checkout) supplies ``flashspec`` and ``flashspec_jax``; the helpers (``jax_vs_torch_gpu``,
``jax_small_sweep``) come from this script's folder. The model: SmolLM2's depth (30 layers, ``--loop scan``)
or TinyLlama's (22, ``unrolled``) at tiny widths, fp32, its weights a seeded torch model's handed over by
DLPack (``jax_vs_torch_gpu.jax_model``, as the GPU table does), the state donated as on the GPU. One JSON line:
the weights' leaves, whether ``weight_sources`` reads them from the Variables (main only), ``launch_us``
(``jax_small_sweep.host``: microseconds inside ``decode_one``; median and min over ``--reps`` generations of
128 tokens; ``--trivial``: the step swapped for one without a model, the host's work alone), the jit cache's
entries after them (1: no retrace) and the Python calls per ``decode_one`` (cProfile: exact, not a timing).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = Path(os.environ.get("TREE", HERE.parent)).resolve()
sys.path[:0] = [str(TREE / "shared"), str(TREE), str(HERE)]

import argparse  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402

DIMS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
DEPTH = {"scan": 30, "unrolled": 22}


def build(loop: str, trivial: bool):
    """The backend on a seeded torch model's weights (DLPack), the layer loop forced, the state donated."""
    import jax.numpy as jnp
    import torch

    import flashspec_jax.backend as backend_lib
    import jax_vs_torch_gpu
    from flashspec_torch.model import Llama, LlamaConfig
    from jax_same_process import trivial_step

    backend_lib.on_gpu = lambda: True  # JaxBackend donates the state on a GPU only
    torch.manual_seed(0)
    dims = dict(DIMS, num_layers=DEPTH[loop])
    m, where = jax_vs_torch_gpu.jax_model(dims, Llama(LlamaConfig(**dims, max_position_embeddings=8192)).eval(), jnp.float32)
    m.scan_layers = loop == "scan"
    backend = jax_vs_torch_gpu.jax_backend(m)
    if trivial:
        backend.steps.decode_one = trivial_step
        backend.jit_steps()
    return backend, where


def python_calls(backend, prompts, tokens: int) -> float:
    """Python function calls per ``decode_one`` over one generation (cProfile)."""
    import numpy as np

    from jax_small_sweep import GREEDY

    seed = np.zeros(1, np.uint64)
    backend.prefill(prompts, tokens)
    profile, handles = cProfile.Profile(), []
    profile.enable()
    for step in range(tokens):
        handles.append(backend.decode_one(GREEDY, seed, step))
    profile.disable()
    for h in handles:
        h.fetch()
    return sum(v[1] for v in pstats.Stats(profile).stats.values()) / tokens


def main(argv=None) -> None:
    import jax
    import numpy as np

    from jax_small_sweep import host

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loop", choices=tuple(DEPTH), default="scan")
    ap.add_argument("--trivial", action="store_true", help="the step swapped for one without a model")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args(argv)
    backend, where = build(args.loop, args.trivial)
    prompts = np.random.default_rng(1).integers(0, DIMS["vocab_size"], (1, 128)).tolist()
    host(backend, prompts, args.tokens)  # the compile
    launch = [host(backend, prompts, args.tokens)["launch_us"] for _ in range(args.reps)]
    sources = getattr(backend, "sources", "absent")
    row = dict(tree=str(TREE), loop=args.loop, trivial=args.trivial, weights=where,
               leaves=len(jax.tree.leaves(backend.weights)),
               sources=sources if sources == "absent" else (None if sources is None else len(sources)),
               launch_us_median=statistics.median(launch), launch_us_min=min(launch),
               python_calls_per_step=python_calls(backend, prompts, args.tokens),
               jit_cache_entries=backend.decode_jit._cache_size())
    print(json.dumps(row))


if __name__ == "__main__":
    main()
