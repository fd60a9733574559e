"""The draft head's file, read the same way by both backends (``flashspec_torch.heads``,
``flashspec_jax.heads``): where a named head lives, its metadata, and the checks that it fits a target.

One safetensors file (``head.safetensors`` in a directory): the head's weights (torch names), its
``token_ids`` and metadata: ``format`` (FORMAT), ``feature_layers`` and ``target_config`` (JSON),
``target_name``, ``extra`` (JSON; ``fingerprint`` = the mean |embedding| of the target it was trained for).
``token_ids`` is either sorted by id (the first files) or most frequent first beside ``token_counts``
(int64, the same order: each token's count in the training text), which lets a reader keep the N
most frequent only; the set of ids, and so the head, is the same either way.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from .config import LlamaConfig

FORMAT = "flashspec-draft-head-1"
OUTSIDE = -1e30  # the logit of a token outside a head's vocabulary: exp underflows to 0 in float32
CONFIG_FIELDS = ("hidden_size", "num_layers", "vocab_size", "num_heads", "num_kv_heads", "head_dim")
TRAIN_HINT = "train a head for it with `flashspec train-head --target MODEL --out DIR`"


def config_fields(c: LlamaConfig) -> dict:
    return {f: getattr(c, f) for f in CONFIG_FIELDS}


def check_fits(trained_for: LlamaConfig, target: LlamaConfig) -> None:
    for field in CONFIG_FIELDS:
        a, b = getattr(trained_for, field), getattr(target, field)
        if a != b:
            raise ValueError(f"the draft head was trained for a target with {field}={a}, but this target has {b}: {TRAIN_HINT}")


def draft_head_file(directory: str) -> Path:
    """The file of draft ``head`` (``directory`` '': the shipped head of the embedded model) or ``head:DIR``."""
    from .drafts import SHIPPED_HEAD

    if not directory and not SHIPPED_HEAD.is_file():
        raise ValueError(f"draft 'head': no trained head ships with this install ({SHIPPED_HEAD} is missing); "
                         "train one with `flashspec train-head --out DIR` and use --draft head:DIR")
    return Path(directory) if directory else SHIPPED_HEAD


def read_metadata(path: str | Path, target: LlamaConfig) -> tuple[Path, dict]:
    """A head file (or a directory holding ``head.safetensors``) -> (the file, its metadata), checked
    to be a head for a target of ``target``'s shape."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        path = path / "head.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no draft head at {path}: train one with `flashspec train-head --target MODEL --out DIR`")
    with safe_open(str(path), "numpy") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a FlashSpec draft head (metadata format {meta.get('format')!r}, want {FORMAT!r})")
    check_fits(replace(target, **json.loads(meta["target_config"])), target)
    return path, meta


def kept_ids(ids, counts, top: int, path):
    """The token ids a head drafts from: all of ``ids`` (the file's ``token_ids``, [V_d]) when ``top``
    is 0, else the ``top`` most frequent, which needs a file that stores them most frequent first
    (``counts``, its ``token_counts``, present). Works on numpy arrays and torch tensors alike."""
    if not top:
        return ids
    if counts is None:
        raise ValueError(f"top={top}: the head at {path} stores its vocabulary sorted by id, not by frequency; "
                         "retrain it with `flashspec train-head` (which saves the counts) or use all of it")
    if not 1 <= top <= len(ids):
        raise ValueError(f"top={top} must be in [1, {len(ids)}] (the head's vocabulary size)")
    return ids[:top]


def check_fingerprint(name: str, path: Path, meta: dict, fingerprint: float) -> None:
    """Refuse a head trained for a target of the same shape but other weights (``fingerprint``: this
    target's mean |embedding|)."""
    trained = json.loads(meta.get("extra", "{}")).get("fingerprint")
    if trained is not None and not math.isclose(trained, fingerprint, rel_tol=0.02):
        raise ValueError(f"draft {name!r}: the head at {path} was trained for {meta.get('target_name')!r}, whose weights "
                         f"differ from this target's: {TRAIN_HINT}")
