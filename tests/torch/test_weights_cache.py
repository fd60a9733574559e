"""The converted-weights cache under concurrent processes (pytest -n 2, two CLIs started together)."""
import subprocess
import sys

import pytest

fcntl = pytest.importorskip("fcntl")

TRY_LOCK = "import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"


def other_process_can_lock(path) -> bool:
    return subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], capture_output=True).returncode == 0


def test_conversion_lock_excludes_another_process_until_released(tmp_path):
    from flashspec.weights import conversion_lock

    out = tmp_path / "cache" / "SmolLM2-123"
    with conversion_lock(out):
        assert not other_process_can_lock(tmp_path / "cache" / "SmolLM2-123.lock")
    assert other_process_can_lock(tmp_path / "cache" / "SmolLM2-123.lock")
