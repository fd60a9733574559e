"""The torch engine: load a target and drafts once, then generate with the one core loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from flashspec.bandits import POLICIES, BanditConfig
from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, StepRecord, decode, speculate
from flashspec.stats import summarize

from .backend import TorchBackend
from .drafts import LAYERSKIP_DEFAULT, LookupDraft, ModelDraft, TransformersDraft, draft_from_model
from .weights import LLAMA_FAMILY, LoadedModel, directory_model_type, load, load_transformers_directory

DRAFT_HELP = (
    "ngram[:N] | nf4 | layerskip[:L1-L2,L3] | self | PATH (a model directory or .gguf sharing the tokenizer) "
    "| a transformers model object (Python API)"
)
TARGET_HELP = "None (the embedded SmolLM2-135M-Instruct) | PATH | nf4 | nf4:PATH (an NF4 copy of that target)"


def parse_layers(text: str, num_layers: int) -> frozenset[int]:
    """'20-29,5' -> {5, 20, ..., 29}."""
    layers: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            layers.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"layerskip:{text} must list layers like 20-29,5") from None
    if not layers or min(layers) < 0 or max(layers) >= num_layers:
        raise ValueError(f"layerskip:{text} must name layers in [0, {num_layers})")
    if len(layers) == num_layers:
        raise ValueError(f"layerskip:{text} skips every layer")
    return frozenset(layers)


def load_target(spec: str | None, dtype: torch.dtype, device) -> LoadedModel:
    """``TARGET_HELP``: a model as ``weights.load`` reads it, or ``nf4[:PATH]``, its NF4 copy."""
    if spec is not None and (spec == "nf4" or spec.startswith("nf4:")):
        from .nf4 import quantize_nf4

        base = load(spec[4:] or None, dtype, device)
        return LoadedModel(quantize_nf4(base.model), base.tokenizer, f"{base.name} (nf4)")
    return load(spec, dtype, device)


class Engine:
    """``Engine(target=None)`` loads the embedded SmolLM2-135M-Instruct; ``generate`` runs it.

    ``target``: a LoadedModel or a spelling of TARGET_HELP (``"nf4"``: the embedded model in NF4).
    ``drafts``: names of DRAFT_HELP, LoadedModels or transformers causal-LM objects.
    """

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
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is unknown; choose one of {sorted(POLICIES)}")
        if not drafts:
            raise ValueError("drafts must name at least one draft; use speculate=False for plain decoding")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.target = target if isinstance(target, LoadedModel) else load_target(target, self.dtype, self.device)
        self.tokenizer = self.target.tokenizer
        self.policy_name, self.objective = policy, objective
        self.policy = None  # shared across generate calls, so what one request learns helps the next
        BanditConfig(objective=objective)  # validate now
        self.drafts = [self.make_draft(d) for d in drafts]
        config = self.target.model.config
        eos = set(config.eos_token_ids)
        self.backend = TorchBackend(self.target.model, self.drafts, sorted(eos), verify_impl)

    def make_draft(self, spec) -> ModelDraft | LookupDraft | TransformersDraft:
        """A draft from its name (see DRAFT_HELP), a LoadedModel or a transformers model object."""
        model = self.target.model
        if not isinstance(spec, str):
            return draft_from_model(spec, model, self.dtype, self.device)
        name, _, arg = spec.partition(":")
        if name == "ngram":
            try:
                return LookupDraft(spec, max_n=int(arg or 3))
            except ValueError:
                raise ValueError(f"draft {spec!r}: use ngram or ngram:N with N >= 1") from None
        if name == "layerskip":
            return ModelDraft(spec, model, parse_layers(arg or LAYERSKIP_DEFAULT, model.config.num_layers))
        if spec == "nf4":
            from .nf4 import is_nf4, quantize_nf4

            return ModelDraft("nf4", model if is_nf4(model) else quantize_nf4(model))
        if spec == "self":
            return ModelDraft("self", model)
        if Path(spec).is_dir() and directory_model_type(spec) not in LLAMA_FAMILY:
            hf = load_transformers_directory(spec, self.dtype, self.device)
            hf.config.name_or_path = Path(spec).name
            return draft_from_model(hf, model, self.dtype, self.device)
        try:
            other = load(spec, self.dtype, self.device)
        except FileNotFoundError as e:
            raise ValueError(f"draft {spec!r} is unknown ({e}); a draft is {DRAFT_HELP}") from None
        return draft_from_model(other, model, self.dtype, self.device)

    def policy_for(self, gamma: int, seed: int):
        if self.policy is None or self.policy_gamma != gamma:
            config = BanditConfig(objective=self.objective, gamma=gamma)
            self.policy = POLICIES[self.policy_name](len(self.drafts), config, rng=seed)
            self.policy_gamma = gamma
        return self.policy

    def encode(self, prompt: str, chat: bool) -> list[int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        tok = self.tokenizer
        if chat and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return list(ids)
        return list(tok(prompt)["input_ids"])

    def generate(
        self,
        prompt: str | Sequence[str],
        *,
        gamma: int = 4,
        temperature: float = 0.7,
        top_k: int = 0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
        seed: int | Sequence[int] = 0,
        speculation: bool = True,
        chat: bool = True,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> dict:
        """Generate for one prompt (str) or a batch (list of str); returns SPEC.md's stats dict.

        ``seed`` is the request's own: an int for every prompt, or one per prompt. A request's
        tokens depend on its prompt and seed only, not on its row in the batch.
        """
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts:
            raise ValueError("prompt must be a string or a non-empty list of strings")
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)
        ids = [self.encode(p, chat) for p in prompts]
        seeds = [seed] * len(prompts) if isinstance(seed, int) else list(seed)
        if len(seeds) != len(prompts) or any(not isinstance(s, int) or not 0 <= s < 2**63 for s in seeds):
            raise ValueError(f"seed must be an int in [0, 2**63) or one per prompt ({len(prompts)}), got {seed!r}")
        seed_t = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            if speculation:
                policy = self.policy_for(gamma, seeds[0])
                outs, records = speculate(self.backend, policy, ids, sampling=sampling, spec=spec, seed=seed_t, on_step=on_step)
            else:
                outs, records = decode(self.backend, ids, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed_t, on_step=on_step)
        wall = time.perf_counter() - start
        stats = summarize(records, self.backend.draft_names, wall, sum(map(len, outs)))
        texts = [self.tokenizer.decode(o, skip_special_tokens=True, clean_up_tokenization_spaces=False) for o in outs]
        single = isinstance(prompt, str)
        return {
            "text": texts[0] if single else texts,
            "tokens": outs[0] if single else outs,
            **stats,
            "speculation": speculation,
            "gamma": gamma if speculation else None,
            "policy": self.policy_name if speculation else None,
            "drafts": self.backend.draft_names if speculation else [],
            "backend": "torch",
            "device": str(self.device),
            "wall_s": wall,
        }
