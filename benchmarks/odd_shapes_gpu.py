"""The engines at model shapes that are not powers of two (issue #41), against transformers, on a GPU.

    python benchmarks/odd_shapes_gpu.py --out $OUT/odd_shapes_gpu.json            # an H100: every shape, < 8 min
    python benchmarks/odd_shapes_gpu.py --out /tmp/odd.json --shapes hd24 --new-tokens 8   # the CPU: plumbing only

Per shape a tiny random-weight Llama is built with transformers (``LlamaConfig`` / ``LlamaForCausalLM``, fp32),
saved to a temporary directory and loaded through each backend's public loader (``flashspec_torch.weights.load``,
``flashspec_jax.weights.load``). Greedy tokens for two prompts (batch 1 each: a random one,
and a longer one that repeats it around its continuation, prefilled by SDPA) of:

* ``transformers``: ``generate(do_sample=False)`` in fp32 (the reference);
* ``torch_graphs``: the torch engine in fp32 with CUDA graphs and speculation on (n-gram draft, G = 4);
* ``torch_eager``: the same without CUDA graphs (every launch through Triton's launcher: counted, ``kernels_ran``);
* ``torch_plain``: plain greedy decoding, CUDA graphs;
* ``jax``: the JAX engine in fp32 (matmul precision "highest"), speculation on (n-gram draft), its host loop.

Each comparison records ``equal`` and the first mismatch (prompt, index, both tokens, and transformers' gap
between its two largest logits there: a gap near float32 rounding is a near-tie, not a bug). A shape passes when
every comparison is equal. On the CPU the torch engine runs plain torch (no Triton), so a CPU run checks only the
script's plumbing. The JSON has the hardware, versions, date, each shape's config and per-check results.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

# (head_dim, hidden, intermediate, heads, kv_heads, vocab): the odd sizes, each in a real model's place
SHAPES = {
    "hd24": (24, 96, 256, 4, 2, 32000),  # the crash: hidden 96, 4 heads
    "hd80": (80, 2560, 10240, 32, 32, 51200),  # Phi-2's widths
    "hd96": (96, 3072, 8192, 32, 32, 32064),  # Phi-3-mini's widths
    "hd112": (112, 896, 4864, 8, 2, 151936),  # Qwen2-0.5B's hidden and vocabulary, heads of 112
    "w960": (64, 960, 2560, 15, 5, 49153),  # SmolLM2-360M's widths, an odd vocabulary
    "w2560": (128, 2560, 6912, 20, 4, 151936),  # hidden 2560, intermediate 6912, Qwen's vocabulary
}
GAMMA = 4


def hf_model(name: str, layers: int, device: str):
    """A random transformers Llama in fp32 (std 0.1: logits spread well beyond float32 rounding)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    head_dim, hidden, inter, heads, kv_heads, vocab = SHAPES[name]
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=512, initializer_range=0.1, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval()


def prompts(model, vocab: int) -> list[list[int]]:
    """A random prompt p, and p + the model's own greedy continuation c of p + p again (after the second p the
    n-gram draft proposes c; random weights rarely repeat it: the JSON has the acceptance of each run)."""
    p = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(vocab)).tolist()
    c, _ = hf_generate(model, p, 24)
    return [p, p + c + p]


