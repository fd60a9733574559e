"""The JAX backend: implements ``flashspec.backend.Backend`` with jitted steps over our Flax model.

Everything a step needs stays on the device (``steps.State``: token history, lengths, finished
flags, the KV caches). Each operation is one jitted function (compiled once per shape; cache and
prompt lengths are bucketed, so a longer sequence never recompiles); JAX dispatches
asynchronously, and ``commit`` starts the device-to-host copy of the step's small results, which
the loop reads one step later (``StepHandle.fetch``): the host never waits inside a step.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flashspec.backend import StepView
from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult

from .drafts import LookupDraft, ModelDraft, Proposal, make_seeds
from .heads import HeadDraft, HeadParams
from .model import Llama
from .parallel import replicate
from .steps import State, StepOut, Steps, batch_shapes
from .verify import on_gpu


@dataclass
class AsyncHandle:
    """A step's small device results packed into one array (``pack``), copying to the host; ``fetch``
    waits for that one copy only."""

    packed: jax.Array  # [3, B] int32: num_accepted, active, done

    def fetch(self) -> StepView:
        n, active, done = np.asarray(self.packed)
        return StepView(n.copy(), active.astype(bool), done.astype(bool))


def pack(out: StepOut) -> jax.Array:  # [3, B] int32
    """A step's ``StepOut`` as one int32 array: one device-to-host copy per step instead of three."""
    return jnp.stack([out.num_accepted.astype(jnp.int32), out.active.astype(jnp.int32), out.done.astype(jnp.int32)])


def packed(step):
    """``step`` (-> (state, StepOut)) returning (state, ``pack(StepOut)``); its signature kept for ``jax.jit``."""
    @functools.wraps(step)
    def run(*args, **kwargs):
        state, out = step(*args, **kwargs)
        return state, pack(out)

    return run


def on_leaves(step, treedef, at: int):
    """``step`` taking, as its positional argument ``at``, the weights' flat leaves (a tuple) instead of
    their pytree, rebuilt by ``treedef`` when traced; its signature kept for ``jax.jit``. A call then
    flattens a tuple of arrays in C++, not the nnx ``State``s node by node in Python."""
    @functools.wraps(step)
    def run(*args, **kwargs):
        args = (*args[:at], jax.tree.unflatten(treedef, args[at]), *args[at + 1 :])
        return step(*args, **kwargs)

    return run


def weight_sources(weights) -> tuple[tuple | None, jax.tree_util.PyTreeDef]:
    """(what each leaf of ``weights`` is read from at a call: the ``nnx.Variable`` holding it, or the array
    itself; the treedef). ``JaxBackend.leaves`` reads them: the arrays a flatten of ``weights`` would give
    at that moment (a Variable's value set since is seen), without the flatten. None where reading them so
    does not give exactly the flatten's arrays (a Variable holding more than one array, a Flax without
    ``_raw_value``): ``leaves`` then flattens at each call."""
    nodes = jax.tree.leaves(weights, is_leaf=lambda x: isinstance(x, nnx.Variable))
    leaves, treedef = jax.tree.flatten(weights)
    try:
        same = len(nodes) == len(leaves) and all(read_leaf(n) is a for n, a in zip(nodes, leaves))
    except AttributeError:
        same = False
    return (tuple(nodes) if same else None), treedef


def read_leaf(node):
    """A Variable's array as its pytree flatten reads it (``_raw_value``), or ``node`` itself (an array)."""
    return node._raw_value if isinstance(node, nnx.Variable) else node


def start_copy(packed_out: jax.Array) -> AsyncHandle:
    packed_out.copy_to_host_async()
    return AsyncHandle(packed_out)


