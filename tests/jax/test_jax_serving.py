"""Continuous batching on the JAX backend (``flashspec_jax.slots``) on a tiny random model (fp32, CPU):
requests that share the batch, join it while others run, wait for a slot, enter in prefill chunks
or sit steps out for another sampling group give the tokens each gives alone through the JAX
engine's ``generate`` (greedy and sampled, fixed seeds; plain, n-gram, layer-skip and a draft head);
bad slots are refused; the HTTP app serves in process."""

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec.serving import Service, check_params  # noqa: E402
from serving_checks import VOCAB, CharTokenizer, complete_and_stream  # noqa: E402

PROMPTS = ["abcabcab", "hello world", "zyx", "hello world", "the cat sat on the mat and the cat sat", "q"]
SAMPLINGS = [dict(temperature=1.0, top_k=20), dict(temperature=0.0), dict(temperature=0.7, top_p=0.9)]


@pytest.fixture(scope="module")
def tiny():
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import LoadedModel, random_model

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=256, eos_token_ids=(1,))
    return LoadedModel(random_model(cfg, dtype=jnp.float32, seed=3, std=0.4), CharTokenizer(), "tiny")


def make_engine(tiny, mode: str | None):
    """The JAX engine with one draft: ngram, layerskip:1, or a random draft head over layers 0 and 1."""
    from flashspec_jax.engine import Engine

    eng = Engine(tiny, ("layerskip:1" if mode == "layerskip:1" else "ngram",), policy="fixed", device="cpu")
    if mode == "head":
        eng.backend.set_drafts([eng.backend.head_draft("head", random_head(tiny.model), (0, 1))])
    return eng


def random_head(model):
    """HeadParams of normal(0, 0.3) weights over the target's whole vocabulary (features of 2 layers)."""
    from flashspec_jax.heads import HeadParams, head_config
    from flashspec_jax.model import Layers, layer_shapes

    c = head_config(model.config)
    keys = iter(jax.random.split(jax.random.PRNGKey(7), 16))
    normal = lambda *shape: 0.3 * jax.random.normal(next(keys), shape, jnp.float32)  # noqa: E731
    layer = Layers(**{f: jnp.ones((1, *sh)) if "norm" in f else normal(1, *sh) for f, sh in layer_shapes(c).items()})
    w = c.hidden_size
    return HeadParams(normal(w, 2 * w), normal(w, 2 * w), jnp.ones(w), jnp.ones(w), layer, jnp.ones(w),
                      jnp.arange(VOCAB, dtype=jnp.int32), model.embed.get_value())


@pytest.fixture(scope="module")
def engine(tiny):
    return make_engine(tiny, "ngram")


def serve_together(svc, cases) -> list:
    streams = [svc.submit(svc.encode(prompt=p), check_params(n, s.get("temperature", 1.0), s.get("top_p", 1.0),
                                                              s.get("top_k", 0), seed, None))
               for p, seed, s, n in cases]
    for st in streams:
        for _ in st:
            pass
    return streams


@pytest.mark.parametrize("mode", [None, "ngram", "layerskip:1", "head"])
def test_each_request_equals_itself_alone(tiny, engine, mode):
    speculation = mode is not None
    kinds = 3 if mode in (None, "ngram") else 2  # the drafts with caches: two sampling groups (fewer compiles)
    engine = engine if kinds == 3 else make_engine(tiny, mode)
    cases = [(p, 10 + i, SAMPLINGS[i % kinds], 6 + 2 * (i % 3)) for i, p in enumerate(PROMPTS)]
    want = [engine.generate(p, seed=seed, speculation=speculation, gamma=3, max_new_tokens=n, chat=False, **s)["tokens"]
            for p, seed, s, n in cases]
    svc = Service(engine, max_batch=3, context=64, gamma=3, speculation=speculation, prefill_chunk=16)
    admitted, admit = [], engine.backend.admit
    engine.backend.admit = lambda slots, prompts, *a: (admitted.append(len(prompts[0])), admit(slots, prompts, *a))[1]
    try:  # every bucket's steps compiled ahead (all rows held: nothing changes), every prefill class run
        assert svc.prepare([0.0]) > 0
    finally:
        del engine.backend.admit
    assert admitted == [n + 1 for n in (1, 2, 3, 4, 5, 8, 9, 16)]  # K/V lengths up to the chunk of 16
    with svc:  # 6 requests, 3 slots: some wait, some join while others run, the long one in chunks of 16
        streams = serve_together(svc, cases)
    for (p, seed, s, n), w, st in zip(cases, want, streams):
        assert st.token_ids == w, f"{p!r} seed {seed} {s}: served {st.token_ids} != alone {w}"
        assert st.finish_reason in ("length", "stop") and st.stats["steps"] >= 1
    assert kinds == 2 or want[1] != want[3]  # the same prompt with another seed: not one shared stream


def test_bad_slots_are_refused(engine):
    engine.backend.open_slots(2, 64)
    with pytest.raises(ValueError, match=r"slots=\[2\] must be distinct integers in \[0, 2\)"):
        engine.backend.admit([2], [[5, 6]], [4], [0])
    with pytest.raises(ValueError, match="does not fit a slot of 64 tokens"):
        engine.backend.admit([0], [[5] * 60], [8], [0])


def test_the_http_app_serves_with_the_jax_backend(engine):
    """``flashspec serve --backend jax``'s app in process: a completion and a stream with usage."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from flashspec.server.app import create_app
    from flashspec.server.metrics import Metrics

    metrics = Metrics("tiny", ["ngram"], 2)
    alone = engine.generate("abc", seed=0, gamma=3, max_new_tokens=3, chat=False, temperature=0.0)["tokens"]
    service = Service(engine, max_batch=2, context=64, gamma=3, observer=metrics)  # opens the slots
    with TestClient(create_app(service, metrics, drain_timeout=1)) as client:
        assert complete_and_stream(client) == CharTokenizer().decode(alone)


def test_adaptive_serving_greedy_equals_plain_decoding_alone(tiny):
    """The server's default policy on the JAX backend: the arms are chosen per step without
    full-information scores (the JAX slot steps score nothing), and greedy tokens are plain decoding's."""
    from flashspec.backend import FreeScoring
    from flashspec_jax.engine import Engine

    eng = Engine(tiny, ("ngram",), policy="adaptive", device="cpu")
    prompts = ["abcabcab", "hello world"]
    want = [eng.generate(p, speculation=False, temperature=0.0, max_new_tokens=8, chat=False)["tokens"] for p in prompts]
    svc = Service(eng, max_batch=1, context=64, gamma=4)  # one slot: one bucket's steps to compile
    assert svc.scheduler.adaptive and not isinstance(eng.backend, FreeScoring)
    with svc:
        streams = serve_together(svc, [(p, i, {"temperature": 0.0}, 8) for i, p in enumerate(prompts)])
    assert [st.token_ids for st in streams] == want
    assert sum(sum(st.stats["arm_pulls"].values()) for st in streams) > 0  # each arm is measured once at least
