"""The torch backend: implements ``flashspec.backend.Backend`` over our Llama model.

Everything a step needs stays on the device: the token history, each row's length, the finished
flags. ``commit`` starts an asynchronous copy of the step's small results, which the loop reads one
step later (``StepHandle.fetch``), so the host never waits for the device inside a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flashspec.backend import StepView
from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult
from flashspec.random import FINAL

from .drafts import LookupDraft, ModelDraft, Proposal, Sequences
from .model import Llama
from .sampling import sample
from .verify import verify


@dataclass
class AsyncHandle:
    """Device results copied to the host without blocking; ``fetch`` waits for that copy only."""

    num_accepted: torch.Tensor
    active: torch.Tensor
    done: torch.Tensor
    event: torch.cuda.Event | None

    def fetch(self) -> StepView:
        if self.event is not None:
            self.event.synchronize()
        return StepView(self.num_accepted.numpy().copy(), self.active.numpy().copy(), self.done.numpy().copy())


class HostMirror:
    """Two sets of pinned host buffers, used in turn: the loop reads step t-1 before step t+1 is
    committed, so a slot is never overwritten before it was read. (Allocating pinned memory every
    step costs milliseconds; pageable memory would make the copy block the host.)"""

    def __init__(self, batch: int, device: torch.device):
        self.device, self.turn = device, 0
        if device.type == "cuda":
            self.slots = [
                [torch.empty(batch, dtype=dt, pin_memory=True) for dt in (torch.int32, torch.bool, torch.bool)]
                for _ in range(2)
            ]

    def start(self, num_accepted, active, done) -> AsyncHandle:
        if self.device.type != "cuda":
            return AsyncHandle(num_accepted.clone(), active.clone(), done.clone(), None)
        slot = self.slots[self.turn]
        self.turn ^= 1
        for h, t in zip(slot, (num_accepted.to(torch.int32), active, done)):
            h.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return AsyncHandle(*slot, event)


class TorchBackend:
    def __init__(self, target: Llama, drafts: Sequence[ModelDraft | LookupDraft], eos_ids: Sequence[int] = (), verify_impl: str | None = None):
        vocab = target.config.vocab_size
        for d in drafts:
            if isinstance(d, ModelDraft) and d.model.config.vocab_size != vocab:
                raise ValueError(
                    f"draft {d.name!r} has vocabulary size {d.model.config.vocab_size} but the target has {vocab}: "
                    "a draft must share the target's tokenizer"
                )
        self.target, self.drafts = target, list(drafts)
        self.draft_names = [d.name for d in self.drafts]
        self.device = target.embed.weight.device
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], dtype=torch.int64, device=self.device)
        self.verify_impl = verify_impl

    # -- the batch

    def prefill(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, margin: int = 66) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        b, longest = len(prompts), max(len(p) for p in prompts)
        s_max = longest + max_new_tokens + margin
        limit = self.target.config.max_position_embeddings
        if longest + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {limit} tokens"
            )
        dev = self.device
        tokens = torch.zeros((b, s_max), dtype=torch.int64, device=dev)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.int64)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=dev)
        self.seqs = Sequences(tokens, lengths, longest)
        self.prompt_len = lengths.clone()
        self.max_new = max_new_tokens
        self.done = torch.zeros(b, dtype=torch.bool, device=dev)
        self.cache = self.target.new_cache(b, s_max)
        if longest > 1:  # K/V of every prompt token but the last (the first step feeds the last)
            pos = torch.arange(longest - 1, device=dev)[None].expand(b, -1)
            self.target(tokens[:, : longest - 1], pos, self.cache, longest - 1, logits_last=0)
        for d in self.drafts:
            d.start(b, s_max)
        self.mirror = HostMirror(b, dev)

    def draft(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> Proposal:
        return self.drafts[arm].propose(self.seqs, gamma, sampling, seed, offset)

    def score(self, proposal: Proposal) -> torch.Tensor:  # [B, G+1, V]
        length = self.seqs.length
        g = proposal.tokens.shape[1]
        last = self.seqs.tokens.gather(1, (length - 1)[:, None])
        pos = (length - 1)[:, None] + torch.arange(g + 1, device=self.device)
        attend = min(self.seqs.max_len_bound + g, self.cache.max_len)
        return self.target(torch.cat([last, proposal.tokens], 1), pos, self.cache, attend)

    def verify(self, target_logits, proposal: Proposal, sampling: SamplingConfig, seed, offset: int) -> VerifyResult:
        return verify(
            target_logits, proposal.tokens, proposal.logits, proposal.logprobs,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            seed=seed, offset=offset, impl=self.verify_impl,
        )

    def decode_one(self, sampling: SamplingConfig, seed, offset: int) -> AsyncHandle:
        """Plain autoregressive decoding on the same engine: one target forward, one token."""
        length = self.seqs.length
        last = self.seqs.tokens.gather(1, (length - 1)[:, None])
        attend = min(self.seqs.max_len_bound, self.cache.max_len)
        z = self.target(last, (length - 1)[:, None], self.cache, attend)[:, 0]
        y, _ = sample(z, sampling, seed, offset, position=0, stream=FINAL)
        tokens = torch.cat([y[:, None], torch.full_like(y[:, None], -1)], 1)
        zero = torch.zeros_like(y, dtype=torch.int32)
        return self.commit(VerifyResult(zero, tokens.to(torch.int32)))

    def commit(self, result: VerifyResult) -> AsyncHandle:
        """Append num_accepted + 1 tokens per live row (cut at EOS and at max_new_tokens)."""
        seqs = self.seqs
        n = result.num_accepted.to(torch.int64)
        emitted = result.tokens.to(torch.int64)  # [B, G+1]
        width = emitted.shape[1]
        j = torch.arange(width, device=self.device)
        count = n + 1
        is_eos = (j[None] < count[:, None]) & torch.isin(emitted, self.eos)
        hit_eos = is_eos.any(-1)
        count = torch.where(hit_eos, is_eos.int().argmax(-1) + 1, count)
        room = self.max_new - (seqs.length - self.prompt_len)
        count = torch.minimum(count, room)
        active = ~self.done
        count = torch.where(active, count, 0)
        pos = (seqs.length[:, None] + j).clamp(max=seqs.tokens.shape[1] - 1)
        old = seqs.tokens.gather(1, pos)
        seqs.tokens.scatter_(1, pos, torch.where(j[None] < count[:, None], emitted, old))
        seqs.length = seqs.length + count
        self.done = self.done | (active & hit_eos & (count > 0)) | (seqs.length - self.prompt_len >= self.max_new)
        seqs.max_len_bound = min(seqs.max_len_bound + width, seqs.tokens.shape[1])
        seqs.step += 1
        return self.mirror.start(n, active, self.done)

    def outputs(self) -> list[list[int]]:
        tokens = self.seqs.tokens.cpu().numpy()
        start, end = self.prompt_len.cpu().numpy(), self.seqs.length.cpu().numpy()
        return [tokens[b, start[b] : end[b]].tolist() for b in range(len(start))]
