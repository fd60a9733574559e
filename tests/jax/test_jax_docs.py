"""docs/jax.md's code blocks, run in order in one namespace with fewer runs (RUNS = 8, 8 new tokens):
the documented research example (vmap over seeds of a jitted whole generation, the Pallas verify as
a jitted function) keeps working."""

import re
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")

DOC = Path(__file__).resolve().parents[2] / "docs" / "jax.md"
FULL = "RUNS, MAX_NEW, GAMMA = 1000, 32, 4"


def test_the_documented_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2 and FULL in blocks[0]
    scope: dict = {}
    for code in blocks:
        exec(compile(code.replace(FULL, "RUNS, MAX_NEW, GAMMA = 8, 8, 3"), str(DOC), "exec"), scope)
    out = capsys.readouterr().out
    rate = float(re.search(r"acceptance ([0-9.]+) \+- ", out).group(1))
    assert 0.0 < rate < 1.0  # the layer-skip draft is often but not always right
    assert scope["per_seed"].tokens.shape == (16, 4, 4)
    assert scope["accepted"].shape == (8,)
