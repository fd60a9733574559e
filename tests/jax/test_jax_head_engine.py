"""The shipped draft head in the JAX engine on the real embedded model (SmolLM2-135M-Instruct, fp32 on
the CPU): greedy speculation equals greedy decoding, and the whole-generation loop drafts with it too.
The first two tokens' joint law with a head in the JAX engine is checked on a tiny random model
(tests/jax/test_jax_engine.py); the head's q equals the torch head's (tests/jax/test_jax_head.py)."""

import pytest

jax = pytest.importorskip("jax")

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.drafts import SHIPPED_HEAD  # noqa: E402
from head_checks import check_greedy_equals_plain  # noqa: E402  (tests/head_checks.py)
from prompts import HEAD_PROMPTS as PROMPTS  # noqa: E402  (tests/prompts.py)

pytestmark = pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")


@pytest.fixture(scope="module")
def engine():
    from flashspec_jax.engine import Engine

    return Engine(None, ("head", "ngram"), policy="fixed", device="cpu")  # arm 0: the head


def test_greedy_head_speculation_equals_greedy_decoding(engine):
    spec = check_greedy_equals_plain(engine, PROMPTS)
    assert spec["acceptance"] > 0.2  # the head really drafted (0.31 here, as the torch engine's head)


def test_the_device_loop_drafts_with_the_head(engine):
    """The whole generation in one while_loop (``loop="device"``, the head an arm of its lax.switch)."""
    from flashspec_jax.whole import Fixed, Whole

    ids = [engine.encode(p, chat=False) for p in PROMPTS]
    greedy = SamplingConfig(0.0)
    outs, records = Whole(engine.backend).run(ids, max_new_tokens=12, gamma=4, sampling=greedy, seed=0,
                                              policy=Fixed(0))
    plain = engine.generate(PROMPTS, speculation=False, temperature=0.0, max_new_tokens=12, chat=False)["tokens"]
    assert outs == plain
    assert sum(r.accepted for r in records) > 0
