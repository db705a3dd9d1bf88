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
# # The seed systems, reproduced
#
# lpserve was built from six systems papers. This notebook reruns each one's headline
# comparison on the paper's own set-up (model, GPU, workload statistics, SLOs) with
# lpserve's cost model, one figure per paper, at a reduced size; the full-size figures,
# with the paper's numbers beside lpserve's, come from `benchmarks/seeds/*.py` (the README's
# "Reproducing the seed papers" table lists them).
#
# 1. vLLM: paged KV memory against reservation for the maximum length (Orca (Max));
# 2. Sarathi-Serve and the drift-plus-penalty controller on bursty code traffic;
# 3. JITServe: service goodput of SLO-aware scheduling with imprecise output lengths;
# 4. Autellix: program-level scheduling of agentic programs;
# 5. FastServe: skip-join MLFQ against naive MLFQ and FCFS as the load rises;
# 6. MFS: the order of KV transfers on a shared prefill-to-decode link.

# %% tags=["parameters"]
# Parameters. FULL = True runs larger traces (several minutes); the default is the reduced
# size that runs in a few minutes on two cores.
FULL = False
SEED = 0
N_REQUESTS = 1200 if FULL else 300
N_PROGRAMS = 300 if FULL else 60

# %%
import matplotlib.pyplot as plt
import numpy as np

import lpserve as lp
from lpserve import objectives as obj
from lpserve.policies.disagg import link_schedule
from lpserve.policies.lyapunov import lyapunov
from lpserve.policies.predictors import NoisyOracle
from lpserve.trace import papers
from lpserve.trace import programs as P

# %% [markdown]
# ## 1. vLLM: paged KV memory (Kwon et al., SOSP 2023)
#
# OPT-13B on one A100-40GB, ShareGPT-like requests (`lpserve.trace.papers.sharegpt_like`)
# within OPT's 2,048-token context. `orca-max` reserves KV for 2,048 tokens per request at
# admission; `vllm-v0` (the vLLM the paper measured) and `vllm` (today's V1) allocate
# blocks as tokens are produced. Left: the share of the KV memory held that stores tokens
# (paper: 96.3 % paged, 20.4 % Orca (Max)). Right: latency per output token as the load
# rises (the paper's Fig. 12 metric).

# %%
OPT = lp.Cluster(gpu="a100-40gb", llm="opt-13b")
ENGINES = {"vllm-v0": lambda: lp.make_policy("vllm-v0", prefix_caching=False),
           "vllm": lambda: lp.make_policy("vllm", prefix_caching=False),
           "orca-max": lambda: lp.make_policy("orca", reserve_tokens=2048,
                                              max_model_len=2048).with_(name="orca-max")}
base = papers.sharegpt_like(N_REQUESTS, 1.0, seed=SEED, max_prompt_tokens=1024,
                            max_output_tokens=1024)


def token_share(res):
    a, st = res.arrays, res.stats
    ok = (a["status"] == "finished") & (a["preemptions"] == 0)
    span = np.nanmax(a["finish_s"]) - a["arrival_s"][0]
    held = st["kv_utilization"] * st["total_blocks"] * 16 * span
    return obj.kv_token_seconds(a["first_scheduled_s"][ok], a["first_token_s"][ok],
                                a["finish_s"][ok], a["prompt_tokens"][ok],
                                a["output_tokens"][ok]) / held


rates = [0.5, 1.0, 2.0, 3.0]
share, norm = {}, {e: [] for e in ENGINES}
for e, make in ENGINES.items():
    share[e] = token_share(lp.simulate(lp.Instance(trace=base.with_rate(1.0), cluster=OPT),
                                       make(), seed=SEED))
    for r in rates:
        a = lp.simulate(lp.Instance(trace=base.with_rate(r), cluster=OPT), make(),
                        seed=SEED).arrays
        norm[e].append(obj.normalized_latency_s(a["e2e_s"], a["output_tokens"]))
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].bar(list(share), [100 * v for v in share.values()])
ax[0].set_ylabel("KV held that stores tokens (%)")
for e, ys in norm.items():
    ax[1].plot(rates, ys, marker="o", label=e)
ax[1].set_xlabel("request rate (req/s)")
ax[1].set_ylabel("latency per output token (s)")
ax[1].set_yscale("log")
ax[1].legend()
fig.tight_layout()
{e: round(v, 3) for e, v in share.items()}

# %% [markdown]
# ## 2. Sarathi-Serve and the drift-plus-penalty controller
#
# Llama-3-8B on one H100, the Azure code trace (bursty; `papers.azure_code_like`, an MMPP
# stand-in with its lengths, when `../shared` is absent), SLO TTFT 2 s / TPOT 50 ms. `lyapunov` takes its TBT target from
# the instance's SLO (50 ms); `lyapunov@0.1s` is the fixed 0.1 s target it had before. The
# bars are goodput (requests meeting both SLOs per second) beside Sarathi's fixed budgets.

