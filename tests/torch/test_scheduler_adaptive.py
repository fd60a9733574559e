"""The slot scheduler with the adaptive arms (``--policy adaptive``, issue #35) on a tiny random model
(CPU): under a simulated clock whose speculative steps cost what a plain step does at one row and 6x
at four, it speculates alone and decodes plainly at four rows; a request entering a slot starts from
the request prior, not the posterior of the request that held the slot; greedy requests served
together equal plain greedy decoding of each alone; the per-request figures count what each row
drafted; each bucket's costs are its steps' own as the running set grows and shrinks. The policy runs through
the engine loop's calls (``flashspec.adaptive_loop``): a request served alone gets the engine loop's arms, a slow
choice holds its arm, ``Service.prepare`` and a new sampling group prepare every arm and set ``warm``."""

import numpy as np
import pytest

from fault_helpers import tiny_target
from torch_helpers import serve_together

from flashspec.adaptive import AdaptivePolicy
from flashspec.config import SamplingConfig
from flashspec.scheduler import Scheduler, Submission
from flashspec.serving import Service
from slow_choice import SlowChoice  # tests/slow_choice.py

GREEDY = SamplingConfig(0.0, 0, 1.0)


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=5)


def adaptive_engine(tiny, graphs=False):
    from flashspec_torch.engine import Engine

    eng = Engine(tiny, ("ngram",), policy="adaptive", device="cpu")
    if graphs:  # the graphed steps' fixed-shape code (full-information scoring inside), run eagerly
        from flashspec_torch.backend import StaticSteps

        eng.backend.graphed, eng.backend.graphs = True, StaticSteps()
    return eng


class Clock:
    """Simulated seconds: a slot step advances it by its cost (``cost(plain, rows computed)``)."""

    def __init__(self, backend, cost):
        self.now, self.log = 0.0, []
        step, decode = backend.step_slots, backend.decode_slots

        def step_slots(arm, gamma, sampling, rows):
            return self.run(False, backend, rows, lambda: step(arm, gamma, sampling, rows))

        def decode_slots(sampling, rows):
            return self.run(True, backend, rows, lambda: decode(sampling, rows))

        self.cost = cost
        backend.step_slots, backend.decode_slots = step_slots, decode_slots

    def run(self, plain, backend, rows, go):
        handle = go()
        k = backend.bucket()
        self.now += self.cost(plain, k)
        self.log.append((plain, int(np.asarray(rows).sum())))
        return handle

    def __call__(self):
        return self.now


def run_until_idle(sched, limit=2000):
    for _ in range(limit):
        if not (sched.busy() or sched.pending):
            return
        sched.iterate()
    raise AssertionError("the scheduler did not finish its requests")


def submit(eng, sched, prompts, n):
    return [sched.submit(Submission(tuple(eng.tokenizer(p)["input_ids"]), n, GREEDY, seed=i), lambda t, new: None)
            for i, p in enumerate(prompts)]


