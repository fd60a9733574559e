"""The JAX engine on the embedded model (SmolLM2-135M-Instruct, fp32 on the CPU), against the
torch backend: logits, greedy tokens, sampled tokens under the shared generator; on a tiny random model,
the first-token laws and the whole-generation loop against the host loop."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from flashspec.bandits import UCB1, BanditConfig, FixedArm  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, speculate  # noqa: E402
from flashspec.testing import chi_square_test  # noqa: E402

from prompts import PROMPTS  # noqa: E402  (tests/prompts.py: shared by both backends)


@pytest.fixture(scope="module")
def torch_engine():
    from flashspec_torch.engine import Engine

    return Engine(None, ("ngram", "layerskip:24-29"), policy="fixed", device="cpu")


@pytest.fixture(scope="module")
def jax_engine():
    from flashspec_jax.engine import Engine

    return Engine(None, ("ngram", "layerskip:24-29"), policy="thompson-token", device="cpu")


def test_logits_match_the_torch_model(torch_engine, jax_engine):
    """Rows of different lengths (per-row positions), then a second forward through the cache."""
    tm, jm = torch_engine.target.model, jax_engine.target.model
    ids = [torch_engine.encode(p, chat=False) for p in PROMPTS[:4]]
    t = max(map(len, ids))
    tokens = np.array([p + [0] * (t - len(p)) for p in ids])
    shift = np.arange(4)[:, None] * 3  # each row starts at its own position
    pos = shift + np.arange(t)[None]
    nxt = np.array([[11], [12], [13], [14]])
    with torch.inference_mode():
        cache = tm.new_cache(4, t + 16)
        z_t = tm(torch.tensor(tokens), torch.tensor(pos), cache, t + 16).numpy()
        z2_t = tm(torch.tensor(nxt), torch.tensor(pos[:, -1:] + 1), cache, t + 16).numpy()
    cache = jm.new_cache(4, t + 16)
    z_j, cache = jm(jnp.asarray(tokens), jnp.asarray(pos), cache)
    z2_j, _ = jm(jnp.asarray(nxt), jnp.asarray(pos[:, -1:] + 1), cache)
    for a, b in ((np.asarray(z_j), z_t), (np.asarray(z2_j), z2_t)):
        rel = np.abs(a - b).max() / np.abs(b).max()
        assert rel < 1e-4, rel


def test_greedy_tokens_equal_the_torch_backend(torch_engine, jax_engine):
    """5 prompts of mixed kinds (code, prose, chat; every other one of the first ten) in one batch: JAX
    speculative (adaptive policy, n-gram and layer-skip drafts) and JAX plain decoding == torch plain
    decoding, token for token. (The sampled tests below compare the two backends on these prompts too.)"""
    common = dict(temperature=0.0, max_new_tokens=16, chat=False)
    group = PROMPTS[0:10:2]
    want = torch_engine.generate(group, speculation=False, **common)["tokens"]
    spec = jax_engine.generate(group, speculation=True, gamma=4, **common)
    plain = jax_engine.generate(group, speculation=False, **common)["tokens"]
    for prompt, a, b, c in zip(group, want, spec["tokens"], plain):
        assert b == a, f"{prompt!r}: jax speculative {b} != torch {a}"
        assert c == a, f"{prompt!r}: jax plain {c} != torch {a}"
    assert sum(spec["arm_pulls"].values()) == spec["steps"] >= 1


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """(fraction of identical sequences, fraction of positions before the first difference)."""
    same = np.mean([x == y for x, y in zip(a, b)])
    prefix = [next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y))) for x, y in zip(a, b)]
    return float(same), float(sum(prefix) / sum(max(len(x), len(y)) for x, y in zip(a, b)))


def fixed_arm_run(engine, arm: int, prompts, sampling, seeds, **spec):
    ids = [engine.encode(p, chat=False) for p in prompts]
    policy = FixedArm(2, BanditConfig(fixed_arm=arm))
    seed = torch.tensor(seeds) if engine.backend_name == "torch" else np.array(seeds, np.uint64)
    with torch.inference_mode():
        return speculate(engine.backend, policy, ids, sampling=sampling, spec=SpecConfig(**spec), seed=seed)


@pytest.mark.parametrize("arm", [0, 1], ids=["ngram", "layerskip"])
def test_sampled_tokens_agree_with_the_torch_backend(torch_engine, jax_engine, arm, capsys):
    """Same seeds, same fixed draft, T = 0.8, top-p 0.95, 5 prompts of mixed kinds in one batch x 16 tokens:
    the shared generator makes the tokens identical unless float32 rounding of the two models' logits
    flips a near-tie of a Gumbel argmax or an accept test. Measured on this CPU: 20 of 20 sequences
    identical with either draft over all 20 prompts; the bound asserted leaves room for one flip (a
    wrong stream or offset makes the sequences differ from the first sampled token)."""
    sampling = SamplingConfig(0.8, top_p=0.95)
    prompts, seeds = PROMPTS[0:10:2], list(range(100, 105))
    a = fixed_arm_run(torch_engine, arm, prompts, sampling, seeds, gamma=4, max_new_tokens=16)[0]
    b = fixed_arm_run(jax_engine, arm, prompts, sampling, seeds, gamma=4, max_new_tokens=16)[0]
    same, prefix = agreement(a, b)
    with capsys.disabled():
        print(f"\n[arm {arm}] sampled agreement with torch: {same:.3f} of sequences identical, "
              f"{prefix:.3f} of tokens before the first difference")
    assert same >= 0.8 and prefix >= 0.85


def tiny_engine():
    """The JAX engine on a tiny random 3-layer model (tests/char_tokenizer.py's vocabulary) with the n-gram
    and layer-skip (layer 2) drafts: the embedded model's engine code, at a size the statistical test affords."""
    from char_tokenizer import VOCAB, CharTokenizer

    from flashspec_jax.engine import Engine
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import LoadedModel, random_model

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256, eos_token_ids=())  # no EOS: every row emits 2 tokens
    tiny = LoadedModel(random_model(cfg, dtype=jnp.float32, seed=3, std=0.4), CharTokenizer(), "tiny")
    return Engine(tiny, ("ngram", "layerskip:2"), policy="fixed", device="cpu")


