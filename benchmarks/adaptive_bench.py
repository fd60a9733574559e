"""Adaptive speculation (``flashspec.adaptive``) against every fixed configuration and plain decoding, per
batch size, in one run (issue #35). Greedy, so every configuration must emit plain decoding's tokens.

    python benchmarks/adaptive_bench.py --models llama3-8b,smollm2-135m --budget-s 150 \
        --out $OUT/adaptive_gpu.json                                                        # H100
    OMP_NUM_THREADS=1 python benchmarks/adaptive_bench.py --device cpu --models embedded --batches 1,4,16 \
        --tokens 48 --rounds 3 --clock process --out benchmarks/results/adaptive_cpu.json   # this CPU (noisy)

Models: ``embedded`` (SmolLM2-135M-Instruct's real weights; skipped, with the reason in the JSON, where its
weights are not installed), ``smollm2-135m`` and ``llama3-8b`` (those shapes with random weights, bf16 on the
GPU). The embedded model runs the drafts of ``--drafts`` (default: the engine's own default set,
``flashspec.drafts.default_drafts``: the shipped draft head and ngram), built by ``flashspec_torch.engine.Engine``
as the engine builds them, with its default dynamic draft length (``Engine(stop_below=None)``: 0.4 for a head on
the CPU, 0 on a GPU; recorded per draft in the JSON's ``stop_below``), on held-out prompts of
``flashspec.head_corpus`` (``split(corpus())[1]``: files, topics and subjects the head never trained on), a
batch of B taking B prompts cycling over the domains code, prose, chat (chat through the chat template). Random
weights give an n-gram draft nothing to match, so those models run ngram and a controlled synthetic draft,
``replay``: it proposes plain decoding's own continuation (recorded first) with each position kept with
probability ``--keep`` and otherwise replaced by another token, a fixed table per position, so its
per-token acceptance is ``--keep`` while drafting, scoring and verifying cost what a real one-hot draft
costs (one gather on the device; capturable in a CUDA graph).

Per (model, batch): tokens/s of plain decoding (a backend without drafts' features), of each fixed (draft, G)
and of the adaptive loop (arms: plain and every draft at G = 2 and 4; one policy per model kept across batch
sizes, as a server keeps it; a warm-up run of every configuration first captures the graphs and lets the policy
measure each arm in the bucket). Checks, each pass/fail in the JSON: every configuration's tokens equal plain
decoding's (``tokens_equal``: the fraction of rows equal per configuration); adaptive >= 0.98 x the best fixed
configuration or plain; adaptive >= 1.0 x plain. Tokens/s = new tokens of the batch / time of the timed run
(prefill excluded) on ``--clock``: ``wall``, or ``process`` (this process's CPU time: on a shared machine it
leaves out the time spent waiting for a core; one torch thread, OMP_NUM_THREADS=1, so it is the step's work).
The adaptive loop's step times (the policy's own measurements, ``adaptive_steps_ms``) are on ``--clock`` too, so with
``process`` the policy prices its arms as on a quiet machine; the fixed runs' ``steps_ms`` are the wall clock. The policy trusts
its first timings where this run captured the step kinds (``prepare_arms``, as the engine's loop). For the split
of a shortfall (docs/adaptive.md): each run's per-step ms in order (``steps_ms``), the adaptive run's host ms per
choice (``adaptive_choose_ms``) and the best fixed arm again with full-information scoring on
(``best_fixed_scored``: the scoring's price per step).

``--rounds N``: every configuration of a batch row (plain, each fixed arm, adaptive) runs once a round, the order
rotated each round (``benchmarks/rounds.py``; the machine's drift weighs on all alike), each figure and check on the
median over rounds (the details: the median round's run); per round in ``rounds_tokens_per_s``, ``spread`` ((max -
min) / median), ``checks.rounds_adaptive_vs_best`` (against that round's best) and ``adaptive_rounds`` (the arms).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from importlib.metadata import version
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT), str(ROOT / "benchmarks")]  # this checkout's flashspec, rounds.py

from flashspec.adaptive import AdaptivePolicy, bucket, make_arms  # noqa: E402
from flashspec.adaptive_loop import prepare_arms, speculate_adaptive, use_free_scoring  # noqa: E402
from flashspec.config import SamplingConfig
from flashspec.drafts import default_drafts
from flashspec.loop import SpecConfig, decode_steps, speculate_steps
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, Proposal, Stateless
from flashspec_torch.model import Llama, LlamaConfig
from rounds import median_index, run_rounds, spread  # noqa: E402  (benchmarks/rounds.py)

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, rope_theta=500000.0),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16),  # the CPU smoke test
}
LENGTHS = (2, 4)
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}  # --clock
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


def recording(observe, arms: list[int]):
    """``observe`` that appends each observed step's arm index to ``arms`` (one per step the loop records, in order;
    a record names only its draft, not the length the arm asked for)."""

    def recorded_observe(a, *args, **kwargs):
        arms.append(a)
        return observe(a, *args, **kwargs)

    return recorded_observe


def scored_run(backend, prompts, tokens: int, seed, drafts, fixed: dict, clock) -> dict:
    """The best fixed arm again with full-information scoring on (as the adaptive loop's speculative steps run):
    its step ms against the unscored run's give the scoring's price per step on this device."""
    key = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    name, g = key.rsplit(":G", 1)
    d = [x.name for x in drafts].index(name)
    backend.score_free(max(LENGTHS))
    run = lambda rec: speculate_steps(backend, Fixed(d), sampling=GREEDY, spec=SpecConfig(int(g), tokens), seed=seed,
                                      first_offset=0, on_step=None, records=rec)
    timed(backend, prompts, tokens, run, clock)  # warm-up
    _, s, rec = timed(backend, prompts, tokens, run, clock)
    new = len(prompts) * tokens
    return dict(arm=key, tokens_per_s=new / s, steps=len(rec), step_ms=step_ms(rec), steps_ms=steps_ms(rec))


def arm_name(arm, drafts) -> str:
    """A policy arm's name, as the fixed runs' keys: "plain" or "draft:G<its length>" (the length the arm asks for;
    a draft with a dynamic length may propose fewer tokens in a row)."""
    return "plain" if arm.plain else f"{drafts[arm.draft].name}:G{arm.length}"


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


def timed(backend, prompts, tokens: int, run, clock=time.perf_counter) -> tuple[list[list[int]], float, list]:
    """(new tokens, seconds on ``clock``, records) of one run after its prefill."""
    backend.prefill(prompts, tokens)
    records: list = []
    synchronize(backend.device)
    start = clock()
    run(records)
    synchronize(backend.device)
    return backend.outputs(), clock() - start, records


def load_model(name: str, device: torch.device, dtype: torch.dtype | None = None, gguf: str | None = None,
               drafts: tuple[str, ...] = (), prompts: int = 0):
    """(model, prompts' token lists or None for random prompts, drafts or None); random weights in ``dtype``
    (None: bf16 on a GPU, fp32 on the CPU). ``embedded`` reads the installed package's GGUF, or ``gguf`` (the same
    file copied to a machine without the package), with ``drafts`` (engine draft names) built by the engine and
    ``prompts`` held-out prompts (``held_out_prompts``)."""
    if name == "embedded":
        from flashspec_torch.engine import Engine

        eng = Engine(gguf, drafts, device=str(device))  # the engine's drafts, stop_below at its default
        return eng.target.model, held_out_prompts(eng.tokenizer, prompts), list(eng.drafts)
    torch.manual_seed(0)
    with device:
        m = Llama(LlamaConfig(**SHAPES[name], max_position_embeddings=4096))
    m = m.to(dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32))
    for p in m.parameters():
        p.data.normal_(0, 0.02)
    return m.eval().requires_grad_(False), None, None


def held_out_prompts(tokenizer, count: int) -> list[list[int]]:
    """The first ``count`` prompts of ``flashspec.head_corpus``'s held-out split, cycling over its domains (code,
    prose, chat, code, ...; the k-th of a domain is its k-th held-out prompt), chat through the chat template."""
    from flashspec.engine import encode
    from flashspec.head_corpus import DOMAINS, corpus, split

    held = split(corpus())[1]
    by_domain = {d: [p for p in held if p.domain == d] for d in DOMAINS}
    picks = [(DOMAINS[i % len(DOMAINS)], i // len(DOMAINS)) for i in range(count)]
    return [encode(tokenizer, by_domain[d][k].text, d == "chat") for d, k in picks]


def replay_drafts(prompts, ref_out, keep: float, vocab: int, device) -> list:
    """A random-weight model's drafts: ngram and the replay draft of plain decoding's tokens ``ref_out``."""
    width = max(map(len, prompts)) + len(ref_out[0]) + 80
    ref = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, (p, o) in enumerate(zip(prompts, ref_out)):
        ref[i, : len(p) + len(o)] = torch.tensor(p + o)
    return [LookupDraft(), ReplayDraft(ref.to(device), keep, vocab)]


def prepare_steps(backend, prompts, tokens: int) -> int:
    """Capture every step kind, with and without full-information scoring; returns the kinds captured (0 off CUDA).
    Leaves scoring off, as the fixed runs run."""
    captured = 0
    for free in (max(LENGTHS), 0):  # the adaptive loop's steps score the drafts not run; fixed ones do not
        backend.score_free(free)
        for g in LENGTHS:
            backend.prefill(prompts, tokens)
            captured += backend.prepare(g, GREEDY)
    return captured


def fixed_runner(backend, prompts, tokens: int, seed, d: int, g: int, clock):
    """Draft ``d`` at G = ``g``, warmed up now: a function timing one run ((tokens, seconds, records), ``timed``)."""
    run = lambda rec: speculate_steps(backend, Fixed(d), sampling=GREEDY, spec=SpecConfig(g, tokens), seed=seed,
                                      first_offset=0, on_step=None, records=rec)

    def once():
        backend.score_free(0)  # as a fixed configuration runs (an adaptive run before it leaves the scoring on)
        return timed(backend, prompts, tokens, run, clock)

    once()  # warm-up
    return once


def fixed_summary(records, seconds: float, new: int, rows: int) -> dict:
    """A fixed run's figures: tokens/s, acceptance, tokens drafted per row and step, steps (the tail included), the
    median and each step's ms, and the per-row traces that ``benchmarks/policy_sim.py`` replays."""
    drafted = sum(r.drafted for r in records)
    return dict(tokens_per_s=new / seconds, acceptance=sum(r.accepted for r in records) / max(1, drafted),
                drafted_per_step=drafted / max(1, sum(r.rows for r in records)), steps=len(records),
                step_ms=step_ms(records), steps_ms=steps_ms(records), trace=traces(records, rows))


