#!/usr/bin/env bash
# The whole test suite (fast and slow tiers): sets up .venv, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh test
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
exec .venv/bin/python -m pytest -q "$@"
