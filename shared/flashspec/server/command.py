"""``flashspec serve``'s options and run (the web libraries are imported only when it runs)."""

from __future__ import annotations

import argparse
import sys


def add_serve(sub, positive_int) -> None:
    from ..adaptive import NAME, engine_policies

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching",
                       description="Serve the embedded SmolLM2-135M-Instruct (or --target) over HTTP: /v1/completions, "
                                   "/v1/chat/completions, /v1/models, /health, /metrics.")
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--target", help="a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", action="append", metavar="DRAFT",
                   help="ngram[:N] | nf4 | layerskip[:L1-L2] | self | head[:DIR][@N] | PATH; repeat for several "
                        "(default ngram)")
    p.add_argument("--policy", choices=engine_policies(), default=NAME,
                   help="draft selection (default %(default)s: each step chooses plain decoding or a draft at G or "
                        "G // 2 for the requests it serves, from each request's own acceptance and the step times "
                        "measured at the current batch size; a bandit name: every step drafts G tokens with the "
                        "bandit's draft; fixed: a request's tokens do not depend on the other requests)")
    p.add_argument("--gamma", type=positive_int, default=4, help="tokens drafted per step (adaptive: G and G // 2)")
    p.add_argument("--no-speculation", action="store_true", help="plain autoregressive decoding")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=positive_int, default=16, help="requests served at once (KV-cache slots)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting at most; more get 429")
    p.add_argument("--context", type=positive_int, help="tokens per slot, prompt + output (default: the model's, "
                                                       "at most 2048)")
    p.add_argument("--prefill-chunk", type=positive_int, default=512, metavar="TOKENS",
                   help="prompt tokens prefilled between two steps at most: a longer prompt enters in chunks, "
                        "so running requests keep streaming (default %(default)s)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="a request's tokens independent of the requests served beside it (batch-invariant kernels)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds SIGTERM / Ctrl-C waits for requests in flight before cancelling them")
    p.add_argument("--warm-up", default="0,1", metavar="T1,T2",
                   help="temperatures whose steps are captured (CUDA graphs) before serving (default %(default)s; "
                        "'' for none; others are captured on first use)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    if args.max_queue < 0 or not 0 <= args.port < 65536 or args.drain_timeout < 0:
        raise ValueError("--max-queue and --drain-timeout must be >= 0 and --port in [0, 65535]")
    try:
        import uvicorn

        from .app import create_app
        from .metrics import Metrics
    except ImportError as e:
        raise ImportError(f"flashspec serve needs the serve extra: pip install 'flashspec[serve]' ({e})") from None
    from ..engine import engine_class
    from ..serving import Service

    make, drafts = engine_class(args.backend), tuple(args.draft or ("ngram",))
    if args.batch_invariant:
        eng = make(args.target, drafts, policy=args.policy, device=args.device, batch_invariant=True)
    else:
        eng = make(args.target, drafts, policy=args.policy, device=args.device)
    metrics = Metrics(eng.target.name, list(eng.backend.draft_names), args.max_batch)
    service = Service(eng, max_batch=args.max_batch, max_queue=args.max_queue, context=args.context,
                      gamma=args.gamma, speculation=not args.no_speculation, prefill_chunk=args.prefill_chunk,
                      observer=metrics)
    try:
        temperatures = [float(t) for t in args.warm_up.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--warm-up {args.warm_up!r} must be comma-separated temperatures") from None
    captured = service.prepare(temperatures)
    app = create_app(service, metrics, drain_timeout=args.drain_timeout)
    print(f"flashspec serve: {service.model_name} on http://{args.host}:{args.port} ({args.max_batch} slots of "
          f"{service.context} tokens; {captured} step kinds prepared ahead)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.drain_timeout + 5)
    return 0
