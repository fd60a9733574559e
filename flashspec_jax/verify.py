"""``flashspec_jax.verify``: speculative-decoding verification on JAX arrays.

The typed front door: argument checks (``flashspec.contract.check_verify_args``, plus value checks
on concrete inputs), the counter coordinates, and the dispatch to ``impl="pallas"`` (the fused
kernels of ``flashspec_jax.kernels.verify``; Pallas interpret mode off the GPU) or
``impl="reference"`` (the oracle's algorithm in jnp). Both run under one ``jax.jit`` each, with
temperature / top-k / top-p static and seed / offset traced (new seeds never recompile).

Value checks (NaN / +inf logits, rows without a finite logit, token ids outside [0, V),
``draft_logprobs`` that are not log-probabilities, a drafted token that q gives no mass) need the
data: they run only when the inputs are concrete, and cost one reduction over the logits and a
device-to-host sync of a few flags. Call ``verify`` inside your own ``jax.jit`` (as the decoding
loop does) to skip them; the kernels clamp ids so that nothing reads out of bounds.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from flashspec.contract import VerifyResult, check_verify_args, draft_lengths_problem
from flashspec_jax import random as rng
from flashspec_jax.kernels import verify as kernels

IMPLS = ("pallas", "reference")


def register_result_pytree() -> None:
    """VerifyResult (a numpy-only dataclass) as a pytree, so that ``verify`` works under jax.jit."""
    try:
        jax.tree_util.register_dataclass(VerifyResult, data_fields=["num_accepted", "tokens"], meta_fields=[])
    except ValueError:  # already registered (by another import of this module's twin)
        pass


register_result_pytree()


def verify(
    target_logits,  # [B, G+1, V] float
    draft_tokens,  # [B, G] int
    draft_logits=None,  # [B, G, V] float, or None for a deterministic (one-hot) draft
    draft_logprobs=None,  # [B, G] float: log q_i(x_i) as the draft computed it, or None
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed=0,
    offset=0,
    draft_lengths=None,  # [B] int in [0, G]: row b proposes its first L_b tokens (ids past L_b never read); None: G
    impl: str | None = None,
    config: kernels.VerifyKernelConfig | None = None,  # impl="pallas": tiling and loop variant (None: default)
) -> VerifyResult[jax.Array]:
    """Accept / reject the drafted tokens and draw the residual or bonus token (see SPEC.md); a row whose
    L_b tokens are all accepted draws y from p at position L_b (L_b = 0: plain decoding's token)."""
    impl = resolve_impl(impl)
    shape, cfg = check_verify_args(
        target_logits, draft_tokens, draft_logits, draft_logprobs, temperature, top_k, top_p, seed, offset,
        draft_lengths,
    )
    args = (target_logits, draft_tokens, draft_logits, draft_logprobs)
    concrete = not any(isinstance(a, jax.core.Tracer) for a in (*args, seed, offset, draft_lengths))
    proposed = np.ones((shape.batch, shape.gamma), bool)
    if concrete and draft_lengths is not None:
        lengths = np.asarray(draft_lengths).astype(np.int64)
        problem = draft_lengths_problem(lengths, shape.gamma)
        if problem:
            raise ValueError(problem)
        proposed = np.arange(shape.gamma)[None] < lengths[:, None]
    if concrete:
        check_values(*args, vocab=shape.vocab, greedy=cfg.greedy, proposed=proposed)
    seed_lo, seed_hi = rng.split_counter(seed)
    offset_lo, _ = rng.split_counter(offset)
    decision = verify_jit(
        *args, seed_lo, seed_hi, offset_lo, None if draft_lengths is None else jnp.asarray(draft_lengths, jnp.int32),
        temperature=float(cfg.temperature), top_k=int(cfg.top_k), top_p=float(cfg.top_p), impl=impl,
        interpret=not on_gpu(), config=config,
    )
    if concrete and draft_logits is not None and draft_logprobs is None and not cfg.greedy:
        check_draft_support(np.asarray(decision.log_q_x), np.asarray(draft_tokens), proposed)
    return VerifyResult(num_accepted=decision.num_accepted, tokens=decision.tokens)


def on_gpu() -> bool:
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def resolve_impl(impl: str | None) -> str:
    if impl is None:
        return "pallas" if on_gpu() else "reference"
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} must be one of {IMPLS} (or None: 'pallas' on GPU, else 'reference')")
    return impl


