"""Drafts for the torch backend, all over one model class (no copies of the model).

* ``ModelDraft``: any Llama-family model sharing the target's tokenizer -- a small model, an NF4
  copy, or the target itself with layers skipped (``skip``). It keeps its own KV cache and catches
  up lazily: when it was not used for some steps (the bandit chose another arm), its first forward
  of the next step feeds every token it has not seen, so arms can switch every step.
* ``TransformersDraft``: any other transformers causal LM sharing the tokenizer (no cache).
* ``LookupDraft``: prompt-lookup (n-gram) drafting on the device: find the latest earlier
  occurrence of the sequence's last n tokens and propose what followed. Deterministic, so q is
  one-hot (``logits`` is None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashspec.config import SamplingConfig

from .layers import default_impl
from .model import Llama
from .sampling import draft_gumbel, sample, sample_gumbel
from .device import next_pow2
from .weights import LoadedModel, from_transformers

@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, G] int64
    logits: torch.Tensor | None  # [B, G, V] float32 raw draft logits; None: one-hot q
    logprobs: torch.Tensor | None  # [B, G] float32 log q(x) as sampled
    lengths: torch.Tensor | None = None  # [B] int64 in [1, G]: row b proposes its first L_b tokens; None: G


def confident_lengths(
    w: torch.Tensor,  # [B, G, V'] the draft's raw logits at each drafted position
    j: torch.Tensor,  # [B, G] int: the drafted token's column in w
    stop_below: float,
) -> torch.Tensor | None:  # [B] int64 in [1, G]; None when stop_below is 0 (never stop)
    """The dynamic draft length: row b stops after its first token whose probability under the draft's own
    temperature-1 distribution is below ``stop_below``, L_b = 1 + min{i : q_i(x_i) < stop_below} (G if none).
    Whether position i + 1 is proposed depends only on x_0 .. x_i and the draft's logits, all known before
    verification, and position i + 1 is reached only when x_0 .. x_i were all accepted (they are then the
    emitted tokens), so each emitted token still follows the target's law (docs/adaptive.md). Dropping the
    unsure token itself instead would not: its own draw would decide whether it is verified."""
    if not stop_below:
        return None
    g = j.shape[1]
    first_low = torch.where(unsure(w, j, stop_below), torch.arange(g, device=j.device), g).min(1).values
    return (first_low + 1).clamp(max=g)


def unsure(
    w: torch.Tensor,  # [B, G, V'] the draft's raw logits at each drafted position
    j: torch.Tensor,  # [B, G] int: the drafted token's column in w
    stop_below: float,
) -> torch.Tensor:  # [B, G] bool
    """Whether each drafted token's probability under the draft's own temperature-1 distribution is below
    ``stop_below`` (``confident_lengths`` stops a row after the first)."""
    w = w.float()
    log_q = w.gather(-1, j[..., None].long())[..., 0] - torch.logsumexp(w, -1)
    return log_q < math.log(stop_below)


def check_stop_below(stop_below: float) -> float:
    if isinstance(stop_below, bool) or not isinstance(stop_below, (int, float)) or not 0.0 <= stop_below < 1.0:
        raise ValueError(f"stop_below={stop_below!r} must be a probability in [0, 1) (0: always draft G tokens)")
    return float(stop_below)


@dataclass
class Sequences:
    """The batch's token history on the device (shared by the backend and the drafts)."""

    tokens: torch.Tensor  # [B, S] int64: prompt then generated tokens
    length: torch.Tensor  # [B] int64: tokens held per row; the last one is not yet in any cache
    max_len_bound: int  # host-side upper bound of length over rows (no device read needed)
    step: int = 0
    # [B, S, F]: the target's residual stream after the layers its FeatureDrafts read (flashspec.backend),
    # per position it has fed; None when no draft reads them
    features: torch.Tensor | None = None


