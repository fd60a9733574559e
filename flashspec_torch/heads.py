"""An EAGLE-style draft head: one Llama decoder layer over the target's own hidden states.

At head position p the input is the target's residual stream at position p - 1 after the layers
``feature_layers`` (concatenated, fused to the width C by ``fc_feat``) and the target's embedding of
token p; ``fc_in`` maps the two (each RMS-normed) to C, one decoder layer (``model.Block``, with the
head's own one-layer KV cache) gives the head's state s_p, and the final norm and the target's LM
head (rows ``token_ids`` only: a reduced vocabulary) give the logits of token p + 1. Drafting
further, the head feeds its own s_p where the target's fused features were (EAGLE-3).

The head owns only the fusion, the layer and two norms; the embedding and LM head are the target's
(``attach``), so a head file holds a few MiB. q is exactly what the draft samples from: the logits
of tokens outside ``token_ids`` are OUTSIDE (exp underflows to 0 in float32 at any temperature
>= 1e-8), so their q is 0 and they are never drafted. Drafting therefore samples over the V_d
columns only, with the DRAFT stream's Gumbel noise taken at the real token ids for all G positions in
one pass (``sampling.draft_gumbel``): the same token and log q as sampling the full row; the full row
(``full_logits``) is built once per step for the verifier.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from flashspec.config import LlamaConfig, SamplingConfig
from flashspec.head_file import (FORMAT, OUTSIDE, check_fingerprint, check_fits, config_fields, draft_head_file, kept_ids,
                                 read_metadata)

from .drafts import ModelDraft, Proposal, Sequences, check_stop_below, confident_lengths, unsure
from .layers import default_impl, is_k_major, kernel_attends, relaid, rms_norm, settle_layout
from .model import Block, KVCache, Llama, project
from .sampling import draft_gumbel, sample_gumbel
from .tree_score import TreePass

class DraftHead(nn.Module):
    """The head's own weights (saved); ``attach`` lends it the target's embedding and LM head."""

    def __init__(self, target: LlamaConfig, feature_layers: tuple[int, ...], token_ids: torch.Tensor | None = None):
        super().__init__()
        c = target.hidden_size
        bad = [i for i in feature_layers if not 0 <= i < target.num_layers]
        if not feature_layers or bad or len(set(feature_layers)) != len(feature_layers):
            raise ValueError(f"feature_layers={feature_layers!r} must be distinct target layers in [0, {target.num_layers})")
        self.target_config, self.feature_layers = target, tuple(int(i) for i in feature_layers)
        self.config = replace(target, num_layers=1)
        self.fc_feat = nn.Linear(len(feature_layers) * c, c, bias=False)
        self.fc_in = nn.Linear(2 * c, c, bias=False)
        self.embed_norm = nn.Parameter(torch.ones(c))
        self.feat_norm = nn.Parameter(torch.ones(c))
        self.layer = Block(self.config)
        self.norm = nn.Parameter(torch.ones(c))
        ids = torch.arange(target.vocab_size) if token_ids is None else torch.as_tensor(token_ids, dtype=torch.int64)
        if ids.ndim != 1 or not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size or \
                len(ids.unique()) != len(ids):
            raise ValueError(f"token_ids must be distinct token ids in [0, {target.vocab_size})")
        self.register_buffer("token_ids", ids.sort().values)
        self.full_vocab = len(ids) == target.vocab_size
        self.lent: tuple[torch.Tensor, torch.Tensor] | None = None  # (embedding [V, C], LM head rows [V_d, C])

    def attach(self, target: Llama) -> "DraftHead":
        """Borrow the target's embedding and the LM head rows of ``token_ids`` (not saved with the head)."""
        check_fits(self.target_config, target.config)
        w = target.lm_head.weight
        self.lent = (target.embed.weight, w if self.full_vocab else w[self.token_ids.to(w.device)].detach().clone())
        return self

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [..., k C] target features -> [..., C]
        return self.fc_feat(features)

    def run(self, target: Llama, tokens, feats, positions, cache: KVCache, attend_len: int, select=None,
            tree: TreePass | None = None):
        """tokens [B, T] int64, feats [B, T, C] (fused target features or the head's own states at the
        previous positions), positions [B, T]; K/V written into ``cache`` at positions. Returns the
        head's states and logits over its vocabulary ([B, T, C], [B, T, V_d]; at ``select`` [B] only:
        [B, C], [B, V_d]). With ``tree`` (``flashspec_torch.head_tree`` builds it), RoPE takes
        ``tree.rope_positions`` and attention ``tree.mask`` (plain torch layers); K/V still go to positions."""
        embed, _ = self.lent
        c = self.config
        e = nn.functional.embedding(tokens, embed)
        x = torch.cat([rms_norm(e, self.embed_norm, c.rms_norm_eps), rms_norm(feats, self.feat_norm, c.rms_norm_eps)], -1)
        impl = target.impl or default_impl(x.device)
        linear_impl, pdl, fused_projs, fused_rows = target.decode_settings(x.device)
        self.settle_layout(linear_impl, x.device)
        x = project(self.fc_in, x, linear_impl)
        cos_table, sin_table = target.rope_tables(x)
        rope, mask = (positions, None) if tree is None else (tree.rope_positions, tree.mask)
        if tree is not None:
            impl = "reference"
        elif not kernel_attends(impl, c.num_heads, c.num_kv_heads, tokens.shape[1], c.head_dim):
            slots = torch.arange(attend_len, device=tokens.device)
            mask = slots[None, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, S] bool
        h, d = self.layer(x, None, cos_table[rope], sin_table[rope], cache.k[0], cache.v[0], positions, mask,
                          attend_len, impl, linear_impl, pdl, fused_projs, fused_rows)
        s = h + d
        if select is not None:
            s = s.gather(1, select[:, None, None].expand(-1, 1, s.shape[-1]))[:, 0]
        return s, self.logits(s)

    def settle_layout(self, linear_impl: str, device: torch.device) -> None:
        """The head's projections and borrowed LM head rows in the storage order this pass's products read
        best (``layers.settle_layout``, judged by ``fc_in``'s weight; ``Llama.settle_layout`` for the target's)."""
        if settle_layout(self, self.fc_in.weight, linear_impl, device) and not self.full_vocab:
            embed, rows = self.lent  # the copied rows; the full vocabulary's are the target's own weight
            self.lent = (embed, relaid(rows, is_k_major(self.fc_in.weight)))

    def logits(self, s: torch.Tensor) -> torch.Tensor:  # [..., C] head states -> [..., V_d] float32
        return nn.functional.linear(rms_norm(s, self.norm, self.config.rms_norm_eps), self.lent[1]).float()

    def full_logits(self, w: torch.Tensor) -> torch.Tensor:  # [..., V_d] -> [..., V]: OUTSIDE off the head's vocabulary
        if self.full_vocab:
            return w
        full = torch.full((*w.shape[:-1], self.target_config.vocab_size), OUTSIDE, dtype=w.dtype, device=w.device)
        return full.index_copy_(-1, self.token_ids, w)