def make_counters(seed_lo, seed_hi, offset, batch: int) -> kernels.Counters:
    """uint32 [] or [B] halves -> the coordinates: [B] as given, [1] where shared (not broadcast to [B]: in a
    jitted loop XLA would build the copies every step, one kernel launch each); per-row seeds use row
    coordinate 0, a shared seed the batch row."""
    per_row = jnp.ndim(seed_lo) == 1
    row = jnp.zeros(batch, jnp.uint32) if per_row else jnp.arange(batch, dtype=jnp.uint32)
    vec = lambda a: jnp.reshape(jnp.asarray(a, jnp.uint32), (-1,))  # noqa: E731  [] -> [1]: a bitcast
    return kernels.Counters(vec(seed_lo), vec(seed_hi), vec(offset), row)


@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p", "impl", "interpret", "config"))
def verify_jit(
    z,  # [B, G+1, V]
    x,  # [B, G]
    w,  # [B, G, V] or None
    log_q_given,  # [B, G] or None
    seed_lo,  # uint32 [] or [B]
    seed_hi,  # uint32 [] or [B]
    offset,  # uint32 [] or [B]
    lengths=None,  # [B] int32 or None
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    impl: str,
    interpret: bool,
    config: kernels.VerifyKernelConfig | None = None,
) -> kernels.Decision:
    c = make_counters(seed_lo, seed_hi, offset, z.shape[0])
    x = x.astype(jnp.int32)
    if temperature == 0:
        w, log_q_given = None, None
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    if impl == "reference":
        return kernels.verify_reference(z, x, w, log_q_given, c, lengths, **sampling)
    return kernels.verify(z, x, w, log_q_given, c, lengths, **sampling, config=config, interpret=interpret)


# ----------------------------------------------------------------------------- value checks


@jax.jit
def logits_flags(a) -> tuple[jax.Array, jax.Array]:  # [..., V] -> (any NaN/+inf, any row without finite)
    return jnp.any(jnp.isnan(a) | (a == jnp.inf)), jnp.any(~jnp.any(jnp.isfinite(a), axis=-1))


def check_logits(name: str, a) -> None:
    if isinstance(a, np.ndarray):
        a = a.astype(np.float32)
        bad, empty = bool(np.any(np.isnan(a) | np.isposinf(a))), bool(np.any(~np.isfinite(a).any(-1)))
    else:
        bad, empty = (bool(f) for f in logits_flags(a))
    if not (bad or empty):
        return
    a = np.asarray(a).astype(np.float32)
    if bad:
        idx = tuple(int(i) for i in np.argwhere(np.isnan(a) | np.isposinf(a))[0])
        raise ValueError(f"{name}{list(idx)} is {a[idx]}: logits must be finite or -inf (masked)")
    idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a).any(-1))[0])
    raise ValueError(f"{name}{list(idx)} has no finite logit: every row needs at least one token with mass")


def check_values(z, x, w, log_q_given, *, vocab: int, greedy: bool, proposed: np.ndarray) -> None:
    """The data-dependent checks of the oracle, on concrete inputs; positions past L_b (``proposed`` [B, G]
    False) are not checked."""
    check_logits("target_logits", z)
    if w is not None and not greedy:
        check_logits("draft_logits", w)
    x = np.asarray(x).astype(np.int64)
    bad = ((x < 0) | (x >= vocab)) & proposed
    if bad.any():
        b, i = np.argwhere(bad)[0]
        raise ValueError(
            f"draft_tokens[{b}, {i}] = {x[b, i]} is out of range [0, {vocab}); "
            "padding ids such as -1 are not tokens: verify only rows with real drafts"
        )
    if log_q_given is not None and not greedy:
        lq = np.asarray(log_q_given).astype(np.float32)
        if not (np.isfinite(lq) & (lq <= 1e-3) | ~proposed).all():
            raise ValueError("draft_logprobs must be finite log-probabilities (<= 0)")


def check_draft_support(log_q_x: np.ndarray, x, proposed: np.ndarray) -> None:  # [B, G] each
    impossible = np.isneginf(log_q_x) & proposed
    if impossible.any():
        b, i = np.argwhere(impossible)[0]
        raise ValueError(
            f"draft_tokens[{b}, {i}] = {x[b, i]} has zero probability under draft_logits after "
            "temperature/top-k/top-p: the draft must sample from exactly the q given to verify"
        )