def test_speculates_alone_and_decodes_plainly_where_speculation_costs_more(tiny):
    eng = adaptive_engine(tiny)
    policy = eng.adaptive_policy(4, 0)
    # a speculative step costs a plain step's time at one row, 6x at four (verification's compute at a large batch)
    clock = Clock(eng.backend, lambda plain, k: 0.01 * k * (1.0 if plain or k == 1 else 6.0))
    free, observe_free = [], policy.observe_free
    policy.observe_free = lambda d, scored, accepted, where: (free.append((d, scored.copy(), accepted.copy(), where)),
                                                              observe_free(d, scored, accepted, where))
    from flashspec.adaptive_loop import use_free_scoring

    assert use_free_scoring(eng.backend, policy) == 1  # the n-gram, scored inside the slot steps it does not run
    sched = Scheduler(eng.backend, policy, slots=4, context=128, gamma=4, clock=clock)
    submit(eng, sched, ["abcabcab"], 48)
    run_until_idle(sched)
    alone = clock.log[:]
    submit(eng, sched, ["abcabcab", "the cat sat on the mat", "hello world", "zyx"], 32)
    run_until_idle(sched)
    four = [plain for plain, rows in clock.log[len(alone):] if rows == 4]
    spec_alone = sum(not plain for plain, _ in alone) / len(alone)
    assert spec_alone >= 0.7, f"alone, speculation cost nothing more and was run in {spec_alone:.0%} of the steps"
    assert len(four) >= 10 and sum(four) / len(four) >= 0.8, f"at four rows plain decoding ran {sum(four)} of {len(four)}"
    assert any(len(where) == 4 for _, _, _, where in free)  # plain steps at four rows scored the n-gram for free
    assert all(((sc == 1) & (acc <= 1)).all() for _, sc, acc, _ in free)  # a plain step emits 1 token: 1 scored
    assert sum(acc.sum() for _, _, acc, _ in free) > 0
    submit(eng, sched, ["abcabcab", "hello world"], 16)  # the running set shrinks to two slots: bucket 1
    run_until_idle(sched)
    cost = policy.cost
    assert cost[0, 0] == pytest.approx(0.01) and cost[2, 0] == pytest.approx(0.04)  # each step's own time, per bucket
    assert np.nanmax(cost[2, 1:]) == pytest.approx(0.24)
    measured = policy.cost_weight > 0  # [buckets, arms]: 1, 4, then 2 rows served, each step's own time in its bucket
    k = 2.0 ** np.arange(cost.shape[0])[:, None]  # [buckets, 1]: the rows a step of the bucket computes
    want = 0.01 * k * np.where(np.array([a.plain for a in policy.arms])[None] | (k == 1), 1.0, 6.0)
    assert measured[1].any() and measured[:3].sum() >= 6 and np.allclose(cost[measured], np.broadcast_to(want, cost.shape)[measured])


def test_a_request_entering_a_slot_starts_from_the_request_prior(tiny):
    eng = adaptive_engine(tiny)
    policy = eng.adaptive_policy(4, 0)
    sched = Scheduler(eng.backend, policy, slots=1, context=128, gamma=4)
    submit(eng, sched, ["abcabcab"], 24)
    run_until_idle(sched)
    assert policy.row_succ[:, 0].sum() + policy.row_fail[:, 0].sum() > 0  # the first request's own evidence
    submit(eng, sched, ["zyx"], 8)
    sched.iterate()  # admits the second request into slot 0 and launches its first step
    assert policy.row_succ[:, 0].sum() == 0 and policy.row_fail[:, 0].sum() == 0
    assert policy.counts()[0][:, 0] == pytest.approx(policy.succ * policy.weakened())  # the pooled prior alone
    run_until_idle(sched)


@pytest.mark.parametrize("graphs", [False, True])
def test_greedy_requests_served_adaptively_equal_plain_decoding_alone(tiny, graphs):
    eng = adaptive_engine(tiny, graphs)
    prompts = ["abcabcab", "hello world", "zyx", "the cat sat on the mat"]
    want = [eng.generate(p, speculation=False, temperature=0.0, max_new_tokens=16, chat=False)["tokens"]
            for p in prompts]
    svc = Service(eng, max_batch=2, context=64, gamma=4)
    assert isinstance(svc.scheduler.policy, AdaptivePolicy) and svc.scheduler.adaptive
    assert eng.backend.free_gamma == 4  # full-information scoring of the n-gram, eager or graphed
    with svc:
        streams = serve_together(svc, [(p, i, {"temperature": 0.0}, 16) for i, p in enumerate(prompts)], gap=0.02)
    for p, w, st in zip(prompts, want, streams):
        assert st.token_ids == w, f"{p!r}: served {st.token_ids} != plain greedy alone {w}"
        s = st.stats
        pulls = sum(s["arm_pulls"].values())
        assert 0 <= s["accepted"] <= s["drafted"] <= 4 * pulls and pulls <= s["steps"]
    assert sum(sum(st.stats["arm_pulls"].values()) for st in streams) > 0  # it did speculate somewhere


