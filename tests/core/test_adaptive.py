"""flashspec.adaptive and its loop (flashspec.adaptive_loop) against the fake (Markov-chain) backend: exactness
with plain decoding among the arms, and the throughput choice under a simulated clock (step costs that grow with
the batch)."""

import numpy as np
import pytest

from flashspec import adaptive_loop, change, loop, throughput
from flashspec.adaptive import AdaptivePolicy, Arm, bucket, make_arms
from flashspec.adaptive_loop import speculate_adaptive
from flashspec.throughput import emitted_moments
from flashspec.config import SamplingConfig
from flashspec.fake import LookupDraft, MarkovBackend, ModelDraft
from flashspec.fake import chain_law as target_law
from flashspec.loop import SpecConfig
from flashspec.testing import chi_square_test
from slow_choice import SlowChoice  # tests/slow_choice.py

V = 4


def chain(seed):
    r = np.random.default_rng(seed)
    target = (r.normal(size=(V, V)) * 1.2).astype(np.float32)
    drafts = [ModelDraft("good", (target + r.normal(size=(V, V)) * 0.3).astype(np.float32)),
              LookupDraft("lookup", r.integers(0, V, V))]
    return target, drafts


def run(backend, policy, prompts, sampling, spec, seed=0):
    backend.prefill(prompts, spec.max_new_tokens)
    records = []
    speculate_adaptive(backend, policy, sampling=sampling, spec=spec, seed=seed, rows=len(prompts), records=records)
    return backend.outputs(), records


def test_plain_and_speculative_arms_together_are_exact():
    """One bucket for every batch size: a small warm-up batch measures every arm, plain decoding is then made to
    look free (a cost of 1 ns at weight 1e-6, so the next measurement replaces it) and every speculative step
    to cost 1 ms (plain decoding's own next measurement is capped there, so speculation wins), so 40,000
    rows run two plain steps
    (the second chosen before the first is read), then a speculative one the posterior picks; the law of
    the first three tokens is the target's."""
    target, drafts = chain(1)
    sampling = SamplingConfig(1.0)
    policy = AdaptivePolicy(make_arms(2, (1, 2)), 2, rng=3, max_buckets=1)
    run(MarkovBackend(target, drafts), policy, [[0]] * 4, sampling, SpecConfig(gamma=2, max_new_tokens=40), seed=1)
    policy.log_cost[0, 0], policy.cost_weight[0, 0] = np.log(1e-9), 1e-6
    policy.log_cost[0, 1:], policy.cost_weight[0, 1:] = np.log(1e-3), 1e6  # every draft's step 1 ms, whatever the load
    policy.succ[0], policy.fail[0] = 60.0, 6.0  # the good draft's acceptance about 0.9, whatever the warm-up ran
    policy.samples[0], policy.rough[0], policy.age[0] = 2, False, 0  # every estimate clean and fresh, whatever the
    # warm-up's host timing made of it (a loaded machine marks steps rough or leaves an arm measured once: explored)
    outs, records = run(MarkovBackend(target, drafts), policy, [[0]] * 40_000, sampling,
                        SpecConfig(gamma=2, max_new_tokens=40, max_steps=3), seed=17)  # 3 steps, 3+ tokens a row
    assert [r.arm for r in records][:2] == [-1, -1] and records[2].arm >= 0
    tokens = np.array([o[:3] for o in outs])
    observed = np.bincount(tokens @ np.array([V * V, V, 1]), minlength=V**3)
    _, p_value, note = chi_square_test(observed, target_law(target, sampling, 0, 3))
    assert p_value >= 0.01, note


