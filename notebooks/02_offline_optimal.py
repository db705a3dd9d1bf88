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
# # Offline optima and lower bounds
#
# How far is a serving policy from the best possible? lpserve answers with three tools:
#
# 1. the **hindsight-optimal scheduling IP** of Jaillet et al. (`models/schedule-ip.md`),
#    exact for small instances of the round model (one time unit per batch, KV memory $M$);
# 2. **lower bounds that scale**: its LP relaxation, a memory-area bound, and a bound for the
#    real GPU cost model that holds for every policy the simulator runs
#    (`models/lower-bounds.md`);
# 3. **routing LPs** whose solutions and dual prices export as routers
#    (`models/routing-lp.md`).

# %% tags=["parameters"]
# Parameters: number of zero-arrival instances for the MC-SF comparison and their size.
N_TRIALS = 8
N_REQUESTS = 7
SEED = 0

# %%
import numpy as np
import pandas as pd

import lpserve as lp
from lpserve.instance import load_instance
from lpserve.opt.exact import KVProblem, kv_optimal
from lpserve.opt.mcsf_ref import mcsf_latency
from lpserve.opt.routing_lp import export_fluid

# %% [markdown]
# ## 1. A certified instance
#
# `instances/tiny` has seven requests and 12 tokens of KV memory. Its optimum is recorded in
# `instance.toml` (like MIPLIB's `.solu`) and re-checked by the test suite. The IP, a dynamic
# program over rounds, and the three bounds:

# %%
inst, spec = load_instance("tiny")
rows = []
for name in ("schedule-ip", "schedule-lp", "schedule-area", "cost-bound"):
    sol = lp.solve(name, inst, time_limit_s=60)
    rows.append({"formulation": name, "status": sol.status.value, "objective": sol.objective,
                 "bound": sol.bound, "wall_s": round(sol.wall_s, 3),
                 "certified": spec["optimal"][name]})
dp_value, dp_start = kv_optimal(KVProblem.from_instance(inst))
print("dynamic program:", dp_value, "start rounds", dp_start.tolist())
pd.DataFrame(rows)

# %% [markdown]
# ## 2. MC-SF against the hindsight optimum
#
# Jaillet et al. report that with every request arriving at time 0, MC-SF (shortest
# predicted output first, admitted only if memory stays within $M$ until the predicted
# completions) is on average within 0.5 % of the optimum at $n = 40$–$60$. At the reduced
# size HiGHS proves optimal here, the mean ratio is a few percent
# (`tests/slow/test_opt_mcsf.py` runs 20 instances at $n = 8$).

# %%
rng = np.random.default_rng(SEED)
ratios = []
for _ in range(N_TRIALS):
    M = int(rng.integers(15, 26))
    s = rng.integers(1, 4, N_REQUESTS)
    o = np.array([rng.integers(1, M - x + 1) for x in s])
    tr = lp.Trace.from_arrays(arrival_s=np.zeros(N_REQUESTS), prompt_tokens=s, output_tokens=o)
    case = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       cost=lp.UnitRoundCost(memory_tokens=M))
    opt = lp.solve("schedule-ip", case, time_limit_s=60)
    ratios.append(mcsf_latency(KVProblem.from_instance(case)) / opt.objective)
ratios = np.array(ratios)
print(f"MC-SF / OPT: mean {ratios.mean():.4f}, max {ratios.max():.4f}, "
      f"optimal in {(ratios <= 1 + 1e-12).sum()} of {ratios.size}")

# %% [markdown]
# ## 3. Bounds and routing on the bundled trace
#
# The cost-model bound needs no solver: each request needs its prefill (at the best
# per-token rate, with every reusable prefix cached) and its decode iterations alone, and
# the cluster's KV memory bounds how fast requests can finish together. The fluid LP splits
# request classes over replicas; its dual prices say which resource binds.

# %%
trace = lp.bundled_trace()
cluster = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=4)
big = lp.Instance(trace=trace, cluster=cluster)
bound = lp.solve("cost-bound", big)
fluid = lp.solve("routing-fluid", big)
print(f"cost-model bound: {bound.bound:.1f} s total e2e, {bound.info['mean_e2e_lb_s']:.3f} s "
      f"mean over {bound.info['n_requests']} requests")
print(f"fluid LP: {fluid.status.value}, {fluid.info['n_classes']} classes, objective "
      f"{fluid.objective:.2f} request-s/s")
pd.DataFrame({k: fluid.dual[k] for k in ("prefill", "decode", "gpu", "kv")})

# %% [markdown]
# ## 4. Routers against the bound in the simulator
#
# The exported dual-index router scores each replica by expected latency + dual prices x
# resource use + live queue. With identical replicas and a light load no capacity row binds,
# so it reduces to join-the-shortest-queue; the randomized fluid split pays for its
# randomness. The engine rejects the prompts above its token budget, so the bound is taken
# over the requests it serves.

# %%
base = lp.make_policy("vllm")
policies = {
    "round robin": base,
    "JSQ": lp.make_policy("vllm+least-outstanding"),
    "power of two": lp.make_policy("vllm+power-of-two"),
    "LP dual index": base.with_(router=export_fluid(fluid, big), name="lp-index"),
    "LP fluid split": base.with_(router=export_fluid(fluid, big, kind="split"), name="lp-split"),
}
rows, served_bound = [], None
for name, pol in policies.items():
    df = lp.simulate(big, pol, seed=0).requests
    fin = df[df["status"] == "finished"]
    if served_bound is None:
        idx = fin["request"].to_numpy()
        sub = lp.Trace.from_arrays(arrival_s=trace.arrival_s[idx],
                                   prompt_tokens=trace.prompt_tokens[idx],
                                   output_tokens=trace.output_tokens[idx])
        served_bound = lp.solve("cost-bound", big.with_(trace=sub)).bound
    rows.append({"router": name, "served": len(fin), "mean_e2e_s": fin["e2e_s"].mean(),
                 "total_over_bound": fin["e2e_s"].sum() / served_bound})
pd.DataFrame(rows)
