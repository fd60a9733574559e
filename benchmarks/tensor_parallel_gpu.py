"""Tensor-parallel targets on several GPUs (issue #39's table): Llama-3-8B's shape with random bf16
weights, split over TP = 1, 2, 4 devices (as many as the machine has), for the torch engine
(torchrun, NCCL, the step in a CUDA graph) and the JAX engine (a ``tp`` mesh, XLA's SPMD
partitioner). Per (backend, TP, batch 1 and 32, plain and n-gram speculative decoding, greedy):
ms per step, ms per new token, the per-GPU weights floor (per-GPU weight bytes / HBM bandwidth),
the share of a step that the collectives alone take (the step's all-reduces and logits
all-gather timed by themselves: 2 L + 1 all-reduces of [B, T, C] and one all-gather of
[B, T, V / N]), and whether the tokens equal TP = 1's.

    export PYTHONPATH=$PWD/shared:$PWD:$PWD/benchmarks TRITON_INTERPRET=0
    python benchmarks/tensor_parallel_gpu.py --out $OUT/tp            # on a 2- or 4-GPU machine
    python benchmarks/tensor_parallel_gpu.py --out /tmp/tp --dry-run  # a tiny config on the CPU (2 devices, gloo)

Each (backend, TP) runs in its own child process (torchrun for torch) under a share of
``--budget-s``; one that fails or overruns is recorded as such and the others still run. Writes
``tensor_parallel.json`` (hardware, versions, date, every row, pass / fail per check) and
``tensor_parallel.log`` (the children's output tails) under ``--out``. NVLink multicast stays off
(NCCL_NVLS_ENABLE=0 and the like are forced in the children's environment).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                 num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position_embeddings=1024)
HBM_GBPS = 3350.0  # H100 SXM HBM3, nominal: the floor's bandwidth
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BATCHES, GAMMA, PROMPT = (1, 32), 4, 64


class Fixed:
    """Always the n-gram draft (arm 0): the same arms at every TP degree."""

    def choose(self) -> int:
        return 0

    def observe(self, *args) -> None:
        pass


def prompts(batch: int, vocab: int) -> list[list[int]]:
    """Random rows of a repeated motif, so that the n-gram draft finds continuations."""
    import numpy as np

    rs = np.random.default_rng(batch)
    return [(rs.integers(0, vocab, 8).tolist() * (PROMPT // 8)) for _ in range(batch)]


def measure(backend, cfg: dict, tokens: int, sync, seeds) -> list[dict]:
    """Per batch and mode: the generation twice (the first compiles / captures), the second timed.
    ``seeds``: a list of per-row seeds -> what the backend's step takes."""
    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, decode, speculate

    rows, greedy = [], SamplingConfig(0.0)
    for batch in BATCHES:
        ps, seed = prompts(batch, cfg["vocab_size"]), seeds([0] * batch)
        for mode in ("plain", "speculative"):
            def run():
                if mode == "plain":
                    return decode(backend, ps, sampling=greedy, max_new_tokens=tokens, seed=seed)
                return speculate(backend, Fixed(), ps, sampling=greedy, spec=SpecConfig(gamma=GAMMA, max_new_tokens=tokens),
                                 seed=seed)
            run()
            sync()
            start = time.perf_counter()
            out, records = run()
            sync()
            wall = time.perf_counter() - start
            steps = len(records)
            rows.append(dict(batch=batch, mode=mode, steps=steps, ms_per_step=1e3 * wall / steps,
                             ms_per_token=1e3 * wall / tokens, step_p50_ms=1e3 * statistics.median(r.seconds for r in records),
                             accepted=sum(r.accepted for r in records),
                             tokens_sha=hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16], first_row=out[0][:8]))
    return rows


def weight_floor(per_gpu_bytes: float) -> dict:
    return dict(per_gpu_weight_gb=per_gpu_bytes / 1e9, floor_ms=per_gpu_bytes / (HBM_GBPS * 1e9) * 1e3,
                floor_bandwidth_gbps=HBM_GBPS)


