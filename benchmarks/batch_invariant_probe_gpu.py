"""Issue #40 per op: which op of the torch batch-invariant path first gives a request's rows other bits
inside a batch than alone, in a prefill, a decode step and a scoring pass?

    python benchmarks/batch_invariant_probe_gpu.py --out $OUT/batch_invariant_probe.json [--shape smollm2-135m]

A random bf16 model of the shape (``batch_invariant_gpu.random_model``), batch-invariant mode, eager (the
kernels of the graphed engine, PDL on). Requests 0-3 (``batch_invariant_gpu.py``'s prompts of 8-40 tokens, by
default those of its default run) sit at rows 0-3 of a batch of 16 and at rows 63-60 of a batch of 64
(reversed), as its checks place them. Per
batch and pass, the way the engine runs it: the prefill of every prompt token but the last (the batch
right-padded, attending its longest), one decode step of the last prompt token and a scoring pass of it
and 4 random tokens (G + 1 = 5 rows per request, 80 or 320 in all; cache of 512 slots, attending all, as
graphed). Every op the model calls (add + RMSNorm, the products, qkv with its RoPE + KV write, gate_up with
its SwiGLU, attention) is wrapped:

* ``isolated``: each call in the batch is run again on a probed request's rows alone (its inputs sliced
  from the batch's, the KV cache written by the batch, the attention bound its run alone has); the
  labels (layer, op) where the rows differ, the first one, and counts per op;
* ``first_diverging``: the request run alone through the same passes; the first (layer, op) whose
  output rows differ from the batch's (ops before it got the same inputs);
* ``repeat_diverging``: the same for the batch run a second time (not None: a race, not the batch).

Both under two launch settings: ``engine`` (this revision's ``launch_tiling``) and ``m64`` (64-row tiles
for the shape's products on this card as if its evidence had checked them: main before issue #40's
fix; the same as ``engine`` on a card not in ``MMA64_CARDS``). ``--device cpu --tiny`` (TRITON_INTERPRET=1)
tests the script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import triton

from flashspec_torch import invariant_matmul as I
from flashspec_torch import layers as L
from flashspec_torch import model as M
from flashspec_torch.model import Llama, LlamaConfig
from batch_invariant_gpu import SHAPES, draw_requests, random_model  # benchmarks/ is on sys.path for scripts

OPS = ("add_rms_norm", "invariant_matmul", "invariant_matmul_rope_kv", "invariant_matmul_swiglu", "attention")
PRODUCTS = OPS[1:4]  # labelled by projection (``product_names``)
REQUESTS = 4
CACHE_SLOTS = 512  # the graphed engine's cache at these lengths (backend.allocate), attended whole


def product_names(c: LlamaConfig) -> dict[tuple[int, int], str]:
    """(N, K) -> the projection's name (o and down share N; K tells them apart)."""
    h, hd = c.hidden_size, c.head_dim
    return {((c.num_heads + 2 * c.num_kv_heads) * hd, h): "qkv", (h, c.num_heads * hd): "o",
            (2 * c.intermediate_size, h): "gate_up", (h, c.intermediate_size): "down", (c.vocab_size, h): "lm_head"}


