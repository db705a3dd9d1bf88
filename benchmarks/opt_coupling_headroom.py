"""How far can a lower bound go that charges requests for sharing iterations while they
are surely in the system? A ceiling for that family of bounds on the default workload,
not a bound.

Every request ``i`` is in the system at least during its forced window ``[a_i, a_i +
L_i)``, ``L_i`` its time alone (the per-request cost bound's ``latency_lb_s``). Summed over
requests, latency beyond ``L_i`` accrues at a rate of at least

    min over b of  (b - 1) X_b / (F + X_b) + (N - b)

per replica holding ``N`` present requests: ``b`` of them decode together (each waits
for the others' KV reads: a decode iteration takes at least ``F + X_b``, ``X_b`` the KV
reads of the ``b`` smallest contexts, ``F`` one decode alone), the others wait. This
script integrates that rate over the forced windows, with three choices that can only
raise it: every present request decodes or waits (none is prefilling), contexts are the
prompts, and the present requests are split over the replicas alternately by context
(not minimized over splits). A valid bound of this family is at most what it prints.

It prints, per load, the per-request cost bound's mean E2E, the ceiling of the coupled
term and their sum, beside the best simulated schedule of ``opt_interval_default.py``
when given (``--upper``), and the interval that sum would give.

    python benchmarks/opt_coupling_headroom.py [--loads 0.5,1,2] [--upper 3.040,3.592,7.232]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt.lower_bounds import build_cost_bound, solve_cost_bound
from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

GPU, LLM, REPLICAS, DURATION_S = "a100-80gb", "llama-2-7b", 2, 150.0


def rate_min(x: np.ndarray, F: float) -> float:
    """The least latency rate of one replica holding requests whose decodes read ``x``
    seconds of KV each: ``min_b (b - 1) X_b / (F + X_b) + (N - b)``."""
    if x.size == 0:
        return 0.0
    X = np.cumsum(np.sort(x))
    b = np.arange(1, x.size + 1)
    return float(np.min((b - 1) * X / (F + X) + (x.size - b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0.5,1,2")
    ap.add_argument("--upper", default="3.040,3.592,7.232",
                    help="best simulated mean E2E per load (s), for the interval column")
    ap.add_argument("--grid", type=int, default=20_000, help="time points per load")
    args = ap.parse_args()
    tr = load_trace(DEFAULT_TRACE)
    t0 = float(tr.arrival_s[0])
    win = tr.window(t0, t0 + DURATION_S).rebased()
    cl = lp.Cluster(gpu=GPU, llm=LLM, replicas=REPLICAS)
    cost = lp.cost_model(gpu=GPU, llm=LLM)
    F = float(cost.batch_time_s([], [], [1]))
    k = 35  # the per-token KV read from a batch of 35 decodes at 1 and 1,000 tokens
    beta = (float(cost.batch_time_s([], [], [1000] * k))
            - float(cost.batch_time_s([], [], [1] * k))) / (k * 999)
    uppers = [float(u) for u in args.upper.split(",")] if args.upper else []
    print(f"default workload ({len(win)} requests, {DURATION_S:g} s, {REPLICAS} x {GPU}, "
          f"{LLM}); one decode alone F = {F * 1e3:.2f} ms, KV read {beta * 1e9:.1f} ns "
          "per context token")
    print(f"{'load':>5} {'cost bound':>10} {'+ coupled ceiling':>17} {'= sum':>7} "
          f"{'best schedule':>13} {'interval at best':>16} {'wall s':>6}")
    for j, load in enumerate(float(x) for x in args.loads.split(",")):
        t1 = time.perf_counter()
        inst = lp.Instance(trace=win if load == 1.0 else win.scale_rate(load), cluster=cl)
        model = build_cost_bound(inst)
        n = len(inst.trace)
        lb = solve_cost_bound(model).objective / n
        a, L = np.asarray(inst.trace.arrival_s), model.alone_s
        x = beta * np.asarray(inst.trace.prompt_tokens, np.float64)
        T, dt = np.linspace(0.0, float((a + L).max()), args.grid, retstep=True)
        extra = 0.0
        for t in T:
            live = np.flatnonzero((a <= t) & (t < a + L))
            if live.size:
                xs = np.sort(x[live])
                extra += dt * sum(rate_min(xs[g::REPLICAS], F) for g in range(REPLICAS))
        up = uppers[j] if j < len(uppers) else float("nan")
        total = lb + extra / n
        print(f"x{load:<4g} {lb:10.3f} {extra / n:17.3f} {total:7.3f} {up:13.3f} "
              f"{up / total:16.3f} {time.perf_counter() - t1:6.1f}")


if __name__ == "__main__":
    main()