def adaptive_runner(backend, prompts, tokens: int, seed, policy, captured: int, clock):
    """The adaptive loop, warmed up now (the policy measures every arm in this bucket): a function timing one run,
    (tokens, seconds, records, host seconds per choice, the arm index of each record)."""
    spec = SpecConfig(gamma=max(LENGTHS), max_new_tokens=tokens)
    run = lambda rec: speculate_adaptive(backend, policy, sampling=GREEDY, spec=spec, seed=seed, rows=len(prompts),
                                         records=rec, clock=clock)

    def once():
        use_free_scoring(backend, policy)  # a fixed run before it turned the scoring off
        choices: list[float] = []
        arms: list[int] = []
        policy.choose, policy.observe = timing(policy.choose, choices), recording(policy.observe, arms)
        try:
            out, s, rec = timed(backend, prompts, tokens, run, clock)
        finally:
            del policy.choose, policy.observe  # the class's methods again
        if len(arms) != len(rec):
            raise RuntimeError(f"the adaptive run observed {len(arms)} steps but recorded {len(rec)}")
        return out, s, rec, choices, arms

    use_free_scoring(backend, policy)
    prepare_arms(backend, policy, GREEDY, captured)
    timed(backend, prompts, tokens, run, clock)  # warm-up
    return once


