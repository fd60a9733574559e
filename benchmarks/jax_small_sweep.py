"""The JAX engine's plain decode step at small shapes against torch's, per variant (issue #37): which of
the layer loop, the attention kernel's slot splits and k decode steps per call closes the gap at
SmolLM2-135M's shape.

    python benchmarks/jax_small_sweep.py --out DIR --budget-s 170    # on the H100 / H200 (random bf16 weights)
    python benchmarks/jax_small_sweep.py --dry-run --out DIR         # a tiny config on the CPU: the plumbing only

Every entry of ``PLAN`` (a shape, a variant, its batch sizes) runs in a child process of its own
(``shape_children.run_children``: killed at its share of ``--budget-s``; a share unused passes on),
with ``shape_children.AUTOTUNE_CACHE`` in its ``XLA_FLAGS`` (one per-fusion autotuning cache for every
child). ``VARIANTS``:

* ``default``: the engine as it is (``Llama``'s choices on this GPU: the scan at SmolLM2, unrolled at
  TinyLlama, the fused attention kernel); ``scan`` / ``unrolled``: the layer loop forced;
* ``split512``: the attention kernel's ``SPLIT_MIN_SLOTS`` at its earlier 512 slots, so short caches
  do not split (SmolLM2 at batch 1 has 3 KV heads: 3 programs unsplit, 18 with the default's 6 splits
  of its 384 slots).

The XLA flag variants that lost (command buffers off or extended, graphs of any size) are one line
each in docs/jax.md; ``jax_xla_flags_gpu.py`` still sweeps flags around the while loop.

A child (``flashspec_jax.weights.random_model``, seed 0: the same model in every child; greedy, a
``--prompt-len`` random prompt) runs per batch size, each part under its deadline:
``plain``: ``flashspec.loop.decode`` over ``JaxBackend`` (``--tokens`` new tokens at batch 1,
``--batch-tokens`` above), once to compile, then ``--reps`` times: the median wall time per token
and the mean launch-to-launch step of the loop's records (``step_ms``, what the torch rows use);
``host``: the same steps called by hand (batch 1): the host's microseconds inside ``decode_one`` (the
Python and dispatch of one step, ``launch_us``) and waiting for the step before (``wait_us``): if the
launch is a small part of the step, the host is hidden behind the device; ``k_steps``: ``--k`` decode
steps in one jitted call (a ``lax.fori_loop`` over ``Steps.decode_one``; batch 1, the default variant): the per-call cost
(Python, dispatch, executable launch) spread over k tokens, its tokens against ``plain``'s.
The ``torch`` child times the torch engine (CUDA graphs) at the same shapes and batches
(``jax_vs_torch_gpu.TorchSide``) as the bar; the ``attn8b`` child times the attention of one token
over Llama-3-8B's 32 layers at 256 slots of context in 1, 2, 4 and 5 splits (5: one block of 64 slots each) (``jax_parts``).
The parent merges the children into ``jax_small_sweep.json`` (per shape and batch: every variant's
step against torch's and the default's, the best variant) and prints the table.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashspec.config import SamplingConfig  # noqa: E402

import shape_children  # noqa: E402  (benchmarks/ is on sys.path; no GPU work, no torch)
from shape_children import TINY, guarded  # noqa: E402

VARIANTS = {  # name -> (layer loop (None: the model's choice), SPLIT_MIN_SLOTS (None: the kernel's))
    "default": (None, None),
    "split512": (None, 512),
    "unrolled": ("unrolled", None),
    "scan": ("scan", None),
}
SMOL, TINYLLAMA = "smollm2-135m", "tinyllama-1.1b"
PLAN = (  # (shape, variant or "torch" / "attn8b", batch sizes, weight of the budget), run in this order
    (SMOL, "torch", (1, 8, 64), 14.0), (TINYLLAMA, "torch", (1,), 10.0),
    (SMOL, "default", (1, 8, 64), 28.0), (SMOL, "split512", (1, 8), 14.0), (SMOL, "unrolled", (1,), 16.0),
    (TINYLLAMA, "default", (1,), 48.0), ("llama3-8b", "attn8b", (1,), 10.0),
    (TINYLLAMA, "split512", (1,), 6.0),  # last: reuses TinyLlama's autotuning
)
SPLITS_8B = (1, 2, 4, 5)  # the attn8b child's split counts at 256 slots of context
GREEDY = SamplingConfig(0.0)
BAR = 1.15  # issue #37: the JAX step within 1.15x of torch's


# -- a JAX child: one shape under one variant


def prompts_for(vocab: int, batch: int, prompt_len: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(batch).integers(0, vocab, (batch, prompt_len)).tolist()


def sha(tokens) -> str:
    return hashlib.sha1(json.dumps(tokens).encode()).hexdigest()


def plain(backend, prompts, tokens: int, reps: int) -> dict:
    """``flashspec.loop.decode``: once to compile, then ``reps`` times (the median wall; the step from its records)."""
    import numpy as np

    from flashspec.loop import decode

    seed = np.zeros(len(prompts), np.uint64)
    t0 = time.perf_counter()
    decode(backend, prompts, sampling=GREEDY, max_new_tokens=tokens, seed=seed)
    first, walls, steps = time.perf_counter() - t0, [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        out, rec = decode(backend, prompts, sampling=GREEDY, max_new_tokens=tokens, seed=seed)
        walls.append(time.perf_counter() - t0)
        steps.append(statistics.mean(r.seconds for r in rec) * 1e3)
    wall = statistics.median(walls)
    return dict(compile_and_first_s=first, steps=len(rec), step_ms=statistics.median(steps), steps_ms=steps,
                ms_per_token_wall=wall * 1e3 / tokens, tokens_per_s=sum(map(len, out)) / wall, tokens=out, tokens_sha1=sha(out))


def host(backend, prompts, tokens: int) -> dict:
    """The decode steps called by hand as ``flashspec.loop.decode_steps`` does (launch step k, read step
    k - 1): mean microseconds inside the launch and waiting for the read."""
    import numpy as np

    seed = np.zeros(len(prompts), np.uint64)
    backend.prefill(prompts, tokens)
    launch, wait, pending = [], [], None
    t_start = time.perf_counter()
    for step in range(tokens):
        t0 = time.perf_counter()
        handle = backend.decode_one(GREEDY, seed, step)
        t1 = time.perf_counter()
        if pending is not None:
            pending.fetch()
            wait.append((time.perf_counter() - t1) * 1e6)
        launch.append((t1 - t0) * 1e6)
        pending = handle
    pending.fetch()
    step_us = (time.perf_counter() - t_start) * 1e6 / tokens
    return dict(launch_us=statistics.mean(launch[1:]), wait_us=statistics.mean(wait), step_us=step_us,
                launch_over_step=statistics.mean(launch[1:]) / step_us)


def k_steps(backend, prompts, tokens: int, k: int, reps: int) -> dict:
    """``k`` decode steps per jitted call (a ``lax.fori_loop`` of known trip count; the state donated on a
    GPU): ms per token (the median of ``reps`` generations after one to compile) and its tokens."""
    import jax
    import numpy as np
    from jax import lax

    steps = backend.steps
    seeds = backend.seeds(np.zeros(len(prompts), np.uint64))

    def run_k(weights, state, offset):
        return lax.fori_loop(0, k, lambda i, s: steps.decode_one(weights, s, GREEDY, seeds, offset + i)[0], state)

    fn = jax.jit(run_k, donate_argnames=("state",) if jax.default_backend() == "gpu" else ())
    calls = -(-tokens // k)

    def generate():
        backend.prefill(prompts, tokens)
        for c in range(calls):
            backend.state = fn(backend.weights, backend.state, c * k)
        return backend.outputs()

    t0 = time.perf_counter()
    generate()
    first, walls = time.perf_counter() - t0, []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = generate()
        walls.append(time.perf_counter() - t0)
    return dict(k=k, calls=calls, compile_and_first_s=first, ms_per_token_wall=statistics.median(walls) * 1e3 / tokens,
                tokens_sha1=sha(out), tokens=out)


def one_batch(m, batch: int, args, deadline: float) -> dict:
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    prompts = prompts_for(m.config.vocab_size, batch, args.prompt_len)
    tokens = args.tokens if batch == 1 else args.batch_tokens
    out = dict(batch=batch, new_tokens=tokens, plain=guarded(lambda: plain(backend, prompts, tokens, args.reps), deadline))
    if batch == 1:
        out["host"] = guarded(lambda: host(backend, prompts, tokens), deadline)
    if batch == 1 and args.variant == "default":  # a compile of its own: the default variant only
        out["k_steps"] = guarded(lambda: k_steps(backend, prompts, tokens, args.k, args.reps), deadline)
        if "tokens" in out["k_steps"] and "tokens" in out["plain"]:
            out["k_steps_equal_plain"] = out["k_steps"].pop("tokens") == out["plain"]["tokens"]
    return out


def jax_child(args, start: float, deadline: float) -> dict:
    """One shape under this process's XLA_FLAGS and the variant's model settings; the JSON after every batch."""
    import jax
    import jax.numpy as jnp

    from flashspec_jax.kernels import attention as kernel_attention
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    loop, split_min = VARIANTS[args.variant]
    if split_min is not None:
        kernel_attention.SPLIT_MIN_SLOTS = split_min
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    m = random_model(LlamaConfig(**json.loads(args.dims), max_position_embeddings=4096), dtype=dtype, seed=0)
    if loop is not None:
        m.scan_layers = loop == "scan"
    slots = cache_slots(args)
    row = head(args, jax) | dict(dtype=str(jnp.dtype(dtype)), layer_loop="scan" if m.uses_scan() else "unrolled",
                                 attention=m.attention_choice(), split_min_slots=kernel_attention.SPLIT_MIN_SLOTS,
                                 splits_at_batch={b: kernel_attention.choose_splits(b, m.config.num_kv_heads, slots[b],
                                                                                     kernel_attention.BLOCK_S)
                                                  for b in args.batches}, batches={})
    for b in args.batches:
        row["batches"][b] = guarded(lambda b=b: one_batch(m, b, args, deadline), deadline)
        row["child_wall_s"] = time.perf_counter() - start
        save(args, row)
        print(json.dumps({args.variant: {b: summary_of(row["batches"][b])}}), flush=True)
    return row


def cache_slots(args) -> dict[int, int]:
    """Cache slots per batch size, as ``steps.batch_shapes`` sizes them."""
    from flashspec_jax.steps import batch_shapes

    return {b: batch_shapes([[1] * args.prompt_len], args.tokens if b == 1 else args.batch_tokens)[0].shape[1]
            for b in args.batches}


def summary_of(batch_row: dict) -> dict:
    p, h, k = batch_row.get("plain", {}), batch_row.get("host", {}), batch_row.get("k_steps", {})
    return dict(step_ms=p.get("step_ms"), wall_ms=p.get("ms_per_token_wall"), launch_us=h.get("launch_us"),
                k_steps_ms=k.get("ms_per_token_wall"), error=p.get("error") or p.get("skipped"))


# -- the torch and attn8b children


def torch_child(args, start: float, deadline: float) -> dict:
    """The torch engine (CUDA graphs, Triton verify) at the shape's batch sizes: plain decoding and n-gram speculation."""
    import torch

    from jax_vs_torch_gpu import TorchSide  # (imports JAX too; its backend is never started here)

    args.gamma = 4
    side = TorchSide(json.loads(args.dims), args)
    row = dict(shape=args.shape, variant=args.variant, device=torch.cuda.get_device_name(), prompt_len=args.prompt_len,
               versions=dict(torch=torch.__version__, python=platform.python_version()), batches={})
    for b in args.batches:
        row["batches"][b] = guarded(lambda b=b: side.batch(b), deadline)
        row["child_wall_s"] = time.perf_counter() - start
        save(args, row)
        print(json.dumps({"torch": {b: row["batches"][b].get("plain", row["batches"][b])}})[:600], flush=True)
    return row