class JaxBackend:
    """``drafts`` are ``LookupDraft``, ``ModelDraft`` (made with :meth:`model_draft`) or ``HeadDraft``
    (:meth:`head_draft`)."""

    def __init__(self, target: Llama, eos_ids: Sequence[int] = (), verify_impl: str | None = None):
        self.config = target.config
        graphdef, params = nnx.split(target)
        self.graphdef = graphdef
        self.weights = [params]  # index 0: the target; then other draft models and heads
        self.draft_models: list[Llama | HeadParams] = [target]  # what each entry of weights holds
        self.drafts: list[ModelDraft | LookupDraft | HeadDraft] = []
        self.eos_ids, self.verify_impl = tuple(eos_ids), verify_impl
        self.steps: Steps | None = None
        self.decode_rows = 1  # positions per row in a plain decoding forward (Steps.decode_one's rows)

    # -- drafts

    def model_draft(self, name: str, model: Llama | None = None, skip: frozenset[int] = frozenset()) -> ModelDraft:
        """A draft over ``model`` (None: the target itself, e.g. with layers skipped)."""
        model = model or self.draft_models[0]
        if model.config.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"draft {name!r} has vocabulary size {model.config.vocab_size} but the target has "
                f"{self.config.vocab_size}: a draft must share the target's tokenizer"
            )
        if not any(m is model for m in self.draft_models):
            self.draft_models.append(model)
            self.weights.append(self.placed(nnx.split(model)[1]))
        index = next(i for i, m in enumerate(self.draft_models) if m is model)
        return ModelDraft(name, model, index, nnx.graphdef(model), skip)

    def head_draft(self, name: str, params: HeadParams, feature_layers: tuple[int, ...]) -> HeadDraft:
        """A draft head (``flashspec_jax.heads.load_head``) over the target's features."""
        self.draft_models.append(params)
        self.weights.append(self.placed(params))
        return HeadDraft(name, self.draft_models[0], feature_layers, len(self.weights) - 1, self.graphdef)

    def placed(self, weights):
        """A draft's weights: replicated over the target's mesh when the target is split."""
        mesh = self.draft_models[0].mesh
        return weights if mesh is None else replicate(weights, mesh)

    def set_drafts(self, drafts: Sequence[ModelDraft | LookupDraft | HeadDraft]) -> None:
        self.drafts = list(drafts)
        self.draft_names = [d.name for d in self.drafts]
        self.steps = Steps(self.draft_models[0], self.drafts, self.eos_ids, self.verify_impl, self.graphdef)
        self.jit_steps()

    def jit_steps(self) -> None:
        """The jitted steps; those that read the weights take ``self.leaves`` (``on_leaves``)."""
        s, donate = self.steps, on_gpu()
        self.sources, self.treedef = weight_sources(self.weights)
        keep = lambda *names: dict(donate_argnames=names) if donate else {}  # noqa: E731
        flat = self.on_leaves
        self.prefill_jit = jax.jit(flat(s.prefill), static_argnames=("prefix",))
        self.draft_jit = jax.jit(flat(s.draft, 1), static_argnames=("arm", "gamma", "cfg"), **keep("state"))
        self.score_jit = jax.jit(flat(s.score), **keep("state"))
        self.verify_jit = jax.jit(s.verify, static_argnames=("cfg",))
        self.commit_jit = jax.jit(packed(s.commit), **keep("state"))
        self.decode_jit = jax.jit(flat(packed(s.decode_one)), static_argnames=("cfg", "rows"), **keep("state"))

    def on_leaves(self, step, at: int = 0):
        """``step`` taking ``self.leaves`` as its positional argument ``at`` (``on_leaves``)."""
        return on_leaves(step, self.treedef, at)

    @property
    def leaves(self) -> tuple:
        """The weights' arrays now, in the order of ``jax.tree.leaves(self.weights)``: what the jitted steps take."""
        if self.sources is None:
            return tuple(jax.tree.leaves(self.weights))
        return tuple([read_leaf(n) for n in self.sources])

    # -- the batch

    def prefill(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        self.state = self.start_state(prompts, max_new_tokens)

    def start_state(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> State:
        if self.steps is None:
            raise ValueError("set_drafts(...) must be called before prefill")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        longest = max(len(p) for p in prompts)
        limit = self.config.max_position_embeddings
        if longest + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {limit} tokens"
            )
        tokens, lengths, prefix = batch_shapes(prompts, max_new_tokens)
        return self.prefill_jit(self.leaves, jnp.asarray(tokens), jnp.asarray(lengths), max_new_tokens, prefix=prefix)

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        """Nothing ahead of time: each jitted step compiles on its first call (once per shape)."""
        return 0

    def step(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> AsyncHandle:
        """draft -> score -> verify -> commit, four jitted calls dispatched asynchronously."""
        proposal = self.draft(arm, gamma, sampling, seed, offset)
        return self.commit(self.verify(self.score(proposal), proposal, sampling, seed, offset))

    # -- the step's parts

    def draft(self, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int) -> Proposal:
        proposal, self.state = self.draft_jit(arm, self.leaves, self.state, gamma, sampling, self.seeds(seed), offset)
        return proposal

    def score(self, proposal: Proposal) -> jax.Array:  # [B, G+1, V]
        z, self.state = self.score_jit(self.leaves, self.state, proposal)
        return z

    def verify(self, target_logits, proposal: Proposal, sampling: SamplingConfig, seed, offset: int) -> VerifyResult:
        return self.verify_jit(target_logits, proposal, sampling, self.seeds(seed), offset)

    def commit(self, result: VerifyResult) -> AsyncHandle:
        self.state, out = self.commit_jit(self.state, result)
        return start_copy(out)

    def decode_one(self, sampling: SamplingConfig, seed, offset: int) -> AsyncHandle:
        self.state, out = self.decode_jit(self.leaves, self.state, sampling, self.seeds(seed), offset, rows=self.decode_rows)
        return start_copy(out)

    def outputs(self) -> list[list[int]]:
        seqs = self.state.seqs
        tokens, start, end = (np.asarray(a) for a in (seqs.tokens, seqs.prompt_len, seqs.length))
        return [tokens[b, start[b] : end[b]].tolist() for b in range(len(start))]

    @functools.lru_cache(maxsize=8)  # noqa: B019 - the backend lives as long as its engine
    def _seeds(self, seeds: int | tuple[int, ...]):
        return make_seeds(np.array(seeds, dtype=np.uint64))

    def seeds(self, seed):
        """An int (shared: the batch row is a coordinate, as in the torch backend) or one int per
        row (per-request seeds) -> uint32 halves (cached)."""
        b = self.state.seqs.tokens.shape[0]
        if isinstance(seed, (int, np.integer)):
            return self._seeds(int(seed))
        values = tuple(int(s) for s in np.asarray(seed).reshape(-1))
        if len(values) != b:
            raise ValueError(f"seed has {len(values)} values but the batch has {b} rows")
        return self._seeds(values)
