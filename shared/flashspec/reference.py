"""The NumPy oracle of SPEC.md's verification mathematics.

Slow and plain on purpose: every kernel is compared with it. All arithmetic is float32 after the
inputs are cast to float32 (so fp16 / bf16 / fp32 logits are computed in fp32), in log space.

Notation (the paper's letters): z target logits, w draft logits, T temperature, p = softmax of the
filtered z / T, q likewise for w, x the drafted tokens, u the accept uniforms, n the first
rejection, y the residual or bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import random as rng
from .config import SamplingConfig
from .contract import VerifyResult, check_verify_args, draft_lengths_problem


@dataclass(frozen=True)
class Counters:
    """Per-row coordinates of the shared generator."""

    seed: np.ndarray  # [B] uint64
    offset: np.ndarray  # [B] uint64
    row: np.ndarray  # [B] uint32: the batch row for a shared seed, 0 for per-row seeds

    @classmethod
    def make(cls, seed, offset, batch: int) -> "Counters":
        per_row = np.ndim(seed) == 1
        seeds = np.broadcast_to(np.asarray(seed, dtype=np.uint64), (batch,))
        offsets = np.broadcast_to(np.asarray(offset, dtype=np.uint64), (batch,))
        rows = np.zeros(batch, np.uint32) if per_row else np.arange(batch, dtype=np.uint32)
        return cls(seeds, offsets, rows)


# ----------------------------------------------------------------------------- distributions


def as_float32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def scale(z: np.ndarray, temperature: float) -> np.ndarray:  # [..., V] -> [..., V]
    """z / T in float32 (a true division, as every backend must do)."""
    return z / np.float32(temperature)


def filter_top_k(s: np.ndarray, k: int) -> np.ndarray:  # [..., V] scaled logits
    """Keep every token whose scaled logit is at least the k-th largest (ties kept)."""
    v = s.shape[-1]
    if k <= 0 or k >= v:
        return s
    kth = np.partition(s, v - k, axis=-1)[..., v - k : v - k + 1]
    return np.where(s >= kth, s, np.float32(-np.inf))


def softmax(s: np.ndarray) -> np.ndarray:  # [..., V]
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(axis=-1, keepdims=True)


def filter_top_p(s: np.ndarray, top_p: float) -> np.ndarray:  # [..., V] scaled logits
    """Keep the shortest prefix (by probability, ties: lower id first) whose mass reaches top_p."""
    if top_p >= 1.0:
        return s
    probs = softmax(s)
    order = np.argsort(-probs, axis=-1, kind="stable")  # descending; stable keeps lower ids first
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # exclusive prefix sum
    keep_sorted = mass_before < np.float32(top_p)
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, s, np.float32(-np.inf))


def filter_logits(s: np.ndarray, cfg: SamplingConfig) -> np.ndarray:  # [..., V]
    """top-k, then top-p, on scaled logits; removed tokens become -inf."""
    return filter_top_p(filter_top_k(s, cfg.top_k), cfg.top_p)


def log_softmax(s: np.ndarray) -> np.ndarray:  # [..., V]
    m = s.max(axis=-1, keepdims=True)
    return s - (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))


def log_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:  # [..., V] -> [..., V]
    """log p = log_softmax(filter(z / T)), float32."""
    return log_softmax(filter_logits(scale(as_float32(logits), cfg.temperature), cfg))


def gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:  # [B, G, V], [B, G] -> [B, G]
    return np.take_along_axis(a, idx[..., None].astype(np.int64), axis=-1)[..., 0]


# ----------------------------------------------------------------------------- sampling


def sample(
    logits: np.ndarray,  # [B, V] raw logits
    cfg: SamplingConfig,
    seed=0,
    offset=0,
    position: int = 0,
    stream: int = rng.DRAFT,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw one token per row with the shared generator (Gumbel-max); returns (tokens [B], log q [B]).

    This is how a draft must sample so that ``verify`` sees the exact q it sampled from: the same
    temperature, top-k and top-p, and the DRAFT stream (disjoint from verify's streams).
    """
    logits = as_float32(logits)
    b, v = logits.shape
    if cfg.greedy:
        return logits.argmax(-1).astype(np.int32), np.zeros(b, np.float32)
    c = Counters.make(seed, offset, b)
    lq = log_probs(logits, cfg)
    g = rng.gumbel(c.seed[:, None], c.offset[:, None], c.row[:, None], position, np.arange(v)[None], stream)
    tokens = (lq + g).argmax(-1)
    return tokens.astype(np.int32), lq[np.arange(b), tokens]


