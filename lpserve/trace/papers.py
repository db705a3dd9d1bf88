"""Workloads generated to the statistics the seed papers report (layer 0: numpy only).

Every generator is seeded and returns a :class:`~lpserve.trace.Trace`; the statistics it
is built to and their sources are in its docstring. Where a paper gives a mean but no
spread, the spread is a stated assumption (a keyword argument), never a fitted value.

==========================  ===============================================================
:func:`sharegpt_like`       single-turn chat requests with ShareGPT's heavy-tailed prompt
                            and output lengths, Poisson arrivals (vLLM, FastServe)
:func:`alpaca_like`         short instruction-following requests with Alpaca's mean lengths
:func:`azure_code_like`     bursty code-completion traffic with the Azure code trace's lengths
                            and mean rate (a stand-in when the trace itself is absent)
:func:`jitserve_mix`        streaming, deadline and compound requests in one stream (tenants
                            0, 1, 2), for service goodput under per-kind SLOs (JITServe)
==========================  ===============================================================

The agentic program workloads of Autellix are in :mod:`lpserve.trace.programs`.
"""
from __future__ import annotations

import numpy as np

from lpserve.trace import LoadReport, Trace
from lpserve.trace import generate as G

#: first turns of ShareGPT V3 (cl100k tokens, 11,820 conversations of the shared
#: ``sharegpt_v3_turn_lengths_part1.csv.gz``, turn 0, zero-length turns dropped): prompt
#: mean 194.2 / median 25 / p99 2,517 tokens (CV 8.2), response mean 305.4 / median 272.5
#: / p99 770 (CV 0.96). The vLLM paper (Kwon et al., SOSP 2023, Fig. 11) reports means of
#: 161.3 input and 338.0 output tokens for its ShareGPT sample (OPT tokenizer).
SHAREGPT_FIRST_TURN = {"prompt_mean": 194.2, "prompt_cv": 8.2, "output_mean": 305.4,
                       "output_cv": 0.96}
#: arXiv summarization (Llama-2 tokenizer, vidur's table in the shared data): prefill mean
#: 2,588 (std 793), decode mean 291 (std 564)
ARXIV_SUMMARIZATION = {"prompt_mean": 2588.0, "prompt_cv": 0.31, "output_mean": 291.0,
                       "output_cv": 1.94}
#: Alpaca in the vLLM paper (Fig. 11): 19.31 input and 58.45 output tokens on average;
#: the paper gives no spread
ALPACA_MEANS = {"prompt_mean": 19.31, "output_mean": 58.45}


def sharegpt_like(n_requests: int, rate_per_s: float, *, seed: int = 0,
                  max_prompt_tokens: int = 2048, max_output_tokens: int = 2048,
                  prompt_cv: float = SHAREGPT_FIRST_TURN["prompt_cv"],
                  output_cv: float = SHAREGPT_FIRST_TURN["output_cv"]) -> Trace:
    """``n_requests`` single-turn chat requests, Poisson at ``rate_per_s``, with log-normal
    prompt and output lengths of ShareGPT's first turns (:data:`SHAREGPT_FIRST_TURN`:
    means 194 and 305 tokens, CVs 8.2 and 0.96), capped at ``max_prompt_tokens`` and
    ``max_output_tokens`` (OPT's context is 2,048 tokens; the vLLM and FastServe
    evaluations drop longer requests)."""
    s = SHAREGPT_FIRST_TURN
    return G.synthetic(
        n_requests, arrivals=G.Poisson(rate_per_s=rate_per_s),
        prompt=G.LogNormal(mean=s["prompt_mean"], cv=prompt_cv, max_tokens=max_prompt_tokens),
        output=G.LogNormal(mean=s["output_mean"], cv=output_cv,
                           max_tokens=max_output_tokens),
        seed=seed, name="sharegpt-like")


def alpaca_like(n_requests: int, rate_per_s: float, *, seed: int = 0, cv: float = 1.0,
                max_tokens: int = 2048) -> Trace:
    """``n_requests`` instruction-following requests, Poisson at ``rate_per_s``, log-normal
    with Alpaca's means (:data:`ALPACA_MEANS`: 19.3 input, 58.5 output tokens) and the
    assumed coefficient of variation ``cv`` for both (the paper gives none)."""
    a = ALPACA_MEANS
    return G.synthetic(
        n_requests, arrivals=G.Poisson(rate_per_s=rate_per_s),
        prompt=G.LogNormal(mean=a["prompt_mean"], cv=cv, max_tokens=max_tokens),
        output=G.LogNormal(mean=a["output_mean"], cv=cv, max_tokens=max_tokens),
        seed=seed, name="alpaca-like")


def length_stats(trace: Trace) -> dict[str, float]:
    """Mean and CV of the prompt and output lengths of ``trace`` (tokens)."""
    p = np.asarray(trace.prompt_tokens, np.float64)
    o = np.asarray(trace.output_tokens, np.float64)
    return {"prompt_mean": float(p.mean()), "prompt_cv": float(p.std() / p.mean()),
            "output_mean": float(o.mean()), "output_cv": float(o.std() / o.mean())}