class Clock:
    """A simulated clock: each step advances it by the cost model's seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TimedBackend(MarkovBackend):
    """Step costs: plain = rows * per_row + fixed; speculative = (1 + spec_extra(rows)) x that, independent of G."""

    def __init__(self, target, drafts, clock, spec_extra, spikes=None):
        super().__init__(target, drafts)
        self.clock, self.spec_extra = clock, spec_extra
        self.spikes = spikes or {}  # G (0: plain) -> factors of that kind's first steps' costs (a load spike)

    def spike(self, gamma):
        return self.spikes[gamma].pop(0) if self.spikes.get(gamma) else 1.0

    def cost(self, rows):
        return 1e-3 + 1e-5 * rows

    def step(self, arm, gamma, sampling, seed, offset):
        rows = int((~self.done).sum())
        self.clock.now += self.cost(rows) * (1 + self.spec_extra(rows) * gamma / 4) * self.spike(gamma)
        return super().step(arm, gamma, sampling, seed, offset)

    def decode_one(self, sampling, seed, offset):
        self.clock.now += self.cost(int((~self.done).sum())) * self.spike(0)
        return super().decode_one(sampling, seed, offset)


class LateHandle:
    """A step the simulated device finishes at ``finish``: reading it waits until then."""

    def __init__(self, handle, finish, clock):
        self.handle, self.finish, self.clock = handle, finish, clock

    def fetch(self):
        self.clock.now = max(self.clock.now, self.finish)
        return self.handle.fetch()


class AsyncBackend(MarkovBackend):
    """A device that runs launched steps in order, as a GPU does: a launch costs the host ``launch_s``,
    the step costs the device ``costs[G]`` (0: plain) after the previous one, and reading it waits for it; a plain
    step that scores the drafts for free costs ``score_s`` more (``scored``: those steps)."""

    def __init__(self, target, drafts, clock, costs, launch_s=1e-6, score_s=0.0):
        super().__init__(target, drafts)
        self.clock, self.costs, self.launch_s, self.free_at = clock, costs, launch_s, 0.0
        self.score_s, self.scored = score_s, 0

    def later(self, handle, gamma):
        self.clock.now += self.launch_s
        scoring = gamma == 0 and self.free_gamma > 0
        self.scored += scoring
        self.free_at = max(self.free_at, self.clock.now) + self.costs[gamma] + scoring * self.score_s
        return LateHandle(handle, self.free_at, self.clock)

    def step(self, arm, gamma, sampling, seed, offset):
        return self.later(super().step(arm, gamma, sampling, seed, offset), gamma)

    def decode_one(self, sampling, seed, offset):
        return self.later(super().decode_one(sampling, seed, offset), 0)


def test_an_asynchronous_devices_step_costs_go_to_the_arm_that_ran_them(clock):
    """Plain 1 s, G = 2 3 s, G = 4 5 s on a device that runs ahead of the host, a useless draft: each measured
    arm's estimated cost is its own (timing from one launch to the next gives step k - 1's cost to step k:
    G = 2 then looks as cheap as the plain step before it), G = 4 (at least G = 2's 3 s, emitting one token)
    is never run, and plain decoding runs every step but G = 2's two (the fake backend prepares nothing, so a
    first measurement is provisional and G = 2, which could win at plain decoding's cost, is measured again)."""
    target, _ = chain(2)
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)  # never the greedy token
    backend = AsyncBackend(target, [wrong], clock, {0: 1.0, 2: 3.0, 4: 5.0})
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=40))
    assert np.allclose(policy.cost[1, :2], [1.0, 3.0], rtol=1e-3) and np.isnan(policy.cost[1, 2]), policy.cost[1]
    assert [r.arm for r in records[:5]] == [-1, -1, 0, -1, 0] and all(r.arm == -1 for r in records[5:])
    assert np.allclose([r.seconds for r in records[:5]], [1.0, 1.0, 3.0, 1.0, 3.0], rtol=1e-3)


def plain_fraction(records):
    return np.mean([r.arm == -1 for r in records[len(records) // 2:]])  # the second half: after learning


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(loop.time, "perf_counter", c)
    return c


def test_useless_drafts_lose_to_plain_decoding(clock):
    target, _ = chain(2)
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)  # never the greedy token
    backend = TimedBackend(target, [wrong], clock, lambda rows: 0.3)
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=300))
    assert plain_fraction(records) > 0.9


