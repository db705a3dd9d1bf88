"""What whole requests add to the cost-model LP: its bound with completion and prefill-done
binaries (a mixed-integer program), on the tiny instances of ``opt_tiny_exact.py``.

The LP of ``models/cost-lp.md`` counts a request's completion at the mean of its tokens'
times ((15), (16)) and lets its decode start as its prefill progresses ((8), fractionally).
This script adds, for every request ``i`` and interval ``k`` of its window, two binaries:
``z_ik`` = all of ``i``'s decode-phase tokens are produced by the interval's end ``e_k``,
``w_ik`` = all of its prompt tokens are computed by ``e_k``; with ``X_ik``, ``P_ik`` its
decode and prompt tokens in intervals up to ``k`` (columns of the LP) and ``D_ik`` the part
of interval ``k`` after ``a_i``:

    z_ik <= z_i,k+1,  w_ik <= w_i,k+1                         (monotone)
    (o_i - 1) z_ik <= X_ik,  u_i w_ik <= P_ik,  X_ik <= (o_i - 1) w_ik
    C_i >= a_i + sum_k D_ik (1 - z_ik),   t_i >= a_i + sum_k D_ik (1 - w_ik)

Every schedule satisfies them with its own indicators (a request not done by ``e_k``
finishes after it; no decode-phase token precedes the last prompt token), so the program's
optimum is still a lower bound on every simulated schedule; its bound here is HiGHS' dual
bound of the branch and bound (solver tolerances, not a certificate as the LP's). It is a
measurement of what the LP's relaxation of whole requests costs, not a registered bound:
on 613 requests the program does not solve in minutes.

It prints, per instance, OPT of the schedule space (``schedule-exact``), the best bound
``lpserve`` reports (``cost-lp``, ``srpt-bound``), the LP with every column and the program
on the grid of ``--dt-scale`` (times the default grid), their ratios to OPT (each at least
the reported bound), and the means.

    python benchmarks/opt_whole_request.py [--n-instances 12] [--dt-scale 1]
        [--time-limit 45] [--default-load X]

``--default-load X`` runs the bundled default workload (613 requests in 150 s, 2 x A100,
Llama-2-7B) at rate scale ``X`` instead, on the grid of ``lpserve gap`` (4 times the
default, its caps from ``vllm``'s simulated latencies), and prints the LP and the program's
mean E2E bounds.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.sparse import coo_matrix, csc_matrix

from lpserve.opt import solve
from lpserve.opt.cost_lp_build import KIND_NAMES, CostLPModel, build_cost_lp
from lpserve.opt.solution import highs_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opt_tiny_exact import tiny_instance

_PRE, _DEC, _FIRST, _DONE = (KIND_NAMES.index(k) for k in
                             ("prefill", "decode", "first-token", "completion"))


def whole_request_program(model: CostLPModel, arrival_s: np.ndarray, output_tokens: np.ndarray,
                          integer: bool = True) -> dict:
    """The LP of ``model`` (every column) with the binaries above; arrays of the model
    plus ``integer`` (bool per column) for :func:`lpserve.opt.solution.highs_model`.
    ``arrival_s`` (s) and ``output_tokens``: the trace's, shape (n,)."""
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size)).tocoo()
    r, c, v = A.row.tolist(), A.col.tolist(), A.data.tolist()
    rlo, rhi = model.row_lo.tolist(), model.row_hi.tolist()
    n_col = model.c.size
    pmass = np.flatnonzero(model.row_group == "pmass")  # one per request, in request order
    if pmass.size != arrival_s.size:
        raise ValueError(f"{pmass.size} prompt mass rows for {arrival_s.size} requests")
    by_req = np.split(np.argsort(model.col_req, kind="stable"),
                      np.searchsorted(np.sort(model.col_req), np.arange(1, arrival_s.size)))

    def row(entries: list, lo: float, hi: float) -> None:
        for col, val in entries:
            r.append(len(rlo))
            c.append(int(col))
            v.append(float(val))
        rlo.append(lo)
        rhi.append(hi)

    for i, own in enumerate(by_req):
        kind = model.col_kind[own]
        pre, dec = own[kind == _PRE], own[kind == _DEC]
        ks = np.unique(model.col_k[np.concatenate([pre, dec])])
        if ks.size == 0:
            continue
        a, nd = float(arrival_s[i]), int(output_tokens[i]) - 1
        span = (ks + 1) * model.dt_s - np.maximum(ks * model.dt_s, a)
        binaries = []
        for toks, mass, done in ((pre, float(model.row_lo[pmass[i]]), own[kind == _FIRST]),
                                 (dec, float(nd), own[kind == _DONE])):
            if mass <= 0 or done.size == 0:
                binaries.append(None)
                continue
            b = np.arange(n_col, n_col + ks.size)
            n_col += ks.size
            for j in range(ks.size - 1):
                row([(b[j], 1.0), (b[j + 1], -1.0)], -np.inf, 0.0)
            for j, k in enumerate(ks):
                row([(b[j], mass)] + [(t, -1.0) for t in toks[model.col_k[toks] <= k]],
                    -np.inf, 0.0)
            row([(done[0], 1.0)] + list(zip(b, span)), a + float(span.sum()), np.inf)
            binaries.append(b)
        w = binaries[0]
        if w is not None and nd:
            for j, k in enumerate(ks):  # no decode-phase token before the prefill is done
                row([(w[j], -float(nd))] + [(t, 1.0) for t in dec[model.col_k[dec] <= k]],
                    -np.inf, 0.0)
    extra = n_col - model.c.size
    M = coo_matrix((v, (r, c)), shape=(len(rlo), n_col)).tocsc()
    return {"col_cost": np.concatenate([model.c, np.zeros(extra)]),
            "col_lower": np.concatenate([model.col_lo, np.zeros(extra)]),
            "col_upper": np.concatenate([model.col_hi, np.ones(extra)]),
            "row_lower": np.array(rlo), "row_upper": np.array(rhi),
            "a_start": M.indptr, "a_index": M.indices, "a_value": M.data,
            "integer": np.concatenate([np.zeros(model.c.size, bool),
                                       np.full(extra, integer)])}


