"""The slot scheduler with the adaptive arms (``--policy adaptive``, issue #35) on a tiny random model
(CPU): under a simulated clock whose speculative steps cost what a plain step does at one row and 6x
at four, it speculates alone and decodes plainly at four rows; a request entering a slot starts from
the request prior, not the posterior of the request that held the slot; greedy requests served
together equal plain greedy decoding of each alone; the per-request figures count what each row
drafted."""

import numpy as np
import pytest

from fault_helpers import tiny_target
from torch_helpers import serve_together

from flashspec.adaptive import AdaptivePolicy
from flashspec.config import SamplingConfig
from flashspec.scheduler import Scheduler, Submission
from flashspec.serving import Service

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
    cost = policy.cost
    assert cost[0, 0] == pytest.approx(0.01) and cost[2, 0] == pytest.approx(0.04)  # each step's own time, per bucket
    assert np.nanmax(cost[2, 1:]) == pytest.approx(0.24)


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