class HeadDraft:
    """The head as a draft of the torch backend (a ``flashspec.backend.FeatureDraft``): the backend
    keeps the target's features in ``Sequences.features``; the head keeps its own KV cache and
    catches up lazily like ``drafts.ModelDraft``, re-feeding every position from the first one it
    drafted with its own states (those entries are rewritten from the target's features)."""

    capturable = True

    def __init__(self, name: str, head: DraftHead, target: Llama, stop_below: float = 0.0):
        self.name, self.target = name, target
        self.stop_below = check_stop_below(stop_below)  # drafts.confident_lengths' threshold (0: always G tokens)
        self.head = head.to(device=target.embed.weight.device, dtype=target.embed.weight.dtype).eval().requires_grad_(False)
        self.head.attach(target)
        self.feature_layers = head.feature_layers

    def start(self, batch: int, max_len: int) -> None:
        c = getattr(self, "cache", None)
        if c is None or c.k.shape[1] != batch or c.max_len != max_len:
            p = self.target.embed.weight
            self.cache = KVCache(self.head.config, batch, max_len, p.dtype, p.device)
            self.valid = torch.zeros(batch, dtype=torch.int64, device=p.device)
        self.valid.zero_()  # positions < valid hold K/V made from the target's features
        self.used_at: int | None = None
        self.width = 0  # the last step's G + 1: the most positions it can leave unfed

    # the same lazy catch-up bookkeeping as a model draft (used_at, one step behind at most), and the step's width

    def mark_used(self, seqs: Sequences, gamma: int | None = None) -> None:
        """``ModelDraft.mark_used``; ``width`` = G + 1, the most positions the step can leave unfed (host state: set
        here, after the step, not inside it, which a CUDA graph replays without Python)."""
        ModelDraft.mark_used(self, seqs)
        self.width = 0 if gamma is None else gamma + 1

    def lagging(self, seqs: Sequences, gamma: int | None = None) -> bool:
        """Not used in the previous step, or that step was wider than ``gamma`` allows: it may have left up to
        ``width`` = its G + 1 positions unfed, more than the G + 1 a graphed step at ``gamma`` feeds."""
        return ModelDraft.lagging(self, seqs) or (gamma is not None and self.width > gamma + 1)

    def catch_up_bound(self, seqs: Sequences, gamma: int) -> int:
        """``ModelDraft.catch_up_bound``, and off the CPU at least the previous step's ``width`` + 1."""
        bound = ModelDraft.catch_up_bound(self, seqs, gamma)
        return bound if seqs.length.device.type == "cpu" else max(bound, self.width + 1)

    def feed(self, seqs: Sequences, start: torch.Tensor, chunk: int, attend: int, select=None):
        """Head positions start .. start + chunk - 1 from the tokens and the target's features."""
        s_max = self.cache.max_len
        pos = (start[:, None] + torch.arange(chunk, device=start.device)).clamp(max=s_max - 1)  # [B, C]
        prev = (pos - 1).clamp(min=0)
        feats = seqs.features.gather(1, prev[..., None].expand(-1, -1, seqs.features.shape[-1]))
        feats = self.head.fuse(feats) * (pos > 0)[..., None]  # position 0 has no previous feature
        return self.head.run(self.target, seqs.tokens.gather(1, pos), feats, pos, self.cache, attend, select)

    get_ready = ModelDraft.get_ready  # after prefill: caught up over the prompt, as if used in the step before

    def catch_up(self, seqs: Sequences, gamma: int) -> None:
        """Feed every position but the last eagerly, so that ``propose(graphed=True)`` feeds at most G + 1."""
        start = torch.minimum(self.valid, seqs.length - 1)
        s_max = self.cache.max_len
        chunk = min(self.catch_up_bound(seqs, gamma), seqs.max_len_bound, s_max)
        self.feed(seqs, start, chunk, min(seqs.max_len_bound, s_max), select=torch.zeros_like(start))  # no logits kept
        self.valid.copy_(torch.maximum(self.valid, seqs.length - 1))

    def root(self, seqs: Sequences, gamma: int, attend: int, graphed: bool = False):  # -> [B, C], [B, V_d]
        """Feed every position not fed yet (up to each row's last committed token, position length - 1) from
        the tokens and the target's features; the head's state and logits there (its first draft)."""
        length = seqs.length  # [B]
        start = torch.minimum(self.valid, length - 1)
        chunk = gamma + 1 if graphed else min(self.catch_up_bound(seqs, gamma), seqs.max_len_bound, self.cache.max_len)
        last = (length - 1 - start).clamp(max=chunk - 1)
        return self.feed(seqs, start, chunk, attend, select=last)

    def stops_early(self, w: torch.Tensor, graphed: bool) -> torch.Tensor | None:  # w [B, V_d] -> [B] bool
        """With a dynamic length (``stop_below``) on the CPU's eager path, where the test below reads host memory:
        which rows have stopped (none yet). ``propose`` stops drafting once every row has, so the proposal and the
        target's scoring pass are max(L) (+ 1) positions long instead of G (+ 1); no row's verification reaches
        past its own length L, so the emitted tokens are the same. None elsewhere: always G tokens."""
        if graphed or not self.stop_below or w.device.type != "cpu":
            return None
        return torch.zeros(w.shape[0], dtype=torch.bool)

    def propose(self, seqs: Sequences, gamma: int, sampling: SamplingConfig, seed, offset, graphed: bool = False) -> Proposal:
        s_max = self.cache.max_len
        length = seqs.length  # [B]
        attend = s_max if graphed else min(seqs.max_len_bound + gamma, s_max)
        s, w = self.root(seqs, gamma, attend, graphed)
        ids = self.head.token_ids  # [V_d]
        noise = None if sampling.greedy else draft_gumbel(seed, offset, length.shape[0], gamma, ids)  # [B, G, V_d]
        xs, js, ws, lqs = [], [], [], []
        stopped = self.stops_early(w, graphed)  # [B] bool, or None: always G tokens
        for i in range(gamma):
            if noise is None:
                j, lq_i = w.argmax(-1), torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
            else:
                j, lq_i = sample_gumbel(w, sampling, noise[:, i])
            x_i = ids[j]
            xs.append(x_i)
            js.append(j)
            ws.append(w)
            lqs.append(lq_i)
            if stopped is not None:
                stopped |= unsure(w[:, None], j[:, None], self.stop_below)[:, 0]
                if bool(stopped.all()):  # every row's length ends here: no verification reaches further
                    break
            if i + 1 < gamma:
                p_i = (length + i).clamp(max=s_max - 1)[:, None]
                s, w = self.head.run(self.target, x_i[:, None], s[:, None], p_i, self.cache, attend)
                s, w = s[:, 0], w[:, 0]
        self.valid.copy_(length)
        w = torch.stack(ws, 1)  # [B, G, V_d]
        return Proposal(torch.stack(xs, 1), self.head.full_logits(w), torch.stack(lqs, 1),
                        confident_lengths(w, torch.stack(js, 1), self.stop_below))


