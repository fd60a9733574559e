"""Each supported family as a FlashSpec target against transformers (tiny random models saved by
transformers, flashspec.family_cases): fp32 logits within 1e-4, greedy 64 tokens identical, with
and without speculation (n-gram and layer-skipping drafts); the first sampled token of speculation
follows the target on a non-Llama family (Qwen3)."""

import numpy as np
import pytest

pytest.importorskip("transformers")

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.family_cases import CASES, parity, save_case  # noqa: E402
from flashspec.testing import chi_square_test  # noqa: E402
from torch_helpers import next_token_law  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {m: (root / m, save_case(m, root / m)) for m in CASES}


@pytest.mark.parametrize("model_type", list(CASES))
def test_family_matches_transformers(saved, model_type):
    path, hf = saved[model_type]
    row = parity(model_type, "torch", path, hf)
    assert row["logits_max_error"] < 1e-4, row
    assert row["greedy_identical"] and row["speculation_identical"], row


def test_speculative_sampling_follows_a_qwen3_target(saved):
    """Engine-level exactness on a non-Llama family: with a layer-skipping draft (q != p) in the loop,
    the first emitted token ~ the target's next-token distribution."""
    from flashspec_torch.engine import Engine

    path, _ = saved["qwen3"]
    eng = Engine(str(path), ("layerskip:1",), policy="fixed", device="cpu")
    prompt, n, sampling = "The quick", 600, SamplingConfig(temperature=1.0, top_k=8)
    ids = eng.encode(prompt, chat=False)
    p = next_token_law(eng.target.model, ids, sampling)
    out = eng.generate([prompt] * n, seed=list(range(n)), temperature=1.0, top_k=8, max_new_tokens=2, gamma=2, chat=False)
    first = np.array([t[0] for t in out["tokens"]])
    _, p_value, note = chi_square_test(np.bincount(first, minlength=p.size), p)
    assert p_value > 1e-3, note
    assert out["acceptance"] > 0  # the draft really took part


def test_cli_no_speculation_json_is_valid_and_a_batch_has_per_request_stats(saved, capsys):
    import json

    from flashspec.cli import main
    from flashspec_torch.engine import Engine

    path, _ = saved["qwen2"]
    assert main(["generate", "ab", "--target", str(path), "--no-speculation", "--json", "--no-chat",
                 "--max-new-tokens", "4", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert result["acceptance"] is None and result["new_tokens"] == 4
    eng = Engine(str(path), ("ngram",), device="cpu")
    out = eng.generate(["abab abab", "xy"], temperature=0.0, max_new_tokens=6, chat=False)
    assert [r["new_tokens"] for r in out["per_request"]] == [len(t) for t in out["tokens"]]
    assert sum(r["accepted"] for r in out["per_request"]) == round(out["acceptance"] * sum(r["drafted"] for r in out["per_request"]))
