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
# # Competitive ratios of online schedulers
#
# Each scheduler in `lpserve.policies` that claims a bound points at a file in `proofs/`.
# This notebook measures how close the bounds are on random instances, and compares the
# schedulers lpserve adds beyond the published systems with their parents:
#
# 1. classical single-machine bounds: processor sharing against SPT (ratio
#    $\le 2 - 2/(n+1)$), SETF with speed $1+\epsilon$ against SRPT ($\le 1 + 1/\epsilon$);
# 2. MC-SF against the hindsight optimum of the KV round model (Jaillet et al.), and the
#    adversary that makes every deterministic online algorithm $\Omega(\sqrt n)$-competitive;
# 3. A_max and A_min (Chen, Ye, Zhou) as the prediction intervals widen;
# 4. skip-join on predicted service vs FastServe's skip-join, the adaptive starvation
#    threshold vs the fixed one, and PLAS × MLFQ vs PLAS, in the simulator on Llama-2-70B
#    (2 × A100-80GB, TP2).

# %% tags=["parameters"]
# Parameters. FULL = True runs the full-size version (several minutes); the default is
# the reduced size that runs in under two minutes.
FULL = False
SEED = 0
N_RANDOM = 400 if FULL else 100          # random instances per classical bound
N_IP = 40 if FULL else 8                 # MC-SF vs IP optimum instances per arrival model
N_IP_REQUESTS = 8 if FULL else 6
N_TRACE = 600 if FULL else 150           # Azure requests for the end-to-end comparison
N_PROGRAMS = 120 if FULL else 40

# %%
import numpy as np

import lpserve as lp
from lpserve.policies.predictors import IntervalClasses
from lpserve.policies.schedulers import single_machine_flow_times
from lpserve.trace import generate as G

rng = np.random.default_rng(SEED)

# %% [markdown]
# ## 1. Classical bounds (proofs/sched-round-robin.md, proofs/sched-setf-speed.md)

# %%
ps_ratio, ps_bound = [], []
for _ in range(N_RANDOM):
    n = int(rng.integers(2, 12))
    p = rng.integers(1, 20, n).astype(float)
    ps = single_machine_flow_times("ps", np.zeros(n), p).sum()
    spt = np.cumsum(np.sort(p)).sum()
    ps_ratio.append(ps / spt)
    ps_bound.append(2 - 2 / (n + 1))
ps_ratio, ps_bound = np.array(ps_ratio), np.array(ps_bound)
print(f"PS / OPT: mean {ps_ratio.mean():.3f}, max {ps_ratio.max():.3f}; "
      f"max ratio / bound {np.max(ps_ratio / ps_bound):.3f} (must be <= 1)")
assert np.all(ps_ratio <= ps_bound + 1e-9)

for eps in (0.1, 0.5, 1.0):
    r = []
    for _ in range(N_RANDOM // 2):
        n = int(rng.integers(2, 30))
        size = np.ceil(rng.pareto(1.5, n) + 1)
        rel = np.sort(rng.integers(0, 3 * n, n)).astype(float)
        r.append(single_machine_flow_times("setf", rel, size, speed=1 + eps).sum()
                 / single_machine_flow_times("srpt", rel, size).sum())
    r = np.array(r)
    print(f"SETF(speed {1 + eps:.1f}) / SRPT: mean {r.mean():.3f}, max {r.max():.3f}, "
          f"bound {1 + 1 / eps:.1f}")
    assert r.max() <= 1 + 1 / eps + 1e-9

# %% [markdown]
# ## 2. MC-SF against the hindsight optimum, and the lower-bound adversary
#
# The simulator with `UnitRoundCost`, one token per KV block and mixed batching is the round
# model, so `mcsf-oracle` here is MC-SF exactly. The paper reports mean ratios of about 1.005
# (all arrivals at 0) and 1.047 (Poisson) at n = 40–60; HiGHS limits us to smaller n.

# %%
def unit_instance(a, s, o, M):
    tr = lp.Trace.from_arrays(arrival_s=np.asarray(a, float), prompt_tokens=s, output_tokens=o)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=int(M)))


def tel(res):
    a = res.arrays
    return float(np.sum(a["finish_s"] - a["arrival_s"]))