def test_a_load_spike_on_plain_decodings_first_steps_is_capped_by_the_speculative_costs(clock):
    """Useless drafts (speculative steps cost 1.15x / 1.3x and emit one token) and plain decoding's first two
    steps (the second chosen while the first was in flight: every speculative arm includes plain decoding's
    work, so it waits for plain decoding's cost) timed 20x too slow: plain decoding's estimate exceeds the
    speculative arms' (impossible: a plain step does less work), so it is re-measured at once, and wins; G = 4,
    whose least cost is G = 2's (plain decoding's capped), runs at most twice (its first timing provisional), as
    without the spike."""
    target, _ = chain(2)
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)  # never the greedy token
    backend = TimedBackend(target, [wrong], clock, lambda rows: 0.3, spikes={0: [20.0, 20.0]})
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=300))
    assert [r.arm for r in records[:4]] == [-1, -1, 0, -1] and plain_fraction(records) > 0.9
    assert sum(r.drafted // r.rows == 4 for r in records if r.arm == 0) <= 2
    capped = AdaptivePolicy(make_arms(1, (2, 4)), 1)
    for arm, seconds in ((0, 20.0), (1, 1.15), (2, 1.3)):
        capped.observe(arm, 2, np.zeros(2, int), seconds)
    assert np.allclose(np.exp(capped.capped_log_cost(1)), [1.15, 1.15, 1.3]) and np.isclose(capped.cost[1, 0], 20.0)


def test_a_load_spike_on_the_best_arms_first_steps_is_re_measured(clock):
    """A perfect draft at 2 rows (G = 4 best) whose first G = 4 step is timed 20x too slow, on steps made ready
    before their first timing (``warm``): G = 2 wins until G = 4's estimate is ``remeasure`` steps old, G = 4 is
    re-measured (the spike now counts 0.9^64) and wins from then on; with a period longer than the run the spike
    shuts it out for good. Where the first run of a step kind may be cold (not ``warm``, the default: the fake
    backend prepares nothing, as the CPU), that first measurement is provisional: G = 4 is run again at once and
    wins from then on, whatever the period."""
    target, _ = chain(3)
    same = ModelDraft("same", target.copy())
    for warm, remeasure, g4_wins in ((True, 64, True), (True, 100_000, False), (False, 100_000, True)):
        backend = TimedBackend(target, [same], clock, lambda rows: 0.3, spikes={4: [20.0]})
        policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0, remeasure=remeasure)
        policy.warm = warm
        _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=600))
        g4 = np.array([r.drafted == 4 * r.rows for r in records])
        first = int(np.argmax(g4))
        assert first < 6  # plain, G = 2, G = 4 measured once each first
        if warm:
            assert not g4[first + 1:60].any()
        else:
            assert g4[first + 1] or g4[first + 2]  # measured again as soon as its first step was read
            assert g4[first + 4:60].all()  # and wins (G = 2's own second measurement between)
        assert (np.mean(g4[-40:]) > 0.9) == g4_wins


