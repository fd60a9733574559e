"""The research path: a whole generation in one ``jax.lax.while_loop``, zero host round trips.

Prefill, then per step: the policy chooses an arm on the device (its state is arrays), the arm's
draft runs through ``lax.switch``, the target scores, verify decides, commit appends, and the
previous step's outcome is observed. The loop body is the host backend's own ``Steps`` methods,
so both paths run the same code; the function is pure, so ``jax.vmap`` over seeds measures
acceptance statistics of many runs in one call (``run_many``).

Correspondence with the host loop (``flashspec.loop.speculate``), which reads results one step
late: at step t the host calls ``choose()`` before it observes step t-1, so the choice sees steps
0..t-2. Here the body likewise chooses first and then observes the pending step t-1. The host
also runs one step more than needed when the last row finishes (it learns of it one step late);
that step has no active row and changes nothing, so the tokens are the same. Observations are
per active row (each row one trial), as in ``flashspec.loop.observe``.

Policies on the device: ``fixed``, ``ucb1`` (deterministic given the observations: the same
choices as ``flashspec.bandits.UCB1`` with ``objective="acceptance"``, up to float32 rounding of
the index at near-ties) and ``thompson-token`` (the same posterior as the host's, sampled with
``jax.random``, so its draws, unlike its law, differ from the host's NumPy generator). A
throughput objective needs step times, which the device loop does not measure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flashspec.config import SamplingConfig
from flashspec.loop import StepRecord

from .backend import JaxBackend
from .drafts import Seeds, make_seeds
from .model import layer_shapes
from .steps import State, batch_shapes


class BanditState(NamedTuple):
    pulls: jax.Array  # [K] float32: row-trials per arm
    reward: jax.Array  # [K] float32: sum of accepted / drafted fractions (UCB1) or Beta a (Thompson)
    failures: jax.Array  # [K] float32: Beta b (Thompson)
    key: jax.Array  # [2] uint32: the policy's own random stream (never the verifier's)


class DevicePolicy:
    """Arm choice on the device; ``observe`` takes one step's per-row counts."""

    name = "policy"

    def init(self, num_arms: int, seed: int | jax.Array = 0) -> BanditState:
        z = jnp.zeros(num_arms, jnp.float32)
        return BanditState(z, z, z, jax.random.key_data(jax.random.PRNGKey(seed)))

    def choose(self, s: BanditState) -> jax.Array:
        raise NotImplementedError

    def observe(self, s: BanditState, arm, n, active, gamma: int) -> BanditState:  # n, active [B]
        rows = jnp.sum(active).astype(jnp.float32)
        frac = jnp.sum(jnp.where(active, n, 0) / np.float32(gamma))
        reject = jnp.sum(active & (n < gamma)).astype(jnp.float32)
        accepted = jnp.sum(jnp.where(active, n, 0)).astype(jnp.float32)
        return self.update(s, arm, rows, frac, accepted, reject)

    def update(self, s, arm, rows, frac, accepted, reject) -> BanditState:
        return s._replace(pulls=s.pulls.at[arm].add(rows))


@dataclass(frozen=True)
class Fixed(DevicePolicy):
    arm: int = 0
    name = "fixed"

    def choose(self, s):
        return jnp.int32(self.arm)


@dataclass(frozen=True)
class UCB1(DevicePolicy):
    """Each arm once, then the largest mean + sqrt(2 ln t / n_k) (acceptance objective)."""

    name = "ucb1"

    def choose(self, s):
        n = s.pulls
        t = jnp.maximum(jnp.sum(n), 1.0)
        index = s.reward / n + jnp.sqrt(2.0 * jnp.log(t) / n)
        return jnp.argmax(jnp.where(n == 0, jnp.inf, index)).astype(jnp.int32)

    def update(self, s, arm, rows, frac, accepted, reject):
        return s._replace(pulls=s.pulls.at[arm].add(rows), reward=s.reward.at[arm].add(frac))


