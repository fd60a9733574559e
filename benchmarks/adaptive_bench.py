"""Adaptive speculation (``flashspec.adaptive``) against every fixed configuration and plain decoding, per
batch size, in one run (issue #35). Greedy, so every configuration must emit plain decoding's tokens.

    python benchmarks/adaptive_bench.py --models llama3-8b,smollm2-135m --budget-s 150 \
        --out $OUT/adaptive_gpu.json                                                        # H100
    python benchmarks/adaptive_bench.py --device cpu --models embedded --batches 1,4,16 --tokens 32 \
        --out benchmarks/results/adaptive_cpu.json                                          # this CPU (noisy)

Models: ``embedded`` (SmolLM2-135M-Instruct's real weights; chat prompts, so the n-gram draft meets real
text; skipped, with the reason in the JSON, where its weights are not installed), ``smollm2-135m`` and
``llama3-8b`` (those shapes with random weights, bf16 on the GPU). Random
weights give an n-gram draft nothing to match, so those models also get a controlled synthetic draft,
``replay``: it proposes plain decoding's own continuation (recorded first) with each position kept with
probability ``--keep`` and otherwise replaced by another token, a fixed table per position, so its
per-token acceptance is ``--keep`` while drafting, scoring and verifying cost what a real one-hot draft
costs (one gather on the device; capturable in a CUDA graph).

Per (model, batch): tokens/s of plain decoding, of each fixed (draft, G) and of the adaptive loop (arms:
plain and every draft at G = 2 and 4; one policy per model kept across batch sizes, as a server keeps
it; a warm-up run of every configuration first captures the graphs and lets the policy measure each arm
in the bucket). Checks, each pass/fail in the JSON: every configuration's tokens equal plain decoding's
(``tokens_equal``: the fraction of rows equal per configuration); adaptive >= 0.98 x the best fixed
configuration or plain; adaptive >= 1.0 x plain. Tokens/s = new tokens of the
batch / wall time of the timed run (prefill excluded). The policy trusts its first timings where this run captured
the step kinds (``prepare_arms``, as the engine's loop). For the split of a shortfall (docs/adaptive.md): each run's
per-step ms in order (``steps_ms``), the adaptive run's host ms per choice (``adaptive_choose_ms``) and the best
fixed arm again with full-information scoring on (``best_fixed_scored``: the scoring's price per step).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib.metadata import version
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]  # this checkout's flashspec, whatever is installed

from flashspec.adaptive import AdaptivePolicy, bucket, make_arms  # noqa: E402
from flashspec.adaptive_loop import prepare_arms, speculate_adaptive, use_free_scoring  # noqa: E402
from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode_steps, speculate_steps
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, Proposal, Stateless
from flashspec_torch.model import Llama, LlamaConfig

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, rope_theta=500000.0),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16),  # the CPU smoke test
}
LENGTHS = (2, 4)
GREEDY = SamplingConfig(0.0)


class ReplayDraft(Stateless):
    """Proposes ``reference`` [B, S] (prompt + plain decoding's tokens) from each row's length on, each
    position kept with probability ``keep`` (a fixed table), else the next token id. Recomputable from the
    history (``flashspec_torch.free``), as the n-gram lookup is."""

    capturable = True
    recomputable = True

    def __init__(self, reference: torch.Tensor, keep: float, vocab: int, name: str = "replay", seed: int = 1234):
        self.name, self.vocab = name, vocab
        self.reference = reference.clone()
        self.wrong = torch.zeros(reference.shape, dtype=torch.bool, device=reference.device)
        self.load(reference, keep, seed)

    def load(self, reference: torch.Tensor, keep: float, seed: int = 1234) -> None:
        """A new reference and acceptance, in place (the captured steps read these buffers)."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.reference.copy_(reference)
        self.wrong.copy_(torch.rand(reference.shape, generator=g) >= keep)

    def propose(self, seqs, gamma, sampling, seed, offset, graphed=False) -> Proposal:
        pos = (seqs.length[:, None] + torch.arange(gamma, device=seqs.length.device)).clamp(max=self.reference.shape[1] - 1)
        tok = self.reference.gather(1, pos)
        return Proposal(torch.where(self.wrong.gather(1, pos), (tok + 1) % self.vocab, tok), None, None)


class Fixed:
    def __init__(self, arm: int):
        self.arm = arm

    def choose(self):
        return self.arm

    def observe(self, *args):
        pass


def rows_equal(out: list[list[int]], ref: list[list[int]]) -> float:
    """The fraction of rows whose tokens equal plain decoding's (bf16 on a GPU: scoring G + 1 positions
    may round differently from decoding one, so a near-tie can flip; fp32 on the CPU: 1.0 expected)."""
    return sum(a == b for a, b in zip(out, ref)) / len(ref)


def traces(records, rows: int) -> list[str]:
    """Per batch row, the tokens it accepted at each step it was active, one digit a step (G <= 9): what a fixed
    run saw, for ``flashspec.policy_sim.trace_bits`` to replay."""
    return ["".join(str(r.row_accepted[i]) for r in records if r.row_accepted[i] >= 0) for i in range(rows)]


def step_ms(records) -> float:
    """The median of the run's step times (``StepRecord.seconds``), in ms."""
    times = sorted(r.seconds for r in records)
    return round(times[len(times) // 2] * 1e3, 4) if times else float("nan")


def steps_ms(records) -> list[float]:
    """Each step's seconds (``StepRecord.seconds``) in order, in ms: the run's wall less their sum is host time
    outside the timed steps (the first choice, the last read)."""
    return [round(r.seconds * 1e3, 4) for r in records]


def timing(choose, out: list[float]):
    """``choose`` that appends each call's host seconds to ``out`` (the adaptive run's choices; a held step makes
    none, ``flashspec.throughput.held``)."""

    def timed_choose(*args, **kwargs):
        t0 = time.perf_counter()
        arm = choose(*args, **kwargs)
        out.append(time.perf_counter() - t0)
        return arm

    return timed_choose


def scored_run(backend, prompts, tokens: int, seed, drafts, fixed: dict) -> dict:
    """The best fixed arm again with full-information scoring on (as the adaptive loop's speculative steps run):
    its step ms against the unscored run's give the scoring's price per step on this device."""
    key = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    name, g = key.rsplit(":G", 1)
    d = [x.name for x in drafts].index(name)
    backend.score_free(max(LENGTHS))
    run = lambda rec: speculate_steps(backend, Fixed(d), sampling=GREEDY, spec=SpecConfig(int(g), tokens), seed=seed,
                                      first_offset=0, on_step=None, records=rec)
    timed(backend, prompts, tokens, run)  # warm-up
    _, s, rec = timed(backend, prompts, tokens, run)
    new = len(prompts) * tokens
    return dict(arm=key, tokens_per_s=new / s, steps=len(rec), step_ms=step_ms(rec), steps_ms=steps_ms(rec))


def policy_arm_name(record, drafts) -> str:
    return "plain" if record.arm < 0 else f"{drafts[record.arm].name}:G{record.drafted // max(record.rows, 1)}"


def arm_runs(names: list[str]) -> str:
    """The adaptive run's arms in order, each run of one arm as name*count ("ngram:G4*3 plain*1 ...")."""
    runs: list[list] = []
    for n in names:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return " ".join(f"{n}*{k}" for n, k in runs)


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(backend, prompts, tokens: int, run) -> tuple[list[list[int]], float, list]:
    """(new tokens, seconds, records) of one run after its prefill."""
    backend.prefill(prompts, tokens)
    records: list = []
    synchronize(backend.device)
    start = time.perf_counter()
    run(records)
    synchronize(backend.device)
    return backend.outputs(), time.perf_counter() - start, records


def load_model(name: str, device: torch.device, dtype: torch.dtype | None = None, gguf: str | None = None):
    """(model, prompts' token lists or None for random prompts); random weights in ``dtype`` (None: bf16 on a
    GPU, fp32 on the CPU). ``embedded`` reads the installed package's GGUF, or ``gguf`` (the same file copied
    to a machine without the package)."""
    if name == "embedded":
        from flashspec_torch.engine import Engine

        from prompts import PROMPTS  # noqa: E402  (tests/prompts.py, on sys.path below)

        eng = Engine(gguf, ("ngram",), device=str(device))
        return eng.target.model, [eng.encode(p, True) for p in PROMPTS]
    torch.manual_seed(0)
    with device:
        m = Llama(LlamaConfig(**SHAPES[name], max_position_embeddings=4096))
    m = m.to(dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32))
    for p in m.parameters():
        p.data.normal_(0, 0.02)
    return m.eval().requires_grad_(False), None


def run_batch(model, prompts, tokens: int, keep: float | None, policy_box: dict, device) -> dict:
    vocab = model.config.vocab_size
    seed = torch.zeros(len(prompts), dtype=torch.int64, device=device) if device.type == "cuda" else 0
    spec = SpecConfig(gamma=max(LENGTHS), max_new_tokens=tokens)
    plain_backend = TorchBackend(model, [LookupDraft()], eos_ids=[])

    def plain(backend):
        return lambda rec: decode_steps(backend, sampling=GREEDY, max_new_tokens=tokens, seed=seed, first_offset=0,
                                        on_step=None, records=rec)

    timed(plain_backend, prompts, tokens, plain(plain_backend))  # warm-up
    ref_out, plain_s, plain_rec = timed(plain_backend, prompts, tokens, plain(plain_backend))
    drafts = [LookupDraft()]
    if keep is not None:
        width = max(map(len, prompts)) + tokens + 80
        ref = torch.zeros((len(prompts), width), dtype=torch.int64)
        for i, (p, o) in enumerate(zip(prompts, ref_out)):
            ref[i, : len(p) + len(o)] = torch.tensor(p + o)
        drafts.append(ReplayDraft(ref.to(device), keep, vocab))
    backend = TorchBackend(model, drafts, eos_ids=[])
    captured = 0  # step kinds captured here: the policy trusts first timings (``prepare_arms``), as the engine's
    for free in (max(LENGTHS), 0):  # the adaptive loop's steps score the drafts not run; fixed ones do not
        backend.score_free(free)
        for g in LENGTHS:
            backend.prefill(prompts, tokens)
            captured += backend.prepare(g, GREEDY)
    new = len(prompts) * tokens
    row = dict(batch=len(prompts), new_tokens=new, plain_tokens_per_s=new / plain_s, plain_step_ms=step_ms(plain_rec),
               fixed={}, tokens_equal={})
    for d, draft in enumerate(drafts):
        for g in LENGTHS:
            run = lambda rec, d=d, g=g: speculate_steps(backend, Fixed(d), sampling=GREEDY, spec=SpecConfig(g, tokens),
                                                       seed=seed, first_offset=0, on_step=None, records=rec)
            timed(backend, prompts, tokens, run)  # warm-up
            out, s, rec = timed(backend, prompts, tokens, run)
            key = f"{draft.name}:G{g}"
            row["fixed"][key] = dict(tokens_per_s=new / s, acceptance=sum(r.accepted for r in rec) / max(1, sum(r.drafted for r in rec)),
                                     steps=len(rec), step_ms=step_ms(rec),  # steps: the tail included
                                     steps_ms=steps_ms(rec),  # each step's, in order
                                     trace=traces(rec, len(prompts)))  # replayed by benchmarks/policy_sim.py
            row["tokens_equal"][key] = rows_equal(out, ref_out)
    row["best_fixed_scored"] = scored_run(backend, prompts, tokens, seed, drafts, row["fixed"])
    if "policy" not in policy_box:
        policy_box["policy"] = AdaptivePolicy(make_arms(len(drafts), LENGTHS), len(drafts), rng=0)
    policy = policy_box["policy"]
    use_free_scoring(backend, policy)
    prepare_arms(backend, policy, GREEDY, captured)
    run = lambda rec: speculate_adaptive(backend, policy, sampling=GREEDY, spec=spec, seed=seed, rows=len(prompts),
                                         records=rec)
    timed(backend, prompts, tokens, run)  # warm-up: the policy measures every arm in this bucket
    choices: list[float] = []
    policy.choose = timing(policy.choose, choices)
    try:
        out, s, rec = timed(backend, prompts, tokens, run)
    finally:
        del policy.choose  # the class's method again
    pulls: dict[str, int] = {}
    for r in rec:
        name = policy_arm_name(r, drafts)
        pulls[name] = pulls.get(name, 0) + 1
    best = max(row["fixed"].items(), key=lambda kv: kv[1]["tokens_per_s"])
    names = ["plain" if a.plain else f"{drafts[a.draft].name}:G{a.length}" for a in policy.arms]
    costs = policy.cost[min(bucket(len(prompts)), policy.cost.shape[0] - 1)]
    row.update(adaptive_tokens_per_s=new / s, adaptive_steps=pulls, best_fixed=best[0],
               adaptive_arms=arm_runs([policy_arm_name(r, drafts) for r in rec]),
               adaptive_trace=traces(rec, len(prompts)),  # a plain step's digit is 0 (nothing drafted)
               adaptive_step_ms={n: step_ms([r for r in rec if policy_arm_name(r, drafts) == n]) for n in pulls},
               adaptive_steps_ms=steps_ms(rec), adaptive_choose_ms=[round(c * 1e3, 4) for c in choices],
               policy_warm=policy.warm,
               adaptive_cost_ms={n: round(float(c) * 1e3, 4) for n, c in zip(names, costs)})
    row["tokens_equal"]["adaptive"] = rows_equal(out, ref_out)
    best_tps = max(best[1]["tokens_per_s"], row["plain_tokens_per_s"])
    row["checks"] = {
        "tokens_equal_plain": all(v == 1.0 for v in row["tokens_equal"].values()),
        "adaptive_vs_best_fixed_or_plain": row["adaptive_tokens_per_s"] / best_tps,
        "adaptive_ge_0.98_best": row["adaptive_tokens_per_s"] >= 0.98 * best_tps,
        "adaptive_ge_plain": row["adaptive_tokens_per_s"] >= row["plain_tokens_per_s"],
    }
    return row


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="embedded,smollm2-135m,llama3-8b")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new (model, batch) after this many seconds")
    ap.add_argument("--keep", type=float, default=0.6, help="the replay draft's per-token acceptance")
    ap.add_argument("--prompt-len", type=int, default=64, help="random prompts' length (random-weight models)")
    ap.add_argument("--gguf", default=None, help="the embedded model's GGUF file where its package is not installed")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    unknown = set(args.models.split(",")) - {"embedded", *SHAPES}
    if unknown:
        ap.error(f"--models: unknown {sorted(unknown)}; choose from {['embedded', *SHAPES]}")
    doc = dict(command="python " + " ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
               torch=torch.__version__, triton=version("triton"), python=platform.python_version(),
               cuda=torch.version.cuda, keep=args.keep, lengths=LENGTHS, tokens_per_row=args.tokens,
               sampling="greedy", complete=False, models={}, skipped={},
               tokens_equal_note=("fraction of rows whose greedy tokens equal plain decoding's; in bf16 (the GPU) "
                                  "scoring G + 1 positions and decoding one round differently, so a near-tie of "
                                  "random weights' top two logits can flip a token: a fraction < 1 there is that "
                                  "rounding, not the policy (fp32 on the CPU: 1.0, tests/torch/test_adaptive_bench.py)"))
    start = time.perf_counter()
    with torch.inference_mode():
        for name in args.models.split(","):
            try:
                model, chat = load_model(name, device, gguf=args.gguf)
            except (ImportError, FileNotFoundError, OSError) as e:  # the embedded model's weights not installed
                doc["skipped"][name] = f"{type(e).__name__}: {e}"
                print(f"skipped {name}: {e}", flush=True)
                continue
            keep = None if name == "embedded" else args.keep
            box: dict = {}
            rows = []
            for b in map(int, args.batches.split(",")):
                if time.perf_counter() - start > args.budget_s:
                    doc["skipped"][f"{name}@{b}"] = f"--budget-s {args.budget_s} spent"
                    continue
                if chat is not None:
                    prompts = [chat[i % len(chat)] for i in range(b)]
                else:
                    g = torch.Generator().manual_seed(b)
                    prompts = torch.randint(0, model.config.vocab_size, (b, args.prompt_len), generator=g).tolist()
                rows.append(run_batch(model, prompts, args.tokens, keep, box, device))
                print(json.dumps({"model": name, **{k: rows[-1][k] for k in ("batch", "checks", "adaptive_steps")}}),
                      flush=True)
                doc["models"][name] = rows
                write(args.out, doc, start)  # after every batch: a run cut short keeps what it measured
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    doc["complete"] = True
    write(args.out, doc, start)


def write(out: Path, doc: dict, start: float) -> None:
    doc["seconds"] = time.perf_counter() - start
    doc["speed_pass"] = all(r["checks"][k] for rows in doc["models"].values() for r in rows
                            for k in ("adaptive_ge_0.98_best", "adaptive_ge_plain"))
    doc["all_pass"] = all(r["checks"][k] for rows in doc["models"].values() for r in rows
                          for k in ("tokens_equal_plain", "adaptive_ge_0.98_best", "adaptive_ge_plain"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
