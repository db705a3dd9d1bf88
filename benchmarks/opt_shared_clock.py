"""Where a lower bound on the default workload can still come from: the shared clock.

Every schedule the simulator runs on a replica is a sequence of iterations. An iteration
takes at least ``F + sum of its members' increments`` on both sides of the cost LP's
minorants (``models/cost-lp.md`` (1)-(2)), every member gains one token, and every request
in the system waits for all of it. Averaged over iterations, a schedule is a fluid one
whose decode rates lie in the hull of the iterations' compositions: per side ``s``,

    F_s * k + sum_i inc_s,i * x_i + prompt work <= 1,   x_i <= k   (k iterations per second)

so the least total latency over such fluid schedules (the *shared-clock relaxation*) is at
most the simulator's optimum, and a bound built on it is at most that least latency.

This script is a measurement, not a bound. Per load it prints:

* with ``--lp``, ``cost-lp``: the time-indexed LP solved to optimality (one window
  round), at its default windows and at windows of three times each request's latency
  under ``vllm`` (on a grid three times coarser, to keep the LP's size): where the LP
  family stands, and that wider windows do not lift it far (it counts a request
  interrupted by others at the mean time of its tokens, about half of its time in the
  system);
* ``shared clock, PS``: the fluid schedule in which every request in the system decodes in
  every iteration (prompts first, at their chunk cost), requests split over the replicas
  alternately. It is a schedule of the relaxation, so the relaxation's optimum, and any
  bound built on it, is at most this value: the ceiling of that family;
* the interval such a bound would give at best against the best simulated schedule
  (below 1 where the fluid schedule is slower than that schedule: the relaxation's
  optimum is at most the smaller of the two, so the ceiling says nothing there).

A ceiling far above the LP says the shared clock is where the slack is; what is missing
is a way to compute (or bound from below) the relaxation's optimum over every order.

    python benchmarks/opt_shared_clock.py [--loads 0.5,1,2] [--upper 3.040,3.592,7.232] [--lp]
        [--caps 10,20,30,45]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt.cost_lp import build_cost_lp, solve_cost_lp
from lpserve.opt.cost_lp_terms import Minorant, iteration_minorant
from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

GPU, LLM, REPLICAS, DURATION_S = "a100-80gb", "llama-2-7b", 2, 150.0


def fluid_ps_latency_s(m: Minorant, arrival_s: np.ndarray, prompt: np.ndarray,
                       output: np.ndarray, dt_s: float = 0.002,
                       cap: int | None = None) -> np.ndarray:
    """Latency (s) of each request under the fluid processor-sharing schedule on one
    replica: each time step ``dt_s`` first computes waiting prompts, shortest first, at
    the larger of a whole-prompt chunk's two increments (the prompt's first token comes
    with it), then lets every request past its prompt decode at the iteration rate
    ``1 / max(F_A + sum a, F_B + sum b)`` over those requests (contexts = prompts);
    with ``cap``, only the ``cap`` of them with the fewest tokens left decode."""
    n = arrival_s.size
    pre = np.array([max(m.chunk_a(float(p)), m.chunk_b(float(p))) for p in prompt])
    inc_a, inc_b = m.decode_a(prompt), m.decode_b(prompt)
    rem = output.astype(np.float64) - 1.0
    done = np.full(n, np.nan)
    t = 0.0
    while np.isnan(done).any():
        live = np.flatnonzero((arrival_s <= t) & np.isnan(done))
        if live.size == 0:
            t = float(arrival_s[np.isnan(done)].min())
            continue
        budget = dt_s
        filling = live[pre[live] > 0]
        while filling.size and budget > 0:
            j = filling[np.argmin(pre[filling])]
            use = min(budget, pre[j])
            pre[j] -= use
            budget -= use
            filling = live[pre[live] > 0]
        dec = live[(pre[live] <= 0) & (rem[live] > 0)]
        if cap is not None:
            dec = dec[np.argsort(rem[dec], kind="stable")[:cap]]
        if dec.size and budget > 0:
            it_s = max(m.F_A + inc_a[dec].sum(), m.F_B + inc_b[dec].sum())
            rem[dec] -= budget / it_s
        t += dt_s
        fin = live[(pre[live] <= 0) & (rem[live] <= 1e-9)]
        done[fin] = t
    return done - arrival_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0.5,1,2")
    ap.add_argument("--upper", default="3.040,3.592,7.232",
                    help="best simulated mean E2E per load (s), for the interval column")
    ap.add_argument("--lp", action="store_true",
                    help="also solve cost-lp at default and at 3x-latency windows (minutes)")
    ap.add_argument("--caps", default="",
                    help="also the fluid schedules decoding only the CAP requests with the "
                         "fewest tokens left, e.g. 10,20,30,45 (another schedule of the "
                         "relaxation each: does reordering beat processor sharing?)")
    args = ap.parse_args()
    tr = load_trace(DEFAULT_TRACE)
    t0 = float(tr.arrival_s[0])
    win = tr.window(t0, t0 + DURATION_S).rebased()
    cl = lp.Cluster(gpu=GPU, llm=LLM, replicas=REPLICAS)
    m = iteration_minorant(lp.cost_model(gpu=GPU, llm=LLM))
    uppers = [float(u) for u in args.upper.split(",")] if args.upper else []
    print(f"default workload ({len(win)} requests, {DURATION_S:g} s, {REPLICAS} x {GPU}, "
          f"{LLM}); F_A {m.F_A * 1e3:.2f} ms, F_B {m.F_B * 1e3:.2f} ms")
    head = f"{'load':>5} {'shared clock, PS':>16} {'interval at best':>16}"
    if args.lp:
        head += f" {'cost-lp':>8} {'cost-lp, 3x windows':>19}"
    print(head + f" {'best schedule':>13} {'wall s':>6}")
    for j, load in enumerate(float(x) for x in args.loads.split(",")):
        t1 = time.perf_counter()
        inst = lp.Instance(trace=win if load == 1.0 else win.scale_rate(load), cluster=cl)
        a = np.asarray(inst.trace.arrival_s, np.float64)
        p = np.asarray(inst.trace.prompt_tokens, np.float64)
        o = np.asarray(inst.trace.output_tokens, np.int64)
        total = sum(fluid_ps_latency_s(m, a[r::REPLICAS], p[r::REPLICAS], o[r::REPLICAS]).sum()
                    for r in range(REPLICAS))
        ceiling = total / a.size
        up = uppers[j] if j < len(uppers) else float("nan")
        row = f"x{load:<4g} {ceiling:16.3f} {up / ceiling:16.3f}"
        for cap in (int(c) for c in args.caps.split(",") if c):
            cap_total = sum(fluid_ps_latency_s(m, a[r::REPLICAS], p[r::REPLICAS],
                                               o[r::REPLICAS], cap=cap).sum()
                            for r in range(REPLICAS))
            row += f" cap {cap}: {cap_total / a.size:.3f}"
        if args.lp:
            base = build_cost_lp(inst)
            lat = np.asarray(lp.simulate(inst, "vllm").arrays["e2e_s"], np.float64)
            wide = build_cost_lp(inst, windows_s=np.maximum(base.window_s, 3.0 * lat),
                                 dt_s=3.0 * base.dt_s)
            vals = [solve_cost_lp(x, window_rounds=1).bound / a.size for x in (base, wide)]
            row += f" {vals[0]:8.3f} {vals[1]:19.3f}"
        print(row + f" {up:13.3f} {time.perf_counter() - t1:6.1f}")


if __name__ == "__main__":
    main()
