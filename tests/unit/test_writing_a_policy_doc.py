"""``docs/writing-a-policy.md``: every Python block runs, in order, in one module (so the
policies it defines pickle, as ``check_policy`` requires)."""
from __future__ import annotations

import linecache
import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-policy.md"


def test_the_doc_code_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    mod = types.ModuleType("writing_a_policy_doc")
    sys.modules[mod.__name__] = mod
    try:
        for i, code in enumerate(blocks):
            name = f"<{DOC.name}, block {i + 1}>"  # so tracebacks show the block's lines
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            exec(compile(code, name, "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    out = capsys.readouterr().out
    # the errors the doc promises were raised and printed
    assert "wrote into view field 'arrival_s'" in out
    assert "view.output_tokens is None" in out
    assert "decides on predicted output lengths" in out
    assert "Result(policy='shortest-predicted'" in out
