"""The draft head in JAX (flashspec_jax.heads) against the torch head on a tiny random target: the
target's features, the head's q, tokens and log q (fp32); greedy speculation with the head equals
greedy decoding as the head lags and catches up; the file's refusals."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from flashspec.config import LlamaConfig, SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402
from schedules import Cycle  # noqa: E402  (tests/schedules.py: the head lags and catches up)

CFG = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_position_embeddings=512, tie_word_embeddings=False)
LAYERS = (2, 0)  # not sorted: the features are concatenated in this order


def random_head(tm, seed: int, scale: float, copy: bool):
    """A random head over the odd tokens; ``copy``: one that mostly drafts the current token again
    (fc_in passes the token's embedding through, small weights elsewhere), which a repetitive random
    target accepts now and then."""
    from flashspec_torch.heads import DraftHead

    torch.manual_seed(seed)
    head = DraftHead(CFG, LAYERS, torch.arange(1, 97, 2))
    for p in head.parameters():
        p.data.normal_(0, scale)
    if copy:
        with torch.no_grad():
            head.fc_in.weight[:, : CFG.hidden_size] += torch.eye(CFG.hidden_size)
            for name in ("embed_norm", "feat_norm", "norm", "layer.attn_norm", "layer.mlp_norm"):
                head.get_parameter(name).fill_(1.0)
    return head


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(torch target, JAX target, {kind: (torch head, its file)}): a random head (its file stores the
    vocabulary most frequent first, with counts) and a copying one (sorted by id, the first format)."""
    from flashspec_jax.weights import from_state
    from flashspec_torch.heads import save_head
    from flashspec_torch.model import Llama

    torch.manual_seed(0)
    tm = Llama(CFG).eval().requires_grad_(False)
    for p in tm.parameters():
        p.data.normal_(0, 0.3)
    tm.lm_head.weight.copy_(tm.embed.weight)  # untied, but equal: the copying head's argmax is its input token
    heads = {}
    for kind, scale in (("random", 0.3), ("copy", 0.1)):
        head = random_head(tm, 1, scale, kind == "copy")
        path = tmp_path_factory.mktemp(kind) / "head.safetensors"
        counts = (torch.arange(97) * 37) % 97 if kind == "random" else None  # random: the file's ids in frequency order
        heads[kind] = head, save_head(head, path, target_name="tiny", dtype=torch.float32, counts=counts)
    jm = from_state(CFG, {k: v.numpy() for k, v in tm.state_dict().items()})
    return tm, jm, heads


def jax_backend(jm, path, with_ngram=False):
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.heads import load_head

    backend = JaxBackend(jm)
    params, layers, _ = load_head(path, jm)
    assert layers == LAYERS
    backend.set_drafts([backend.head_draft("head", params, layers)] + ([LookupDraft("ngram")] if with_ngram else []))
    return backend


def test_the_target_hands_over_the_same_features(models):
    tm, jm, _ = models
    rs = np.random.default_rng(0)
    tokens, pos = rs.integers(0, 97, (2, 7)), rs.integers(0, 9, (2, 1)) + np.arange(7)[None]
    with torch.inference_mode():
        z_t, f_t = tm(torch.tensor(tokens), torch.tensor(pos), tm.new_cache(2, 24), 24, hidden=LAYERS)
    z_j, _, f_j = jm(jnp.asarray(tokens), jnp.asarray(pos), jm.new_cache(2, 24), hidden=LAYERS)
    assert f_j.shape == (2, 7, 2 * CFG.hidden_size)
    np.testing.assert_allclose(np.asarray(f_j), f_t.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(z_j), z_t.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="skips"):
        jm(jnp.asarray(tokens), jnp.asarray(pos), jm.new_cache(2, 24), hidden=(1,), skip=frozenset({1}))


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(0.8, top_k=20, top_p=0.9)])
@pytest.mark.parametrize("per_row_seeds", [False, True])
def test_flax_head_q_equals_the_torch_head_q(models, sampling, per_row_seeds):
    """The same token history and target features (rows of different lengths, the head fed part of
    the prompt ahead) -> the same drafted tokens, full-row logits (OUTSIDE off the head's vocabulary)
    and log q."""
    from flashspec_jax.drafts import Seqs, make_seeds
    from flashspec_torch.drafts import Sequences
    from flashspec_torch.heads import HeadDraft

    tm, jm, heads = models
    head, path = heads["random"]
    b, s, gamma, prefix = 3, 40, 4, 6
    rs = np.random.default_rng(1)
    tokens = rs.integers(0, 97, (b, s))
    length = np.array([9, 17, 12])
    feats = rs.standard_normal((b, s, 2 * CFG.hidden_size)).astype(np.float32)
    seed = np.array([5, 11, 2**40 + 3]) if per_row_seeds else 1234

    torch_head = HeadDraft("head", head, tm)
    torch_head.start(b, s)
    seqs_t = Sequences(torch.tensor(tokens), torch.tensor(length), int(length.max()), features=torch.tensor(feats))
    with torch.inference_mode():
        want = torch_head.propose(seqs_t, gamma, sampling, torch.tensor(seed) if per_row_seeds else seed, 7)

    backend = jax_backend(jm, path)
    draft = backend.drafts[0]
    seqs = Seqs(jnp.asarray(tokens, jnp.int32), jnp.asarray(length, jnp.int32), jnp.asarray(length, jnp.int32),
                jnp.zeros(b, bool), jnp.int32(8), jnp.asarray(feats))
    state = draft.start(backend.weights, seqs, prefix)
    got, _ = jax.jit(draft.propose, static_argnames=("gamma", "cfg"))(
        backend.weights, state, seqs, gamma=gamma, cfg=sampling, seeds=make_seeds(seed), offset=7)
    np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens.numpy())
    np.testing.assert_allclose(np.asarray(got.logits), want.logits.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got.logprobs), want.logprobs.numpy(), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got.logits)[..., 0] == -1e30)  # token 0 is outside the head's vocabulary