def hf_generate(model, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """(greedy tokens, the gap between the two largest logits at each step)."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    gaps = [float(s[0].topk(2).values.diff().abs()) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), gaps


def compare(got: list[list[int]], want: list[list[int]], gaps: list[list[float]] | None = None) -> dict:
    for p, (a, b) in enumerate(zip(got, want)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                first = dict(prompt=p, index=i, got=x, want=y)
                if gaps is not None:
                    first["reference_top2_gap"] = gaps[p][i]
                return dict(equal=False, first_mismatch=first)
        if len(a) != len(b):
            return dict(equal=False, first_mismatch=dict(prompt=p, index=min(len(a), len(b)), lengths=[len(a), len(b)]))
    return dict(equal=True, first_mismatch=None)


class CountLaunches:
    """Counts Triton launches by kernel name while active (every ``kernel[grid](...)`` goes through run)."""

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        self.counts, self.original = collections.Counter(), JITFunction.run
        counts, original = self.counts, self.original

        def run(fn, *args, **kwargs):
            counts[fn.fn.__name__] += 1
            return original(fn, *args, **kwargs)

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.jit import JITFunction

        JITFunction.run = self.original


def torch_runs(directory: Path, ps: list[list[int]], new_tokens: int, device: str) -> tuple[dict, dict]:
    """({run name: tokens per prompt}, facts about the kernels) for the torch engine on the saved model."""
    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, decode, speculate
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.layers import default_impl, kernel_attends
    from flashspec_torch.weights import load

    model = load(str(directory), torch.float32, device).model
    greedy, spec = SamplingConfig(0.0), SpecConfig(gamma=GAMMA, max_new_tokens=new_tokens)
    runs, acceptance = {}, []
    launches = CountLaunches() if device == "cuda" else None
    for name, graphs in (("torch_graphs", True), ("torch_eager", False)):
        backend = TorchBackend(model, [LookupDraft("ngram")], graphs=graphs)
        outs = []
        for p in ps:
            if name == "torch_eager" and launches is not None:
                with launches:
                    out, records = speculate(backend, Fixed(), [p], sampling=greedy, spec=spec)
            else:
                out, records = speculate(backend, Fixed(), [p], sampling=greedy, spec=spec)
            outs.append(out[0])
            acceptance.append(sum(r.accepted for r in records) / max(1, sum(r.drafted for r in records)))
        runs[name] = outs
    backend = TorchBackend(model, [LookupDraft("ngram")], graphs=True)
    runs["torch_plain"] = [decode(backend, [p], sampling=greedy, max_new_tokens=new_tokens)[0][0] for p in ps]
    c = model.config
    linear_impl, pdl, fused, rows = model.decode_settings(torch.device(device))
    facts = dict(impl=model.impl or default_impl(torch.device(device)),
                 attention_kernel_decode=kernel_attends(default_impl(torch.device(device)), c.num_heads, c.num_kv_heads,
                                                        1, c.head_dim),
                 linear_impl=linear_impl, pdl=pdl, fused_projections=sorted(fused), fused_rows=rows,
                 kernels_ran=dict(launches.counts) if launches is not None else {},
                 ngram_acceptance_per_run=acceptance)
    del model, backend
    return runs, facts


def jax_run(directory: Path, ps: list[list[int]], new_tokens: int) -> tuple[list[list[int]], str]:
    import jax

    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, speculate
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.weights import load

    jax.config.update("jax_default_matmul_precision", "highest")  # fp32 products in fp32 (the GPU default is TF32)
    model = load(str(directory)).model
    backend = JaxBackend(model)
    backend.set_drafts([LookupDraft("ngram")])
    spec = SpecConfig(gamma=GAMMA, max_new_tokens=new_tokens)
    outs = [speculate(backend, Fixed(), [p], sampling=SamplingConfig(0.0), spec=spec)[0][0] for p in ps]
    return outs, jax.default_backend()


class Fixed:  # the one draft, every step
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def run_shape(name: str, layers: int, new_tokens: int, device: str, with_jax: bool) -> dict:
    head_dim, hidden, inter, heads, kv_heads, vocab = SHAPES[name]
    row = dict(shape=name, head_dim=head_dim, hidden_size=hidden, intermediate_size=inter, num_heads=heads,
               num_kv_heads=kv_heads, vocab_size=vocab, num_layers=layers, new_tokens=new_tokens, gamma=GAMMA)
    start = time.perf_counter()
    hf = hf_model(name, layers, device)
    ps = prompts(hf, vocab)
    want, gaps = zip(*(hf_generate(hf, p, new_tokens) for p in ps))
    row["smallest_reference_top2_gap"] = min(min(g) for g in gaps)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        del hf
        try:
            runs, row["torch"] = torch_runs(Path(tmp), ps, new_tokens, device)
        except Exception as e:  # noqa: BLE001  (the JSON records the failure, the next shape still runs)
            runs, row["torch_error"] = {}, f"{type(e).__name__}: {e}"[:2000]
        if with_jax:
            try:
                runs["jax"], row["jax_platform"] = jax_run(Path(tmp), ps, new_tokens)
            except Exception as e:  # noqa: BLE001
                row["jax_error"] = f"{type(e).__name__}: {e}"[:2000]
    checks = {}
    if "torch_graphs" in runs:
        checks["torch_graphs_vs_eager"] = compare(runs["torch_graphs"], runs["torch_eager"])
    for run in ("torch_graphs", "torch_eager", "torch_plain", "jax"):
        if run in runs:
            checks[f"{run}_vs_transformers"] = compare(runs[run], list(want), list(gaps))
    row["checks"] = checks
    row["tokens"] = dict(transformers=list(want), **runs)
    row["pass"] = bool(checks) and all(c["equal"] for c in checks.values()) and "torch_error" not in row and (
        "jax_error" not in row)
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


def environment(device: str) -> dict:
    import transformers
    import triton

    env = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), python=platform.python_version(),
               torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
               device=device, gpu=torch.cuda.get_device_name() if device == "cuda" else None)
    try:
        import jax

        env.update(jax=jax.__version__, jax_devices=[str(d) for d in jax.devices()])
    except Exception as e:  # noqa: BLE001
        env["jax"] = f"unavailable: {e}"
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                       cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        env["commit"] = None
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--no-jax", action="store_true", help="leave the JAX engine out")
    ap.add_argument("--budget-s", type=float, default=360.0, help="start no new shape after this many seconds")
    args = ap.parse_args()
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; choose among {list(SHAPES)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, in transformers as in cuBLAS products
    torch.backends.cudnn.allow_tf32 = False
    doc = dict(environment=environment(device), note=__doc__.split("\n\n")[2], shapes=[], skipped=[])
    out, start = Path(args.out), time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        if time.perf_counter() - start > args.budget_s:
            doc["skipped"].append(name)
            continue
        row = run_shape(name, args.layers, args.new_tokens, device, not args.no_jax)
        doc["shapes"].append(row)
        doc["all_pass"] = all(r["pass"] for r in doc["shapes"]) and not doc["skipped"]
        out.write_text(json.dumps(doc, indent=1))  # after every shape: a cut-off run keeps what it did
        print(f"{name}: pass={row['pass']} {json.dumps(row['checks'])} ({row['wall_s']} s)", flush=True)
    doc["all_pass"] = all(r["pass"] for r in doc["shapes"]) and not doc["skipped"]
    doc["wall_s"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(doc, indent=1))
    print(f"all_pass={doc['all_pass']} -> {out}")


if __name__ == "__main__":
    main()
