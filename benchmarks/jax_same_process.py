"""The JAX engine's plain decode step with torch alive in the same process (issue #37): is its host side
slower there, and is that what made TinyLlama's JAX step 1.35 ms in the side-by-side table against 1.16
in a JAX-only process?

    python benchmarks/jax_same_process.py --out DIR --budget-s 190   # on the GPU: TinyLlama-1.1B, batch 1, bf16
    python benchmarks/jax_same_process.py --shape smollm2-135m --out DIR --budget-s 100   # SmolLM2's (scan)
    python benchmarks/jax_same_process.py --cpu --out DIR            # the CPU: a tiny 22-layer unrolled model

GPU: the torch engine on TinyLlama's random model (``jax_vs_torch_gpu.TorchSide``: CUDA graphs), then,
in the same process with that model alive, the JAX engine on its weights by DLPack, as the table script
runs them (``jax_vs_torch_gpu.jax_model``; its decode step jitted on the flat leaves, the engine's path, and
on the nnx pytree, dc5b818's path: ``path_variants``, alternating), then, with what time is left, the JAX engine on
``random_model``'s weights (a second compile, served by the persistent compilation cache this script
turns on). Per JAX model, ``--reps`` rounds, each round ``gc.freeze()`` off then on: ``plain``
(``flashspec.loop.decode``, 128 tokens: the mean launch-to-launch step) and ``host`` (the same steps by
hand: microseconds inside ``JaxBackend.decode_one``, ``launch_us``, and waiting for the step before,
``wait_us``; ``jax_small_sweep.host``). A launch well under the step with a wait > 0 says the step is the
device's, not the host's. Last, with ``LAST_PART_S`` of the budget left, the DLPack model with the einsum
attention (``attention_impl="xla"``: no Pallas custom call between the layers' fusions): whether the
launch shrinks without them.

CPU (``--cpu``): a 22-layer model at tiny widths, its layers unrolled (the GPU's TinyLlama choice), fp32,
the state donated as on the GPU (``JaxBackend`` donates it on a GPU only; undonated, each call copies the
KV cache, which on this model's CPU step outweighs the rest of the host's work);
``--with-torch`` builds a torch model of TinyLlama's vocabulary and depth first (the heap a torch process
holds). Rounds alternate the weights passed as flat leaves (``JaxBackend.leaves``, the engine's path) and
as the nnx pytree (the path before: one jit of the same step, flattened per call), each with
``gc.freeze()`` off and on: ``launch_us`` per combination (median over rounds), tokens compared;
``--trivial``: the step swapped for one of the same signature without a model (the host's cost alone).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

TINYLLAMA = "tinyllama-1.1b"
CPU_MODEL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=22, num_heads=4, num_kv_heads=2,
                 head_dim=16)  # TinyLlama's depth at tiny widths


PARTS = (  # (name, the JAX model's weights: the torch model's by DLPack or random_model's, attention_impl)
    ("jax_dlpack", "torch", None), ("jax_random", "random", None), ("jax_dlpack_xla_attention", "torch", "xla"))
LAST_PART_S = 60.0  # the last part (a compile of its own) starts only with this much of the budget left


def frozen(on: bool, fn):
    """fn() with ``gc.freeze()`` (every object so far out of the collector's reach) when ``on``."""
    if on:
        gc.freeze()
    try:
        return fn()
    finally:
        if on:
            gc.unfreeze()


def rounds(variants: dict, reps: int, deadline: float) -> dict:
    """``variants`` (name -> fn() -> dict of figures) called in turn, ``reps`` rounds (alternating A/B),
    while before ``deadline``: per name its figures per round, the median of each number and how many
    times the garbage collector ran (per generation) during its calls."""
    runs: dict[str, list[dict]] = {n: [] for n in variants}
    collections = {n: [0, 0, 0] for n in variants}  # the collector's runs per generation during each variant's
    for _ in range(reps):
        for name, fn in variants.items():
            if time.perf_counter() < deadline:
                before = [g["collections"] for g in gc.get_stats()]
                runs[name].append(fn())
                collections[name] = [c + g["collections"] - b for c, g, b in zip(collections[name], gc.get_stats(), before)]
    out = {}
    for name, rs in runs.items():
        keys = [k for k in (rs[0] if rs else {}) if isinstance(rs[0][k], float)]
        out[name] = dict(rounds=len(rs), median={k: statistics.median(r[k] for r in rs) for k in keys},
                         per_round=[{k: round(r[k], 4) for k in keys} for r in rs],
                         tokens_sha1=sorted({r.get("tokens_sha1") for r in rs} - {None}),
                         gc_collections_by_generation=collections[name])
    return out


def jax_variants(backend, prompts, tokens: int) -> dict:
    """plain (step ms) and host (launch / wait us) with gc frozen off and on."""
    from jax_small_sweep import host, plain

    def one(freeze: bool):
        def run():
            p = frozen(freeze, lambda: plain(backend, prompts, tokens, 1))
            h = frozen(freeze, lambda: host(backend, prompts, tokens))
            return dict(step_ms=p["step_ms"], wall_ms=p["ms_per_token_wall"], launch_us=h["launch_us"],
                        wait_us=h["wait_us"], host_step_us=h["step_us"], tokens_sha1=p["tokens_sha1"])
        return run

    return {"gc": one(False), "gc_frozen": one(True)}


# -- the GPU


def gpu(args, deadline: float) -> dict:
    import jax
    import jax.numpy as jnp
    import torch

    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from jax_profile_gpu import SHAPES
    from jax_vs_torch_gpu import TorchSide, jax_model
    from jax_small_sweep import plain, prompts_for
    from shape_children import guarded

    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="fs_jax_cc_"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    dims = dict(SHAPES)[args.shape]
    args.gamma, args.batch_tokens = 4, args.tokens
    side = TorchSide(dims, args)
    row = dict(device=torch.cuda.get_device_name(), shape=args.shape, config=dims, tokens=args.tokens,
               torch=guarded(lambda: side.batch(1), deadline))
    save(args, row)
    prompts = prompts_for(dims["vocab_size"], 1, args.prompt_len)
    for name, source, attention in PARTS:
        if name == PARTS[-1][0] and deadline - time.perf_counter() < LAST_PART_S:
            row[name] = dict(skipped=f"under {LAST_PART_S} s of the budget left")
            continue

        def one(source=side.model if source == "torch" else None, attention=attention):
            t0 = time.perf_counter()
            m, where = jax_model(dims, source, jnp.bfloat16)
            m.attention_impl = attention
            backend = JaxBackend(m, eos_ids=[])
            backend.set_drafts([LookupDraft()])
            variants = (path_variants(backend, prompts, args.tokens, backend.steps.decode_one) if name == PARTS[0][0]
                        else jax_variants(backend, prompts, args.tokens))
            first = plain(backend, prompts, args.tokens, 1)  # the compile
            for v in variants.values():  # compile each path
                v()
            out = dict(weights=where, layer_loop="scan" if m.uses_scan() else "unrolled",
                       attention=m.attention_choice(), compile_and_first_s=time.perf_counter() - t0,
                       first_tokens_sha1=first["tokens_sha1"])
            out.update(rounds(variants, args.reps, deadline))
            return out
        row[name] = guarded(one, deadline)
        save(args, row)
    row["summary"] = gpu_summary(row)
    return row


def gpu_summary(row: dict) -> dict:
    t = row.get("torch", {}).get("plain", {}).get("step_ms")
    out = dict(torch_step_ms=t)
    for name, _, _ in PARTS:
        for mode, runs in row.get(name, {}).items():
            med = runs.get("median", {}) if isinstance(runs, dict) else {}
            if med:
                out[f"{name}_{mode}"] = dict(step_ms=med["step_ms"], launch_us=med["launch_us"], wait_us=med["wait_us"],
                                             over_torch=med["step_ms"] / t if t else None)
    out["tokens_equal_torch"] = {n: row.get(n, {}).get("first_tokens_sha1") == row.get("torch", {}).get("plain", {}).get("tokens_sha1")
                                 for n, _, _ in PARTS if n in row}
    return out


# -- the CPU


def cpu(args, deadline: float) -> dict:
    import jax.numpy as jnp
    import numpy as np

    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    row = dict(device=platform.processor() or platform.machine(), config=CPU_MODEL, tokens=args.tokens,
               with_torch=args.with_torch, trivial=args.trivial)
    if args.with_torch:
        row["torch_model"] = torch_heap()
    m = random_model(LlamaConfig(**CPU_MODEL, max_position_embeddings=1024), dtype=jnp.float32)
    m.scan_layers = False
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    prompts = np.random.default_rng(1).integers(0, CPU_MODEL["vocab_size"], (1, args.prompt_len)).tolist()
    step = trivial_step if args.trivial else backend.steps.decode_one
    variants = path_variants(backend, prompts, args.tokens, step)
    for v in variants.values():  # compile both paths
        v()
    row.update(tracked_objects=len(gc.get_objects()), **rounds(variants, args.reps, deadline))
    med = {k: row[k]["median"].get("launch_us") for k in variants}
    row["summary"] = dict(launch_us=med, tokens_agree=len({s for k in variants for s in row[k]["tokens_sha1"]}) == 1)
    return row


def path_variants(backend, prompts, tokens: int, step) -> dict:
    """``jax_variants`` per path of the weights into the same jitted decode step (the state donated, as on
    the GPU): ``leaves`` (``JaxBackend.leaves``, the engine's path since 7ab966c) and ``pytree`` (the nnx
    ``State`` flattened per call: the path of dc5b818 and before)."""
    import jax

    from flashspec_jax.backend import on_leaves, packed

    jit = lambda fn: jax.jit(fn, static_argnames=("cfg", "rows"), donate_argnames=("state",))  # noqa: E731
    nested_jit = jit(packed(step))

    def nested(weights, *rest, **kwargs):  # decode_one's call with the pytree, not the leaves
        return nested_jit(backend.weights, *rest, **kwargs)

    variants = {}
    for path, fn in (("leaves", jit(on_leaves(packed(step), backend.treedef, 0))), ("pytree", nested)):
        for mode, run in jax_variants(backend, prompts, tokens).items():
            def with_path(fn=fn, run=run):
                backend.decode_jit = fn
                return run()
            variants[f"{path}_{mode}"] = with_path
    return variants


def trivial_step(weights, state, cfg, seeds, offset, rows: int = 1):
    """``Steps.decode_one``'s signature and outputs, no model: one token of 0 appended (``--trivial``: the
    host's cost of a step alone, no device work beside it)."""
    from flashspec_jax.steps import StepOut

    seqs = state.seqs
    state = state._replace(seqs=seqs._replace(length=seqs.length + 1))
    return state, StepOut(seqs.length * 0, ~seqs.done, seqs.done)


def torch_heap() -> dict:
    """A torch model of TinyLlama's vocabulary and depth (small widths) on the CPU: torch's objects in the heap."""
    import torch

    from flashspec_torch.model import Llama, LlamaConfig

    t0 = time.perf_counter()
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512, num_layers=22, num_heads=4,
                      num_kv_heads=2, head_dim=64, max_position_embeddings=1024)
    torch_heap.model = Llama(cfg).eval()  # kept alive for the whole run
    return dict(torch=torch.__version__, build_s=time.perf_counter() - t0, tracked_objects=len(gc.get_objects()))


def save(args, row: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jax_same_process.json").write_text(json.dumps(row, indent=1, default=str))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=190.0, help="no round starts past it")
    ap.add_argument("--shape", default=TINYLLAMA, help="GPU: the shape (jax_profile_gpu.SHAPES), e.g. smollm2-135m")
    ap.add_argument("--cpu", action="store_true", help="the CPU's tiny unrolled model (module docstring)")
    ap.add_argument("--with-torch", action="store_true", help="--cpu: a torch model alive in the process")
    ap.add_argument("--trivial", action="store_true", help="--cpu: the step swapped for one without a model")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation (batch 1)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5, help="rounds (each variant once per round)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    deadline = start + args.budget_s
    row = cpu(args, deadline) if args.cpu else gpu(args, deadline)
    import jax

    row.update(script="benchmarks/jax_same_process.py", argv=sys.argv[1:] if argv is None else list(argv),
               date=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=time.perf_counter() - start,
               versions=dict(jax=jax.__version__, python=platform.python_version()), xla_flags=os.environ.get("XLA_FLAGS", ""))
    save(args, row)
    print(json.dumps(row["summary"], indent=1))


if __name__ == "__main__":
    main()
