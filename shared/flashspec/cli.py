"""The ``flashspec`` command: ``bandit-sim`` and ``bench bandit`` (more subcommands plug in below).

Each subcommand is an ``add_*`` function that adds its parser and sets ``run`` to a function of
the parsed arguments returning the exit status. Bad input exits with status 2 and one line on
stderr, never a traceback; a fault while running (NaN logits, an unexpected error) exits 1 with one
line; Ctrl-C exits 130 (``generate`` prints what it had produced first). docs/failure_modes.md
lists them. ``FLASHSPEC_TRACEBACK=1`` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")  # the user's text may hold a line break


class UsageError(Exception):
    """Bad input found after parsing (e.g. means outside [0, 1]): one line, exit status 2."""


def floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")


def ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def seed_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [0, 2**63)")
    return value


def add_config_options(p: argparse.ArgumentParser) -> None:
    """Options that fill a BanditConfig (defaults: the dataclass's)."""
    from .bandits import LIKELIHOODS, OBJECTIVES, RESTARTS, BanditConfig

    d = BanditConfig()
    g = p.add_argument_group("policy settings")
    g.add_argument("--objective", choices=OBJECTIVES, default=d.objective,
                   help="what the policies maximise and regret measures (default %(default)s)")
    g.add_argument("--likelihood", choices=LIKELIHOODS, default=d.likelihood,
                   help="Thompson-family posterior (default %(default)s)")
    g.add_argument("--discount", type=float, default=d.discount,
                   help="discounted-thompson's factor (default %(default)s)")
    g.add_argument("--cd-delta", type=float, default=d.cd_delta,
                   help="cd-thompson's Page-Hinkley drift allowance (default %(default)s)")
    g.add_argument("--cd-threshold", type=float, default=d.cd_threshold,
                   help="cd-thompson's alarm threshold (default %(default)s)")
    g.add_argument("--cd-warmup", type=int, default=d.cd_warmup,
                   help="observations of an arm before it is tested (default %(default)s)")
    g.add_argument("--restart", choices=RESTARTS, default=d.restart,
                   help="cd-thompson forgets all arms or the alarmed arm (default %(default)s)")
    g.add_argument("--fixed-arm", type=int, default=d.fixed_arm,
                   help="the fixed policy's arm (default %(default)s)")


def config_from(args):
    from .bandits import BanditConfig

    return BanditConfig(
        objective=args.objective, likelihood=args.likelihood, discount=args.discount,
        cd_delta=args.cd_delta, cd_threshold=args.cd_threshold, cd_warmup=args.cd_warmup,
        restart=args.restart, fixed_arm=args.fixed_arm,
    )


def add_bandit_sim(sub) -> None:
    from .bandits import POLICIES

    p = sub.add_parser("bandit-sim", help="simulate draft-selection policies on synthetic arms",
                       description="Cumulative pseudo-regret of bandit policies over many seeds.")
    p.add_argument("--policy", action="append", choices=[*POLICIES, "all"],
                   help="policy to simulate; repeat for several, or 'all' (default all)")
    p.add_argument("--means", type=floats, default=(0.3, 0.7, 0.5),
                   help="per-arm success (or per-token acceptance) probabilities (default 0.3,0.7,0.5)")
    p.add_argument("--rounds", type=positive_int, default=10_000)
    p.add_argument("--seeds", type=positive_int, default=200)
    p.add_argument("--seed", type=seed_int, default=0, help="base seed of every generator")
    p.add_argument("--reward", choices=("bernoulli", "acceptance"), default="bernoulli")
    p.add_argument("--gamma", type=ints, default=(4,),
                   help="tokens drafted per pull for --reward acceptance (one, or one per arm)")
    sw = p.add_mutually_exclusive_group()
    sw.add_argument("--switch-every", type=positive_int, metavar="N",
                    help="rotate the means by one arm every N rounds")
    sw.add_argument("--switch-at", type=ints, nargs="+", metavar="T",
                    help="rotate the means at these rounds (comma- or space-separated)")
    p.add_argument("--costs", type=floats, help="seconds per step per arm (--objective throughput)")
    p.add_argument("--free", type=ints, default=(), metavar="ARMS",
                   help="arms scored after every round without being run (full information, as the n-gram "
                        "draft is from the emitted text), e.g. 0,1,2")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_options(p)
    p.set_defaults(run=run_bandit_sim)


def run_bandit_sim(args) -> int:
    from .bandit_bench import report, run_policies
    from .bandits import POLICIES
    from .simulate import Environment, switch_every

    names = args.policy or ["all"]
    names = list(POLICIES) if "all" in names else list(dict.fromkeys(names))
    switch = ()
    if args.switch_every:
        switch = switch_every(args.switch_every, args.rounds)
    elif args.switch_at:
        switch = tuple(sorted({t for group in args.switch_at for t in group}))
    gamma = args.gamma[0] if len(args.gamma) == 1 else args.gamma
    env = Environment(args.means, reward=args.reward, gamma=gamma, switch_at=switch,
                      costs=args.costs, objective=args.objective, free=args.free)
    config = config_from(args)
    results = run_policies(names, env, config, args.rounds, args.seeds, args.seed)
    command = "flashspec " + shlex.join(args.argv)
    doc = report(results, env, config, args.rounds, args.seeds, args.seed, command)
    print(json.dumps(doc, indent=2) if args.json else format_table(doc))
    return 0


def format_table(doc: dict) -> str:
    env, b = doc["environment"], doc["bounds"]
    lines = [
        f"K={len(env['means'])} means={','.join(map(str, env['means']))} reward={env['reward']} "
        f"objective={env['objective']} rounds={doc['rounds']} seeds={doc['seeds']}"
        + (f" switches={env['switch_at']}" if env["switch_at"] else ""),
        f"{'policy':<22}{'mean regret':>12}{'sd':>9}{'p90':>9}{'on best arm':>13}",
    ]
    for name, s in doc["policies"].items():
        lines.append(f"{name:<22}{s['mean_regret']:>12.1f}{s['std_regret']:>9.1f}"
                     f"{s['p90_regret']:>9.1f}{s['best_arm_fraction']:>13.3f}")
    lines.append(f"sqrt(K T ln T) = {b['sqrt_k_t_ln_t']:.1f}")
    if b["ucb1_auer2002_thm1"] is not None:
        lines.append(f"UCB1 bound (Auer et al. 2002, Theorem 1) = {b['ucb1_auer2002_thm1']:.1f}")
    return "\n".join(lines)


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that write JSON and PNG plots")
    kinds = p.add_subparsers(dest="kind", metavar="{bandit,generate,kernels,serve}", parser_class=Parser)
    kinds.required = True
    add_bench_bandit(kinds)
    for kind, (_, _, text) in BENCH_SCRIPTS.items():  # parsed by the script itself (main passes the rest on)
        kinds.add_parser(kind, help=text + "; options: flashspec bench " + kind + " --help")


# The engine and kernel benchmarks are scripts of the source tree (benchmarks/), not of the
# installed package: they need a checkout, which an editable install (scripts/setup.sh) is.
BENCH_SCRIPTS = {
    "generate": ("generate_cpu.py", "engine_gpu.py", "tokens/s of the engines (CPU: next to transformers; GPU: ms per step)"),
    "kernels": ("verify_kernels.py", "verify_kernels.py", "verify kernel timings against the memory floor (GPU)"),
    "serve": ("serve_bench.py", "serve_bench.py", "load on a server: TTFT, inter-token latency, req/s, tok/s"),
}


def benchmarks_dir() -> Path:
    here = Path(__file__).resolve().parents[2] / "benchmarks"
    if not here.is_dir():
        raise UsageError(f"benchmarks/ is not next to the installed package ({here}): run from a source checkout "
                         "installed with `pip install -e .` (scripts/setup.sh does)")
    return here


def run_bench_script(kind: str, rest: list[str]) -> int:
    """``flashspec bench generate|kernels ARGS``: the script of benchmarks/ with ARGS (the GPU
    variant where torch sees a GPU)."""
    import subprocess

    script, gpu_script, _ = BENCH_SCRIPTS[kind]
    where = benchmarks_dir()
    if gpu_script != script and torch_sees_a_gpu():
        script = gpu_script
    return subprocess.call([sys.executable, str(where / script), *rest])


def torch_sees_a_gpu() -> bool:
    """Whether torch is installed and sees a CUDA GPU, asked in a child process: this process
    imports no framework."""
    import subprocess

    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.call([sys.executable, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


def add_bench_bandit(kinds) -> None:
    b = kinds.add_parser("bandit", help="regret of every policy on the standard scenarios")
    b.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                   help="folder for bandit_*.json and bandit_*.png (default %(default)s)")
    b.add_argument("--rounds", type=positive_int, default=10_000)
    b.add_argument("--seeds", type=positive_int, default=200)
    b.add_argument("--seed", type=seed_int, default=0)
    b.add_argument("--no-plot", action="store_true", help="write the JSON only")
    b.set_defaults(run=run_bench_bandit)


def run_bench_bandit(args) -> int:
    from .bandit_bench import run_bench

    plot = not args.no_plot
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("the PNG plots need matplotlib: pip install 'flashspec[dev]' "
                             "(or pass --no-plot)")
    command = "flashspec " + shlex.join(args.argv)
    for path in run_bench(args.out, args.rounds, args.seeds, args.seed, command, plot):
        print(path)
    return 0


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in (0, 1]")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def add_generate(sub) -> None:
    from .adaptive import engine_policies

    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Generate with the embedded SmolLM2-135M-Instruct (or --target) and adaptive drafts.")
    p.add_argument("prompt", help="the prompt; - reads it from standard input")
    p.add_argument("--backend", choices=("torch", "jax"), default="torch", help="the engine")
    p.add_argument("--target", help="a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct); "
                                    "nf4 or nf4:PATH for its 4-bit NF4 copy")
    p.add_argument("--draft", action="append", metavar="DRAFT",
                   help="ngram[:N] | nf4 | layerskip[:L1-L2] | self | head[:DIR][@N] | head-tree[/N[xK]][:DIR][@V] (a tree of N nodes, "
                        "depth --gamma) | PATH; repeat for several (default: head and ngram with torch on the embedded model, else ngram)")
    p.add_argument("--policy", choices=engine_policies(), default="adaptive",
                   help="how a draft is chosen per step (adaptive: plain decoding, each draft at G and G // 2, "
                        "by measured tokens/s)")
    p.add_argument("--gamma", type=positive_int, default=4, help="tokens drafted per step (a tree draft, head-tree: the tree's depth)")
    p.add_argument("--temperature", type=non_negative_float, default=0.7, help="sampling temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 is off")
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling's mass; 1.0 is off")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate at most")
    p.add_argument("--seed", type=seed_int, default=0, help="the request's seed")
    p.add_argument("--no-speculation", action="store_true", help="plain autoregressive decoding (the baseline)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="a row's logits independent of the batch and of the tokens per pass, so a request's "
                        "tokens are the same alone, in any batch and with speculation, in bf16 too (torch, jax)")
    p.add_argument("--row-invariant", action="store_true",
                   help="jax: plain decoding computes gamma + 1 positions per step, the shape of a speculative "
                        "step's scoring pass, so greedy speculation gives greedy decoding's tokens in bf16 at batch 1 "
                        "(torch: --batch-invariant)")
    p.add_argument("--tensor-parallel", type=positive_int, default=1, metavar="N",
                   help="split the target over N devices (jax: a mesh of N devices; torch: run under "
                        "torchrun --nproc-per-node N, rank 0 prints); docs/tensor_parallel.md")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_generate)


def check_generate_args(args) -> None:
    """The request's settings, checked before the model is loaded (seconds) rather than after."""
    from .config import SamplingConfig
    from .loop import SpecConfig

    try:
        SamplingConfig(args.temperature, args.top_k, args.top_p)
        SpecConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    except ValueError as e:
        raise UsageError(str(e).replace("self.", "--").replace("_", "-")) from None
    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    if not args.prompt.strip():
        raise UsageError("the prompt must be a non-empty string" + (" (standard input was empty)" if args.prompt == "" else ""))


def run_generate(args) -> int:
    from .drafts import default_drafts
    from .engine import engine_class

    check_generate_args(args)
    options = {}  # the backend's own options: keyword arguments of its engine class
    if args.batch_invariant:
        if args.row_invariant:
            raise UsageError("--batch-invariant already gives plain decoding speculation's tokens; drop --row-invariant")
        options["batch_invariant"] = True
    if args.row_invariant:
        if args.backend != "jax":
            raise UsageError(f"--row-invariant is an option of the jax backend, not of --backend {args.backend}; "
                             f"the torch backend's is --batch-invariant")
        options["row_invariant"] = True
    if args.tensor_parallel != 1:
        options["tensor_parallel"] = args.tensor_parallel
    eng = engine_class(args.backend)(args.target, tuple(args.draft or default_drafts(args.backend, args.target)), policy=args.policy,
                                     device=args.device, **options)
    show = sys.stderr.isatty() and eng.rank == 0
    counted = {"tokens": 0, "steps": 0, "accepted": 0, "drafted": 0}

    def progress(record) -> None:
        counted["tokens"] += record.emitted
        counted["steps"] += 1
        counted["accepted"] += record.accepted
        counted["drafted"] += record.drafted
        if show:
            acc = counted["accepted"] / counted["drafted"] if counted["drafted"] else 0.0
            print(f"\r[{counted['tokens']:>5} tokens | {counted['steps']:>4} steps | acceptance {acc:.2f}]",
                  end="", file=sys.stderr, flush=True)

    from .faults import NonFiniteLogitsError

    try:
        result = eng.generate(
            args.prompt, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            max_new_tokens=args.max_new_tokens, seed=args.seed, speculation=not args.no_speculation,
            chat=not args.no_chat, on_step=progress,
        )
    except NonFiniteLogitsError as e:  # print what was produced before the fault, then the one line
        if e.result is not None:
            print(json.dumps(e.result) if args.json else e.result["text"])
        print(f"flashspec generate: error: {one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if show:
            print(file=sys.stderr)
    if eng.rank != 0:  # a split target's other ranks computed the same result: rank 0 prints it
        return 0
    if result.get("interrupted"):
        print(json.dumps(result) if args.json else result["text"])
        print(f"flashspec generate: interrupted after {result['new_tokens']} tokens", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, allow_nan=False))  # valid JSON: no statistic is NaN (null where undefined)
        return 0
    print(result["text"])
    lat = result["step_latency_ms"]
    acc = "none drafted" if result["acceptance"] is None else f"{result['acceptance']:.2f}"
    rate = "-" if result["tokens_per_s"] is None else f"{result['tokens_per_s']:.1f}"
    print(f"\n-- {result['new_tokens']} tokens in {result['wall_s']:.2f} s ({rate} tok/s), "
          f"{result['steps']} steps, acceptance {acc}, step p50 {lat['p50']:.1f} ms / p90 {lat['p90']:.1f} ms, "
          f"pulls {result['arm_pulls']}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="flashspec", description="Exact, adaptive speculative decoding.")
    parser.add_argument("--version", action="version", version=f"flashspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    add_generate(sub)
    add_bandit_sim(sub)
    add_bench(sub)
    add_train_head(sub)
    from .server.command import add_serve

    add_serve(sub, positive_int)
    return parser


def add_train_head(sub) -> None:
    p = sub.add_parser("train-head", help="train an EAGLE-style draft head for a target by self-distillation",
                       description="The target continues an offline prompt corpus (stdlib code, pydoc topics, chat "
                                   "instructions); a one-layer head learns its next-token law. docs/draft_head.md.")
    p.add_argument("--target", help="a model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="directory for head.safetensors, history.json, report.json, loss.png")
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--seconds", type=float, default=None, help="stop training after this many seconds")
    p.add_argument("--batch", type=positive_int, default=16, help="sequences per step")
    p.add_argument("--vocab", type=int, default=8192, help="the head's vocabulary: most frequent tokens (0: all)")
    p.add_argument("--feature-layers", type=ints, default=None, help="target layers the head reads (default: low,mid,top)")
    p.add_argument("--train-prompts", type=positive_int, default=600, help="training prompts per domain")
    p.add_argument("--eval-prompts", type=positive_int, default=40, help="held-out prompts per domain")
    p.add_argument("--new-tokens", type=positive_int, default=128, help="tokens the target generates per prompt")
    p.add_argument("--samples", type=positive_int, default=1, help="continuations sampled per training prompt")
    p.add_argument("--greedy", action="store_true", help="also one greedy continuation per training prompt")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=positive_int, default=50, help="learning-rate warm-up steps")
    p.add_argument("--passes", type=positive_int, default=3, help="training-time-test depth")
    p.add_argument("--decay", type=float, default=0.8, help="pass k's loss weight is decay**k, in (0, 1]")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--init", help="continue this head (a directory or file, or 'shipped': the embedded model's) "
                                  "instead of a new one; it keeps its feature layers and vocabulary")
    p.add_argument("--gen-seconds", type=float, default=None, help="stop generating training data after this long")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.set_defaults(run=run_train_head)


def run_train_head(args) -> int:
    try:
        from flashspec_torch.head_job import run_train_head as job
        from flashspec_torch.head_train import TrainConfig
    except ImportError as e:
        raise ImportError(f"train-head needs the torch backend: pip install 'flashspec[torch]' ({e})") from None
    cfg = TrainConfig(feature_layers=args.feature_layers, vocab=args.vocab, new_tokens=args.new_tokens, batch=args.batch,
                      steps=args.steps, seconds=args.seconds, lr=args.lr, warmup=args.warmup, passes=args.passes,
                      decay=args.decay, seed=args.seed, samples=args.samples, greedy=args.greedy, init=args.init,
                      gen_seconds=args.gen_seconds)
    job(args.out, cfg, target=args.target, train_per_domain=args.train_prompts, eval_per_domain=args.eval_prompts,
        device=args.device, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] in BENCH_SCRIPTS:
        try:
            return run_bench_script(argv[1], argv[2:])
        except UsageError as e:
            print(f"flashspec bench: error: {one_line(e)}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.run(args)
    except (ValueError, UsageError, OSError, ImportError) as e:
        print(f"flashspec {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flashspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug or a fault: still one line, unless asked for more
        if os.environ.get("FLASHSPEC_TRACEBACK"):
            raise
        print(f"flashspec {args.command}: internal error: {type(e).__name__}: {one_line(e)} "
              "(FLASHSPEC_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1


def one_line(e: BaseException | str) -> str:
    """An error's text on one line: every run of whitespace (line breaks, carriage returns, ...) as one space."""
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