def child_torch(tp: int, cfg: dict, tokens: int) -> dict:
    """Under torchrun: every rank builds the same random target, splits it, runs the loop; rank 0 reports."""
    import torch
    import torch.distributed as dist

    from flashspec_torch import parallel
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.model import Llama, LlamaConfig
    from flashspec_torch.slots import TorchSlotBackend

    cuda = torch.cuda.is_available()
    rank, device = parallel.start(tp, torch.device("cuda" if cuda else "cpu"))
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Llama(LlamaConfig(**cfg)).to(dtype)
    for p in model.parameters():
        p.data.normal_(0, 0.02)
        dist.broadcast(p.data, 0)  # the same weights on every rank, whatever each GPU's generator does
    model = parallel.shard_model(model.eval().requires_grad_(False), rank, tp)
    per_gpu = sum(p.numel() * p.element_size() for p in model.parameters())
    backend = TorchSlotBackend(model, [LookupDraft()], [], None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        rows = measure(backend, cfg, tokens, sync, lambda s: torch.tensor(s, dtype=torch.int64, device=device))
        for row in rows:
            row["collectives_ms"] = collectives_torch(cfg, tp, row["batch"], 1 if row["mode"] == "plain" else GAMMA + 1,
                                                      dtype, device, sync)
            row["collective_share"] = row["collectives_ms"] / row["ms_per_step"]
    result = dict(backend="torch", tp=tp, rows=rows, graphs=backend.graphed, **weight_floor(per_gpu))
    dist.barrier()
    dist.destroy_process_group()
    return result if rank == 0 else {}


def collectives_torch(cfg: dict, tp: int, batch: int, t: int, dtype, device, sync, reps: int = 5) -> float:
    """ms of one step's collectives alone (eager, back to back): 2 L + 1 all-reduces, one all-gather."""
    import torch
    import torch.distributed as dist

    if tp == 1:
        return 0.0
    x = torch.ones(batch, t, cfg["hidden_size"], dtype=dtype, device=device)
    z = torch.ones(batch, t, cfg["vocab_size"] // tp, dtype=dtype, device=device)
    parts = torch.empty(batch * tp, t, z.shape[-1], dtype=dtype, device=device)
    times = []
    for _ in range(reps + 1):
        sync()
        start = time.perf_counter()
        for _ in range(2 * cfg["num_layers"] + 1):
            dist.all_reduce(x)
        dist.all_gather_into_tensor(parts, z)
        sync()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times[1:])


def child_jax(tp: int, cfg: dict, tokens: int) -> dict:
    """One process: the random target split over a mesh of ``tp`` devices, the host loop over jitted steps."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flashspec_jax import parallel
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    gpu = jax.default_backend() == "gpu"
    config = LlamaConfig(**cfg)
    model = random_model(config, dtype=jnp.bfloat16 if gpu else jnp.float32, seed=0)
    platform_name = jax.devices()[0].platform
    if tp > 1:
        model = parallel.shard_model(model, parallel.make_mesh(tp, platform_name))
    per_gpu = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(model))  # device 0's part
    backend = JaxBackend(model, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    rows = measure(backend, cfg, tokens, lambda: jax.block_until_ready(backend.state), lambda s: np.array(s, np.uint64))
    for row in rows:
        row["collectives_ms"] = collectives_jax(cfg, tp, row["batch"], 1 if row["mode"] == "plain" else GAMMA + 1, platform_name)
        row["collective_share"] = row["collectives_ms"] / row["ms_per_step"]
    return dict(backend="jax", tp=tp, rows=rows, devices=[str(d) for d in jax.devices()[:tp]], **weight_floor(per_gpu))


def collectives_jax(cfg: dict, tp: int, batch: int, t: int, platform_name: str, reps: int = 5) -> float:
    """ms of one step's collectives alone: 2 L + 1 psums of [B, T, C] and one all-gather, in one jit."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    if tp == 1:
        return 0.0
    mesh = parallel_mesh(tp, platform_name)
    n = 2 * cfg["num_layers"] + 1

    def body(x, z):  # per device: x [B, T, C], z [B, T, V / N]
        x = lax.fori_loop(0, n, lambda i, x: lax.psum(x, "tp") * 0.5, x)
        return x, lax.all_gather(z, "tp", axis=2, tiled=True)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, None, "tp")), out_specs=(P(), P()),
                              check_vma=False))
    x = jnp.ones((batch, t, cfg["hidden_size"]), jnp.bfloat16)
    z = jnp.ones((batch, t, cfg["vocab_size"]), jnp.bfloat16)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        jax.block_until_ready(f(x, z))
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times[1:])


def parallel_mesh(tp: int, platform_name: str):
    from flashspec_jax.parallel import make_mesh

    return make_mesh(tp, platform_name)


