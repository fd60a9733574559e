"""``flashspec.generate``: the user API, dispatching to a backend that is imported only when used."""

from __future__ import annotations

import contextlib
import numbers
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from . import adaptive, adaptive_loop
from .bandits import POLICIES, BanditConfig
from .config import SamplingConfig
from .faults import NonFiniteLogitsError
from .loop import SpecConfig, StepRecord, decode_steps, speculate_steps
from .stats import per_request, summarize

BACKENDS = ("torch", "jax")


class EngineBase:
    """What the torch and JAX engines share: ``generate`` (the request checks, prompt encoding,
    the loop, SPEC.md's result dict), the draft-selection policy kept across requests.

    A subclass sets ``backend_name``, ``policy_name``, ``objective``, ``tokenizer``, ``backend``
    (a ``flashspec.backend.Backend``) and ``device``, and supplies ``seed_array`` (the request's
    seeds as its backend takes them) and ``running`` (the context its backend's calls run in); it
    may override ``run`` (another loop), ``after_fault`` and ``result_extra``."""

    backend_name = ""
    rank = 0  # this process's rank when the target is split over processes (torch tensor parallelism): rank 0 reports
    policy = None  # shared across generate calls, so what one request learns helps the next
    policy_gamma: int | None = None

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
        tokens depend on its prompt and seed only, not on its row in the batch. Ctrl-C returns
        what was produced so far, with ``"interrupted": True``; NaN or infinite logits raise
        ``NonFiniteLogitsError`` carrying that partial result as ``.result``.
        """
        prompts, seeds = check_request(prompt, seed, speculation, chat, on_step)
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)
        ids = [self.encode(p, chat) for p in prompts]
        request = Request(ids, seeds, sampling, spec, speculation, on_step)
        records: list[StepRecord] = []
        outs, interrupted = None, False
        start = time.perf_counter()
        try:
            with self.running():
                outs = self.run(request, records)
        except KeyboardInterrupt:  # Ctrl-C: return what was produced; the next call starts afresh
            interrupted = True
        except NonFiniteLogitsError as e:
            e.result = self.result(prompt, request, None, records, time.perf_counter() - start, False)
            self.after_fault()
            raise
        return self.result(prompt, request, outs, records, time.perf_counter() - start, interrupted)

    def run(self, request: Request, records: list[StepRecord]) -> list[list[int]]:
        """The core loop on this engine's backend: prefill, prepare the step kinds the request can
        run (CUDA graphs on a GPU), then speculative or plain steps. Returns the new tokens."""
        backend, r = self.backend, request
        seed = self.seed_array(r.seeds)
        backend.prefill(r.ids, r.spec.max_new_tokens)
        adapts = r.speculation and self.policy_name == adaptive.NAME
        policy = self.adaptive_policy(r.spec.gamma, r.seeds[0]) if adapts else None
        if policy is not None:
            adaptive_loop.use_free_scoring(backend, policy)
        prepared = backend.prepare(r.spec.gamma if r.speculation else None, r.sampling)
        if policy is not None:
            adaptive_loop.prepare_arms(backend, policy, r.sampling, prepared)
            adaptive_loop.speculate_adaptive(backend, policy, sampling=r.sampling, spec=r.spec, seed=seed,
                                             rows=len(r.ids), on_step=r.on_step, records=records)
        elif r.speculation:
            speculate_steps(backend, self.policy_for(r.spec.gamma, r.seeds[0]), sampling=r.sampling, spec=r.spec,
                            seed=seed, first_offset=0, on_step=r.on_step, records=records)
        else:
            decode_steps(backend, sampling=r.sampling, max_new_tokens=r.spec.max_new_tokens, seed=seed,
                         first_offset=0, on_step=r.on_step, records=records)
        return backend.outputs()

    def seed_array(self, seeds: list[int]):
        """The request's seeds (one per prompt) as the backend's ``step`` takes them."""
        raise NotImplementedError

    def running(self) -> AbstractContextManager:
        """The context the backend's calls of one request run in (inference mode, a device)."""
        return contextlib.nullcontext()

    def after_fault(self) -> None:
        """Called after NaN or infinite logits, before the error is raised (e.g. scrub the caches)."""

    def result_extra(self, request: Request) -> dict:
        """Backend-specific fields of the result dict."""
        return {}

    def adaptive_policy(self, gamma: int, seed: int) -> adaptive.AdaptivePolicy:
        """``--policy adaptive``: plain decoding and every draft at G and G // 2, kept across requests."""
        if self.policy is None or self.policy_gamma != gamma:
            drafts = len(self.backend.draft_names)
            arms = adaptive.make_arms(drafts, adaptive.engine_lengths(gamma))
            self.policy = adaptive.AdaptivePolicy(arms, drafts, rng=seed)
            self.policy_gamma = gamma
        return self.policy

    def policy_for(self, gamma: int, seed: int):
        if self.policy_name == adaptive.NAME:
            raise ValueError("policy='adaptive' is not a draft bandit: its policy is adaptive_policy (generate's "
                             "adaptive loop, the slot scheduler)")
        if self.policy is None or self.policy_gamma != gamma:
            config = BanditConfig(objective=self.objective, gamma=gamma)
            self.policy = POLICIES[self.policy_name](len(self.backend.draft_names), config, rng=seed)
            self.policy_gamma = gamma
        return self.policy

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return encode(self.tokenizer, prompt, chat)

    def result(self, prompt, request: Request, outs: list[list[int]] | None, records, wall: float,
               interrupted: bool) -> dict:
        """SPEC.md's stats dict for the new tokens ``outs`` (one list per prompt; None: what the
        backend holds now, e.g. after an interrupt)."""
        outs = self.backend.outputs() if outs is None else outs
        speculation, gamma = request.speculation, request.spec.gamma
        stats = summarize(records, self.backend.draft_names, wall, sum(map(len, outs)),
                          plain=speculation and self.policy_name == adaptive.NAME)
        texts = [self.tokenizer.decode(o, skip_special_tokens=True, clean_up_tokenization_spaces=False) for o in outs]
        single = isinstance(prompt, str)
        return {
            "text": texts[0] if single else texts,
            "tokens": outs[0] if single else outs,
            **stats,
            "speculation": speculation,
            "gamma": gamma if speculation else None,
            "policy": self.policy_name if speculation else None,
            "drafts": list(self.backend.draft_names) if speculation else [],
            "backend": self.backend_name,
            "device": str(self.device),
            "wall_s": wall,
            "interrupted": interrupted,
            **({} if single else {"per_request": per_request(records, [len(o) for o in outs])}),
            **self.result_extra(request),
        }


