# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Quickstart: trace → simulate → compare
#
# A serving question in lpserve has four parts: a **trace** of requests, a **cluster**
# (GPU, LLM, tensor parallelism, replicas), an **instance** that adds latency targets, and
# **policies** (a router, a scheduler and a KV evictor driving an engine). This notebook
# loads the bundled Azure conversation trace, simulates vLLM on it, and compares the
# baseline heuristics with an LP-exported router against a lower bound that no policy can
# beat.

# %% tags=["parameters"]
# Parameters. Default: the first 120 s of the bundled trace on 2 replicas.
# Full size: DURATION_S = None (all 10 minutes, 2,867 requests).
DURATION_S = 120.0
REPLICAS = 2
LOADS = (0.5, 1.0, 1.5)  # rate scales for the robustness view
SEED = 0

# %%
import pandas as pd

import lpserve as lp
from lpserve.evaluate import BoundViolation, ClaimedBound, compare, robustness
from lpserve.evaluate.plots import plot_gap_to_bound, plot_latency_cdf, plot_latency_vs_load

pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)

# %% [markdown]
# ## 1. A trace
#
# `lp.bundled_trace()` is the first 10 minutes of the Azure LLM inference trace (2023,
# conversation). A trace is a structure of arrays sorted by arrival.

# %%
full = lp.bundled_trace()
trace = full if DURATION_S is None else full.window(0.0, DURATION_S)
print(full)
stats = trace.stats()
print(f"using {stats['n_requests']} requests over {stats['duration_s']:.0f} s "
      f"({stats['rate_per_s']:.2f} req/s); prompt tokens mean "
      f"{stats['prompt_tokens']['mean']:.0f}, output tokens mean "
      f"{stats['output_tokens']['mean']:.0f}")

# %% [markdown]
# ## 2. A cluster, its cost model and an instance
#
# The cost model gives the time of any batch (prefill chunks plus decode contexts) on the
# cluster's GPU. Here: one 512-token prefill, then a decode step of two requests.

# %%
cluster = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", tp=1, replicas=REPLICAS)
cost = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
print(f"prefill 512 tokens: {1e3 * cost.batch_time_s(prefill_tokens=[512]):.2f} ms; "
      f"decode 2 requests (700 and 1200 tokens of context): "
      f"{1e3 * cost.batch_time_s(decode_context=[700, 1200]):.2f} ms")
inst = lp.Instance(trace=trace, cluster=cluster, slo=lp.SLO(ttft_s=1.0, tpot_s=0.1))

# %% [markdown]
# ## 3. Simulate one policy
#
# `lp.simulate` runs a registered policy (or a `Policy` object) and returns per-request
# times; `summary()` uses the one definition of every metric (`lpserve.objectives`).

# %%
res = lp.simulate(inst, "vllm", seed=SEED)
s = res.summary()
print(f"finished {s['n_finished']} / {s['n_requests']}  (rejected {s['n_rejected']}: "
      f"{s['reasons']})")
pd.DataFrame({k: s[k] for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}).T

# %%
res.requests.head()

# %% [markdown]
# ## 4. Compare policies with a lower bound
#
# `compare` simulates each policy, computes the cost-model lower bound (per request: the
# prefill and decode iterations alone; plus the KV-memory term on the mean), **asserts**
# that no bound exceeds any policy's value of the same metric over the same requests, and
# returns one row per policy. `ratio_to_bound` is the mean end-to-end latency over the
# bound: 1.0 would be optimal.

# %%
policies = ["vllm", "vllm+least-outstanding", "sarathi", "lp-index"]
table = compare(inst, policies, bounds=["cost-bound"], seeds=(SEED,))
table[["policy", "kind", "ttft_s_mean", "ttft_s_p99", "tpot_s_mean", "e2e_s_mean",
       "e2e_s_p99", "goodput_rps", "bound_value", "ratio_to_bound", "e2e_s_p99_over_p50"]]

# %%
samples = table.attrs["samples"]
print(f"lower bounds over the {samples.n_common} requests every policy finished:")
pd.Series(samples.bound_values["cost-bound"])

# %%
plot_latency_cdf(table)

# %% [markdown]
# A bound that claims too much is caught: here a made-up "bound" of 100 s on the mean
# end-to-end latency.

# %%
try:
    compare(inst, ["vllm"], bounds=["cost-bound", ClaimedBound("made-up", {"e2e_s_mean": 100.0})])
except BoundViolation as exc:
    print(exc)
else:
    raise AssertionError("a bound above every simulated value must be rejected")

# %% [markdown]
# ## 5. Robustness across loads
#
# The same comparison at several arrival-rate scales: each policy's mean and spread, its
# mean and worst ratio to the bound.

# %%
cases = {f"x{x:g}": inst.with_(trace=trace.scale_rate(x)) for x in LOADS}
summary, runs = robustness(cases, policies, return_runs=True)
summary

# %%
runs["load"] = runs["instance"].str.lstrip("x").astype(float)
plot_latency_vs_load(runs, "e2e_s_mean")

# %%
plot_gap_to_bound(runs)
