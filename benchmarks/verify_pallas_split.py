"""Where a Pallas verify step's time goes at small shapes: the step against its first kernels alone.

Each stage runs S steps inside one jitted ``lax.scan`` over k rotating input sets (separate buffers,
one step per set in the scan body, as ``verify_variants.py``'s unrolled loop), every step's offset
depending on the previous step's output, so the steps are serial as in decoding:

* ``stats``: the normaliser kernel (``row_stats``) of the target rows only;
* ``stats+decide``: that plus the final kernel (``final_decide``: accept test, n, the sweep of row n);
* ``step``: the whole ``flashspec_jax.verify(impl="pallas")`` (plus the candidates' reduction and the
  token assembly in jnp);
* ``step-two-argmax``: the same with the previous epilogue (``final.pick_draw_reference``: two argmaxes
  and an any across the chunks, where ``final.pick_draw`` is one variadic reduction).

The differences are what each part costs in the loop (launch gaps included). The compiled loop's
HLO gives the number of kernels a step launches (fusions and custom calls in the scan body, per
step). On CPU it runs in interpret mode with tiny shapes (``--dry-run``), to check the script.

    python benchmarks/verify_pallas_split.py --out $OUT      # H200: verify_pallas_split.json
"""

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from jax_timing import median_seconds, scan_over_sets  # noqa: E402  (benchmarks/ is on sys.path)

SHAPES = [(1, 4, 128256), (8, 4, 128256), (32, 4, 32000), (32, 4, 128256)]  # (B, G, V), bf16, T = 0.7


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help="B:G:V,... (default: %s)" % SHAPES)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes in interpret mode (CPU)")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    p.add_argument("--tag", default="", help="suffix of the JSON's name (e.g. a run under other XLA_FLAGS)")
    return p.parse_args(argv)


def stage_fns(temperature: float, interpret: bool):
    """name -> one(acc, (z, x, w, lq)) -> (acc, a value that depends on the stage's outputs)."""
    import jax.numpy as jnp

    from flashspec_jax import verify
    from flashspec_jax.kernels import final
    from flashspec_jax.kernels.verify import choose_config, row_stats
    from flashspec_jax.verify import make_counters, verify_jit

    def config_of(z):
        return choose_config(z.shape[0], z.shape[1] - 1, z.shape[2], z.dtype.itemsize, interpret)

    def stats(acc, inp):
        z = inp[0]
        m, l = row_stats(z, temperature=temperature, greedy=False, config=config_of(z), interpret=interpret,
                         scale_max=False)
        return acc + (m.sum() + l.sum()).astype(jnp.uint32), m

    def decide(acc, inp):
        z, x, w, lq = inp
        cfg = config_of(z)
        st = row_stats(z, temperature=temperature, greedy=False, config=cfg, interpret=interpret, scale_max=False)
        c = make_counters(jnp.uint32(7), jnp.uint32(0), acc, z.shape[0])
        partials, n, _ = final.final_decide(z, x, w, lq, st, None, c, temperature=temperature,
                                            raw_max=cfg.loops == "lanes", config=cfg, interpret=interpret)
        return acc + n.sum().astype(jnp.uint32) + partials[1].sum().astype(jnp.uint32), n

    def step(acc, inp):
        res = verify(*inp, seed=jnp.uint32(7), offset=acc, temperature=temperature, impl="pallas")
        return acc + res.tokens.sum().astype(jnp.uint32), res.tokens

    def step_two_argmax(acc, inp):  # the step with the previous epilogue (final.pick_draw_reference)
        fast = final.pick_draw
        final.pick_draw = final.pick_draw_reference  # read when verify is traced, restored right after
        verify_jit.clear_cache()  # (its cached trace holds the other epilogue)
        try:
            return step(acc, inp)
        finally:
            final.pick_draw = fast
            verify_jit.clear_cache()

    return {"stats": stats, "stats+decide": decide, "step": step, "step-two-argmax": step_two_argmax}


