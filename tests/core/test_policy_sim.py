"""The replay simulator (``flashspec.policy_sim``) and the adaptive policy in it: a static batch of 256 rows on
Llama-3-8B's H100 prices (``benchmarks/policy_sim.py`` calibrates these from the run's JSON), where a speculative
step costs 2.2-3.6x a plain one and plain decoding is the best fixed choice."""

import numpy as np
import pytest

from flashspec.adaptive import AdaptivePolicy, make_arms
from flashspec.throughput import emitted_moments
from flashspec.policy_sim import (DraftModel, Rows, Scenario, compare, position_acceptance, run_adaptive, run_fixed,
                                  trace_bits)

ARMS = make_arms(2, (2, 4))  # plain, ngram:G2, ngram:G4, replay:G2, replay:G4
# H100, Llama-3-8B's shape, batch 256 (benchmarks/results/h100_2026-12-06_s13_adaptive): seconds per step, the
# drafts' fitted acceptance, and the seconds a plain step's full-information scoring adds
LLAMA_256 = dict(costs=(0.01004, 0.02246, 0.03398, 0.02178, 0.03576),
                 drafts=(DraftModel(0.9, 0.7, 512.0), DraftModel(0.5, 0.6, 8.0)), score_cost=0.00069)


class BlindPolicy(AdaptivePolicy):
    """A mutant that explores blindly: every unmeasured arm is tried whatever its prices say, every draft is
    Thompson-sampled although scored for free, and every step is valued by the mean row (no batch tail)."""

    def hopeless(self, b, rate):
        return np.zeros(len(self.arms), bool)

    def sample_alpha(self):
        succ, fail = self.counts()
        return self.rng.beta(self.prior[0] + succ, self.prior[1] + fail)

    def new_batch(self, rows=None, tokens=None):
        super().new_batch(rows, None)


def test_a_static_batch_runs_until_its_slowest_row():
    """A draft always right emits 3 tokens a G = 2 step, one always wrong 1: 30 tokens take 10 and 30 steps;
    rows whose draft turns wrong after a few tokens hold the whole batch for their remaining tokens."""
    sc = Scenario(ARMS[:2], (1.0, 2.0), (DraftModel(1.0, 1.0),), batch=4, tokens=30, noise=0.0)
    assert run_fixed(sc, 1).steps == {1: 10} and run_fixed(sc, 0).steps == {0: 30}
    never = Scenario(ARMS[:2], (1.0, 2.0), (DraftModel(0.0, 0.0),), batch=4, tokens=30, noise=0.0)
    assert run_fixed(never, 1).tokens_per_s == pytest.approx(run_fixed(never, 0).tokens_per_s / 2)
    drop = Scenario(ARMS[:2], (1.0, 2.0), (DraftModel(1.0, 0.0, 6.0),), batch=64, tokens=30, noise=0.0)
    rows = Rows(drop)
    assert rows.ok[0, :, 0].all() and not rows.ok[0, :, 29].all() and run_fixed(drop, 1, rows).steps[1] > 20


@pytest.fixture(scope="module")
def llama_256():
    return Scenario(ARMS, batch=256, tokens=128, **LLAMA_256)


def test_the_policy_stays_with_plain_decoding_where_speculation_does_not_pay(llama_256):
    """At batch 256 plain decoding is the best fixed arm (about 1.1x the n-gram at G = 2): the policy, priced by
    the batch's finish and scoring the drafts for free, runs within 8% of it from a cold start (0.94x); the blind
    explorer, which tries every arm and keeps sampling drafts it could have read, falls below 0.9x (0.76x)."""
    out = compare(llama_256, lambda: AdaptivePolicy(ARMS, 2, rng=0), warm=False)
    assert out["best"] == 0 and out["vs_plain"] >= 0.92, out
    blind = compare(llama_256, lambda: BlindPolicy(ARMS, 2, rng=0), warm=False)
    assert blind["vs_plain"] < 0.9, blind


def test_a_replayed_trace_gives_its_fixed_run_back():
    """A fixed G = 4 run's trace (tokens accepted per step) fixes every position it saw; a G = 2 trace fills the
    bonus position the G = 4 run never drafted; replaying the G = 4 run takes exactly its recorded 4 steps."""
    bits = trace_bits({4: ["4203"], 2: ["22"]}, 16)
    assert bits[0, :13].tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0] and (bits[0, 13:] == -1).all()
    assert trace_bits({2: ["1220"]}, 10)[0].tolist() == [1, 0, 1, 1, -1, 1, 1, -1, 0, -1]
    with pytest.raises(ValueError, match="3 accepted of 2"):
        trace_bits({2: ["3"]}, 8)
    sc = Scenario((ARMS[0], ARMS[2]), (1.0, 2.0), (DraftModel(0.0, 0.0),), batch=3, tokens=12, noise=0.0)
    rows = Rows.replay(sc, [bits])
    assert run_fixed(sc, 1, rows).steps == {1: 4} and run_fixed(sc, 0, rows).steps == {0: 12}
    assert position_acceptance(["4203"], 4) == [0.75, 1.0, 0.6667, 0.5]  # reached 4, 3, 3, 2 times


class SharedAlpha(AdaptivePolicy):
    """A mutant that values every draft position at the draft's one per-token acceptance (no position profile)."""

    def profile(self):
        return np.ones_like(self.pos_succ)