class Probe:
    """Wraps ``flashspec_torch.model``'s ops while active. ``rows``: (batch row, tokens) of each probed
    request; ``alone_attend``: its attention bound alone (None: the batch's). Records each call's output
    rows per request (``records``) and, with ``isolate``, the calls whose rows differ when the op runs on
    the request's rows alone (``differing``)."""

    def __init__(self, model: Llama, rows: list[tuple[int, int]], isolate: bool, alone_attend: list[int | None]):
        self.model, self.rows, self.isolate, self.alone_attend = model, rows, isolate, alone_attend
        self.names = product_names(model.config)
        self.layer = "embed"
        self.records: list[list[tuple[str, torch.Tensor]]] = [[] for _ in rows]
        self.differing: list[list[str]] = [[] for _ in rows]

    @contextlib.contextmanager
    def active(self):
        saved = {op: getattr(M, op) for op in OPS}
        block_fwd, logits_fwd = M.Block.forward_invariant, M.Llama.forward_logits
        index = {id(b): i for i, b in enumerate(self.model.layers)}
        probe = self

        def forward_invariant(block, *args):
            probe.layer = f"layer {index[id(block)]}"
            return block_fwd(block, *args)

        def forward_logits(model, *args):
            probe.layer = "final"
            return logits_fwd(model, *args)

        try:
            for op in OPS:
                setattr(M, op, getattr(self, op))
            M.Block.forward_invariant, M.Llama.forward_logits = forward_invariant, forward_logits
            yield self
        finally:
            for op, fn in saved.items():
                setattr(M, op, fn)
            M.Block.forward_invariant, M.Llama.forward_logits = block_fwd, logits_fwd

    def note(self, i: int, label: str, batch: list[torch.Tensor], alone: list[torch.Tensor] | None) -> None:
        self.records[i].append((label, torch.cat([t.reshape(-1) for t in batch])))
        if alone is not None and not all(torch.equal(a, b) for a, b in zip(alone, batch)):
            self.differing[i].append(label)

    def invariant_matmul(self, x, w, pdl=False):  # x [B, T, K]
        return self.product(I.invariant_matmul, x, w, pdl)

    def invariant_matmul_swiglu(self, x, w, pdl=False):  # gate_up with its SwiGLU epilogue: x [B, T, K]
        return self.product(I.invariant_matmul_swiglu, x, w, pdl)

    def product(self, fn, x, w, pdl):
        y = fn(x, w, pdl)
        label = f"{self.layer} {self.names.get(tuple(w.shape), 'product')}"
        for i, (b, n) in enumerate(self.rows):
            alone = [fn(x[b : b + 1, :n].contiguous(), w, pdl)] if self.isolate else None
            self.note(i, label, [y[b : b + 1, :n]], alone)
        return y

    def add_rms_norm(self, h, d, weight, eps, impl="reference", pdl=False):  # h, d [B, T, C]; h updated in place
        ins = [(h[b : b + 1, :n].clone(), None if d is None else d[b : b + 1, :n].clone()) for b, n in self.rows]
        h, y = L.add_rms_norm(h, d, weight, eps, impl, pdl)
        for i, ((b, n), (h0, d0)) in enumerate(zip(self.rows, ins)):
            alone = list(L.add_rms_norm(h0, d0, weight, eps, impl, pdl)) if self.isolate else None
            self.note(i, f"{self.layer} add_rms_norm", [h[b : b + 1, :n], y[b : b + 1, :n]], alone)
        return h, y

    def invariant_matmul_rope_kv(self, x, w, rope, pdl=False):
        """qkv with RoPE + KV write as its epilogue (x [B, T, K]; rope: an ``invariant_matmul.RopeKV``): q
        [B, H, T, D] and the cache rows written."""
        k_cache, v_cache, positions = rope.k_cache, rope.v_cache, rope.positions
        caches = [(k_cache[b : b + 1].clone(), v_cache[b : b + 1].clone()) for b, _ in self.rows]  # [1, H_kv, S, D]
        q = I.invariant_matmul_rope_kv(x, w, rope, pdl)
        label = f"{self.layer} {self.names.get(tuple(w.shape), 'product')}"
        for i, ((b, n), (k0, v0)) in enumerate(zip(self.rows, caches)):
            p0 = int(positions[b, 0])
            written = [q[b : b + 1, :, :n], k_cache[b : b + 1, :, p0 : p0 + n], v_cache[b : b + 1, :, p0 : p0 + n]]
            alone = None
            if self.isolate:
                sl = (slice(b, b + 1), slice(0, n))
                mine = replace(rope, cos=rope.cos[sl], sin=rope.sin[sl], positions=positions[sl], k_cache=k0, v_cache=v0)
                alone = [I.invariant_matmul_rope_kv(x[sl].contiguous(), w, mine, pdl), k0[:, :, p0 : p0 + n],
                         v0[:, :, p0 : p0 + n]]
            self.note(i, label, written, alone)
        return q

    def attention(self, q, k_cache, v_cache, positions, mask, kv_heads, impl="reference", pdl=False, attend_len=None,
                  invariant=False):  # q [B, H, T, D] -> [B, T, H D]
        out = L.attention(q, k_cache, v_cache, positions, mask, kv_heads, impl, pdl, attend_len, invariant)
        for i, (b, n) in enumerate(self.rows):
            alone = None
            if self.isolate:
                attend = self.alone_attend[i] or attend_len
                alone = [L.attention(q[b : b + 1, :, :n].contiguous(), k_cache[b : b + 1], v_cache[b : b + 1],
                                            positions[b : b + 1, :n].contiguous(), None, kv_heads, impl, pdl, attend,
                                            invariant)]
            self.note(i, f"{self.layer} attention", [out[b : b + 1, :n]], alone)
        return out


