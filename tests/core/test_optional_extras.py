"""The core needs neither torch nor jax; a missing backend names the extra to install."""

import subprocess
import sys

import pytest

BLOCK = "import sys; sys.modules['torch'] = None; sys.modules['jax'] = None; sys.modules['triton'] = None\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_core_imports_without_torch_or_jax():
    r = run(
        "import flashspec, flashspec.reference, flashspec.testing, flashspec.mutants, flashspec.loop, "
        "flashspec.bandits, flashspec.simulate, flashspec.fake, flashspec.engine, flashspec.cli, flashspec.drafts, "
        "flashspec.weights\n"
        "import numpy as np\n"
        "res = flashspec.reference.verify(np.zeros((1, 3, 4), np.float32), np.zeros((1, 2), np.int64))\n"
        "print(res.num_accepted.shape)"
    )
    assert r.returncode == 0, r.stderr
    assert "(1,)" in r.stdout


@pytest.mark.parametrize("module,extra", [("flashspec_torch", "flashspec[torch]"), ("flashspec_jax", "flashspec[jax]")])
def test_missing_backend_names_its_extra(module, extra):
    r = run(f"import {module}")
    assert r.returncode != 0
    assert extra in r.stderr


def test_generate_without_torch_names_the_extra():
    r = run("import flashspec.engine\nflashspec.engine.generate('hi')")
    assert r.returncode != 0 and "flashspec[torch]" in r.stderr


def test_cli_generate_without_torch_is_one_line_naming_the_extra():
    r = run("import sys\nfrom flashspec.cli import main\nsys.exit(main(['generate', 'hi']))")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "pip install 'flashspec[torch]'" in r.stderr and "Traceback" not in r.stderr


REFUSE = (
    "import sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.partition('.')[0] in ('torch', 'triton', 'jax', 'flashspec_torch', 'flashspec_jax'):\n"
    "            raise ImportError(f'{name} refused by the test')\n"
    "sys.meta_path.insert(0, Refuse())\n"
    "from flashspec.cli import main\n"
)


@pytest.mark.parametrize("argv,needle", [
    (["--help"], "bandit-sim"),
    (["bench", "--help"], "kernels"),
    (["bandit-sim", "--rounds", "50", "--seeds", "2", "--policy", "ucb1", "--json"], '"ucb1"'),
])
def test_the_cli_runs_with_no_framework_importable(argv, needle):
    """``flashspec --help`` and ``bandit-sim`` import neither a framework nor a backend package."""
    code = REFUSE + f"try:\n    status = main({argv!r})\nexcept SystemExit as e:\n    status = e.code\n" \
        "assert not {'torch', 'jax', 'triton'} & set(sys.modules), sorted(sys.modules)\nsys.exit(status)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert needle in r.stdout


def test_the_refusing_finder_can_fail():
    """The finder above does refuse: importing a backend under it fails."""
    r = subprocess.run([sys.executable, "-c", REFUSE + "import flashspec.engine\nflashspec.engine.engine_class('jax')"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "refused by the test" in r.stderr
