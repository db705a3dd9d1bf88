"""Agentic program workloads generated to Autellix's statistics (layer 0: numpy only).

Autellix (Luo et al., arXiv 2502.13965, section 6, Table 1) evaluates on four program
workloads; each generator below matches the paper's mean calls per program and mean
prefill / decode tokens per call (the spread of each is a stated assumption, a keyword
argument; the paper gives means and maxima only). A program is a set of calls sharing
``program_id``; a call with a ``parent`` is released when its parent finishes (no tool
or human delay is modelled: the paper's interrupts are not simulated). Calls of one program
share KV prefixes as their context grows (block ids follow each program's token stream,
as :func:`lpserve.trace.generate.sessions` does for chats), except in the ShareGPT
programs, whose per-call statistics count new tokens only.

=========================  ==================================================================
:func:`sharegpt_programs`  chat conversations as chains: 6.66 calls on average (max 80),
                           256 prefill / 277 decode tokens per call
:func:`react_programs`     BFCL ReAct agents as chains: 10.75 calls (max 70), 735 / 34
:func:`lats_programs`      LATS tree search as trees of parallel calls: ~160 calls, 467 / 73
:func:`mixed_programs`     the three, one third of the programs each
=========================  ==================================================================
"""
from __future__ import annotations

import numpy as np

from lpserve.trace import LoadReport, Trace, TraceError, pack_blocks

#: the paper's per-workload statistics (Table 1): mean calls, max calls, mean prefill
#: and decode tokens per call
AUTELLIX_STATS = {
    "sharegpt": {"calls": 6.66, "max_calls": 80, "prefill": 256.0, "decode": 277.0},
    "bfcl": {"calls": 10.75, "max_calls": 70, "prefill": 735.06, "decode": 34.14},
    "lats": {"calls": 159.7, "max_calls": 160, "prefill": 467.2, "decode": 72.6},
}


#: ReAct: tokens of the system prompt, tool descriptions and question (assumed)
REACT_BASE_TOKENS = 300.0
#: LATS: the root prompt as a share of the mean prefill; with the tree's growth the mean
#: prefill per call comes out near the paper's 467 (``program_stats``, seeds 0-2 of 8 programs)
LATS_BASE_SHARE = 0.58


def _lognormal(rng: np.random.Generator, mean: float, cv: float, size: int,
               lo: int = 1, hi: int | None = None) -> np.ndarray:
    s2 = np.log1p(cv * cv)
    x = np.rint(rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), size=size))
    x = np.maximum(x, lo)
    return (np.minimum(x, hi) if hi is not None else x).astype(np.int64)


def _n_calls(rng: np.random.Generator, mean: float, cap: int, size: int) -> np.ndarray:
    """Geometric numbers of calls (>= 1) of the given mean, capped."""
    return np.minimum(rng.geometric(1.0 / mean, size=size), cap).astype(np.int64)