def kernels_per_step(hlo: str, k: int) -> dict:
    """Kernel launches in the scan body of compiled HLO text: fusions and custom calls, per step, and
    what each fusion of the body computes (its kind and the opcodes of its fused computation, with
    how many times that fusion occurs in the body: k steps)."""
    comps = re.split(r"\n(?=\S)", hlo)
    body = max(comps, key=lambda comp: comp.count("custom-call("))  # the unrolled body
    ops = re.findall(r"\s([a-z][a-z-]*)\(", body)
    named = {m.group(1): c for c in comps if (m := re.match(r"%?([\w.\-]+)\s", c))}
    fusions: dict[str, int] = {}
    for kind, called in re.findall(r"fusion\(.*?kind=(k\w+).*?calls=%?([\w.\-]+)", body):
        inner = re.findall(r"\s([a-z][a-z-]*)\(", named.get(called, ""))
        what = f"{kind}: " + " ".join(sorted(set(inner) - {"parameter", "constant", "get-tuple-element", "tuple"}))
        fusions[what] = fusions.get(what, 0) + 1
    return dict(fusions_per_step=ops.count("fusion") / k, custom_calls_per_step=ops.count("custom-call") / k,
                other_ops=sorted(set(ops) - {"fusion", "custom-call", "parameter", "get-tuple-element", "tuple"}),
                fusions=fusions)


def time_stage(one, sets, steps: int, on_gpu: bool) -> tuple[float, dict]:
    fn = scan_over_sets(lambda acc, inp: one(acc, inp)[0], sets, steps)
    counts = kernels_per_step(fn.lower(sets).compile().as_text(), len(sets))
    return 1e6 * median_seconds(fn, (sets,), 7 if on_gpu else 1) / steps, counts


def make_sets(b: int, g: int, v: int, dtype, temperature: float, k: int):
    import jax
    import jax.numpy as jnp

    kz, kw, kg = jax.random.split(jax.random.key(b * 7919 + g * 31 + v), 3)
    z = (2.0 * jax.random.normal(kz, (k, b, g + 1, v), jnp.float32)).astype(dtype)
    w = (z[:, :, :g].astype(jnp.float32) + 1.4 * jax.random.normal(kw, (k, b, g, v), jnp.float32)).astype(dtype)
    log_q = jax.nn.log_softmax(w.astype(jnp.float32) / temperature, axis=-1)
    x = jnp.argmax(log_q + jax.random.gumbel(kg, log_q.shape), axis=-1).astype(jnp.int32)
    lq = jnp.take_along_axis(log_q, x[..., None], axis=-1)[..., 0]
    return [tuple(a[j] for a in (z, x, w, lq)) for j in range(k)]


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    on_gpu = jax.default_backend() in ("gpu", "cuda")
    shapes = SHAPES if args.shapes is None else [tuple(int(t) for t in s.split(":")) for s in args.shapes.split(",")]
    if args.dry_run:
        shapes = [(2, 2, 300)]
    stages = stage_fns(args.temperature, interpret=not on_gpu)
    rows = []
    for b, g, v in shapes:
        itemsize = jnp.dtype(args.dtype).itemsize
        per_set = (g + 2) * b * v * itemsize
        k = max(2, min(32, math.ceil(3 * 60e6 / per_set))) if on_gpu else 2  # 3x the L2 in flight
        sets = make_sets(b, g, v, getattr(jnp, args.dtype), args.temperature, k)
        row = dict(B=b, G=g, V=v, dtype=args.dtype, temperature=args.temperature, buffers=k, steps=k * math.ceil(32 / k))
        for name, one in stages.items():
            try:
                us, counts = time_stage(one, sets, row["steps"], on_gpu)
                row[name] = dict(us_per_step=us, **counts)
            except Exception as e:  # noqa: BLE001 - reported, the other stages still run
                row[name] = dict(error=f"{type(e).__name__}: {e}"[:300])
        print(json.dumps(row), flush=True)
        rows.append(row)
        del sets
    name = "verify_pallas_split" + ("_dry" if args.dry_run else "") + (f"_{args.tag}" if args.tag else "")
    out = Path(args.out) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # --out may name a folder that does not exist yet
    env = dict(jax=jax.__version__, backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
               date=time.strftime("%Y-%m-%d"), xla_flags=os.environ.get("XLA_FLAGS", ""))
    out.write_text(json.dumps(dict(environment=env, rows=rows), indent=1))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