def adaptive_summary(rec, choices: list[float], arms: list[int], policy, drafts, batch: int) -> dict:
    """The adaptive run's record (``arms``: each record's arm index): pulls per arm, the arms in order, traces, step
    ms, the policy's costs."""
    stepped = [arm_name(policy.arms[a], drafts) for a in arms]  # [steps]
    pulls = dict(Counter(stepped))  # arm name -> steps, in order of first use
    names = [arm_name(a, drafts) for a in policy.arms]
    costs = policy.cost[min(bucket(batch), policy.cost.shape[0] - 1)]
    return dict(adaptive_steps=pulls, adaptive_arms=arm_runs(stepped),
                adaptive_trace=traces(rec, batch),  # a plain step's digit is 0 (nothing drafted)
                adaptive_step_ms={n: step_ms([r for r, m in zip(rec, stepped) if m == n]) for n in pulls},
                adaptive_steps_ms=steps_ms(rec), adaptive_choose_ms=[round(c * 1e3, 4) for c in choices],
                policy_warm=policy.warm,
                adaptive_cost_ms={n: round(float(c) * 1e3, 4) for n, c in zip(names, costs)})


def run_batch(model, prompts, tokens: int, keep: float | None, policy_box: dict, device, drafts: list | None = None,
              clock=time.perf_counter, rounds: int = 1, log=None) -> dict:
    """Plain decoding, every fixed (draft, G) and the adaptive loop on ``prompts`` in ``rounds`` interleaved rounds
    (``rounds.run_rounds``: each configuration once a round, the order rotated; ``log(round, name)``), each figure
    the median over rounds, then the best fixed one with full-information scoring. ``drafts``: the drafts (None:
    ngram and a replay draft of acceptance ``keep``); ``policy_box["policy"]``: the model's policy, made on its first
    batch and kept."""
    seed = torch.zeros(len(prompts), dtype=torch.int64, device=device) if device.type == "cuda" else 0
    plain_backend = TorchBackend(model, [LookupDraft()], eos_ids=[])  # no feature draft: plain decoding's own cost
    plain = lambda rec: decode_steps(plain_backend, sampling=GREEDY, max_new_tokens=tokens, seed=seed, first_offset=0,
                                     on_step=None, records=rec)
    timed(plain_backend, prompts, tokens, plain, clock)  # warm-up
    ref_out = timed(plain_backend, prompts, tokens, plain, clock)[0]  # the reference tokens (and the replay's)
    if drafts is None:
        drafts = replay_drafts(prompts, ref_out, keep, model.config.vocab_size, device)
    backend = TorchBackend(model, drafts, eos_ids=[])
    captured = prepare_steps(backend, prompts, tokens)  # the policy trusts first timings where captured (as the engine)
    if "policy" not in policy_box:
        policy_box["policy"] = AdaptivePolicy(make_arms(len(drafts), LENGTHS), len(drafts), rng=0)
    policy = policy_box["policy"]
    runs = {"plain": lambda: timed(plain_backend, prompts, tokens, plain, clock)}
    runs.update({f"{draft.name}:G{g}": fixed_runner(backend, prompts, tokens, seed, d, g, clock)
                 for d, draft in enumerate(drafts) for g in LENGTHS})
    runs["adaptive"] = adaptive_runner(backend, prompts, tokens, seed, policy, captured, clock)
    results, orders = run_rounds(runs, rounds, log)
    new, rows = len(prompts) * tokens, len(prompts)
    tps = {name: [new / r[1] for r in rs] for name, rs in results.items()}  # [rounds] per configuration
    pick = {name: results[name][median_index(v)] for name, v in tps.items()}  # the median round's run
    row = dict(batch=rows, new_tokens=new, rounds=rounds, round_orders=orders, rounds_tokens_per_s=tps,
               spread={name: spread(v) for name, v in tps.items()}, plain_tokens_per_s=new / pick["plain"][1],
               plain_step_ms=step_ms(pick["plain"][2]), tokens_equal={
                   name: min(rows_equal(r[0], ref_out) for r in rs) for name, rs in results.items() if name != "plain"})
    row["fixed"] = {k: fixed_summary(pick[k][2], pick[k][1], new, rows) for k in runs if k not in ("plain", "adaptive")}
    row["best_fixed_scored"] = scored_run(backend, prompts, tokens, seed, drafts, row["fixed"], clock)
    out, s, rec, choices, arms = pick["adaptive"]
    row.update(adaptive_tokens_per_s=new / s, **adaptive_summary(rec, choices, arms, policy, drafts, rows))
    row["adaptive_rounds"] = [dict(steps=dict(Counter(n)), arms=arm_runs(n)) for n in (
        [arm_name(policy.arms[a], drafts) for a in r[4]] for r in results["adaptive"])]  # where each round's steps went
    row["checks"] = checks(row, tps)
    return row