def test_a_good_draft_wins_at_small_batch_and_loses_at_large(clock):
    """Greedy, a draft equal to the target (every token accepted): at 2 rows a step of G = 4 costs 1.3x a plain
    step and emits 5x the tokens; at 64 rows verification costs 8x a plain step and plain decoding wins."""
    target, _ = chain(3)
    same = ModelDraft("same", target.copy())
    backend = TimedBackend(target, [same], clock, lambda rows: 0.3 if rows <= 2 else 28.0)
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    greedy = SamplingConfig(0.0)
    _, small = run(backend, policy, [[0]] * 2, greedy, SpecConfig(gamma=4, max_new_tokens=200))
    assert plain_fraction(small) < 0.1
    assert np.mean([r.drafted == 4 * r.rows for r in small[len(small) // 2:]]) > 0.9  # the longer length
    _, large = run(backend, policy, [[0]] * 64, greedy, SpecConfig(gamma=4, max_new_tokens=200))
    assert plain_fraction(large) > 0.9


def test_arms_buckets_and_bad_input():
    assert make_arms(2, (4, 2)) == (Arm(None), Arm(0, 2), Arm(0, 4), Arm(1, 2), Arm(1, 4))
    assert make_arms(1, (3,), plain=False) == (Arm(0, 3),)
    assert [bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 256)] == [0, 1, 2, 2, 3, 3, 4, 8]
    for bad in (dict(num_drafts=-1), dict(num_drafts=1, lengths=()), dict(num_drafts=1, lengths=(0,)),
                dict(num_drafts=0, plain=False)):
        with pytest.raises(ValueError):
            make_arms(**bad)
    with pytest.raises(ValueError, match="draft"):
        AdaptivePolicy([Arm(2, 4)], 2)
    with pytest.raises(ValueError, match="discount"):
        AdaptivePolicy(make_arms(1), 1, discount=0.0)
    with pytest.raises(ValueError, match="cost_discount"):
        AdaptivePolicy(make_arms(1), 1, cost_discount=1.5)
    with pytest.raises(ValueError, match="carry"):
        AdaptivePolicy(make_arms(1), 1, carry=0)
    with pytest.raises(ValueError, match="remeasure"):
        AdaptivePolicy(make_arms(1), 1, remeasure=0)
    p = AdaptivePolicy(make_arms(1), 1)
    with pytest.raises(ValueError, match="seconds"):
        p.observe(1, 2, np.array([1, 2]), 0.0)
    with pytest.raises(ValueError, match="accepted"):
        p.observe(1, 2, np.array([1, 3]), 1.0)


def test_full_information_moves_the_posterior_of_an_arm_not_run():
    p = AdaptivePolicy(make_arms(2, (4,)), 2)
    p.observe_free(1, np.array([3, 2, 4]), np.array([3, 0, 4]))
    assert (p.succ[1], p.fail[1]) == (7, 1) and (p.succ[0], p.fail[0]) == (0, 0)


@pytest.mark.parametrize("free", [0, 4])
def test_full_information_in_the_loop_scores_the_drafts_not_run(clock, free):
    """A lookup draft that proposes the greedy chain and a useless one, speculative steps dearer than plain at
    64 rows: plain decoding runs, and with the backend's full-information scoring (``score_free``) the right
    draft's posterior still learns from every plain step (without it, only from its own steps)."""
    target, _ = chain(2)
    right = LookupDraft("right", target.argmax(-1))
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)
    backend = AsyncBackend(target, [wrong, right], clock, {0: 1.0, 2: 4.0, 4: 8.0})
    policy = AdaptivePolicy(make_arms(2, (2, 4)), 2, rng=0, discount=1.0)
    if free:  # the longest arm's G
        assert adaptive_loop.use_free_scoring(backend, policy) == 2 and backend.free_gamma == 4
    _, records = run(backend, policy, [[0]] * 64, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=30))
    own = sum(r.accepted for r in records if r.arm == 1)
    if free:
        assert policy.succ[1] > own + 64 * 5 and policy.mean_alpha()[1].min() > 0.9
    else:
        assert policy.succ[1] == own
    assert all(r.arm == -1 for r in records[6:])  # the arms worth measuring measured once, then plain decoding


def test_each_request_of_a_mixed_stream_adapts_to_its_own_domain(clock):
    """Requests alternate between two domains, each draft right (the greedy chain) in one and wrong in the
    other; one policy serves the stream with full information: after the first request, each request runs
    the draft that is right for it on most steps from its second step on (with all the old evidence kept,
    ``carry`` unbounded, each switch takes about 20 steps)."""
    target, _ = chain(2)
    right, wrong = target.argmax(-1), (target.argmax(-1) + 1) % V
    policy = AdaptivePolicy(make_arms(2, (2, 4)), 2, rng=0)
    for i in range(6):
        good = i % 2
        drafts = [LookupDraft("a", right if good == 0 else wrong), LookupDraft("b", right if good == 1 else wrong)]
        backend = AsyncBackend(target, drafts, clock, {0: 1.0, 2: 1.2, 4: 1.4})
        adaptive_loop.use_free_scoring(backend, policy)
        _, records = run(backend, policy, [[i % V]] * 16, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=80))
        on_good = np.mean([r.arm == good for r in records[2:]])
        assert i == 0 or on_good > 0.8, (i, [r.arm for r in records])