@dataclass(frozen=True)
class ThompsonToken(DevicePolicy):
    """Beta(a, b) on per-token acceptance: a += accepted tokens, b += 1 per rejecting row."""

    prior_a: float = 1.0
    prior_b: float = 1.0
    name = "thompson-token"

    def choose(self, s):
        key = jax.random.fold_in(jax.random.wrap_key_data(s.key), jnp.sum(s.pulls).astype(jnp.int32))
        theta = jax.random.beta(key, self.prior_a + s.reward, self.prior_b + s.failures)
        return jnp.argmax(theta).astype(jnp.int32)  # E[accepted]/G is increasing in theta

    def update(self, s, arm, rows, frac, accepted, reject):
        return s._replace(pulls=s.pulls.at[arm].add(rows), reward=s.reward.at[arm].add(accepted),
                          failures=s.failures.at[arm].add(reject))


DEVICE_POLICIES = {"fixed": Fixed, "ucb1": UCB1, "thompson-token": ThompsonToken}


class Carry(NamedTuple):
    step: jax.Array  # [] int32
    state: State
    bandit: BanditState
    pending: tuple  # (arm [], num_accepted [B], active [B], valid [])
    arms: jax.Array  # [max_steps] int32: the arm of each step, -1 after the end
    accepted: jax.Array  # [max_steps] int32: accepted tokens over the active rows
    rows: jax.Array  # [max_steps] int32: active rows


