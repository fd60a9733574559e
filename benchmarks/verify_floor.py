"""How close can a verify step get to the memory floor? The Triton verify next to the plainest kernel
that reads the target logits once (torch's row max, and torch's sum over all of them: one kernel each)
and next to an empty kernel, all timed the same way (CUDA-graph replays
of one call per input set, cycling sets larger than L2, replayed back to back; ``verify_kernels.time_graph``).

    python benchmarks/verify_floor.py [--batch 32,128,256] [--vocab 32000,128256]   # writes $OUT/verify_floor.json

``--single-replay`` also times every graph one replay between the events (the method before 2026-12-05,
``*_single_replay_us``), which adds the host's launch of the replay divided by the graph's calls.
``--table FILE`` prints a committed run as the README's table (no GPU): verify / floor and the faster
bare read / floor per shape, bold within ``GOAL`` (1.5x), and the count within it for each timing method.

"read" is what any kernel that must see every logit once costs on this GPU at this size, launch and
tail included; "verify / read" is what the verify algorithm adds on top of reading its input.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib
import sys

import torch

GOAL = 1.5  # issue #3: at B >= 32 the Triton kernel within 1.5x of the memory floor


def read_rows(inp: dict) -> torch.Tensor:  # [B, G+1]: every target logit read once, a row max (one kernel)
    return torch.amax(inp["target_logits"], -1)


def read_all(inp: dict) -> torch.Tensor:  # []: every target logit read once, one sum over all (split freely)
    return torch.sum(inp["target_logits"], dtype=torch.float32)


def empty(inp: dict) -> torch.Tensor:
    return inp["draft_tokens"][:1, :1] + 1  # one tiny kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="32,128,256")
    ap.add_argument("--vocab", default="32000,128256")
    ap.add_argument("--gamma", default="4")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rows", default="flat",
                    help="target rows: flat (2 N(0, 1)), llm (drawn from SmolLM2's recorded rows, llm_rows.py), or both: flat,llm")
    ap.add_argument("--single-replay", action="store_true",
                    help="also time one replay between the events (*_single_replay_us: launch latency included)")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "benchmarks/results")))
    ap.add_argument("--table", type=pathlib.Path, help="print this verify_floor.json as a Markdown table and stop")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if not torch.cuda.is_available():
        raise SystemExit("verify_floor.py needs a CUDA GPU")
    from verify_kernels import bytes_required, capture, copy_bandwidth_gbps, input_sets, time_graph
    from flashspec_torch.verify import verify

    dev = torch.device("cuda")
    gbps = copy_bandwidth_gbps(dev)
    rows = []
    for kind, v, dt, g, b in itertools.product(args.rows.split(","), map(int, args.vocab.split(",")), args.dtypes.split(","),
                                               map(int, args.gamma.split(",")), map(int, args.batch.split(","))):
        shape = dict(B=b, G=g, V=v, dtype=dt, draft="logprobs", temperature=0.7, rows=kind)
        sets = input_sets(shape, dev)
        floor_us = bytes_required(shape) / (gbps * 1e9) * 1e6
        steps = {
            "verify": lambda inp: verify(**inp, temperature=0.7, seed=1, offset=2, impl="triton", validate=False),
            "read": read_rows,
            "read_all": read_all,
            "empty": empty,
        }
        row = dict(shape, floor_us=floor_us, sets=len(sets))
        for name, step in steps.items():
            graph, _ = capture(step, sets)
            row[f"{name}_us"] = time_graph(graph, len(sets)) * 1e3
            if args.single_replay:
                row[f"{name}_single_replay_us"] = time_graph(graph, len(sets), min_calls=1) * 1e3
            del graph
        row["verify_x_floor"] = row["verify_us"] / floor_us
        z = sets[0]["target_logits"]
        row["read_floor_us"] = z.numel() * z.element_size() / (gbps * 1e9) * 1e6  # the target logits alone
        row["read_x_floor"] = row["read_us"] / row["read_floor_us"]
        row["read_all_x_floor"] = row["read_all_us"] / row["read_floor_us"]
        row["verify_x_read"] = row["verify_us"] / row["read_us"]
        out = verify(**sets[0], temperature=0.7, seed=1, offset=2, impl="triton", validate=False)
        row["mean_accepted"] = out.num_accepted.float().mean().item()  # how far the steps get on these rows
        print(f"{kind:<4} B={b:<4} G={g} V={v:<7} {dt:<9} floor {floor_us:7.1f} us | verify {row['verify_us']:7.1f} "
              f"({row['verify_x_floor']:.2f}x) | row max {row['read_us']:7.1f} ({row['read_x_floor']:.2f}x) | "
              f"sum {row['read_all_us']:7.1f} ({row['read_all_x_floor']:.2f}x) | "
              f"empty {row['empty_us']:5.1f} | verify/read {row['verify_x_read']:.2f} | accepted {row['mean_accepted']:.2f}"
              + (f" | one replay: verify {row['verify_single_replay_us']:7.1f} "
                 f"({row['verify_single_replay_us'] / floor_us:.2f}x) empty {row['empty_single_replay_us']:5.1f}"
                 if args.single_replay else ""), flush=True)
        rows.append(row)
        write(args.out, gbps, rows)  # after every shape: a run stopped by its time limit keeps what it timed
        del sets
        torch.cuda.empty_cache()


def meets(r: dict, key: str = "verify_us") -> bool:
    """Row r's time ``key`` is within GOAL x its floor."""
    return key in r and r[key] <= GOAL * r["floor_us"]


