"""``flashspec bandit-sim`` and ``flashspec bench bandit``; the committed bandit results."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashspec.cli import main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_bandit_sim_json(capsys):
    doc = run_json(capsys, "bandit-sim", "--policy", "ucb1", "--policy", "thompson",
                   "--rounds", "500", "--seeds", "20", "--json")
    assert list(doc["policies"]) == ["ucb1", "thompson"]
    for summary in doc["policies"].values():
        assert summary["mean_regret"] > 0 and summary["std_regret"] > 0
    assert doc["bounds"]["sqrt_k_t_ln_t"] == pytest.approx((3 * 500 * 6.2146080984) ** 0.5)
    assert doc["bounds"]["ucb1_auer2002_thm1"] > doc["policies"]["ucb1"]["mean_regret"]
    assert doc["command"].startswith("flashspec bandit-sim --policy ucb1")


def test_bandit_sim_all_policies_piecewise_acceptance(capsys):
    doc = run_json(capsys, "bandit-sim", "--policy", "all", "--reward", "acceptance", "--gamma", "3",
                   "--switch-at", "100,200", "300", "--rounds", "400", "--seeds", "5", "--json")
    assert set(doc["policies"]) == {"ucb1", "thompson", "thompson-token", "discounted-thompson",
                                    "cd-thompson", "fixed"}
    assert doc["environment"]["switch_at"] == [100, 200, 300]
    assert doc["bounds"]["ucb1_auer2002_thm1"] is None


def test_bandit_sim_table(capsys):
    assert main(["bandit-sim", "--policy", "thompson", "--rounds", "200", "--seeds", "5"]) == 0
    out = capsys.readouterr().out
    assert "thompson" in out and "sqrt(K T ln T)" in out and "Auer" in out


@pytest.mark.parametrize("argv", [
    ["bandit-sim", "--means", "0.3,1.7"],
    ["bandit-sim", "--means", "a,b"],
    ["bandit-sim", "--policy", "nope"],
    ["bandit-sim", "--rounds", "0"],
    ["bandit-sim", "--switch-every", "10", "--switch-at", "5"],
    ["bandit-sim", "--policy", "fixed", "--fixed-arm", "7", "--rounds", "5", "--seeds", "1"],
    ["bandit-sim", "--discount", "1.5", "--rounds", "5", "--seeds", "1"],
    ["bandit-sim", "--objective", "throughput", "--costs", "1,2", "--rounds", "5"],
    ["bench"],
    [],
])
def test_bad_input_is_one_line(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err and "Traceback" not in err


def test_console_script_reports_bad_input_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "flashspec.cli", "bandit-sim", "--means", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_bench_bandit_writes_json_and_png(tmp_path, capsys):
    assert main(["bench", "bandit", "--out", str(tmp_path), "--rounds", "300", "--seeds", "4"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    for scenario in ("stationary", "acceptance", "piecewise", "throughput"):
        assert f"bandit_{scenario}.json" in names and f"bandit_{scenario}.png" in names
        doc = json.loads((tmp_path / f"bandit_{scenario}.json").read_text())
        assert doc["command"].startswith("flashspec bench bandit")
        assert doc["equivalent"].startswith("flashspec bandit-sim")
        assert doc["rounds"] == 300 and doc["seeds"] == 4


def committed(name):
    path = RESULTS / f"bandit_{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not generated yet")
    return json.loads(path.read_text())


def test_committed_results_meet_the_claims():
    """The committed JSON (from `flashspec bench bandit`) holds what docs/bandits.md quotes."""
    st, acc, pw = committed("stationary"), committed("acceptance"), committed("piecewise")
    for doc in (st, acc, pw):
        assert (doc["rounds"], doc["seeds"]) == (10_000, 200) and doc["command"]
    assert 95 <= st["policies"]["ucb1"]["mean_regret"] <= 107
    assert st["policies"]["thompson"]["mean_regret"] <= 22
    assert acc["policies"]["thompson-token"]["mean_regret"] <= 13
    assert pw["policies"]["cd-thompson"]["mean_regret"] <= 170
    assert st["policies"]["cd-thompson"]["mean_regret"] <= 25
    assert st["bounds"]["ucb1_auer2002_thm1"] == pytest.approx(555.19, abs=0.01)
    assert st["bounds"]["sqrt_k_t_ln_t"] == pytest.approx(525.65, abs=0.01)
