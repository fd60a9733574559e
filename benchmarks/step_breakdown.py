"""Where a slot step's time goes (the serving step, ``flashspec_torch.slots``), at given batch sizes on a
random-weight model: the whole plain and n-gram steps (graph replays, launched and read as the scheduler
does), and each part alone -- the target forward over the whole bucketed cache and over just the slots in
use (the difference is attention over empty slots), the lookup draft, verify, greedy next-token choice,
the commit. On a GPU each part is timed as a CUDA-graph replay (median); on the CPU (``tiny``), eagerly.

    python benchmarks/step_breakdown.py --shape llama3-8b --batches 64,256      # prints JSON
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = 128  # tokens per request


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


def breakdown(shape: str, batches: list[int], context: int) -> dict:
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.slots import TorchSlotBackend

    model = model_for(shape)
    cuda = torch.cuda.is_available()
    backend = TorchSlotBackend(model, [LookupDraft()], eos_ids=[])
    out = {"shape": shape, "context": context, "prompt_tokens": PROMPT, "gamma": 4, "sampling": "greedy",
           "graphs": backend.graphed, "rows": []}
    with torch.inference_mode():
        backend.open_slots(max(batches), context)
        admitted = 0
        for b in sorted(batches):
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
    return row


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
    args = p.parse_args()
    print(json.dumps(breakdown(args.shape, [int(b) for b in args.batches.split(",")], args.context), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
