"""Two source trees side by side on one GPU: the default Triton and Pallas verify timings at the README's
shapes, their tokens, and the torch engine's tokens on random-weight models (issue #36's before / after).

    python benchmarks/before_after.py --tree OLD --tree NEW [--rounds 2] [--out DIR]

Each (tree, part) runs in a process of its own (the trees import the same package names), alternating the
trees round by round, so that drift of the card's clocks falls on both. Parts:

* ``torch``: ``flashspec_torch.verify`` (its default impl) at each shape, T = 0.7 with the draft's logits and
  log-probs given, and T = 0 at two shapes; timed as CUDA-graph replays back to back (median ms per step over input sets
  that together exceed the L2 cache three times).
* ``jax``: ``flashspec_jax.verify`` (its default impl) at the same shapes, as a jitted ``lax.scan`` over the
  input sets (median wall time of a call divided by its steps).
* ``engine``: random-weight Llama models of SmolLM2-135M's and TinyLlama-1.1B's shapes (bf16), the torch
  backend with its defaults (CUDA graphs on a GPU), plain decoding and n-gram speculation (G = 4), greedy and
  T = 0.7, batch 1 and 4: the tokens.

Writes ``before_after[_TAG].json``: per shape each tree's times (the faster of its rounds) and whether the tokens of
every tree are equal.
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
import time
from datetime import date
from pathlib import Path

SHAPES = [  # (B, G, V, dtype): the README's Triton table, then its floor table at G = 4 and a few G = 1, 8
    (1, 4, 128256, "bfloat16"), (8, 4, 128256, "bfloat16"), (32, 4, 128256, "bfloat16"),
    (256, 4, 128256, "bfloat16"), (256, 8, 128256, "bfloat16"),
    (128, 4, 128256, "bfloat16"), (256, 4, 128256, "float32"), (128, 4, 128256, "float32"),
    (32, 4, 128256, "float32"), (256, 4, 32000, "bfloat16"), (128, 4, 32000, "bfloat16"), (32, 4, 32000, "bfloat16"),
    (256, 4, 32000, "float32"), (128, 4, 32000, "float32"), (32, 4, 32000, "float32"),
    (256, 1, 128256, "bfloat16"), (32, 8, 128256, "bfloat16"), (128, 1, 32000, "float32"),
]
GREEDY_SHAPES = [(8, 4, 128256, "bfloat16"), (256, 4, 32000, "float32")]
L2_BYTES = 60 * 2**20
TEMPERATURE = 0.7


def input_count(b: int, g: int, v: int, itemsize: int) -> int:
    return max(2, -(-3 * L2_BYTES // (b * (g + 1) * v * itemsize)))


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(bytes(memoryview(a).cast("B")))
    return h.hexdigest()[:16]


def torch_inputs(b, g, v, dtype, count, device):
    import torch

    gen = torch.Generator(device=device).manual_seed(1234 + b * 7 + g * 131 + v)
    sets = []
    for _ in range(count):
        z = 2.0 * torch.randn(b, g + 1, v, device=device, generator=gen)
        w = z[:, :g] + 0.7 * torch.randn(b, g, v, device=device, generator=gen)
        logq = torch.log_softmax(w / TEMPERATURE, dim=-1)
        gumbel = -torch.log(-torch.log(torch.rand(b, g, v, device=device, generator=gen).clamp_min(1e-20)))
        x = torch.argmax(logq + gumbel, dim=-1)
        sets.append((z.to(getattr(torch, dtype)), x, w.to(getattr(torch, dtype)), logq.gather(-1, x[..., None])[..., 0]))
    return sets


def cases() -> list[tuple[int, int, int, str, float]]:  # (B, G, V, dtype, T)
    return [s + (TEMPERATURE,) for s in SHAPES] + [s + (0.0,) for s in GREEDY_SHAPES]


def run_torch() -> list[dict]:
    import torch
    from flashspec_torch import verify

    device = torch.device("cuda")
    rows = []
    for b, g, v, dtype, temperature in cases():
        rows.append(torch_shape(verify, b, g, v, dtype, temperature, device))
        torch.cuda.empty_cache()
    return rows


def torch_shape(verify, b, g, v, dtype, temperature, device) -> dict:
    import torch

    itemsize = 2 if dtype == "bfloat16" else 4
    sets = torch_inputs(b, g, v, dtype, input_count(b, g, v, itemsize), device)
    def step(z, x, w, logq):
        return verify(z, x, w, logq, temperature=temperature, seed=5, offset=3)

    eager = [step(*s) for s in sets]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets:
            step(*s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [step(*s) for s in sets]
    graph.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(o.tokens, e.tokens) for o, e in zip(outs, eager))
    replays = max(1, -(-32 // len(sets)))
    for _ in range(20):
        graph.replay()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / (replays * len(sets)))
    tokens = torch.stack([e.tokens for e in eager]).cpu().numpy()
    return dict(B=b, G=g, V=v, dtype=dtype, T=temperature, ms=statistics.median(times), graph_equals_eager=same,
                tokens=digest(tokens))


def run_jax() -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flashspec_jax import verify

    rows = []
    for b, g, v, dtype, temperature in cases():
        itemsize = 2 if dtype == "bfloat16" else 4
        count = input_count(b, g, v, itemsize)
        key = jax.random.PRNGKey(1234 + b * 7 + g * 131 + v)
        sets = []
        for i in range(count):
            kz, kw, kg = jax.random.split(jax.random.fold_in(key, i), 3)
            z = 2.0 * jax.random.normal(kz, (b, g + 1, v), jnp.float32)
            w = z[:, :g] + 0.7 * jax.random.normal(kw, (b, g, v), jnp.float32)
            logq = jax.nn.log_softmax(w / TEMPERATURE, axis=-1)
            x = jnp.argmax(logq + jax.random.gumbel(kg, w.shape), axis=-1).astype(jnp.int32)
            sets.append((z.astype(dtype), x, w.astype(dtype), jnp.take_along_axis(logq, x[..., None], -1)[..., 0]))

        def one(z, x, w, logq, offset):
            return verify(z, x, w, logq, temperature=temperature, seed=5, offset=offset)

        first = jax.jit(one)(*sets[0], 3)
        tokens = np.asarray(first.tokens)
        steps = max(256, 4 * count)

        def run(sets):
            def body(acc, _):
                for z, x, w, logq in sets:
                    res = one(z, x, w, logq, acc % 1000)
                    acc = acc + res.tokens[0, 0].astype(jnp.uint32)
                return acc, None
            return jax.lax.scan(body, jnp.uint32(0), None, length=max(1, steps // count))[0]

        fn = jax.jit(run)
        jax.block_until_ready(fn(sets))
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(sets))
            times.append((time.perf_counter() - t0) / (max(1, steps // count) * count))
        rows.append(dict(B=b, G=g, V=v, dtype=dtype, T=temperature, ms=1e3 * statistics.median(times),
                         tokens=digest(tokens)))
    return rows


ENGINE_SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32,
                           num_kv_heads=4, head_dim=64),
}


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def llama_config(**shape):
    try:
        from flashspec.config import LlamaConfig
    except ImportError:
        from flashspec_torch.model import LlamaConfig
    return LlamaConfig(**shape)


def run_engine() -> list[dict]:
    import torch
    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, decode, speculate
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.model import Llama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for name, shape in ENGINE_SHAPES.items():
        config = llama_config(**shape)
        torch.manual_seed(0)
        with torch.device(device):
            model = Llama(config).to(dtype)
        for p in model.parameters():
            p.data.normal_(0, 0.02)
        model = model.eval().requires_grad_(False)
        gen = torch.Generator().manual_seed(7)
        base = torch.randint(0, config.vocab_size, (4, 24), generator=gen).tolist()
        prompts = [p[:12] + p[:12] for p in base]  # a repeat, so the n-gram draft proposes
        for batch in (1, 4):
            for temperature in (0.0, 0.7):
                sampling = SamplingConfig(temperature)
                backend = TorchBackend(model, [LookupDraft()])
                plain, _ = decode(backend, prompts[:batch], sampling=sampling, max_new_tokens=48, seed=11)
                spec, _ = speculate(backend, Fixed(), prompts[:batch], sampling=sampling,
                                    spec=SpecConfig(gamma=4, max_new_tokens=48), seed=11)
                rows.append(dict(shape=name, batch=batch, T=temperature, plain=plain, spec=spec,
                                 greedy_spec_equals_plain=temperature > 0 or plain == spec))
        del model
    return rows


def worker(part: str) -> None:
    rows = {"torch": run_torch, "jax": run_jax, "engine": run_engine}[part]()
    print("ROWS " + json.dumps(rows))


def run_part(tree: Path, part: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=f"{tree / 'shared'}:{tree}", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", part], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("ROWS "):
            return json.loads(line[5:])
    raise RuntimeError(f"{tree} {part} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def compare(results: dict[str, dict[str, list[list[dict]]]], trees: list[str]) -> dict:
    out = {}
    for part in ("torch", "jax"):
        if part not in results[trees[0]]:
            continue
        table = []
        for i, row in enumerate(results[trees[0]][part][0]):
            entry = {k: row[k] for k in ("B", "G", "V", "dtype", "T")}
            for t in trees:
                entry[f"ms[{t}]"] = min(r[i]["ms"] for r in results[t][part])
            entry["same_tokens"] = len({results[t][part][0][i]["tokens"] for t in trees}) == 1
            entry["ratio_last_over_first"] = entry[f"ms[{trees[-1]}]"] / entry[f"ms[{trees[0]}]"]
            table.append(entry)
        out[part] = table
    if "engine" in results[trees[0]]:
        first = results[trees[0]]["engine"][0]
        out["engine"] = [dict(shape=r["shape"], batch=r["batch"], T=r["T"],
                              same_tokens=all(results[t]["engine"][0][i]["plain"] == r["plain"] and
                                              results[t]["engine"][0][i]["spec"] == r["spec"] for t in trees),
                              greedy_spec_equals_plain=[results[t]["engine"][0][i]["greedy_spec_equals_plain"]
                                                        for t in trees])
                         for i, r in enumerate(first)]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", type=Path, help="a source tree (twice or more)")
    p.add_argument("--parts", default="torch,jax,engine")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    p.add_argument("--tag", default="", help="the JSON is before_after[_TAG].json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if not args.tree or len(args.tree) < 2:
        p.error("give --tree at least twice")
    names = [str(t) for t in args.tree]
    results: dict[str, dict[str, list]] = {n: {} for n in names}
    for part in args.parts.split(","):
        rounds = 1 if part == "engine" else args.rounds
        for _ in range(rounds):
            for tree, name in zip(args.tree, names):
                t0 = time.perf_counter()
                results[name].setdefault(part, []).append(run_part(tree.resolve(), part))
                print(f"{part} {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    summary = compare(results, names)
    env = dict(date=str(date.today()), python=platform.python_version(), trees=names)
    try:
        import torch
        env.update(torch=torch.__version__, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    except ImportError:
        pass
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"before_after{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(dict(environment=env, summary=summary, raw=results),
                                                           indent=1))
    for part, table in summary.items():
        for row in table:
            print(part, json.dumps(row))


if __name__ == "__main__":
    main()
