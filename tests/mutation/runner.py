"""Apply one mutation of :mod:`tests.mutation.table` to a copy of the repository and run the
tests that must kill it.

A mutation is killed when pytest, run on the copy (``PYTHONPATH`` and the working directory
pointing at it, in a subprocess), exits with status 1 and *every* test its row names
failed (a parametrized test counts as failed when one of its cases failed).
Exit status 0 means the mutation survived; any other status (collection or import error,
no test collected, timeout) is reported as an error, not as a kill. A mutation whose old
text no longer occurs exactly once in its file does not apply, which is an error too.

Run from the repository root::

    python -m tests.mutation.runner              # every mutation, one line each
    python -m tests.mutation.runner las-rank-negated cost-kv-capacity-shrunk

The copy keeps the files' modification times (``shutil.copy2``), so numba's on-disk caches
(``__pycache__/*.nbi``) stay valid for every file the mutation does not touch; numba itself
recompiles the mutated file, but a kernel in another file that calls it would keep the old
callee in its cache, so the copy's caches of those files go too
(:func:`clear_dependent_kernel_caches`) and the tests compile them afresh.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.table import MUTATIONS, Mutation

REPO = Path(__file__).resolve().parents[2]
#: what a copy needs to import the package and run its tests
COPIED = ("lpserve", "tests", "proofs", "models", "instances", "pyproject.toml")
IGNORED = shutil.ignore_patterns(".hypothesis", ".pytest_cache", "*.egg-info", "lpserve-report")
TIMEOUT_S = 300


class MutationError(AssertionError):
    """A mutation does not apply, or its tests could not run."""


@dataclass(frozen=True)
class Outcome:
    """What running one mutation's tests gave: ``killed`` (status 1), the failing test
    node ids, the pytest exit status, the seconds it took and the output's tail."""

    mutation: str
    killed: bool
    failed: tuple[str, ...]
    returncode: int
    wall_s: float
    tail: str


def occurrences(m: Mutation, root: Path = REPO) -> int:
    """How often ``m.old`` occurs in ``m.file`` under ``root`` (it must be once)."""
    path = root / m.file
    if not path.is_file():
        raise MutationError(f"mutation {m.id!r}: file {m.file} does not exist")
    return path.read_text().count(m.old)


def copy_tree(dest: Path, root: Path = REPO) -> None:
    """Copy what the tests need from ``root`` into ``dest`` (modification times kept)."""
    for name in COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=IGNORED, copy_function=shutil.copy2)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def apply(m: Mutation, dest: Path) -> None:
    """Patch ``m.file`` under ``dest`` (a copy): ``m.old`` -> ``m.new``, exactly once."""
    n = occurrences(m, dest)
    if n != 1:
        raise MutationError(f"mutation {m.id!r} no longer applies: its old text occurs {n} "
                            f"times in {m.file} (it must occur exactly once)")
    path = dest / m.file
    path.write_text(path.read_text().replace(m.old, m.new))


_KERNEL = re.compile(r"^\s*@(numba\.)?(njit|jit|vectorize|guvectorize|cfunc)\b", re.M)


def clear_dependent_kernel_caches(dest: Path, mutated: str) -> list[str]:
    """Delete numba's caches, in the copy ``dest``, of every kernel file that imports the
    mutated module ``mutated`` (a path under ``dest``), directly or through other kernel
    files; returns their paths. Nothing is deleted when ``mutated`` has no kernel."""
    pkg = dest / "lpserve"
    kernels = {f: f.read_text() for f in pkg.rglob("*.py") if _KERNEL.search(f.read_text())}
    target = dest / mutated
    if target not in kernels:
        return []
    stale, frontier = set(), {target}
    while frontier:
        names = {f.stem for f in frontier}
        found = {f for f, text in kernels.items() if f not in stale and f not in frontier
                 and any(re.search(rf"^(from|import) [\w.]*\b{re.escape(n)}\b|"
                                   rf"^from [\w.]+ import .*\b{re.escape(n)}\b", text, re.M)
                         for n in names)}
        stale |= frontier
        frontier = found
    stale.discard(target)  # numba rebuilds the mutated file's own cache (its source changed)
    for f in stale:
        for cache in (f.parent / "__pycache__").glob(f"{f.stem}.*.nb[ic]"):
            cache.unlink()
    return sorted(str(f.relative_to(dest)) for f in stale)


def run(m: Mutation, *, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Copy the repository, apply ``m`` and run ``m.tests`` there; the hypothesis profile is
    the caller's (``HYPOTHESIS_PROFILE``) without shrinking (``mutation-<profile>``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lpserve-mutation-") as tmp:
        dest = Path(tmp) / "repo"
        dest.mkdir()
        copy_tree(dest)
        apply(m, dest)
        clear_dependent_kernel_caches(dest, m.file)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(dest)
        # the caller's profile without shrinking (tests/conftest.py)
        profile = env.get("HYPOTHESIS_PROFILE", "dev")
        env["HYPOTHESIS_PROFILE"] = profile if profile.startswith("mutation-") else \
            f"mutation-{profile}"
        env.setdefault("LPSERVE_SHARED", str(REPO.parent / "shared"))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--no-header", "-o", "addopts=", *m.tests]
        try:
            proc = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Outcome(m.id, False, (), -1, time.perf_counter() - t0,
                           f"timed out after {timeout_s:.0f} s")
    out = proc.stdout + proc.stderr
    failed = tuple(dict.fromkeys(re.findall(r"^FAILED (\S+)", out, flags=re.M)))
    every = all(any(f == node or f.startswith(node + "[") for f in failed) for node in m.tests)
    return Outcome(m.id, proc.returncode == 1 and every, failed, proc.returncode,
                   time.perf_counter() - t0, out[-3000:])


def check_imports_the_copy() -> None:
    """The subprocess imports the copied package, not an installed one."""
    with tempfile.TemporaryDirectory(prefix="lpserve-mutation-") as tmp:
        dest = Path(tmp) / "repo"
        dest.mkdir()
        shutil.copytree(REPO / "lpserve", dest / "lpserve", ignore=IGNORED)
        env = dict(os.environ, PYTHONPATH=str(dest))
        got = subprocess.run([sys.executable, "-c", "import lpserve; print(lpserve.__file__)"],
                             cwd=dest, env=env, capture_output=True, text=True, timeout=120)
        if not got.stdout.strip().startswith(str(dest)):
            raise MutationError(f"the subprocess imported {got.stdout.strip() or got.stderr!r},"
                                f" not the copy under {dest}")


def main(argv: list[str]) -> int:
    """Run the named mutations (all without names); print one line each; 0 if all killed."""
    chosen = [m for m in MUTATIONS if not argv or m.id in argv]
    unknown = sorted(set(argv) - {m.id for m in MUTATIONS})
    if unknown:
        print(f"unknown mutation ids: {unknown}", file=sys.stderr)
        return 2
    bad = 0
    for m in chosen:
        o = run(m)
        verdict = "killed" if o.killed else (
            "SURVIVED" if o.returncode == 0 else
            "PARTLY" if o.returncode == 1 else f"ERROR (pytest exit {o.returncode})")
        print(f"{m.id:<40} {verdict:<10} {o.wall_s:6.1f} s  {', '.join(o.failed)}", flush=True)
        if not o.killed:
            bad += 1
            print(o.tail)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
