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
# # Cost model validation: predicted vs measured
#
# The calibrated cost model (`lp.cost_model`) predicts the time of one serving iteration
# from datasheet figures, the model's shape and a handful of fitted efficiencies
# (`models/cost-model.md`). Here we compare its predictions with every measured point
# shipped with lpserve: Vidur's A100 operator profiles for Llama-2-7B, NCCL all-reduce
# timings on a DGX-A100, Splitwise's end-to-end medians for Llama-2-70B and BLOOM-176B,
# and published points from lmdeploy, TensorRT-LLM and DistServe.

# %% tags=["parameters"]
# Parameters: SOURCE=None reads the copies inside the package; point it at a calibration
# folder in its original layout (e.g. "../shared/calibration") to use that instead.
SOURCE = None

# %%
import matplotlib.pyplot as plt
import numpy as np

import lpserve as lp
from lpserve.cost import validation_table

table = validation_table(SOURCE)
kept = table[~table.excluded]
print(f"{len(table)} measured points, {int(table.excluded.sum())} flagged anomalous by their source")

# %% [markdown]
# ## Error summary per phase
# `fit_split == "test"` marks points that no fit saw (every other Splitwise row and all
# published points).

# %%
summary = (kept.assign(abs_error=kept.rel_error.abs())
           .groupby(["phase", "fit_split"]).abs_error.agg(["count", "median", "max"]))
summary.round(3)

# %% [markdown]
# ## Predicted vs measured
# One panel per kind of measurement; the dashed lines are ±10 % and ±30 %.

# %%
groups = [("Vidur operators (per layer)", kept.source == "vidur"),
          ("NCCL all-reduce", kept.source == "vidur-nccl"),
          ("Splitwise iterations", kept.source == "splitwise"),
          ("published points", ~kept.source.isin(["vidur", "vidur-nccl", "splitwise"]))]
fig, axes = plt.subplots(1, 4, figsize=(18, 4.5))
for ax, (title, mask) in zip(axes, groups):
    sub = kept[mask]
    for phase, marker in (("prefill", "o"), ("decode", "s"), ("comm", "^")):
        s = sub[sub.phase == phase]
        if len(s):
            ax.scatter(s.measured_ms, s.predicted_ms, s=12, marker=marker, label=phase, alpha=0.7)
    lo, hi = sub.measured_ms.min() * 0.7, sub.measured_ms.max() * 1.4
    x = np.geomspace(lo, hi, 10)
    ax.plot(x, x, "k-", lw=0.8)
    for f, ls in ((0.1, "--"), (0.3, ":")):
        ax.plot(x, x * (1 + f), "k", ls=ls, lw=0.6)
        ax.plot(x, x * (1 - f), "k", ls=ls, lw=0.6)
    ax.set(xscale="log", yscale="log", title=title, xlabel="measured (ms)",
           ylabel="predicted (ms)")
    ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## Distribution of relative errors

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
for phase in ("prefill", "decode"):
    ax.hist(100 * kept[kept.phase == phase].rel_error, bins=60, alpha=0.6, label=phase)
ax.set(xlabel="predicted / measured - 1 (%)", ylabel="points")
ax.legend()

# %% [markdown]
# ## Largest errors
# The largest prefill errors are small-chunk FlashAttention rows of the operator profile
# (tens of microseconds, where kernel-launch granularity dominates) and batched prompts of
# the Splitwise engine, whose batched prefill does not grow smoothly with the batch.

# %%
kept.assign(abs_error=kept.rel_error.abs()).nlargest(12, "abs_error")[
    ["point", "calibration", "measured_ms", "predicted_ms", "rel_error", "fit_split"]]

# %% [markdown]
# ## The three cost models side by side
# The analytic model, the measured table (Vidur's profile interpolated) and the unit-round
# model of the theory papers share one interface.

# %%
analytic = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
tablecost = lp.TableCost.vidur_a100_llama2_7b(tp=1)
unit = lp.UnitRoundCost(memory_tokens=analytic.kv_capacity_tokens())
batch_sizes = [1, 2, 4, 8, 16, 32, 64, 128]
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, m in (("analytic", analytic), ("table (Vidur profile)", tablecost)):
    ax.plot(batch_sizes, [1e3 * m.batch_time_s([], [], [1024] * b) for b in batch_sizes],
            marker="o", label=name)
ax.set(xscale="log", xlabel="decode batch (context 1024)", ylabel="iteration time (ms)",
       title="Llama-2-7B on A100-80GB")
ax.legend()
print("unit-round iteration:", unit.batch_time_s([], [], [1024] * 8), "time unit")
