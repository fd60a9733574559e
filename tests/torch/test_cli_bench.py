"""`flashspec bench generate|kernels` run the source tree's benchmark scripts with the given options."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("kind,script", [("generate", "generate_cpu.py"), ("kernels", "verify_kernels.py")])
def test_bench_passes_its_options_to_the_script(kind, script):
    out = subprocess.run([sys.executable, "-m", "flashspec.cli", "bench", kind, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"usage: {script}" in out.stdout


def test_bench_kernels_refuses_unknown_options():
    out = subprocess.run([sys.executable, "-m", "flashspec.cli", "bench", "kernels", "--no-such-option"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--no-such-option" in out.stderr