# %%
import os

code_path = os.path.join(os.environ.get("LPSERVE_SHARED", "../shared"), "traces",
                         "azure_llm_2023_code_first30min.csv.gz")
code = (lp.load_trace(code_path).head(N_REQUESTS).rebased() if os.path.exists(code_path)
        else papers.azure_code_like(N_REQUESTS, seed=SEED))
H100 = lp.Cluster(gpu="h100-sxm", llm="llama-3-8b")
code_inst = lp.Instance(trace=code, cluster=H100, slo=lp.SLO(ttft_s=2.0, tpot_s=0.05))
runs = {"lyapunov": lyapunov(), "lyapunov@0.1s": lyapunov(tbt_slo_s=0.1)}
runs.update({f"sarathi-{b}": lp.make_policy("sarathi", max_num_batched_tokens=b)
             for b in (256, 512, 1024, 2048)})
good = {k: lp.simulate(code_inst, p, seed=SEED).summary()["goodput_rps"]
        for k, p in runs.items()}
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(list(good), list(good.values()))
ax.set_ylabel("goodput (req/s)")
plt.setp(ax.get_xticklabels(), rotation=20)
fig.tight_layout()
{k: round(v, 3) for k, v in good.items()}

# %% [markdown]
# ## 3. JITServe: service goodput with imprecise output lengths
#
# One stream of streaming chat turns (SLO TTFT 1 s, TPOT 0.1 s), deadline summarization
# jobs (30 s) and compound agent requests (each call within 6 s), Llama-3.1-8B on one
# A100-80GB (`lpserve.trace.papers.jitserve_mix`). Service goodput counts the output
# tokens of requests that met their SLO (a compound request only when all its calls did).
# `sjf-predicted` and `slo-aware` read output lengths from a noisy oracle with log-normal
# error sigma 0 (exact) or 1.0.

# %%
A100 = lp.Cluster(gpu="a100-80gb", llm="llama-3.1-8b")
TIERS = (lp.Tier("streaming", lp.SLO(ttft_s=1.0, tpot_s=0.1), (0,)),
         lp.Tier("deadline", lp.SLO(e2e_s=30.0), (1,)),
         lp.Tier("compound", lp.SLO(e2e_s=6.0), (2,)))
V1 = dict(batching="decode-first", chunked_prefill=True, max_num_batched_tokens=2048,
          watermark=0.0)
mix = lp.Instance(trace=papers.jitserve_mix(N_REQUESTS, 8.0, seed=SEED), cluster=A100,
                  tiers=TIERS)
ttft, tpot, _ = mix.request_slos()
e2e = mix.request_e2e_s()


def service(res):
    a = res.arrays
    meets = (a["status"] == "finished") & obj.meets_slo(a["ttft_s"], a["tpot_s"], ttft, tpot,
                                                         a["e2e_s"], e2e)
    span = np.nanmax(a["finish_s"]) - a["arrival_s"][0]
    return obj.service_goodput(meets=meets, output_tokens=a["output_tokens"],
                               program_id=mix.trace.program_id, span_s=span)


rows = {"fcfs": (lp.make_policy("vllm"), None), "sarathi": (lp.make_policy("sarathi"), None)}
for sigma in (0.0, 1.0):
    rows[f"sjf-pred s={sigma}"] = (lp.make_policy("sjf-predicted", **V1),
                                   NoisyOracle(sigma=sigma, interval_z=1.0))
    rows[f"slo-aware s={sigma}"] = (lp.make_policy("slo-aware", **V1),
                                    NoisyOracle(sigma=sigma, interval_z=1.0))
svc = {k: service(lp.simulate(mix, p, seed=SEED, predictor=pr)) for k, (p, pr) in rows.items()}
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(list(svc), list(svc.values()))
ax.set_ylabel("service goodput (tokens/s)")
plt.setp(ax.get_xticklabels(), rotation=20)
fig.tight_layout()
{k: round(v, 1) for k, v in svc.items()}

# %% [markdown]
# ## 4. Autellix: program-level scheduling
#
# ShareGPT conversations as programs (6.66 calls, 256 / 277 tokens per call;
# `lpserve.trace.programs`), Llama-3.1-8B on one A100-80GB, vLLM's V0 engine. At this
# reduced size the engine is capped at 32 running calls (instead of 256) so that a short
# run queues; mean program-level token latency (program response time over its output
# tokens) of FCFS, request-level MLFQ and PLAS as the program rate rises.

