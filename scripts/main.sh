#!/usr/bin/env bash
# The main job: the heuristic-gap report on the bundled default workload (sets up .venv
# first). Arguments go to `lpserve gap` (see `lpserve gap --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh test
exec .venv/bin/lpserve gap "$@"
