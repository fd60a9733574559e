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

from .head_train import (TrainConfig, acceptance_by_position, for_training, frequent_tokens, generate_sequences,
                         init_file, initial_head, token_counts, train_head)
from .heads import fingerprint, load_head, save_head


def pick(prompts, per_domain: int, seed: int):
    """Up to ``per_domain`` prompts of each domain, a fixed random choice."""
    rng = random.Random(seed)
    out = []
    for d in DOMAINS:
        mine = [p for p in prompts if p.domain == d]
        out += rng.sample(mine, min(per_domain, len(mine)))
    return out


def run_train_head(out: str | Path, cfg: TrainConfig, *, target=None, train_per_domain: int = 600,
                   eval_per_domain: int = 40, device=None, dtype=None, compare: dict | None = None,
                   tops: tuple[int, ...] = (), log=print) -> dict:
    """Train a head for ``target`` (None: the embedded model; a LoadedModel or a TARGET_HELP spelling).
    ``compare`` ({name: head file or directory}): other heads measured on the same held-out sequences
    (report ``compare``); ``tops``: the new head also over its N most frequent tokens only
    (``load_head(top=N)``; report ``held_out_acceptance_top_n``)."""
    from .engine import check_device, load_target
    from .weights import LoadedModel

    t0 = time.perf_counter()
    dev = check_device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    loaded = target if isinstance(target, LoadedModel) else load_target(target, dtype, dev)
    if loaded.tokenizer is None:
        raise ValueError(f"target {loaded.name!r} has no tokenizer: training prompts must be encoded")
    model = loaded.model
    t_load = time.perf_counter()
    start = initial_head(model, cfg, None) if cfg.init else None  # loaded and checked once, before generating
    train, held = make_data(model, loaded.tokenizer, cfg, train_per_domain, eval_per_domain, log)
    t_gen = time.perf_counter()
    counts = token_counts(train, model.config.vocab_size)
    ids = start.token_ids if start is not None else frequent_tokens(train, cfg.vocab, model.config.vocab_size)
    generated = sum(len(s.tokens) - s.prompt_len for s in train + held)
    gen_rate = generated / max(t_gen - t_load, 1e-9)
    log(f"generated {generated} tokens in {t_gen - t_load:.1f} s ({gen_rate:.0f}/s); training from {cfg.init or 'scratch'}")
    head, hist = train_head(model, train, cfg, None if start is not None else ids, head=start,
                            on_log=lambda s, l, per: log(f"step {s}: loss {l:.4f} {per}"))
    t_train = time.perf_counter()
    steps_done = hist.steps[-1] + 1 if hist.steps else 0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"fingerprint": fingerprint(model), "steps": steps_done, "config": asdict(cfg)}
    path = save_head(head, out / "head.safetensors", target_name=loaded.name, extra=extra, counts=counts)
    by_domain, by_top, others = measure(path, len(head.token_ids), model, held, cfg.passes, tops,
                                        compare or {})
    report = {
        "target": loaded.name, "device": str(dev), "dtype": str(dtype), "config": asdict(cfg),
        "feature_layers": list(head.feature_layers), "head_vocab": len(head.token_ids),
        "data": data_stats(train, held, ids, model.config.vocab_size),
        "seconds": {"load": t_load - t0, "generate": t_gen - t_load, "train": t_train - t_gen,
                    "evaluate": time.perf_counter() - t_train},
        "init": str(init_file(cfg.init)) if cfg.init else None,
        "steps_done": steps_done,
        "final_loss": hist.loss[-1] if hist.loss else None,
        "generation": {"tokens": generated, "tokens_per_s": gen_rate},
        "throughput": throughput(hist),
        "held_out_acceptance": by_domain,
        "held_out_acceptance_top_n": by_top,
        "compare": others,
        "environment": environment(dev),
    }
    report["head_bytes"] = path.stat().st_size
    (out / "history.json").write_text(json.dumps(asdict(hist)))
    (out / "report.json").write_text(json.dumps(report, indent=1))
    plot_loss(hist, out / "loss.png")
    log(f"wrote {path} ({report['head_bytes'] / 2**20:.1f} MiB); training {json.dumps(report['throughput'])}; "
        f"held-out acceptance {json.dumps(by_domain)}")
    return report