class Stateless:
    """A draft that keeps no cache: nothing to start, never behind, nothing to record."""

    def start(self, batch: int, max_len: int) -> None:
        pass

    def lagging(self, seqs: Sequences, gamma: int | None = None) -> bool:
        return False

    def mark_used(self, seqs: Sequences, gamma: int | None = None) -> None:
        pass

    def get_ready(self, seqs: Sequences, gamma: int) -> None:
        pass


class ModelDraft:
    capturable = True  # propose(graphed=True) has fixed shapes (after catch_up when lagging)

    def __init__(self, name: str, model: Llama, skip: frozenset[int] = frozenset(), stop_below: float = 0.0):
        if skip and max(skip) >= model.config.num_layers:
            raise ValueError(f"skip={sorted(skip)} names layers beyond the model's {model.config.num_layers}")
        self.name, self.model, self.skip = name, model, frozenset(skip)
        self.stop_below = check_stop_below(stop_below)  # confident_lengths' threshold (0: always G tokens)

    def start(self, batch: int, max_len: int) -> None:
        """A new batch; the cache is reused when its shape fits (CUDA graphs keep its address)."""
        c = getattr(self, "cache", None)
        if c is None or c.k.shape[1] != batch or c.max_len != max_len:
            self.cache = self.model.new_cache(batch, max_len)
            self.valid = torch.zeros(batch, dtype=torch.int64, device=self.model.embed.weight.device)
        self.valid.zero_()  # positions < valid hold this draft's K/V
        self.used_at: int | None = None

    def catch_up_bound(self, seqs: Sequences, gamma: int) -> int:
        """Host-side bound on the tokens a row may not have fed yet; on the CPU, where the lengths
        are host memory and reading them waits for nothing, the exact count."""
        if seqs.length.device.type == "cpu":
            return max(1, int((seqs.length - torch.minimum(self.valid, seqs.length - 1)).max()))
        if self.used_at is None:
            return seqs.max_len_bound
        return (seqs.step - self.used_at) * (gamma + 1) + 2

    def lagging(self, seqs: Sequences, gamma: int | None = None) -> bool:
        """Not used in the previous step: more than the last two tokens may be unfed (``gamma``: the step's G)."""
        return self.used_at is None or self.used_at != seqs.step - 1

    def get_ready(self, seqs: Sequences, gamma: int) -> None:
        """After ``prefill`` (``TorchBackend.prepare``): feed every committed token but the last now (``catch_up``), as
        if the draft had run in the step before, so that its first step in the request does a step's work only (that
        step's time prices the arm: ``flashspec.adaptive``). The same K/V the first step would have fed."""
        if self.lagging(seqs, gamma):
            self.catch_up(seqs, gamma)
            self.used_at = seqs.step - 1

    def catch_up(self, seqs: Sequences, gamma: int) -> None:
        """Feed every unfed token but the last (eager, variable length), so that the fixed-shape
        ``propose(..., graphed=True)`` has at most two tokens left to feed."""
        s_max = self.cache.max_len
        start = torch.minimum(self.valid, seqs.length - 1)
        chunk = min(self.catch_up_bound(seqs, gamma), seqs.max_len_bound, s_max)
        pos = (start[:, None] + torch.arange(chunk, device=start.device)).clamp(max=s_max - 1)  # [B, C]
        self.model(seqs.tokens.gather(1, pos), pos, self.cache, min(seqs.max_len_bound, s_max), logits_last=0, skip=self.skip)
        self.valid.copy_(torch.maximum(self.valid, seqs.length - 1))

    def propose(self, seqs: Sequences, gamma: int, sampling: SamplingConfig, seed, offset, graphed: bool = False) -> Proposal:
        """Device work only (capturable when ``graphed``: fixed shapes, attention over the whole
        cache, after ``catch_up`` when lagging); the backend calls ``mark_used`` after it."""
        s_max = self.cache.max_len
        length = seqs.length
        start = torch.minimum(self.valid, length - 1)  # [B] first position this draft must (re)feed
        chunk = 2 if graphed else min(self.catch_up_bound(seqs, gamma), seqs.max_len_bound, s_max)
        pos = (start[:, None] + torch.arange(chunk, device=length.device)).clamp(max=s_max - 1)  # [B, C]
        tokens = seqs.tokens.gather(1, pos)
        attend = s_max if graphed else min(seqs.max_len_bound + gamma, s_max)
        last = (length - 1 - start).clamp(max=chunk - 1)  # only a finished row can lag further
        w = self.model(tokens, pos, self.cache, attend, select=last, skip=self.skip)[:, 0]
        noise = None if sampling.greedy else draft_gumbel(  # [B, G, V]
            seed, offset, length.shape[0], gamma, torch.arange(w.shape[-1], device=w.device))
        xs, ws, lqs = [], [], []
        for i in range(gamma):
            x_i, lq_i = sample(w, sampling, seed, offset) if noise is None else sample_gumbel(w, sampling, noise[:, i])
            xs.append(x_i)
            ws.append(w)
            lqs.append(lq_i)
            if i + 1 < gamma:
                p_i = (length + i)[:, None]
                w = self.model(x_i[:, None], p_i, self.cache, attend, skip=self.skip)[:, 0]
        self.valid.copy_(length + gamma - 1)
        x, w = torch.stack(xs, 1), torch.stack(ws, 1)
        return Proposal(x, w, torch.stack(lqs, 1), confident_lengths(w, x, self.stop_below))

    def mark_used(self, seqs: Sequences, gamma: int | None = None) -> None:
        """Record on the host that this step (at ``gamma``) ran the draft: outside any CUDA graph, whose replays
        run no Python."""
        self.used_at = seqs.step