class Steps:
    """A simulated device clock for the engine's loop and the server alike: every step (``step``, ``decode_one``,
    ``step_slots``, ``decode_slots``) advances it by ``cost(G)`` (0: plain) and is logged as ``(G, sampling)``."""

    def __init__(self, backend, cost):
        self.now, self.log, self.cost = 0.0, [], cost
        step, decode_one = backend.step, backend.decode_one
        step_slots, decode_slots = backend.step_slots, backend.decode_slots
        backend.step = lambda arm, g, s, seed, offset: self.run(g, s, lambda: step(arm, g, s, seed, offset))
        backend.decode_one = lambda s, seed, offset: self.run(0, s, lambda: decode_one(s, seed, offset))
        backend.step_slots = lambda arm, g, s, rows: self.run(g, s, lambda: step_slots(arm, g, s, rows))
        backend.decode_slots = lambda s, rows: self.run(0, s, lambda: decode_slots(s, rows))

    def run(self, gamma, sampling, go):
        handle = go()
        self.now += self.cost(gamma)
        self.log.append((gamma, sampling))
        return handle

    def __call__(self):
        return self.now


def test_a_served_request_gets_the_engine_loops_choices(tiny, monkeypatch):
    """One greedy request, served alone (one slot) and generated by the engine's loop, each on its own engine with
    the same policy seed, under the same simulated step costs: the same arm on every step while the request has
    more than G + 1 tokens left (nearer its end the engine's static-batch value caps the length by the tokens left,
    the server's does not), and the same tokens. Both run the policy through ``adaptive_loop``'s calls."""
    import time

    from flashspec.adaptive_loop import use_free_scoring

    n, cost = 64, lambda g: 0.010 + 0.0015 * g
    prompt = "abcabcab abcabcab"
    engine_side = adaptive_engine(tiny)
    clock = Steps(engine_side.backend, cost)
    monkeypatch.setattr(time, "perf_counter", clock)  # the engine loop's StepTimer
    records = []
    want = engine_side.generate(prompt, gamma=4, temperature=0.0, max_new_tokens=n, chat=False,
                                on_step=records.append)["tokens"]
    served_side = adaptive_engine(tiny)
    served = Steps(served_side.backend, cost)
    policy = served_side.adaptive_policy(4, 0)  # as Service makes it
    use_free_scoring(served_side.backend, policy)
    sched = Scheduler(served_side.backend, policy, slots=1, context=128, gamma=4, clock=served)
    (ticket,) = submit(served_side, sched, [prompt], n)
    run_until_idle(sched)
    assert ticket.tokens == want
    engine_arms = [g for g, _ in clock.log[: len(records)]]
    left = n - np.cumsum([0] + [r.emitted for r in records])  # tokens left before each step
    far = int(np.argmax(left < 4 + 2)) if (left < 4 + 2).any() else len(records)
    assert far >= 10 and len(set(engine_arms[:far])) >= 2, engine_arms  # a mix of arms to agree on
    assert [g for g, _ in served.log[:far]] == engine_arms[:far]


def test_a_slow_choice_holds_its_arm_in_the_server_and_the_tokens_stay_plain_decodings(tiny):
    """Served steps of 1 s on a simulated device and a choice taking 0.6 s of host time: a choice made on value
    holds its arm for ceil(0.6 / 0.25) = 3 steps (``throughput.held``), so the policy is asked on fewer than 0.6
    of the steps, the held steps run the arm chosen, and greedy tokens equal plain decoding's; with no host time
    every step asks."""
    from flashspec.adaptive import make_arms
    from flashspec.adaptive_loop import use_free_scoring

    prompts = ["abcabcab", "the cat sat on the mat"]
    calls = {}
    for host_s in (0.6, 0.0):
        eng = adaptive_engine(tiny)
        want = [eng.generate(p, speculation=False, temperature=0.0, max_new_tokens=40, chat=False)["tokens"]
                for p in prompts]
        clock = Steps(eng.backend, lambda g: 1.0)
        policy = SlowChoice(make_arms(1, (2, 4)), 1, rng=0, clock=clock, host_s=host_s)
        use_free_scoring(eng.backend, policy)
        sched = Scheduler(eng.backend, policy, slots=2, context=128, gamma=4, clock=clock)
        tickets = submit(eng, sched, prompts, 40)
        run_until_idle(sched)
        assert [t.tokens for t in tickets] == want
        calls[host_s] = policy.calls / len(clock.log)
    assert calls[0.6] <= 0.6 and calls[0.0] == 1.0, calls


