"""The JAX engine: load a target and drafts once, then generate with the one core loop.

The same user surface as ``flashspec_torch.engine.Engine`` (draft names, policies, the stats dict
of SPEC.md). ``loop="device"`` runs the whole generation in one ``lax.while_loop`` instead
(``flashspec_jax.whole``; policies fixed, ucb1 and thompson-token, acceptance objective).
``row_invariant``: plain decoding runs the target over the request's gamma + 1 positions per row
(the last token and copies, ``Steps.decode_one``'s rows), the shape of a speculative step's
scoring pass, so that a row's logits are rounded as in scoring and greedy speculation gives
greedy decoding's tokens in bf16 too (docs/jax.md). ``batch_invariant``: every reduction of the
target's forward by the batch-invariant Pallas kernels (``Llama.batch_invariant``), so a request's
tokens are the same alone, in any batch and with speculation (docs/batch_invariance.md, "JAX").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flashspec.adaptive import engine_policies
from flashspec.bandits import BanditConfig
from flashspec.drafts import DRAFT_HELP, layerskip_layers, not_implemented, parse_draft
from flashspec.engine import EngineBase, Request
from flashspec.loop import StepRecord

from . import parallel, whole
from .drafts import LookupDraft, ModelDraft
from .heads import HeadDraft, load_draft_head
from .slots import JaxSlotBackend
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
        row_invariant: bool = False,
        batch_invariant: bool = False,
        tensor_parallel: int = 1,
    ):
        if policy not in engine_policies():
            raise ValueError(f"policy={policy!r} is unknown; choose one of {engine_policies()}")
        if not drafts:
            raise ValueError("drafts must name at least one draft; use speculation=False for plain decoding")
        if loop not in LOOPS:
            raise ValueError(f"loop={loop!r} must be one of {LOOPS}")
        if loop == "device" and policy not in whole.DEVICE_POLICIES:
            raise ValueError(f"loop='device' runs the policies {sorted(whole.DEVICE_POLICIES)}, not {policy!r}")
        if not isinstance(row_invariant, bool):
            raise TypeError(f"row_invariant={row_invariant!r} must be True or False")
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant={batch_invariant!r} must be True or False")
        if batch_invariant and row_invariant:
            raise ValueError("batch_invariant=True already gives plain decoding speculation's tokens; "
                             "leave row_invariant False")
        self.row_invariant, self.batch_invariant = row_invariant, batch_invariant
        self.device = self.pick_device(device)
        with self.on_device():
            self.dtype = dtype or (jnp.float32 if self.device.platform == "cpu" else jnp.bfloat16)
            self.target = target if isinstance(target, LoadedModel) else load(target, self.dtype)
            self.tokenizer = self.target.tokenizer
            self.policy_name, self.objective, self.loop = policy, objective, loop
            BanditConfig(objective=objective)  # validate now
            config = self.target.model.config
            self.tensor_parallel = tensor_parallel
            eos = sorted(set(config.eos_token_ids))
            self.target.model.batch_invariant = batch_invariant  # the model's own setting: shared with its engines
            target = self.split_target(tensor_parallel)
            if batch_invariant:
                target.invariant_check()
            self.backend = JaxSlotBackend(target, eos, verify_impl)
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

    def split_target(self, n: int):
        """The target's model, or with ``n`` > 1 a copy split over a mesh of ``n`` devices of the
        engine's platform (``flashspec_jax.parallel``)."""
        model = self.target.model
        parallel.check_degree(model.config, n, len(jax.devices(self.device.platform)))
        return model if n == 1 else parallel.shard_model(model, parallel.make_mesh(n, self.device.platform))

    def on_device(self):
        return jax.default_device(self.device) if self.device != jax.devices()[0] else contextlib.nullcontext()

    def make_draft(self, spec: str) -> ModelDraft | LookupDraft | HeadDraft:
        model = self.target.model
        draft = parse_draft(spec)
        if draft.kind == "ngram":
            return LookupDraft(spec, max_n=draft.max_n)
        if draft.kind == "layerskip":
            return self.backend.model_draft(spec, skip=layerskip_layers(draft, model.config.num_layers))
        if draft.kind == "self":
            return self.backend.model_draft("self")
        if draft.kind == "head":
            return load_draft_head(self.backend, spec, draft.path, draft.top)
        if draft.kind != "path":
            raise not_implemented(draft, "jax")
        try:
            other = load(spec, self.dtype)
        except FileNotFoundError as e:
            raise ValueError(f"draft {spec!r} is unknown ({e}); a draft is {DRAFT_HELP}") from None
        return self.backend.model_draft(other.name, other.model)

    def seed_array(self, seeds: list[int]) -> np.ndarray:
        return np.array(seeds, dtype=np.uint64)

    def running(self):
        return self.on_device()

    def run(self, request: Request, records: list[StepRecord]) -> list[list[int]]:
        """The core loop, or with ``loop="device"`` the whole speculative generation in one launch."""
        self.backend.decode_rows = request.spec.gamma + 1 if self.row_invariant else 1
        if self.whole is None or not request.speculation:
            return super().run(request, records)
        r = request
        start = time.perf_counter()
        device_policy = whole.DEVICE_POLICIES[self.policy_name]()
        outs, steps = self.whole.run(r.ids, max_new_tokens=r.spec.max_new_tokens, gamma=r.spec.gamma,
                                     sampling=r.sampling, seed=self.seed_array(r.seeds), policy=device_policy,
                                     policy_seed=r.seeds[0] % 2**31)
        wall = time.perf_counter() - start
        for s in steps:  # one launch: no per-step times, their mean instead
            records.append(StepRecord(s.arm, s.drafted, s.accepted, s.emitted, s.rows, wall / len(steps)))
            if r.on_step:
                r.on_step(records[-1])
        return outs

    def result_extra(self, request: Request) -> dict:
        return {"loop": self.loop if request.speculation else "host", "tensor_parallel": self.tensor_parallel}
