"""The mutation suite (tests/mutation/table.py): every planted bug must be killed by the
tests its row names, run on a copy of the repository with the bug applied.

The default tier checks that the table still applies (each old text exactly once, each
named test and proof file present); the slow tier applies the mutations one at a time and
fails if any survives. Under either hypothesis profile (``HYPOTHESIS_PROFILE=dev`` or
``ci``; the subprocess inherits it). ``python -m tests.mutation.runner`` prints the same
verdicts, with the tests that killed each mutation.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mutation import runner
from tests.mutation.table import MUTATIONS

REPO = Path(__file__).resolve().parents[2]


def _test_exists(node: str) -> bool:
    path, _, name = node.partition("::")
    f = REPO / path
    return f.is_file() and re.search(rf"^def {re.escape(name)}\(", f.read_text(), re.M) is not None


def test_table_applies_and_names_real_tests():
    ids = [m.id for m in MUTATIONS]
    assert len(ids) == len(set(ids)), "mutation ids must be distinct"
    assert len(MUTATIONS) >= 20
    for m in MUTATIONS:
        assert runner.occurrences(m) == 1, (
            f"mutation {m.id!r} no longer applies: its old text must occur exactly once in "
            f"{m.file}, found {runner.occurrences(m)}")
        assert m.old != m.new, m.id
        assert m.tests, m.id
        for node in m.tests:
            assert _test_exists(node), f"mutation {m.id!r}: test {node} does not exist"
        proofs = re.findall(r"proofs/[\w.-]+\.md", m.claim)
        assert proofs, f"mutation {m.id!r}: its claim names no proof file"
        for proof in proofs:
            assert (REPO / proof).is_file(), (m.id, proof)


@pytest.mark.slow
def test_the_copy_is_what_the_subprocess_imports():
    runner.check_imports_the_copy()


@pytest.mark.slow
@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_mutation_is_killed(mutation):
    out = runner.run(mutation)
    print(f"\n{mutation.id}: {'killed by ' + ', '.join(out.failed) if out.killed else 'NOT killed'}"
          f" ({out.wall_s:.1f} s)")
    assert out.returncode != 0, f"mutation {mutation.id!r} SURVIVED {mutation.tests}"
    assert out.killed, (f"mutation {mutation.id!r}: not every test of {mutation.tests} failed "
                        f"(pytest exit {out.returncode}; failed: {out.failed}):\n{out.tail}")
