"""The JAX engine and the torch engine side by side on one GPU: issue #37's table in one run.

    python benchmarks/jax_vs_torch_gpu.py --out DIR --budget-s 530   # on the GPU (random bf16 weights)
    python benchmarks/jax_vs_torch_gpu.py --dry-run --out DIR        # a tiny config on the CPU, JAX only

Everything does not fit one device call: ``bash scripts/gpu_session.sh jax1`` (SmolLM2-135M and
TinyLlama-1.1B) and ``jax2`` (Llama-3-8B alone) are the table's two calls (docs/jax.md has the
estimate per part). The shapes (``--shapes``: SmolLM2-135M, TinyLlama-1.1B, Llama-3-8B, in that
order) each run in a child process of their own (``shape_children``), killed when the shape's share
of ``--budget-s`` is up (``SHARES`` of what is left, by need, so a shape's unused time goes to the
next): one long compile costs its own shape's remaining parts, never the next shape. Inside a child
the parts run one after another in the order of issue #37's figures, each JAX run compiled just
before it is timed (nothing compiles beside a timing or before the first figure) and written as soon
as it finishes: a kill loses only the run it cuts. Parts 1 to 5 start until the share's end, 6 and 7
only before ``CHILD_SOFT`` of it; a part not started is recorded as skipped, one that fails with its
error (the others go on). Per shape:

1. ``torch`` batch 1: the torch engine (CUDA graphs, Triton verify), greedy, 128-token random
   prompts, ``--tokens`` new tokens: plain decoding and n-gram speculation (G = 4);
2. ``jax``: the JAX engine's default path at batch 1 (``Llama``'s choices on this GPU, recorded):
   plain decoding, n-gram speculation with the host loop and with the whole generation in one
   ``lax.while_loop`` (``flashspec_jax.whole``), and the compiled decode step's ``cost_analysis``
   bytes accessed (XLA's ops only: a Pallas kernel counts as unknown, so its own cache reads are
   not in the figure) and memory analysis;
3. ``torch`` at each of ``--batches`` (``--batch-tokens`` new tokens per row), then its model freed;
4. ``jax_batches``: the JAX engine the same way, batch size by batch size (plain decoding, then
   n-gram speculation with the host loop, as torch's; the while loop is compared with it at batch 1);
5. ``row_invariant``: batch 1, plain decoding over G + 1 positions per step
   (``JaxBackend.decode_rows``): its tokens against speculation's (bf16) and its ms per token;
6. ``jax_other_attention``: plain decoding at batch 1 with the other attention implementation than
   the default ("fused" against the einsum "xla"), and its decode step's bytes;
7. ``attention_paths`` (``--attention-shapes``): the attention of one token over all layers, alone,
   "xla" against "fused" (``choose_splits``' splits) and the kernel split the other way
   (``jax_parts.splits_at``), at each of ``--contexts`` (``jax_parts.attention_paths``).

With torch, JAX takes the torch model's random weights (``jax_model``: each tensor handed over by
DLPack, no host copy), so both engines decode the same model and the JAX model is not built anew.
Every loop is ``flashspec.loop.decode`` / ``speculate`` over the engine's backend (``Loops``), run
once to compile (or capture graphs) at the timed shapes, then timed once: ``step_ms`` is the mean
launch-to-launch step of the loop's records, ``wall_s`` the whole call (prefill included),
tokens/s = new tokens of all rows / wall. With ``--autotune-cache DIR`` (``gpu_session.sh``'s ``jax``
steps: /tmp/fs_autotune) the children share XLA's GEMM autotuning cache in DIR, so a call after
another on the same warm device recompiles the shapes it repeats without autotuning them again. The weights floor is the weights' bytes over the measured
copy bandwidth (torch's 1 GiB device copy; JAX's x + 1 without torch). Each child rewrites its JSON
after every timed run (a part cut by the kill is marked ``unfinished``); the parent merges them into
``jax_vs_torch.json`` (``jax_vs_torch_report.merge``: per child its share, wall time and whether it was
killed) and prints the table.
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

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402
from flashspec_jax import whole  # noqa: E402
from flashspec_jax.backend import JaxBackend  # noqa: E402
from flashspec_jax.drafts import LookupDraft  # noqa: E402
from flashspec_jax.model import LlamaConfig  # noqa: E402
from flashspec_jax.weights import from_state, random_model  # noqa: E402

import jax_parts  # noqa: E402  (benchmarks/ is on sys.path)
import jax_profile_gpu  # noqa: E402
import shape_children  # noqa: E402
from shape_children import CHILD_SOFT, TINY, guarded  # noqa: E402
from jax_vs_torch_report import checks_of, merge, summarize, table  # noqa: E402

SHAPES = jax_profile_gpu.SHAPES  # engine_gpu.py's, smallest first
SHARES = {"smollm2-135m": 0.2, "tinyllama-1.1b": 0.28, "llama3-8b": 0.52}  # of --budget-s, by need (others: equal)
ORDER = ("smollm2-135m", "tinyllama-1.1b", "llama3-8b")  # the quick shapes first: their unused time goes to 8B
GREEDY = SamplingConfig(0.0)
NOTES = ("step_ms: mean launch-to-launch step of flashspec.loop's records (steady-state decode ms/token at batch 1); "
         "ms_per_step_wall: wall (prefill included) / steps; tokens_per_s: new tokens of all rows / wall. JAX bytes: "
         "compiled decode step's cost_analysis 'bytes accessed' (XLA ops; Pallas kernels count as unknown). With torch, "
         "JAX runs the torch model's random weights (jax_weights; DLPack), so both engines decode the same model.")


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


class Loops:
    """Named generation runs over one backend: plain decoding, n-gram speculation (host loop) and, with
    ``device_loop`` (a ``whole.Whole``), the while loop (``names``: which of them). ``timed`` calls
    each once untimed (its compile, or graph capture: ``compile_and_first_s``), then again, timed,
    one run after another, with the tokens compared between the runs."""

    def __init__(self, backend, prompts, tokens: int, gamma: int, seed, sync, device_loop=None,
                 names=("plain", "spec_host", "spec_while")):
        spec = SpecConfig(gamma=gamma, max_new_tokens=tokens)
        runs = {"plain": lambda: decode(backend, prompts, sampling=GREEDY, max_new_tokens=tokens, seed=seed),
                "spec_host": lambda: speculate(backend, Fixed(), prompts, sampling=GREEDY, spec=spec, seed=seed),
                "spec_while": lambda: device_loop.run(prompts, max_new_tokens=tokens, gamma=gamma, sampling=GREEDY,
                                                      seed=seed, policy=whole.Fixed(0))}
        self.runs = {n: runs[n] for n in names if n != "spec_while" or device_loop is not None}
        self.backend, self.sync, self.batch, self.tokens = backend, sync, len(prompts), tokens
        self.first_s: dict[str, float] = {}
        self.outs: dict[str, list] = {}  # each timed run's tokens

    def call_first(self, name: str) -> None:
        t0 = time.perf_counter()
        self.runs[name]()
        self.sync()
        self.first_s[name] = time.perf_counter() - t0

    def timed(self, save=None) -> dict:
        """Each run timed once (``save(so far)`` after each); the comparisons between them."""
        out = dict(batch=self.batch, new_tokens=self.tokens)
        for name, fn in self.runs.items():
            if name not in self.first_s:
                self.call_first(name)
            t0 = time.perf_counter()
            res, rec = fn()
            self.sync()
            out[name] = figures(name, res, rec, time.perf_counter() - t0, self.first_s[name])
            self.outs[name] = res
            if save is not None:
                save(out)
        return compared(out, self.outs)


def figures(name: str, res: list, rec: list, wall_s: float, first_s: float) -> dict:
    """One timed run's figures from its tokens and the loop's records."""
    r = dict(compile_and_first_s=first_s, wall_s=wall_s, steps=len(rec), tokens_per_s=sum(map(len, res)) / wall_s,
             ms_per_step_wall=wall_s * 1e3 / max(1, len(rec)), tokens_sha1=hashlib.sha1(json.dumps(res).encode()).hexdigest())
    if name != "spec_while":  # the while loop's records carry no times
        r["step_ms"] = statistics.mean(x.seconds for x in rec) * 1e3
    if name != "plain":
        r["acceptance"] = sum(x.accepted for x in rec) / max(1, sum(x.drafted for x in rec))
        r["tokens_per_step"] = sum(x.emitted for x in rec) / max(1, len(rec))
    return r


def compared(out: dict, outs: dict) -> dict:
    """``out`` with the runs' tokens compared (those of ``outs`` that ran)."""
    if "spec_host" in outs and "plain" in outs:
        out["spec_equals_plain"] = outs["spec_host"] == outs["plain"]
    if "spec_while" in outs and "spec_host" in outs:
        out["while_equals_host"] = outs["spec_while"] == outs["spec_host"]
        out["while_over_host_step"] = out["spec_while"]["ms_per_step_wall"] / out["spec_host"]["ms_per_step_wall"]
    return out


