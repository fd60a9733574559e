"""Training a draft head by self-distillation (``flashspec train-head``; Python: ``train_head``).

1. The target continues prompts of ``flashspec.head_corpus`` (our engine's plain decoding): ``samples``
   continuations sampled at ``temperature`` per training prompt, plus one greedy one when ``greedy``;
   held-out groups are continued too (sampled, once), for the measurements only.
2. Each training batch: the target scores the sequences once (no gradient), giving its features at
   the head's ``feature_layers`` and its next-token distribution p at every position.
3. The head runs ``passes`` times over the batch (training-time test, as EAGLE-3 and HASS do): pass
   0 reads the target's features, pass k the head's own states of pass k - 1, and attends to the
   target-fed keys up to position p - k and to its own keys of passes 1..k (``ttt_states``), which
   is exactly what drafting the (k+1)-th token sees. Loss: cross-entropy of q against p on the
   head's vocabulary (KL to p up to a constant), pass k weighted by ``decay ** k``.

With ``init`` (a head file or directory, or ``shipped``), training continues that head (its weights,
feature layers and vocabulary; a fresh optimizer and the same learning-rate schedule) instead of
starting from a random one, so a head improves across runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from flashspec.config import SamplingConfig
from flashspec.head_file import check_fingerprint, draft_head_file
from flashspec.head_corpus import Prompt

from .heads import DraftHead, fingerprint, load_head
from .layers import apply_rope, rms_norm, silu_mul_reference
from .model import Llama


@dataclass(frozen=True)
class TrainConfig:
    feature_layers: tuple[int, ...] | None = None  # None: a low, a middle and the top layer (EAGLE-3)
    vocab: int = 8192  # the head's vocabulary: the most frequent tokens of the generated text (0: the target's)
    new_tokens: int = 128  # tokens the target generates per prompt
    temperature: float = 0.8  # of the target's generation
    gen_batch: int = 64
    batch: int = 16  # sequences per training step
    steps: int = 200
    seconds: float | None = None  # stop training after this long, whatever ``steps`` says
    samples: int = 1  # continuations the target samples per training prompt (distinct seeds)
    greedy: bool = False  # also one greedy continuation per training prompt (the contexts greedy drafting sees)
    lr: float = 1e-3
    warmup: int = 50
    passes: int = 3  # training-time test depth
    decay: float = 0.8  # pass k's loss weight is decay ** k (lower: more weight on the first drafted position)
    seed: int = 0
    init: str | None = None  # continue this head (a file or directory, or "shipped"); None: a new head
    gen_seconds: float | None = None  # stop generating training continuations after this long (held-out ones always)

    def __post_init__(self):
        for name in ("new_tokens", "gen_batch", "batch", "steps", "passes", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.vocab < 0:
            raise ValueError(f"vocab={self.vocab} must be >= 0 (0: the target's whole vocabulary)")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay={self.decay} must be in (0, 1]: pass k's loss weight is decay ** k")
        if self.warmup < 1 or not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0 and warmup={self.warmup} >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (the target samples its own continuations)")
        if self.init == "":
            raise ValueError("init='' names no head: pass a head file or directory, 'shipped', or None for a new head")


def lr_scale(step: int, elapsed: float, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine to 0 over the run: its progress is the
    larger of step / steps and elapsed / seconds, so a run cut by ``seconds`` still anneals."""
    done = min(step, cfg.steps) / cfg.steps
    if cfg.seconds:
        done = max(done, min(elapsed / cfg.seconds, 1.0))
    return min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * done))