for poisson in (False, True):
    ratios = []
    for _ in range(N_IP):
        M = int(rng.integers(15, 26))
        s = rng.integers(1, 4, N_IP_REQUESTS)
        o = np.array([rng.integers(1, M - x + 1) for x in s])
        a = (np.ceil(np.cumsum(rng.exponential(1 / rng.uniform(0.5, 1.5), s.size)))
             if poisson else np.zeros(s.size))
        inst = unit_instance(a, s, o, M)
        sol = lp.solve("schedule-ip", inst, time_limit_s=60)
        assert sol.status == lp.Status.OPTIMAL, sol.message
        ratios.append(tel(lp.simulate(inst, "mcsf-oracle")) / sol.objective)
    ratios = np.array(ratios)
    print(f"MC-SF / OPT ({'Poisson' if poisson else 'all at 0'}, n={N_IP_REQUESTS}): "
          f"mean {ratios.mean():.4f}, max {ratios.max():.4f}, optimal in "
          f"{int(np.sum(ratios <= 1 + 1e-9))}/{ratios.size}")


# %%
def adversary_ratio(n: int, policy: str) -> float:
    """proofs/sched-kv-lower-bound.md: a long request, then n short ones one round after
    the policy starts it; ratio against holding the long one back."""
    ell = int(np.ceil(np.sqrt(n)))
    M = n * (ell + 1)
    policy = lp.make_policy(policy, max_num_batched_tokens=2 * M, watermark=0.0)
    alone = lp.simulate(unit_instance([0], [M - ell], [ell], M), policy)
    t0 = int(alone.arrays["first_scheduled_s"][0])
    a = [0] + [t0 + 1] * n
    s = [M - ell] + [ell] * n
    o = [ell] + [1] * n
    alg = tel(lp.simulate(unit_instance(a, s, o, M), policy))
    hold = n * 1 + (t0 + 2 + ell)
    return alg / hold


for policy in ("mcsf-oracle", "vllm-v0"):
    print(policy, {n: round(adversary_ratio(n, policy), 2) for n in (4, 16, 64, 256)},
          "(sqrt n:", [2, 4, 8, 16], ")")

# %% [markdown]
# ## 3. A_max and A_min as intervals widen
#
# Equal prompts, all requests at 0, intervals from geometric classes of ratio $1/\alpha$
# (the truth always inside). The hindsight benchmark H-SF is MC-SF with true lengths.

# %%
for alpha in (0.5, 0.25, 0.125, 0.0625):
    ra, rm = [], []
    for _ in range(10):
        n, M = 40, 400
        o = rng.integers(1, 150, n)
        inst = unit_instance(np.zeros(n), np.full(n, 8), o, M)
        hsf = tel(lp.simulate(inst, "mcsf-oracle"))
        pr = IntervalClasses(alpha=alpha)
        ra.append(tel(lp.simulate(inst, "a-max", predictor=pr)) / hsf)
        rm.append(tel(lp.simulate(inst, "a-min", predictor=pr)) / hsf)
    print(f"alpha {alpha:.4f}: A_max / H-SF mean {np.mean(ra):.3f}, "
          f"A_min / H-SF mean {np.mean(rm):.3f}")

# %% [markdown]
# ## 4. Beyond the published systems, each against its parent
#
# Azure conversation trace at high load and a generated agentic workload on Llama-2-70B,
# 2 × A100-80GB (TP2). Predictions for the predicted-service variant come from
# `IntervalClasses(alpha=0.5)`.

# %%
cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-70b", tp=2, replicas=1)
tr = lp.bundled_trace()
tr = tr.take(np.arange(min(N_TRACE, len(tr)))).with_rate(2.5)
inst = lp.Instance(trace=tr, cluster=cl)
pairs = [("fastserve", "mlfq-predicted"), ("fastserve", "fastserve-adaptive"),
         ("vllm-v0", "fastserve")]
for parent, child in pairs:
    out = []
    for name in (parent, child):
        pred = IntervalClasses(alpha=0.5) if name == "mlfq-predicted" else None
        e = lp.simulate(inst, name, seed=SEED, predictor=pred).summary()["e2e_s"]
        out.append(f"{name} mean {e['mean']:.1f} s / p99 {e['p99']:.1f} s")
    print(" vs ".join(out))

# %%
prog = G.agentic_programs(N_PROGRAMS, program_arrivals=G.Poisson(1.0),
                          stages=G.Uniform(1, 6), fanout=G.Uniform(1, 3),
                          prompt=G.LogNormal(600, 1.0), output=G.LogNormal(120, 1.5),
                          seed=SEED)
pinst = lp.Instance(trace=prog, cluster=cl)


def program_latency(res):
    a = res.arrays
    pid = prog.program_id
    return np.array([np.nanmax(a["finish_s"][pid == p]) - a["arrival_s"][pid == p].min()
                     for p in np.unique(pid)])


for name in ("vllm-v0", "mlfq", "plas", "atlas", "plas-mlfq"):
    lat = program_latency(lp.simulate(pinst, name, seed=SEED))
    print(f"{name:10s} program latency mean {lat.mean():7.1f} s, p99 "
          f"{np.percentile(lat, 99):7.1f} s")