def jitserve_mix(n_requests: int, rate_per_s: float, *, seed: int = 0,
                 shares: tuple[float, float, float] = (0.5, 0.3, 0.2),
                 calls_per_compound: int = 3) -> Trace:
    """A stream of three request kinds (JITServe's service classes), Poisson at
    ``rate_per_s`` (a compound request counts as one arrival), ``tenant`` naming the kind:

    * 0 *streaming*: a chat turn with :data:`SHAREGPT_FIRST_TURN` lengths (prompt <= 2,048,
      output <= 1,024 tokens);
    * 1 *deadline*: a summarization job with :data:`ARXIV_SUMMARIZATION` lengths (prompt
      <= 4,096, output <= 1,024);
    * 2 *compound*: a chain of ``calls_per_compound`` agent calls (prompt mean 735, output
      mean 34 tokens: Autellix's BFCL statistics), each released when the previous one
      finishes, one ``program_id`` per compound request.

    ``shares`` are the kinds' shares of the arrivals. The SLO of each kind is the
    caller's (``Instance.tiers`` by tenant)."""
    if len(shares) != 3 or min(shares) < 0 or not np.isclose(sum(shares), 1.0):
        raise ValueError(f"jitserve_mix: shares must be three numbers >= 0 summing to 1, "
                         f"got {shares!r}")
    if calls_per_compound < 1:
        raise ValueError(f"jitserve_mix: calls_per_compound must be >= 1, got "
                         f"{calls_per_compound!r}")
    rng = np.random.default_rng(seed)
    starts = G.Poisson(rate_per_s).sample(n_requests, rng)
    kind = rng.choice(3, size=n_requests, p=np.asarray(shares, float))
    sg, ax = SHAREGPT_FIRST_TURN, ARXIV_SUMMARIZATION
    draws = {
        0: (G.LogNormal(sg["prompt_mean"], sg["prompt_cv"], 2048),
            G.LogNormal(sg["output_mean"], sg["output_cv"], 1024)),
        1: (G.LogNormal(ax["prompt_mean"], ax["prompt_cv"], 4096),
            G.LogNormal(ax["output_mean"], ax["output_cv"], 1024)),
        2: (G.LogNormal(735.0, 1.0, 4096), G.LogNormal(34.0, 1.0, 512)),
    }
    arrival, prompt, output, tenant, parent, program = [], [], [], [], [], []
    n_prog = 0
    for t, k in zip(starts.tolist(), kind.tolist()):
        calls = calls_per_compound if k == 2 else 1
        p_draw, o_draw = draws[k]
        par = -1
        for j in range(calls):
            arrival.append(t + 1e-6 * j)
            prompt.append(int(p_draw.sample(1, rng)[0]))
            output.append(int(o_draw.sample(1, rng)[0]))
            tenant.append(k)
            parent.append(par)
            program.append(n_prog if k == 2 else -1)
            if k == 2:
                par = len(arrival) - 1
        n_prog += int(k == 2)
    n = len(arrival)
    rep = LoadReport(source=f"jitserve-mix(seed={seed})", format="generated", n_read=n,
                     n_kept=n)
    return Trace.from_columns(name="jitserve-mix", arrival_s=np.asarray(arrival),
                              packed=None, sort=True, report=rep,
                              prompt_tokens=np.asarray(prompt, np.int64),
                              output_tokens=np.asarray(output, np.int64),
                              tenant=np.asarray(tenant, np.int64),
                              parent=np.asarray(parent, np.int64),
                              program_id=np.asarray(program, np.int64))


#: Azure LLM inference trace 2023, code (the shared 30-minute slice): input mean 2,028 /
#: median 1,460 tokens, output mean 27.4 / median 13, 5,740 requests in 1,788 s
AZURE_CODE = {"prompt_mean": 2028.0, "prompt_median": 1460.0, "output_mean": 27.4,
              "output_median": 13.0, "rate_per_s": 5740 / 1788.4}


def azure_code_like(n_requests: int, *, seed: int = 0,
                    rates_per_s: tuple[float, float] = (1.5, 15.0),
                    mean_dwell_s: tuple[float, float] = (50.0, 8.0)) -> Trace:
    """Bursty code-completion requests: log-normal lengths with the Azure code trace's
    means and medians (:data:`AZURE_CODE`; CVs 0.96 and 1.99 follow from them), capped at
    8,192 and 2,048 tokens, and a two-state MMPP of ``rates_per_s`` with ``mean_dwell_s``
    (assumed; its long-run rate 3.4 req/s is near the trace's 3.2 and its bursts make the
    per-second counts far from Poisson, as the trace's are)."""
    a = AZURE_CODE

    def cv(mean: float, median: float) -> float:
        return float(np.sqrt(np.expm1(2.0 * np.log(mean / median))))

    return G.synthetic(
        n_requests, arrivals=G.MMPP(rates_per_s, mean_dwell_s),
        prompt=G.LogNormal(a["prompt_mean"], cv(a["prompt_mean"], a["prompt_median"]), 8192),
        output=G.LogNormal(a["output_mean"], cv(a["output_mean"], a["output_median"]), 2048),
        seed=seed, name="azure-code-like")
