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
source scripts/peer-venv.sh
peer_venv_begin vidur "${LPSERVE_VIDUR_VENV:-.venv-vidur}"
echo "vidur-env: installing vidur==0.0.26 and lpserve into $venv ..." >&2
"${pip[@]}" install --quiet "vidur==0.0.26" >&2
"${pip[@]}" install --quiet -e ".[test]" >&2
"$venv/bin/python" - <<'PY' >&2
import importlib.metadata as md
import vidur  # noqa: F401
import lpserve.adapters.vidur  # noqa: F401
print("vidur-env: vidur", md.version("vidur"), "lpserve", md.version("lpserve"))
PY
peer_venv_end vidur