class LookupDraft(Stateless):
    """Prompt lookup: match the last n tokens (n = max_n .. 1) against the history."""

    capturable = True
    recomputable = True  # the proposal is a function of the history and G alone (flashspec_torch.free)

    def __init__(self, name: str = "ngram", max_n: int = 3, impl: str | None = None):
        if max_n < 1:
            raise ValueError(f"{max_n=} must be >= 1")
        self.name, self.max_n = name, max_n
        self.impl = impl  # "triton" (one kernel) or "reference" (torch ops); None: by device

    def propose(self, seqs: Sequences, gamma: int, sampling: SamplingConfig, seed, offset, graphed: bool = False) -> Proposal:
        impl = self.impl or default_impl(seqs.tokens.device)
        lookup = lookup_triton if impl == "triton" else lookup_reference
        return Proposal(lookup(seqs.tokens, seqs.length, gamma, self.max_n), None, None)


def lookup_reference(seq: torch.Tensor, length: torch.Tensor, gamma: int, max_n: int) -> torch.Tensor:
    """seq [B, S] int64, length [B] -> the G tokens after the latest earlier match [B, G] int64."""
    b, s = seq.shape
    dev = seq.device
    best = torch.full((b,), -1, dtype=torch.int64, device=dev)  # continuation start, -1: none yet
    for n in range(max_n, 0, -1):
        if n >= s:
            continue
        tail_pos = (length[:, None] - n + torch.arange(n, device=dev)).clamp(min=0)
        tail = seq.gather(1, tail_pos)  # [B, n]
        windows = seq.unfold(1, n, 1)  # [B, S-n+1, n]
        starts = torch.arange(windows.shape[1], device=dev)
        hit = (windows == tail[:, None]).all(-1) & (starts[None] < (length - n)[:, None])  # earlier than the tail
        latest = torch.where(hit, starts[None], -1).max(-1).values  # [B]
        found = (latest >= 0) & (length > n)
        best = torch.where((best < 0) & found, latest + n, best)
    fallback = length - 1  # no match: repeat the last token
    start = torch.where(best >= 0, best, fallback)
    pos = torch.minimum(start[:, None] + torch.arange(gamma, device=dev), (length - 1)[:, None])
    return seq.gather(1, pos)


