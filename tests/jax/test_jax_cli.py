"""`flashspec generate --backend jax` on the embedded model: SPEC.md's JSON fields."""

import json

import pytest

pytest.importorskip("jax")

from flashspec.cli import main  # noqa: E402

FIELDS = {"text", "tokens", "new_tokens", "tokens_per_s", "steps", "acceptance", "arm_pulls",
          "arm_acceptance", "step_latency_ms"}


def test_generate_with_the_jax_backend_prints_the_spec_fields(capsys):
    assert main(["generate", "def add(a, b):", "--backend", "jax", "--no-chat", "--max-new-tokens", "6",
                 "--temperature", "0", "--draft", "ngram", "--draft", "layerskip:24-29", "--policy", "thompson-token", "--json",
                 "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert FIELDS <= set(out) and out["backend"] == "jax"
    assert 1 <= out["new_tokens"] == len(out["tokens"]) <= 6
    assert set(out["arm_pulls"]) == {"ngram", "layerskip:24-29"}
    assert sum(out["arm_pulls"].values()) == out["steps"]


def test_a_bad_jax_device_is_one_line(capsys):
    assert main(["generate", "hi", "--backend", "jax", "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "device" in err and len(err.splitlines()) == 1


def test_row_invariant_plain_decoding_with_the_jax_backend(capsys):
    """`--row-invariant` with --backend jax: plain decoding over gamma + 1 positions per step, the
    tokens of greedy speculation (fp32 here; docs/jax.md)."""
    common = ["generate", "def add(a, b):", "--backend", "jax", "--no-chat", "--max-new-tokens", "6",
              "--temperature", "0", "--json", "--device", "cpu"]
    assert main([*common, "--row-invariant", "--no-speculation"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*common, "--draft", "ngram"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert plain["tokens"] == spec["tokens"] and len(plain["tokens"]) == 6
