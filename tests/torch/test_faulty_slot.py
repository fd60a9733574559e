"""A request whose logits turn NaN ends with an error, and its slot's K/V (NaN from the poisoned token on) are
scrubbed before the slot takes the next request: that request's tokens equal its own alone (CPU, tiny model)."""

import pytest
from fault_helpers import CharTokenizer, poisoned, tiny_target

from flashspec.serving import Service


@pytest.mark.parametrize("mode", [None, "ngram"])
def test_a_nan_rows_slot_is_scrubbed_before_reuse(mode):
    from flashspec_torch.engine import Engine

    bad_id = CharTokenizer()("~")["input_ids"][0]
    eng = Engine(poisoned(tiny_target(seed=5), bad_id), (mode or "ngram",), policy="fixed", device="cpu")
    kw = dict(speculation=mode is not None, gamma=3)
    want = eng.generate("abc", seed=3, max_new_tokens=8, temperature=0.0, chat=False, **kw)["tokens"]
    with Service(eng, max_batch=1, context=64, prefill_chunk=64, **kw) as svc:  # one slot: both requests use it
        failed = svc.complete("hello ~ world and more", max_tokens=8, temperature=0.0, seed=1)
        after = svc.complete("abc", max_tokens=8, temperature=0.0, seed=3)
    assert failed["finish_reason"] == "error" and "NaN" in failed.get("error", "NaN"), failed
    assert after["finish_reason"] in ("length", "stop") and after["token_ids"] == want, (after, want)


def test_only_the_faulty_slots_rows_are_scrubbed():
    from flashspec_torch.engine import Engine

    eng = Engine(tiny_target(seed=5), ("layerskip:1",), policy="fixed", device="cpu")  # a draft with its own cache
    b = eng.backend
    b.open_slots(4, 32)
    caches = [b.cache] + [d.cache for d in b.drafts if hasattr(d, "cache") and d.cache is not None]
    assert len(caches) == 2
    for c in caches:
        c.k.fill_(float("nan"))
        c.v.fill_(float("nan"))
    b.faulty[2] = True
    b.scrub_faulty([1, 2])  # slot 1: no fault, untouched; slot 2: zeroed
    for c in caches:
        for t in (c.k, c.v):
            assert (t[:, 2] == 0).all() and t[:, [0, 1, 3]].isnan().all()
    assert not b.faulty.any()