def test_each_draft_position_is_priced_by_its_own_acceptance():
    """An n-gram whose third and fourth tokens hold less often (position 0.35, 0.5: the continuation past its match),
    on SmolLM2-135M's H200 prices at batch 64: G = 2 is the best fixed arm by a few per cent. One acceptance for every
    position, learned from the G = 4 steps' rejections, prices G = 2 too low and mixes in G = 4 (half its steps, 0.984x
    of the best since ad22's clean pricing; 0.975x before, 0.96x before the change test); each position's own
    acceptance keeps G = 2."""
    assert emitted_moments(0.8, 2, np.array([1.0, 0.5]))[0] == pytest.approx(1 + 0.8 + 0.8 * 0.4)
    assert emitted_moments(0.8, 3)[0] == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert emitted_moments(0.8, 3, np.ones(4))[1] == pytest.approx(emitted_moments(0.8, 3)[1])
    sc = Scenario(ARMS, (1.08e-3, 1.28e-3, 1.46e-3, 1.34e-3, 1.6e-3),
                  (DraftModel(0.95, 0.75, 48.0, position=(1.0, 1.0, 0.35, 0.5)), DraftModel(0.6, 0.6)), batch=64)
    out = compare(sc, lambda: AdaptivePolicy(ARMS, 2, rng=0))
    assert out["best"] == 1 and out["vs_best"] >= 0.98 and out["steps"].get(2, 0) <= 2, out
    shared = compare(sc, lambda: SharedAlpha(ARMS, 2, rng=0))
    assert shared["vs_best"] < out["vs_best"] and shared["steps"].get(2, 0) > 10, shared


def test_the_gpu_runs_replay_keeps_the_chosen_arms_and_the_cold_start():
    """``run_adaptive(chosen=)`` records each step's arm (the steps the run took), and ``warm=False`` makes the
    first measurement of each arm provisional: a policy that starts cold runs every speculative arm twice, one
    that starts warm once; ``benchmarks/adaptive_replay.py`` replays a GPU run's batches with one policy."""
    sc = Scenario(ARMS, (1.0, 1.5, 1.8, 1.5, 1.8), (DraftModel(0.8, 0.8), DraftModel(0.3, 0.3)), batch=4, tokens=40,
                  noise=0.0)
    counts = {}
    for warm in (True, False):
        seq: list[int] = []
        res = run_adaptive(sc, AdaptivePolicy(ARMS, 2, rng=0), warm=warm, chosen=seq)
        assert len(seq) == sum(res.steps.values()) and all(seq.count(a) == n for a, n in res.steps.items())
        counts[warm] = res.steps
    assert counts[True] != counts[False]


def test_the_replay_script_replays_each_batch_of_a_run():
    """The replay of a two-batch run's record (traces and step times as ``adaptive_bench.py`` writes them): one
    row per batch, the replayed arm sequence as many steps as it says, the best fixed arm's steps as recorded."""
    from benchmark_modules import load_benchmark

    replay = load_benchmark("adaptive_replay")
    fixed = {f"{d}:G{g}": dict(step_ms=1.0 + g / 10, trace=[t * 6] * 2)
             for d, t in (("ngram", "2"), ("replay", "1")) for g in (2, 4)}
    row = dict(batch=2, plain_step_ms=1.0, fixed=fixed, adaptive_arms="ngram:G2*6",
               adaptive_cost_ms={"plain": 1.0, "ngram:G2": 1.2, "ngram:G4": 1.4, "replay:G2": 1.2, "replay:G4": 1.4},
               checks={"adaptive_vs_best_fixed_or_plain": 1.0})
    out = replay.replay_model([row, dict(row, batch=2)], 18, lambda arms: AdaptivePolicy(arms, 2, rng=0), True, True)
    assert [r["batch"] for r in out] == [2, 2]
    for r in out:
        assert sum(int(x.rsplit("*", 1)[1]) for x in r["replayed_arms"].split()) == r["replayed_steps"]
        assert r["best_fixed_steps"] == 6 and r["replayed_vs_best"] <= 1.0 + 1e-9


class NoChange(AdaptivePolicy):
    """A mutant that never detects a change: a draft's evidence is forgotten only by the per-step discount (and no
    ``bias`` correction, which sees a change too, as accepted tokens over predicted, over a few steps)."""

    def changed(self, draft, drafted, accepted, where=None, alpha=None, profile=None):
        return False

    def bias(self):
        return np.ones(len(self.succ))


def test_a_batch_wide_change_of_acceptance_is_seen_in_a_step():
    """A lookup draft with nothing to match for its rows' first tokens (acceptance 0), then right 90% of the time,
    beside a draft right 55% of the time at every position, at batch 128: the policy leaves the second draft for the
    first within a few steps of the change (a change of domain, ``AdaptivePolicy.changed``), where forgetting by the
    discount alone holds the old evidence (the start's rejections, 128 rows' worth a step) for many steps more."""
    arms = make_arms(2, (2,), plain=False)  # lookup:G2, steady:G2
    sc = Scenario(arms, (1.0, 1.0), (DraftModel(0.0, 0.9, 3.0), DraftModel(0.55, 0.55)), batch=128, tokens=96,
                  noise=0.0)
    first = {}
    for make in (AdaptivePolicy, NoChange):
        policy = make(arms, 2, rng=0)
        policy.new_batch(128)
        policy.succ[:] = (8.0, 4.0)  # both drafts looked good on the last request (carry's worth of evidence)
        policy.fail[:] = (2.0, 3.0)
        seq: list[int] = []
        run_adaptive(sc, policy, chosen=seq)
        later = [i for i in range(3, len(seq)) if seq[i] == 0]
        first[make.__name__] = later[0] if later else len(seq)
    assert first["AdaptivePolicy"] <= 6 and first["NoChange"] >= first["AdaptivePolicy"] + 3, first