def attn8b_child(args, start: float, deadline: float) -> dict:
    """Llama-3-8B's attention of one token over its 32 layers at 256 slots of context (320 cache slots):
    the fused kernel in each of ``SPLITS_8B`` splits, against the einsum (ms, output difference)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_parts
    from flashspec_jax.model import KVCache, LlamaConfig, rope_table
    from jax_profile_gpu import median_ms

    dims, ctx = json.loads(args.dims), args.attn_context
    c = LlamaConfig(**dims, max_position_embeddings=ctx + 128)
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    qkv = jax.random.normal(jax.random.key(0), (1, 1, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim), dtype)
    positions = jnp.full((1, 1), ctx, jnp.int32)
    cos, sin = rope_table(c, positions, dtype)
    shape = (c.num_layers, 1, c.num_kv_heads, ctx + 64, c.head_dim)
    made = KVCache(*(0.5 * jax.random.normal(jax.random.key(i), shape, dtype) for i in (1, 2)))
    row, ref = head(args, jax) | dict(context=ctx, slots=ctx + 64, paths={}), None
    for impl, splits in [("xla", 0), *(("fused", s) for s in SPLITS_8B)]:
        name = impl if impl == "xla" else f"fused_{splits}"

        def one():
            nonlocal ref
            step = jax_parts.attention_step(c, impl, c.num_layers, splits)
            cache = KVCache(*(jnp.copy(a) for a in made))
            total, cache = step(qkv, cos, sin, cache, positions)
            total = np.asarray(total, np.float32)
            ref = total if impl == "xla" else ref
            ms, _ = median_ms(lambda cc: step(qkv, cos, sin, cc, positions)[1], cache, args.reps * 5)
            diff = None if ref is None else float(np.abs(total - ref).max() / max(1e-30, np.abs(ref).max()))
            return dict(ms=ms, rel_max_diff_vs_xla=diff)

        row["paths"][name] = guarded(one, deadline)
        save(args, row)
    print(json.dumps({"attn8b": {k: v.get("ms") for k, v in row["paths"].items()}}), flush=True)
    return row


def head(args, jax) -> dict:
    dev = jax.devices()[0]
    return dict(shape=args.shape, variant=args.variant, xla_flags=os.environ.get("XLA_FLAGS", ""),
                device=getattr(dev, "device_kind", str(dev)), platform=jax.default_backend(),
                versions=dict(jax=jax.__version__, python=platform.python_version()), prompt_len=args.prompt_len,
                reps=args.reps)


def save(args, row: dict) -> None:
    shape_children.write_json(args.out / shape_children.RESULT, row)


def child(args) -> None:
    start = time.perf_counter()
    deadline = start + args.budget_s * shape_children.CHILD_SOFT
    run = {"torch": torch_child, "attn8b": attn8b_child}.get(args.variant, jax_child)
    save(args, run(args, start, deadline))


# -- the parent: one child per PLAN entry, the merge


def plan_of(args) -> list[tuple[str, str, tuple[int, ...], float]]:
    keep_v = set(args.variants.split(",")) if args.variants else None
    keep_s = set(args.shapes.split(",")) if args.shapes else None
    plan = [p for p in PLAN if (keep_v is None or p[1] in keep_v) and (keep_s is None or p[0] in keep_s)]
    if args.dry_run:  # the tiny config stands in for every shape; no CUDA for torch
        plan = [("tiny", v, tuple(b for b in batches if b <= 2) or (1,), w) for _, v, batches, w in plan if v != "torch"]
        first = {}
        for s, v, b, w in plan:
            first.setdefault(v, (s, v, b, w))
        plan = list(first.values())
    return plan


def child_command(args, plan, dims: dict, common: str, script: str):
    """command(name, share, outdir) for ``run_children``: the child under its variant's XLA_FLAGS, its
    output also into outdir/child.log (its tail kept in the JSON when it fails)."""
    entries = {f"{s}@{v}": (s, v, b) for s, v, b, _ in plan}
    keep = ["--tokens", str(args.tokens), "--batch-tokens", str(args.batch_tokens), "--prompt-len", str(args.prompt_len),
            "--reps", str(args.reps), "--k", str(args.k), "--attn-context", str(args.attn_context),
            *(["--dry-run"] if args.dry_run else [])]

    def command(name: str, share: float, outdir: Path) -> list[str]:
        shape, variant, batches = entries[name]
        return shape_children.flagged_command(
            [common], outdir / "child.log",
            [sys.executable, script, "--child", "--shape", shape, "--variant", variant, "--dims", json.dumps(dims[shape]),
             "--batches", ",".join(map(str, batches)), "--out", str(outdir), "--budget-s", f"{share:.1f}", *keep])
    return command


def merge(children: list[dict]) -> dict:
    """Per shape and batch: each variant's plain step (ms) against torch's and the default's, its host
    launch, k steps per call, tokens against the default's; the best variant."""
    rows, table = {}, {}
    for c in children:
        shape, variant = c["shape"].split("@")
        row = dict(c["data"] or {}, rc=c["rc"], killed=c["killed"], share_s=c["share_s"], wall_s=c["wall_s"])
        if tail := shape_children.log_tail(c, Path(c.get("log", "")), 1500):
            row["log_tail"] = tail
        rows.setdefault(shape, {})[variant] = row
    for shape, variants in rows.items():
        torch_b = variants.get("torch", {}).get("batches", {})
        default_b = variants.get("default", {}).get("batches", {})
        for variant, row in variants.items():
            if variant in ("torch", "attn8b"):
                continue
            for b, br in row.get("batches", {}).items():
                p = br.get("plain", {})
                torch_ms = torch_b.get(b, {}).get("plain", {}).get("step_ms")
                default_p = default_b.get(b, {}).get("plain", {})
                entry = dict(step_ms=p.get("step_ms"), ms_per_token_wall=p.get("ms_per_token_wall"),
                             torch_step_ms=torch_ms, launch_us=br.get("host", {}).get("launch_us"),
                             k_steps_ms_per_token=br.get("k_steps", {}).get("ms_per_token_wall"),
                             tokens_equal_default=(p.get("tokens") == default_p.get("tokens")) if "tokens" in p else None)
                if torch_ms and p.get("step_ms"):
                    entry["over_torch"] = p["step_ms"] / torch_ms
                    entry["within_bar"] = entry["over_torch"] <= BAR
                if default_p.get("step_ms") and p.get("step_ms"):
                    entry["over_default"] = p["step_ms"] / default_p["step_ms"]
                table.setdefault(f"{shape} b{b}", {})[variant] = entry
    best = {}
    for key, vs in table.items():
        measured = {v: e["step_ms"] for v, e in vs.items() if e.get("step_ms")}
        if measured:
            v = min(measured, key=measured.get)
            best[key] = dict(variant=v, step_ms=measured[v], over_torch=vs[v].get("over_torch"),
                             default_step_ms=vs.get("default", {}).get("step_ms"))
    for row in (r for vs in rows.values() for r in vs.values()):  # the token lists stay out of the merged file
        for br in row.get("batches", {}).values():
            br.get("plain", {}).pop("tokens", None) if isinstance(br, dict) else None
    attn = next((vs["attn8b"].get("paths") for vs in rows.values() if "attn8b" in vs), None)
    return dict(table=table, best=best, attn8b_ms={k: v.get("ms") for k, v in (attn or {}).items()}, children=rows)