def prompts_for(vocab: int, batch: int, prompt_len: int) -> list[list[int]]:
    return np.random.default_rng(batch).integers(0, vocab, (batch, prompt_len)).tolist()


class TorchSide:
    """The torch engine on one shape's random model (built on the first call, freed by ``free``)."""

    def __init__(self, dims: dict, args):
        self.dims, self.args, self.model = dims, args, None

    def batch(self, batch: int, save=None) -> dict:
        """Plain decoding and n-gram speculation at ``batch`` (``save(so far)`` after each run)."""
        import torch
        from flashspec_torch.backend import TorchBackend
        from flashspec_torch.drafts import LookupDraft as TorchLookup

        out = self.build() if self.model is None else {}
        seed = torch.zeros(batch, dtype=torch.int64, device="cuda")
        with torch.inference_mode():
            backend = TorchBackend(self.model, [TorchLookup()], eos_ids=[], verify_impl="triton", graphs=True)
            prompts = prompts_for(self.dims["vocab_size"], batch, self.args.prompt_len)
            out.update(Loops(backend, prompts, self.args.tokens if batch == 1 else self.args.batch_tokens, self.args.gamma,
                             seed, torch.cuda.synchronize, names=("plain", "spec_host")).timed(
                None if save is None else lambda runs: save(dict(out, **runs))))
        return out

    def build(self) -> dict:
        import engine_gpu
        import torch
        from flashspec_torch.model import LlamaConfig as TorchConfig

        t0 = time.perf_counter()
        self.model = engine_gpu.random_model(TorchConfig(**self.dims, max_position_embeddings=8192))
        torch.cuda.empty_cache()  # the float32 model it was cast from (32 GB at 8B): JAX allocates beside torch
        return dict(build_s=time.perf_counter() - t0,
                    weight_bytes=sum(p.numel() * p.element_size() for p in self.model.parameters()))

    def free(self) -> None:
        if self.model is not None:
            import torch

            self.model = None
            torch.cuda.empty_cache()


