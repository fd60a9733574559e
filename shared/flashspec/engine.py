"""``flashspec.generate``: the user API, dispatching to a backend that is imported only when used."""

from __future__ import annotations

import numbers

from .bandits import POLICIES, BanditConfig
from .stats import summarize

BACKENDS = ("torch", "jax")


class EngineBase:
    """What the torch and JAX engines share: the draft-selection policy kept across requests,
    prompt encoding, the request checks and SPEC.md's result dict. A subclass sets
    ``backend_name``, ``policy_name``, ``objective``, ``tokenizer``, ``backend`` and ``device``."""

    backend_name = ""
    policy = None  # shared across generate calls, so what one request learns helps the next
    policy_gamma: int | None = None

    def policy_for(self, gamma: int, seed: int):
        if self.policy is None or self.policy_gamma != gamma:
            config = BanditConfig(objective=self.objective, gamma=gamma)
            self.policy = POLICIES[self.policy_name](len(self.backend.draft_names), config, rng=seed)
            self.policy_gamma = gamma
        return self.policy

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return encode(self.tokenizer, prompt, chat)

    def report(self, prompt, outs: list[list[int]], records, wall: float, speculation: bool, gamma: int, extra: dict) -> dict:
        """SPEC.md's stats dict for the new tokens ``outs`` (one list per prompt)."""
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
            "drafts": list(self.backend.draft_names) if speculation else [],
            "backend": self.backend_name,
            "device": str(self.device),
            "wall_s": wall,
            **extra,
        }


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


def engine(backend: str = "torch", target=None, drafts=("ngram",), *, policy: str = "thompson-token", device=None,
           row_invariant: bool = False):
    """An engine holding the loaded target and drafts (load once, generate many times).
    ``row_invariant``: torch on CUDA only, see flashspec_torch.Engine."""
    if backend == "torch":
        try:
            from flashspec_torch.engine import Engine
        except ImportError as e:
            raise ImportError(f"backend='torch' needs the torch extra: pip install 'flashspec[torch]' ({e})") from None
        return Engine(target, drafts, policy=policy, device=device, row_invariant=row_invariant)
    if backend == "jax":
        if row_invariant:
            raise ValueError("row_invariant is an option of the torch backend (its fused products); use backend='torch'")
        try:
            from flashspec_jax.engine import Engine as JaxEngine
        except ImportError as e:
            raise ImportError(f"backend='jax' needs the jax extra: pip install 'flashspec[jax]' ({e})") from None
        return JaxEngine(target, drafts, policy=policy, device=device)
    raise ValueError(f"backend={backend!r} is unknown; choose one of {BACKENDS}")


def generate(prompt, *, backend: str = "torch", target=None, drafts=("ngram",), policy: str = "thompson-token", device=None,
             row_invariant: bool = False, **options) -> dict:
    """One-shot generation (loads the model each call; hold an ``engine(...)`` to reuse it).

    ``options`` are ``Engine.generate``'s keyword arguments: gamma, temperature, top_k, top_p,
    max_new_tokens, seed, speculation, chat, on_step.
    """
    return engine(backend, target, drafts, policy=policy, device=device, row_invariant=row_invariant).generate(prompt, **options)


def encode(tok, prompt: str, chat: bool) -> list[int]:
    """A prompt's token ids: through the tokenizer's chat template as one user turn (chat, when it has one)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty string")
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return list(ids)
    return list(tok(prompt)["input_ids"])