def batch_passes(prompts: list[list[int]], extra: list[list[int]], device) -> list[tuple]:
    """The engine's passes over a batch: (name, tokens [B, T], positions [B, T], attend, logits_last, each
    row's tokens): the prefill of all but each prompt's last token (right-padded), one decode step of
    that token, a scoring pass of it and the row's ``extra`` tokens (at the same positions)."""
    lengths = [len(p) for p in prompts]
    t = max(lengths) - 1
    pre = torch.tensor([p[:-1] + [0] * (t + 1 - len(p)) for p in prompts], device=device)
    last = torch.tensor([[p[-1]] for p in prompts], device=device)
    start = torch.tensor([[n - 1] for n in lengths], device=device)
    g1 = 1 + len(extra[0])
    scored = torch.cat([last, torch.tensor(extra, device=device)], 1)
    return [("prefill", pre, torch.arange(t, device=device)[None].expand(len(prompts), -1), t, 0, [n - 1 for n in lengths]),
            ("decode", last, start, CACHE_SLOTS, None, [1] * len(prompts)),
            ("scoring", scored, start + torch.arange(g1, device=device), CACHE_SLOTS, None, [g1] * len(prompts))]


def first_diverging(alone: list[tuple[str, torch.Tensor]], batch: list[tuple[str, torch.Tensor]]) -> str | None:
    assert [a for a, _ in alone] == [b for b, _ in batch], "the runs called other ops"
    return next((label for (label, a), (_, b) in zip(alone, batch) if not torch.equal(a, b)), None)


def recorded(m: Llama, prompts, extra, probed: list[int], device) -> dict[tuple[str, int], list]:
    """The passes over the batch ``prompts`` without isolation: (pass, request) -> the request's records."""
    cache = m.new_cache(len(prompts), CACHE_SLOTS)
    out = {}
    for name, tokens, pos, attend, last, rows in batch_passes(prompts, extra, device):
        probe = Probe(m, [(b, rows[b]) for b in probed], False, [None] * len(probed))
        with probe.active():
            m(tokens, pos, cache, attend, logits_last=last)
        out.update({(name, r): probe.records[r] for r in range(len(probed))})
    return out


def probe_batch(m: Llama, prompts, extra, probed: list[int], device) -> list[dict]:
    """Requests at rows ``probed`` of the batch ``prompts``: each pass's isolated differences, its first
    diverging op against the request run alone through the same passes, and against the batch run again
    (``repeat_diverging``: not None would be a race, not the batch)."""
    alone = {}
    for r, b in enumerate(probed):
        alone.update({(name, r): rec for (name, _), rec in recorded(m, [prompts[b]], [extra[b]], [0], device).items()})
    cache = m.new_cache(len(prompts), CACHE_SLOTS)
    out = []
    for name, tokens, pos, attend, last, rows in batch_passes(prompts, extra, device):
        alone_attend = [rows[b] if name == "prefill" else None for b in probed]  # a prefill alone attends its own length
        probe = Probe(m, [(b, rows[b]) for b in probed], True, alone_attend)
        with probe.active():
            m(tokens, pos, cache, attend, logits_last=last)
        for r, b in enumerate(probed):
            diff = probe.differing[r]
            by_op = {op: sum(label.endswith(" " + op) for label in diff) for op in OPS if op not in PRODUCTS}
            by_op.update({p: sum(label.endswith(" " + p) for label in diff) for p in probe.names.values()})
            out.append(dict(**{"pass": name}, rows=int(tokens.numel()), request=r, row=b,
                            first_diverging=first_diverging(alone[name, r], probe.records[r]),
                            isolated_first=diff[0] if diff else None, isolated_differing=len(diff),
                            isolated_by_op={k: v for k, v in by_op.items() if v}, records=probe.records[r]))
    again = recorded(m, prompts, extra, probed, device)
    for row in out:
        row["repeat_diverging"] = first_diverging(row.pop("records"), again[row["pass"], row["request"]])
    return out


@contextlib.contextmanager
def launches(setting: str, m: Llama, device: str):
    """``engine``: this revision's launches; ``m64``: the card's 64-row launches for the shape's products too."""
    card = I.card(torch.device(device))
    saved = I.MMA64_CARDS
    if setting == "m64" and card in saved:
        extra = frozenset(product_names(m.config))
        I.MMA64_CARDS = {**saved, card: replace(saved[card], products=saved[card].products | extra)}
    try:
        yield
    finally:
        I.MMA64_CARDS = saved