# %%
prog_rates = [0.5, 1.0, 1.5]
lat = {p: [] for p in ("vllm-v0", "mlfq", "plas")}
for r in prog_rates:
    tr = P.sharegpt_programs(N_PROGRAMS, r, seed=SEED)
    for p in lat:
        a = lp.simulate(lp.Instance(trace=tr, cluster=A100),
                        lp.make_policy(p, max_num_seqs=32, max_num_batched_tokens=8192),
                        seed=SEED).arrays
        v = obj.program_token_latency_s(arrival_s=a["arrival_s"], finish_s=a["finish_s"],
                                        output_tokens=a["output_tokens"],
                                        program_id=tr.program_id, parent=tr.parent)
        lat[p].append(float(np.nanmean(v)))
fig, ax = plt.subplots(figsize=(6, 3))
for p, ys in lat.items():
    ax.plot(prog_rates, ys, marker="o", label=p)
ax.set_xlabel("programs per second")
ax.set_ylabel("program token latency (s/token)")
ax.legend()
fig.tight_layout()

# %% [markdown]
# ## 5. FastServe: skip-join MLFQ as the load rises
#
# OPT-13B on one A100-40GB, ShareGPT-like requests. Mean job completion time of FCFS,
# naive MLFQ (every request enters queue 0) and skip-join MLFQ, at loads relative to
# FCFS's saturated throughput. `fastserve` swaps on the transfer engine's overlapped host
# link with proactive swapping (its registered engine); `mlfq` as registered prices swaps
# serially inside iterations. The swap ablation and the PCIe tipping point are in
# `benchmarks/seeds/fastserve.py`.

# %%
fs = papers.sharegpt_like(N_REQUESTS, 1.0, seed=SEED, max_prompt_tokens=1024,
                          max_output_tokens=1024)
kw = dict(max_num_batched_tokens=2048)
sat = lp.simulate(lp.Instance(trace=fs.with_rate(1e6), cluster=OPT),
                  lp.make_policy("vllm-v0", **kw)).arrays
mu = len(fs) / np.nanmax(sat["finish_s"])
loads = [0.5, 0.8, 1.0, 1.2]
jct = {p: [] for p in ("vllm-v0", "mlfq", "fastserve")}
for rho in loads:
    inst = lp.Instance(trace=fs.with_rate(rho * mu), cluster=OPT)
    for p in jct:
        jct[p].append(lp.simulate(inst, lp.make_policy(p, **kw),
                                  seed=SEED).summary()["e2e_s"]["mean"])
fig, ax = plt.subplots(figsize=(6, 3))
for p, ys in jct.items():
    ax.plot(loads, ys, marker="o", label=p)
ax.set_xlabel("load (rate / FCFS saturated throughput)")
ax.set_ylabel("mean JCT (s)")
ax.set_yscale("log")
ax.legend()
fig.tight_layout()

# %% [markdown]
# ## 6. MFS: KV transfers on a shared link
#
# The finished prefills of a disaggregated run (2 prefill and 2 decode replicas of
# Llama-3.1-8B) become KV transfers on one shared link; half the requests are interactive
# (TTFT SLO 0.5 s), half batch (5 s). Share of transfers ending by their deadline under
# FIFO, MFS's reverse multi-level queue and least laxity first, as the link slows.

# %%
conv = lp.bundled_trace().head(N_REQUESTS).rebased().with_rate(6.0)
dis = lp.Cluster(gpu="a100-80gb", llm="llama-3.1-8b", prefill_replicas=2, decode_replicas=2)
a = lp.simulate(lp.Instance(trace=conv, cluster=dis), "vllm-v0", seed=SEED).arrays
done = np.isfinite(a["first_token_s"]) & (a["output_tokens"] > 1)
tight = np.random.default_rng(SEED).random(len(conv))[done] < 0.5
ready = a["first_token_s"][done]
size = a["prompt_tokens"][done] * lp.cost_model(gpu="a100-80gb",
                                                llm="llama-3.1-8b").kv_bytes_per_token
deadline = a["arrival_s"][done] + np.where(tight, 0.5, 5.0)
gbps = [40.0, 20.0, 12.0, 8.0]
att = {o: [1 - link_schedule(ready, size, deadline, g, o)["late"].mean() for g in gbps]
       for o in ("fcfs", "rmlq", "llf")}
fig, ax = plt.subplots(figsize=(6, 3))
for o, ys in att.items():
    ax.plot(gbps, ys, marker="o", label=o)
ax.set_xlabel("link bandwidth (Gb/s)")
ax.set_ylabel("transfers within deadline")
ax.invert_xaxis()
ax.legend()
fig.tight_layout()
