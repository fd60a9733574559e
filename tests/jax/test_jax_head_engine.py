"""The shipped draft head in the JAX engine on the real embedded model (SmolLM2-135M-Instruct, fp32 on
the CPU): greedy speculation equals greedy decoding, the whole-generation loop drafts with it too, and
at T = 0.7 with top-p the first two emitted tokens follow the target's own joint law (the torch
engine's test, tests/torch/test_head_engine.py, with fewer rows)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec.bandits import BanditConfig, FixedArm  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.drafts import SHIPPED_HEAD  # noqa: E402
from flashspec.loop import SpecConfig, speculate  # noqa: E402
from head_checks import check_first_two_tokens, check_greedy_equals_plain  # noqa: E402  (tests/head_checks.py)
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


def test_sampled_first_two_tokens_follow_the_target_with_the_head(engine):
    """T = 0.7, top-p 0.9, G = 2: the first token's law and the first two tokens' joint law,
    chi-square against the target's own p(t1) p(t2 | t1) computed by plain forward passes. 100 rows in
    one batch (the torch test: 200): the JAX reference verify's top-p over 49,152 columns costs about
    10 s per step at batch 40 on this loaded CPU, and the head's q is checked exactly against the
    torch head's in tests/jax/test_jax_head.py."""
    from flashspec_jax.kernels.verify import log_probs

    prompt, n = "My favourite colour is", 100
    sampling = SamplingConfig(temperature=0.7, top_p=0.9)
    ids = engine.encode(prompt, chat=False)
    m = engine.target.model
    z1, _ = m(jnp.asarray([ids]), jnp.arange(len(ids))[None], m.new_cache(1, len(ids)))
    p1 = np.asarray(jnp.exp(log_probs(z1[0, -1], 0.7, 0, 0.9)), np.float64)  # [V]
    first = np.nonzero(p1 > 0)[0]  # the nucleus of the first token
    k = len(ids) + 1
    seqs = jnp.asarray([ids + [int(t)] for t in first])
    z2, _ = m(seqs, jnp.broadcast_to(jnp.arange(k)[None], seqs.shape), m.new_cache(len(first), k))
    p2 = np.asarray(jnp.exp(log_probs(z2[:, -1], 0.7, 0, 0.9)), np.float64)  # [F, V]
    tokens, records = speculate(engine.backend, FixedArm(2, BanditConfig(fixed_arm=0)), [ids] * n, sampling=sampling,
                                spec=SpecConfig(gamma=2, max_new_tokens=2), seed=np.arange(n, dtype=np.uint64))  # the head
    check_first_two_tokens(tokens, first, p1, p2)
    assert sum(r.accepted for r in records) > 0.1 * sum(r.drafted for r in records)  # the head's drafts mattered
