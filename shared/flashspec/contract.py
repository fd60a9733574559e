"""The verify contract shared by every backend: argument checks and the result type.

The checks here read only shapes, dtypes and Python scalars, so a backend can run them without
touching device memory. Checks that need the values (finite rows, token ranges) live with each
implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .config import SamplingConfig
from .random import MAX_OFFSET, MAX_SEED

Array = TypeVar("Array")

MAX_VOCAB = 1 << 30  # tokens are int32 and the kernels index the vocabulary in int32, with a tile of headroom
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")


@dataclass(frozen=True)
class VerifyResult(Generic[Array]):
    num_accepted: Array  # [B] int32, in [0, G]
    tokens: Array  # [B, G+1] int32: the num_accepted + 1 emitted tokens, then -1


@dataclass(frozen=True)
class VerifyShape:
    batch: int  # B
    gamma: int  # G
    vocab: int  # V


def dtype_name(x: Any) -> str:
    """'float32' for a numpy, torch or jax array of float32 (and likewise for other dtypes)."""
    return str(x.dtype).removeprefix("torch.")


def _shape(name: str, x: Any) -> tuple[int, ...]:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(x).__name__}")
    return tuple(int(d) for d in x.shape)


def check_counter(name: str, value: Any, batch: int, limit: int) -> None:
    """seed / offset: a Python int in [0, limit], or an integer array of shape [] or [B]."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an int, not a bool")
    if isinstance(value, int):
        if not 0 <= value <= limit:
            raise ValueError(f"{name}={value} must be in [0, {limit}]")
        return
    if not hasattr(value, "shape"):
        raise ValueError(f"{name}={value!r} must be an int in [0, {limit}] or an integer array of shape [] or [B]")
    shape = _shape(name, value)
    if shape not in ((), (batch,)):
        raise ValueError(f"{name} has shape {list(shape)}; expected an int or shape [] or [{batch}] (one per row)")
    if dtype_name(value) not in INT_DTYPES + ("uint64",):
        raise ValueError(f"{name} has dtype {dtype_name(value)}; expected an integer dtype")


def check_vocab(vocab_size: int, name: str = "vocab_size") -> None:
    if vocab_size > MAX_VOCAB:
        raise ValueError(f"{name}={vocab_size} is not supported: token ids and the verify kernels' vocabulary indices "
                         f"are int32, {name} <= {MAX_VOCAB}")


def check_verify_args(
    target_logits: Any,  # [B, G+1, V]
    draft_tokens: Any,  # [B, G]
    draft_logits: Any | None,  # [B, G, V]
    draft_logprobs: Any | None,  # [B, G]
    temperature: float,
    top_k: int,
    top_p: float,
    seed: Any,
    offset: Any,
    draft_lengths: Any | None = None,  # [B] int in [0, G]
) -> tuple[VerifyShape, SamplingConfig]:
    """Check shapes, dtypes and scalars; raise ValueError naming the argument."""
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    ts = _shape("target_logits", target_logits)
    if len(ts) != 3:
        raise ValueError(f"target_logits has shape {list(ts)}; expected [B, G+1, V]")
    b, g1, v = ts
    if b < 1 or v < 1:
        raise ValueError(f"target_logits has shape {list(ts)}; B and V must be >= 1")
    check_vocab(v, "V (target_logits' last dimension)")
    if g1 < 2:
        raise ValueError(
            f"target_logits has shape {list(ts)}: G+1={g1} positions means G={g1 - 1} drafted tokens; "
            "verify needs G >= 1 (score G drafted positions plus the bonus position)"
        )
    if dtype_name(target_logits) not in FLOAT_DTYPES:
        raise ValueError(f"target_logits has dtype {dtype_name(target_logits)}; expected one of {FLOAT_DTYPES}")
    g = g1 - 1
    xs = _shape("draft_tokens", draft_tokens)
    if xs != (b, g):
        raise ValueError(f"draft_tokens has shape {list(xs)}; expected [B, G] = [{b}, {g}] to match target_logits {list(ts)}")
    if dtype_name(draft_tokens) not in INT_DTYPES:
        raise ValueError(f"draft_tokens has dtype {dtype_name(draft_tokens)}; expected an integer dtype")
    if draft_logits is not None:
        ds = _shape("draft_logits", draft_logits)
        if len(ds) != 3 or ds[:2] != (b, g):
            raise ValueError(f"draft_logits has shape {list(ds)}; expected [B, G, V] = [{b}, {g}, {v}]")
        if ds[2] != v:
            raise ValueError(
                f"draft_logits has vocabulary size {ds[2]} but target_logits has {v}: "
                "draft and target must share one vocabulary"
            )
        if dtype_name(draft_logits) not in FLOAT_DTYPES:
            raise ValueError(f"draft_logits has dtype {dtype_name(draft_logits)}; expected one of {FLOAT_DTYPES}")
    if draft_logprobs is not None:
        if draft_logits is None and not cfg.greedy:
            raise ValueError(
                "draft_logprobs was given without draft_logits: the residual needs the draft's full "
                "distribution; pass draft_logits too, or neither for a deterministic (one-hot) draft"
            )
        ps = _shape("draft_logprobs", draft_logprobs)
        if ps != (b, g):
            raise ValueError(f"draft_logprobs has shape {list(ps)}; expected [B, G] = [{b}, {g}]")
        if dtype_name(draft_logprobs) not in FLOAT_DTYPES:
            raise ValueError(f"draft_logprobs has dtype {dtype_name(draft_logprobs)}; expected one of {FLOAT_DTYPES}")
    check_counter("seed", seed, b, MAX_SEED)
    check_counter("offset", offset, b, MAX_OFFSET)
    if draft_lengths is not None:
        check_draft_lengths_shape(draft_lengths, b, g)
    return VerifyShape(b, g, v), cfg


