"""Every claim has a proof file and a test (proofs/README.md): the ``Claim`` of every
registered policy points at an existing proof file and an existing test, and that proof
file names the test; every proof file names tests that exist; every proof file the code,
the README, the models or the docs cite exists; nothing cites a file outside the project."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import lpserve as lp
from lpserve.registry import policy_names

REPO = Path(__file__).resolve().parents[2]
PROOFS = sorted(p for p in (REPO / "proofs").glob("*.md") if p.name != "README.md")
NODE = re.compile(r"(tests/[\w/]+\.py)?::(\w+)|(tests/[\w/]+\.py)")


def _has_test(path: str, name: str) -> bool:
    f = REPO / path
    return f.is_file() and re.search(rf"^(async )?def {re.escape(name)}\(", f.read_text(),
                                     re.M) is not None


def cited_tests(text: str) -> list[tuple[str, str | None]]:
    """Test nodes a proof file cites: ``tests/x.py::name``, ``::name`` (in the file cited
    last before it) and whole files ``tests/x.py``, as ``(path, name or None)``."""
    out: list[tuple[str, str | None]] = []
    last = None
    for m in NODE.finditer(text):
        path, name, whole = m.group(1), m.group(2), m.group(3)
        if whole:
            if Path(whole).name.startswith("test_"):
                last = whole
            out.append((whole, None))
        elif name:
            last = path or last
            if last is not None:
                out.append((last, name))
    return out


def _claims():
    seen = {}
    for name in policy_names():
        for c in lp.make_policy(name).meta.claims:
            seen.setdefault((c.statement, c.proof, c.test), name)
    return sorted(seen.items())


def test_registered_claims_exist():
    assert len(_claims()) >= 10


@pytest.mark.parametrize("claim,policy", _claims(), ids=lambda x: x if isinstance(x, str)
                         else x[1])
def test_every_claim_has_its_proof_and_its_test(claim, policy):
    statement, proof, test = claim
    f = REPO / proof
    assert f.is_file(), f"{policy}: claim {statement!r} points at missing {proof}"
    assert test, f"{policy}: claim {statement!r} names no test"
    path, _, name = test.partition("::")
    assert _has_test(path, name), f"{policy}: claim {statement!r}: test {test} does not exist"
    assert name in f.read_text(), f"{proof} does not name the test of {policy}'s claim ({test})"


@pytest.mark.parametrize("proof", PROOFS, ids=lambda p: p.name)
def test_every_proof_file_names_tests_that_exist(proof):
    text = proof.read_text()
    assert re.search(r"\*\*Tests?\.?\*\*|\bTests?[.:]|^## Tests", text, re.M), \
        f"{proof.name} has no Tests section"
    nodes = cited_tests(text)
    assert any(name for _, name in nodes), f"{proof.name} names no test function"
    for path, name in nodes:
        if name is None:
            assert (REPO / path).is_file(), f"{proof.name} cites missing {path}"
        else:
            assert _has_test(path, name), f"{proof.name} cites missing test {path}::{name}"


def test_proof_index_lists_every_proof_file():
    index = (REPO / "proofs" / "README.md").read_text()
    missing = [p.name for p in PROOFS if f"`{p.name}`" not in index]
    assert not missing, f"proofs/README.md does not list {missing}"


def _project_texts():
    for sub in ("lpserve", "models", "docs", "benchmarks", "notebooks", "tests"):
        for f in (REPO / sub).rglob("*"):
            if f.suffix in (".py", ".md") and "__pycache__" not in f.parts:
                yield f
    yield REPO / "README.md"


def test_every_cited_proof_file_exists_and_nothing_cites_outside_files():
    here = Path(__file__).resolve()
    bad, outside = [], []
    for f in _project_texts():
        if f.resolve() == here:
            continue
        text = f.read_text()
        for p in set(re.findall(r"proofs/[\w.-]+\.md", text)):
            if not (REPO / p).is_file():
                bad.append(f"{f.relative_to(REPO)} -> {p}")
        if "theory.md" in text:
            outside.append(str(f.relative_to(REPO)))
    assert not bad, f"citations of missing proof files: {bad}"
    assert not outside, f"citations of theory.md, a file outside the project: {outside}"
