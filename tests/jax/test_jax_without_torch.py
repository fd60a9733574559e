"""`pip install 'flashspec[jax]'` alone runs the JAX backend: torch, triton and flashspec_torch made
unimportable in a subprocess (a finder first on sys.meta_path refusing them, and sys.modules entries
of None so that transformers' availability checks see them absent)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "triton", "flashspec_torch")

SITECUSTOMIZE = textwrap.dedent(f"""
    import sys

    BLOCKED = {BLOCKED!r}


    class RefuseBlocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
            return None


    sys.meta_path.insert(0, RefuseBlocked())
    for name in BLOCKED:
        sys.modules[name] = None  # importlib.util.find_spec then answers None: 'not installed'
""")

SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("torch", "triton", "flashspec_torch"):
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{name} was importable")
    from transformers.utils import is_torch_available
    import flashspec_jax, flashspec_jax.model, flashspec_jax.weights, flashspec_jax.engine
    from flashspec.cli import main
    rc = main(["generate", "def add(a, b):", "--backend", "jax", "--no-chat", "--max-new-tokens", "4",
               "--temperature", "0", "--json", "--device", "cpu"])
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "triton", "flashspec_torch")
                    and sys.modules[m] is not None)
    print(json.dumps({"rc": rc, "torch_available": is_torch_available(), "leaked": leaked}))
""")


def test_the_jax_backend_generates_with_torch_unimportable(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = [str(tmp_path / "site"), str(REPO / "shared"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path)), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    generated, report = json.loads(lines[-2]), json.loads(lines[-1])
    assert report == {"rc": 0, "torch_available": False, "leaked": []}
    assert generated["backend"] == "jax" and 1 <= generated["new_tokens"] <= 4
