"""Every backend implements the whole ``flashspec.backend.Backend`` protocol, with its signatures."""

import importlib
import inspect

import numpy as np
import pytest

from flashspec.backend import Backend, SlotBackend
from flashspec.config import SamplingConfig
from flashspec.fake import LookupDraft, MarkovBackend
from flashspec.loop import SpecConfig, decode, speculate

METHODS = sorted(n for n, v in vars(Backend).items() if inspect.isfunction(v) and not n.startswith("_"))


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def test_the_protocol_lists_what_the_loop_and_engines_call():
    assert METHODS == ["decode_one", "outputs", "prefill", "prepare", "step"]


@pytest.mark.parametrize("where", ["flashspec.fake:MarkovBackend", "flashspec_torch.backend:TorchBackend",
                                   "flashspec_jax.backend:JaxBackend"])
def test_each_backend_class_has_every_protocol_method(where):
    module, _, name = where.partition(":")
    cls = getattr(pytest.importorskip(module) if module != "flashspec.fake" else importlib.import_module(module), name)
    for method in METHODS:
        want = list(inspect.signature(getattr(Backend, method)).parameters)
        got = getattr(cls, method, None)
        assert callable(got), f"{name} lacks {method}"
        assert list(inspect.signature(got).parameters)[: len(want)] == want, f"{name}.{method}'s parameters"


SLOT_METHODS = sorted(n for n, v in vars(SlotBackend).items() if inspect.isfunction(v) and not n.startswith("_"))


def test_the_slot_protocol_lists_what_the_scheduler_calls():
    assert SLOT_METHODS == ["admit", "decode_slots", "open_slots", "prefill_chunk", "release", "step_slots"]


@pytest.mark.parametrize("module,name", [("flashspec_torch.slots", "TorchSlotBackend"),
                                         ("flashspec_jax.slots", "JaxSlotBackend")])
def test_both_backends_serve_slots(module, name):
    """Each slot backend has every method of the protocols, with their parameters first."""
    cls = getattr(pytest.importorskip(module), name)
    for method in METHODS + SLOT_METHODS:
        want = list(inspect.signature(getattr(SlotBackend, method, None) or getattr(Backend, method)).parameters)
        assert list(inspect.signature(getattr(cls, method)).parameters)[: len(want)] == want, method


def test_the_scheduler_refuses_a_backend_without_slots():
    from flashspec.scheduler import Scheduler

    backend = MarkovBackend(np.zeros((4, 4), np.float32), [LookupDraft("x", np.arange(4))])
    with pytest.raises(TypeError, match="SlotBackend"):
        Scheduler(backend, Fixed(), slots=2, context=16)


def test_a_class_missing_a_method_fails_the_check():
    class NoDecode(MarkovBackend):
        decode_one = None

    table = np.zeros((4, 4), np.float32)
    assert isinstance(MarkovBackend(table, [LookupDraft("x", np.arange(4))]), Backend)
    assert not isinstance(NoDecode(table, [LookupDraft("x", np.arange(4))]), Backend)


def test_the_fake_backends_plain_decoding_is_greedy_speculations_tokens():
    rng = np.random.default_rng(0)
    target = rng.normal(size=(6, 6)).astype(np.float32)
    backend = MarkovBackend(target, [LookupDraft("guess", rng.integers(0, 6, 6))], eos=5)
    greedy, prompts = SamplingConfig(0.0), [[0], [1], [2], [3]]
    plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=9)
    spec, _ = speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=3, max_new_tokens=9))
    assert plain == spec
    for p, out in zip(prompts, plain):
        chain = [p[-1], *out]
        assert all(target[a].argmax() == b for a, b in zip(chain, chain[1:]))
