"""The verify kernels under Nsight Compute: what bounds each launch (run on the H200 under ``ncu``).

    ncu --clock-control none --kernel-name regex:verify_ --launch-skip 8 --launch-count 4 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis \\
        python benchmarks/verify_ncu.py --batch 256 --gamma 1 --vocab 128256 --dtype bfloat16

(`bash scripts/gpu_session.sh ncu` runs it over a few shapes.) The script alone calls
``verify_triton`` with the default configuration (``choose_config``, or ``--variant``, draft log-probs given, the
benchmark's flat rows of ``verify_kernels.make_inputs``) ``--calls`` times on rotating input sets, so
that ``--launch-skip`` passes over the first calls (compilation, warm-up) and the profiled launches
read logits that are not in the L2. Without ncu it checks the tokens against the torch reference.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from verify_kernels import input_sets  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--gamma", type=int, default=1)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--calls", type=int, default=8, help="verify calls (two launches each)")
    p.add_argument("--variant", default="lanes", help="a name from verify_variants.variants (lanes: choose_config)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    import torch

    from flashspec.config import SamplingConfig
    from flashspec_torch import verify_reference, verify_triton
    from verify_variants import variants

    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("verify_ncu.py profiles GPU launches: run it on a CUDA device under ncu")
    device = torch.device("cuda")
    shape = dict(B=args.batch, G=args.gamma, V=args.vocab, dtype=args.dtype, draft="logprobs",
                 temperature=args.temperature)
    sets = input_sets(shape, device)
    cfg = SamplingConfig(temperature=args.temperature)
    itemsize = torch.finfo(getattr(torch, args.dtype)).bits // 8
    kc = variants(args.batch, args.gamma, args.vocab, itemsize, device)[args.variant]
    seed = torch.full((args.batch,), 7, dtype=torch.int64, device=device)
    offset = torch.zeros((), dtype=torch.int64, device=device)
    ref = sets[0]  # the reference draws with the variant's noise (top-down variants: flashspec.random.gumbel_top_down)
    want = verify_reference(ref["target_logits"], ref["draft_tokens"], ref["draft_logits"], ref["draft_logprobs"], cfg,
                            seed, offset, top_down=kc.top_down)
    got = None
    for _, inp in zip(range(args.calls), itertools.cycle(sets)):
        got = verify_triton(inp["target_logits"], inp["draft_tokens"], inp["draft_logits"], inp["draft_logprobs"],
                            cfg, seed, offset, config=kc)
        if got is not None and inp is sets[0]:
            assert torch.equal(got.tokens, want.tokens), "Triton's tokens differ from the torch reference's"
    torch.cuda.synchronize()
    print(f"shape {shape} config {kc}: {args.calls} calls, {len(sets)} input sets, tokens equal the reference's")


if __name__ == "__main__":
    main()
