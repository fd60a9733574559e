"""Logit rows shaped like a real LLM's, for timing the verify kernels beyond flat random rows.

The verify benchmarks draw target logits as z = 2 N(0, 1): flat rows, on which the sweep's exact pruning
passes over the fewest tiles (the worst case for the kernel). A language model's rows are peaked: a few
tokens hold most of the mass, far above a broad bulk. This module records what such rows look like and
draws rows of any vocabulary size from that record:

    python benchmarks/llm_rows.py collect      # CPU: SmolLM2-135M answers the chat prompts; writes ROWS_FILE
    python benchmarks/llm_rows.py show         # what the committed record holds (mass of the top token, entropy)

The record (``benchmarks/data/smollm2_rows.npz``): for each of R decoding positions of SmolLM2-135M-Instruct
(the embedded model, sampling at T = 0.7 through the chat prompts of ``benchmarks/prompts/chat.txt``), its
HEAD largest logits exactly ([R, HEAD], descending) and QUANTILES quantiles of the other logits ([R, Q],
ascending, at probabilities (k + 0.5) / Q). ``sample_rows`` puts a recorded row's head at random positions of a
V-sized row and fills the rest with independent draws from its bulk's quantile function, so a row keeps the
real gap between its top tokens and the rest at any V (the bulk holds V / 49152 times the mass it had).
"""

from __future__ import annotations

import argparse
import datetime
import pathlib

import numpy as np

ROWS_FILE = pathlib.Path(__file__).parent / "data" / "smollm2_rows.npz"
HEAD = 64  # logits kept exactly per row
QUANTILES = 1024  # quantiles kept of the rest


def summarise(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # z [R, V] -> head [R, HEAD], bulk [R, Q]
    """Each row's HEAD largest logits (descending) and the quantiles of the others (ascending)."""
    s = np.sort(z.astype(np.float64), axis=-1)[:, ::-1]
    head, rest = s[:, :HEAD], s[:, HEAD:][:, ::-1]
    probs = (np.arange(QUANTILES) + 0.5) / QUANTILES
    bulk = np.quantile(rest, probs, axis=-1).T
    return head.astype(np.float32), bulk.astype(np.float32)


def load(path: pathlib.Path = ROWS_FILE) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: `python benchmarks/llm_rows.py collect` records it (CPU, ~1 min)")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def sample_rows(record: dict, n: int, v: int, device, gen, first: int = 0):  # -> [n, v] float32 torch tensor
    """n rows of V logits: row i takes recorded row (first + i) % R's head at random positions and draws the
    rest from its bulk."""
    import torch

    head = torch.as_tensor(record["head"], dtype=torch.float32, device=device)  # [R, HEAD]
    bulk = torch.as_tensor(record["bulk"], dtype=torch.float32, device=device)  # [R, Q]
    r, q = bulk.shape
    if v <= head.shape[1]:
        raise ValueError(f"{v=} must exceed the {head.shape[1]} head logits a recorded row keeps")
    which = (torch.arange(n, device=device) + first) % r
    # inverse CDF of the bulk: linear between the quantiles, clamped at the outer ones
    t = (torch.rand(n, v, device=device, generator=gen) * q - 0.5).clamp_(0, q - 1)
    lo = t.floor().long().clamp_(max=q - 2)
    frac = t - lo
    rows = bulk[which]  # [n, Q]
    z = torch.lerp(rows.gather(1, lo), rows.gather(1, lo + 1), frac)
    # the head at HEAD distinct random positions of each row
    pos = torch.rand(n, v, device=device, generator=gen).topk(head.shape[1], dim=1).indices
    z.scatter_(1, pos, head[which])
    return z


def collect(out: pathlib.Path, tokens_per_prompt: int, temperature: float, seed: int) -> None:
    import torch

    from drafts_common import chat_prompts
    from flashspec.engine import encode
    from flashspec_torch.weights import load as load_model

    prompts = chat_prompts()
    loaded = load_model(None)
    model, tok = loaded.model, loaded.tokenizer
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = encode(tok, prompt, chat=True)
            for _ in range(tokens_per_prompt):
                t = torch.tensor([ids])
                cache = model.new_cache(1, t.shape[1])
                logits = model(t, torch.arange(t.shape[1])[None], cache, t.shape[1], logits_last=1)[0, -1]
                rows.append(logits.numpy().copy())
                g = -torch.log(-torch.log(torch.rand(logits.shape, generator=gen).clamp_(1e-12, 1 - 1e-7)))
                ids.append(int((logits / temperature + g).argmax()))
            print(f"{len(rows):4d} rows | {prompt[:60]!r} -> {tok.decode(ids[-tokens_per_prompt:])[:60]!r}", flush=True)
    z = np.stack(rows)
    p = torch.softmax(torch.as_tensor(z) / temperature, -1)
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    print(f"recorded rows (T = {temperature}): top-token probability median {p.max(-1).values.median():.3f}, "
          f"entropy median {ent.median():.2f} nats")
    head, bulk = summarise(z)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, head=head, bulk=bulk, vocab=np.int64(z.shape[1]), temperature=np.float32(temperature),
                        model=np.str_(loaded.name), date=np.str_(datetime.date.today().isoformat()),
                        command=np.str_(f"python benchmarks/llm_rows.py collect --tokens {tokens_per_prompt} "
                                        f"--temperature {temperature} --seed {seed}"))
    print(f"wrote {out}: {z.shape[0]} rows of V = {z.shape[1]}")


def describe(record: dict, temperature: float = 0.7) -> str:
    """Top-token probability and entropy of the recorded rows at their own V, and of rows drawn at V = 128256."""
    import torch

    lines = []
    v0 = int(record["vocab"])
    for v in (v0, 32000, 128256):
        z = sample_rows(record, len(record["head"]), v, "cpu", torch.Generator().manual_seed(0))
        p = torch.softmax(z / temperature, -1)
        ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        top = p.max(-1).values
        lines.append(f"V = {v:6d} (T = {temperature}): top-token probability median {top.median():.3f} "
                     f"(quartiles {top.quantile(0.25):.3f}-{top.quantile(0.75):.3f}), entropy median {ent.median():.2f} nats")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["collect", "show"])
    ap.add_argument("--out", type=pathlib.Path, default=ROWS_FILE)
    ap.add_argument("--tokens", type=int, default=16, help="decoding positions recorded per chat prompt")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.what == "collect":
        collect(args.out, args.tokens, args.temperature, args.seed)
    rec = load(args.out)
    print(f"{args.out}: {len(rec['head'])} rows of {rec['model']} (V = {int(rec['vocab'])}), {rec['date']}")
    print(describe(rec))


if __name__ == "__main__":
    main()