def test_greedy_speculation_with_the_head_equals_greedy_decoding(models):
    """... with the head lagging and catching up (an arm schedule with ngram); the same steps as the
    torch backend with the same head; the features the backend kept are the target's."""
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.heads import HeadDraft

    tm, jm, heads = models
    head, path = heads["copy"]
    backend = jax_backend(jm, path, with_ngram=True)
    prompts, greedy, spec = [[1, 2, 3, 4, 5], [7, 8, 9]], SamplingConfig(0.0), SpecConfig(gamma=3, max_new_tokens=20)
    plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=20)
    tokens, records = speculate(backend, Cycle([0, 0, 1, 0, 1, 1, 0]), prompts, sampling=greedy, spec=spec)
    assert tokens == plain
    assert sum(r.accepted for r in records if r.arm == 0) > 0  # the head's drafts were used
    seqs = backend.state.seqs
    for row, n in enumerate(np.asarray(seqs.length) - 1):  # every fed position: the target's own streams
        ids = seqs.tokens[row : row + 1, :n]
        _, _, want = jm(ids, jnp.arange(n)[None], jm.new_cache(1, n), logits=False, hidden=LAYERS)
        np.testing.assert_allclose(np.asarray(seqs.features[row, :n]), np.asarray(want[0]), rtol=1e-5, atol=1e-5)
    torch_backend = TorchBackend(tm, [HeadDraft("head", head, tm), LookupDraft("ngram")])
    with torch.inference_mode():
        tokens_t, records_t = speculate(torch_backend, Cycle([0, 0, 1, 0, 1, 1, 0]), prompts, sampling=greedy, spec=spec)
    assert tokens_t == tokens
    assert [(r.arm, r.accepted) for r in records_t] == [(r.arm, r.accepted) for r in records]