def solve_program(model: CostLPModel, arrays: dict, time_limit_s: float) -> tuple:
    """(bound on the total latency (s), status text, wall s): the LP's optimum or the
    branch and bound's dual bound."""
    h = highs_model(**arrays, time_limit_s=time_limit_s)
    t0 = time.perf_counter()
    h.run()
    info = h.getInfo()
    mip = bool(arrays["integer"].any())
    bound = info.mip_dual_bound if mip else info.objective_function_value
    return (float(bound) + model.const, h.modelStatusToString(h.getModelStatus()),
            time.perf_counter() - t0)


def default_workload(load: float, time_limit_s: float) -> int:
    """The LP and the program on the bundled default workload at rate scale ``load``."""
    import lpserve as lp
    from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

    tr = load_trace(DEFAULT_TRACE)
    t0 = float(tr.arrival_s[0])
    window = tr.window(t0, t0 + 150.0).rebased()
    inst = lp.Instance(trace=window if load == 1.0 else window.scale_rate(load),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2))
    n = len(inst.trace)
    upper = float(np.sum(lp.simulate(inst, "vllm").arrays["e2e_s"]))
    model = build_cost_lp(inst, dt_scale=4.0, upper_total_s=upper)
    a = np.asarray(inst.trace.arrival_s, np.float64)
    o = np.asarray(inst.trace.output_tokens)
    for name, integer in (("LP", False), ("whole requests", True)):
        total, status, wall = solve_program(model, whole_request_program(model, a, o, integer),
                                            time_limit_s)
        print(f"FIGURE default workload x{load:g} ({n} requests): {name} mean E2E bound "
              f"{total / n:.4f} s ({status}, {wall:.0f} s)", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-instances", type=int, default=12)
    ap.add_argument("--max-requests", type=int, default=6)
    ap.add_argument("--dt-scale", type=float, default=1.0)
    ap.add_argument("--time-limit", type=float, default=45.0)
    ap.add_argument("--default-load", type=float, default=None)
    args = ap.parse_args()
    if args.default_load is not None:
        return default_workload(args.default_load, args.time_limit)
    print(f"{'seed':>4}{'n':>3}{'R':>3}{'OPT s':>9}{'lpserve':>9}{'LP':>9}{'whole':>9}"
          f"{'LP/OPT':>8}{'whole/OPT':>10}  status")
    r_lp, r_whole = [], []
    for seed in range(args.n_instances):
        inst = tiny_instance(seed, args.max_requests)
        opt = solve("schedule-exact", inst).objective
        reported = max(solve("cost-lp", inst).bound, solve("srpt-bound", inst).bound)
        model = build_cost_lp(inst, dt_scale=args.dt_scale)
        tr = inst.trace
        a, o = np.asarray(tr.arrival_s, np.float64), np.asarray(tr.output_tokens)
        lp_s, _, _ = solve_program(model, whole_request_program(model, a, o, False),
                                   args.time_limit)
        whole_s, status, wall = solve_program(model, whole_request_program(model, a, o),
                                              args.time_limit)
        r_lp.append(max(lp_s, reported) / opt)
        r_whole.append(max(whole_s, reported) / opt)
        print(f"{seed:>4}{len(tr):>3}{inst.cluster.n_replicas:>3}{opt:>9.4f}{reported:>9.4f}"
              f"{lp_s:>9.4f}{whole_s:>9.4f}{r_lp[-1]:>8.3f}{r_whole[-1]:>10.3f}  {status} "
              f"{wall:.0f} s", flush=True)
    print(f"FIGURE {len(r_lp)} tiny instances, grid x{args.dt_scale}: best bound / OPT mean "
          f"{np.mean(r_lp):.3f} with the LP, {np.mean(r_whole):.3f} with whole requests "
          f"({args.time_limit:.0f} s per program)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
