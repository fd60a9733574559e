"""The summary of ``benchmarks/serve_gpu.py``'s JSON: output tokens/s per run and concurrency, the
ratios the serving issues ask for (speculation / plain, flashspec / transformers serve, JAX / torch,
the adaptive scheduler / plain and / the best fixed configuration) and their checks."""

from __future__ import annotations


def summary(doc: dict) -> dict:
    """Output tokens/s per run and concurrency, speculation / plain, flashspec / transformers serve."""
    table = {name: {lv["concurrency"]: round(lv["output_tokens_per_s"], 1) for lv in run.get("levels", [])
                    if "output_tokens_per_s" in lv}
             for name, run in doc["runs"].items()}
    out = {"output_tokens_per_s": table}
    hf = table.get("transformers serve embedded", {})
    checks = {}
    for mode, base in (doc.get("generate_batch1") or {}).items():
        one = [lv for lv in doc["runs"].get(f"flashspec embedded {mode}", {}).get("levels", [])
               if lv.get("concurrency") == 1 and (lv.get("tpot_ms") or {}).get("mean")]
        if isinstance(base, dict) and base.get("tpot_ms") and one:  # the issue asks for at most 1.15
            ratio = one[0]["tpot_ms"]["mean"] / base["tpot_ms"]
            out[f"embedded {mode}: served ms per token at concurrency 1 / generate batch 1"] = round(ratio, 3)
            checks[f"embedded {mode}: concurrency-1 latency within 1.15x of generate"] = ratio <= 1.15
    for row in (doc.get("step_breakdown") or {}).get("rows", []) if isinstance(doc.get("step_breakdown"), dict) else []:
        if isinstance(row, dict) and "plain_share_outside_forward" in row:
            out[f"step outside the forward at batch {row['batch']} (plain, n-gram)"] = (
                round(row["plain_share_outside_forward"], 3), round(row["ngram_share_outside_forward"], 3))
            checks[f"step outside the forward <= 10% at batch {row['batch']}"] = max(
                row["plain_share_outside_forward"], row["ngram_share_outside_forward"]) <= 0.10
        if isinstance(row, dict) and "plain_sampled_step_ms" in row:  # T > 0: the fused sampler, the torch one
            out[f"sampled plain step ms at batch {row['batch']} (fused sampler, torch sampler)"] = (
                round(row["plain_sampled_step_ms"], 3), round(row["plain_sampled_step_torch_sampler_ms"], 3))
            for name, c in row["check_fused_equals_torch_sampler"].items():
                checks[f"fused sampler draws the torch sampler's tokens at batch {row['batch']}, {name}"] = c["pass"]
    for name, ok in (doc.get("chunked_prefill") or {}).get("checks", {}).items():
        checks[f"chunked prefill: {name}"] = ok
    for name, run in doc["runs"].items():
        if "checks" in run:
            checks[f"{name}: every request answered"] = run["checks"]["every_request_ok"]
    if hf.get(16) and table.get("flashspec embedded plain", {}).get(16):
        checks["embedded plain >= 10x transformers serve at concurrency 16"] = (
            table["flashspec embedded plain"][16] >= 10 * hf[16])
    adaptive_summary(table, out, checks)
    out["checks"] = checks
    for name, row in table.items():
        if name.endswith(" ngram"):
            plain = table.get(name[: -len(" ngram")] + " plain", {})
            out[f"{name} / plain"] = {c: round(v / plain[c], 3) for c, v in row.items() if plain.get(c)}
        if name.startswith("flashspec jax "):
            base = table.get("flashspec " + name[len("flashspec jax "):], {})
            out[f"{name} / torch"] = {c: round(v / base[c], 3) for c, v in row.items() if base.get(c)}
        if name.startswith("flashspec embedded") and hf:
            out[f"{name} / transformers serve"] = {c: round(v / hf[c], 2) for c, v in row.items() if hf.get(c)}
    return out


def adaptive_summary(table: dict, out: dict, checks: dict) -> None:
    """Per shape of --parts adaptive: adaptive / plain and adaptive / the best fixed configuration (plain or
    n-gram G = 4) per concurrency, with the issue's checks (>= 1.0x plain, >= 0.98x the best fixed)."""
    prefix = "adaptive part flashspec "
    for name, row in table.items():
        if not (name.startswith(prefix) and name.endswith(" adaptive")):
            continue
        shape = name[len(prefix): -len(" adaptive")]
        plain, ngram = table.get(f"{prefix}{shape} plain", {}), table.get(f"{prefix}{shape} ngram", {})
        levels = {}
        for c, v in row.items():
            if not plain.get(c):
                continue
            best = max(plain[c], ngram.get(c, 0.0))
            levels[c] = {"adaptive": v, "plain": plain[c], "ngram_g4": ngram.get(c), "adaptive/plain": round(v / plain[c], 3),
                         "adaptive/best_fixed": round(v / best, 3)}
            checks[f"{shape} adaptive >= 1.0x plain at concurrency {c}"] = v >= plain[c]
            checks[f"{shape} adaptive >= 0.98x best fixed at concurrency {c}"] = v >= 0.98 * best
        out[f"adaptive {shape}"] = levels
