"""``flashspec train-head`` as one call: data, training, held-out measurements, files under ``out``.

    out/head.safetensors   the head (``heads.save_head``; --draft head:out)
    out/history.json       the loss curve (weighted sum and per pass, per logged step, with seconds)
    out/report.json        data (prompts, tokens per domain), config, timings, the vocabulary's coverage,
                           held-out acceptance by domain and draft position, environment
    out/loss.png           the loss curve (when matplotlib is installed)
"""

from __future__ import annotations

import json
import platform
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from flashspec.engine import encode
from flashspec.head_corpus import DOMAINS, corpus, split

from .head_train import TrainConfig, acceptance_by_position, frequent_tokens, generate_sequences, train_head
from .heads import fingerprint, save_head


def pick(prompts, per_domain: int, seed: int):
    """Up to ``per_domain`` prompts of each domain, a fixed random choice."""
    rng = random.Random(seed)
    out = []
    for d in DOMAINS:
        mine = [p for p in prompts if p.domain == d]
        out += rng.sample(mine, min(per_domain, len(mine)))
    return out


def run_train_head(out: str | Path, cfg: TrainConfig, *, target=None, train_per_domain: int = 600,
                   eval_per_domain: int = 40, device=None, dtype=None, log=print) -> dict:
    """Train a head for ``target`` (None: the embedded model; a LoadedModel or a TARGET_HELP spelling)."""
    from .engine import check_device, load_target
    from .weights import LoadedModel

    t0 = time.perf_counter()
    dev = check_device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    loaded = target if isinstance(target, LoadedModel) else load_target(target, dtype, dev)
    if loaded.tokenizer is None:
        raise ValueError(f"target {loaded.name!r} has no tokenizer: training prompts must be encoded")
    model, tok = loaded.model, loaded.tokenizer
    train_prompts, held_prompts = split(corpus())
    train_prompts = pick(train_prompts, train_per_domain, cfg.seed)
    held_prompts = pick(held_prompts, eval_per_domain, cfg.seed + 1)
    enc = lambda p: encode(tok, p.text, p.domain == "chat")  # noqa: E731
    eos = model.config.eos_token_ids
    log(f"generating: {len(train_prompts)} training prompts x {cfg.samples} samples + {len(held_prompts)} held-out prompts "
        f"x {cfg.new_tokens} tokens")
    t_load = time.perf_counter()
    train = generate_sequences(model, train_prompts * cfg.samples, enc, cfg, eos)
    held = generate_sequences(model, held_prompts, enc, cfg, eos)
    t_gen = time.perf_counter()
    ids = frequent_tokens(train, cfg.vocab, model.config.vocab_size)
    log(f"generated in {t_gen - t_load:.1f} s; training ({cfg.steps} steps, at most {cfg.seconds} s)")
    head, hist = train_head(model, train, cfg, ids, on_log=lambda s, l, per: log(f"step {s}: loss {l:.4f} {per}"))
    t_train = time.perf_counter()
    by_domain = {d: acceptance_by_position(head, model, [s for s in held if s.domain == d], cfg.passes)
                 for d in DOMAINS if any(s.domain == d for s in held)}
    report = {
        "target": loaded.name, "device": str(dev), "dtype": str(dtype), "config": asdict(cfg),
        "feature_layers": list(head.feature_layers), "head_vocab": len(head.token_ids),
        "data": data_stats(train, held, ids),
        "seconds": {"load": t_load - t0, "generate": t_gen - t_load, "train": t_train - t_gen,
                    "evaluate": time.perf_counter() - t_train},
        "steps_done": hist.steps[-1] + 1 if hist.steps else 0,
        "final_loss": hist.loss[-1] if hist.loss else None,
        "held_out_acceptance": by_domain,
        "environment": environment(dev),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"fingerprint": fingerprint(model), "steps": report["steps_done"], "config": asdict(cfg)}
    path = save_head(head, out / "head.safetensors", target_name=loaded.name, extra=extra)
    report["head_bytes"] = path.stat().st_size
    (out / "history.json").write_text(json.dumps(asdict(hist)))
    (out / "report.json").write_text(json.dumps(report, indent=1))
    plot_loss(hist, out / "loss.png")
    log(f"wrote {path} ({report['head_bytes'] / 2**20:.1f} MiB); held-out acceptance {json.dumps(by_domain)}")
    return report


def data_stats(train, held, ids: torch.Tensor) -> dict:
    inside = torch.zeros(int(ids.max()) + 1, dtype=torch.bool)
    inside[ids] = True
    cont = [t for s in held for t in s.tokens[s.prompt_len :]]
    covered = sum(1 for t in cont if t < len(inside) and inside[t]) / max(1, len(cont))
    return {
        "train_sequences": {d: sum(s.domain == d for s in train) for d in DOMAINS},
        "train_tokens": sum(len(s.tokens) for s in train),
        "held_out_sequences": {d: sum(s.domain == d for s in held) for d in DOMAINS},
        "held_out_continuation_tokens_in_head_vocab": covered,
    }


def environment(dev: torch.device) -> dict:
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(), "torch": torch.__version__,
           "machine": platform.machine(), "cpu_threads": torch.get_num_threads()}
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def plot_loss(hist, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k in range(len(hist.per_pass[0]) if hist.per_pass else 0):
        ax.plot(hist.steps, [p[k] for p in hist.per_pass], label=f"pass {k} (draft position {k + 1})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy to the target (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
