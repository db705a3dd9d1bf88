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
# # Speculation, rebalancing and KV compression against their baselines
#
# Three decisions beyond routing, batching, eviction and prefill control, each in the
# simulator against the baseline an engine uses today:
#
# 1. **Speculative decoding** (`models/speculative-decoding.md`): never speculate, always
#    k drafts, a UCB1 bandit per (request class, batch size) (`proofs/speculation-ucb-regret.md`),
#    optimistic per-class acceptance rates (`proofs/speculation-acceptance-ucb.md`) and a
#    clairvoyant per-step oracle, as the load rises;
# 2. **Load rebalancing** (`models/rebalancing.md`): no migration vs Llumnix-style freeness
#    vs the migration assignment MILP under a bursty load;
# 3. **KV compression before a swap** (`models/kv-compression-swap.md`): recompute vs swap
#    vs compress-and-swap as PCIe bandwidth falls, and where swapping tips over.

# %% tags=["parameters"]
# Parameters. FULL = True runs the benchmark sizes (several minutes); the default is the
# reduced size that runs in about two minutes.
FULL = False
SEED = 0
N_SPEC = 500 if FULL else 150            # Azure requests for speculation
SPEC_LOADS = [0.25, 1.0, 2.0, 4.0] if FULL else [0.25, 2.0]
N_MIG = 600 if FULL else 300             # requests per bursty trace for rebalancing
MIG_SEEDS = 3 if FULL else 1
N_SWAP = 200 if FULL else 120            # Azure requests for the swap sweep
PCIE_EFFS = [1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01]

# %%
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import lpserve as lp
from lpserve.cost.preemption import tipping_bandwidth_gbps

# %% [markdown]
# ## 1. Speculative decoding
#
# Llama-2-70B on 4 × A100-80GB drafted by Llama-2-7B on the same GPUs (its weights and KV
# shrink the KV pool). Two request classes (tenants) with per-token acceptance 0.8 and
# 0.4. Speculation helps while batches are small and costs throughput once batched
# verification is compute-bound.
# %%
from lpserve.policies.speculation import (
    AcceptanceUCBSpeculation,
    FixedSpeculation,
    NeverSpeculate,
    OracleSpeculation,
    UCBSpeculation,
)

RATES = {0: 0.8, 1: 0.4}
DRAFT = "llama-2-7b"
tr = lp.bundled_trace()
tr = tr.take(np.flatnonzero(tr.prompt_tokens <= 4096)[:N_SPEC])
spec_trace = lp.Trace.from_arrays(
    arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens, output_tokens=tr.output_tokens,
    tenant=np.random.default_rng(SEED).integers(0, 2, len(tr)), name="azure-two-classes")
deciders = {
    "never": lambda: NeverSpeculate(DRAFT, RATES),
    "fixed k=2": lambda: FixedSpeculation(2, DRAFT, RATES),
    "ucb": lambda: UCBSpeculation(DRAFT, RATES, max_k=4),
    "acc-ucb": lambda: AcceptanceUCBSpeculation(DRAFT, RATES, max_k=4),
    "oracle": lambda: OracleSpeculation(DRAFT, RATES, max_k=4),
}
spec = {}
for rate in SPEC_LOADS:
    inst = lp.Instance(trace=spec_trace.with_rate(rate),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-70b", tp=4))
    for name, make in deciders.items():
        res = lp.simulate(inst, lp.make_policy("vllm-v0", speculation=make()), seed=SEED)
        a, s = res.arrays, res.summary()
        span = float(np.nanmax(a["finish_s"]) - a["arrival_s"].min())
        spec[rate, name] = (a["generated_tokens"].sum() / span, s["tpot_s"]["p50"],
                            s["e2e_s"]["mean"])
for rate in SPEC_LOADS:
    print(f"{rate:g} req/s: " + "; ".join(
        f"{n} {spec[rate, n][0]:.0f} tok/s, TPOT p50 {1e3 * spec[rate, n][1]:.0f} ms"
        for n in deciders))

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
for name in deciders:
    ax[0].plot(SPEC_LOADS, [1e3 * spec[r, name][1] for r in SPEC_LOADS], "o-", label=name)
    ax[1].plot(SPEC_LOADS, [spec[r, name][0] for r in SPEC_LOADS], "o-", label=name)
ax[0].set(xlabel="arrival rate (req/s)", ylabel="TPOT p50 (ms)", xscale="log")
ax[1].set(xlabel="arrival rate (req/s)", ylabel="output tokens/s", xscale="log")
ax[0].legend()
fig.tight_layout()

# %% [markdown]
# At light load every speculating decider lowers TPOT against `never`; at high load a
# fixed k loses throughput and the oracle backs off to (almost) never speculating. UCB1
# learns per (context, arm) and is still exploring at these run lengths; the optimistic
# acceptance-rate decider learns one rate per class from every drafted token and tracks
# the clairvoyant oracle (see `benchmarks/README.md` for the full-size figures).

# %% [markdown]
# ## 2. Load rebalancing by live migration
#
# Four Llama-2-7B replicas with a small KV pool behind a load-blind router (round robin),
# under bursty arrivals (Gamma renewal, CV 3) with long outputs: some replicas fill their
# KV while others idle. A rebalancer is asked every 0.5 s which decoding requests to move
# (stop-and-copy of their KV over the replica link, priced by the cost model):
# Llumnix-style freeness (move from the least to the most free replica) or the migration
# assignment MILP (`models/rebalancing.md`), against no migration.

# %%
from lpserve.trace import generate as G

mig_cluster = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=4,
                         gpu_memory_fraction=0.22)