def test_the_batch_value_sums_each_rows_own_acceptance():
    """Two rows of four accept all 4 drafted tokens, two accept none: per row, a G = 4 step emits 3 tokens a
    row on average, so at 3.1x a plain step's cost plain decoding is best; the pooled acceptance (0.8 per
    token) at every draft position would have promised 3.36 tokens a row and kept speculating. Pooled over the
    rows, the draft positions' own acceptances (0.5 at the first, then 1: ``AdaptivePolicy.profile``) price
    the step right too."""
    per_row, pooled = (AdaptivePolicy(make_arms(1, (4,)), 1, rng=0) for _ in range(2))
    per_row.new_batch(4)
    for p in (per_row, pooled):
        p.observe(0, 4, np.zeros(4, int), 1.0, where=np.arange(4))
        for _ in range(30):
            p.observe(1, 4, np.array([4, 4, 0, 0]), 3.1, where=np.arange(4))
    assert per_row.mean_alpha().shape == (1, 4) and pooled.mean_alpha().shape == (1, 1)
    assert np.argmax(per_row.value(4, 2, per_row.mean_alpha())) == 0 and per_row.choose(4) == 0
    assert emitted_moments(pooled.mean_alpha(), 4)[0] / 3.1 > 1.0 + 0.05  # one acceptance for every position
    assert pooled.profile()[0, 0] < 0.7 and (pooled.profile()[0, 1:] > 1.15).all()  # 0.625 and 1.25, shrunk
    assert np.argmax(pooled.value(4, 2, pooled.mean_alpha())) == 0


