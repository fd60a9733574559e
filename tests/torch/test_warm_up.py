"""Capturing every step kind up front (``TorchBackend.prepare``, ``Engine.warm_up``): the same
tokens as lazy capture and as eager steps, no capture after the first call, bounded graph count,
and an interrupt in the middle of a capture leaves the engine usable."""

import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, decode_steps, speculate, speculate_steps
from flashspec_torch.backend import StepGraphs
from flashspec_torch.engine import Engine

from fault_helpers import tiny_target
from test_backend_graphs import PROMPTS, Cycle, backends

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GREEDY = SamplingConfig(0.0)
SPEC = SpecConfig(gamma=3, max_new_tokens=20)


def run(b, pattern, sampling=GREEDY):
    """Speculation then plain decoding, each captured lazily (a kind when it first runs)."""
    seed = torch.tensor([3, 1, 4, 1], device=b.device)
    with torch.inference_mode():
        spec_out, _ = speculate(b, Cycle(pattern), PROMPTS, sampling=sampling, spec=SPEC, seed=seed)
        plain_out, _ = decode(b, PROMPTS, sampling=sampling, max_new_tokens=20, seed=seed)
    return spec_out, plain_out


def run_prepared(b, pattern, sampling=GREEDY):
    """``run`` as the engine runs it: prefill, then ``prepare`` every kind of the settings, then steps."""
    seed = torch.tensor([3, 1, 4, 1], device=b.device)
    steps = dict(sampling=sampling, seed=seed, first_offset=0, on_step=None, records=[])
    with torch.inference_mode():
        b.prefill(PROMPTS, SPEC.max_new_tokens)
        b.prepare(SPEC.gamma, sampling)
        speculate_steps(b, Cycle(pattern), spec=SPEC, **steps)
        spec_out = b.outputs()
        b.prefill(PROMPTS, 20)
        b.prepare(None, sampling)
        decode_steps(b, max_new_tokens=20, **steps)
    return spec_out, b.outputs()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.8)])
def test_warmed_up_graphs_give_the_eager_tokens(device, sampling):
    eager = run(backends(device, False), [0, 1, 2, 2, 0], sampling)
    assert run_prepared(backends(device, True), [0, 1, 2, 2, 0], sampling) == eager
    if sampling.greedy:
        assert eager[0] == eager[1]


@cuda_only
def test_the_first_prefill_captures_every_draft_and_later_steps_capture_nothing():
    b = backends("cuda", True)
    first = run_prepared(b, [0])  # only draft 0 is chosen, yet all three drafts' graphs exist
    assert set(b.graphs.graphs) == {("spec", a, SPEC.gamma, GREEDY) for a in range(3)} | {("plain", GREEDY)}
    torch.cuda.synchronize()
    keys, allocated = list(b.graphs.graphs), torch.cuda.memory_allocated()
    again = run_prepared(b, [1, 2, 2, 1])
    torch.cuda.synchronize()
    assert list(b.graphs.graphs) == keys and torch.cuda.memory_allocated() == allocated
    assert first[1] == again[1] and first[0] == first[1] == again[0]  # greedy: every draft gives plain's tokens


@cuda_only
def test_prefill_captures_nothing_prepare_does():
    b = backends("cuda", True)
    with torch.inference_mode():
        b.prefill(PROMPTS, 8)
        assert b.graphs.graphs == {}
        assert b.prepare(SPEC.gamma, GREEDY) == 4  # three drafts and plain decoding
        assert b.prepare(SPEC.gamma, GREEDY) == 0
        b.prefill(PROMPTS, 8)  # the buffers fit: the graphs stay
    assert len(b.graphs.graphs) == 4


@cuda_only
def test_an_interrupt_during_a_capture_leaves_the_backend_usable():
    want = run(backends("cuda", False), [0, 1, 2])
    b = backends("cuda", True)
    draft = b.drafts[1]
    propose = draft.propose

    def interrupted(*args, **kw):
        if torch.cuda.is_current_stream_capturing():
            raise KeyboardInterrupt  # what Ctrl-C raises, at the worst moment
        return propose(*args, **kw)

    draft.propose = interrupted
    with pytest.raises(KeyboardInterrupt):
        run_prepared(b, [0, 1, 2])
    assert b.graphs.graphs == {}  # the half-made graph and its pool are gone
    draft.propose = propose
    assert run(b, [0, 1, 2]) == want


@cuda_only
def test_graph_count_is_bounded_oldest_first():
    b = backends("cuda", True)
    b.graphs = StepGraphs(max_graphs=2)
    with torch.inference_mode():
        b.prefill(PROMPTS, 8)
        for t in (0.0, 0.5, 0.9):
            b.prepare(None, SamplingConfig(t))
    assert list(b.graphs.graphs) == [("plain", SamplingConfig(0.5)), ("plain", SamplingConfig(0.9))]
    assert run(b, [0]) == run(backends("cuda", False), [0])  # a dropped kind is captured again


def test_step_graphs_reject_a_zero_bound():
    if not torch.cuda.is_available():
        pytest.skip("StepGraphs holds a CUDA stream")
    with pytest.raises(ValueError, match="max_graphs"):
        StepGraphs(max_graphs=0)


def test_engine_warm_up_checks_its_arguments_and_is_a_no_op_off_cuda():
    eng = Engine(tiny_target(), ("ngram",), policy="fixed", device="cpu")
    for bad, match in ((dict(batch=0), "batch"), (dict(gamma=0), "gamma"), (dict(context=10_000), "context"),
                       (dict(temperatures=(-1.0,)), "temperature")):
        with pytest.raises(ValueError, match=match):
            eng.warm_up(**bad)
    assert eng.warm_up(batch=2, gamma=3) == 0
    kw = dict(temperature=0.0, max_new_tokens=12, chat=False)
    assert eng.generate("abcab", **kw)["tokens"] == Engine(tiny_target(), ("ngram",), policy="fixed",
                                                            device="cpu").generate("abcab", **kw)["tokens"]


@cuda_only
@pytest.mark.parametrize("delay", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
def test_a_real_sigint_during_the_first_call_leaves_the_engine_usable(delay):
    """SIGINT (what Ctrl-C sends) at some moment of a first call: warm-up, captures or steps."""
    import os
    import signal
    import threading

    from flashspec_torch.weights import LoadedModel

    def engine():
        t = tiny_target()
        return Engine(LoadedModel(t.model.to("cuda"), t.tokenizer, t.name), ("ngram", "self"), policy="fixed",
                      device="cuda")

    kw = dict(temperature=0.0, max_new_tokens=40, chat=False)
    want = engine().generate("abcab", **kw)["tokens"]
    eng = engine()
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()  # inside: at delay 0 the signal can land while start() waits for the thread
        first = eng.generate("abcab", **kw)
        timer.join()  # a signal after the call ends lands here
    except KeyboardInterrupt:  # landed outside generate's own handler (before its try, or after the call)
        first = None
    timer.join()
    if first is not None:
        assert first["tokens"] == want[: len(first["tokens"])]
        assert first["interrupted"] or first["tokens"] == want
    assert eng.generate("abcab", **kw)["tokens"] == want
