"""Full-information scoring in the torch backend (``flashspec_torch.free``): a recomputable draft that was not
run is scored exactly as if it had run (an identical copy of the running n-gram draft is credited with the
running draft's accepted counts on every row and step), eagerly and with the graphed steps' code; on plain
steps it is scored on the one emitted token; the draft a step ran is not scored again (0 tokens scored)."""

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, ModelDraft

from fault_helpers import tiny_target
from test_backend_graphs import PROMPTS

GREEDY = SamplingConfig(0.0)


@pytest.fixture(scope="module")
def target():
    return tiny_target(0).model


@pytest.mark.parametrize("graphs", [False, True])
def test_a_copy_of_the_running_draft_is_scored_as_it_ran(target, graphs):
    drafts = [LookupDraft("a"), ModelDraft("m", target, frozenset({1})), LookupDraft("b"), LookupDraft("c", max_n=1)]
    b = TorchBackend(target, drafts, graphs=graphs)
    assert b.score_free(3) == 3  # the model draft is not recomputable
    with torch.inference_mode():
        b.prefill(PROMPTS, 24)
        for step in range(8):
            plain = step % 3 == 2
            view = (b.decode_one(GREEDY, 0, step) if plain else b.step(0, 3, GREEDY, 0, step)).fetch()
            act = view.active
            n = np.asarray(view.num_accepted)[act]
            others = [0, 2, 3] if plain else [2, 3]
            scored = view.free_scored[others][:, act]
            assert (scored == (1 if plain else np.minimum(n + 1, 3))).all() and not view.free_scored[1].any()
            assert (view.free_accepted[:, act] <= view.free_scored[:, act]).all()
            if not plain:
                assert (view.free_accepted[2, act] == n).all() and not view.free_scored[0].any()
        b.score_free(0)
        assert b.step(0, 3, GREEDY, 0, 8).fetch().free_scored is None


def test_bad_gamma_is_refused(target):
    with pytest.raises(ValueError, match="gamma"):
        TorchBackend(target, [LookupDraft()]).score_free(-1)


def test_a_dynamic_draft_length_records_what_was_proposed(target):
    """``stop_below``: rows stop drafting early; ``StepView.drafted`` says how many tokens each row proposed
    (plain steps: 0) and the loop's records count those, not G per row."""
    from flashspec.loop import SpecConfig, speculate

    class First:
        def choose(self):
            return 0

        def observe(self, *args):
            pass

    b = TorchBackend(target, [ModelDraft("skip", target, frozenset({1}), stop_below=0.5)])
    with torch.inference_mode():
        _, records = speculate(b, First(), PROMPTS, sampling=GREEDY, spec=SpecConfig(gamma=4, max_new_tokens=12))
        assert b.decode_one(GREEDY, 0, 99).fetch().drafted.tolist() == [0] * len(PROMPTS)
    assert all(r.accepted <= r.drafted <= 4 * r.rows and r.drafted >= r.rows for r in records)
    assert any(r.drafted < 4 * r.rows for r in records)