class Whole:
    """Whole generations on the device over a backend's steps and weights. ``unstack_weights``
    (None: where the target's layers are unrolled): the layer weights sliced once before the loop
    (``unstacked``), so the body does not copy them out of the loop-carried stacks every iteration;
    it holds a second copy of the layer weights during the call (docs/jax.md has the measurement).
    Either setting gives the same outputs."""

    def __init__(self, backend: JaxBackend, unstack_weights: bool | None = None):
        if backend.steps is None:
            raise ValueError("the backend needs its drafts (backend.set_drafts) first")
        if unstack_weights not in (None, True, False):
            raise TypeError(f"unstack_weights={unstack_weights!r} must be True, False or None (by the layer loop)")
        scan = backend.draft_models[0].uses_scan()
        if unstack_weights and scan:
            raise ValueError("unstack_weights=True needs the unrolled layer loop (Llama.scan_layers=False, or a GPU "
                             "and layers of SCAN_BELOW_BYTES or more); the scan reads the stacked weights")
        self.backend, self.steps = backend, backend.steps
        self.unstack = not scan if unstack_weights is None else unstack_weights
        self.run_jit = jax.jit(self.generate, static_argnames=("prefix", "gamma", "cfg", "policy", "max_steps"))
        self.many_jit = jax.jit(self.generate_many, static_argnames=("prefix", "gamma", "cfg", "policy", "max_steps"))

    def generate_many(self, weights, tokens, lengths, max_new, seeds: Seeds, policy_seeds, first_offset, **static):
        """``generate`` vmapped over runs: seeds [R] or [R, B], policy_seeds [R]."""
        one = lambda s, ps: self.generate(weights, tokens, lengths, max_new, s, ps, first_offset, **static)  # noqa: E731
        return jax.vmap(one)(seeds, policy_seeds)

    def generate(self, weights, tokens, lengths, max_new, seeds: Seeds, policy_seed, first_offset, *,
                 prefix: int, gamma: int, cfg: SamplingConfig, policy: DevicePolicy, max_steps: int):
        steps = self.steps
        weights = unstacked(weights, self.backend.config) if self.unstack else weights
        uniform = not all(d.deterministic for d in steps.drafts)
        draft = steps.draft_uniform if uniform else steps.draft
        branches = [functools.partial(draft, arm, gamma=gamma, cfg=cfg) for arm in range(len(steps.drafts))]
        state = steps.prefill(weights, tokens, lengths, max_new, prefix)
        b = tokens.shape[0]
        none = (jnp.int32(0), jnp.zeros(b, jnp.int32), jnp.zeros(b, bool), jnp.bool_(False))
        minus = jnp.full(max_steps, -1, jnp.int32)
        carry = Carry(jnp.int32(0), state, policy.init(len(branches), policy_seed), none, minus, minus * 0, minus * 0)

        def cond(c: Carry):
            return (c.step < max_steps) & ~jnp.all(c.state.seqs.done)

        def body(c: Carry):
            arm = policy.choose(c.bandit)
            offset = first_offset + c.step
            run = lambda i: lambda w, s: branches[i](w, s, seeds=seeds, offset=offset)  # noqa: E731
            proposal, state = lax.switch(arm, [run(i) for i in range(len(branches))], weights, c.state)
            z, state = steps.score(weights, state, proposal)
            state, out = steps.commit(state, steps.verify(z, proposal, cfg, seeds, offset))
            p_arm, p_n, p_active, p_valid = c.pending
            observed = policy.observe(c.bandit, p_arm, p_n, p_active, gamma)
            bandit = jax.tree.map(lambda new, old: jnp.where(p_valid, new, old), observed, c.bandit)
            live = out.active
            return Carry(
                c.step + 1, state, bandit, (arm, out.num_accepted, live, jnp.bool_(True)),
                c.arms.at[c.step].set(arm),
                c.accepted.at[c.step].set(jnp.sum(jnp.where(live, out.num_accepted, 0))),
                c.rows.at[c.step].set(jnp.sum(live)),
            )

        c = lax.while_loop(cond, body, carry)
        seqs = c.state.seqs
        return seqs.tokens, seqs.prompt_len, seqs.length, c.arms, c.accepted, c.rows

    # -- host front ends

    def inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int):
        tokens, lengths, prefix = batch_shapes(prompts, max_new_tokens)
        return jnp.asarray(tokens), jnp.asarray(lengths), prefix

    def run(self, prompts, *, max_new_tokens: int, gamma: int, sampling: SamplingConfig, seed,
            policy: DevicePolicy, policy_seed: int = 0, max_steps: int | None = None):
        """One generation; returns (new tokens per row, StepRecords) like ``flashspec.loop.speculate``."""
        tokens, lengths, prefix = self.inputs(prompts, max_new_tokens)
        seeds = make_seeds(seed if isinstance(seed, (int, np.integer)) else np.asarray(seed))
        out = self.run_jit(self.backend.weights, tokens, lengths, max_new_tokens, seeds, policy_seed, 0,
                           prefix=prefix, gamma=gamma, cfg=sampling, policy=policy,
                           max_steps=max_steps or max_new_tokens)
        return unpack(*(np.asarray(a) for a in out), gamma)

    def run_many(self, prompts, seeds: np.ndarray, *, max_new_tokens: int, gamma: int, sampling: SamplingConfig,
                 policy: DevicePolicy, max_steps: int | None = None) -> dict:
        """``jax.vmap`` over runs: seeds [R] (one per run, shared by the batch rows) or [R, B].
        Returns per run the new tokens and the arms / accepted / active-row counts per step."""
        tokens, lengths, prefix = self.inputs(prompts, max_new_tokens)
        seeds = np.asarray(seeds, dtype=np.uint64)
        lo, hi = make_seeds(seeds)
        out = self.many_jit(self.backend.weights, tokens, lengths, max_new_tokens, Seeds(lo, hi),
                            jnp.asarray(seeds.reshape(len(seeds), -1)[:, 0].astype(np.uint32)), 0,
                            prefix=prefix, gamma=gamma, cfg=sampling, policy=policy,
                            max_steps=max_steps or max_new_tokens)
        tok, start, end, arms, acc, rows = (np.asarray(a) for a in out)
        runs = [unpack(tok[r], start[r], end[r], arms[r], acc[r], rows[r], gamma) for r in range(len(seeds))]
        return {"tokens": [r[0] for r in runs], "records": [r[1] for r in runs],
                "arms": arms, "accepted": acc, "rows": rows}


def unstacked(weights: list, config) -> list:
    """The target's layer weights (``weights[0]``, each [L, ...]) as tuples of L per-layer arrays,
    sliced once, before the loop: the unrolled layers then read whole arrays in the loop's body,
    not static slices of loop-carried stacks (see docs/jax.md on what XLA does with those)."""
    names = set(layer_shapes(config))

    def split(path, a):
        return tuple(a[i] for i in range(a.shape[0])) if path[0].key in names else a

    return [jax.tree_util.tree_map_with_path(split, weights[0]), *weights[1:]]


def unpack(tokens, start, end, arms, accepted, rows, gamma: int):
    outs = [tokens[b, start[b] : end[b]].tolist() for b in range(len(start))]
    records = [
        StepRecord(int(a), gamma * int(r), int(n), int(n) + int(r), int(r), 0.0)
        for a, n, r in zip(arms, accepted, rows) if a >= 0 and r > 0
    ]
    return outs, records
