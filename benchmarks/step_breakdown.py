"""Where a slot step's time goes (the serving step, ``flashspec_torch.slots``), at given batch sizes on a
random-weight model: the whole plain and n-gram steps (graph replays, launched and read as the scheduler
does), and each part alone -- the target forward over the whole bucketed cache and over just the slots in
use (the difference is attention over empty slots), the lookup draft, verify, greedy next-token choice,
the commit; and the sampled (T > 0) plain step with the fused sampler (``sample_next_triton``, the GPU's
default) and with the torch sampler it replaced (``sample_next_reference``), each pick alone too, after a
check that both draw the same tokens from the step's logits. On a GPU each part is timed as a CUDA-graph
replay (median); on the CPU (``tiny``), eagerly.

    python benchmarks/step_breakdown.py --shape llama3-8b --batches 64,256 --budget-s 150 --out $OUT/step_breakdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = 128  # tokens per request
SAMPLED = {"T=0.8": dict(temperature=0.8), "T=1 top_k=50": dict(temperature=1.0, top_k=50),
           "T=0.7 top_p=0.9": dict(temperature=0.7, top_p=0.9)}  # the first one is timed as a whole step


def timed(fn, reps: int = 20) -> float:
    """Median ms of ``fn``: a CUDA-graph replay on a GPU, an eager call on the CPU."""
    if torch.cuda.is_available():
        from engine_gpu import graph_ms

        return graph_ms(fn, reps)
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def steps_ms(launch, n: int = 20) -> float:
    """ms per step of ``n`` steps launched one ahead of the read, as the scheduler runs them."""
    pending = launch()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(n):
        nxt = launch()
        pending.fetch()
        pending = nxt
    pending.fetch()
    return (time.perf_counter() - t) * 1e3 / (n + 1)


def model_for(shape: str):
    from flashspec_torch.model import Llama, LlamaConfig

    if shape == "tiny":
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=16, max_position_embeddings=4096)
        torch.manual_seed(0)
        return Llama(cfg).eval().requires_grad_(False)
    from engine_gpu import SHAPES, random_model

    return random_model(LlamaConfig(**SHAPES[shape], max_position_embeddings=8192))


def breakdown(shape: str, batches: list[int], context: int, deadline: float | None = None,
              out: dict | None = None) -> dict:
    """The rows of ``batches`` (those not started by ``deadline`` skipped), into ``out`` as they come."""
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.slots import TorchSlotBackend

    model = model_for(shape)
    cuda = torch.cuda.is_available()
    backend = TorchSlotBackend(model, [LookupDraft()], eos_ids=[])
    out = {} if out is None else out
    out.update({"shape": shape, "context": context, "prompt_tokens": PROMPT, "gamma": 4,
                "sampling": "greedy; the plain_sampled_* figures at " + next(iter(SAMPLED)),
                "graphs": backend.graphed, "rows": []})
    with torch.inference_mode():
        backend.open_slots(max(batches), context)
        admitted = 0
        for b in sorted(batches):
            if deadline is not None and time.monotonic() > deadline:
                out["rows"].append({"batch": b, "error": "skipped: the budget was spent"})
                continue
            try:
                out["rows"].append(measure(backend, model, b, admitted, max(batches), context, cuda))
            except Exception as e:  # noqa: BLE001 - e.g. out of memory at the largest batch: the others stay
                out["rows"].append({"batch": b, "error": f"{type(e).__name__}: {e}"[:500]})
            admitted = b
            print(json.dumps(out["rows"][-1]), flush=True)
    return out


def measure(backend, model, b: int, admitted: int, slots: int, context: int, cuda: bool) -> dict:
    """One batch size: admit rows up to ``b``, then time the steps and their parts."""
    from flashspec.config import SamplingConfig
    from flashspec_torch.backend import commit_reference, commit_triton, greedy_next_reference, greedy_next_triton

    greedy = SamplingConfig(0.0)
    prompts = torch.randint(0, model.config.vocab_size, (b - admitted, PROMPT)).tolist()
    backend.admit(list(range(admitted, b)), prompts, [context - PROMPT] * (b - admitted), list(range(admitted, b)))
    rows = torch.zeros(slots, dtype=torch.bool).numpy()
    rows[:b] = True
    for _ in range(3):  # compiles and captures
        backend.step_slots(0, 4, greedy, rows).fetch()
        backend.decode_slots(greedy, rows).fetch()
    row = {"batch": b, "bucket": backend.bucket(), "cache_slots": backend.shape[1],
           "plain_step_ms": steps_ms(lambda: backend.decode_slots(greedy, rows)),
           "ngram_step_ms": steps_ms(lambda: backend.step_slots(0, 4, greedy, rows))}
    with backend.first_rows(backend.bucket()):
        row.update(parts(backend, model, greedy, cuda, greedy_next_triton if cuda else greedy_next_reference,
                         commit_triton if cuda else commit_reference))
    fwd1, fwd5 = row["forward_1_token_whole_cache_ms"], row["forward_5_tokens_whole_cache_ms"]
    row["plain_share_outside_forward"] = 1 - fwd1 / row["plain_step_ms"]
    row["ngram_share_outside_forward"] = 1 - fwd5 / row["ngram_step_ms"]
    row["plain_share_attention_on_empty_slots"] = (fwd1 - row["forward_1_token_used_slots_ms"]) / row["plain_step_ms"]
    row.update(sampled(backend, model, rows, cuda))
    row["plain_sampled_share_outside_forward"] = 1 - fwd1 / row["plain_sampled_step_ms"]
    row["plain_sampled_torch_sampler_share_outside_forward"] = 1 - fwd1 / row["plain_sampled_step_torch_sampler_ms"]
    return row


def sampled(backend, model, rows, cuda: bool) -> dict:
    """The sampled plain step with the fused sampler and with the torch one (its own graphs: the backend's
    launcher swapped), each pick alone, and the check that both draw the same tokens from the step's logits."""
    import flashspec_torch.backend as torch_backend
    from flashspec.config import SamplingConfig
    from flashspec_torch.sample_next import sample_next_reference, sample_next_triton

    configs = {name: SamplingConfig(**kw) for name, kw in SAMPLED.items()}
    timed_cfg = next(iter(configs.values()))
    from flashspec_torch.device import interpreting

    fused = sample_next_triton if cuda or interpreting() else sample_next_reference  # the CPU: the interpreter's
    out = {}
    launchers = (("plain_sampled_step_ms", fused), ("plain_sampled_step_torch_sampler_ms", sample_next_reference))
    for name, launcher in launchers:
        graphs = backend.graphs
        backend.graphs = type(graphs)() if graphs is not None else None  # captures of its own
        try:
            with mock.patch.object(torch_backend, "sample_next_triton", launcher):
                for _ in range(3):  # compiles and captures
                    backend.decode_slots(timed_cfg, rows).fetch()
                out[name] = steps_ms(lambda: backend.decode_slots(timed_cfg, rows))
        finally:
            if backend.graphs is not None:
                backend.graphs.clear()
            backend.graphs = graphs
    with backend.first_rows(backend.bucket()):
        seqs = backend.seqs
        last = seqs.tokens.gather(1, (seqs.length - 1)[:, None])
        z1 = model(last, (seqs.length - 1)[:, None], backend.cache, backend.cache.max_len)[:, 0]
        seed, offset, bad = backend.seed, backend.offset, backend.bad
        out["sample_next_fused_ms"] = timed(lambda: fused(z1, timed_cfg, seed, offset, bad))
        out["sample_next_torch_ms"] = timed(lambda: sample_next_reference(z1, timed_cfg, seed, offset, bad))
        checks = {}
        for name, cfg in configs.items():
            want = sample_next_reference(z1, cfg, seed, offset, bad).tokens[:, 0]
            got = fused(z1, cfg, seed, offset, bad).tokens[:, 0]
            checks[name] = {"rows": int(want.numel()), "equal_rows": int((want == got).sum()),
                            "pass": bool(torch.equal(want, got))}
    out["check_fused_equals_torch_sampler"] = checks
    return out


