"""The torch backend: implements ``flashspec.backend.Backend`` over our Llama model.

Everything a step needs stays on the device: the token history, each row's length, the finished
flags. ``commit`` starts an asynchronous copy of the step's small results, which the loop reads one
step later (``StepHandle.fetch``), so the host never waits for the device inside a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flashspec.backend import FeatureDraft, StepView, feature_layers
from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult

from .drafts import LookupDraft, ModelDraft, Proposal, Sequences
from .faults import discard_flagged, screen
from .layers import default_impl
from .model import Llama
from .parallel import is_split
from .sample_next import next_token_result, sample_next_reference, sample_next_triton
from .device import next_pow2
from .free import expand, free_proposals, recomputable, score_into
from .verify import verify


@dataclass
class AsyncHandle:
    """Device results copied to the host without blocking; ``fetch`` waits for that copy only."""

    num_accepted: torch.Tensor
    active: torch.Tensor
    done: torch.Tensor
    bad: torch.Tensor
    event: torch.cuda.Event | None
    free: torch.Tensor | None = None  # [2, R, B] int32: flashspec_torch.free's counts; None: not scored
    free_drafts: tuple[int, ...] = ()  # (D, then the R recomputable drafts' indices, in free's order)
    drafted: torch.Tensor | None = None  # [B] int32: tokens each row proposed; None: not recorded

    def fetch(self) -> StepView:
        if self.event is not None:
            self.event.synchronize()
        free = None if self.free is None else [expand(c, self.free_drafts[0], list(self.free_drafts[1:]))
                                               for c in self.free.numpy()]
        return StepView(self.num_accepted.numpy().copy(), self.active.numpy().copy(), self.done.numpy().copy(),
                        self.bad.numpy().copy(), free_scored=None if free is None else free[0],
                        free_accepted=None if free is None else free[1],
                        drafted=None if self.drafted is None else self.drafted.numpy().copy())


class HostMirror:
    """Two sets of pinned host buffers, used in turn: the loop reads step t-1 before step t+1 is
    committed, so a slot is never overwritten before it was read. (Allocating pinned memory every
    step costs milliseconds; pageable memory would make the copy block the host.)"""

    def __init__(self, batch: int, device: torch.device, drafts: Sequence[int] = (0,)):
        """``drafts``: (D, then the recomputable drafts' indices) for flashspec_torch.free's counts."""
        self.device, self.turn, self.drafts = device, 0, tuple(drafts)
        if device.type == "cuda":
            self.slots = [
                [torch.empty(batch, dtype=dt, pin_memory=True) for dt in (torch.int32, torch.bool, torch.bool, torch.uint8)]
                + [torch.empty((2, len(drafts) - 1, batch), dtype=torch.int32, pin_memory=True),
                   torch.empty(batch, dtype=torch.int32, pin_memory=True)]
                for _ in range(2)
            ]

    def start(self, num_accepted, active, done, bad, free=None, drafted=None) -> AsyncHandle:
        """``free``: [2, R, B] int32 full-information counts (flashspec_torch.free), or None; ``drafted``:
        [B] int32 tokens each row proposed, or None."""
        if self.device.type != "cuda":
            return AsyncHandle(num_accepted.clone(), active.clone(), done.clone(), bad.clone(), None,
                               None if free is None else free.clone(), self.drafts,
                               None if drafted is None else drafted.clone())
        slot = self.slots[self.turn]
        self.turn ^= 1
        for h, t in zip(slot, (num_accepted.to(torch.int32), active, done, bad)):
            h.copy_(t, non_blocking=True)
        if free is not None:
            slot[4].copy_(free, non_blocking=True)
        if drafted is not None:
            slot[5].copy_(drafted, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return AsyncHandle(*slot[:4], event, None if free is None else slot[4], self.drafts,
                           None if drafted is None else slot[5])


class StepGraphs:
    """Whole steps captured as CUDA graphs (per key) and replayed after.

    A step reads and writes only buffers that live as long as the batch state (token history,
    lengths, caches, seed, offset), so one capture serves every later step. Capture is preceded by
    one eager warm-up (compiles the Triton kernels, creates cuBLAS handles) on one side stream kept
    for the object's life (cuBLAS keeps a workspace per stream: a fresh stream per capture would
    hold one more each time); the warm-up's effects on the state are undone from a snapshot, so the
    first replay is the step's real execution. At most ``max_graphs`` are kept, the oldest dropped
    first (a server that sees many sampling settings holds a bounded set).
    """

    def __init__(self, max_graphs: int = 64):
        if max_graphs < 1:
            raise ValueError(f"{max_graphs=} must be >= 1")
        self.max_graphs = max_graphs
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream()
        self.graphs: dict = {}

    def capture(self, key, step, state: Sequence[torch.Tensor]) -> bool:
        """Capture ``step`` under ``key`` unless it is captured already (nothing is executed);
        whether it was new."""
        if key in self.graphs:
            return False
        try:
            snapshot = [t.clone() for t in state]
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                step()
            torch.cuda.current_stream().wait_stream(self.side)
            for t, saved in zip(state, snapshot):
                t.copy_(saved)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.side):
                outputs = step()
        except BaseException:  # e.g. Ctrl-C mid-capture: a half-made graph must not be kept, nor its pool
            self.clear()
            raise
        if len(self.graphs) >= self.max_graphs:
            del self.graphs[next(iter(self.graphs))]  # after the new capture: the pool keeps a live graph
        self.graphs[key] = (graph, outputs)
        return True

    def replay(self, key, step, state: Sequence[torch.Tensor]):
        """Replay the graph of ``key`` (capturing ``step`` first if new); returns the outputs
        ``step`` returned when it was captured (static buffers, refreshed by every replay)."""
        self.capture(key, step, state)
        graph, outputs = self.graphs[key]
        graph.replay()
        return outputs

    def clear(self) -> None:
        """Drop every graph, and their memory pool with them: a pool whose graphs are all gone
        cannot take new captures (PyTorch asserts), so the next capture gets a fresh one."""
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle()


class StaticSteps:
    """The graphed steps' fixed-shape code run eagerly, without capture: what ``graphs=True``
    does off CUDA, so the CPU tests cover the code that the GPU captures."""

    def capture(self, key, step, state) -> bool:
        return False  # nothing is captured

    def replay(self, key, step, state):
        return step()

    def clear(self) -> None:
        pass


class TorchBackend:
    """``graphs`` (default: on CUDA) captures each kind of step in a CUDA graph: the draft with a
    given arm, scoring, verification and commit as one replay, so a step costs one launch from the
    host. Without graphs (the CPU default) steps run eagerly with host-side length bounds, which
    keeps attention short; ``graphs=True`` off CUDA runs the fixed-shape graphed code eagerly."""

    def __init__(self, target: Llama, drafts: Sequence[ModelDraft | LookupDraft], eos_ids: Sequence[int] = (),
                 verify_impl: str | None = None, graphs: bool | None = None):
        vocab = target.config.vocab_size
        for d in drafts:
            if isinstance(d, ModelDraft) and d.model.config.vocab_size != vocab:
                raise ValueError(
                    f"draft {d.name!r} has vocabulary size {d.model.config.vocab_size} but the target has {vocab}: "
                    "a draft must share the target's tokenizer"
                )
        self.target, self.drafts = target, list(drafts)
        self.draft_names = [d.name for d in self.drafts]
        self.hidden = feature_layers(self.drafts)  # target layers whose residual stream the drafts read
        self.device = target.embed.weight.device
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], dtype=torch.int64, device=self.device)
        self.verify_impl = verify_impl
        self.commit_impl: str | None = None  # "triton" (one kernel) or "reference"; None: by device
        self.graphed = self.device.type == "cuda" if graphs is None else bool(graphs)
        if self.graphed and self.device.type != "cuda" and is_split(target):
            raise ValueError("graphs=True with a tensor-parallel target off CUDA: the graphed steps with their "
                             "collectives inside are the GPU (NCCL) path; on the CPU leave graphs None (eager steps)")
        self.graphs = (StepGraphs() if self.device.type == "cuda" else StaticSteps()) if self.graphed else None
        self.shape: tuple[int, int] | None = None  # (B, S) of the buffers below
        self.free_gamma = 0  # score_free's G (0: no full-information scoring)

    # -- the batch

    def prefill(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, margin: int = 66) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        b, longest = len(prompts), max(len(p) for p in prompts)
        limit = self.target.config.max_position_embeddings
        if longest + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {limit} tokens"
            )
        self.allocate(b, longest + max_new_tokens + margin)
        dev, seqs = self.device, self.seqs
        host = torch.zeros((b, longest), dtype=torch.int64)
        for i, p in enumerate(prompts):
            host[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.int64)
        seqs.tokens[:, :longest].copy_(host)
        seqs.length.copy_(torch.tensor([len(p) for p in prompts], dtype=torch.int64))
        seqs.max_len_bound, seqs.step = longest, 0
        self.prompt_len.copy_(seqs.length)
        self.max_new.fill_(max_new_tokens)
        self.done.zero_()
        self.bad.zero_()
        if longest > 1:  # K/V of every prompt token but the last (the first step feeds the last)
            pos = torch.arange(longest - 1, device=dev)[None].expand(b, -1)
            self.run_target(seqs.tokens[:, : longest - 1], pos, longest - 1, logits_last=0)
        for d in self.drafts:
            d.start(b, self.shape[1])

    def allocate(self, batch: int, s_needed: int) -> None:
        """Buffers for a batch; kept (and the graphs with them) while the next batch fits."""
        if self.shape is not None and self.shape[0] == batch and self.shape[1] >= s_needed:
            return
        s_max = max(512, -(-s_needed // 256) * 256) if self.graphed else s_needed  # few re-captures
        dev = self.device
        i64 = dict(dtype=torch.int64, device=dev)
        self.seqs = Sequences(torch.zeros((batch, s_max), **i64), torch.zeros(batch, **i64), 0)
        if self.hidden:
            width = len(self.hidden) * self.target.config.hidden_size
            self.seqs.features = torch.zeros((batch, s_max, width), dtype=self.target.embed.weight.dtype, device=dev)
        self.prompt_len = torch.zeros(batch, **i64)
        self.max_new = torch.zeros(batch, **i64)  # per row: slot requests have their own
        self.done = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.active = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.bad = torch.zeros(batch, dtype=torch.uint8, device=dev)  # flashspec.faults bits of the step
        self.seed = torch.zeros(batch, **i64)
        self.offset = torch.zeros((), **i64)
        self.cache = self.target.new_cache(batch, s_max)
        scored = recomputable(self.drafts)
        self.mirror = HostMirror(batch, dev, (len(self.drafts), *scored))
        self.free = torch.zeros((2, len(scored), batch), dtype=torch.int32, device=dev)  # flashspec_torch.free
        self.drafted = torch.zeros(batch, dtype=torch.int32, device=dev)  # per row: tokens proposed by the last step
        self.shape = (batch, s_max)
        if self.graphs is not None:
            self.graphs.clear()

    def state(self) -> list[torch.Tensor]:
        """What a step writes besides the KV caches (whose rewrites are idempotent)."""
        valid = [d.valid for d in self.drafts if isinstance(d, (ModelDraft, FeatureDraft))]
        return [self.seqs.tokens, self.seqs.length, self.done, self.active, self.bad, *valid]

    def attend(self, extra: int) -> int:  # a host bound on the slots any query may see
        return self.cache.max_len if self.graphed else min(self.seqs.max_len_bound + extra, self.cache.max_len)

    # -- one speculative step

    def step(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> AsyncHandle:
        """draft -> score -> verify -> commit; one CUDA-graph replay when graphed. A tree draft
        (``tree_step.HeadTreeDraft``) runs ``tree_step``, ``gamma`` its depth."""
        draft = self.drafts[arm]
        if not self.graphed or not draft.capturable:  # e.g. a transformers model with growing inputs
            if getattr(draft, "tree", False):
                from .tree_step import tree_step

                return tree_step(self, arm, gamma, sampling, seed, offset)
            proposal = self.draft(arm, gamma, sampling, seed, offset)
            return self.commit(self.verify(self.score(proposal), proposal, sampling, seed, offset),
                               gamma if proposal.lengths is None else proposal.lengths, skip=arm)
        if draft.lagging(self.seqs, gamma):
            draft.catch_up(self.seqs, gamma)
        self.set_counters(seed, offset)
        num_accepted = self.graphs.replay(self.step_key(arm, gamma, sampling), self.graphed_step(arm, gamma, sampling),
                                          self.state())
        draft.mark_used(self.seqs, gamma)
        return self.commit_host(num_accepted, gamma + 1)

    def step_key(self, arm: int, gamma: int, sampling: SamplingConfig) -> tuple:
        """The graph of a speculative step: a tree arm's ("tree", ...) or a chain arm's ("spec", ...)."""
        kind = "tree" if getattr(self.drafts[arm], "tree", False) else "spec"
        return (kind, arm, gamma, sampling, self.free_gamma)

    def graphed_step(self, arm: int, gamma: int, sampling: SamplingConfig):
        """The device work of one speculative step, reading seed / offset from the buffers."""
        draft = self.drafts[arm]

        def run():
            p = draft.propose(self.seqs, gamma, sampling, self.seed, self.offset, graphed=True)
            r = self.verify(self.score(p), p, sampling, self.seed, self.offset)
            self.commit_device(r, gamma if p.lengths is None else p.lengths, skip=arm)
            return r.num_accepted

        def run_tree():
            from .tree_step import tree_result

            r, depth = tree_result(self, arm, gamma, sampling, self.seed, self.offset, graphed=True)
            self.commit_device(r, depth, skip=arm)
            return r.num_accepted

        return run_tree if getattr(draft, "tree", False) else run

    def graphed_decode(self, sampling: SamplingConfig):
        def run():
            r = self.sample_next(sampling, self.seed, self.offset)
            self.commit_device(r, 0)
            return r.num_accepted

        return run

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        """Capture now every step kind a request with these settings can run: each capturable
        draft at ``gamma`` (None: none) and plain decoding. Call after ``prefill`` (a batch that
        needs new buffers drops the graphs). The policy may pick any draft at any step, so
        capturing all of them here puts the graphs' memory and compile time into the first call
        instead of a later one. Then every model draft catches up over the prompt (``get_ready``), so that
        its first step does a step's work only. Returns the graphs captured (0 without graphs, or when all exist)."""
        captured = 0
        if self.graphed:
            for arm, d in enumerate(self.drafts):
                if gamma is not None and d.capturable:  # a lagging model draft's unfed K/V do not matter to a capture
                    captured += self.graphs.capture(self.step_key(arm, gamma, sampling),
                                                    self.graphed_step(arm, gamma, sampling), self.state())
            captured += self.graphs.capture(("plain", sampling, self.free_gamma), self.graphed_decode(sampling), self.state())
        if gamma is not None:
            for d in self.drafts:
                d.get_ready(self.seqs, gamma)
        return captured

    def set_counters(self, seed, offset: int) -> None:
        """The step's seed / offset into the buffers the graphs read."""
        if isinstance(seed, torch.Tensor):
            self.seed.copy_(seed.reshape(-1).expand(self.seed.shape[0]))
        else:
            self.seed.fill_(seed)
        self.offset.fill_(offset)

    def draft(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> Proposal:
        d = self.drafts[arm]
        proposal = d.propose(self.seqs, gamma, sampling, seed, offset)
        d.mark_used(self.seqs, gamma)
        return proposal

    def score(self, proposal: Proposal) -> torch.Tensor:  # [B, G+1, V]
        length = self.seqs.length
        g = proposal.tokens.shape[1]
        last = self.seqs.tokens.gather(1, (length - 1)[:, None])
        pos = (length - 1)[:, None] + torch.arange(g + 1, device=self.device)
        return self.run_target(torch.cat([last, proposal.tokens], 1), pos, self.attend(g))

    def run_target(self, tokens, pos, attend: int, logits_last: int | None = None):
        """The target over tokens [B, T] at pos [B, T]; with feature drafts, its hidden states at
        ``self.hidden`` go into ``seqs.features`` at pos (clamped into the buffer: rows past the end are
        finished)."""
        if not self.hidden:
            return self.target(tokens, pos, self.cache, attend, logits_last=logits_last)
        z, feats = self.target(tokens, pos, self.cache, attend, logits_last=logits_last, hidden=self.hidden)
        f = self.seqs.features
        f.scatter_(1, pos.clamp(max=f.shape[1] - 1)[..., None].expand(-1, -1, f.shape[-1]), feats.to(f.dtype))
        return z

    def verify(self, target_logits, proposal: Proposal, sampling: SamplingConfig, seed, offset) -> VerifyResult:
        target_logits, logits, logprobs = screen(self.bad, target_logits, proposal.logits, proposal.logprobs)
        return verify(
            target_logits, proposal.tokens, logits, logprobs,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            seed=seed, offset=offset, impl=self.verify_impl, validate=False,  # screened above; ids are the drafts' own
            draft_lengths=proposal.lengths,  # a device tensor made inside the step: no capture per length
        )

    # -- plain decoding

    def decode_one(self, sampling: SamplingConfig, seed, offset: int) -> AsyncHandle:
        """Plain autoregressive decoding on the same engine: one target forward, one token."""
        if not self.graphed:
            return self.commit(self.sample_next(sampling, seed, offset), 0)
        self.set_counters(seed, offset)
        num_accepted = self.graphs.replay(("plain", sampling, self.free_gamma), self.graphed_decode(sampling), self.state())
        return self.commit_host(num_accepted, 2)

    def sample_next(self, sampling: SamplingConfig, seed, offset) -> VerifyResult:
        length = self.seqs.length
        last = self.seqs.tokens.gather(1, (length - 1)[:, None])
        z = self.run_target(last, (length - 1)[:, None], self.attend(0))[:, 0]
        triton = (self.commit_impl or default_impl(self.device)) == "triton"
        if sampling.greedy:  # screen + argmax: one launch on a GPU instead of about ten
            return (greedy_next_triton if triton else greedy_next_reference)(z, self.bad)
        return (sample_next_triton if triton else sample_next_reference)(z, sampling, seed, offset, self.bad)

    # -- commit

    def commit(self, result: VerifyResult, drafted: torch.Tensor | int | None = None,
               skip: int | None = None) -> AsyncHandle:
        self.commit_device(result, drafted, skip)
        return self.commit_host(result.num_accepted, result.tokens.shape[1])

    def score_free(self, gamma: int) -> int:
        """From now on every step also scores each recomputable draft at ``gamma`` tokens against what it
        emitted (``flashspec_torch.free``; 0: stop). Steps are captured per G of scoring. Returns the drafts scored."""
        if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= 64:
            raise ValueError(f"gamma={gamma!r} must be an integer in [0, 64] (0: no full-information scoring)")
        self.free_gamma = gamma
        return len(recomputable(self.drafts)) if gamma else 0

    def commit_device(self, result: VerifyResult, drafted: torch.Tensor | int | None = None,
                      skip: int | None = None) -> None:
        """Append num_accepted + 1 tokens per live row (cut at EOS and at max_new_tokens), in place;
        ``drafted``: the tokens each row proposed ([B] or one for all; None: not recorded); ``skip``: the draft the
        step ran, not scored for free (its verification counted it: 0 tokens scored)."""
        seqs = self.seqs
        if isinstance(drafted, torch.Tensor):
            self.drafted.copy_(drafted)
        elif drafted is not None:
            self.drafted.fill_(drafted)
        proposals = free_proposals(self.drafts, seqs, self.free_gamma, skip) if self.free_gamma else []
        length_before = seqs.length.clone()
        args = (result.num_accepted, result.tokens, self.eos, seqs.tokens, seqs.length, self.prompt_len,
                self.max_new, self.done, self.active)
        if (self.commit_impl or default_impl(self.device)) == "triton":
            commit_triton(*args)
        else:
            commit_reference(*args)
        discard_flagged(self.bad, length_before, seqs.length, self.done, self.active)  # NaN / inf logits
        if proposals:
            score_into(self.free, proposals, result.tokens, result.num_accepted)

    def commit_host(self, num_accepted: torch.Tensor, width: int) -> AsyncHandle:
        """Host bookkeeping of a committed step; starts the asynchronous copy of its results."""
        seqs = self.seqs
        bound = seqs.max_len_bound + width
        if self.device.type == "cpu":  # the lengths are host memory: the exact bound waits for nothing
            bound = int(seqs.length.max())
        seqs.max_len_bound = min(bound, seqs.tokens.shape[1])
        seqs.step += 1
        return self.mirror.start(num_accepted, self.active, self.done, self.bad, self.free if self.free_gamma else None,
                                 self.drafted)

    def outputs(self) -> list[list[int]]:
        tokens = self.seqs.tokens.cpu().numpy()
        start, end = self.prompt_len.cpu().numpy(), self.seqs.length.cpu().numpy()
        return [tokens[b, start[b] : end[b]].tolist() for b in range(len(start))]



def commit_reference(
    num_accepted: torch.Tensor,  # [B] int32
    emitted: torch.Tensor,  # [B, W] int32: num_accepted + 1 tokens, then -1
    eos: torch.Tensor,  # [E] int64
    tokens: torch.Tensor,  # [B, S] int64, appended to in place
    length: torch.Tensor,  # [B] int64, advanced in place
    prompt_len: torch.Tensor,  # [B] int64
    max_new: torch.Tensor,  # [B] int64
    done: torch.Tensor,  # [B] bool, updated in place
    active: torch.Tensor,  # [B] bool, written: the row was live during this step
) -> None:
    n = num_accepted.to(torch.int64)
    emitted = emitted.to(torch.int64)
    j = torch.arange(emitted.shape[1], device=emitted.device)
    count = n + 1
    is_eos = (j[None] < count[:, None]) & torch.isin(emitted, eos)
    hit_eos = is_eos.any(-1)
    count = torch.where(hit_eos, is_eos.int().argmax(-1) + 1, count)
    count = torch.minimum(count, max_new - (length - prompt_len))
    active.copy_(~done)
    count = torch.where(active, count, 0)
    pos = (length[:, None] + j).clamp(max=tokens.shape[1] - 1)
    old = tokens.gather(1, pos)
    tokens.scatter_(1, pos, torch.where(j[None] < count[:, None], emitted, old))
    length.add_(count)
    done.logical_or_((active & hit_eos & (count > 0)) | (length - prompt_len >= max_new))


def commit_triton(num_accepted, emitted, eos, tokens, length, prompt_len, max_new, done, active) -> None:
    """``commit_reference`` as one kernel launch (flashspec_torch/kernels/steps.py)."""
    from .kernels.steps import commit_kernel

    b, w = emitted.shape
    commit_kernel[(b,)](num_accepted, emitted, eos, tokens, length, prompt_len, max_new, done, active,
                        w, eos.numel(), tokens.shape[1], BLOCK_W=next_pow2(w), num_warps=1)


def greedy_next_reference(
    z: torch.Tensor,  # [B, V] float logits
    bad: torch.Tensor,  # [B] uint8, written: flashspec.faults bits of this step
) -> VerifyResult:  # num_accepted [B] zeros; tokens [B, 2] int32: (argmax, -1)
    """Plain greedy decoding's result: the fault screen, then torch.argmax."""
    screen(bad, z[:, None])
    return next_token_result(z.argmax(-1))


def greedy_next_triton(z: torch.Tensor, bad: torch.Tensor) -> VerifyResult:  # as greedy_next_reference
    """``greedy_next_reference`` as one kernel launch (flashspec_torch/kernels/steps.py)."""
    from flashspec.faults import TARGET_LOGITS

    from .kernels.steps import greedy_next_kernel

    b, v = z.shape
    tokens = torch.empty((b, 2), dtype=torch.int32, device=z.device)
    num = torch.empty((b,), dtype=torch.int32, device=z.device)
    block = min(8192, next_pow2(v)) if z.is_cuda else min(1024, next_pow2(v))
    greedy_next_kernel[(b,)](z, tokens, num, bad, v, z.stride(0), FLAG=TARGET_LOGITS, BLOCK_V=block,
                             num_warps=16 if block >= 4096 else 4)
    return VerifyResult(num, tokens)
