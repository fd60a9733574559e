"""Per-step records -> the statistics SPEC.md's `generate --json` reports."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .loop import StepRecord


def summarize(records: Sequence[StepRecord], draft_names: Sequence[str], wall_seconds: float, new_tokens: int,
              plain: bool = False) -> dict:
    """tokens_per_s, steps, acceptance (mean fraction of drafted tokens accepted), arm_pulls (per draft name, and
    "plain": the plain decoding steps, where ``plain``: a policy that chooses plain decoding as an arm),
    arm_acceptance (per draft name), step_latency_ms (p50, p90)."""
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.accepted for r in records)
    pulls = {"plain": 0} if plain else {}
    pulls.update({name: 0 for name in draft_names})
    arm_drafted = {name: 0 for name in draft_names}
    arm_accepted = {name: 0 for name in draft_names}
    for r in records:
        if r.arm < 0:  # a plain autoregressive step
            if plain:
                pulls["plain"] += 1
            continue
        name = draft_names[r.arm]
        pulls[name] += 1
        arm_drafted[name] += r.drafted
        arm_accepted[name] += r.accepted
    latency = np.array([r.seconds for r in records]) * 1e3
    return {
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / wall_seconds if wall_seconds > 0 else None,
        "steps": len(records),
        "acceptance": accepted / drafted if drafted else None,  # None (JSON null): nothing was drafted
        "arm_pulls": pulls,
        "arm_acceptance": {n: (arm_accepted[n] / arm_drafted[n] if arm_drafted[n] else None) for n in draft_names},
        "step_latency_ms": {
            "p50": float(np.percentile(latency, 50)) if len(latency) else None,
            "p90": float(np.percentile(latency, 90)) if len(latency) else None,
        },
    }


def per_request(records: Sequence[StepRecord], new_tokens: Sequence[int]) -> list[dict]:
    """Each batch row's own statistics: new_tokens, steps it took part in, drafted (the tokens the row itself
    proposed: ``StepRecord.row_drafted``), accepted and acceptance (None where nothing was drafted, or where
    the records do not say per row)."""
    known = all(r.row_accepted is not None for r in records)
    drafts_known = all(r.row_drafted is not None for r in records)
    rows = []
    for i, n in enumerate(new_tokens):
        mine = [r.row_accepted[i] for r in records if r.row_accepted is not None and r.row_accepted[i] >= 0]
        drafted = sum(r.row_drafted[i] for r in records if r.row_drafted is not None and r.row_drafted[i] > 0)
        accepted = sum(mine) if known else None
        drafted = drafted if drafts_known else None
        rows.append({"new_tokens": n, "steps": len(mine) if known else None, "drafted": drafted,
                     "accepted": accepted, "acceptance": accepted / drafted if known and drafted else None})
    return rows
