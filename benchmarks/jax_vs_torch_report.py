"""The report of ``jax_vs_torch_gpu.py``: per shape its summary figures, the pass/fail checks over
all shapes, the printed table, and the merge of the per-shape child processes' rows (no ``main``).
"""

from __future__ import annotations

import jax_parts  # benchmarks/ is on sys.path

HEAD = ("device", "platform", "versions", "xla_flags", "date", "dry_run", "copy_bandwidth_gbps", "floor_bandwidth", "notes")


def get(d: dict, *path, default=float("nan")):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def summarize(row: dict, bw: float, batches: list[int]) -> dict:
    """The table's figures of one shape (NaN where a part did not run)."""
    t, j, o = row.get("torch", {}), row.get("jax", {}), row.get("jax_other_attention", {})
    weight_bytes = get(t, "batch_1", "weight_bytes", default=None) or row["jax_weight_bytes"]
    s = dict(weights_floor_ms=weight_bytes / bw * 1e3, torch_step_ms=get(t, "batch_1", "plain", "step_ms"),
             jax_step_ms=get(j, "plain", "step_ms"), torch_wall_ms=get(t, "batch_1", "plain", "ms_per_step_wall"),
             jax_wall_ms=get(j, "plain", "ms_per_step_wall"), jax_choices=get(j, "choices", default={}),
             jax_other_attention=get(o, "choices", "attention", default=None), jax_other_step_ms=get(o, "plain", "step_ms"),
             while_over_host_step=get(j, "while_over_host_step"),
             jax_bytes_accessed=get(j, "bytes_per_step", "cost_analysis", "bytes accessed"),
             jax_other_bytes_accessed=get(o, "bytes_per_step", "cost_analysis", "bytes accessed"))
    s["jax_over_torch_step"] = s["jax_step_ms"] / s["torch_step_ms"]
    s["jax_over_torch_wall"] = s["jax_wall_ms"] / s["torch_wall_ms"]
    s["jax_over_floor"] = s["jax_step_ms"] / s["weights_floor_ms"]
    s["other_attention_over_default"] = s["jax_other_step_ms"] / s["jax_step_ms"]
    for b in batches:
        for side, part in (("torch", t.get("batches", {})), ("jax", row.get("jax_batches", {}))):
            r = get(part, f"batch_{b}", default={})
            for run in ("plain", "spec_host"):
                s[f"b{b}_{side}_{run}_tokens_per_s"] = get(r, run, "tokens_per_s")
            s[f"b{b}_{side}_spec_acceptance"] = get(r, "spec_host", "acceptance")
    return s


def checks_of(rows: list[dict]) -> tuple[dict, dict]:
    """Pass/fail per check (only where its parts ran) and information (bf16 token agreement)."""
    checks, info = {}, {}
    for r in rows:
        n, s = r["shape"], r["summary"]
        if s["jax_over_torch_step"] == s["jax_over_torch_step"]:  # not NaN
            checks[f"{n}_b1_jax_within_1.15x_torch_step"] = s["jax_over_torch_step"] <= 1.15
        if n == "llama3-8b" and s["jax_over_floor"] == s["jax_over_floor"]:
            checks[f"{n}_b1_jax_within_1.3x_weights_floor"] = s["jax_over_floor"] <= 1.3
        if s["while_over_host_step"] == s["while_over_host_step"]:
            checks[f"{n}_b1_while_within_1.05x_host_step"] = s["while_over_host_step"] <= 1.05
        for key, part in (("b1", r.get("jax", {})), *((k, v) for k, v in r.get("jax_batches", {}).items() if isinstance(v, dict))):
            if "while_equals_host" in part:
                checks[f"{n}_{key}_jax_while_tokens_equal_host"] = part["while_equals_host"]
            if "spec_equals_plain" in part:
                info[f"{n}_{key}_jax_spec_equals_plain_{r['dtype']}"] = part["spec_equals_plain"]
        torch_runs = {"batch_1": r.get("torch", {}).get("batch_1", {}), **r.get("torch", {}).get("batches", {})}
        jax_runs = {"batch_1": r.get("jax", {}), **r.get("jax_batches", {})}
        for k, v in torch_runs.items():  # the same weights (jax_weights): the engines' greedy tokens, bf16 rounding apart
            for run in ("plain", "spec_host"):
                a, b = get(v, run, "tokens_sha1", default=None), get(jax_runs.get(k, {}), run, "tokens_sha1", default=None)
                if a and b and r.get("jax_weights", "").startswith("the torch model"):
                    info[f"{n}_{k}_{run}_tokens_equal_torch_jax"] = a == b
        for k, v in torch_runs.items():
            if isinstance(v, dict) and "spec_equals_plain" in v:
                info[f"{n}_{k}_torch_spec_equals_plain"] = v["spec_equals_plain"]
        if "row_invariant_equals_spec" in r.get("row_invariant", {}):
            checks[f"{n}_row_invariant_equals_spec"] = r["row_invariant"]["row_invariant_equals_spec"]
        for ctx, a in r.get("attention_paths", {}).get("contexts", {}).items():
            for impl in jax_parts.ATTENTIONS[1:]:
                if f"{impl}_rel_max_diff" in a:
                    checks[f"{n}_attention_{impl}_close_to_xla_ctx{ctx}"] = a[f"{impl}_rel_max_diff"] < 0.05
        parts = {**{f"torch_{k}": v for k, v in torch_runs.items()}, "torch_batches": r.get("torch", {}).get("batches"),
                 **{f"jax_{k}": v for k, v in r.get("jax_batches", {}).items()},
                 **{k: r[k] for k in ("jax", "jax_other_attention", "attention_paths", "row_invariant") if k in r}}
        for part, v in parts.items():
            if isinstance(v, dict) and ("error" in v or "skipped" in v):
                info[f"{n}_{part}"] = v.get("error") or v.get("skipped")
    return checks, info