def checks(row: dict, tps: dict[str, list[float]]) -> dict:
    """Pass/fail on the medians (``row``'s figures), and adaptive over the best of plain and the fixed runs per round
    (``tps``: each configuration's tokens/s per round)."""
    best = max(row["fixed"].items(), key=lambda kv: kv[1]["tokens_per_s"])
    row["best_fixed"] = best[0]
    best_tps = max(best[1]["tokens_per_s"], row["plain_tokens_per_s"])
    per_round = [a / max(v[r] for k, v in tps.items() if k != "adaptive") for r, a in enumerate(tps["adaptive"])]
    return {
        "tokens_equal_plain": all(v == 1.0 for v in row["tokens_equal"].values()),
        "adaptive_vs_best_fixed_or_plain": row["adaptive_tokens_per_s"] / best_tps,
        "adaptive_vs_plain": row["adaptive_tokens_per_s"] / row["plain_tokens_per_s"],
        "rounds_adaptive_vs_best": per_round,  # in each round against that round's best configuration
        "rounds_adaptive_vs_plain": [a / p for a, p in zip(tps["adaptive"], tps["plain"])],
        "adaptive_ge_0.98_best": row["adaptive_tokens_per_s"] >= 0.98 * best_tps,
        "adaptive_ge_plain": row["adaptive_tokens_per_s"] >= row["plain_tokens_per_s"],
    }


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="embedded,smollm2-135m,llama3-8b")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new (model, batch) after this many seconds")
    ap.add_argument("--keep", type=float, default=0.6, help="the replay draft's per-token acceptance")
    ap.add_argument("--prompt-len", type=int, default=64, help="random prompts' length (random-weight models)")
    ap.add_argument("--gguf", default=None, help="the embedded model's GGUF file where its package is not installed")
    ap.add_argument("--drafts", default=None, help="the embedded model's drafts, engine draft names (default: the "
                    "engine's, head,ngram); random-weight models run ngram and replay")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="tokens/s and the adaptive policy's step times on the wall clock or this process's CPU time "
                         "(--device cpu, with OMP_NUM_THREADS=1)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every configuration of a batch row "
                    "(the order rotated each round); each figure the median over rounds")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    unknown = set(args.models.split(",")) - {"embedded", *SHAPES}
    if unknown:
        ap.error(f"--models: unknown {sorted(unknown)}; choose from {['embedded', *SHAPES]}")
    if args.drafts is not None and "embedded" not in args.models.split(","):
        ap.error("--drafts names the embedded model's drafts; random-weight models run ngram and replay: "
                 "add embedded to --models or leave --drafts out")
    args.drafts = default_drafts("torch", None) if args.drafts is None else tuple(filter(None, args.drafts.split(",")))
    if not args.drafts:
        ap.error("--drafts: name at least one draft (e.g. head,ngram)")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: run at least one round")
    if args.clock == "process" and args.device != "cpu":
        ap.error("--clock process times the host's CPU work, not a device's: use it with --device cpu")
    return args


