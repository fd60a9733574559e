"""What one step of an XLA loop costs before any verify arithmetic: the floor under the Pallas timings.

    python benchmarks/jax_loop_floor.py --out DIR      # on the H200 (about a minute)
    python benchmarks/jax_loop_floor.py --dry-run      # CPU, tiny shape (Pallas interpret mode)

The loop is jax_timing.scan_over_sets (one jitted ``lax.scan``, k input sets unrolled per iteration as
separate buffers, each step's offset depends on the previous step's tokens, ``block_until_ready``
once; time / steps). Per step, bf16 logits [B, G+1, V]:

* ``fusion``: tokens from one jnp op on the offset (no read of the logits);
* ``read``: tokens from a jnp max over the logits (one XLA reduction reading them all);
* ``pallas-1`` / ``pallas-2`` / ``pallas-3``: one, two or three trivial Pallas kernels in a chain (each reads one
  logit and the previous kernel's output), then the same tokens;
* ``verify-two``: the real verify (``choose_config``: two kernels and the epilogue).

``--triton``: per shape, torch's Triton default on the same call first (CUDA-graph replays as in
verify_kernels.py), so Pallas / Triton comes from one process; ``--torch-first``: torch's work before
JAX starts (is a shared process slower?); ``--dtype float32``, ``--gamma``, ``--temperature``.

Writes DIR/jax_loop_floor{--tag}.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jax_timing import median_seconds, scan_over_sets  # noqa: E402  (benchmarks/ is on sys.path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1:128256,8:128256,32:32000", help="B:V,...")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the logits' dtype")
    p.add_argument("--only", default="", help="comma-separated step names (default: all)")
    p.add_argument("--torch-first", action="store_true",
                   help="run torch's Triton verify eagerly and as a CUDA graph replay before JAX starts")
    p.add_argument("--triton", action="store_true",
                   help="per shape, time torch's Triton default first (CUDA graph replays, verify_kernels.time_graph) in this process")
    p.add_argument("--tag", default="", help="suffix of the JSON's name")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    return p.parse_args(argv)


def trivial_kernel(z_ref, prev_ref, o_ref):  # [B, G+1, V], [B, G+1] int32 -> [B, G+1] int32
    o_ref[...] = prev_ref[...] + z_ref[0, 0, 0].astype(prev_ref.dtype)


def steps_of(b: int, g: int, v: int, t: float, interpret: bool, itemsize: int = 2) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plt

    from flashspec_jax import verify
    from flashspec_jax.kernels.config import choose_config

    params = plt.CompilerParams(num_warps=4, num_stages=1)
    rows, cols = pl.next_power_of_2(b), pl.next_power_of_2(g + 1)  # Triton blocks: powers of 2
    out = jax.ShapeDtypeStruct((rows, cols), jnp.int32)

    def whole(kernel):  # the kernel sees whole arrays (no grid, no blocks)
        return pl.pallas_call(kernel, out_shape=out, compiler_params=params, interpret=interpret)

    def chain(n):
        def step(z, x, w, lq, offset):
            toks = jnp.zeros((rows, cols), jnp.int32) + offset.astype(jnp.int32)
            for _ in range(n):
                toks = whole(trivial_kernel)(z, toks)
            return toks
        return step

    def real(config):
        def step(z, x, w, lq, offset):
            return verify(z, x, w, lq, seed=jnp.uint32(7), offset=offset, temperature=t, impl="pallas",
                          config=config).tokens
        return step

    return {
        "fusion": lambda z, x, w, lq, offset: jnp.zeros((b, g + 1), jnp.int32) + offset.astype(jnp.int32),
        "read": lambda z, x, w, lq, offset: (jnp.max(z, axis=-1).astype(jnp.int32) + offset.astype(jnp.int32)),
        "pallas-1": chain(1), "pallas-2": chain(2), "pallas-3": chain(3),
        "verify-two": real(None if interpret else choose_config(b, g, v, itemsize)),
    }


def time_shape(b: int, g: int, v: int, t: float, on_gpu: bool, only=(), dtype: str = "bfloat16") -> list[dict]:
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    per_set = (2 * g + 1) * b * v * dt.itemsize
    k = max(2, min(32, math.ceil(3 * 60e6 / per_set))) if on_gpu else 2
    steps = k * math.ceil(64 / k) if on_gpu else k
    kz, kw = jax.random.split(jax.random.key(b + v))
    sets = []
    for j in range(k):
        z = (2.0 * jax.random.normal(jax.random.fold_in(kz, j), (b, g + 1, v))).astype(dt)
        w = (z[:, :g].astype(jnp.float32) + 1.4 * jax.random.normal(jax.random.fold_in(kw, j), (b, g, v))).astype(
            dt)
        log_q = jax.nn.log_softmax(w.astype(jnp.float32) / t, axis=-1)
        x = jnp.argmax(log_q, axis=-1).astype(jnp.int32)
        sets.append((z, x, w, jnp.take_along_axis(log_q, x[..., None], axis=-1)[..., 0]))
    rows = []
    for name, step in steps_of(b, g, v, t, not on_gpu, dt.itemsize).items():
        if only and name not in only:
            continue
        fn = scan_over_sets(lambda acc, inp, step=step: acc + step(*inp, acc).sum().astype(jnp.uint32), sets, steps)
        row = dict(name=name, B=b, G=g, V=v, dtype=dtype, temperature=t, buffers=k, steps=steps)
        try:
            row["step_us"] = 1e6 * median_seconds(fn, (sets,), 7 if on_gpu else 1) / steps
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        print(f"B={b} V={v} {name:18s} " + (f"{row['step_us']:7.1f} us/step" if "step_us" in row else row["error"]),
              flush=True)
        rows.append(row)
    return rows


def run_torch_first() -> dict:
    """What a process that ran torch's Triton verify first has done before its JAX rows: torch's CUDA context, its caching
    allocator holding a few GB, Triton kernels launched eagerly and replayed in a CUDA graph."""
    import torch

    from flashspec.config import SamplingConfig
    from flashspec_torch import verify_triton

    dev = torch.device("cuda")
    b, g, v = 32, 4, 128256
    z = torch.randn(b, g + 1, v, device=dev, dtype=torch.bfloat16)
    w = torch.randn(b, g, v, device=dev, dtype=torch.bfloat16)
    x = torch.randint(0, v, (b, g), device=dev, dtype=torch.int32)
    cfg = SamplingConfig(temperature=0.7)
    hold = torch.empty(4 << 30, dtype=torch.uint8, device=dev)  # the reference's buffers, the input sets
    out = verify_triton(z, x, w, None, cfg, 7, 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_triton(z, x, w, None, cfg, 7, 3)
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    del hold
    return dict(torch=torch.__version__, torch_reserved_gb=torch.cuda.memory_reserved() / 2**30,
                torch_tokens=int(out.tokens.sum()))


def time_triton(b: int, g: int, v: int, t: float, dtype: str) -> dict:
    """The Triton default on the same call (bf16, draft logits and log q(x)), graph-replayed as in
    verify_kernels.py: the Pallas / Triton ratio from one process and one device call."""
    import torch
    from verify_kernels import capture, input_sets, time_graph

    from flashspec_torch import verify

    shape = dict(B=b, G=g, V=v, dtype=dtype, draft="logprobs", temperature=t)
    sets = input_sets(shape, torch.device("cuda"))
    seed = torch.full((b,), 7, dtype=torch.int64, device="cuda")
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    graph, outs = capture(lambda inp: verify(**inp, temperature=t, seed=seed, offset=offset, impl="triton"), sets)
    row = dict(name="triton-graph", B=b, G=g, V=v, dtype=dtype, temperature=t, buffers=len(sets),
               step_us=1e3 * time_graph(graph, len(sets), reps=15))
    del graph, outs, sets
    torch.cuda.empty_cache()
    print(f"B={b} V={v} {'triton-graph':18s} {row['step_us']:7.1f} us/step", flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.triton:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    first = run_torch_first() if args.torch_first else {}
    import jax

    on_gpu = jax.default_backend() in ("gpu", "cuda")
    shapes = [(3, 1000)] if args.dry_run or not on_gpu else [tuple(int(a) for a in s.split(":"))
                                                               for s in args.shapes.split(",")]
    env = dict(jax=jax.__version__, backend=jax.default_backend(),
               device=str(jax.devices()[0].device_kind), date=time.strftime("%Y-%m-%d"), torch_first=first,
               **{k: os.environ.get(k, "") for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                                     "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS")})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b, v in shapes:  # written after every shape: a run stopped by a timeout keeps what it measured
        if args.triton and on_gpu:
            rows.append(time_triton(b, args.gamma, v, args.temperature, args.dtype))
        rows += time_shape(b, args.gamma, v, args.temperature, on_gpu, [n for n in args.only.split(",") if n], args.dtype)
        (out / f"jax_loop_floor{args.tag}.json").write_text(json.dumps(dict(environment=env, rows=rows), indent=1))
    print(f"wrote {out / f'jax_loop_floor{args.tag}.json'}")
    return 0 if all("step_us" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