def table(rows: list[dict], batches: list[int]) -> str:
    f = lambda x, p=3: "-" if x != x else f"{x:.{p}f}"  # noqa: E731
    lines = ["shape | floor ms | torch step ms | JAX step ms (attention) | JAX/torch (step, wall) | JAX/floor | other attention "
             "step ms | JAX GB/step default, other | while/host"]
    for r in rows:
        s = r["summary"]
        lines.append(f"{r['shape']} | {f(s['weights_floor_ms'])} | {f(s['torch_step_ms'])} | {f(s['jax_step_ms'])} "
                     f"({s['jax_choices'].get('attention', '-')}) | {f(s['jax_over_torch_step'], 2)}, {f(s['jax_over_torch_wall'], 2)} | "
                     f"{f(s['jax_over_floor'], 2)} | {f(s['jax_other_step_ms'])} ({s['jax_other_attention']}) | "
                     f"{f(s['jax_bytes_accessed'] / 1e9)}, {f(s['jax_other_bytes_accessed'] / 1e9)} | {f(s['while_over_host_step'], 3)}")
    lines.append("shape | batch | torch plain / n-gram tok/s (acceptance) | JAX plain / n-gram tok/s (acceptance)")
    for r in rows:
        s = r["summary"]
        for b in batches:
            lines.append(f"{r['shape']} | {b} | {f(s[f'b{b}_torch_plain_tokens_per_s'], 0)} / {f(s[f'b{b}_torch_spec_host_tokens_per_s'], 0)} "
                         f"({f(s[f'b{b}_torch_spec_acceptance'], 2)}) | {f(s[f'b{b}_jax_plain_tokens_per_s'], 0)} / "
                         f"{f(s[f'b{b}_jax_spec_host_tokens_per_s'], 0)} "
                         f"({f(s[f'b{b}_jax_spec_acceptance'], 2)})")
    for r in rows:
        for ctx, a in r.get("attention_paths", {}).get("contexts", {}).items():
            lines.append(f"{r['shape']} attention alone, context {ctx} (ms per token over all layers): xla "
                         f"{f(a.get('xla_ms', float('nan')))}, fused ({a.get('splits', '-')} splits) {f(a.get('fused_ms', float('nan')))}, "
                         f"fused in {a.get('alt_splits', '-')} splits {f(a.get('fused_alt_ms', float('nan')))}")
    return "\n".join(lines)


def missing_of(rows: list[dict], batches: list[int], shapes: list[str]) -> list[str]:
    """Issue #37's figures that did not come out ("shape: figure"; "shape: no row" for a shape whose
    child wrote none): per shape torch's and JAX's batch-1 step, the while loop against the host loop,
    the decode step's bytes, and both engines' plain and n-gram tokens/s at each of ``batches``."""
    keys = ["torch_step_ms", "jax_step_ms", "while_over_host_step", "jax_bytes_accessed",
            *(f"b{b}_{side}_{run}_tokens_per_s" for b in batches for side in ("torch", "jax") for run in ("plain", "spec_host"))]
    summaries = {r["shape"]: r["summary"] for r in rows}
    return [f"{n}: no row" if n not in summaries else f"{n}: {k}" for n in shapes
            for k in (keys if n in summaries else [None])
            if n not in summaries or summaries[n][k] != summaries[n][k]]  # NaN: not measured


def merge(children: list[dict], batches: list[int], head: dict, wall_s: float) -> dict:
    """The children's rows (``run_children``'s results, one shape each) as one result: the head of the
    first child that wrote one, a summary for the rows of a killed child, the checks over all rows,
    and per child its share, wall time, exit status and whether it was killed (also in ``info``)."""
    first = next((c["data"] for c in children if c["data"]), {})
    head = {**{k: first[k] for k in HEAD if k in first}, **head}
    rows, info = [], {}
    for c in children:
        data = c["data"] or {}
        for row in data.get("rows", []):
            row.setdefault("summary", summarize(row, data["copy_bandwidth_gbps"] * 1e9, batches))
            rows.append(row)
        if c["killed"] or c["rc"] != 0:
            info[f"{c['shape']}_child"] = (f"killed at its share ({c['share_s']} s)" if c["killed"] else f"rc {c['rc']}") + \
                ("" if data.get("rows") else ", no row written")
    checks, row_info = checks_of(rows)
    return dict(head, wall_s=wall_s, children=[{k: v for k, v in c.items() if k != "data"} for c in children], checks=checks,
                passed=all(checks.values()), info={**row_info, **info}, summary={r["shape"]: r["summary"] for r in rows},
                issue37_missing=missing_of(rows, batches, [c["shape"] for c in children]), rows=rows)
