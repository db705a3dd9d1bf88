#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install lpserve into it
# with the extras named in $1 (default: test). Idempotent: re-installs only when
# pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "lpserve needs Python >= 3.11 (found: $("$py" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.lpserve-install-$(sha256sum pyproject.toml | cut -c1-16)-${extras}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  rm -f .venv/.lpserve-install-*
  touch "$stamp"
fi
# compile the simulator's numba kernels into their cache once per checkout (a few
# seconds when already cached); later processes load them
.venv/bin/python -m lpserve.cli compile