def test_sampled_first_tokens_follow_the_target():
    """With a draft in the loop, the first emitted token ~ the target's next-token distribution. One step
    (max_new_tokens=1): the first token is that step's accepted draft or its corrected draw, and a
    second step (the loop issues it before reading the first) would not change it. On a tiny random
    model (the embedded model's 300 rows took ~3.5 min of CI), its final norm x3 for a peaked law, 1,000
    rows in one batch: a law at T = 0.8 or 1.25 instead of 1 fails it (p < 1e-6), as on the embedded model."""
    from flashspec_jax.kernels.verify import log_probs

    engine = tiny_engine()
    m = engine.target.model
    m.norm.set_value(3 * m.norm.get_value())
    prompt, n = "The capital of France is", 1000
    ids = engine.encode(prompt, chat=False)
    z, _ = m(jnp.asarray([ids]), jnp.arange(len(ids))[None], m.new_cache(1, len(ids)))
    p = np.asarray(jnp.exp(log_probs(z[0, -1], 1.0, 8, 1.0)), np.float64)
    outs, records = fixed_arm_run(engine, 1, [prompt] * n, SamplingConfig(1.0, top_k=8), list(range(n)),
                                  gamma=2, max_new_tokens=1)  # layer-skip draft: q != p, often accepted
    first = np.array([t[0] for t in outs])
    _, p_value, note = chi_square_test(np.bincount(first, minlength=p.size), p)
    assert p_value > 1e-3, note
    assert sum(r.accepted for r in records) > 0.04 * n  # the draft really took part (~0.09 a row)


def test_sampled_first_two_tokens_follow_the_target_with_a_head():
    """A draft head in the loop (tests/jax/test_jax_serving.py's random head over the tiny model's layers 0
    and 1, its final norm scaled by 0.1 for a flatter q), T = 1.5, top-p 0.9, G = 2 (a target flat enough for
    ~20% of the head's drafts to be accepted): the first token's law and the first two tokens' joint law, chi-square
    against the target's own p(t1) p(t2 | t1) by plain forward passes. On the tiny model, 400 rows (the
    shipped head on the embedded model took ~2.5 min of CI for 100; its greedy tests stay in
    tests/jax/test_jax_head_engine.py)."""
    from flashspec_jax.kernels.verify import log_probs
    from head_checks import check_first_two_tokens
    from test_jax_serving import random_head

    engine = tiny_engine()
    m = engine.target.model
    head = random_head(m)
    head = head._replace(norm=0.1 * head.norm)  # a flatter q: its drafts land in the target's nucleus often
    engine.backend.set_drafts([engine.backend.head_draft("head", head, (0, 1)), engine.backend.drafts[0]])
    prompt, n = "My favourite colour is", 400
    sampling = SamplingConfig(temperature=1.5, top_p=0.9)
    ids = engine.encode(prompt, chat=False)
    z1, _ = m(jnp.asarray([ids]), jnp.arange(len(ids))[None], m.new_cache(1, len(ids)))
    p1 = np.asarray(jnp.exp(log_probs(z1[0, -1], 1.5, 0, 0.9)), np.float64)  # [V]
    first = np.nonzero(p1 > 0)[0]  # the nucleus of the first token
    k = len(ids) + 1
    seqs = jnp.asarray([ids + [int(t)] for t in first])
    z2, _ = m(seqs, jnp.broadcast_to(jnp.arange(k)[None], seqs.shape), m.new_cache(len(first), k))
    p2 = np.asarray(jnp.exp(log_probs(z2[:, -1], 1.5, 0, 0.9)), np.float64)  # [F, V]
    tokens, records = speculate(engine.backend, FixedArm(2, BanditConfig(fixed_arm=0)), [ids] * n, sampling=sampling,
                                spec=SpecConfig(gamma=2, max_new_tokens=2), seed=np.arange(n, dtype=np.uint64))  # the head
    check_first_two_tokens(tokens, first, p1, p2)
    assert sum(r.accepted for r in records) > 0.1 * sum(r.drafted for r in records)  # the head's drafts mattered