def describe(args, device: torch.device) -> dict:
    """The JSON's header: the command, the machine, the settings."""
    return dict(command="python " + " ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                torch=torch.__version__, triton=version("triton"), python=platform.python_version(),
                cuda=torch.version.cuda, keep=args.keep, lengths=LENGTHS, tokens_per_row=args.tokens,
                sampling="greedy", clock=args.clock, rounds=args.rounds, threads=torch.get_num_threads(),
                complete=False, models={},
                skipped={}, embedded_drafts=list(args.drafts), stop_below={},
                prompts_embedded="flashspec.head_corpus held-out split, cycling code, prose, chat",
                tokens_equal_note=("fraction of rows whose greedy tokens equal plain decoding's; in bf16 (the GPU) "
                                   "scoring G + 1 positions and decoding one round differently, so a near-tie of "
                                   "random weights' top two logits can flip a token: a fraction < 1 there is that "
                                   "rounding, not the policy (fp32 on the CPU: 1.0, "
                                   "tests/torch/test_adaptive_bench.py)"))


def batch_prompts(model, held: list | None, b: int, prompt_len: int) -> list[list[int]]:
    """The first ``b`` held-out prompts, or ``b`` random prompts of ``prompt_len`` tokens (seeded by ``b``)."""
    if held is not None:
        return held[:b]
    g = torch.Generator().manual_seed(b)
    return torch.randint(0, model.config.vocab_size, (b, prompt_len), generator=g).tolist()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    doc, clock, start = describe(args, device), CLOCKS[args.clock], time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    with torch.inference_mode():
        for name in args.models.split(","):
            try:
                model, held, drafts = load_model(name, device, gguf=args.gguf, drafts=args.drafts, prompts=max(batches))
            except (ImportError, FileNotFoundError, OSError) as e:  # the embedded model's weights not installed
                doc["skipped"][name] = f"{type(e).__name__}: {e}"
                print(f"skipped {name}: {e}", flush=True)
                continue
            if drafts is not None:
                doc["stop_below"][name] = {d.name: getattr(d, "stop_below", None) for d in drafts}
            box: dict = {}
            rows = []
            for b in batches:
                if time.perf_counter() - start > args.budget_s:
                    doc["skipped"][f"{name}@{b}"] = f"--budget-s {args.budget_s} spent"
                    continue
                log = lambda r, c, b=b: print(f"{name} batch {b} round {r}: {c} ({time.perf_counter() - start:.0f} s)",
                                              flush=True)
                rows.append(run_batch(model, batch_prompts(model, held, b, args.prompt_len), args.tokens, args.keep,
                                      box, device, drafts, clock, args.rounds, log))
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