def measure(path: Path, vocab: int, model, held, passes: int, tops, compare: dict) -> tuple[dict, dict, dict]:
    """Held-out acceptance of the head as saved at ``path`` (bf16 weights, as it ships), of it over
    its N most frequent tokens for each N of ``tops`` below its ``vocab``, and of the ``compare`` heads."""
    def at(p, top=0):
        return held_out_acceptance(load_head(p, model.config, top=top)[0], model, held, passes)

    return at(path), {n: at(path, n) for n in tops if n < vocab}, {name: at(p) for name, p in compare.items()}


def make_data(model, tok, cfg: TrainConfig, train_per_domain: int, eval_per_domain: int, log) -> tuple[list, list]:
    """(training sequences: ``cfg.samples`` sampled continuations per prompt, plus a greedy one when
    ``cfg.greedy``; held-out sequences: one sampled continuation per prompt). The held-out ones come
    first; the training prompts are shuffled across domains, so that ``cfg.gen_seconds`` cuts every
    domain alike: the greedy continuations get at most their share of it (``1 / (samples + 1)``), the
    sampled ones the rest."""
    train_prompts, held_prompts = split(corpus())
    train_prompts = pick(train_prompts, train_per_domain, cfg.seed)
    random.Random(cfg.seed + 2).shuffle(train_prompts)
    held_prompts = pick(held_prompts, eval_per_domain, cfg.seed + 1)
    enc = lambda p: encode(tok, p.text, p.domain == "chat")  # noqa: E731
    eos = model.config.eos_token_ids
    log(f"generating: {len(train_prompts)} training prompts x ({cfg.samples} sampled{' + 1 greedy' if cfg.greedy else ''}) "
        f"+ {len(held_prompts)} held-out prompts x {cfg.new_tokens} tokens")
    held = generate_sequences(model, held_prompts, enc, cfg, eos)
    start, train = time.perf_counter(), []
    if cfg.greedy:  # first: the cheap ones (no noise to draw), so that what they leave goes to sampling
        greedy_by = None if cfg.gen_seconds is None else start + cfg.gen_seconds / (cfg.samples + 1)
        train += generate_sequences(model, train_prompts, enc, cfg, eos, greedy=True, deadline=greedy_by)
    end = None if cfg.gen_seconds is None else start + cfg.gen_seconds
    return train + generate_sequences(model, train_prompts * cfg.samples, enc, cfg, eos, deadline=end), held


def held_out_acceptance(head, model, held, passes: int) -> dict:
    """``acceptance_by_position`` per domain of the held-out sequences."""
    head = for_training(head, model)
    return {d: acceptance_by_position(head, model, [s for s in held if s.domain == d], passes)
            for d in DOMAINS if any(s.domain == d for s in held)}


def throughput(hist) -> dict:
    """Training steps and tokens per second after the first logged step (which includes warm-up work)."""
    if len(hist.steps) < 2:
        return {"steps_per_s": None, "tokens_per_s": None}
    dt = hist.seconds[-1] - hist.seconds[0]
    return {"steps_per_s": (hist.steps[-1] - hist.steps[0]) / dt, "tokens_per_s": (hist.tokens[-1] - hist.tokens[0]) / dt}


def data_stats(train, held, ids: torch.Tensor, vocab_size: int) -> dict:
    """Sequence and token counts; the share of held-out continuation tokens inside the head's
    vocabulary (``ids``, most frequent first) and inside its 2k / 4k / 8k most frequent tokens."""
    cont = torch.tensor([t for s in held for t in s.tokens[s.prompt_len :]], dtype=torch.int64)
    rank = torch.full((vocab_size,), len(ids), dtype=torch.int64)  # a token's place in ids (len(ids): outside)
    rank[ids] = torch.arange(len(ids))
    r = rank[cont]

    def covered(n: int) -> float:
        return float((r < n).float().mean()) if len(cont) else 0.0

    return {
        "train_prompts": {d: len({tuple(s.tokens[: s.prompt_len]) for s in train if s.domain == d}) for d in DOMAINS},
        "train_sequences": {d: sum(s.domain == d for s in train) for d in DOMAINS},
        "train_tokens": sum(len(s.tokens) for s in train),
        "held_out_sequences": {d: sum(s.domain == d for s in held) for d in DOMAINS},
        "held_out_continuation_tokens_in_head_vocab": covered(len(ids)),
        "held_out_coverage_by_top_n": {n: covered(n) for n in (2048, 4096, 8192) if n <= len(ids)},
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