class _Builder:
    """Collects calls and their block ids (a program's token stream, one id per block)."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise TraceError(f"block_tokens must be >= 1, got {block_tokens!r}")
        self.bt = block_tokens
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.parent: list[int] = []
        self.program: list[int] = []
        self.blocks: list[list[int]] = []
        self._next = 0

    def fresh(self, n: int) -> list[int]:
        out = list(range(self._next, self._next + n))
        self._next += n
        return out

    def add(self, t: float, prompt: int, output: int, parent: int, program: int,
            stream: list[int]) -> int:
        """A call whose prompt is the first ``prompt`` tokens of a stream whose full blocks
        have ids ``stream`` (grown with fresh ids as needed); returns its index."""
        full = prompt // self.bt
        if len(stream) < full:
            stream.extend(self.fresh(full - len(stream)))
        row = stream[:full] + (self.fresh(1) if prompt % self.bt else [])
        self.arrival.append(t)
        self.prompt.append(int(prompt))
        self.output.append(int(output))
        self.parent.append(int(parent))
        self.program.append(int(program))
        self.blocks.append(row)
        return len(self.arrival) - 1

    def trace(self, name: str, seed: int, tenant: list[int] | None = None) -> Trace:
        n = len(self.arrival)
        rep = LoadReport(source=f"{name}(seed={seed})", format="generated", n_read=n, n_kept=n)
        kw = {} if tenant is None else {"tenant": np.asarray(tenant, np.int64)}
        return Trace.from_columns(name=name, arrival_s=np.asarray(self.arrival),
                                  packed=pack_blocks(self.blocks, n), sort=True, report=rep,
                                  prompt_tokens=np.asarray(self.prompt, np.int64),
                                  output_tokens=np.asarray(self.output, np.int64),
                                  parent=np.asarray(self.parent, np.int64),
                                  program_id=np.asarray(self.program, np.int64),
                                  block_tokens=self.bt, **kw)


def _starts(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    if not (np.isfinite(rate_per_s) and rate_per_s > 0):
        raise TraceError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise TraceError(f"n_programs must be an integer >= 1, got {n!r}")
    t = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
    return t - t[0]


def _sharegpt(b: _Builder, rng: np.random.Generator, p: int, t0: float, cv: float) -> None:
    s = AUTELLIX_STATS["sharegpt"]
    k = int(_n_calls(rng, s["calls"], s["max_calls"], 1)[0])
    pre = _lognormal(rng, s["prefill"], cv, k, hi=8192)
    dec = _lognormal(rng, s["decode"], cv, k, hi=4096)
    parent = -1
    for j in range(k):  # per-call tokens are new tokens: no shared stream
        parent = b.add(t0 + 1e-6 * j, int(pre[j]), int(dec[j]), parent, p, [])


def _react(b: _Builder, rng: np.random.Generator, p: int, t0: float, cv: float) -> None:
    s = AUTELLIX_STATS["bfcl"]
    k = int(_n_calls(rng, s["calls"], s["max_calls"], 1)[0])
    dec = _lognormal(rng, s["decode"], cv, k, hi=2048)
    # a system-and-tools prompt of REACT_BASE_TOKENS, then each step appends its output and
    # an observation; with geometric call counts of mean m the mean prefill per call is
    # base + step (m - 1), so the observation's mean makes it the paper's 735
    obs_mean = max((s["prefill"] - REACT_BASE_TOKENS) / (s["calls"] - 1) - s["decode"], 1.0)
    base = _lognormal(rng, REACT_BASE_TOKENS, cv, 1)[0]
    obs = _lognormal(rng, obs_mean, cv, k, hi=2048)
    stream: list[int] = []
    prompt, parent = int(base), -1
    for j in range(k):
        parent = b.add(t0 + 1e-6 * j, prompt, int(dec[j]), parent, p, stream)
        prompt += int(dec[j]) + int(obs[j])


def _lats(b: _Builder, rng: np.random.Generator, p: int, t0: float, cv: float,
          width: int) -> None:
    s = AUTELLIX_STATS["lats"]
    n_calls = int(s["calls"])
    # each expansion samples `width` children of one selected node (LATS samples n = 5);
    # a child's prompt is its parent's context plus the parent's output
    base = int(_lognormal(rng, LATS_BASE_SHARE * s["prefill"], cv, 1)[0])
    ctx = [base]
    streams: list[list[int]] = [[]]
    idx = [b.add(t0, base, int(_lognormal(rng, s["decode"], cv, 1)[0]), -1, p, streams[0])]
    depth = [0]
    leaf = [True]
    while len(idx) < n_calls:
        # expand a leaf, preferring shallow ones so the tree's mean context stays at the
        # paper's mean prefill (UCT explores broadly before it goes deep)
        cand = np.flatnonzero(leaf)
        w = np.exp(-np.asarray(depth, float)[cand])
        sel = int(cand[rng.choice(cand.size, p=w / w.sum())])
        leaf[sel] = False
        par_out = b.output[idx[sel]]
        for _ in range(min(width, n_calls - len(idx))):
            c_prompt = ctx[sel] + par_out
            st = list(streams[sel])
            i = b.add(t0 + 1e-6 * (depth[sel] + 1), c_prompt,
                      int(_lognormal(rng, s["decode"], cv, 1)[0]), idx[sel], p, st)
            idx.append(i)
            ctx.append(c_prompt)
            streams.append(st)
            depth.append(depth[sel] + 1)
            leaf.append(True)


def _generate(kind: str, n_programs: int, rate_per_s: float, seed: int, cv: float,
              block_tokens: int, width: int = 5) -> Trace:
    rng = np.random.default_rng(seed)
    starts = _starts(n_programs, rate_per_s, rng)
    b = _Builder(block_tokens)
    kinds = (["sharegpt", "bfcl", "lats"] * n_programs)[:n_programs] if kind == "mixed" \
        else [kind] * n_programs
    if kind == "mixed":
        rng.shuffle(kinds)
    tenant: list[int] = []
    for p, (t0, k) in enumerate(zip(starts.tolist(), kinds)):
        before = len(b.arrival)
        if k == "sharegpt":
            _sharegpt(b, rng, p, t0, cv)
        elif k == "bfcl":
            _react(b, rng, p, t0, cv)
        else:
            _lats(b, rng, p, t0, cv, width)
        tenant.extend([("sharegpt", "bfcl", "lats").index(k)] * (len(b.arrival) - before))
    return b.trace(f"autellix-{kind}", seed, tenant)


def sharegpt_programs(n_programs: int, rate_per_s: float, *, seed: int = 0, cv: float = 1.0,
                      block_tokens: int = 16) -> Trace:
    """ShareGPT conversations as programs: Poisson program arrivals at ``rate_per_s``; a
    geometric number of calls (mean 6.66, at most 80) in a chain, each with log-normal
    prefill (mean 256) and decode (mean 277) tokens of coefficient of variation ``cv``
    (assumed). ``tenant`` is 0."""
    return _generate("sharegpt", n_programs, rate_per_s, seed, cv, block_tokens)


def react_programs(n_programs: int, rate_per_s: float, *, seed: int = 0, cv: float = 1.0,
                   block_tokens: int = 16) -> Trace:
    """BFCL ReAct agents: a chain of a geometric number of calls (mean 10.75, at most 70);
    call ``j``'s prompt is the program's system-and-tools prompt plus every earlier step
    (its output and an observation of the same mean size), so the mean prefill is the
    paper's 735 tokens and the calls of one program share their prefix; decode mean 34.
    ``tenant`` is 1."""
    return _generate("bfcl", n_programs, rate_per_s, seed, cv, block_tokens)


def lats_programs(n_programs: int, rate_per_s: float, *, seed: int = 0, cv: float = 1.0,
                  width: int = 5, block_tokens: int = 16) -> Trace:
    """LATS tree search: 159 calls per program in a tree; each expansion releases
    ``width`` parallel children of one node (their prompt: the node's context plus its
    output, shared as a prefix), shallow nodes selected more often; decode mean 73 tokens.
    ``tenant`` is 2."""
    return _generate("lats", n_programs, rate_per_s, seed, cv, block_tokens, width)


def mixed_programs(n_programs: int, rate_per_s: float, *, seed: int = 0, cv: float = 1.0,
                   block_tokens: int = 16) -> Trace:
    """One third each of ShareGPT, ReAct and LATS programs, in random order; ``tenant``
    names the kind (0, 1, 2)."""
    return _generate("mixed", n_programs, rate_per_s, seed, cv, block_tokens)


def program_stats(trace: Trace) -> dict[str, float]:
    """Mean calls per program and mean prefill / decode tokens per call of ``trace``."""
    pid = np.asarray(trace.program_id)
    return {"programs": float(np.unique(pid).size),
            "calls_per_program": float(pid.size / np.unique(pid).size),
            "max_calls": float(np.bincount(pid).max()),
            "prefill": float(np.mean(trace.prompt_tokens)),
            "decode": float(np.mean(trace.output_tokens))}