def jax_model(dims: dict, torch_model, dtype):
    """(the JAX model, where its weights came from): ``torch_model``'s weights when there is one (each
    tensor handed over by DLPack, stacked over layers on the device: both engines then run the same
    model), else ``random_model``'s (and when the handover fails, with its error)."""
    cfg = LlamaConfig(**dims, max_position_embeddings=8192)
    if torch_model is None:
        return random_model(cfg, dtype=dtype, seed=0), "random_model"
    try:
        state = {k: jnp.from_dlpack(v.detach().contiguous()) for k, v in torch_model.state_dict().items()}
        return from_state(cfg, state, dtype), "the torch model's (DLPack)"
    except Exception as e:
        return random_model(cfg, dtype=dtype, seed=0), f"random_model (DLPack handover failed: {type(e).__name__}: {e})"[:500]


def jax_backend(m):
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    return backend


def choices(m) -> dict:
    return dict(layer_loop="scan" if m.uses_scan() else "unrolled", attention=m.attention_choice())


def decode_bytes(backend, prompt_len: int, tokens: int) -> dict:
    """The compiled decode step's cost_analysis and memory analysis, and the HLO's data movers (batch 1)."""
    state = backend.start_state([[1] * prompt_len], tokens)
    compiled = backend.decode_jit.lower(backend.leaves, state, GREEDY, backend._seeds(0), jnp.uint32(0)).compile()
    hlo = jax_profile_gpu.parse_hlo(compiled.as_text())
    return dict(**jax_profile_gpu.cost(compiled), mover_bytes_by_op=hlo["mover_bytes_by_op"])


