"""The family table (README; in full with the guard list: docs/families.md) (issue #38): each supported family as a tiny random model
saved by transformers (flashspec.family_cases) and written as a GGUF file as llama.cpp's converter
writes it (flashspec.gguf_cases), run by FlashSpec's torch and JAX engines in float32 (on the CPU, or
with --device cuda on a GPU) and compared with transformers (the original model) on the CPU; then
flashspec.families.GUARDS.

    python benchmarks/families_table.py [--out results.json] [--device cuda] [--sources hf,gguf]

Prints two Markdown tables; --out also writes the rows as JSON (with versions and the date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

from flashspec.families import GUARDS
from flashspec.family_cases import CASES, parity, save_case
from flashspec.gguf_cases import save_gguf_case


def rows(backends: tuple[str, ...], device: str = "cpu", sources: tuple[str, ...] = ("hf", "gguf")) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FLASHSPEC_CACHE"] = str(Path(tmp) / "cache")  # the GGUFs' conversions, never a stale one
        for source in sources:
            for model_type in CASES:
                path = Path(tmp) / (model_type if source == "hf" else f"{model_type}.gguf")
                hf = save_case(model_type, path) if source == "hf" else save_gguf_case(model_type, path)
                out += [{**parity(model_type, b, path, hf, device=device), "source": source} for b in backends]
    return out


def markdown(found: list[dict]) -> str:
    lines = ["| family | source | backend | logits max error vs transformers | greedy 64 identical | "
             "speculation identical (drafts) |", "|---|---|---|---|---|---|"]
    for r in found:
        lines.append(f"| {r['family']} | {'HF dir' if r['source'] == 'hf' else 'GGUF'} | {r['backend']} | {r['logits_max_error']:.1e} | "
                     f"{'yes' if r['greedy_identical'] else 'NO'} | "
                     f"{'yes' if r['speculation_identical'] else 'NO'} ({', '.join(r['drafts'])}) |")
    lines += ["", "| family | config field | value tested | outcome |", "|---|---|---|---|"]
    for model_type, field, value, outcome in GUARDS:
        lines.append(f"| {model_type} | `{field}` | `{json.dumps(value)[:60]}` | {outcome} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    p.add_argument("--backends", default="torch,jax", help="comma-separated (default torch,jax)")
    p.add_argument("--sources", default="hf,gguf", help="comma-separated: hf (directories), gguf (default both)")
    p.add_argument("--device", default="cpu", help="the engines' device: cpu, or cuda (transformers stays on the CPU)")
    args = p.parse_args()
    found = rows(tuple(args.backends.split(",")), args.device, tuple(args.sources.split(",")))
    print(markdown(found))
    if args.out:
        import torch
        import transformers

        doc = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.platform(),
               "torch": torch.__version__, "transformers": transformers.__version__, "dtype": "float32",
               "device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
               "rows": found,
               "guards": [dict(zip(("family", "field", "value", "outcome"), g)) for g in GUARDS]}
        args.out.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
