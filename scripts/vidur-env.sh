#!/usr/bin/env bash
# Create (or reuse) .venv-vidur: the peer simulator Vidur (PyPI vidur==0.0.26, the version
# lpserve.adapters.vidur supports) plus lpserve itself (editable), for
# tests/slow/test_vidur_adapter.py and benchmarks/vidur_lpserve_cost.py.
#
#   bash scripts/vidur-env.sh          # idempotent; prints the venv's python path last
#
# Vidur's profiling data is not needed: the adapter prices batches with lpserve's cost
# model. A stamp file keyed by this script and pyproject.toml makes reruns a no-op; delete
# .venv-vidur to rebuild from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LPSERVE_VIDUR_VENV:-.venv-vidur}"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "vidur-env: needs Python >= 3.11 (found: $("$py" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi
key="$(cat scripts/vidur-env.sh pyproject.toml | sha256sum | cut -c1-16)"
stamp="$venv/.lpserve-vidur-$key"
if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade pip >&2
echo "vidur-env: installing vidur==0.0.26 and lpserve into $venv ..." >&2
"${pip[@]}" install --quiet "vidur==0.0.26" >&2
"${pip[@]}" install --quiet -e ".[test]" >&2
"$venv/bin/python" - <<'PY' >&2
import importlib.metadata as md
import vidur  # noqa: F401
import lpserve.adapters.vidur  # noqa: F401
print("vidur-env: vidur", md.version("vidur"), "lpserve", md.version("lpserve"))
PY
rm -f "$venv"/.lpserve-vidur-*
touch "$stamp"
echo "vidur-env: ready in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin/python"
