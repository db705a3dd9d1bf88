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
# # KV-cache eviction: online evictors against offline bounds (Mooncake)
#
# A prefix cache keeps KV blocks of earlier prompts so that a later request sharing the
# prefix skips their prefill. Which blocks to keep when memory is full is an online
# caching problem with a twist: a request only hits on the *leading run* of its blocks
# that is cached (prefix-closed hits), so a deep block without its parents is worthless.
#
# `lpserve.evaluate.cache` replays a block-id trace (cold start, requests in trace order, at
# most `capacity_blocks` blocks kept between requests; `models/kv-caching-flow.md`
# section 1) through
#
# * **bounds and offline policies**: an infinite cache (every block ever seen stays), the
#   **prefix LP** (an upper bound on the hits of any eviction schedule,
#   `models/kv-caching-flow.md` (6)–(9)), its **rounding** (a feasible offline schedule),
#   **Belady** (farthest next use) and its prefix-aware variant;
# * **every online evictor**: LRU (vLLM), radix LRU (SGLang), LFU, prefix LRU, GDSF,
#   session, lookahead and the knapsack index (`lpserve.policies.evictors_kv`).
#
# Hit rate = prefix-hit blocks / prompt blocks.

# %% tags=["parameters"]
# Parameters. Default: the bundled 5-minute Mooncake slice (918 requests).
# Full size: FULL = True reads the 30-minute Mooncake conversation file when present
# (it falls back to the bundled slice, and says so, when the file is missing).
import os

FULL = False
FULL_TRACE = os.path.join(os.environ.get("LPSERVE_SHARED", "../shared"), "traces",
                          "mooncake_fast25_conversation_first30min.jsonl.gz")
CAPACITIES_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
TABLE_CAPACITY_BLOCKS = 256

# %%
import time
from pathlib import Path

import numpy as np
import pandas as pd

import lpserve as lp
from lpserve.evaluate.cache import BOUNDS, policy_names, replay_accesses
from lpserve.evaluate.plots import new_figure
from lpserve.opt import cache_flow as cf

pd.set_option("display.width", 160)

# %% [markdown]
# ## 1. The trace
#
# Mooncake (FAST'25) publishes, for each request, the hash ids of its 512-token prompt
# blocks: a hash chain, so equal ids mean equal prefixes.

# %%
if FULL and Path(FULL_TRACE).is_file():
    trace = lp.load_trace(FULL_TRACE)
else:
    if FULL:
        print(f"{FULL_TRACE} not found: using the bundled 5-minute slice")
    trace = lp.bundled_trace("mooncake-conv-5min")
st = trace.stats()
print(f"{trace.name}: {st['n_requests']:,} requests over {st['duration_s']:.0f} s, "
      f"{st['n_blocks']:,} prompt blocks of {st['block_tokens']} tokens "
      f"({st['distinct_blocks']:,} distinct); infinite-cache hit rate "
      f"{st['infinite_cache_hit_rate']:.4f}")

# %% [markdown]
# How many of these blocks fit in one GPU? The cost model's KV capacity of an A100-80GB
# serving Llama-2-7B, in 512-token blocks, marks a realistic capacity on the plots below.

# %%
cost = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
gpu_blocks = cost.kv_capacity_tokens(0.9) / trace.block_tokens
print(f"A100-80GB / Llama-2-7B KV capacity: {cost.kv_capacity_tokens(0.9):,.0f} tokens "
      f"= {gpu_blocks:.0f} blocks of {trace.block_tokens} tokens")

# %% [markdown]
# ## 2. Replay every evictor and bound at several capacities
#
# The block accesses are prepared once and replayed by each policy (the online evictors
# run in numba; the LP is solved with HiGHS).

# %%
acc = cf.block_accesses(trace)
names = policy_names()
online = [n for n in names if n not in BOUNDS and n != "belady"]
rows = []
for C in CAPACITIES_BLOCKS:
    for name in names:
        t0 = time.perf_counter()
        r = replay_accesses(acc, C, name)
        rows.append({"capacity_blocks": C, "policy": name, "hits": r.hits,
                     "hit_rate": r.hit_rate, "token_hit_rate": r.token_hit_rate,
                     "wall_s": time.perf_counter() - t0})
res = pd.DataFrame(rows)
print(f"{len(rows)} replays of {acc.n_accesses:,} block accesses in "
      f"{res['wall_s'].sum():.1f} s")