def parts(backend, model, greedy, cuda: bool, greedy_next, commit) -> dict:
    """Each part of a step alone, on the backend's own state (inside ``first_rows``)."""
    seqs, cache = backend.seqs, backend.cache
    s = cache.max_len
    length = seqs.length
    used = min(int(length.max()) + 8, s)  # the slots any row uses, with room for the 5 new positions
    last = seqs.tokens.gather(1, (length - 1)[:, None])
    pos1 = (length - 1)[:, None]
    draft = backend.drafts[0]
    proposal = draft.propose(seqs, 4, greedy, backend.seed, backend.offset, graphed=True)
    tok5 = torch.cat([last, proposal.tokens], 1)
    pos5 = pos1 + torch.arange(5, device=length.device)
    z5 = model(tok5, pos5, cache, s)
    z1 = model(last, pos1, cache, s)[:, 0]
    result = backend.verify(z5, proposal, greedy, backend.seed, backend.offset)
    state = [t.clone() for t in (seqs.tokens, seqs.length, backend.prompt_len, backend.max_new, backend.done, backend.active)]
    return {
        "forward_1_token_whole_cache_ms": timed(lambda: model(last, pos1, cache, s)),
        "forward_1_token_used_slots_ms": timed(lambda: model(last, pos1, cache, used)),
        "forward_5_tokens_whole_cache_ms": timed(lambda: model(tok5, pos5, cache, s)),
        "forward_5_tokens_used_slots_ms": timed(lambda: model(tok5, pos5, cache, used)),
        "used_slots": used,
        "mean_row_length": float(length.float().mean()),
        "live_rows": int((~backend.done).sum()),
        "lookup_draft_ms": timed(lambda: draft.propose(seqs, 4, greedy, backend.seed, backend.offset, graphed=True)),
        "verify_ms": timed(lambda: backend.verify(z5, proposal, greedy, backend.seed, backend.offset)),
        "greedy_next_ms": timed(lambda: greedy_next(z1, backend.bad)),
        "commit_ms": timed(lambda: commit(result.num_accepted, result.tokens, backend.eos, *state)),
        "logits_bytes_per_5_token_pass": z5.numel() * z5.element_size(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama3-8b", help="a shape of benchmarks/engine_gpu.py, or tiny (CPU)")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--context", type=int, default=640)
    p.add_argument("--budget-s", type=float, default=150.0, help="batches not started by then are skipped; "
                                                                  "the run is stopped at 1.15x it")
    p.add_argument("--out", type=Path, help="also write OUT.json (the same JSON)")
    args = p.parse_args()
    import triton
    from serve_bench import environment
    from serve_gpu import time_limit

    start = time.monotonic()
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(sys.argv),
           "environment": {**environment(), "triton": triton.__version__, "cuda": torch.version.cuda}}
    try:
        with time_limit(1.15 * args.budget_s):
            breakdown(args.shape, [int(b) for b in args.batches.split(",")], args.context, start + args.budget_s, doc)
    except TimeoutError as e:
        doc["error"] = str(e)
    checks = [c["pass"] for r in doc.get("rows", []) for c in r.get("check_fused_equals_torch_sampler", {}).values()]
    doc["checks_pass"] = bool(checks) and all(checks)
    doc["wall_s"] = round(time.monotonic() - start, 1)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out is not None:
        args.out.with_suffix("").parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(text)
    return 0 if doc["checks_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
