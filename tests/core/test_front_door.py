"""The front door's rough edges of issue #38, without a model: --version, --help's defaults, '-' as
the prompt, the waiting line of a blocked conversion, per-request statistics, no NaN in a result."""

import json
import subprocess
import sys

import pytest

from flashspec import __version__
from flashspec.cli import build_parser, check_generate_args, main
from flashspec.loop import StepRecord
from flashspec.stats import per_request, summarize


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"flashspec {__version__}"


def test_generate_help_shows_the_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line breaks inside a default
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["generate"].format_help().split())
    for shown in ("(default: 0.7)", "(default: 4)", "(default: 128)", "(default: torch)", "(default: adaptive)"):
        assert shown in text, shown
    assert "0 is greedy" in text and "- reads it from standard input" in text


def test_dash_reads_the_prompt_from_stdin(monkeypatch):
    import io

    args = build_parser().parse_args(["generate", "-"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("from a pipe\n"))
    check_generate_args(args)
    assert args.prompt == "from a pipe\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    args = build_parser().parse_args(["generate", "-"])
    with pytest.raises(Exception, match="standard input was empty"):
        check_generate_args(args)


def test_no_drafted_token_gives_null_not_nan():
    stats = summarize([StepRecord(-1, 0, 0, 1, 1, 0.01, (0,))], ["ngram"], 0.0, 1)
    assert stats["acceptance"] is None and stats["tokens_per_s"] is None
    json.dumps(stats, allow_nan=False)  # valid JSON


def test_per_request_statistics_beside_the_totals():
    # row 0 stopped drafting after 1 token in the first step (a dynamic length) while row 1 drafted 4
    records = [StepRecord(0, 5, 2, 4, 2, 0.1, (1, 1), (1, 4)), StepRecord(0, 4, 2, 3, 1, 0.1, (-1, 2), (-1, 4)),
               StepRecord(-1, 0, 0, 2, 2, 0.1, (0, 0), (0, 0))]
    rows = per_request(records, [5, 5])
    assert rows[0] == {"new_tokens": 5, "steps": 2, "drafted": 1, "accepted": 1, "acceptance": 1.0}
    assert rows[1] == {"new_tokens": 5, "steps": 3, "drafted": 8, "accepted": 3, "acceptance": 3 / 8}
    assert summarize(records, ["ngram"], 1.0, 10)["acceptance"] == 4 / 9  # the pooled total
    assert summarize(records, ["ngram"], 1.0, 10)["arm_pulls"] == {"ngram": 2}  # a draft bandit: drafts only
    assert summarize(records, ["ngram"], 1.0, 10, plain=True)["arm_pulls"] == {"plain": 1, "ngram": 2}  # adaptive
    unknown = per_request([StepRecord(0, 4, 2, 3, 1, 0.1)], [3])  # a loop without per-row records
    assert unknown[0]["acceptance"] is None and unknown[0]["new_tokens"] == 3


def test_a_process_waiting_on_a_conversion_says_so(tmp_path):
    pytest.importorskip("fcntl")
    from flashspec.weights import conversion_lock

    out = tmp_path / "cache" / "model-1"
    waiter = ("import sys; from pathlib import Path; from flashspec.weights import conversion_lock\n"
              "with conversion_lock(Path(sys.argv[1])): print('got it')")
    with conversion_lock(out):
        proc = subprocess.Popen([sys.executable, "-c", waiter, str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**__import__("os").environ})
        line = proc.stderr.readline()  # printed while this process still holds the lock
        assert "waiting for another process to finish converting" in line and str(out) in line
    assert proc.communicate(timeout=60)[0].strip() == "got it"


def test_default_drafts_use_the_shipped_head_only_on_the_embedded_model_with_torch():
    """The shipped head fits the embedded model alone: another --target (or the JAX backend's
    default) gets the n-gram draft, so that `generate --target MODEL` never loads a head of another width."""
    from flashspec.drafts import default_drafts

    assert default_drafts("torch", None) == ("head", "ngram")
    assert default_drafts("torch", "/some/model.gguf") == ("ngram",)
    assert default_drafts("jax", None) == ("ngram",)
