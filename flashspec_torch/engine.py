"""The torch engine: load a target and drafts once, then generate with the one core loop."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from flashspec.adaptive import engine_policies
from flashspec.bandits import BanditConfig
from flashspec.config import SamplingConfig
from flashspec.drafts import DRAFT_HELP, layerskip_layers, parse_draft
from flashspec.engine import EngineBase
from flashspec.loop import SpecConfig
from flashspec.weights import LLAMA_FAMILY, directory_model_type

from . import parallel
from .slots import TorchSlotBackend
from .drafts import LookupDraft, ModelDraft, TransformersDraft, check_stop_below, draft_from_model
from .faults import scrub_caches
from .verify import IMPLS
from .weights import LoadedModel, load, load_transformers_directory

def load_target(spec: str | None, dtype: torch.dtype, device) -> LoadedModel:
    """``flashspec.drafts.TARGET_HELP``: a model as ``weights.load`` reads it, or ``nf4[:PATH]``, its NF4 copy."""
    if spec is not None and (spec == "nf4" or spec.startswith("nf4:")):
        from .nf4 import quantize_nf4

        base = load(spec[4:] or None, dtype, device)
        return LoadedModel(quantize_nf4(base.model), base.tokenizer, f"{base.name} (nf4)")
    return load(spec, dtype, device)


class Engine(EngineBase):
    """``Engine(target=None)`` loads the embedded SmolLM2-135M-Instruct; ``generate`` runs it.

    ``target``: a LoadedModel or a spelling of TARGET_HELP (``"nf4"``: the embedded model in NF4).
    ``drafts``: names of DRAFT_HELP, LoadedModels or transformers causal-LM objects.
    ``batch_invariant``: every product of the target by ``flashspec_torch.invariant_matmul`` and
    attention with a fixed tiling, so that a row's logits are the same bits alone, in any batch and
    as one of a scoring pass's rows: a request's tokens then depend neither on the requests beside it
    nor on speculation, in bf16 too (the default multiplies with cuBLAS, whose tiling follows the
    row count). CUDA, or the CPU under TRITON_INTERPRET=1; plain Llama-shaped targets only (refused
    otherwise, here).
    ``stop_below`` (model drafts and draft heads; not head-tree's trees, whose size is fixed): the dynamic
    draft length; a row stops drafting after a token its draft gives probability < stop_below at
    temperature 1 (0: always G tokens; exact, docs/adaptive.md). None: ``HEAD_STOP_BELOW_CPU`` for draft heads
    on the CPU, where a proposal that every row has stopped ends there and shortens the scoring pass
    (``heads.HeadDraft.stops_early``), else 0 (a CUDA graph's step has G + 1 positions whatever the lengths).
    """

    backend_name = "torch"

    def __init__(
        self,
        target: str | LoadedModel | None = None,
        drafts: Sequence = ("ngram",),
        *,
        policy: str = "thompson-token",
        objective: str = "throughput",
        device: str | None = None,
        dtype: torch.dtype | None = None,
        verify_impl: str | None = None,
        batch_invariant: bool = False,
        stop_below: float | None = None,
        tensor_parallel: int = 1,
    ):
        if policy not in engine_policies():
            raise ValueError(f"policy={policy!r} is unknown; choose one of {engine_policies()}")
        kinds = (str, LoadedModel, torch.nn.Module)  # names, or models sharing the tokenizer
        if isinstance(drafts, str) or not isinstance(drafts, (list, tuple)) or not all(isinstance(d, kinds) for d in drafts):
            raise TypeError(f"drafts={drafts!r} must be a sequence of draft names such as ('ngram',) or model objects "
                            f"(LoadedModel, Llama, a transformers causal LM); a draft name is {DRAFT_HELP}")
        if not drafts:
            raise ValueError("drafts must name at least one draft; use speculation=False for plain decoding")
        BanditConfig(objective=objective)  # validate now
        if verify_impl not in (None, *IMPLS):
            raise ValueError(f"verify_impl={verify_impl!r} must be one of {IMPLS} or None (by device)")
        if target is not None and not isinstance(target, (str, LoadedModel)) and not hasattr(target, "__fspath__"):
            raise TypeError(f"target must be None (the embedded model), a path or a LoadedModel, got {type(target).__name__}")
        self.device = check_device(device)
        self.tensor_parallel, self.arms = tensor_parallel, None
        if tensor_parallel != 1:
            self.rank, self.device = self.start_parallel(tensor_parallel, policy, batch_invariant)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise ValueError(f"dtype={dtype!r} must be a floating-point torch dtype (torch.float32, torch.bfloat16, ...)")
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant={batch_invariant!r} must be True or False")
        stop_below = None if stop_below is None else check_stop_below(stop_below)
        self.target = target if isinstance(target, LoadedModel) else load_target(target, self.dtype, self.device)
        weights = self.target.model.embed.weight
        if weights.device.type != self.device.type:
            raise ValueError(f"target's weights are on {weights.device} but device={str(self.device)!r}: "
                             "move the model, or pass the device it is on")
        if self.target.tokenizer is None:
            raise ValueError(f"target {self.target.name!r} has no tokenizer (tokenizer.json or tokenizer_config.json): "
                             "a target needs one to encode prompts; a directory without one can only be a draft")
        self.tokenizer = self.target.tokenizer
        self.target.model.batch_invariant = batch_invariant  # the model's own setting: it is shared with its engines
        if batch_invariant:
            self.target.model.decode_settings(self.device)  # refuses what the mode does not implement, now
        parallel.shard_model(self.target.model, self.rank, tensor_parallel)
        self.policy_name, self.objective = policy, objective
        self.drafts = [self.make_draft(d) for d in drafts]
        stoppable = [d for d in self.drafts if hasattr(d, "stop_below") and not getattr(d, "tree", False)]  # chains
        if stop_below and not stoppable:
            raise ValueError(f"stop_below={stop_below} needs a model draft or a draft head (drafts.confident_lengths); "
                             f"drafts={drafts!r} have a fixed length (a tree too): leave stop_below at 0 or add such a draft")
        for d in stoppable:
            d.stop_below = default_stop_below(d, self.device) if stop_below is None else stop_below
        config = self.target.model.config
        eos = set(config.eos_token_ids)
        self.backend = TorchSlotBackend(self.target.model, self.drafts, sorted(eos), verify_impl)

    def start_parallel(self, n: int, policy: str, batch_invariant: bool) -> tuple[int, torch.device]:
        """Join the group of ``n`` ranks (``flashspec_torch.parallel``); refuse what a split target does not run."""
        if policy == "adaptive" or batch_invariant:
            what = "policy='adaptive'" if policy == "adaptive" else "batch_invariant=True"
            raise ValueError(f"tensor_parallel={n} does not run {what} (its per-step timing / its kernels are "
                             "one device's); use another policy, or tensor_parallel=1")
        rank, device = parallel.start(n, self.device)
        self.arms = torch.distributed.new_group(backend="gloo")  # rank 0's arm choices, host to host
        return rank, device

    def policy_for(self, gamma: int, seed: int):
        """The policy; split over ranks, every rank takes rank 0's choices."""
        policy = super().policy_for(gamma, seed)
        return policy if self.arms is None else parallel.RankZeroPolicy(policy, self.arms)

    def result_extra(self, request) -> dict:
        return {"tensor_parallel": self.tensor_parallel}

    def make_draft(self, spec) -> ModelDraft | LookupDraft | TransformersDraft:
        """A draft from its name (see DRAFT_HELP), a LoadedModel or a transformers model object."""
        model = self.target.model
        if not isinstance(spec, str):
            return draft_from_model(spec, model, self.dtype, self.device)
        draft = parse_draft(spec)
        if self.tensor_parallel != 1 and draft.kind in ("nf4", "head", "head-tree"):
            raise ValueError(f"draft {spec!r} reads the target's own weights, which tensor_parallel="
                             f"{self.tensor_parallel} splits: use ngram, layerskip, self or a draft model")
        if draft.kind == "ngram":
            return LookupDraft(spec, max_n=draft.max_n)
        if draft.kind == "layerskip":
            return ModelDraft(spec, model, layerskip_layers(draft, model.config.num_layers))
        if draft.kind == "nf4":
            from .nf4 import is_nf4, quantize_nf4

            return ModelDraft("nf4", model if is_nf4(model) else quantize_nf4(model))
        if draft.kind == "self":
            return ModelDraft("self", model)
        if draft.kind == "head":
            from .heads import load_draft_head

            return load_draft_head(spec, draft.path, model, draft.top)
        if draft.kind == "head-tree":
            from .heads import read_draft_head
            from .tree_step import HeadTreeDraft

            return HeadTreeDraft(spec, read_draft_head(spec, draft.path, model, draft.top), model, draft.tree, draft.branch)
        if Path(spec).is_dir() and directory_model_type(spec) not in LLAMA_FAMILY:
            hf = load_transformers_directory(spec, self.dtype, self.device)
            hf.config.name_or_path = Path(spec).name
            return draft_from_model(hf, model, self.dtype, self.device)
        try:
            other = load(spec, self.dtype, self.device)
        except FileNotFoundError as e:
            raise ValueError(f"draft {spec!r} is unknown ({e}); a draft is {DRAFT_HELP}") from None
        return draft_from_model(other, model, self.dtype, self.device)

    def seed_array(self, seeds: list[int]) -> torch.Tensor:
        return torch.tensor(seeds, dtype=torch.int64, device=self.device)

    def running(self):
        return torch.inference_mode()

    def after_fault(self) -> None:
        with torch.inference_mode():
            scrub_caches(self.caches())  # stale NaN K/V would poison the next request's attention

    def warm_up(self, *, batch: int = 1, gamma: int = 4, temperatures: Sequence[float] = (0.0, 0.7), top_k: int = 0,
                top_p: float = 1.0, context: int | None = None) -> int:
        """Capture now the CUDA graphs of every step kind that requests of ``batch`` prompts with
        these settings can run (each draft at ``gamma``, plain decoding; one set per temperature),
        for prompt + new tokens up to ``context`` (None: 512, or the model's context if shorter).

        ``generate`` captures every draft's kind for its own settings anyway (``backend.prepare``
        after its prefill); this takes all the settings a server will see up front, so that GPU
        memory and compile time stop growing after it. Returns the number of graphs captured (0 off CUDA, where nothing is)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"{batch=} must be an integer >= 1 (the number of prompts of the requests to come)")
        samplings = [SamplingConfig(t, top_k, top_p) for t in temperatures]
        limit = self.target.model.config.max_position_embeddings
        context = min(512, limit) if context is None else context
        if isinstance(context, bool) or not isinstance(context, int) or not 2 <= context <= limit:
            raise ValueError(f"{context=} must be in [2, {limit}] (the model's context)")
        SpecConfig(gamma=gamma, max_new_tokens=context - 1)  # validates gamma
        captured = 0
        with torch.inference_mode():
            self.backend.prefill([[0]] * batch, context - 1)
            for sampling in samplings:
                captured += self.backend.prepare(gamma, sampling)
        return captured

    def caches(self) -> list:
        """Every KV cache of the current batch (the target's and the model drafts')."""
        found = [self.backend.cache] if self.backend.shape is not None else []
        return found + [d.cache for d in self.drafts if getattr(d, "cache", None) is not None]


HEAD_STOP_BELOW_CPU = 0.4  # measured: docs/draft_head.md, "Dynamic draft length on the CPU"


def default_stop_below(draft, device: torch.device) -> float:
    """``Engine(stop_below=None)``'s value for a draft that can stop: ``HEAD_STOP_BELOW_CPU`` for a draft head on
    the CPU, 0 (always G tokens) otherwise."""
    from .heads import HeadDraft

    return HEAD_STOP_BELOW_CPU if isinstance(draft, HeadDraft) and device.type == "cpu" else 0.0


def check_device(device) -> torch.device:
    """None: cuda when available, else cpu."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: the torch engine runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here (torch {torch.__version__}); use device='cpu'")
    return dev