@pytest.fixture(scope="module")
def tiny():
    """The whole-generation loop's tests run on the tiny model: the same loop code as the embedded model's,
    compiled in seconds (they took ~2.5 min of CI on the embedded model)."""
    return tiny_engine()


@pytest.fixture(scope="module")
def whole_loop(tiny):
    from flashspec_jax.whole import Whole

    return Whole(tiny.backend)


def two_prompts(tiny):
    return [tiny.encode(p, chat=False) for p in (PROMPTS[0], PROMPTS[16])]


def host_and_device(tiny, whole_loop, host_policy, device_policy, sampling, seeds):
    prompts = two_prompts(tiny)
    host, host_rec = speculate(tiny.backend, host_policy, prompts, sampling=sampling, spec=SpecConfig(4, 14), seed=seeds)
    dev, dev_rec = whole_loop.run(prompts, max_new_tokens=14, gamma=4, sampling=sampling, seed=seeds, policy=device_policy)
    return host, dev, host_rec, dev_rec


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_whole_generation_equals_the_host_loop_ucb1(tiny, whole_loop, temperature):
    """UCB1 is deterministic given its observations, and both loops observe one step late: same
    arms, same accepted counts, same tokens."""
    from flashspec_jax import whole

    seeds = np.array([3, 4], np.uint64)
    host, dev, host_rec, dev_rec = host_and_device(
        tiny, whole_loop, UCB1(2, BanditConfig(objective="acceptance")), whole.UCB1(), SamplingConfig(temperature), seeds)
    assert dev == host
    assert [(r.arm, r.accepted, r.rows) for r in dev_rec] == [(r.arm, r.accepted, r.rows) for r in host_rec]
    assert {r.arm for r in host_rec} == {0, 1}  # the policy really switched arms


def test_whole_generation_equals_the_host_loop_fixed(tiny, whole_loop):
    from flashspec_jax import whole

    seeds = np.array([7, 8], np.uint64)
    config = BanditConfig(fixed_arm=1)
    host, dev, _, dev_rec = host_and_device(tiny, whole_loop, FixedArm(2, config), whole.Fixed(1), SamplingConfig(0.9, top_k=20), seeds)
    assert dev == host
    assert {r.arm for r in dev_rec} == {1}


def test_whole_generation_vmaps_over_seeds(tiny, whole_loop):
    """One call, three runs: each equals its own single run; the statistics come per run."""
    from flashspec_jax import whole

    prompts = two_prompts(tiny)
    kw = dict(max_new_tokens=14, gamma=4, sampling=SamplingConfig(0.8), policy=whole.UCB1())
    seeds = np.array([[3, 4], [5, 6], [7, 8]], np.uint64)
    many = whole_loop.run_many(prompts, seeds, **kw)
    assert many["arms"].shape == (3, 14) and many["accepted"].shape == (3, 14)
    for r in range(3):
        alone, records = whole_loop.run(prompts, seed=seeds[r], **kw)
        assert many["tokens"][r] == alone
        assert [(x.arm, x.accepted) for x in many["records"][r]] == [(x.arm, x.accepted) for x in records]
    assert len({tuple(t[0]) for t in many["tokens"]}) > 1  # different seeds, different samples


def test_pallas_verify_inside_the_jitted_step_matches_the_reference(jax_engine):
    """The Pallas kernel (interpret mode here) as the backend's verify: the same tokens."""
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    m = jax_engine.target.model
    prompts = [jax_engine.encode(PROMPTS[2], chat=False)]
    outs = []
    for impl in ("reference", "pallas"):
        b = JaxBackend(m, m.config.eos_token_ids, verify_impl=impl)
        b.set_drafts([LookupDraft()])
        outs.append(speculate(b, FixedArm(1), prompts, sampling=SamplingConfig(0.7), spec=SpecConfig(3, 6), seed=np.array([5], np.uint64))[0])
    assert outs[0] == outs[1]


def test_bad_input_is_a_clear_error(jax_engine):
    with pytest.raises(ValueError, match="prompt"):
        jax_engine.generate("   ")
    with pytest.raises(ValueError, match="temperature"):
        jax_engine.generate("hi", temperature=-1)
    with pytest.raises(ValueError, match="layerskip"):
        jax_engine.make_draft("layerskip:40-50")
    with pytest.raises(ValueError, match="unknown"):
        jax_engine.make_draft("no-such-draft")
    with pytest.raises(ValueError, match="every prompt"):
        jax_engine.backend.prefill([[]], 4)


def test_drafts_the_jax_backend_does_not_build_are_refused(jax_engine):
    with pytest.raises(ValueError, match="'nf4' .* not implemented by the jax backend"):
        jax_engine.make_draft("nf4")
    with pytest.raises(ValueError, match=r"layerskip:30 must name layers in \[0, 30\)"):
        jax_engine.make_draft("layerskip:30")
    assert jax_engine.make_draft("layerskip").name == "layerskip"  # the default skip set, as on torch