# ----------------------------------------------------------------------------- verification


class ReferenceVerifier:
    """verify() as a sequence of small steps; ``flashspec.testing`` breaks single steps on purpose."""

    def __call__(
        self,
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
        draft_lengths=None,  # [B] int in [0, G]: row b proposes its first L_b tokens; None: all G
        impl: str = "reference",
    ) -> VerifyResult[np.ndarray]:
        if impl != "reference":
            raise ValueError(f"impl={impl!r}: flashspec.reference.verify only has impl='reference'")
        shape, cfg = check_verify_args(
            target_logits, draft_tokens, draft_logits, draft_logprobs, temperature, top_k, top_p, seed, offset,
            draft_lengths,
        )
        z = as_float32(target_logits)
        lengths = self.lengths(draft_lengths, shape.batch, shape.gamma)  # [B]
        proposed = np.arange(shape.gamma)[None] < lengths[:, None]  # [B, G]: the positions each row proposes
        x = np.asarray(draft_tokens).astype(np.int64)
        w = None if draft_logits is None else as_float32(draft_logits)
        lq_given = None if draft_logprobs is None else as_float32(draft_logprobs)
        self.check_values(z, x, w, lq_given, shape.vocab, proposed)
        x = np.where(proposed, x, 0)  # ids past L_b are never read
        c = Counters.make(seed, offset, shape.batch)
        if cfg.greedy:
            return self.verify_greedy(z, x, proposed)
        log_p = self.target_log_probs(z, cfg)  # [B, G+1, V]
        log_q = None if w is None else self.draft_log_probs(w, cfg)  # [B, G, V]
        log_q_x = self.draft_log_probs_at(x, log_q, lq_given, proposed)  # [B, G]
        log_u = np.log(self.accept_uniforms(c, shape.gamma, x))  # [B, G]
        accepted = self.accept(log_u, gather(log_p[:, :-1], x), log_q_x) & proposed  # [B, G]
        n = self.first_rejection(accepted)  # [B], <= L_b
        y = self.sample_final(log_p, log_q, x, n, self.bonus_rows(n, lengths), c, log_u)  # [B]
        return self.emit(x, n, y)

    @staticmethod
    def lengths(draft_lengths, batch: int, gamma: int) -> np.ndarray:  # -> [B] int64
        if draft_lengths is None:
            return np.full(batch, gamma, np.int64)
        lengths = np.asarray(draft_lengths).astype(np.int64)
        problem = draft_lengths_problem(lengths, gamma)
        if problem:
            raise ValueError(problem)
        return lengths

    # -- value checks (the shape checks live in flashspec.contract)

    def check_values(self, z, x, w, lq_given, vocab: int, proposed) -> None:  # proposed [B, G] bool
        _check_logits("target_logits", z)
        if w is not None:
            _check_logits("draft_logits", w)
        bad = ((x < 0) | (x >= vocab)) & proposed
        if bad.any():
            b, i = np.argwhere(bad)[0]
            raise ValueError(
                f"draft_tokens[{b}, {i}] = {x[b, i]} is out of range [0, {vocab}); "
                "padding ids such as -1 are not tokens: verify only rows with real drafts"
            )
        if lq_given is not None and not (np.isfinite(lq_given) & (lq_given <= 1e-3) | ~proposed).all():
            raise ValueError("draft_logprobs must be finite log-probabilities (<= 0)")

    # -- the steps

    def target_log_probs(self, z, cfg):  # [B, G+1, V]
        return log_probs(z, cfg)

    def draft_log_probs(self, w, cfg):  # [B, G, V]
        return log_probs(w, cfg)

    def draft_log_probs_at(self, x, log_q, lq_given, proposed):  # -> [B, G]
        if lq_given is not None:
            return np.where(proposed, lq_given, np.float32(0))
        if log_q is None:
            return np.zeros(x.shape, np.float32)  # one-hot q: log q(x) = 0
        lq_x = gather(log_q, x)
        if (np.isneginf(lq_x) & proposed).any():
            b, i = np.argwhere(np.isneginf(lq_x) & proposed)[0]
            raise ValueError(
                f"draft_tokens[{b}, {i}] = {x[b, i]} has zero probability under draft_logits after "
                "temperature/top-k/top-p: the draft must sample from exactly the q given to verify"
            )
        return lq_x

    def accept_uniforms(self, c: Counters, gamma: int, x) -> np.ndarray:  # [B, G]
        i = np.arange(gamma)[None]
        return rng.uniform(c.seed[:, None], c.offset[:, None], c.row[:, None], i, 0, rng.ACCEPT)

    def accept(self, log_u, log_p_x, log_q_x):  # [B, G] each -> [B, G] bool
        with np.errstate(invalid="ignore"):
            return log_u < log_p_x - log_q_x

    def first_rejection(self, accepted):  # [B, G] -> [B]
        return np.where(accepted.all(-1), accepted.shape[-1], (~accepted).argmax(-1))

    def bonus_rows(self, n, lengths):  # [B], [B] -> [B] bool
        """Rows whose L_b proposed tokens were all accepted: y is drawn from p_n (the bonus)."""
        return n == lengths

    def residual(self, p_n, q_n):  # [B, V] each -> [B, V], unnormalised
        return np.maximum(p_n - q_n, np.float32(0))

    def sample_final(self, log_p, log_q, x, n, bonus, c: Counters, log_u):  # n, bonus [B] -> [B]
        """y ~ normalise(max(0, p_n - q_n)) if row n rejected, else (bonus) y ~ p_n; Gumbel-max over row n only."""
        b, g1, v = log_p.shape
        rows = np.arange(b)
        lp_n = log_p[rows, n]  # [B, V]
        g = rng.gumbel(c.seed[:, None], c.offset[:, None], c.row[:, None], n[:, None], np.arange(v)[None], rng.FINAL)
        i = np.minimum(n, g1 - 2)  # the draft row n (clamped for the bonus rows, unused there)
        if log_q is None:
            q_n = (np.arange(v)[None] == x[rows, i][:, None]).astype(np.float32)
        else:
            q_n = np.exp(log_q[rows, i])
        r = self.residual(np.exp(lp_n), q_n)
        with np.errstate(divide="ignore"):
            log_r = np.log(r)
        empty = ~(r > 0).any(-1, keepdims=True)  # p <= q everywhere in float32: fall back to p
        key = np.where(bonus[:, None] | empty, lp_n, log_r) + g
        return key.argmax(-1)

    def emit(self, x, n, y) -> VerifyResult[np.ndarray]:
        b, g = x.shape
        pos = np.arange(g + 1)[None]
        padded = np.concatenate([x, np.zeros((b, 1), x.dtype)], axis=1)
        tokens = np.where(pos < n[:, None], padded, -1)
        tokens[np.arange(b), n] = y
        return VerifyResult(num_accepted=n.astype(np.int32), tokens=tokens.astype(np.int32))

    def verify_greedy(self, z, x, proposed) -> VerifyResult[np.ndarray]:
        """T = 0: accept x_i iff x_i = argmax z_i (i < L_b); y = argmax z_n (ties: lowest index)."""
        accepted = (x == z[:, :-1].argmax(-1)) & proposed
        n = self.first_rejection(accepted)
        y = z[np.arange(z.shape[0]), n].argmax(-1)
        return self.emit(x, n, y)


def _check_logits(name: str, a: np.ndarray) -> None:
    if np.isnan(a).any() or np.isposinf(a).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(a) | np.isposinf(a))[0])
        raise ValueError(f"{name}{list(idx)} is {a[idx]}: logits must be finite or -inf (masked)")
    empty = ~np.isfinite(a).any(-1)
    if empty.any():
        idx = tuple(int(i) for i in np.argwhere(empty)[0])
        raise ValueError(f"{name}{list(idx)} has no finite logit: every row needs at least one token with mass")


verify = ReferenceVerifier()
