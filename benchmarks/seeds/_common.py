"""Helpers shared by the seed-paper benchmarks (``benchmarks/seeds/*.py``): the shared
data, a rate search and the claims table every benchmark prints."""
from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import lpserve as lp
from lpserve.arrays import readonly
from lpserve.trace import generate as G

SHARED = Path(os.environ.get("LPSERVE_SHARED",
                             Path(__file__).resolve().parents[3] / "shared")) / "traces"


#: ShareGPT V3 first turns bundled with lpserve (``lpserve/data/TRACES.md``): the rows of
#: the shared per-turn table that :func:`sharegpt_requests` keeps, in its order
BUNDLED_FIRST_TURNS = Path(lp.__file__).resolve().parent / "data" / \
    "sharegpt_v3_first_turn_lengths.csv.gz"


@lru_cache(maxsize=None)
def first_turn_lengths() -> tuple[np.ndarray, np.ndarray, str]:
    """ShareGPT V3 first turns with a prompt and a response: ``(prompt_tokens,
    response_tokens, source)``, read-only int64 arrays in the table's order; from the
    shared ``sharegpt_v3_turn_lengths_part1.csv.gz`` when present, else the same rows
    bundled with lpserve (read once per process)."""
    import pandas as pd

    path = SHARED / "sharegpt_v3_turn_lengths_part1.csv.gz"
    if path.exists():
        d = pd.read_csv(path)
        d = d[(d.turn == 0) & (d.prompt_tokens > 0) & (d.response_tokens > 0)]
        src = "ShareGPT V3 first turns (shared data)"
    else:
        d = pd.read_csv(BUNDLED_FIRST_TURNS)
        src = "ShareGPT V3 first turns (bundled with lpserve)"
    return (readonly(d.prompt_tokens.to_numpy(np.int64)),
            readonly(d.response_tokens.to_numpy(np.int64)), src)


def sharegpt_requests(n: int, rate_per_s: float, *, seed: int = 0,
                      max_total_tokens: int = 2048) -> lp.Trace:
    """``n`` Poisson requests at ``rate_per_s`` whose (prompt, output) pairs are resampled
    from ShareGPT V3's first turns with prompt + output <= ``max_total_tokens``
    (:func:`first_turn_lengths`)."""
    p, r, _ = first_turn_lengths()
    keep = p + r <= max_total_tokens
    joint = G.EmpiricalJoint(p[keep], r[keep])
    return G.synthetic(n, arrivals=G.Poisson(rate_per_s=rate_per_s), lengths=joint,
                       seed=seed, name="sharegpt-v3-first-turns")


def data_source() -> str:
    """Which ShareGPT lengths the benchmarks use."""
    return first_turn_lengths()[2]


def max_rate(ok: Callable[[float], bool], lo: float, hi: float,
             rel_tol: float = 0.05) -> float:
    """Largest rate in ``[lo, hi]`` with ``ok(rate)`` by geometric bisection, assuming
    ``ok`` holds below some rate and fails above it; 0 when even ``lo`` fails, ``hi``
    when ``hi`` holds."""
    if ok(hi):
        return hi
    if not ok(lo):
        return 0.0
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def verdict(holds: bool, close: bool | None = None) -> str:
    """One word per claim: the ordering holds (and the magnitude is close) or not."""
    if not holds:
        return "does NOT reproduce"
    if close is None:
        return "ordering holds"
    return "reproduces" if close else "ordering holds, magnitude differs"


def claims_table(title: str, rows: Sequence[tuple[str, str, float, float | None, str]]) -> None:
    """Print ``rows`` of (claim, paper's figure as text, lpserve's figure, the paper's
    number to divide by or None, verdict)."""
    print(f"\n## {title}")
    print(f"{'claim':<58} {'paper':>14} {'lpserve':>9} {'ratio':>7}  verdict")
    for claim, paper, ours, ref, word in rows:
        ratio = f"{ours / ref:7.2f}" if ref else f"{'-':>7}"
        print(f"{claim:<58} {paper:>14} {ours:9.3g} {ratio}  {word}")