def default_layers(num_layers: int) -> tuple[int, ...]:
    """A low, a middle and the top layer (EAGLE-3's fusion), fewer when the model is shallow."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, num_layers - 1}))


@dataclass
class Sequence:
    domain: str
    held_out: bool
    tokens: list[int]  # prompt then continuation
    prompt_len: int


def generate_sequences(target: Llama, prompts: list[Prompt], encode, cfg: TrainConfig, eos_ids=(),
                       greedy: bool = False, deadline: float | None = None) -> list[Sequence]:
    """The target's own continuations of the prompts (``encode(prompt) -> ids``), ``gen_batch`` at a
    time, in order: sampled at ``cfg.temperature``, or greedy; no group starts after ``deadline``
    (a ``time.perf_counter()`` value), so the prompts after it are left out."""
    from flashspec.loop import decode

    from .backend import TorchBackend

    backend = TorchBackend(target, [], eos_ids)
    sampling = SamplingConfig(0.0 if greedy else cfg.temperature)
    out = []
    with torch.inference_mode():
        for i in range(0, len(prompts), cfg.gen_batch):
            if deadline is not None and time.perf_counter() > deadline:
                break
            group = prompts[i : i + cfg.gen_batch]
            ids = [encode(p) for p in group]
            seeds = torch.arange(i, i + len(group), device=target.embed.weight.device) + 1000 * cfg.seed
            news, _ = decode(backend, ids, sampling=sampling, max_new_tokens=cfg.new_tokens, seed=seeds)
            out += [Sequence(p.domain, p.held_out, x + n, len(x)) for p, x, n in zip(group, ids, news)]
    return out


def token_counts(seqs: list[Sequence], vocab_size: int) -> torch.Tensor:  # [V] int64: occurrences in seqs
    flat = torch.as_tensor([t for s in seqs for t in s.tokens], dtype=torch.int64)
    return torch.bincount(flat, minlength=vocab_size)[:vocab_size]


def by_frequency(counts: torch.Tensor) -> torch.Tensor:  # [V] counts -> [V] token ids, most frequent first, ties by lower id
    return torch.argsort(-counts, stable=True)


def frequent_tokens(seqs: list[Sequence], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the training sequences (0: all), most frequent first,
    ties by lower id."""
    order = by_frequency(token_counts(seqs, vocab_size))
    return order if size == 0 or size >= vocab_size else order[:size]


def pad(seqs: list[Sequence], device) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, T] int64, lengths [B]
    t = max(len(s.tokens) for s in seqs)
    tokens = torch.zeros((len(seqs), t), dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, : len(s.tokens)] = torch.as_tensor(s.tokens)
    return tokens.to(device), torch.tensor([len(s.tokens) for s in seqs], device=device)


@torch.no_grad()
def target_pass(target: Llama, tokens: torch.Tensor, layers: tuple[int, ...]):
    """The target over whole sequences: (logits [B, T, V] float32, features [B, T, k C])."""
    b, t = tokens.shape
    pos = torch.arange(t, device=tokens.device)[None].expand(b, -1)
    return target(tokens, pos, target.new_cache(b, t), t, hidden=layers)


def shift(x: torch.Tensor, by: int = 1) -> torch.Tensor:  # [B, ..., T, C]: x[p - by] at p (zeros before 0)
    if by == 0:
        return x
    return torch.cat([torch.zeros_like(x[..., :by, :]), x[..., :-by, :]], -2)


def ttt_states(head: DraftHead, target: Llama, tokens: torch.Tensor, feats: torch.Tensor, passes: int) -> list[torch.Tensor]:
    """The head's states [B, T, C] of passes 0..passes-1 (module docstring), differentiable, with the
    layer's own weights and the reference pieces of ``flashspec_torch.layers``."""
    c, blk = head.config, head.layer
    b, t = tokens.shape
    embed = nn.functional.embedding(tokens, target.embed.weight)
    e = rms_norm(embed, head.embed_norm, c.rms_norm_eps)
    inv_freq, scaling = target.config.rope(False)
    angles = torch.arange(t, device=e.device)[:, None].float() * torch.from_numpy(inv_freq).to(e.device)  # as Llama.rope_tables
    cos, sin = (torch.cat([f(angles)] * 2, -1)[None, None] * scaling for f in (torch.cos, torch.sin))  # [1, 1, T, D] float32
    feat = shift(head.fuse(feats))
    keys, states = [], []
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
    for k in range(passes):
        x = head.fc_in(torch.cat([e, rms_norm(feat, head.feat_norm, c.rms_norm_eps)], -1))
        qkv = blk.qkv(rms_norm(x, blk.attn_norm, c.rms_norm_eps))
        q, kk, v = qkv.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
        heads = lambda a, n: a.view(b, t, n, c.head_dim).transpose(1, 2)  # noqa: E731
        q = apply_rope(heads(q, c.num_heads), cos, sin)
        kk, v = apply_rope(heads(kk, c.num_kv_heads), cos, sin), heads(v, c.num_kv_heads)
        rep = c.num_heads // c.num_kv_heads
        kk, v = kk.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [B, H, T, D]
        keys.append((kk, v))
        k0, v0 = keys[0]
        scores = [(q @ k0.transpose(-1, -2)).masked_fill(~causal.tril(-k), -math.inf)]  # [B, H, T, T]: keys <= p - k
        diag_v = []
        for j in range(1, k + 1):  # pass j's key at position p - (k - j)
            kj, vj = shift(keys[j][0], k - j), shift(keys[j][1], k - j)
            valid = torch.arange(t, device=tokens.device) >= k - j
            scores.append(((q * kj).sum(-1, keepdim=True)).masked_fill(~valid[:, None], -math.inf))
            diag_v.append(vj)
        att = (torch.cat(scores, -1) / math.sqrt(c.head_dim)).softmax(-1)
        out = att[..., :t] @ v0
        for j, vj in enumerate(diag_v):
            out = out + att[..., t + j : t + j + 1] * vj
        x = x + blk.o(out.transpose(1, 2).reshape(b, t, -1))
        s = x + blk.down(silu_mul_reference(blk.gate_up(rms_norm(x, blk.mlp_norm, c.rms_norm_eps))))
        states.append(s)
        feat = shift(s)
    return states