@dataclass(frozen=True)
class Request:
    """One ``generate`` call's checked settings."""

    ids: list[list[int]]  # the encoded prompts
    seeds: list[int]  # one per prompt
    sampling: SamplingConfig
    spec: SpecConfig
    speculation: bool
    on_step: Callable[[StepRecord], None] | None


def check_request(prompt, seed, speculation, chat, on_step) -> tuple[list[str], list[int]]:
    """generate()'s request arguments; returns (prompts, one seed per prompt)."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    else:
        raise ValueError(f"prompt must be a string or a non-empty list of strings, got {type(prompt).__name__}")
    seeds = [seed] * len(prompts) if isinstance(seed, numbers.Integral) else seed
    if not isinstance(seeds, (list, tuple)) or len(seeds) != len(prompts) or not all(
        isinstance(s, numbers.Integral) and not isinstance(s, bool) and 0 <= s < 2**63 for s in seeds
    ):
        raise ValueError(f"seed must be an int in [0, 2**63) or a list of one per prompt ({len(prompts)}), got {seed!r}")
    for name, flag in (("speculation", speculation), ("chat", chat)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}={flag!r} must be a bool")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step={on_step!r} must be None or a function of a StepRecord")
    return prompts, [int(s) for s in seeds]


def engine_class(backend: str):
    """The engine class of ``backend``, imported now (a missing extra is a clear ImportError)."""
    if backend == "torch":
        try:
            from flashspec_torch.engine import Engine
        except ImportError as e:
            raise ImportError(f"backend='torch' needs the torch extra: pip install 'flashspec[torch]' ({e})") from None
        return Engine
    if backend == "jax":
        try:
            from flashspec_jax.engine import Engine as JaxEngine
        except ImportError as e:
            raise ImportError(f"backend='jax' needs the jax extra: pip install 'flashspec[jax]' ({e})") from None
        return JaxEngine
    raise ValueError(f"backend={backend!r} is unknown; choose one of {BACKENDS}")


def engine(backend: str = "torch", target=None, drafts=("ngram",), *, policy: str = "thompson-token", device=None):
    """An engine holding the loaded target and drafts (load once, generate many times). A
    backend's own options (dtype, verify_impl, batch_invariant, JAX's row_invariant, JAX's loop) are keyword
    arguments of its engine class: ``flashspec_torch.engine.Engine``, ``flashspec_jax.engine.Engine``."""
    return engine_class(backend)(target, drafts, policy=policy, device=device)


def generate(prompt, *, backend: str = "torch", target=None, drafts=("ngram",), policy: str = "thompson-token", device=None,
             **options) -> dict:
    """One-shot generation (loads the model each call; hold an ``engine(...)`` to reuse it).

    ``options`` are ``Engine.generate``'s keyword arguments: gamma, temperature, top_k, top_p,
    max_new_tokens, seed, speculation, chat, on_step.
    """
    return engine(backend, target, drafts, policy=policy, device=device).generate(prompt, **options)


def encode(tok, prompt: str, chat: bool) -> list[int]:
    """A prompt's token ids: through the tokenizer's chat template as one user turn (chat, when it has one)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty string")
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return list(ids)
    return list(tok(prompt)["input_ids"])