# %% [markdown]
# ## 3. Check the order the theory promises
#
# At every capacity: every feasible schedule (each online evictor, Belady, the rounded
# LP) hits at most the LP bound, and the LP at most the infinite cache.

# %%
wide = res.pivot(index="capacity_blocks", columns="policy", values="hit_rate")
tol = 1e-9
for C, row in wide.iterrows():
    lp_bound = row["lp"]
    assert lp_bound <= row["infinite"] + tol, (C, lp_bound, row["infinite"])
    for name in [*online, "belady", "belady-prefix", "lp-rounded"]:
        assert row[name] <= lp_bound + tol, f"{name} at {C} blocks: {row[name]} > LP {lp_bound}"
print("checked: every feasible schedule <= prefix LP bound <= infinite cache, "
      f"at {len(wide)} capacities")

# %% [markdown]
# ## 4. The gap at one capacity
#
# `of_lp` is the policy's hit rate as a fraction of the LP bound (1.0 = provably optimal).

# %%
at = res[res["capacity_blocks"] == TABLE_CAPACITY_BLOCKS].set_index("policy")
table = pd.DataFrame({
    "kind": ["bound" if n in ("infinite", "lp") else "offline" if n in
             ("belady", "belady-prefix", "lp-rounded") else "online" for n in at.index],
    "hit_rate": at["hit_rate"], "token_hit_rate": at["token_hit_rate"],
    "of_lp": at["hit_rate"] / at.loc["lp", "hit_rate"], "wall_s": at["wall_s"]},
    index=at.index).sort_values("hit_rate", ascending=False)
table

# %%
best_online = table[table["kind"] == "online"]["hit_rate"].idxmax()
print(f"at {TABLE_CAPACITY_BLOCKS} blocks the best online evictor is {best_online} with "
      f"{table.loc[best_online, 'of_lp']:.1%} of the LP bound; LRU reaches "
      f"{table.loc['lru', 'of_lp']:.1%}")

# %% [markdown]
# ## 5. Hit rate against capacity

# %%
fig, (ax,) = new_figure(width_in=8.5, height_in=5.0)
styles = {"infinite": ("black", ":"), "lp": ("black", "--"), "lp-rounded": ("tab:olive", "-."),
          "belady-prefix": ("tab:cyan", "--"), "belady": ("darkviolet", "--")}
palette = [f"C{i}" for i in range(10)]
for i, name in enumerate(online):
    styles[name] = (palette[i % len(palette)], "-")
for name in names:
    color, ls = styles[name]
    ax.plot(wide.index, wide[name], marker="o", markersize=3, linestyle=ls, color=color,
            label=name, linewidth=1.8 if name in ("lp", "infinite") else 1.2)
ax.axvline(gpu_blocks, color="tab:red", alpha=0.5, linewidth=1)
ax.annotate("one A100-80GB, Llama-2-7B", (gpu_blocks, ax.get_ylim()[1] * 0.95),
            rotation=90, va="top", ha="right", fontsize="small", color="tab:red")
ax.set_xscale("log", base=2)
ax.set_xlabel("cache capacity (blocks of 512 tokens)")
ax.set_ylabel("prefix hit rate (hit blocks / prompt blocks)")
ax.set_title(f"Online evictors vs offline bounds, {trace.name}")
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
fig

# %% [markdown]
# ## 6. Gap to the bound per evictor
#
# Each online evictor's hit rate as a fraction of the LP bound, across capacities (box)
# and at the table's capacity (dot).

# %%
ratio = wide[online].div(wide["lp"], axis=0)
fig2, (ax2,) = new_figure(width_in=8.5, height_in=4.2)
ax2.boxplot([ratio[n].to_numpy() for n in online], tick_labels=online)
ax2.scatter(np.arange(1, len(online) + 1), ratio.loc[TABLE_CAPACITY_BLOCKS, online],
            color="tab:red", zorder=3, label=f"at {TABLE_CAPACITY_BLOCKS} blocks")
ax2.axhline(1.0, color="black", linestyle="--", label="prefix LP bound")
ax2.set_ylabel("hit rate / LP bound (fraction)")
ax2.set_xlabel("online evictor")
ax2.set_ylim(0, 1.05)
ax2.set_title(f"Online evictors as a fraction of the prefix LP bound ({len(wide)} capacities)")
ax2.legend(fontsize="small")
fig2