def jax_run(m, args, batch: int, tokens: int, names: tuple[str, ...], rows: int = 1) -> Loops:
    """``names`` of ``Loops``' runs over a backend of their own (``rows``: its ``decode_rows``), on
    ``batch`` random prompts."""
    backend = jax_backend(m)
    backend.decode_rows = rows
    device_loop = whole.Whole(backend) if "spec_while" in names else None
    return Loops(backend, prompts_for(m.config.vocab_size, batch, args.prompt_len), tokens, args.gamma,
                 np.zeros(batch, np.uint64), lambda: None, device_loop, names)


def jax_b1(m, args, plain: Loops, spec: Loops | None = None, save=None) -> dict:
    """Batch 1 with the model's current choices: ``plain``'s and ``spec``'s runs timed (``save`` after
    each), and the decode step's bytes."""
    out = dict(choices=choices(m))
    for lp in (plain, spec) if spec is not None else (plain,):
        out.update(lp.timed(None if save is None else lambda runs: save(dict(out, **runs))))
    compared(out, {**plain.outs, **(spec.outs if spec is not None else {})})
    out["bytes_per_step"] = decode_bytes(plain.backend, args.prompt_len, args.tokens)
    return out


def with_attention(m, impl: str, fn):
    """fn() with the model's ``attention_impl`` set to ``impl``, then back to None (the default)."""
    m.attention_impl = impl
    try:
        return fn()
    finally:
        m.attention_impl = None


def row_invariant(invariant: Loops, spec: Loops) -> dict:
    """Batch 1, greedy: plain decoding over G + 1 positions (``decode_rows``) timed, its tokens against
    n-gram speculation's (``spec``'s timed run, the same prompt)."""
    if "spec_host" not in spec.outs:
        raise RuntimeError("row_invariant compares with batch 1 speculation's tokens, and that run did not finish")
    r = invariant.timed()
    return dict(row_invariant_equals_spec=invariant.outs["plain"] == spec.outs["spec_host"], step_ms=r["plain"]["step_ms"],
                ms_per_step_wall=r["plain"]["ms_per_step_wall"], compile_and_first_s=r["plain"]["compile_and_first_s"])


def by_batch(batches: list[int], run, deadline: float, put) -> dict:
    """``run(b, partial)`` at each of ``batches`` in order, each started only before ``deadline``;
    ``put(so far)`` after each batch size and, through ``partial(runs)``, after each of its runs (the
    unfinished batch size marked), so a kill loses only the run it cuts."""
    out: dict = {}
    for b in batches:
        key = f"batch_{b}"
        partial = lambda runs, key=key: put(dict(out, **{key: dict(runs, unfinished=True)}))  # noqa: E731
        out[key] = guarded(lambda: run(b, partial), deadline)
        put(out)
    return out


def build_jax(row: dict, dims: dict, torch_model):
    """The shape's JAX model (``jax_model``; its weights on the device), its build figures into ``row``."""
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    t0 = time.perf_counter()
    m, row["jax_weights"] = jax_model(dims, torch_model, dtype)
    jax.block_until_ready(nnx.state(m))
    row.update(dtype=str(jnp.dtype(dtype)), jax_build_s=time.perf_counter() - t0, layer_bytes=m.layer_bytes(),
               jax_weight_bytes=int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(m)))))
    return m, dtype