def test_bad_heads_are_refused(models, tmp_path):
    from dataclasses import replace

    from flashspec_jax.heads import load_head
    from flashspec_jax.weights import from_state

    tm, jm, heads = models
    path = heads["random"][1]
    small = replace(CFG, num_layers=2)
    other = from_state(small, {k: v.numpy() for k, v in tm.state_dict().items() if not k.startswith("layers.2.")})
    with pytest.raises(ValueError, match="num_layers=3, but this target has 2"):
        load_head(path, other)
    with pytest.raises(FileNotFoundError, match="train-head"):
        load_head(tmp_path / "nothing", jm)
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(path), "numpy") as f:
        meta = f.metadata()
    state = load_file(str(path))
    del state["fc_in.weight"]
    save_file(state, str(tmp_path / "head.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="lacks 'fc_in.weight'"):
        load_head(tmp_path, jm)


def test_head_at_n_keeps_the_torch_heads_n_most_frequent_tokens(models):
    """``head@N``: the JAX head over the N most frequent tokens of a file that stores them so, the
    same ids and LM head rows as the torch head's; refused for a file sorted by id."""
    from flashspec_jax.heads import load_head
    from flashspec_torch.heads import load_head as torch_load_head

    tm, jm, heads = models
    params, _, _ = load_head(heads["random"][1], jm, top=8)
    want, _ = torch_load_head(heads["random"][1], CFG, top=8)
    assert np.asarray(params.token_ids).tolist() == want.token_ids.tolist()
    np.testing.assert_array_equal(np.asarray(params.lm_rows), tm.lm_head.weight[want.token_ids].numpy())
    with pytest.raises(ValueError, match="sorted by id, not by frequency"):
        load_head(heads["copy"][1], jm, top=8)


def test_a_target_without_its_head_is_refused(models, tmp_path):
    """The shipped head on another target; a head:DIR trained for other weights of the same shape."""
    from flashspec.drafts import SHIPPED_HEAD
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.heads import load_draft_head
    from flashspec_torch.heads import save_head

    tm, jm, heads = models
    backend = JaxBackend(jm)
    if SHIPPED_HEAD.is_file():
        with pytest.raises(ValueError, match="trained for a target with hidden_size=576, but this target has 64"):
            load_draft_head(backend, "head", "")
    save_head(heads["random"][0], tmp_path / "head.safetensors", target_name="other", extra={"fingerprint": 9.0})
    with pytest.raises(ValueError, match="trained for 'other', whose weights differ"):
        load_draft_head(backend, f"head:{tmp_path}", str(tmp_path))


def test_a_bf16_step_with_the_head_lowers_for_the_gpu(models):
    """Prefill, the head's draft (uniform, as in the device loop), score, verify and commit in bf16,
    exported for CUDA on this CPU (jax.export): what the GPU runs traces and lowers."""
    from flashspec_jax.drafts import make_seeds
    from flashspec_jax.steps import batch_shapes
    from flashspec_jax.weights import from_state

    tm, _, heads = models
    jm = from_state(CFG, {k: v.numpy() for k, v in tm.state_dict().items()}, dtype=jnp.bfloat16)
    backend = jax_backend(jm, heads["copy"][1], with_ngram=True)
    steps, cfg = backend.steps, SamplingConfig(0.8, top_p=0.9)
    tokens, lengths, prefix = batch_shapes([[1, 2, 3], [4, 5, 6, 7]], 12)

    def step(weights, tokens, lengths, seeds):
        state = steps.prefill(weights, tokens, lengths, 12, prefix)
        proposal, state = steps.draft_uniform(0, weights, state, 3, cfg, seeds, 5)
        z, state = steps.score(weights, state, proposal)
        return steps.commit(state, steps.verify(z, proposal, cfg, seeds, 5))

    checks = [jax.export.DisabledSafetyCheck.custom_call(n) for n in ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")]
    exported = jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=checks)(
        backend.weights, jnp.asarray(tokens), jnp.asarray(lengths), make_seeds(3))
    assert exported.platforms == ("cuda",)