def print_table(table: dict) -> str:
    lines = ["| shape, batch | variant | step ms | / torch | / default | wall ms/token | launch us | k steps ms/token | tokens = default |",
             "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for key, vs in table.items():
        for v, e in vs.items():
            lines.append(f"| {key} | {v} | {fmt(e['step_ms'], '.3f')} | {fmt(e.get('over_torch'), '.2f')} | "
                         f"{fmt(e.get('over_default'), '.2f')} | {fmt(e['ms_per_token_wall'], '.3f')} | "
                         f"{fmt(e['launch_us'], '.0f')} | {fmt(e['k_steps_ms_per_token'], '.3f')} | {e['tokens_equal_default']} |")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    ap.add_argument("--budget-s", type=float, default=170.0, help="all children together (the parent adds a few s)")
    ap.add_argument("--variants", default="", help="comma-separated subset of PLAN's variants (and torch, attn8b)")
    ap.add_argument("--shapes", default="", help="comma-separated subset of PLAN's shapes")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens at batch 1")
    ap.add_argument("--batch-tokens", type=int, default=64, help="new tokens per row above batch 1")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3, help="timed generations after the compiling one (median)")
    ap.add_argument("--k", type=int, default=8, help="decode steps per jitted call (k_steps)")
    ap.add_argument("--attn-context", type=int, default=256, help="the attn8b child's context")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU (the flags do nothing there)")
    ap.add_argument("--child", action="store_true", help="(internal) one --shape under one --variant in this process")
    ap.add_argument("--shape", help="(internal)")
    ap.add_argument("--variant", help="(internal)")
    ap.add_argument("--dims", help="(internal) the shape's config as JSON")
    ap.add_argument("--batches", default="1", help="(internal) the child's batch sizes")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.tokens, args.batch_tokens, args.prompt_len, args.k = min(args.tokens, 8), min(args.batch_tokens, 6), 12, min(args.k, 4)
        args.attn_context, args.reps = 64, 1
    args.batches = [int(b) for b in args.batches.split(",") if b]
    unknown = {v for v in args.variants.split(",") if v} - set(VARIANTS) - {"torch", "attn8b"}
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {sorted(VARIANTS)} or torch, attn8b")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    from jax_profile_gpu import SHAPES  # engine_gpu's (imports torch, not CUDA)

    start, plan = time.perf_counter(), plan_of(args)
    dims = {"tiny": TINY} if args.dry_run else dict(SHAPES)
    with tempfile.TemporaryDirectory() as tmp:
        common = shape_children.AUTOTUNE_CACHE.format(dir=Path(tmp) / "autotune")
        command = child_command(args, plan, dims, common, str(Path(__file__).resolve()))
        names = [f"{s}@{v}" for s, v, _, _ in plan]
        children = shape_children.run_children(names, {f"{s}@{v}": w for s, v, _, w in plan}, args.budget_s, command, Path(tmp))
        for c in children:
            c["log"] = str(Path(tmp) / c["shape"] / "child.log")
        merged = merge(children)
    result = dict(script="benchmarks/jax_small_sweep.py", argv=sys.argv[1:] if argv is None else list(argv),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), dry_run=args.dry_run,
                  base_xla_flags=os.environ.get("XLA_FLAGS", ""), common_flags=shape_children.AUTOTUNE_CACHE, variants=VARIANTS,
                  plan=[list(p) for p in plan], bar=BAR, wall_s=time.perf_counter() - start,
                  notes="step_ms: mean launch-to-launch step of flashspec.loop.decode's records (median of --reps "
                        "generations); wall: the whole generation (prefill included) per token; launch_us: host time "
                        "inside JaxBackend.decode_one; k_steps: --k decode steps per jitted call, ms per token (wall).",
                  **merged)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("jax_small_sweep_dry_run.json" if args.dry_run else "jax_small_sweep.json")
    shape_children.write_json(path, result)
    print(path)
    print(print_table(result["table"]))


if __name__ == "__main__":
    main()