def test_arms_that_cannot_beat_plain_decoding_even_at_its_cost_are_never_run(clock):
    """Full information shows a lookup draft that is never right after the first plain steps. Its G = 2 arm,
    at plain decoding's cost (the least a speculative step can cost), might still pay on that little
    evidence, so it is measured at most once (never, once the first position's own rejections price it); G = 4,
    at least G = 2's cost (1.5x plain), cannot, and is never run: every other step is plain decoding."""
    target, _ = chain(2)
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)
    backend = AsyncBackend(target, [wrong], clock, {0: 1.0, 2: 1.5, 4: 1.6})
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    adaptive_loop.use_free_scoring(backend, policy)
    _, records = run(backend, policy, [[0]] * 64, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=40))
    assert [r.drafted // r.rows for r in records if r.arm == 0] in ([], [2]) and np.isnan(policy.cost[6, 2])


def test_a_longer_draft_is_explored_where_plain_decodings_estimate_includes_its_scoring():
    """Plain decoding's estimate holds its steps that scored the drafts (dearer than G = 2's here), and G = 4, never
    measured, would win at G = 2's cost: its least cost is G = 2's, not the scoring plain steps' (the mutant that
    floors G = 4 by plain decoding's own estimate calls it hopeless and never runs it)."""
    p = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    p.warm = True
    p.succ[0], p.fail[0] = 90.0, 10.0  # alpha 0.9: G = 4 emits about 4.1 tokens a step, G = 2 about 2.7
    b = p.bucket_of(1)
    p.log_cost[b, :2], p.cost_weight[b, :2] = np.log([1.6, 1.0]), 1.0  # plain (scoring 1 step in 4), G = 2
    rate = p.log_rate(1, p.mean_alpha())
    assert rate[2] - rate[1] > 0.1 and not p.hopeless(b, rate)[2]
    assert p.choose(1) == 2


def test_a_batchs_cost_bucket_is_its_size_not_its_active_rows():
    """A step computes every row of its batch, finished or not: with 3 of 8 rows still active the step is
    timed in the 8-row bucket, so the arms are not explored again as rows finish."""
    p = AdaptivePolicy(make_arms(1, (2,)), 1)
    p.new_batch(8)
    p.observe(0, 3, np.zeros(3, int), 1.0, where=np.arange(3))
    assert p.cost_weight[bucket(8), 0] > 0 and p.cost_weight[bucket(3), 0] == 0


def test_a_slow_choice_holds_its_arm_and_the_tokens_stay_plain_decodings(clock):
    """A choice taking 0.6 s of host time against 1 s device steps holds its arm for ceil(0.6 / HOST_SHARE) = 12
    steps (``held``): few steps ask the policy (those after exploration); the held steps run the arm chosen, and greedy
    tokens equal plain decoding's (each step keeps its own offset whatever arm runs). ``held`` itself: 1 without a
    measured step or host time, or within ``HOST_SHARE`` of a step, at most ``MAX_HOLD``."""
    share = throughput.HOST_SHARE
    assert throughput.held(0.0, 1.0) == 1 and throughput.held(0.1, None) == 1 and throughput.held(0.8 * share, 1.0) == 1
    assert throughput.held(2.5 * share, 1.0) == 3 and throughput.held(5.0, 1.0) == throughput.MAX_HOLD
    target, drafts = chain(1)
    prompts = [[0], [1], [2], [3]]
    backend = AsyncBackend(target, drafts, clock, {0: 1.0, 2: 1.0})
    policy = SlowChoice(make_arms(2, (2,)), 2, rng=0, clock=clock, host_s=0.6)
    outs, records = run(backend, policy, prompts, SamplingConfig(0.0), SpecConfig(gamma=2, max_new_tokens=40))
    assert len(records) >= 12 and policy.calls <= 0.6 * len(records), (policy.calls, len(records))
    arms = [r.arm for r in records]
    assert any(a == b for a, b in zip(arms[3:], arms[4:]))
    plain, _ = loop.decode(MarkovBackend(target, drafts), prompts, sampling=SamplingConfig(0.0), max_new_tokens=40)
    assert outs == plain


def test_a_held_choice_ends_where_the_steps_key_changes():
    """``adaptive_loop.Choices``: a choice made on value taking 0.12 s against a 1 s step holds its arm for the next
    2 steps (ceil(0.12 / ``HOST_SHARE``) = 3 in all) under the same key without asking the policy (each still
    launched: in flight); a step under another key (the server: another sampling group or cost bucket) asks again; a choice not made on value (an exploration) holds
    one step more where its host time shows (0.12 s, more than ``CHOSE_SHARE`` of a step: that step is timed without
    it), none where it takes no time or less than the last read waited for the device."""
    policy = AdaptivePolicy(make_arms(1, (2,)), 1)
    now, asked = [0.0], []

    def choose(arm, on_value=True, seconds=0.12):
        def run():
            now[0] += seconds
            asked.append(arm)
            policy.on_value = on_value
            return arm
        return run

    choices = adaptive_loop.Choices(None, policy, lambda: now[0])
    got = [choices.next(choose(1), 1.0, key="a") for _ in range(4)]
    assert got == [1, 1, 1, 1] and asked == [1, 1] and policy.in_flight == {1: 2}  # the held steps' launches
    assert choices.next(choose(0), 1.0, key="b") == 0 and asked == [1, 1, 0]
    assert [choices.next(choose(1), 1.0, key="b") for _ in range(2)] == [0, 0] and asked == [1, 1, 0]  # held
    assert [choices.next(choose(1, on_value=False), 1.0, key="c") for _ in range(3)] == [1, 1, 1]
    assert asked == [1, 1, 0, 1, 1] and choices.chose and choices.chose_s == pytest.approx(0.12)  # asked, held, asked
    assert [choices.next(choose(0, on_value=False, seconds=0.0), 1.0, key="d") for _ in range(2)] == [0, 0]
    assert asked == [1, 1, 0, 1, 1, 0, 0]  # no hold
    assert [choices.next(choose(1, on_value=False), 1.0, key="e", waited=0.7) for _ in range(2)] == [1, 1]
    assert asked == [1, 1, 0, 1, 1, 0, 0, 1, 1]  # hidden behind the last read's 0.7 s wait for the device: no hold


def test_a_draft_not_scored_for_free_is_tried_again_after_unlucky_first_steps(clock):
    """A draft equal to the target (every token accepted) that the policy cannot score for free (a model draft),
    whose first steps were priced by four rejections: plain decoding leads on the posterior means (G = 2 at
    mean acceptance 0.2 emits 1.24 tokens for 1.15x a plain step's cost). The Thompson draw still tries the
    draft, which then wins on most steps; taking plain decoding at once whenever it led on the means (the
    policy before s17) never ran the draft again."""
    target, _ = chain(3)
    same = ModelDraft("same", target.copy())
    for plain_at_once in (False, True):
        policy = (PlainAtOnce if plain_at_once else AdaptivePolicy)(make_arms(1, (2, 4)), 1, rng=0)
        policy.warm = True
        for arm, seconds in ((0, 1.1e-3), (1, 1.265e-3), (2, 1.43e-3)):  # TimedBackend's step costs at 2 rows
            policy.observe(arm, 2, np.zeros(2, int), seconds)
        assert np.argmax(policy.value(2, 1, policy.mean_alpha())) == 0
        backend = TimedBackend(target, [same], clock, lambda rows: 0.3)
        _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=120))
        assert (plain_fraction(records) < 0.2) != plain_at_once, [r.arm for r in records]