mig = {}
for seed in range(MIG_SEEDS):
    bursty = G.synthetic(N_MIG, arrivals=G.GammaRenewal(rate_per_s=6.0, cv=3.0),
                         prompt=G.Uniform(200, 1500),
                         output=G.LogNormal(mean=300, cv=1.5, max_tokens=3000), seed=seed,
                         name="gamma-cv3")
    inst = lp.Instance(trace=bursty, cluster=mig_cluster)
    for label, name in (("none", "vllm-v0"), ("llumnix", "rebalance-llumnix"),
                        ("assignment-lp", "rebalance-lp")):
        res = lp.simulate(inst, lp.make_policy(name, router="round-robin"), seed=seed)
        s = res.summary()
        mig.setdefault(label, []).append((s["ttft_s"]["mean"], s["ttft_s"]["p99"],
                                          s.get("migrations", 0), res.arrays["ttft_s"]))
for label, rows in mig.items():
    print(f"{label:<14} TTFT mean {np.mean([r[0] for r in rows]):.3f} s, "
          f"p99 {np.mean([r[1] for r in rows]):.2f} s, "
          f"migrations {np.mean([r[2] for r in rows]):.0f}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for label, rows in mig.items():
    t = np.sort(np.concatenate([r[3] for r in rows]))
    ax.plot(t, 1.0 - np.arange(t.size) / t.size, label=label)
ax.set(xscale="log", yscale="log", xlabel="TTFT (s)", ylabel="share of requests above",
       title="TTFT tail under bursty load (round robin, 4 replicas)")
ax.legend()
fig.tight_layout()

# %% [markdown]
# Over NVLink a copy takes milliseconds, so moving decoding requests off a full replica
# frees its KV for waiting requests at little cost; the MILP prices the waiting requests a
# move admits against the decode slowdown it causes at the destination, and moves more
# requests than the freeness heuristic. At the benchmark size (600 requests, 3 seeds) the
# MILP has the lowest mean and p99 TTFT in every cell over NVLink; on a slow link
# (`--link-gbps 2`) its p99 falls behind the heuristic's (`benchmarks/README.md`).

# %% [markdown]
# ## 3. Compress-and-swap and the swap tipping point
#
# FastServe-style skip-join MLFQ swaps running requests out whenever a better-ranked one
# waits. Llama-2-7B on one A100 with a small KV pool, so preemptions are frequent; the
# PCIe bandwidth is swept through the cost model's `pcie_efficiency`. Swaps here are
# reactive and serial (`transfers="serial"`, `proactive_swap=False`: vLLM v0's blocking
# swap, each copy priced inside the next iteration), so the share of busy time spent
# swapping is `swap_wait_s`; `benchmarks/seeds/fastserve.py` measures the overlapped and
# proactive modes. Below the tipping bandwidth, swapping is slower than recomputing the
# victim; compressing the KV to INT4 first (4× fewer bytes, plus a quantize pass at HBM
# speed) moves the tipping point down by about the ratio (`models/kv-compression-swap.md`
# (7)).

# %%
swap_trace = lp.bundled_trace().head(N_SWAP).rebased().with_rate(1.0)
one_way = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b").gpu.pcie_gbps / 2.0


def swap_run(eff, preemption):
    cost = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", pcie_efficiency=eff)
    inst = lp.Instance(trace=swap_trace, cost=cost, cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=0.22, host_memory_gb=64.0))
    res = lp.simulate(inst, lp.make_policy("fastserve", preemption=preemption,
                                           transfers="serial", proactive_swap=False),
                      seed=SEED)
    return res.summary()["e2e_s"]["mean"], res.stats["swap_wait_s"] / res.stats["busy_s"]


recompute_mean = swap_run(1.0, "recompute")[0]
sweep = {m: [swap_run(e, m) for e in PCIE_EFFS] for m in ("swap", "compress-swap")}
bw = [one_way * e for e in PCIE_EFFS]
for m, rows in sweep.items():
    print(m, ", ".join(f"{b:.1f} GB/s: {r[0]:.1f} s ({100 * r[1]:.0f} % swapping)"
                       for b, r in zip(bw, rows)))
print(f"recompute: {recompute_mean:.1f} s")


tips = {m: tipping_bandwidth_gbps(bw, [r[0] for r in rows], recompute_mean)
        for m, rows in sweep.items()}
print({m: round(t, 2) for m, t in tips.items()})

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for m, rows in sweep.items():
    ax.plot(bw, [r[0] for r in rows], "o-", label=m)
    if 0 < tips[m] < math.inf:
        ax.axvline(tips[m], ls=":", color=ax.lines[-1].get_color())
ax.axhline(recompute_mean, color="k", ls="--", label="recompute")
ax.set(xscale="log", yscale="log", xlabel="one-way PCIe bandwidth (GB/s)",
       ylabel="mean E2E latency (s)", title="fastserve: swap tipping point")
ax.legend()
fig.tight_layout()

# %% [markdown]
# Full-size figures for all three, with the commands that produce them, are in
# `benchmarks/README.md` (`speculation_sim.py`, `rebalancing.py`, `swap_tipping_point.py`).