def run_shape(name: str, dims: dict, args, batches: list[int], deadlines: tuple[float, float], save) -> dict:
    """One shape's parts in the order of issue #37's figures (module docstring), each run compiled just
    before it is timed and written (``save(row)``) as soon as it finishes. ``deadlines``: (the share's
    end, the last start of the parts after the issue's: the other attention, the attention alone)."""
    deadline, soft = deadlines
    row = dict(shape=name, config=dims, prompt_len=args.prompt_len, gamma=args.gamma)
    side = TorchSide(dims, args)

    def into(*keys):  # save(row) with a part's figures so far at row[keys...]
        def put(partial: dict) -> None:
            at = row
            for k in keys[:-1]:
                at = at[k]
            at[keys[-1]] = partial
            save(row)
        return put

    if args.torch:
        row["torch"] = {"batch_1": guarded(lambda: side.batch(1), deadline)}
        save(row)
    m, dtype = build_jax(row, dims, side.model)
    other = "xla" if m.attention_choice() != "xla" else "fused"
    b1_spec = jax_run(m, args, 1, args.tokens, ("spec_host", "spec_while"))
    parts = [("jax", lambda: jax_b1(m, args, jax_run(m, args, 1, args.tokens, ("plain",)), b1_spec,
                                    save=lambda partial: into("jax")(dict(partial, unfinished=True)))),
             ("torch_batches", lambda: by_batch(batches, lambda b, partial: side.batch(b, partial), deadline,
                                                into("torch", "batches"))),
             ("jax_batches", lambda: by_batch(batches, lambda b, partial: jax_run(
                 m, args, b, args.batch_tokens, ("plain", "spec_host")).timed(partial), deadline, into("jax_batches"))),
             ("row_invariant", lambda: row_invariant(jax_run(m, args, 1, args.tokens, ("plain",), rows=args.gamma + 1),
                                                     b1_spec)),
             ("jax_other_attention", lambda: with_attention(m, other, lambda: jax_b1(
                 m, args, jax_run(m, args, 1, args.tokens, ("plain",))))),
             ("attention_paths", lambda: jax_parts.attention_paths(dims, args.contexts, 1, args.reps, dtype, soft))]
    for part, fn in parts:
        if (part == "attention_paths" and name not in args.attention_shapes) or (part == "torch_batches" and not args.torch):
            continue
        out = guarded(fn, soft if part in ("jax_other_attention", "attention_paths") else deadline)
        into(*(("torch", "batches") if part == "torch_batches" else (part,)))(out)
        if part == "torch_batches":
            side.free()  # the torch model's memory back before JAX's batches
        print(json.dumps({part: {k: v for k, v in out.items() if k != "bytes_per_step"}})[:1500], flush=True)
    side.free()
    return row


def versions(with_torch: bool) -> dict:
    v = dict(jax=jax.__version__, python=platform.python_version())
    if with_torch:
        import torch
        import triton

        v.update(torch=torch.__version__, triton=triton.__version__)
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(ORDER), help="run in this order, each in its own process")
    ap.add_argument("--batches", default="8,64", help="batch sizes besides 1 (every shape, torch and JAX)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens at batch 1")
    ap.add_argument("--batch-tokens", type=int, default=64, help="new tokens per row at --batches")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20, help="timed calls of the parts timed alone (median)")
    ap.add_argument("--contexts", default="256,2048,8192", help="attention_paths' context lengths")
    ap.add_argument("--attention-shapes", default="smollm2-135m,llama3-8b")
    ap.add_argument("--budget-s", type=float, default=200.0, help="parts that would start past their shape's share are skipped")
    ap.add_argument("--no-torch", dest="torch", action="store_false")
    ap.add_argument("--autotune-cache", type=Path, help="XLA's per-fusion GEMM autotuning cache for every child "
                    "(a later run with the same directory, e.g. a second call on a warm device, skips what this one tuned)")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU, JAX only")
    ap.add_argument("--child", action="store_true", help="(internal) run --shapes in this process, the JSON to --out/"
                    + shape_children.RESULT)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args(argv)
    if args.dry_run:
        args.shapes, args.tokens, args.batch_tokens, args.prompt_len = "tiny", 8, 6, 12
        args.batches = "2" if args.batches == "8,64" else args.batches
        args.contexts, args.reps, args.torch = "1000", 2, False  # 1064 slots: the kernel in 2 splits
        args.attention_shapes = args.attention_shapes.replace("smollm2-135m,", "").replace("llama3-8b", "tiny")
    unknown = set(args.shapes.split(",")) - set(SHAPES) - ({"tiny"} if args.dry_run else set())
    if unknown:
        ap.error(f"--shapes: unknown {sorted(unknown)}; choose from {sorted(SHAPES)}")
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.attention_shapes = set(args.attention_shapes.split(","))
    return args


