"""`flashspec generate` on the embedded model: JSON fields, and bad input as one line, exit 2."""

import json

import pytest

from flashspec.cli import main

FIELDS = {"text", "tokens", "new_tokens", "tokens_per_s", "steps", "acceptance", "arm_pulls",
          "arm_acceptance", "step_latency_ms"}


def test_generate_json_has_the_spec_fields(capsys):
    assert main(["generate", "def add(a, b):", "--no-chat", "--max-new-tokens", "6", "--temperature", "0",
                 "--draft", "ngram", "--draft", "layerskip:24-29", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert FIELDS <= set(out)
    assert 1 <= out["new_tokens"] == len(out["tokens"]) <= 6
    assert set(out["arm_pulls"]) == {"plain", "ngram", "layerskip:24-29"}  # the adaptive policy's arms
    assert sum(out["arm_pulls"].values()) == out["steps"]
    assert set(out["step_latency_ms"]) == {"p50", "p90"}


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.parametrize("argv,needle", [
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "1.5"], "top-p"),
    (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "hi", "--policy", "nope"], "policy"),
    (["generate", "   ", "--device", "cpu"], "prompt"),
    (["generate", "hi", "--draft", "layerskip:99", "--device", "cpu"], "layerskip"),
    (["generate", "hi", "--target", "/no/such/model", "--device", "cpu"], "/no/such/model"),
    (["generate", "hi", "--backend", "jax", "--target", "/no/such/model", "--device", "cpu"], "/no/such/model"),
    (["generate", "hi", "--backend", "jax", "--batch-invariant", "--row-invariant", "--device", "cpu"], "--row-invariant"),
    (["generate", "hi", "--row-invariant", "--device", "cpu"], "--row-invariant"),
])
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    assert run(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = [x for x in lines if not x.startswith("flashspec: waiting for another process")]  # the shared cache's note
    assert len(err) == 1 and needle in err[0] and "Traceback" not in "".join(lines)