def launch_table(m: Llama, batches: list[int], prompts, device: str) -> dict:
    """Per product and pass row count: the tiling ``launch_tiling`` takes under each setting (block_m, block_n, span)."""
    longest = max(len(p) for p in prompts[: max(batches)]) - 1
    ms = sorted({1, 5, *batches, *(5 * b for b in batches), longest, longest * max(batches)})
    out = {}
    for setting in ("engine", "m64"):
        with launches(setting, m, device):
            gpu = I.evidence_card(m.embed.weight)
            out[setting] = {f"{name} M={mm}": "m{block_m} n{block_n} span{span}".format(
                **vars(I.launch_tiling(I.invariant_tiling(n, k, torch.bfloat16), mm, n, k, gpu)))
                for (n, k), name in product_names(m.config).items() for mm in ms}
    return out


def summarize(runs: list[dict]) -> dict:
    """Per setting, batch and pass: the requests whose rows differed alone vs in the batch, and the ops."""
    out = {}
    for r in runs:
        key = f"{r['launches']} batch {r['batch']} {r['pass']}"
        row = out.setdefault(key, dict(requests_differing=0, isolated_first=[], first_diverging=[], repeat_diverging=[]))
        if r["isolated_differing"] or r["first_diverging"]:
            row["requests_differing"] += 1
        for f in ("isolated_first", "first_diverging", "repeat_diverging"):
            if r[f] and r[f] not in row[f]:
                row[f].append(r[f])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="smollm2-135m", help="one of " + ", ".join(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, batches of 4 and 6 (a CPU test of the script)")
    ap.add_argument("--draws-after", default="tinyllama-1.1b", help="as batch_invariant_gpu.py's: the default draws "
                    "SmolLM2's requests of its default run (where requests 2 and 3 failed on the H200, main at d959329)")
    ap.add_argument("--budget-s", type=float, default=90.0, help="no (setting, batch) part starts after this many seconds")
    args = ap.parse_args()
    shape = "tiny" if args.tiny else args.shape
    if shape not in SHAPES:
        raise SystemExit(f"--shape {shape!r} unknown; choose from {', '.join(SHAPES)}")
    start = time.perf_counter()
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096)
    m = random_model(cfg, args.device)
    m.batch_invariant = True
    batches = [4, 6] if args.tiny else [16, 64]
    rng = np.random.default_rng(0)
    for name in [s for s in args.draws_after.split(",") if s and not args.tiny]:
        draw_requests(SHAPES[name]["vocab_size"], rng, False)
    prompts = draw_requests(cfg.vocab_size, rng, args.tiny)  # batch_invariant_gpu.py's requests
    extra = [rng.integers(0, cfg.vocab_size, 4).tolist() for _ in prompts]
    result = dict(what=__doc__.split("\n\n")[0].replace("\n", " "), shape=shape, date=datetime.now(timezone.utc).isoformat(
                  timespec="seconds"), gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu (TRITON_INTERPRET)",
                  versions=dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
                                cuda=torch.version.cuda),
                  settings=dict(batches=batches, requests=REQUESTS, draws_after=args.draws_after, scored=5,
                                cache_slots=CACHE_SLOTS, dtype="bfloat16", pdl=args.device == "cuda"),
                  launch_table=launch_table(m, batches, prompts, args.device), runs=[], skipped=[])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for b in batches:
            for setting in ("m64", "engine"):  # main's launches first: what failed there
                if time.perf_counter() - start > args.budget_s:
                    result["skipped"].append(f"{setting} batch {b}")
                    continue
                order = list(range(b)) if b == batches[0] else list(range(b))[::-1]  # the larger batch reversed
                with launches(setting, m, args.device):
                    runs = probe_batch(m, [prompts[i] for i in order], [extra[i] for i in order],
                                       [order.index(r) for r in range(REQUESTS)], args.device)
                result["runs"] += [dict(launches=setting, batch=b, **r) for r in runs]
                result["summary"] = summarize(result["runs"])
                result["elapsed_s"] = time.perf_counter() - start
                args.out.write_text(json.dumps(result, indent=1))
                print(f"{setting} batch {b}: {time.perf_counter() - start:.0f} s", flush=True)
    result["summary"] = summarize(result["runs"])
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1), flush=True)


if __name__ == "__main__":
    main()
