"""benchmarks/adaptive_bench.py at a tiny random shape on the CPU: every configuration (fixed drafts, the
adaptive loop) emits plain decoding's greedy tokens, and the replay draft with keep = 1 is accepted
wherever it proposes within the token budget; the embedded model with the engine's default drafts (head, ngram)
is exact too."""

import time

import pytest
import torch
from benchmark_modules import load_benchmark

from flashspec.drafts import SHIPPED_HEAD, default_drafts

bench = load_benchmark("adaptive_bench")


def test_tiny_run_is_exact_and_the_replay_draft_is_accepted():
    with torch.inference_mode():
        model, _, _ = bench.load_model("tiny", torch.device("cpu"))
        prompts = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0)).tolist()
        row = bench.run_batch(model, prompts, 8, 1.0, {}, torch.device("cpu"))
    assert row["checks"]["tokens_equal_plain"], row["tokens_equal"]
    assert set(row["fixed"]) == {"ngram:G2", "ngram:G4", "replay:G2", "replay:G4"}
    assert sum(row["adaptive_steps"].values()) >= 1
    assert row["fixed"]["replay:G2"]["acceptance"] >= 0.75  # only the last step drafts past the budget
    for key, fixed in row["fixed"].items():  # one digit per step a row was active: the tokens it accepted
        g = int(key.rsplit("G", 1)[1])
        assert len(fixed["trace"]) == 2 and max(map(len, fixed["trace"])) == fixed["steps"], key
        assert all(sum(int(c) + 1 for c in t) >= 8 and all(int(c) <= g for c in t) for t in fixed["trace"]), key
    assert sum(int(run.rsplit("*", 1)[1]) for run in row["adaptive_arms"].split()) == sum(row["adaptive_steps"].values())
    assert len(row["adaptive_trace"]) == 2 and set(row["adaptive_step_ms"]) == set(row["adaptive_steps"])
    steps = sum(row["adaptive_steps"].values())  # every step timed; a choice each, and one for the step launched
    assert len(row["adaptive_steps_ms"]) == steps and 1 <= len(row["adaptive_choose_ms"]) <= steps + 1  # past the end
    assert all(len(f["steps_ms"]) == f["steps"] for f in row["fixed"].values())
    scored = row["best_fixed_scored"]
    assert scored["arm"] == max(row["fixed"], key=lambda k: row["fixed"][k]["tokens_per_s"]) and scored["steps"] >= 1
    assert row["policy_warm"] is False  # nothing captured on the CPU: first timings stay provisional
    assert row["rounds"] == 1 and row["rounds_tokens_per_s"]["plain"] == [row["plain_tokens_per_s"]]


def test_rounds_interleave_every_configuration_and_report_the_median():
    """``--rounds 3`` at the tiny shape: each configuration runs once a round, the order rotated by one each round;
    each figure is the median of its rounds' (the median round's details), the per-round ratios are the rounds' own."""
    names = []
    with torch.inference_mode():
        model, _, _ = bench.load_model("tiny", torch.device("cpu"))
        prompts = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0)).tolist()
        row = bench.run_batch(model, prompts, 6, 1.0, {}, torch.device("cpu"), rounds=3,
                              log=lambda r, name: names.append((r, name)))
    configs = ["plain", "ngram:G2", "ngram:G4", "replay:G2", "replay:G4", "adaptive"]
    assert row["round_orders"] == [configs, configs[1:] + configs[:1], configs[2:] + configs[:2]]
    assert names == [(r, n) for r, order in enumerate(row["round_orders"]) for n in order]
    tps = row["rounds_tokens_per_s"]
    assert set(tps) == set(configs) and all(len(v) == 3 for v in tps.values())
    median = lambda v: sorted(v)[1]  # noqa: E731
    assert row["plain_tokens_per_s"] == median(tps["plain"]) and row["adaptive_tokens_per_s"] == median(tps["adaptive"])
    assert all(f["tokens_per_s"] == median(tps[k]) for k, f in row["fixed"].items())
    best = [max(v[r] for k, v in tps.items() if k != "adaptive") for r in range(3)]
    assert row["checks"]["rounds_adaptive_vs_best"] == pytest.approx([a / b for a, b in zip(tps["adaptive"], best)])
    assert len(row["adaptive_rounds"]) == 3 and row["checks"]["tokens_equal_plain"], row["tokens_equal"]
    assert all(sum(r["steps"].values()) >= 1 for r in row["adaptive_rounds"])
    assert row["spread"]["plain"] == pytest.approx((max(tps["plain"]) - min(tps["plain"])) / median(tps["plain"]))


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_embedded_run_with_the_default_drafts_is_exact():
    """The embedded model with the engine's default drafts (the shipped head with the CPU's dynamic draft length,
    ngram) on one held-out prompt (the first chat one; the first code and prose prompts come before it), 4 tokens: every fixed (draft, G) and the adaptive loop emit plain
    decoding's greedy tokens, the head drafts and is accepted, and the adaptive steps are named by their arms."""
    from flashspec_torch.engine import default_stop_below

    cpu = torch.device("cpu")
    with torch.inference_mode():
        model, held, drafts = bench.load_model("embedded", cpu, drafts=default_drafts("torch", None), prompts=3)
        row = bench.run_batch(model, held[2:], 4, None, {}, cpu, drafts, time.process_time)
    assert [d.name for d in drafts] == ["head", "ngram"] and drafts[0].stop_below == default_stop_below(drafts[0], cpu)
    assert len(held) == 3 and held[0] != held[1] and held[0] != held[2]
    assert row["checks"]["tokens_equal_plain"], row["tokens_equal"]
    assert set(row["fixed"]) == {"head:G2", "head:G4", "ngram:G2", "ngram:G4"}
    assert row["fixed"]["head:G2"]["acceptance"] > 0  # the head really drafted on text it never saw
    assert all(0 < f["drafted_per_step"] <= int(k[-1]) for k, f in row["fixed"].items())
    assert set(row["adaptive_steps"]) <= {"plain", *row["fixed"]}  # arms' lengths, not the rows' dynamic ones
    assert sum(row["adaptive_steps"].values()) == len(row["adaptive_steps_ms"]) >= 1