def test_a_served_arm_is_priced_by_its_own_work(tiny):
    """Served steps on a simulated device (plain 1 s, G = 2 3 s, G = 4 5 s, a plain step that scores the n-gram for
    free 0.5 s more) and choices of 4 s of host time, each falling in the step read after it: every arm the
    server measured is priced by its own device time, as in the engine's loop (``AdaptivePolicy.observe``'s
    ``chose_s`` and ``scored``); charged with the choices and the scoring, plain decoding would cost 1.5-5 s."""
    from flashspec.adaptive import make_arms
    from flashspec.adaptive_loop import use_free_scoring

    eng = adaptive_engine(tiny)
    backend = eng.backend
    clock = Steps(backend, lambda g: {0: 1.0 + 0.5 * (backend.free_gamma > 0), 2: 3.0, 4: 5.0}[g])
    policy = SlowChoice(make_arms(1, (2, 4)), 1, rng=0, clock=clock, host_s=4.0)
    policy.warm = True  # first timings trusted, as after ``Service.prepare``
    assert use_free_scoring(backend, policy) == 1
    sched = Scheduler(backend, policy, slots=2, context=128, gamma=4, clock=clock)
    submit(eng, sched, ["the cat sat on the mat", "zq xv wk"], 40)
    run_until_idle(sched)
    measured = policy.cost_weight > 0  # [buckets, arms]
    assert measured[:, 0].any() and policy.score_weight[:, 0].any()
    want = np.broadcast_to(np.array([1.0, 3.0, 5.0]), policy.cost.shape)
    assert np.allclose(policy.cost[measured], want[measured], rtol=1e-3), policy.cost[measured.any(axis=1)]


def test_prepare_makes_every_arm_ready_and_marks_the_policy_warm(tiny):
    """``Service.prepare`` makes ready each warm-up setting's arms (G and G // 2, each with plain decoding, with and
    without the free scoring: ``AdaptivePolicy.scores``) and the policy is ``warm``; a request with other settings has its arms made ready before its
    first step, once. Where nothing was made ready (0 kinds: the CPU) the policy stays cold."""
    for kinds in (1, 0):
        eng = adaptive_engine(tiny)
        events, prepare = [], eng.backend.prepare
        eng.backend.prepare = lambda g, s: events.append(("prepare", g, s.temperature, eng.backend.free_gamma)) \
            or prepare(g, s) + kinds
        clock = Steps(eng.backend, lambda g: 0.01)
        svc = Service(eng, max_batch=2, context=64, gamma=4)
        assert svc.prepare(temperatures=(0.0,)) == 4 * kinds
        assert [e[1:] for e in events] == [(2, 0.0, 4), (4, 0.0, 4), (2, 0.0, 0), (4, 0.0, 0)]
        assert svc.scheduler.policy.warm == bool(kinds)
        events.clear()
        warm = SamplingConfig(0.5, 0, 1.0)
        for _ in range(2):  # the second request of these settings prepares nothing more
            svc.scheduler.submit(Submission(tuple(eng.tokenizer("abcabc")["input_ids"]), 6, warm), lambda t, new: None)
            with eng.running():
                run_until_idle(svc.scheduler)
        first_step = next(i for i, (g, s) in enumerate(clock.log) if s == warm)
        assert [e[1:3] for e in events] == [(2, 0.5), (4, 0.5), (2, 0.5), (4, 0.5)] and first_step == 0
        assert svc.scheduler.policy.warm == bool(kinds)
