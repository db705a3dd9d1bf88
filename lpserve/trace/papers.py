"""Workloads generated to the statistics the seed papers report (layer 0: numpy only).

Every generator is seeded and returns a :class:`~lpserve.trace.Trace`; the statistics it
is built to and their sources are in its docstring. Where a paper gives a mean but no
spread, the spread is a stated assumption (a keyword argument), never a fitted value.

==========================  ===============================================================
:func:`sharegpt_like`       single-turn chat requests with ShareGPT's heavy-tailed prompt
                            and output lengths, Poisson arrivals (vLLM, FastServe)
:func:`alpaca_like`         short instruction-following requests with Alpaca's mean lengths
==========================  ===============================================================

The agentic program workloads of Autellix are in :mod:`lpserve.trace.programs`.
"""
from __future__ import annotations

import numpy as np

from lpserve.trace import Trace
from lpserve.trace import generate as G

#: first turns of ShareGPT V3 (cl100k tokens, 11,820 conversations of the shared
#: ``sharegpt_v3_turn_lengths_part1.csv.gz``, turn 0, zero-length turns dropped): prompt
#: mean 194.2 / median 25 / p99 2,517 tokens (CV 8.2), response mean 305.4 / median 272.5
#: / p99 770 (CV 0.96). The vLLM paper (Kwon et al., SOSP 2023, Fig. 11) reports means of
#: 161.3 input and 338.0 output tokens for its ShareGPT sample (OPT tokenizer).
SHAREGPT_FIRST_TURN = {"prompt_mean": 194.2, "prompt_cv": 8.2, "output_mean": 305.4,
                       "output_cv": 0.96}
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