def run_part(backend: str, tp: int, args, timeout: float, log) -> dict:
    """One (backend, TP) in its own process(es); its JSON, or why there is none."""
    part = Path(tempfile.mkdtemp()) / "part.json"
    me = [str(Path(__file__).resolve()), "--child", backend, "--tp", str(tp), "--part", str(part),
          "--tokens", str(args.tokens)] + (["--dry-run"] if args.dry_run else [])
    env = dict(os.environ, **NO_MULTICAST)
    if backend == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp), *me]
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        cmd = [sys.executable, *me]
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        if args.dry_run:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
            env["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(timeout, 1))
        status = "ok" if run.returncode == 0 and part.exists() else f"failed (exit {run.returncode})"
        output = run.stdout[-2000:] + run.stderr[-4000:]
    except subprocess.TimeoutExpired as e:
        status, output = f"timeout after {timeout:.0f} s", str(e.stderr or "")[-4000:]
    log.write(f"==== {backend} tp={tp}: {status} in {time.perf_counter() - start:.1f} s\n{output}\n")
    log.flush()
    result = json.loads(part.read_text()) if status == "ok" else dict(backend=backend, tp=tp, rows=[])
    return dict(result, status=status, wall_s=time.perf_counter() - start)


def checks(parts: list[dict]) -> dict:
    """Per backend: every (batch, mode) row's tokens at each TP == TP = 1's."""
    out = {}
    for p in parts:
        base = next((q for q in parts if q["backend"] == p["backend"] and q["tp"] == 1 and q["rows"]), None)
        if p["tp"] == 1 or base is None:
            continue
        ref = {(r["batch"], r["mode"]): r["tokens_sha"] for r in base["rows"]}
        same = [ref.get((r["batch"], r["mode"])) == r["tokens_sha"] for r in p["rows"]]
        out[f"{p['backend']} tp={p['tp']} tokens == tp=1"] = "pass" if same and all(same) else "fail" if same else "not run"
    return out


def environment() -> dict:
    env = dict(python=platform.python_version(), date=str(date.today()), host=platform.node())
    try:
        import torch

        env.update(torch=torch.__version__, gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    except ImportError:
        pass
    try:
        import jax

        env.update(jax=jax.__version__)
    except ImportError:
        pass
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False, help="directory for tensor_parallel.json and tensor_parallel.log")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU: 2 devices / 2 gloo ranks")
    ap.add_argument("--budget-s", type=float, default=230.0, help="wall-clock budget of all parts together")
    ap.add_argument("--backends", default="torch,jax")
    ap.add_argument("--degrees", default=None, help="TP degrees (default: 1, 2, 4 up to the GPU count; dry run: 1, 2)")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per row")
    ap.add_argument("--child", choices=("torch", "jax"), help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cfg = TINY if args.dry_run else LLAMA3_8B
    if args.child:
        result = (child_torch if args.child == "torch" else child_jax)(args.tp, cfg, args.tokens)
        if result:
            Path(args.part).write_text(json.dumps(result))
        return
    if not args.out:
        ap.error("--out is required")
    if args.degrees:
        degrees = [int(d) for d in args.degrees.split(",")]
    elif args.dry_run:
        degrees = [1, 2]
    else:
        import torch

        degrees = [d for d in (1, 2, 4) if d <= torch.cuda.device_count()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [(b, d) for b in args.backends.split(",") for d in degrees]
    deadline, parts = time.perf_counter() + args.budget_s, []
    with open(out / "tensor_parallel.log", "w") as log:
        for i, (backend, tp) in enumerate(todo):
            share = (deadline - time.perf_counter()) / (len(todo) - i)
            parts.append(run_part(backend, tp, args, share, log))
            print(json.dumps({k: v for k, v in parts[-1].items() if k != "rows"}), flush=True)
    result = dict(script="benchmarks/tensor_parallel_gpu.py", dry_run=args.dry_run, shape="tiny" if args.dry_run else "llama3-8b",
                  config=cfg, gamma=GAMMA, prompt_tokens=PROMPT, new_tokens=args.tokens, environment=environment(),
                  checks=checks(parts), parts=parts)
    (out / "tensor_parallel.json").write_text(json.dumps(result, indent=1))
    print(f"{'backend':8}{'tp':>3}{'batch':>6}{'mode':>13}{'ms/step':>9}{'ms/tok':>8}{'floor':>7}{'coll%':>7}  tokens")
    for p in parts:
        for r in p["rows"]:
            print(f"{p['backend']:8}{p['tp']:>3}{r['batch']:>6}{r['mode']:>13}{r['ms_per_step']:>9.2f}{r['ms_per_token']:>8.2f}"
                  f"{p['floor_ms']:>7.2f}{100 * r['collective_share']:>6.1f}%  {r['tokens_sha']}")
    print(json.dumps(result["checks"]))


if __name__ == "__main__":
    main()