def head_loss(head: DraftHead, states, target_logits, lengths, decay: float):
    """sum_k decay^k * mean over positions k+1 <= p < length of -sum_{v in head vocab} p_v log q_v;
    also the per-pass losses (0-d tensors: reading them waits for the device)."""
    t = target_logits.shape[1]
    p = target_logits.float().softmax(-1)
    if not head.full_vocab:
        p = p[..., head.token_ids]
    pos = torch.arange(t, device=lengths.device)
    total, per = 0.0, []
    for k, s in enumerate(states):
        mask = (pos[None] >= k + 1) & (pos[None] < lengths[:, None])  # [B, T]
        lq = head.logits(s).log_softmax(-1)
        ce = -(p * lq).sum(-1)
        loss = (ce * mask).sum() / mask.sum().clamp(min=1)
        total = total + decay**k * loss
        per.append(loss.detach())
    return total, per


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # the weighted sum
    per_pass: list[list[float]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # training tokens (sequence lengths) seen so far


def train_head(target: Llama, seqs: list[Sequence], cfg: TrainConfig, token_ids: torch.Tensor | None = None,
               log_every: int = 10, on_log=None, head: DraftHead | None = None) -> tuple[DraftHead, History]:
    """Train a head on ``seqs`` (the training ones: ``held_out`` are refused); returns it in float32.
    The head trained is ``head`` when given (what ``initial_head`` returned for this ``cfg``: a caller
    that checked ``cfg.init`` before generating data passes it on, so the file is read once), else
    ``initial_head(target, cfg, token_ids)``."""
    if any(s.held_out for s in seqs):
        raise ValueError("train_head was given held-out sequences: pass the training split only")
    if head is not None and token_ids is not None:
        raise ValueError("train_head was given both head and token_ids: the head keeps its own vocabulary, "
                         "pass token_ids=None with it")
    dev = target.embed.weight.device
    torch.manual_seed(cfg.seed)
    head = for_training(initial_head(target, cfg, token_ids) if head is None else head, target)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    hist, start, seen = History(), time.perf_counter(), 0
    autocast = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    for step in range(cfg.steps):
        pick = torch.randint(len(seqs), (cfg.batch,), generator=gen).tolist()
        tokens, lengths = pad([seqs[i] for i in pick], dev)
        seen += sum(len(seqs[i].tokens) for i in pick)
        z, feats = target_pass(target, tokens, head.feature_layers)
        with autocast:
            states = ttt_states(head, target, tokens, feats.float(), cfg.passes)
            loss, per = head_loss(head, states, z, lengths, cfg.decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * lr_scale(step, time.perf_counter() - start, cfg)
        opt.step()
        out_of_time = cfg.seconds is not None and time.perf_counter() - start > cfg.seconds
        if step % log_every == 0 or step == cfg.steps - 1 or out_of_time:
            hist.steps.append(step)
            hist.loss.append(float(loss.detach()))
            hist.per_pass.append([float(x) for x in per])
            hist.seconds.append(time.perf_counter() - start)
            hist.tokens.append(seen)
            if on_log:
                on_log(step, hist.loss[-1], hist.per_pass[-1])
        if out_of_time:
            break
    return head.eval().requires_grad_(False), hist


def init_file(init: str):
    """The head file ``TrainConfig.init`` names: ``shipped`` (the embedded model's) or a file/directory."""
    return draft_head_file("" if init == "shipped" else init)


def initial_head(target: Llama, cfg: TrainConfig, token_ids: torch.Tensor | None) -> DraftHead:
    """A new head (``cfg.feature_layers``, vocabulary ``token_ids``, final norm the target's), or the
    head ``cfg.init`` names, checked to be one for this target and for ``cfg``: its feature layers and
    vocabulary are kept, so a ``cfg`` or ``token_ids`` asking for others is refused."""
    if cfg.init is None:
        head = DraftHead(target.config, cfg.feature_layers or default_layers(target.config.num_layers), token_ids)
        head.norm.data.copy_(target.norm.float())
        return head
    path = init_file(cfg.init)
    head, meta = load_head(path, target.config)
    try:
        check_fingerprint(f"init={cfg.init}", path, meta, fingerprint(target))
    except ValueError as e:
        raise ValueError(f"{e} (or drop init: a head continues only on the target it was trained for)") from None
    if cfg.feature_layers is not None and tuple(cfg.feature_layers) != head.feature_layers:
        raise ValueError(f"feature_layers={cfg.feature_layers} but the init head {path} reads layers "
                         f"{head.feature_layers}: drop feature_layers (--feature-layers) to continue it, or drop init")
    if cfg.vocab != len(head.token_ids) and not (cfg.vocab == 0 and head.full_vocab):
        raise ValueError(f"vocab={cfg.vocab} but the init head {path} has {len(head.token_ids)} tokens: pass "
                         f"vocab={len(head.token_ids)} (--vocab) to continue it, or drop init")
    if token_ids is not None and not torch.equal(torch.as_tensor(token_ids).sort().values, head.token_ids.cpu()):
        raise ValueError(f"token_ids differ from the init head's vocabulary ({path}): pass None when "
                         "continuing a head (it keeps its own)")
    return head


def for_training(head: DraftHead, target: Llama) -> DraftHead:
    """``head`` in float32 on the target's device with the target's embedding and LM head rows lent
    in float32: how ``ttt_states`` runs it (training, and ``acceptance_by_position`` for any head)."""
    head = head.float().to(target.embed.weight.device)
    head.attach(target)
    head.lent = tuple(w.float() for w in head.lent)
    return head


@torch.no_grad()
def acceptance_by_position(head: DraftHead, target: Llama, seqs: list[Sequence], passes: int, temperature: float = 0.7,
                           batch: int = 16) -> dict:
    """Teacher-forced acceptance of the k-th drafted token (k = pass), over the continuations of
    ``seqs``: ``greedy`` = how often argmax q = argmax p; ``sampled`` = E[sum_v min(p_v, q_v)] at
    ``temperature`` (the chance that a draft sampled from q is accepted), both given the earlier
    drafted tokens were right."""
    dev = target.embed.weight.device
    greedy, sampled, count = torch.zeros(passes), torch.zeros(passes), torch.zeros(passes)
    for i in range(0, len(seqs), batch):
        group = seqs[i : i + batch]
        tokens, lengths = pad(group, dev)
        z, feats = target_pass(target, tokens, head.feature_layers)
        states = ttt_states(head, target, tokens, feats.float(), passes)
        pos = torch.arange(tokens.shape[1], device=dev)
        starts = torch.tensor([s.prompt_len for s in group], device=dev)
        for k, s in enumerate(states):
            mask = (pos[None] >= torch.clamp(starts[:, None] - 1, min=k + 1)) & (pos[None] < lengths[:, None] - 1)
            w = head.full_logits(head.logits(s).reshape(-1, head.lent[1].shape[0])).view(*s.shape[:2], -1)
            greedy[k] += ((w.argmax(-1) == z.argmax(-1)) & mask).sum().cpu()
            p, q = (z / temperature).softmax(-1), (w / temperature).softmax(-1)
            sampled[k] += (torch.minimum(p, q).sum(-1) * mask).sum().cpu()
            count[k] += mask.sum().cpu()
    n = count.clamp(min=1)
    return {"greedy": (greedy / n).tolist(), "sampled": (sampled / n).tolist(), "positions": count.long().tolist()}
