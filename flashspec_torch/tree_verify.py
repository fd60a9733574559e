"""``verify_tree`` for torch tensors: the NumPy oracle (``flashspec.tree``) batched, on any device.

The same rule and the same float32 arithmetic as the oracle (its docstring: sequential elimination over
deterministic children, ``log u < log p(c_k) - log M_k`` with M_k the non-children's mass plus the children
not yet tried, Gumbel-max over the residual at the stop slot), with the counter generator's TREE_ACCEPT and
TREE_FINAL streams, so that it emits the oracle's tokens for the same (seed, offset).

Vectorised over the batch: the walk goes one depth level at a time; at each level every row's current
slot offers its children (a table padded to the widest node), every child's test is computed at once
(each node has its own uniform, so the first child that passes is the one sequential elimination
accepts), and the residual draw is one Gumbel-max over all rows' stop slots at the end. No Python loop
over rows; the loops are over depth levels and over the children of one node (K, small).

Host synchronisations: the checks (``validate``: the tree's values, the logits, the residual's mass), and
the widest node and the deepest path (output shapes) unless the caller gives them (``widest=``, ``depth=``).
With ``validate=False``, ``widest`` and ``depth`` given, nothing is read to the host (an engine step's CUDA
graph captures it). Not built here: a fused kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from flashspec.config import SamplingConfig
from flashspec.contract import check_tree_args
from flashspec.tree import MAX_TREE_DEPTH, TreeVerifyResult, tree_depths

from . import random as rng
from .reference import Counters, log_probs
from .tree_score import slot_ancestors
from .verify import check_logits, check_on_device


def verify_tree(
    target_logits: torch.Tensor,  # [B, N+1, V] float: the root's row, then node j's at j + 1
    tree_tokens: torch.Tensor,  # [B, N] int
    tree_parents: torch.Tensor,  # [B, N] int in [-1, j): -1 the root
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | torch.Tensor = 0,  # int, or int tensor [] or [B] (per-row seeds: generator row 0)
    offset: int | torch.Tensor = 0,  # int, or int tensor [] or [B]
    tree_sizes: torch.Tensor | None = None,  # [B] int in [0, N]; None: all N
    max_depth: int = MAX_TREE_DEPTH,
    validate: bool = True,  # False: the tree and logits are trusted (an engine step built and screened them)
    widest: int | None = None,  # the most children a node may have (K of the children table); None: read
    depth: int | None = None,  # the deepest path the output holds (D); None: the deepest tree's, read
) -> TreeVerifyResult:
    """The oracle's ``verify_tree`` on tensors; the result's fields are int32 tensors on the logits' device:
    num_accepted [B], tokens [B, D+1] (the path's tokens, y, then -1), path [B, D] (D: ``depth``, or the
    deepest tree's). ``widest`` / ``depth`` larger than the tree's change nothing but D (the path's -1 padding);
    with ``validate`` a tree wider or deeper than them is refused, without it they must hold."""
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    b, n, v = check_tree_args(target_logits, tree_tokens, tree_parents, tree_sizes, seed, offset)
    check_tree_tensors(target_logits, tree_tokens, tree_parents, tree_sizes, seed, offset)
    dev = target_logits.device
    sizes = torch.full((b,), n, dtype=torch.int64, device=dev) if tree_sizes is None else tree_sizes.long()
    tokens, parents = clean_tree(tree_tokens.long(), tree_parents.long(), sizes)  # [B, N] each
    z = target_logits.float()
    if validate:
        deepest = int(check_tree_values(tree_tokens, tree_parents, sizes, tokens, parents, v, max_depth).max())
        check_logits("target_logits", z)
        check_bounds(deepest, depth, "depth", "deepest path")
    elif depth is None:
        deepest = int(real_depths(parents, sizes).max())
    kids = children_table(parents, sizes, widest, validate)  # [B, N+1, K]
    d = deepest if depth is None else depth
    if cfg.greedy:
        path, stop = walk_greedy(z, tokens, kids, d)
        y = z[torch.arange(b, device=dev), stop].argmax(-1)
    else:
        c = Counters.make(seed, offset, b, dev)
        log_p = log_probs(z, cfg)  # [B, N+1, V]
        log_u = torch.log(c.uniform(torch.arange(1, n + 1, device=dev)[None], 0, rng.TREE_ACCEPT))  # [B, N]
        path, stop = walk(log_p, tokens, kids, log_u, d)
        y = draw_residual(log_p, tokens, kids, stop, c, validate)
    return emit(tokens, path, y)


# ----------------------------------------------------------------------------- checks


def check_tree_tensors(z, tokens, parents, sizes, seed, offset) -> None:
    """Every array argument is a torch tensor on target_logits' device."""
    named = {"target_logits": z, "tree_tokens": tokens, "tree_parents": parents, "tree_sizes": sizes}
    check_on_device(named, seed, offset, "flashspec_torch.tree_verify", "flashspec.tree.verify_tree")


def check_bounds(actual: int, given: int | None, name: str, what: str) -> None:
    if given is not None and actual > given:
        raise ValueError(f"{name}={given}: the tree's {what} is {actual}; pass {name} >= {actual} (or None)")


def clean_tree(tokens, parents, sizes):  # [B, N] int64 x2, [B] -> [B, N] x2
    """Nodes past tree_sizes (padding, never read) become token 0 under the root; parents clamped into range."""
    n = tokens.shape[1]
    j = torch.arange(n, device=tokens.device)[None]
    real = j < sizes[:, None]
    tokens = torch.where(real, tokens, 0)
    parents = torch.where(real, parents, -1)
    return tokens, torch.minimum(parents.clamp(min=-1), j - 1)


def real_depths(parents, sizes) -> torch.Tensor:  # [B, N] (cleaned), [B] -> [B, N] int64
    """Each node's depth (the root's children: 1), 0 past tree_sizes: its ancestors in the scoring pass's layout
    (``tree_score.slot_ancestors``), the root's slot not counted."""
    return slot_ancestors(parents, sizes).sum(-1)[:, 1:] - 1


def earlier_siblings(parents, real) -> torch.Tensor:  # [B, N], [B, N] bool -> [B, N, N] bool
    """[b, i, m]: node m is a real sibling of node i that comes before it (same parent, m < i)."""
    j = torch.arange(parents.shape[1], device=parents.device)[None]
    return (parents[:, :, None] == parents[:, None]) & real[:, None] & (j[:, None] < j[..., None])


def check_tree_values(raw_tokens, raw_parents, sizes, tokens, parents, v: int, max_depth: int) -> torch.Tensor:
    """The oracle's tree checks, vectorised; on a bad tree the oracle's own check of the first bad row raises its
    message. Returns each node's depth [B, N] (0 past tree_sizes)."""
    n = tokens.shape[1]
    j = torch.arange(n, device=tokens.device)[None]
    real = j < sizes[:, None]  # [B, N]
    t, a = raw_tokens.long(), raw_parents.long()
    bad = real & ((t < 0) | (t >= v) | (a < -1) | (a >= j))
    twin = earlier_siblings(parents, real) & (tokens[:, :, None] == tokens[:, None])  # [B, N, N]
    bad |= real & twin.any(-1)  # an earlier sibling, same token
    depth = real_depths(parents, sizes)
    bad |= depth > max_depth
    bad_row = bad.any(-1) | (sizes < 0) | (sizes > n)  # [B]
    if bool(bad_row.any()):
        r = int(bad_row.nonzero()[0, 0])
        tree_depths(raw_tokens[r].cpu().numpy(), raw_parents[r].cpu().numpy(), int(sizes[r]), v, max_depth, r)
        raise AssertionError(f"tree row {r} failed the vectorised checks but passed the oracle's")  # never reached
    return depth


# ----------------------------------------------------------------------------- the walk


def children_table(parents, sizes, widest: int | None = None, validate: bool = True) -> torch.Tensor:
    # [B, N], [B] -> [B, N+1, K] int64, -1 padded
    """kids[b, s, k]: the k-th child (node order) of slot s (0: the root, j + 1: node j); K = ``widest``, or the
    widest node's children (read to the host) when None."""
    b, n = parents.shape
    j = torch.arange(n, device=parents.device)[None]
    real = j < sizes[:, None]  # [B, N]
    rank = earlier_siblings(parents, real).sum(-1)  # [B, N]
    if widest is None or validate:
        most = int(torch.where(real, rank + 1, 0).max()) if n else 0
        check_bounds(most, widest, "widest", "widest node's children")
    k = most if widest is None else widest
    flat = torch.where(real, (parents + 1) * k + rank, (n + 1) * k)  # padding lands in a dropped column
    kids = torch.full((b, (n + 1) * k + 1), -1, dtype=torch.int64, device=parents.device)
    kids.scatter_(1, flat, j.expand(b, n).clone())
    return kids[:, :-1].reshape(b, n + 1, k)


def walk(log_p, tokens, kids, log_u, depth: int):  # [B, N+1, V], [B, N], [B, N+1, K], [B, N]
    """The accepted path [B, D] (-1 padded) and the stop slot [B], one level at a time."""
    b = log_p.shape[0]
    rows = torch.arange(b, device=log_p.device)
    slot = torch.zeros(b, dtype=torch.int64, device=log_p.device)
    path = torch.full((b, depth), -1, dtype=torch.int64, device=log_p.device)
    for level in range(depth):
        nodes = kids[rows, slot]  # [B, K]
        ok = nodes >= 0
        safe = nodes.clamp(min=0)
        kid_tokens = torch.where(ok, tokens.gather(1, safe), 0)  # [B, K]
        log_pc = child_log_probs(log_p[rows, slot], kid_tokens, ok)  # [B, K]
        passed = ok & (log_u.gather(1, safe) < log_pc)
        slot = descend(passed, nodes, slot, path, level)
    return path, slot


def child_log_probs(lp, kid_tokens, ok) -> torch.Tensor:  # [B, V], [B, K], [B, K] -> [B, K] float32
    """log p_cur(c_k) after c_0..c_{k-1} were rejected, as the oracle's ``child_log_prob``: log p(c_0) for k = 0,
    else log p(c_k) - log(R + p(c_k) + ... + p(c_{K-1})) in float32, R the non-children's mass, the children's
    sum left to right."""
    k = kid_tokens.shape[1]
    if k <= 1:
        return lp.gather(1, kid_tokens)
    p = torch.exp(lp)  # [B, V]
    is_child = child_mask(kid_tokens, ok, p.shape[1])
    rest = torch.where(is_child, 0.0, p).sum(-1)  # [B]
    pc = torch.where(ok, p.gather(1, kid_tokens), 0.0)  # [B, K]
    out = [lp.gather(1, kid_tokens[:, :1])[:, 0]]
    for i in range(1, k):
        tail = pc[:, i]
        for m in range(i + 1, k):
            tail = tail + pc[:, m]
        out.append(torch.log(pc[:, i]) - torch.log(rest + tail))
    return torch.stack(out, 1)


def child_mask(kid_tokens, ok, v: int) -> torch.Tensor:  # [B, K], [B, K] -> [B, V] bool
    """True at the tokens of the real children (padding goes to a dropped column V)."""
    b = kid_tokens.shape[0]
    mask = torch.zeros((b, v + 1), dtype=torch.bool, device=kid_tokens.device)
    return mask.scatter_(1, torch.where(ok, kid_tokens, v), True)[:, :v]


def descend(passed, nodes, slot, path, level: int) -> torch.Tensor:  # [B, K] bool, [B, K], [B] -> [B]
    """Rows with a passing child go into the first one (writing path[:, level]); the others stay."""
    go = passed.any(-1)
    first = nodes.gather(1, passed.to(torch.int8).argmax(-1, keepdim=True))[:, 0]
    path[:, level] = torch.where(go, first, -1)
    return torch.where(go, first + 1, slot)


def walk_greedy(z, tokens, kids, depth: int):  # [B, N+1, V], [B, N], [B, N+1, K]
    """T = 0: descend into the first child equal to argmax z (lowest index on ties), else stop."""
    b = z.shape[0]
    rows = torch.arange(b, device=z.device)
    best = z.argmax(-1)  # [B, N+1]
    slot = torch.zeros(b, dtype=torch.int64, device=z.device)
    path = torch.full((b, depth), -1, dtype=torch.int64, device=z.device)
    for level in range(depth):
        nodes = kids[rows, slot]  # [B, K]
        ok = nodes >= 0
        kid_tokens = tokens.gather(1, nodes.clamp(min=0))
        slot = descend(ok & (kid_tokens == best[rows, slot][:, None]), nodes, slot, path, level)
    return path, slot


def draw_residual(log_p, tokens, kids, stop, c: Counters, validate: bool = True) -> torch.Tensor:
    # [B, N+1, V], ..., [B] -> y [B]
    """Gumbel-max over p at the stop slot with its children zeroed (TREE_FINAL noise at position = the slot);
    ``validate`` checks on the host that some mass is left (it always is: a rejected child never holds all of it)."""
    b, _, v = log_p.shape
    rows = torch.arange(b, device=log_p.device)
    nodes = kids[rows, stop]  # [B, K]
    ok = nodes >= 0
    lp = log_p[rows, stop]  # [B, V]
    is_child = child_mask(tokens.gather(1, nodes.clamp(min=0)), ok, v)
    g = rng.gumbel_from_uniform(c.uniform(stop[:, None], torch.arange(v, device=lp.device)[None], rng.TREE_FINAL))
    key = torch.where(is_child, float("-inf"), lp) + g
    if validate and not bool(torch.isfinite(key).any(-1).all()):
        raise AssertionError("tree verification's residual has no mass: every token was a rejected child")
    return key.argmax(-1)


def emit(tokens, path, y) -> TreeVerifyResult:  # [B, N], [B, D], [B]
    b, d = path.shape
    num = (path >= 0).sum(-1)  # [B]
    path_tokens = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), -1)  # [B, D]
    out = torch.cat([path_tokens, torch.full_like(y[:, None], -1)], 1).scatter(1, num[:, None], y[:, None])
    return TreeVerifyResult(num.to(torch.int32), out.to(torch.int32), path.to(torch.int32))


def as_numpy_result(res: TreeVerifyResult) -> TreeVerifyResult:
    """The fields as NumPy int32 arrays (the oracle's form)."""
    return TreeVerifyResult(*(np.asarray(t.cpu()) for t in (res.num_accepted, res.tokens, res.path)))