class PlainAtOnce(AdaptivePolicy):
    """The choice before s17: plain decoding, best on the posterior means, is taken without a Thompson draw."""

    def sample_alpha(self):
        draw = super().sample_alpha()
        mean = self.mean_alpha()
        if np.argmax(self.value(int(self.row_active.sum()), self.bucket_of(2), mean)) == 0:
            return mean
        return draw


def drive_batch(policy, alpha, tokens, steps, seed):
    """A static batch of G = 2 steps of arm 1 whose rows accept each drafted token with probability ``alpha(t)``
    [rows] at step t, each row until it has ``tokens``; returns the policy."""
    rng = np.random.default_rng(seed)
    rows = len(alpha(0))
    policy.new_batch(rows, tokens)
    left = np.full(rows, tokens)
    for t in range(steps):
        where = np.flatnonzero(left > 0)
        if where.size == 0:
            break
        ok = rng.random((where.size, 2)) < alpha(t)[where, None]  # [rows, 2]
        acc = np.cumprod(ok, axis=1).sum(axis=1)
        policy.observe(1, where.size, acc, 1.0, where=where)
        left[where] -= acc + 1
    return policy


class CountingChanges(AdaptivePolicy):
    """The policy, counting the steps it took for a change (``changed``)."""

    def __init__(self, arms, num_drafts):
        super().__init__(arms, num_drafts, rng=0)
        self.changes = 0

    def changed(self, draft, drafted, accepted, where=None, alpha=None, profile=None):
        seen = super().changed(draft, drafted, accepted, where, alpha, profile)
        self.changes += seen
        return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_slow_drift_of_acceptance_is_not_a_change(monkeypatch, seed):
    """256 rows fall one by one (uniformly over steps 3-40) from acceptance 0.5 into loops at 0.9: the first-position
    share rises about 0.01 a step, which the discount follows; no step is a change (``changed``'s window test). The
    mutant without the window (the rows' predictions alone, which lag such a drift) takes some step for a change."""
    arms = make_arms(1, (2,))
    switch = np.random.default_rng(seed).uniform(3, 40, 256)  # [rows]

    def alpha(t):
        return np.where(t >= switch, 0.9, 0.5)

    assert drive_batch(CountingChanges(arms, 1), alpha, 400, 60, seed).changes == 0
    monkeypatch.setattr(change, "CHANGE_WINDOW", 0)
    assert drive_batch(CountingChanges(arms, 1), alpha, 400, 60, seed).changes >= 1


