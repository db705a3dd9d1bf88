#!/usr/bin/env bash
# The whole test suite: sets up .venv (the test extra, plus ruff from the dev extra), runs
# ruff, then pytest in two stages — the default tier, then the slow tier (long runs,
# notebooks, real vLLM and Vidur in their own venvs) — each spread over
# LPSERVE_TEST_WORKERS processes (default 2, the CI machine's cores; 0 runs in-process).
# Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh test
if ! .venv/bin/ruff --version >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet -e ".[dev]"  # the dev extra adds ruff
fi
echo "== ruff"
.venv/bin/ruff check lpserve tests benchmarks notebooks
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
WORKERS="${LPSERVE_TEST_WORKERS:-2}"
echo "== stage 1: default tier ($WORKERS workers)"
.venv/bin/python -m pytest -q -m "not slow" -n "$WORKERS" "$@"
echo "== stage 2: slow tier ($WORKERS workers)"
.venv/bin/python -m pytest -q -m slow -n "$WORKERS" --durations=15 "$@"