def lookup_triton(seq: torch.Tensor, length: torch.Tensor, gamma: int, max_n: int) -> torch.Tensor:
    """``lookup_reference`` as one kernel launch (flashspec_torch/kernels/steps.py)."""
    from .kernels.steps import lookup_kernel

    b, s = seq.shape
    out = torch.empty((b, gamma), dtype=torch.int64, device=seq.device)
    block_s = min(next_pow2(s), 1024)
    lookup_kernel[(b,)](seq, length, out, s, gamma, MAX_N=max_n, BLOCK_S=block_s, BLOCK_G=next_pow2(gamma), num_warps=4)
    return out


class TransformersDraft(Stateless):
    """Any transformers causal LM sharing the tokenizer, run through its own forward.

    Architectures our ``Llama`` does not cover (GPT-2, Qwen, ...) land here. It keeps no cache:
    each drafted token re-reads the row's whole history (right-padded, masked), which is simple
    and exact but costs O(S) per token: meant for small drafts.
    """

    capturable = False  # its inputs grow with the sequence: run eagerly inside a graphed engine

    def __init__(self, name: str, hf_model: torch.nn.Module):
        self.name, self.hf = name, hf_model.eval().requires_grad_(False)

    def propose(self, seqs: Sequences, gamma: int, sampling: SamplingConfig, seed, offset, graphed: bool = False) -> Proposal:
        length = seqs.length  # [B]
        width = min(seqs.max_len_bound + gamma, seqs.tokens.shape[1])
        tokens = seqs.tokens[:, :width].clone()  # [B, W]: history, then the drafted tokens
        slots = torch.arange(width, device=tokens.device)
        xs, ws, lqs = [], [], []
        for i in range(gamma):
            t = min(seqs.max_len_bound + i, width)
            mask = (slots[None, :t] < (length + i)[:, None]).long()  # [B, t]
            z = self.hf(input_ids=tokens[:, :t], attention_mask=mask, use_cache=False).logits  # [B, t, V]
            last = (length - 1 + i).clamp(max=t - 1)
            w = z.gather(1, last[:, None, None].expand(-1, 1, z.shape[-1]))[:, 0].float()  # [B, V]
            x_i, lq_i = sample(w, sampling, seed, offset, position=i)
            tokens.scatter_(1, (length + i).clamp(max=width - 1)[:, None], x_i[:, None])
            xs.append(x_i)
            ws.append(w)
            lqs.append(lq_i)
        return Proposal(torch.stack(xs, 1), torch.stack(ws, 1), torch.stack(lqs, 1))


def is_llama_family(hf_config) -> bool:
    return getattr(hf_config, "model_type", None) in ("llama", "mistral")


def draft_from_model(source, target: Llama, dtype: torch.dtype, device) -> ModelDraft | TransformersDraft:
    """A draft over another model sharing the target's tokenizer: a ``LoadedModel``, one of our
    ``Llama``s, or a transformers causal-LM object (Llama family: weights copied to our layout
    and cached drafting; any other architecture: ``TransformersDraft``)."""
    if isinstance(source, LoadedModel):
        name, model = source.name, source.model
    elif isinstance(source, Llama):
        name, model = "model", source
    elif isinstance(source, torch.nn.Module) and hasattr(source, "config") and hasattr(source.config, "vocab_size"):
        name = getattr(source.config, "name_or_path", "") or type(source).__name__
        check_vocab(name, source.config.vocab_size, target)
        if not is_llama_family(source.config):
            return TransformersDraft(name, source.to(device=device, dtype=dtype))
        model = from_transformers(source, dtype, device, name=name).model
    else:
        raise ValueError(
            f"draft {source!r} must be a draft name, a LoadedModel, a Llama or a transformers causal-LM object"
        )
    check_vocab(name, model.config.vocab_size, target)
    return ModelDraft(name, model)


def check_vocab(name: str, vocab_size: int, target: Llama) -> None:
    if vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft {name!r} has vocabulary size {vocab_size} but the target has "
            f"{target.config.vocab_size}: a draft must share the target's tokenizer"
        )
