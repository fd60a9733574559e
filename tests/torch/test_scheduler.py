"""Continuous batching on a tiny random model (CPU): requests that share the batch, join it while
others run, wait in the queue for a slot, or sit steps out for another sampling group give the
tokens each gives alone through ``Engine.generate`` (fixed draft, same seed); cancellation frees
the slot; a full queue and an oversize request are refused."""

import threading

import pytest

from fault_helpers import tiny_target
from torch_helpers import serve_together

from flashspec.scheduler import QueueFull
from flashspec.serving import BadRequest, Service, check_params

PROMPTS = ["abcabcab", "hello world", "zyx", "hello world", "the cat sat on the mat", "q"]
SAMPLINGS = [dict(temperature=1.0, top_k=20), dict(temperature=0.0), dict(temperature=0.7, top_p=0.9)]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=5)


def engine(tiny, mode, graphs=False):
    from flashspec_torch.engine import Engine

    eng = Engine(tiny, (mode or "ngram",), policy="fixed", device="cpu")
    if graphs:  # the graphed steps' fixed-shape code, run eagerly (what a GPU captures)
        from flashspec_torch.backend import StaticSteps

        eng.backend.graphed, eng.backend.graphs = True, StaticSteps()
    return eng


def alone(eng, mode, prompt, seed, sampling, n):
    return eng.generate(prompt, seed=seed, speculation=mode is not None, gamma=3, max_new_tokens=n, chat=False,
                        **sampling)["tokens"]


@pytest.mark.parametrize("mode,graphs", [(None, False), ("ngram", False), ("layerskip:1", False), ("ngram", True),
                                         ("layerskip:1", True)])
def test_each_request_equals_itself_alone(tiny, mode, graphs):
    eng = engine(tiny, mode, graphs)
    cases = [(p, 10 + i, SAMPLINGS[i % 3], 6 + 2 * (i % 3)) for i, p in enumerate(PROMPTS)]
    want = [alone(eng, mode, p, seed, s, n) for p, seed, s, n in cases]
    svc = Service(eng, max_batch=3, context=64, gamma=3, speculation=mode is not None, prefill_chunk=16)
    svc.prepare([0.0])  # the prefill run at every length class in slot 0 first: the requests' tokens stay
    with svc:  # 6 requests, 3 slots: some wait, some join while others run, groups take turns
        streams = serve_together(svc, cases, gap=0.05)
    for (p, seed, s, n), w, st in zip(cases, want, streams):
        assert st.token_ids == w, f"{p!r} seed {seed} {s}: served {st.token_ids} != alone {w}"
        assert st.finish_reason in ("length", "stop") and st.stats["steps"] >= 1
    assert want[1] != want[3]  # the same prompt with another seed: not one shared stream


def test_cancel_frees_the_slot(tiny):
    """A request cancelled after its first tokens ends "cancelled" short of its 150 and the slot serves the next
    request. The scheduler thread's third step waits until the test has cancelled, so the request cannot reach its
    150 tokens first (about 0.6 s of steps) while a loaded machine keeps the test's thread waiting."""
    eng = engine(tiny, "ngram")
    cancelled, step, launched = threading.Event(), eng.backend.step_slots, []

    def gated(*args):
        launched.append(args)
        if len(launched) == 3:  # the first tokens were read (after the second launch): wait for the cancel
            cancelled.wait(60)
        return step(*args)

    eng.backend.step_slots = gated
    with Service(eng, max_batch=1, context=200, gamma=3) as svc:
        long = svc.stream("abc", max_tokens=150, temperature=1.0, seed=1)
        first = next(iter(long))
        assert first.token_ids
        long.cancel()
        cancelled.set()
        rest = list(long)
        assert long.finish_reason == "cancelled" and len(long.token_ids) < 150, rest
        out = svc.complete("xyz", max_tokens=4, temperature=0.0)
        assert out["finish_reason"] in ("length", "stop") and out["stats"]["new_tokens"] >= 1


def test_a_full_queue_and_an_oversize_request_are_refused(tiny):
    svc = Service(engine(tiny, "ngram"), max_batch=1, max_queue=2, context=32)  # not started: nothing leaves the queue
    ids = svc.encode(prompt="abc")
    params = check_params(4, 0.0, 1.0, 0, 0, None)
    svc.submit(ids, params), svc.submit(ids, params)
    with pytest.raises(QueueFull, match="max_queue=2"):
        svc.submit(ids, params)
    with pytest.raises(BadRequest, match="context of 32") as e:
        svc.submit(svc.encode(prompt="x" * 30), params)
    assert e.value.param == "max_tokens"
    svc.close(drain=False, timeout=1)


def test_stop_strings_end_the_request_and_are_cut(tiny):
    eng = engine(tiny, "ngram")
    with Service(eng, max_batch=2, context=64, gamma=3) as svc:
        full = svc.complete("hello", max_tokens=20, temperature=0.0)["text"]
        stop = full[5:7]
        cut = svc.complete("hello", max_tokens=20, temperature=0.0, stop=[stop, "never"])
    assert cut["text"] == full[: full.index(stop)] and cut["finish_reason"] == "stop"


def test_a_failed_step_fails_its_requests_and_the_next_ones_are_served(tiny):
    eng = engine(tiny, "ngram")
    step, calls = eng.backend.step_slots, []

    def broken_once(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return step(*args)

    eng.backend.step_slots = broken_once
    with Service(eng, max_batch=2, context=64, gamma=3) as svc:
        failed = svc.complete("abc", max_tokens=20, temperature=0.0)
        ok = svc.complete("abc", max_tokens=4, temperature=0.0)
    assert failed["finish_reason"] == "error" and ok["finish_reason"] in ("length", "stop")
