"""Chunked prefill on a tiny random model (CPU): a long prompt enters its slot in chunks of at most
``prefill_chunk`` tokens between steps; its K/V (and a draft head's features) equal a whole-prompt
prefill's, every request's tokens equal the same request served alone through ``Engine.generate``,
and the running streams keep emitting between the chunks (the order of events, not time)."""

import numpy as np
import pytest
import torch

from fault_helpers import tiny_target
from torch_helpers import serve_together

from flashspec.config import SamplingConfig
from flashspec.scheduler import Scheduler, Submission
from flashspec.serving import Service

LONG = "the cat sat on the mat and then the dog sat on the cat"  # 54 tokens (one per character): 53 of K/V
PROMPTS = ["abcabcab", LONG, "hello world", LONG[::-1], "q"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(seed=5)


def engine(tiny, mode, graphs=False):
    from flashspec_torch.engine import Engine

    eng = Engine(tiny, ("ngram" if mode in (None, "head") else mode,), policy="fixed", device="cpu")
    if mode == "head":  # a random draft head over the target's features (a FeatureDraft)
        from flashspec_torch.heads import DraftHead, HeadDraft
        from flashspec_torch.slots import TorchSlotBackend

        torch.manual_seed(1)
        head = DraftHead(tiny.model.config, (0, 2), None)
        for p in head.parameters():
            p.data.normal_(0, 0.3)
        eng.drafts = [HeadDraft("head", head, tiny.model)]
        eng.backend = TorchSlotBackend(tiny.model, eng.drafts, sorted(tiny.model.config.eos_token_ids), None)
    if graphs:  # the graphed steps' fixed-shape code, run eagerly (what a GPU captures)
        from flashspec_torch.backend import StaticSteps

        eng.backend.graphed, eng.backend.graphs = True, StaticSteps()
    return eng


@pytest.mark.parametrize("mode,graphs", [(None, False), ("ngram", True), ("layerskip:1", False), ("head", True)])
def test_chunked_requests_equal_themselves_alone(tiny, mode, graphs):
    eng = engine(tiny, mode, graphs)
    samplings = [dict(temperature=0.0), dict(temperature=1.0, top_k=20)]
    cases = [(p, 20 + i, samplings[i % 2], 6 + i) for i, p in enumerate(PROMPTS)]
    want = [eng.generate(p, seed=seed, speculation=mode is not None, gamma=3, max_new_tokens=n, chat=False, **s)["tokens"]
            for p, seed, s, n in cases]
    chunks = []
    prefill = eng.backend.prefill_chunk
    eng.backend.prefill_chunk = lambda *a: (chunks.append(a[2]), prefill(*a))
    svc = Service(eng, max_batch=3, context=128, gamma=3, speculation=mode is not None, prefill_chunk=8)
    with svc:  # 5 requests, 3 slots: the long prompts enter in chunks while the others stream
        streams = serve_together(svc, cases)
    for (p, seed, s, n), w, st in zip(cases, want, streams):
        assert st.token_ids == w, f"{p!r} seed {seed} {s}: served {st.token_ids} != alone {w}"
    kv = [len(p) - 1 for p in PROMPTS]  # each prompt's K/V: chunks of 8 while more than 8 are left, then admit
    assert sorted(chunks) == sorted(s for n in kv for s in range(0, n, 8) if n - s > 8)
    assert chunks.count(40) == 2  # the two long prompts: 6 chunks each


def test_running_streams_emit_between_chunks(tiny):
    eng = engine(tiny, "ngram")
    events = []
    prefill = eng.backend.prefill_chunk
    eng.backend.prefill_chunk = lambda slot, tokens, start: (events.append(("chunk", start, len(tokens))),
                                                             prefill(slot, tokens, start))
    sched = Scheduler(eng.backend, eng.policy_for(3, 0), slots=2, context=128, gamma=3, prefill_chunk=8)
    greedy = SamplingConfig(0.0, 0, 1.0)
    with torch.inference_mode():
        short = sched.submit(Submission((5, 6, 7), 60, greedy), lambda t, new: events.append(("short", len(new))))
        for _ in range(2):
            sched.iterate()
        long = sched.submit(Submission(tuple(tiny.tokenizer(LONG)["input_ids"]), 4, greedy),
                            lambda t, new: events.append(("long", len(new))))
        while long.finish_reason is None:
            events.append(("iteration",))
            sched.iterate()
    assert short.finish_reason is None  # the short request still runs
    chunk_at = [i for i, e in enumerate(events) if e[0] == "chunk"]
    assert [events[i][1:] for i in chunk_at] == [(s, 8) for s in range(0, 48, 8)]
    first_long = next(i for i, e in enumerate(events) if e[0] == "long")
    for a, b in zip(chunk_at, [*chunk_at[1:], first_long]):  # the short stream emits between every two
        assert any(e[0] == "short" and e[1] > 0 for e in events[a:b]), events[a:b]
    per_round, n = [], 0  # at most one chunk of prefill work between two steps
    for e in events:
        if e[0] == "iteration":
            per_round.append(n)
            n = 0
        n += e[2] if e[0] == "chunk" else 0
    assert max(per_round + [n]) <= 8


@pytest.mark.parametrize("mode", ["ngram", "head"])
def test_a_chunked_prompt_has_the_whole_prompts_cache(tiny, mode):
    eng = engine(tiny, mode)
    b = eng.backend
    prompt, n = tiny.tokenizer(LONG)["input_ids"], len(tiny.tokenizer(LONG)["input_ids"]) - 1
    greedy, rows = SamplingConfig(0.0, 0, 1.0), np.array([False, True])
    with torch.inference_mode():
        b.open_slots(2, 128)
        b.admit([0], [prompt], [4], [0])
        want = [t[:, 0, :, :n].clone() for t in (b.cache.k, b.cache.v)] + [
            b.seqs.features[0, :n].clone() if mode == "head" else None]
        b.open_slots(2, 128)
        b.admit([1], [[5, 6, 7]], [40], [0])  # a running request in slot 1: every step computes slot 0 too
        for start in (0, 16, 32):
            b.prefill_chunk(0, prompt[start : start + 16], start)
            for _ in range(2):  # steps between the chunks, slot 0 held
                b.step_slots(0, 3, greedy, rows).fetch()
        b.admit([0], [prompt], [4], [0], cached=[48])
    got = [t[:, 0, :, :n] for t in (b.cache.k, b.cache.v)] + [b.seqs.features[0, :n] if mode == "head" else None]
    for g, w in zip(got, want):  # [layers, H_kv, n, D] twice, then the features [n, F]
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert b.seqs.length.tolist()[0] == n + 1


def test_bad_chunk_settings_are_refused(tiny):
    eng = engine(tiny, "ngram")
    with pytest.raises(ValueError, match="prefill_chunk=0 must be an integer >= 1"):
        Service(eng, max_batch=1, context=64, prefill_chunk=0)
    with torch.inference_mode():
        eng.backend.open_slots(1, 64)
        with pytest.raises(ValueError, match="does not fit a slot's prompt"):
            eng.backend.prefill_chunk(0, [1] * 8, 60)
        with pytest.raises(ValueError, match="cached=9"):
            eng.backend.admit([0], [[1] * 9], [4], [0], cached=[9])


def test_an_admission_feeds_the_draft_head_its_own_rows_only(tiny):
    """A request entering while others run: its prompt reaches the head row by row in ``admit``; the
    next step feeds every row its usual G + 1 positions, never the running rows' histories again."""
    eng = engine(tiny, "head", graphs=True)
    b, head = eng.backend, eng.drafts[0].head
    fed, run = [], head.run
    head.run = lambda target, tokens, *a, **k: (fed.append(tuple(tokens.shape)), run(target, tokens, *a, **k))[1]
    greedy, rows = SamplingConfig(0.0, 0, 1.0), np.ones(4, bool)
    with torch.inference_mode():
        b.open_slots(4, 128)
        b.admit([0, 1], [[5, 6, 7, 8, 9], [3, 4]], [40, 40], [0, 1])
        for _ in range(3):
            b.step_slots(0, 3, greedy, rows).fetch()
        fed.clear()
        b.admit([2], [list(range(10, 30))], [40], [2])
        assert fed == [(1, 20)]  # the admitted row's prompt, nothing of rows 0 and 1
        fed.clear()
        b.step_slots(0, 3, greedy, rows).fetch()
    assert fed == [(4, 4), (4, 1), (4, 1)]  # the graphed propose: G + 1 positions, then G - 1 single tokens
