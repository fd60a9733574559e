"""`flashspec generate`: bad input exits 2, faults exit 1, Ctrl-C exits 130 after printing what was
produced; always one readable line on stderr, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
from fault_helpers import first_new_token, poisoned, tiny_target

import flashspec.engine
from flashspec.cli import main
from flashspec_torch.engine import Engine


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


def one_line(capsys) -> tuple[str, str]:
    out = capsys.readouterr()
    err = out.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return out.out, err


@pytest.mark.parametrize("argv,needle", [
    (["generate", "hi", "--top-k", "-1"], "top-k=-1 must be an integer >= 0"),
    (["generate", "hi", "--top-k", "x"], "--top-k"),
    (["generate", "hi", "--gamma", "65"], "--gamma=65 must be an integer in [1, 64]"),
    (["generate", "hi", "--temperature", "1e-9"], "temperature=1e-09 must be 0 (greedy) or >= 1e-06"),
    (["generate", "hi", "--temperature", "nan"], "--temperature"),
    (["generate", "hi", "--seed", "-3"], "argument --seed: '-3' is not an integer in [0, 2**63)"),
    (["generate", "hi", "--max-new-tokens", "ten"], "--max-new-tokens"),
    (["generate", "", "--device", "cpu"], "prompt must be a non-empty string"),
    (["generate", "hi", "--device", "tpu"], "device='tpu' is not a torch device"),
    (["generate", "hi", "--backend", "tf"], "--backend"),
    (["generate"], "prompt"),
])
def test_bad_arguments_exit_2_before_loading_a_model(argv, needle, capsys, monkeypatch):
    monkeypatch.setattr("flashspec_torch.engine.load", lambda *a, **k: pytest.fail("loaded a model for bad input"))
    assert run(argv) == 2
    _, err = one_line(capsys)
    assert needle in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_cuda_on_a_machine_without_it(capsys):
    assert run(["generate", "hi", "--device", "cuda"]) == 2
    assert "CUDA is not available" in one_line(capsys)[1]


def test_missing_and_corrupt_model_files_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    garbage = tmp_path / "model.gguf"
    garbage.write_bytes(os.urandom(2048))
    for target, needle in ((str(garbage), "cannot read"), (str(tmp_path), "has no config.json"),
                           (str(tmp_path / "absent.gguf"), "does not exist")):
        assert run(["generate", "hi", "--target", target, "--device", "cpu"]) == 2
        assert needle in one_line(capsys)[1]


@pytest.fixture
def tiny_engine(monkeypatch):
    """`flashspec generate` on the tiny random model instead of the embedded one."""
    made = {}

    def fake_engine(target, drafts, *, policy, device, batch_invariant=False):
        made["engine"] = Engine(made["target"], drafts, policy=policy, device="cpu", batch_invariant=batch_invariant)
        return made["engine"]

    monkeypatch.setattr(flashspec.engine, "engine_class", lambda backend: fake_engine)
    made["target"] = tiny_target()
    return made


GREEDY = ["--no-chat", "--temperature", "0", "--max-new-tokens", "12", "--device", "cpu", "--draft", "ngram"]  # the tiny target has no head


@pytest.mark.parametrize("json_out", [False, True])
def test_ctrl_c_prints_what_was_produced_and_exits_130(tiny_engine, capsys, monkeypatch, json_out):
    original = Engine.generate

    def generate(self, prompt, *, on_step=None, **kw):
        seen = []

        def interrupt(record):
            on_step(record)
            seen.append(record)
            if len(seen) == 2:
                raise KeyboardInterrupt

        return original(self, prompt, on_step=interrupt, **kw)

    monkeypatch.setattr(Engine, "generate", generate)
    assert run(["generate", "abcab", *GREEDY] + (["--json"] if json_out else [])) == 130
    out, err = one_line(capsys)
    assert "interrupted after" in err
    full = original(tiny_engine["engine"], "abcab", temperature=0.0, max_new_tokens=12, chat=False)
    if json_out:
        got = json.loads(out)
        assert got["interrupted"] and got["tokens"] == full["tokens"][: len(got["tokens"])]
    else:
        assert out.rstrip("\n") and full["text"].startswith(out.rstrip("\n"))


def test_ctrl_c_while_loading_exits_130(capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(flashspec.engine, "engine_class", lambda backend: interrupted)
    assert run(["generate", "hi"]) == 130
    assert one_line(capsys)[1] == "flashspec generate: interrupted"


def test_nan_logits_print_the_tokens_before_and_exit_1(tiny_engine, capsys):
    clean = tiny_engine["target"]
    ref = Engine(clean, ("ngram",), device="cpu").generate("abcab", temperature=0.0, max_new_tokens=12, chat=False)
    k = first_new_token(ref["tokens"], clean.tokenizer("abcab")["input_ids"], at_least=3)
    tiny_engine["target"] = poisoned(clean, ref["tokens"][k])
    assert run(["generate", "abcab", *GREEDY, "--json"]) == 1
    out, err = one_line(capsys)
    assert "NaN or infinite logits for batch row 0" in err
    assert json.loads(out)["tokens"] == ref["tokens"][: k + 1]


def test_an_unexpected_error_is_one_line_and_exit_1(capsys, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("something broke\nacross lines")

    monkeypatch.setattr(flashspec.engine, "engine_class", lambda backend: broken)
    assert run(["generate", "hi"]) == 1
    err = one_line(capsys)[1]
    assert "internal error: RuntimeError: something broke across lines" in err and "FLASHSPEC_TRACEBACK" in err


def test_the_console_script_prints_no_traceback(tmp_path):
    garbage = tmp_path / "model.gguf"
    garbage.write_bytes(b"GGUF" + os.urandom(512))
    env = {**os.environ, "FLASHSPEC_CACHE": str(tmp_path / "cache")}
    for argv in (["generate", "hi", "--top-p", "0"], ["generate", "hi", "--target", str(garbage), "--device", "cpu"]):
        proc = subprocess.run([sys.executable, "-m", "flashspec.cli", *argv], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
