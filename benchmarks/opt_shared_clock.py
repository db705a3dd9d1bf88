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
With ``--windows``, one such attempt: the window-fluid relaxation
(:func:`window_fluid_s`), a convex program. At x2 with 5 s windows it gives 3.489 s, the
cost LP's value: the larger of its two terms per window does not charge the time requests
wait outside the batch (iterations times requests waiting, a product that is not convex).

    python benchmarks/opt_shared_clock.py [--loads 0.5,1,2] [--upper 3.040,3.592,7.232] [--lp]
        [--caps 10,20,30,45] [--windows 5,10 [--per-window]]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt.cost_lp import build_cost_lp, solve_cost_lp
from lpserve.opt.cost_lp_terms import Minorant, iteration_minorant
from lpserve.opt.lower_bounds import prefix_sharing
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


def window_fluid_s(m: Minorant, arrival_s: np.ndarray, prompt: np.ndarray,
                   output: np.ndarray, uncached: np.ndarray, replicas: int, window_s: float,
                   tail_s: float, detail: dict | None = None) -> tuple[float, str]:
    """Least total latency (s) of the window-fluid relaxation of the shared clock, and
    the solver's status (a measurement: no proof in ``proofs/`` yet). ``detail``, when
    given, receives per window (arrays of the window count): ``start_s``, ``arrived`` (decode
    tokens of the requests arriving in it), ``made`` (decode tokens the optimum produces
    in it), ``batch_a_s`` / ``batch_b_s`` / ``present_s`` (its three latency terms, s).

    Time is cut into windows of ``window_s`` up to the last arrival plus ``tail_s``. A
    schedule's iterations overlap window ``w`` by fractions ``f_k`` (of ``K_w = sum f_k``
    decode iterations, over all replicas); request ``i`` gains ``x_iw`` tokens there and
    ``z_iw`` of its prompt. Per side ``s`` of the minorant (``F_s``, decode increment
    ``c_i`` at the prompt's context, prompt cost ``q_i`` of its ``uncached`` tokens, those
    no other request's KV can hold: ``lpserve.opt.lower_bounds.prefix_sharing``), with ``N = sum x``,
    ``Q = sum sqrt(c_i) x_i``, ``W = sum c_i x_i``, ``P = sum q_i z_i``:

    * the time the requests spend in decode batches in the window is
      ``sum_k f_k d_k b_k >= F N + sum_k f_k b_k I_k >= F N + Q^2 / K`` (AM-GM on each
      batch: ``b I = sum_ij (c_i + c_j) / 2 >= (sum_i sqrt c_i)^2``, then Cauchy-Schwarz),
      and ``F K + W + P <= R L`` (the iterations fit in the replicas' time), so
      ``>= F N + F Q^2 / (R L - W - P)`` (Jensen over the replicas);
    * a request not finished at the window's end was there all of it since its arrival:
      ``>= sum_i dur_i * max(rem_i / o_i, 1 - Z_i)``;
    * each token takes an iteration of at least ``F_s + c_i`` (one token per request per
      iteration), and decode follows the prompt (``X_i <= o_i Z_i``).

    The latency in the window is at least the largest of the three; the relaxation
    minimises their sum over windows (a convex program, Clarabel)."""
    import cvxpy as cp

    n = arrival_s.size
    od = (output - 1).astype(np.float64)          # decode tokens (the first comes with the prompt)
    n_win = int(np.ceil((arrival_s.max() + tail_s) / window_s))
    start = np.arange(n_win) * window_s
    dur = np.clip(start[None, :] + window_s - np.maximum(start[None, :], arrival_s[:, None]),
                  0.0, window_s)                  # (n, n_win) time there in each window
    sides = [(m.F_A, m.decode_a(prompt), uncached * m.pre_a),
             (m.F_B, m.decode_b(prompt), uncached * (m.pre_a + m.lin_token))]
    per_tok = np.maximum(m.F_A + sides[0][1], m.F_B + sides[1][1])
    x = cp.Variable((n, n_win), nonneg=True)
    z = cp.Variable((n, n_win), nonneg=True)
    X, Z = cp.cumsum(x, axis=1), cp.cumsum(z, axis=1)
    dm = od > 0
    cons = [x <= dur / per_tok[:, None], z <= (dur > 0).astype(np.float64),
            cp.sum(x, axis=1) <= od, cp.sum(z, axis=1) <= 1,
            X[dm] <= cp.multiply(od[dm][:, None], Z[dm])]
    N = cp.sum(x, axis=0)
    terms = []
    for F, inc, q in sides:
        Q, Wk = np.sqrt(inc) @ x, inc @ x
        room = replicas * window_s - Wk - q @ z
        t = cp.Variable(n_win, nonneg=True)       # t >= Q^2 / room, as second-order cones
        cons += [room >= 0, cp.SOC(room + t, cp.vstack([2 * Q, room - t]), axis=0)]
        terms.append(F * N + F * t)
    rem = cp.maximum(cp.multiply((dm / np.maximum(od, 1.0))[:, None], od[:, None] - X),
                     1 - Z)
    terms.append(cp.sum(cp.multiply(dur, rem), axis=0))
    prob = cp.Problem(cp.Minimize(cp.sum(cp.maximum(*terms))), cons)
    prob.solve(solver="CLARABEL")
    if detail is not None:
        w = np.minimum((arrival_s // window_s).astype(np.int64), n_win - 1)
        detail.update(start_s=start, arrived=np.bincount(w, weights=od, minlength=n_win),
                      made=np.asarray(x.value).sum(axis=0),
                      batch_a_s=np.asarray(terms[0].value), batch_b_s=np.asarray(terms[1].value),
                      present_s=np.asarray(terms[2].value))
    return float(prob.value), prob.status


def print_per_window(d: dict, last_arrival_s: float) -> None:
    """The window-fluid optimum window by window (``window_fluid_s``'s ``detail``), and
    the share of the decode tokens it makes after the last arrival: work a schedule would
    do while requests keep arriving, deferred to the drain, where iterations are cheap,
    for the price of the deferred requests' *fraction* of the time they stay."""
    print(f"{'start s':>8} {'arrived tok':>11} {'made tok':>9} {'batch A s':>9} "
          f"{'batch B s':>9} {'present s':>9}")
    for k in range(d["start_s"].size):
        print(f"{d['start_s'][k]:8.0f} {d['arrived'][k]:11.0f} {d['made'][k]:9.0f} "
              f"{d['batch_a_s'][k]:9.1f} {d['batch_b_s'][k]:9.1f} {d['present_s'][k]:9.1f}")
    late = d["made"][d["start_s"] >= last_arrival_s].sum()
    print(f"decode tokens made in windows starting after the last arrival "
          f"({last_arrival_s:.1f} s): {late:.0f} of {d['made'].sum():.0f} "
          f"({late / max(d['made'].sum(), 1.0):.1%})")


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
    ap.add_argument("--windows", default="",
                    help="also the window-fluid relaxation at these window lengths (s), "
                         "e.g. 5,10 (a convex program per load: about a minute each)")
    ap.add_argument("--per-window", action="store_true",
                    help="with --windows: print each window's arrived and produced decode "
                         "tokens and its three latency terms at the relaxation's optimum")
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
        for win_s in (float(w) for w in args.windows.split(",") if w):
            cached, _ = prefix_sharing(inst.trace, cl.block_tokens)
            detail: dict | None = {} if args.per_window else None
            val, status = window_fluid_s(m, a, p, o, np.maximum(p - cached, 1.0), REPLICAS,
                                         win_s, tail_s=60.0, detail=detail)
            row += f" windows {win_s:g} s: {val / a.size:.3f} ({status})"
            if detail:
                print_per_window(detail, float(a.max()))
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
