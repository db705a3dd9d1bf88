"""Hypothesis strategies for lpserve: traces of every shape, including adversarial ones.

Sections are owned by topic: traces first; simulator, cost and policy strategies follow.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from lpserve.trace import Trace

# ----------------------------------------------------------------------------- traces
token_counts = st.integers(min_value=1, max_value=8192)


@st.composite
def arrival_times(draw, n: int, *, adversarial: bool = True) -> np.ndarray:
    """``n`` sorted arrival times; adversarial draws include ties, bursts and huge gaps."""
    kind = draw(st.sampled_from(["poissonish", "ties", "burst", "gaps"] if adversarial
                                else ["poissonish"]))
    if kind == "ties":
        gaps = [draw(st.sampled_from([0.0, 0.0, 1e-9, 1.0])) for _ in range(n)]
    elif kind == "burst":
        gaps = [0.0] * (n // 2) + [draw(st.floats(0, 10)) for _ in range(n - n // 2)]
    elif kind == "gaps":
        gaps = [draw(st.floats(0, 1e6)) for _ in range(n)]
    else:
        gaps = [draw(st.floats(1e-3, 5.0)) for _ in range(n)]
    t = np.cumsum(np.asarray(gaps, dtype=np.float64))
    start = draw(st.floats(0, 1e5))
    return start + t - (t[0] if n else 0.0)


@st.composite
def block_lists(draw, prompt_tokens: np.ndarray, block_tokens: int) -> list[list[int]]:
    """Prefix-block ids consistent with the prompts: requests share leading runs of an
    earlier request's ids, then continue with fresh ids."""
    out: list[list[int]] = []
    next_id = 0
    for p in prompt_tokens.tolist():
        nb = -(-p // block_tokens)
        row: list[int] = []
        if out and draw(st.booleans()):
            src = out[draw(st.integers(0, len(out) - 1))]
            row = src[:draw(st.integers(0, min(nb, len(src))))]
        while len(row) < nb:
            row.append(next_id)
            next_id += 1
        out.append(row)
    return out


@st.composite
def traces(draw, *, min_size: int = 0, max_size: int = 40, blocks: bool | None = None,
           ids: bool | None = None, adversarial: bool = True) -> Trace:
    """Valid traces: any size in range, optional blocks, ids, parents and predictions."""
    n = draw(st.integers(min_size, max_size))
    arrival = draw(arrival_times(n, adversarial=adversarial))
    prompt = np.asarray(draw(st.lists(token_counts, min_size=n, max_size=n)), np.int64)
    output = np.asarray(draw(st.lists(st.integers(1, 2048), min_size=n, max_size=n)),
                        np.int64)
    kw: dict = {}
    if blocks if blocks is not None else draw(st.booleans()):
        bt = draw(st.sampled_from([1, 16, 512]))
        kw["block_ids"] = draw(block_lists(prompt, bt))
        kw["block_tokens"] = bt
    if ids if ids is not None else draw(st.booleans()):
        kw["session_id"] = draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n))
        kw["tenant"] = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
        kw["program_id"] = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
        kw["parent"] = [draw(st.integers(-1, i - 1)) for i in range(n)]
        lo = [draw(st.integers(1, 2048)) for _ in range(n)]
        kw["predicted_lo"] = lo
        kw["predicted_hi"] = [x + draw(st.integers(0, 500)) for x in lo]
    return Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output,
                             name="hyp", **kw)
