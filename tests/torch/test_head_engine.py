"""The shipped draft head on the real embedded model (SmolLM2-135M-Instruct, fp32 on the CPU):
greedy speculation equals greedy decoding. The first two emitted tokens' joint law with a head and the
dynamic draft length: tests/torch/test_heads.py (a tiny head on a tiny target, 3,000 rows, the same backend
and head draft code)."""

import pytest

from flashspec.drafts import SHIPPED_HEAD
from head_checks import check_greedy_equals_plain  # tests/head_checks.py
from prompts import HEAD_PROMPTS as PROMPTS  # tests/prompts.py

pytestmark = pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")


@pytest.fixture(scope="module")
def engine():
    from flashspec_torch.engine import Engine

    return Engine(None, ("head",), policy="fixed", device="cpu")


def test_greedy_head_speculation_equals_greedy_decoding(engine):
    spec = check_greedy_equals_plain(engine, PROMPTS)
    assert spec["acceptance"] > 0.2  # the head really drafted (about 0.5 per position held out)
