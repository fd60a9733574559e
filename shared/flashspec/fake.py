"""A NumPy backend whose "models" are Markov chains: fixed next-token logit tables.

It lets the loop's exactness be checked against an analytic law, fast, with no real model:
the target's next-token logits are ``target[last_token]``; a model draft's are ``table[last]``;
a deterministic draft maps the last token to a fixed guess (one-hot q, like n-gram lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .backend import StepView
from .config import SamplingConfig
from .contract import VerifyResult
from .random import FINAL
from .reference import log_probs, sample
from .reference import verify as reference_verify


def chain_law(target: np.ndarray, sampling: SamplingConfig, start: int, length: int) -> np.ndarray:  # [V] * length
    """P(t_1..t_L) of sampling the target chain ``target`` [V, V] token by token from ``start``."""
    v = target.shape[0]
    p = np.exp(log_probs(target, sampling).astype(np.float64))  # [V, V]
    law = np.zeros((v,) * length)
    for idx in np.ndindex(*law.shape):
        prev, prob = start, 1.0
        for t in idx:
            prob *= p[prev, t]
            prev = t
        law[idx] = prob
    return law


@dataclass(frozen=True)
class ModelDraft:
    name: str
    logits: np.ndarray  # [V, V]: next-token logits given the last token


@dataclass(frozen=True)
class LookupDraft:
    name: str
    guess: np.ndarray  # [V] int: the proposed next token given the last token


@dataclass(frozen=True)
class Proposal:
    tokens: np.ndarray  # [B, G]
    logits: np.ndarray | None  # [B, G, V], None for a deterministic draft
    last: np.ndarray  # [B]: each row's last committed token


@dataclass(frozen=True)
class DoneHandle:
    view: StepView

    def fetch(self) -> StepView:
        return self.view


class MarkovBackend:
    def __init__(self, target: np.ndarray, drafts: Sequence[ModelDraft | LookupDraft], eos: int | None = None):
        self.target = np.asarray(target, np.float32)  # [V, V]
        self.drafts = list(drafts)
        self.draft_names = [d.name for d in self.drafts]
        self.eos = eos
        self.free_gamma = 0  # score_free's G (0: off)

    def score_free(self, gamma: int) -> int:
        """``flashspec.backend.FreeScoring``: score every LookupDraft (recomputable from the last token) on each step."""
        self.free_gamma = gamma
        return sum(isinstance(d, LookupDraft) for d in self.drafts) if gamma else 0

    def prefill(self, prompts, max_new_tokens):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must be non-empty token lists")
        self.last = np.array([p[-1] for p in prompts])
        self.out: list[list[int]] = [[] for _ in prompts]
        self.max_new = max_new_tokens
        self.done = np.zeros(len(prompts), bool)

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        return 0  # nothing is compiled or captured

    def step(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> DoneHandle:
        proposal = self.draft(arm, gamma, sampling, seed, offset)
        return self.commit(self.verify(self.score(proposal), proposal, sampling, seed, offset))

    def decode_one(self, sampling: SamplingConfig, seed, offset: int) -> DoneHandle:
        """The target's next token (FINAL stream, position 0), committed as a step with nothing accepted."""
        y, _ = sample(self.target[self.last], sampling, seed, offset, position=0, stream=FINAL)
        tokens = np.stack([y, np.full_like(y, -1)], 1)
        return self.commit(VerifyResult(np.zeros(len(y), np.int64), tokens))

    # -- the step's parts (this backend's own; the loop calls ``step``)

    def draft(self, arm, gamma, sampling: SamplingConfig, seed, offset) -> Proposal:
        d = self.drafts[arm]
        b = len(self.last)
        prev = self.last.copy()
        xs, ws = [], []
        for i in range(gamma):
            if isinstance(d, LookupDraft):
                x_i = d.guess[prev]
            else:
                w_i = d.logits[prev]
                x_i, _ = sample(w_i, sampling, seed, offset, position=i)
                ws.append(w_i)
            xs.append(x_i)
            prev = x_i
        tokens = np.stack(xs, 1).reshape(b, gamma)
        return Proposal(tokens, np.stack(ws, 1) if ws else None, self.last.copy())

    def score(self, proposal: Proposal) -> np.ndarray:  # [B, G+1, V]
        prev = np.concatenate([proposal.last[:, None], proposal.tokens], 1)
        return self.target[prev]

    def verify(self, target_logits, proposal: Proposal, sampling: SamplingConfig, seed, offset) -> VerifyResult:
        return reference_verify(
            target_logits, proposal.tokens, proposal.logits,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed, offset=offset,
        )

    def commit(self, result: VerifyResult) -> DoneHandle:
        active = ~self.done
        free = self.free_scores(result) if self.free_gamma else (None, None)
        for b in np.nonzero(active)[0]:
            n = int(result.num_accepted[b])
            new = [int(t) for t in result.tokens[b, : n + 1]]
            if self.eos is not None and self.eos in new:
                new = new[: new.index(self.eos) + 1]
                self.done[b] = True
            room = self.max_new - len(self.out[b])
            self.out[b].extend(new[:room])
            self.last[b] = self.out[b][-1]
            self.done[b] |= len(self.out[b]) >= self.max_new
        return DoneHandle(StepView(np.asarray(result.num_accepted).copy(), active, self.done.copy(),
                                   free_scored=free[0], free_accepted=free[1]))

    def free_scores(self, result: VerifyResult) -> tuple[np.ndarray, np.ndarray]:  # [D, B] each
        """(tokens scored, leading matches) of each LookupDraft's proposal from the rows' last tokens against
        the step's emitted tokens (min(G, accepted + 1) scored), as flashspec_torch.free does."""
        n = np.asarray(result.num_accepted, np.int64)
        scored = np.zeros((len(self.drafts), len(n)), np.int64)
        accepted = np.zeros_like(scored)
        for d, draft in enumerate(self.drafts):
            if not isinstance(draft, LookupDraft):
                continue
            prev = self.last.copy()
            scored[d] = np.minimum(n + 1, self.free_gamma)
            alive = np.ones(len(n), bool)
            for i in range(self.free_gamma):
                prev = draft.guess[prev]
                alive &= (i < scored[d]) & (prev == np.asarray(result.tokens)[:, min(i, result.tokens.shape[1] - 1)])
                accepted[d] += alive
        return scored, accepted

    def outputs(self) -> list[list[int]]:
        return [list(o) for o in self.out]
