"""Draft and target names, one list for every backend, parsed into a ``DraftSpec``.

Each backend builds the drafts it implements from a ``DraftSpec`` and refuses the others with
``not_implemented``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# ``head-tree``'s default nodes per tree and children per frontier node (EAGLE-2's top_k), docs/trees.md
TREE_NODES = 16
TREE_TOP_K = 4
MAX_TREE_NODES = 64  # a step writes N + 1 cache rows past the root: the backends' margin past a row's budget

DRAFT_HELP = (
    "ngram[:N] | nf4 | layerskip[:L1-L2,L3] | self | head[:DIR][@N] (a trained draft head; @N: over its N most frequent tokens) "
    f"| head-tree[/N[xK]][:DIR][@V] (the head drafting an EAGLE-2 tree of N nodes, default {TREE_NODES}, K children per "
    f"frontier node, default {TREE_TOP_K}, depth G; torch) | PATH (a model directory or .gguf sharing the tokenizer) "
    "| a transformers model object (Python API)"
)
TARGET_HELP = "None (the embedded SmolLM2-135M-Instruct) | PATH | nf4 | nf4:PATH (an NF4 copy of that target)"

DRAFT_KINDS = ("ngram", "layerskip", "nf4", "self", "head", "head-tree", "path")
BACKEND_DRAFTS = {"torch": DRAFT_KINDS, "jax": ("ngram", "layerskip", "self", "head", "path")}  # what each backend builds

# The draft head trained for the embedded model ships here (``flashspec train-head``; docs/draft_head.md).
SHIPPED_HEAD = Path(__file__).parent / "heads" / "smollm2-135m" / "head.safetensors"


def default_drafts(backend: str, target: str | None) -> tuple[str, ...]:
    """The CLI's drafts when none is named: the shipped head (trained for the embedded model, so only
    when ``target`` is None, the embedded model) and ngram with torch; ngram otherwise."""
    return ("head", "ngram") if backend == "torch" and target is None else ("ngram",)


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft name. ``kind`` is one of DRAFT_KINDS; ``max_n`` is ngram's longest n-gram;
    ``layers`` is layerskip's text as given ('' when the name had none); ``path`` is a PATH draft's."""

    name: str
    kind: str
    max_n: int = 3
    layers: str = ""
    path: str = ""  # a PATH draft's file or directory; head:DIR's directory ('' for the shipped head)
    top: int = 0  # head@N: the head drafts over its N most frequent tokens (0: all of them)
    tree: int = 0  # head-tree/N: the nodes of each step's tree (0: a chain draft)
    branch: int = TREE_TOP_K  # head-tree/NxK: the children each frontier node adds (EAGLE-2's top_k)


def parse_draft(spec: str) -> DraftSpec:
    """A draft name of DRAFT_HELP -> DraftSpec; anything that is not a keyword is a PATH."""
    name, _, arg = spec.partition(":")
    if name == "ngram":
        try:
            max_n = int(arg or 3)
        except ValueError:
            max_n = 0
        if max_n < 1:
            raise ValueError(f"draft {spec!r}: use ngram or ngram:N with N >= 1")
        return DraftSpec(spec, "ngram", max_n=max_n)
    if name == "layerskip":
        return DraftSpec(spec, "layerskip", layers=arg)
    if spec in ("nf4", "self"):
        return DraftSpec(spec, spec)
    if name == "head" or name.startswith("head@"):
        return parse_head(spec)
    if name.startswith("head-tree"):
        return parse_head_tree(spec)
    return DraftSpec(spec, "path", path=spec)


def parse_head(spec: str) -> DraftSpec:
    """head, head:DIR, head@N, head:DIR@N (N: the head's N most frequent tokens; a DIR may hold an @
    not followed by digits alone)."""
    base, _, top = spec.rpartition("@")
    if not top.isdigit() and not spec.startswith("head@"):
        base, top = spec, ""
    elif not top.isdigit() or int(top) < 1:
        raise ValueError(f"draft {spec!r}: use head[:DIR]@N with N >= 1 (the head's N most frequent tokens)")
    return DraftSpec(spec, "head", path=base.partition(":")[2], top=int(top or 0))


def parse_head_tree(spec: str) -> DraftSpec:
    """head-tree, head-tree/N, head-tree/NxK, then what ``parse_head`` reads after ``head`` (:DIR, @V):
    head-tree/32x4:DIR@4096."""
    rest = spec[len("head-tree"):]
    nodes, branch = TREE_NODES, TREE_TOP_K
    if rest.startswith("/"):
        text = rest[1:].partition(":")[0].partition("@")[0]
        rest = rest[1 + len(text):]
        n, x, k = text.partition("x")
        nodes = int(n) if n.isdigit() else 0
        branch = int(k) if k.isdigit() else 0 if x else branch
    if rest[:1] not in ("", ":", "@") or not 1 <= nodes <= MAX_TREE_NODES or not 1 <= branch <= MAX_TREE_NODES:
        raise ValueError(f"draft {spec!r}: use head-tree[/N[xK]][:DIR][@V] with N in [1, {MAX_TREE_NODES}] (the "
                         f"tree's nodes, default {TREE_NODES}) and K >= 1 (children per frontier node, default "
                         f"{TREE_TOP_K}), e.g. head-tree/32, head-tree/16x4 or head-tree/16:DIR")
    try:
        head = parse_head("head" + rest)
    except ValueError:
        raise ValueError(f"draft {spec!r}: use head-tree[/N[xK]][:DIR]@V with V >= 1 (the head's V most frequent "
                         "tokens)") from None
    return DraftSpec(spec, "head-tree", path=head.path, top=head.top, tree=nodes, branch=branch)


def not_implemented(draft: DraftSpec, backend: str) -> ValueError:
    """The error a backend raises for a draft kind it does not build (naming the ones it does)."""
    others = [b for b, kinds in BACKEND_DRAFTS.items() if draft.kind in kinds]
    return ValueError(f"draft {draft.name!r} is not implemented by the {backend} backend, which builds "
                      f"{', '.join(BACKEND_DRAFTS[backend])} drafts" + (f"; use --backend {others[0]}" if others else ""))


def layerskip_layers(draft: DraftSpec, num_layers: int) -> frozenset[int]:
    """A layerskip draft's skipped layers: those it names, or by default the one at 5/6 of the depth
    (layer 25 of the embedded model's 30: the best estimated gain of benchmarks/drafts_layerskip_search.py,
    benchmarks/results/drafts_layerskip_search.json)."""
    return parse_layers(draft.layers or str(min(num_layers - 1, num_layers * 5 // 6)), num_layers)


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
