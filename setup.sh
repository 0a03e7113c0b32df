#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs cbop-torchrl with its test and docs tools.
# Idempotent: re-running only installs what changed. Override the torch
# requirement with TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0" is the default,
# a CPU wheel on the development machines; any torch>=2.11 works).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[test,cluster,docs]"