def best_read_us(r: dict) -> float:  # the faster bare read of the target logits: row max or sum
    return min(r["read_us"], r["read_all_us"])


def within(rows: list[dict], key: str = "verify_us") -> list[dict]:
    """The rows (B >= 32) whose step ``key`` is within GOAL x the floor."""
    return [r for r in rows if r["B"] >= 32 and meets(r, key)]


def table(doc: dict) -> str:
    """A verify_floor.json as Markdown, one table per kind of target rows: one line per (B, V, dtype), per G
    "verify / read" as multiples of the floor (read: the faster of the row max and the sum; bold: verify
    within GOAL), then the counts."""
    kinds = sorted({r.get("rows", "flat") for r in doc["rows"]}, key=lambda k: k != "flat")
    parts = []
    for kind in kinds:
        rows = [r for r in doc["rows"] if r.get("rows", "flat") == kind]
        parts.append((f"{kind} rows\n\n" if len(kinds) > 1 else "") + kind_table(rows, "timing" in doc))
    return "\n\n".join(parts)


def kind_table(rows: list[dict], back_to_back: bool) -> str:
    gammas = sorted({r["G"] for r in rows})
    by = {(r["B"], r["V"], r["dtype"], r["G"]): r for r in rows}
    lines = ["| B | V | dtype | " + " | ".join(f"G={g} verify / read" for g in gammas) + " |",
             "|---|---|---|" + "---|" * len(gammas)]
    for v, dt, b in sorted({(r["V"], r["dtype"], r["B"]) for r in rows}, key=lambda k: (-k[0], k[1], -k[2])):
        cells = []
        for g in gammas:
            r = by.get((b, v, dt, g))
            if r is None:
                cells.append("-")
                continue
            x = f"{r['verify_us'] / r['floor_us']:.2f}"
            cells.append((f"**{x}**" if meets(r) else x) + f" / {best_read_us(r) / r['floor_us']:.2f}")
        lines.append(f"| {b} | {v} | {'bf16' if dt == 'bfloat16' else 'fp32'} | " + " | ".join(cells) + " |")
    n = sum(r["B"] >= 32 for r in rows)
    bare = [r for r in rows if r["B"] >= 32 and best_read_us(r) > GOAL * r["floor_us"]]
    method = " (graph replays back to back)" if back_to_back else ""
    lines += ["", f"within {GOAL}x the floor: {len(within(rows))} of {n} shapes{method}"]
    if any("verify_single_replay_us" in r for r in rows):
        lines.append(f"within {GOAL}x, one replay between the events: "
                     f"{len(within(rows, 'verify_single_replay_us'))} of {n}")
    lines.append(f"a bare read past {GOAL}x: {len(bare)} of {n}")
    return "\n".join(lines)


def write(out: pathlib.Path, gbps: float, rows: list[dict]) -> None:
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "copy_bandwidth_gbps": gbps, "command": " ".join(["python", "benchmarks/verify_floor.py", *sys.argv[1:]]),
           "timing": "graph replays back to back, >= 32 steps between the CUDA events (verify_kernels.time_graph)",
           "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_floor.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