def main(argv=None) -> None:
    """One shape per child process (``shape_children``), each killed at its share of ``--budget-s``,
    their rows merged into one JSON; with ``--child``, every shape in this process."""
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.child:
        return run_here(args, argv)
    start, script = time.perf_counter(), str(Path(__file__).resolve())
    flags = [shape_children.AUTOTUNE_CACHE.format(dir=args.autotune_cache)] if args.autotune_cache else []
    command = lambda name, share, outdir: shape_children.flagged_command(flags, outdir / "child.log", [  # noqa: E731
        sys.executable, script, *argv, "--shapes", name, "--out", str(outdir), "--budget-s", f"{share:.1f}", "--child"])
    with tempfile.TemporaryDirectory() as tmp:
        children = shape_children.run_children(args.shapes.split(","), SHARES, args.budget_s, command, Path(tmp))
    batches = [int(b) for b in args.batches.split(",") if b]
    result = merge(children, batches, dict(script="benchmarks/jax_vs_torch_gpu.py", argv=argv), time.perf_counter() - start)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("jax_vs_torch_dry_run.json" if args.dry_run else "jax_vs_torch.json")
    shape_children.write_json(path, result)
    print(path)
    print(table(result["rows"], batches))
    print("issue #37 figures missing:", ", ".join(result["issue37_missing"]) or "none")


def run_here(args, argv: list[str]) -> None:
    """Every shape of ``args`` in this process, each of issue #37's parts started only while its shape's
    share of ``--budget-s`` lasts, the others only before ``CHILD_SOFT`` of it; the JSON rewritten after
    every part."""
    start = time.perf_counter()
    shapes = {"tiny": TINY} if args.dry_run else {n: SHAPES[n] for n in args.shapes.split(",")}
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.torch:
        from verify_kernels import copy_bandwidth_gbps

        bw, bw_source = copy_bandwidth_gbps("cuda") * 1e9, "torch: 1 GiB device-to-device copy, (read + write) / median time"
    else:
        bw, bw_source = jax_profile_gpu.bandwidth_gbps() * 1e9, "JAX: jitted x + 1 over 1 GiB, (read + write) / min time"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / shape_children.RESULT
    dev = jax.devices()[0]
    head = dict(script="benchmarks/jax_vs_torch_gpu.py", argv=argv,
                device=getattr(dev, "device_kind", str(dev)), platform=jax.default_backend(), versions=versions(args.torch),
                xla_flags=os.environ.get("XLA_FLAGS", ""), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                dry_run=args.dry_run, copy_bandwidth_gbps=bw / 1e9, floor_bandwidth=bw_source, notes=NOTES)
    rows, share = [], 0.0
    weights = {n: SHARES.get(n, 1.0 / len(shapes)) for n in shapes}
    for n, dims in shapes.items():
        begin, share = share, share + weights[n] / sum(weights.values())
        deadlines = (start + args.budget_s * share, start + args.budget_s * (begin + (share - begin) * CHILD_SOFT))
        save = lambda row: shape_children.write_json(path, dict(head, partial=True, rows=[*rows, row]))  # noqa: E731
        row = run_shape(n, dims, args, batches, deadlines, save)
        row["summary"] = summarize(row, bw, batches)
        rows.append(row)
    checks, info = checks_of(rows)
    result = dict(head, wall_s=time.perf_counter() - start, checks=checks, passed=all(checks.values()), info=info,
                  summary={r["shape"]: r["summary"] for r in rows}, rows=rows)
    shape_children.write_json(path, result)
    print(path)
    print(table(rows, batches))


if __name__ == "__main__":
    main()
