"""``flashspec.generate``: the user API, dispatching to a backend that is imported only when used."""

from __future__ import annotations

BACKENDS = ("torch", "jax")


def engine(backend: str = "torch", target=None, drafts=("ngram",), *, policy: str = "thompson-token", device=None):
    """An engine holding the loaded target and drafts (load once, generate many times)."""
    if backend == "torch":
        try:
            from flashspec_torch.engine import Engine
        except ImportError as e:
            raise ImportError(f"backend='torch' needs the torch extra: pip install 'flashspec[torch]' ({e})") from None
        return Engine(target, drafts, policy=policy, device=device)
    if backend == "jax":
        try:
            from flashspec_jax.engine import Engine as JaxEngine
        except ImportError as e:
            raise ImportError(f"backend='jax' needs the jax extra: pip install 'flashspec[jax]' ({e})") from None
        return JaxEngine(target, drafts, policy=policy, device=device)
    raise ValueError(f"backend={backend!r} is unknown; choose one of {BACKENDS}")


def generate(prompt, *, backend: str = "torch", target=None, drafts=("ngram",), policy: str = "thompson-token", device=None, **options) -> dict:
    """One-shot generation (loads the model each call; hold an ``engine(...)`` to reuse it).

    ``options`` are ``Engine.generate``'s keyword arguments: gamma, temperature, top_k, top_p,
    max_new_tokens, seed, speculation, chat, on_step.
    """
    return engine(backend, target, drafts, policy=policy, device=device).generate(prompt, **options)