def check_draft_lengths_shape(draft_lengths: Any, batch: int, gamma: int) -> None:
    """draft_lengths: an integer array [B] (its values, 0 <= L_b <= G, are checked with the data)."""
    ls = _shape("draft_lengths", draft_lengths)
    if ls != (batch,):
        raise ValueError(f"draft_lengths has shape {list(ls)}; expected [B] = [{batch}] (one length in [0, {gamma}] "
                         "per row), or None for G tokens in every row")
    if dtype_name(draft_lengths) not in INT_DTYPES:
        raise ValueError(f"draft_lengths has dtype {dtype_name(draft_lengths)}; expected an integer dtype")


def draft_lengths_problem(lengths: Any, gamma: int) -> str:
    """'' if every L_b is in [0, G], else the error message naming the first bad row (lengths: NumPy [B])."""
    bad = (lengths < 0) | (lengths > gamma)
    if not bad.any():
        return ""
    b = int(bad.nonzero()[0][0])
    return (f"draft_lengths[{b}] = {int(lengths[b])} is outside [0, {gamma}]: row b proposes its first L_b of the "
            f"G = {gamma} drafted tokens (0: plain decoding for that row)")


def check_tree_args(
    target_logits: Any,  # [B, N+1, V]
    tree_tokens: Any,  # [B, N]
    tree_parents: Any,  # [B, N]
    tree_sizes: Any | None,  # [B]
    seed: Any,
    offset: Any,
) -> tuple[int, int, int]:
    """Tree verification's shapes, dtypes and counters (``flashspec.tree``); returns (B, N, V). Raises ValueError
    naming the argument."""
    ts = _shape("target_logits", target_logits)
    if len(ts) != 3 or ts[0] < 1 or ts[2] < 1:
        raise ValueError(f"target_logits has shape {list(ts)}; expected [B, N+1, V] with B, V >= 1")
    b, n1, v = ts
    check_vocab(v, "V (target_logits' last dimension)")
    if n1 < 2:
        raise ValueError(f"target_logits has shape {list(ts)}: N+1 = {n1} row is the root's alone, an empty tree; a "
                         "tree needs at least one node (a step without one is plain decoding)")
    if dtype_name(target_logits) not in FLOAT_DTYPES:
        raise ValueError(f"target_logits has dtype {dtype_name(target_logits)}; expected one of {FLOAT_DTYPES}")
    for name, a in (("tree_tokens", tree_tokens), ("tree_parents", tree_parents)):
        if _shape(name, a) != (b, n1 - 1):
            raise ValueError(f"{name} has shape {list(_shape(name, a))}; expected [B, N] = [{b}, {n1 - 1}] to match "
                             f"target_logits {list(ts)} (one row per node plus the root's)")
        if dtype_name(a) not in INT_DTYPES:
            raise ValueError(f"{name} has dtype {dtype_name(a)}; expected an integer dtype")
    bad_sizes = tree_sizes is not None and _shape("tree_sizes", tree_sizes) != (b,)
    if bad_sizes or (tree_sizes is not None and dtype_name(tree_sizes) not in INT_DTYPES):
        raise ValueError(f"tree_sizes must be an integer array [B] = [{b}] (row b's tree is its first tree_sizes[b] "
                         "nodes), or None for N nodes in every row")
    check_counter("seed", seed, b, MAX_SEED)
    check_counter("offset", offset, b, MAX_OFFSET)
    return b, n1 - 1, v