# -- files


def save_head(head: DraftHead, path: str | Path, *, target_name: str, dtype: torch.dtype = torch.bfloat16,
              extra: dict | None = None, counts: torch.Tensor | None = None) -> Path:
    """One safetensors file: the head's weights in ``dtype``, ``token_ids`` in int64, and metadata
    (format, feature_layers, the target's config and name, ``extra`` as JSON). With ``counts`` ([V]
    int64: each token's count in the training text), ``token_ids`` is stored most frequent first (ties
    by lower id) beside ``token_counts`` (int64, the same order), so that ``load_head(top=N)`` can
    take the N most frequent; without, ``token_ids`` is sorted by id (the first format, still read)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: (v if k == "token_ids" else v.to(dtype)).detach().cpu().contiguous() for k, v in head.state_dict().items()}
    if counts is not None:
        counts = torch.as_tensor(counts, dtype=torch.int64).cpu()
        if counts.shape != (head.target_config.vocab_size,):
            raise ValueError(f"counts has shape {tuple(counts.shape)}: want [{head.target_config.vocab_size}], "
                             "one count per token of the target's vocabulary")
        ids = state["token_ids"]
        ids = ids[torch.argsort(-counts[ids], stable=True)]  # ids ascending, so ties stay by lower id
        state["token_ids"], state["token_counts"] = ids.contiguous(), counts[ids].contiguous()
    meta = {"format": FORMAT, "feature_layers": json.dumps(head.feature_layers), "target_name": target_name,
            "target_config": json.dumps(config_fields(head.target_config)), "extra": json.dumps(extra or {})}
    save_file(state, str(path), metadata=meta)
    return path


def load_head(path: str | Path, target: LlamaConfig, top: int = 0) -> tuple[DraftHead, dict]:
    """A head file (or a directory holding ``head.safetensors``) for ``target``: (the head in float32,
    metadata). ``top=N`` (0: all) keeps the N most frequent tokens of the head's vocabulary (the file must
    store them in frequency order: ``save_head(counts=...)``): a smaller LM head, exact all the same,
    since q is 0 outside the vocabulary the head drafts from; acceptance drops by the tokens cut."""
    from safetensors.torch import load_file

    path, meta = read_metadata(path, target)
    state = load_file(str(path))
    ids = kept_ids(state.pop("token_ids"), state.pop("token_counts", None), top, path)
    head = DraftHead(target, tuple(json.loads(meta["feature_layers"])), ids)
    head.load_state_dict({**{k: v.float() for k, v in state.items()}, "token_ids": head.token_ids})
    return head, meta


def fingerprint(target: Llama) -> float:
    """mean |embedding|: tells two targets of the same shape apart."""
    return float(target.embed.weight.detach().double().abs().mean())


def read_draft_head(name: str, directory: str, target: Llama, top: int = 0) -> DraftHead:
    """``head`` (the shipped head of the embedded model) or ``head:DIR``'s head for ``target``, its file and
    fingerprint checked; ``top`` (``head@N``): over its N most frequent tokens only (0: all)."""
    path = draft_head_file(directory)
    head, meta = load_head(path, target.config, top)
    check_fingerprint(name, path, meta, fingerprint(target))
    return head


def load_draft_head(name: str, directory: str, target: Llama, top: int = 0) -> HeadDraft:
    """``read_draft_head``'s head as a chain draft of ``target`` (a tree: ``tree_step.HeadTreeDraft``)."""
    return HeadDraft(name, read_draft_head(name, directory, target, top), target)
