"""The eager tree scoring pass (``flashspec_torch.tree_score.score_tree``) on a GPU: is every slot's row its path's
causal row in bf16, and what does one pass of N+1 tree rows cost beside the chain's scoring pass?

    python benchmarks/tree_score_gpu.py --out $OUT/tree_score.json [--model PATH] [--sizes 8,16,32,64]

The embedded SmolLM2-135M unless --model (a GGUF or a Hugging Face directory), in --dtype (bf16). Per tree
size N: B rows of random trees (a random parent per node, distinct random sibling tokens) rooted after a
random context of --context tokens, every row's cache prefilled. ``check``: row 0's slots against their paths
run causally on a fresh cache (the engine's kernels there, the plain torch layers in the tree pass): max
|diff|, the logits' max |value|, argmax agreement. ``ms``: medians over --reps of score_tree (host layout
included), of the layout alone, of the chain scoring pass of N+1 rows (``Llama.forward`` as
``TorchBackend.score`` calls it) and of G+1 = 5 rows. ``--device cpu --dtype float32`` tests the script.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone

import numpy as np
import torch

from flashspec.tree_layout import slot_depths, tree_attention_mask
from flashspec.tree_testing import token_paths
from flashspec_torch.tree_score import score_tree
from flashspec_torch.weights import load


def random_trees(r, b: int, n: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:  # [B, N] tokens, parents
    tokens, parents = np.zeros((b, n), np.int64), np.zeros((b, n), np.int64)
    for i in range(b):
        for j in range(n):
            a = int(r.integers(-1, j))
            taken = set(tokens[i, :j][parents[i, :j] == a])
            t = int(r.integers(0, vocab))
            while t in taken:
                t = int(r.integers(0, vocab))
            tokens[i, j], parents[i, j] = t, a
    return tokens, parents


def timed_ms(fn, reps: int, device) -> float:
    """Median wall time of fn() over reps calls (after one warm-up), synchronised."""
    out = []
    for k in range(reps + 1):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if k:
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_row0(model, ctx, tokens, parents, z) -> dict:
    """Row 0's slots against "context (root last), path" run causally: max |diff|, max |logit|, argmax agreement."""
    diffs, scale, agree = [], 0.0, []
    for s, path in enumerate(token_paths(tokens[0], parents[0])):
        ids = torch.tensor([[*ctx[0].tolist(), *path]], device=z.device)
        t = ids.shape[1]
        want = model(ids, torch.arange(t, device=z.device)[None], model.new_cache(1, t), t, logits_last=1)[0, 0]
        diffs.append((z[0, s] - want).abs().max().item())
        scale = max(scale, want.abs().max().item())
        agree.append(bool(z[0, s].argmax() == want.argmax()))
    return {"max_abs_diff": max(diffs), "max_abs_logit": scale, "argmax_agree": sum(agree) / len(agree)}


def one_size(model, r, args, n: int, device) -> dict:
    b, length, v = args.batch, args.context, model.config.vocab_size
    ctx = torch.from_numpy(r.integers(0, v, (b, length))).to(device)  # the context; its last token is the root
    tokens, parents = random_trees(r, b, n, v)
    cache = model.new_cache(b, length + n + 8)
    base = torch.full((b,), length - 1, dtype=torch.int64, device=device)
    model(ctx[:, :-1], torch.arange(length - 1, device=device).expand(b, -1), cache, length - 1, logits_last=0)
    tt, pp = torch.from_numpy(tokens).to(device), torch.from_numpy(parents).to(device)
    z = score_tree(model, cache, ctx[:, -1], tt, pp, base)
    out = {"n": n, "depth": int(slot_depths(parents).max()), "check": check_row0(model, ctx, tokens, parents, z)}

    def chain(g: int):
        pos = base[:, None] + torch.arange(g + 1, device=device)
        return lambda: model(torch.cat([ctx[:, -1:], tt[:, :g]], 1), pos, cache, length + g)

    out["ms"] = {"score_tree": timed_ms(lambda: score_tree(model, cache, ctx[:, -1], tt, pp, base), args.reps, device),
                 "layout_host": timed_ms(lambda: (tree_attention_mask(parents), slot_depths(parents)), args.reps, device),
                 "chain_n_plus_1_rows": timed_ms(chain(n), args.reps, device),
                 "chain_5_rows": timed_ms(chain(min(4, n)), args.reps, device)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="GGUF or HF directory; default: the embedded SmolLM2-135M")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--sizes", default="8,16,32,64")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new sizes after this many seconds")
    args = p.parse_args()
    device = torch.device(args.device)
    model = load(args.model, getattr(torch, args.dtype), args.device).model
    r = np.random.default_rng(0)
    t0, results = time.perf_counter(), []
    with torch.inference_mode():
        for n in (int(x) for x in args.sizes.split(",")):
            if time.perf_counter() - t0 > args.budget_s:
                break
            results.append(one_size(model, r, args, n, device))
            print(json.dumps(results[-1]), flush=True)
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()}
    report = {"when": datetime.now(timezone.utc).isoformat(), "args": vars(args), "env": env, "results": results}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