def test_a_step_of_slow_rows_is_judged_by_their_own_acceptance():
    """After 30 steps of 256 rows, half accepting 0.95 a token and half 0.15, a step of the slow half alone (as a
    static batch ends) is no surprise to the rows' own posteriors (``surprised`` with ``where``); to the pooled
    posterior alone (``where`` None) it is."""
    arms = make_arms(1, (2,))
    fast = np.arange(256) < 128

    def alpha(t):
        return np.where(fast, 0.95, 0.15)

    policy = drive_batch(AdaptivePolicy(arms, 1, rng=0), alpha, 10_000, 30, 0)
    slow = np.flatnonzero(~fast)
    accepted = (np.random.default_rng(5).random(slow.size) < 0.15).astype(np.int64)  # [128]: first tokens only
    tried = np.ones(slow.size, bool)
    assert not policy.surprised(0, tried, accepted, slow)
    assert policy.surprised(0, tried, accepted, None)



def test_a_draft_that_stops_early_is_valued_by_the_tokens_it_emits():
    """A draft with a dynamic length that drafts one token a row at G = 2 and at G = 4 (it stops after it) and has
    that token accepted: each such row ended its run as a rejection would, so G = 4 is valued at G = 2's tokens
    (2 a step), not at the 5 of a draft accepted at every position it was offered, and G = 2, the cheaper, is
    chosen (the mutant that reads a stop as a censored window values G = 2 at 3 tokens and G = 4 at 5)."""
    p = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    p.warm = True
    b = p.bucket_of(4)
    ones = np.ones(4, np.int64)
    for _ in range(20):
        p.observe(1, 4, ones, 1.5, drafted=ones)  # G = 2: one token drafted and accepted
        p.observe(2, 4, ones, 1.8, drafted=ones)  # G = 4: the same
    p.observe(0, 4, np.zeros(4, np.int64), 1.0)
    tokens = np.exp(p.log_rate(4, p.mean_alpha())) / 4  # [arms]: per row and step
    assert tokens[1] == pytest.approx(tokens[2], rel=0.02) and tokens[2] < 2.1, tokens
    assert p.choose(4) == 1


def test_a_free_scores_window_is_censored_not_a_rejection():
    """``observe_free``'s window ends where the step's tokens end: a draft scored on 1 token and matching it
    gains evidence of acceptance and none of rejection (``adaptive.ended`` reads stops of run drafts only)."""
    p = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    p.observe_free(0, np.ones(4, np.int64), np.ones(4, np.int64))
    assert p.succ[0] == 4 and p.fail[0] == 0


def test_the_loop_times_its_steps_on_the_clock_it_is_given():
    """``speculate_adaptive(clock=...)``: the steps are timed on that clock (a benchmark's process time), not on
    ``time.perf_counter``: on a simulated device of 1 s plain steps and 3 s G = 2 steps every record's seconds are
    its arm's."""
    target, _ = chain(2)
    wrong = LookupDraft("wrong", (target.argmax(-1) + 1) % V)
    c = Clock()
    backend = AsyncBackend(target, [wrong], c, {0: 1.0, 2: 3.0, 4: 5.0})
    policy = AdaptivePolicy(make_arms(1, (2,)), 1, rng=0)
    backend.prefill([[0]] * 2, 20)
    records = []
    speculate_adaptive(backend, policy, sampling=SamplingConfig(0.0), spec=SpecConfig(gamma=2, max_new_tokens=20),
                       seed=0, rows=2, records=records, clock=c)
    assert {r.arm for r in records} == {-1, 0}
    assert np.allclose([r.seconds for r in records], [3.0 if r.arm == 0 else 1.0 for r in records], rtol=1e-3)
