"""The JAX engine: load a target and drafts once, then generate with the one core loop.

The same user surface as ``flashspec_torch.engine.Engine`` (draft names, policies, the stats dict
of SPEC.md). ``loop="device"`` runs the whole generation in one ``lax.while_loop`` instead
(``flashspec_jax.whole``; policies fixed, ucb1 and thompson-token, acceptance objective).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flashspec.bandits import POLICIES, BanditConfig
from flashspec.engine import EngineBase, check_request
from flashspec.config import SamplingConfig
from flashspec.drafts import DRAFT_HELP, not_implemented, parse_draft, parse_layers
from flashspec.loop import SpecConfig, StepRecord, decode, speculate

from . import whole
from .backend import JaxBackend
from .drafts import LookupDraft, ModelDraft
from .weights import LoadedModel, load

LOOPS = ("host", "device")


class Engine(EngineBase):
    """``Engine(target=None)`` loads the embedded SmolLM2-135M-Instruct; ``generate`` runs it."""

    backend_name = "jax"

    def __init__(
        self,
        target: str | LoadedModel | None = None,
        drafts: Sequence[str] = ("ngram",),
        *,
        policy: str = "thompson-token",
        objective: str = "throughput",
        device: str | None = None,
        dtype=None,
        verify_impl: str | None = None,
        loop: str = "host",
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is unknown; choose one of {sorted(POLICIES)}")
        if not drafts:
            raise ValueError("drafts must name at least one draft; use speculation=False for plain decoding")
        if loop not in LOOPS:
            raise ValueError(f"loop={loop!r} must be one of {LOOPS}")
        if loop == "device" and policy not in whole.DEVICE_POLICIES:
            raise ValueError(f"loop='device' runs the policies {sorted(whole.DEVICE_POLICIES)}, not {policy!r}")
        self.device = self.pick_device(device)
        with self.on_device():
            self.dtype = dtype or (jnp.float32 if self.device.platform == "cpu" else jnp.bfloat16)
            self.target = target if isinstance(target, LoadedModel) else load(target, self.dtype)
            self.tokenizer = self.target.tokenizer
            self.policy_name, self.objective, self.loop = policy, objective, loop
            BanditConfig(objective=objective)  # validate now
            config = self.target.model.config
            self.backend = JaxBackend(self.target.model, sorted(set(config.eos_token_ids)), verify_impl)
            self.backend.set_drafts([self.make_draft(d) for d in drafts])
            self.whole = whole.Whole(self.backend) if loop == "device" else None

    @staticmethod
    def pick_device(device: str | None):
        if device is None:
            return jax.devices()[0]
        platform = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu"}.get(device)
        if platform is None:
            raise ValueError(f"device={device!r} must be cpu, cuda or gpu (or None: JAX's default)")
        try:
            return jax.devices(platform)[0]
        except RuntimeError:
            raise ValueError(f"device={device!r}: JAX has no {platform} device here") from None

    def on_device(self):
        return jax.default_device(self.device) if self.device != jax.devices()[0] else contextlib.nullcontext()

    def make_draft(self, spec: str) -> ModelDraft | LookupDraft:
        model = self.target.model
        draft = parse_draft(spec)
        if draft.kind == "ngram":
            return LookupDraft(spec, max_n=draft.max_n)
        if draft.kind == "layerskip":
            return self.backend.model_draft(spec, skip=parse_layers(draft.layers, model.config.num_layers))
        if draft.kind == "self":
            return self.backend.model_draft("self")
        if draft.kind != "path":
            raise not_implemented(draft, "jax")
        try:
            other = load(spec, self.dtype)
        except FileNotFoundError as e:
            raise ValueError(f"draft {spec!r} is unknown ({e}); a draft is {DRAFT_HELP}") from None
        return self.backend.model_draft(other.name, other.model)

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
        prompts, seeds = check_request(prompt, seed, speculation, chat, on_step)
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)
        ids = [self.encode(p, chat) for p in prompts]
        per_row = np.array(seeds, dtype=np.uint64)
        start = time.perf_counter()
        with self.on_device():
            if not speculation:
                outs, records = decode(self.backend, ids, sampling=sampling, max_new_tokens=max_new_tokens, seed=per_row, on_step=on_step)
            elif self.whole is not None:
                device_policy = whole.DEVICE_POLICIES[self.policy_name]()
                outs, records = self.whole.run(ids, max_new_tokens=max_new_tokens, gamma=gamma, sampling=sampling,
                                               seed=per_row, policy=device_policy, policy_seed=seeds[0] % 2**31)
            else:
                policy = self.policy_for(gamma, seeds[0])
                outs, records = speculate(self.backend, policy, ids, sampling=sampling, spec=spec, seed=per_row, on_step=on_step)
        wall = time.perf_counter() - start
        if self.whole is not None and speculation:  # one launch: no per-step times, their mean instead
            records = [StepRecord(r.arm, r.drafted, r.accepted, r.emitted, r.rows, wall / max(1, len(records))) for r in records]
            for r in records if on_step else ():
                on_step(r)
        return self.report(prompt, outs, records, wall, speculation, gamma, {"loop": self.loop if speculation else "host"})
