#!/usr/bin/env bash
# The main job on the bundled default workload: sets up .venv, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh test
exec .venv/bin/lpserve trace stats "$@"
