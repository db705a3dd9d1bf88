"""Unit tests of the cost-model LP's terms and solver (``models/cost-lp.md``,
``proofs/cost-lp-bound.md``): each lemma of the proof on random batches of the calibrated
analytic model, the certificate, the statuses, and the cheap bounds."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt.cost_lp_build import request_floors
from lpserve.opt.cost_lp_terms import (
    counted_prompt_tokens,
    decode_floor,
    iteration_minorant,
    minorant_time,
    prefill_classes,
    regime_prompt_shares,
    regime_shares,
    share_levels,
)
from lpserve.opt.srpt_bound import srpt_flow_time

MODELS = [("a100-80gb", "llama-2-7b", 1), ("a100-80gb", "llama-2-70b", 4),
          ("h100-80gb", "llama-3-8b", 2), ("a100-80gb", "llama-2-13b", 2)]


def _costs():
    out = []
    for gpu, llm, tp in MODELS:
        try:
            out.append(lp.cost_model(gpu=gpu, llm=llm, tp=tp))
        except (KeyError, ValueError, LookupError):
            continue
    assert len(out) >= 2
    return out


def _random_batch(rng):
    n_dec = int(rng.integers(0, 40))
    n_ch = int(rng.integers(0 if n_dec else 1, 4))
    ctx = rng.integers(1, 8000, n_dec)
    ch = rng.integers(1, 3000, n_ch)
    cached = rng.integers(0, 4000, n_ch)
    return ctx, ch, cached


@pytest.mark.parametrize("cost", _costs(), ids=lambda c: f"{c.gpu.key}-{c.llm.key}-tp{c.tp}")
def test_iteration_time_is_above_both_minorants(cost):
    """Lemma 1 (1)-(2): T(batch) >= F + sum of increments on both sides; an iteration with no
    decode lacks only the decode fixed cost."""
    m = iteration_minorant(cost)
    rng = np.random.default_rng(1)
    for _ in range(300):
        ctx, ch, cached = _random_batch(rng)
        t = cost.batch_time_s(prefill_tokens=ch, prefill_cached=cached, decode_context=ctx)
        slack = 0.0 if ctx.size else m.fixed_dec
        for side in "AB":
            assert t >= minorant_time(m, side, ctx, ch) - slack - 1e-12, (side, ctx, ch)


@pytest.mark.parametrize("cost", _costs(), ids=lambda c: f"{c.gpu.key}-{c.llm.key}-tp{c.tp}")
def test_a_recompute_chunk_costs_at_least_a_decode(cost):
    """Lemma 1: the last chunk of a recompute, which produces a decode-phase token at context
    p + c - 1, adds at least that decode's increment, and pays the decode fixed cost."""
    m = iteration_minorant(cost)
    rng = np.random.default_rng(2)
    for _ in range(200):
        c, p = int(rng.integers(1, 2000)), int(rng.integers(0, 6000))
        ctx = rng.integers(1, 4000, int(rng.integers(0, 8)))
        with_chunk = cost.batch_time_s(prefill_tokens=[c], prefill_cached=[p],
                                       decode_context=ctx)
        for side, inc in (("A", m.decode_a), ("B", m.decode_b)):
            base = minorant_time(m, side, ctx, [])
            assert with_chunk >= base + float(inc(p + c - 1)) - 1e-12 - \
                (0.0 if ctx.size else 0.0), (side, c, p)


def test_share_levels_stay_below_the_share():
    """(4)-(5): the levels' piecewise-linear shares are below w t / (t - F) everywhere."""
    cost = lp.cost_model()
    m = iteration_minorant(cost)
    rng = np.random.default_rng(3)
    for _ in range(50):
        ctx = int(rng.integers(1, 6000))
        d = float(cost.decode_alone_s([ctx])[0])
        a, b = float(m.decode_a(ctx)), float(m.decode_b(ctx))
        ths = [m.F_A * g for g in (1.3, 1.7, 2.5)]
        ts, sa, sb = share_levels(d, m.F_A, a, m.F_B, b, breaks=ths)
        assert ts[0] == d and np.all(np.diff(ts) > 0)
        for t in np.concatenate([rng.uniform(d, ts[-1] * 1.5, 200), ts]):
            fa = np.interp(t, ts, sa)
            fb = np.interp(t, ts, sb)
            assert fa <= a * t / (t - m.F_A) * (1 + 1e-12)
            assert fb <= b * t / (t - m.F_B) * (1 + 1e-12)
            for th in ths:
                reg = np.interp(t, ts, regime_shares(ts, sa, sb, th))
                true = a * t / (t - m.F_A) if t <= th else b * t / (t - m.F_B)
                assert reg <= true * (1 + 1e-12)


def test_prompt_class_levels_stay_below_the_share():
    """(3), (6): a chunk of c tokens in an iteration of time T >= T(c alone) has per-token
    time T / c at least the class rate, and its class's shares are below its true share."""
    cost = lp.cost_model()
    m = iteration_minorant(cost)
    classes = prefill_classes(cost, m, 3000)
    rng = np.random.default_rng(4)
    for _ in range(400):
        c = int(rng.integers(1, 3001))
        q = max(j for j, pc in enumerate(classes) if pc.lo <= c)
        pc = classes[q]
        assert pc.lo <= c <= pc.hi
        T = float(cost.prefill_alone_s([c])[0]) * rng.uniform(1.0, 6.0)
        tau = T / c
        assert tau >= pc.rate - 1e-15
        Fa, Fb = m.F_A - m.fixed_dec, m.F_B - m.fixed_dec
        true_a = m.chunk_a(c) / c * T / (T - Fa)
        true_b = m.chunk_b(c) / c * T / (T - Fb)
        assert np.interp(tau, pc.t, pc.share_a) <= true_a * (1 + 1e-12)
        assert np.interp(tau, pc.t, pc.share_b) <= true_b * (1 + 1e-12)
        for th in (m.F_A * 1.3, m.F_A * 2.5):
            reg = np.interp(tau, pc.t, regime_prompt_shares(pc, th))
            assert reg <= (true_a if T <= th else true_b) * (1 + 1e-12)


def test_decode_floor_is_below_the_lone_iterations():
    cost = lp.cost_model()
    S, grid = decode_floor(cost, 5000, max_points=64)
    d = np.diff(S)
    ctx = np.arange(0, 5001)
    assert np.all(d <= cost.decode_alone_s(ctx) * (1 + 1e-12))
    assert np.all(d <= cost.prefill_alone_s(np.ones(ctx.size, np.int64), ctx) * (1 + 1e-12))


def test_counted_prompt_tokens_count_each_block_once():
    bt = 4
    blocks = [[1, 2, 3], [1, 2, 9], [7], [1, 2, 3, 4]]
    prompts = [13, 14, 5, 17]
    tr = lp.Trace.from_arrays(arrival_s=np.arange(4.0), prompt_tokens=prompts,
                              output_tokens=[2] * 4, block_ids=blocks, block_tokens=bt)
    got = counted_prompt_tokens(tr)
    distinct = len({b for lst in blocks for b in lst}) * bt
    tails = sum(p - len(lst) * bt for p, lst in zip(prompts, blocks))
    assert got.sum() == distinct + tails
    assert got.tolist() == [13, 14 - 8, 5, 17 - 12]


def test_srpt_flow_time_on_hand_cases():
    assert srpt_flow_time(np.array([0.0, 1.0]), np.array([3.0, 1.0])) == pytest.approx(5.0)
    assert srpt_flow_time(np.array([0.0, 0.0, 0.0]), np.array([1.0, 2.0, 3.0])) == \
        pytest.approx(1 + 3 + 6)
    assert srpt_flow_time(np.array([0.0, 5.0]), np.array([1.0, 1.0]), speed=2.0) == \
        pytest.approx(1.0)
    rng = np.random.default_rng(5)
    for _ in range(30):
        r = np.sort(rng.uniform(0, 5, 6))
        p = rng.uniform(0.1, 2, 6)
        v = srpt_flow_time(r, p)
        fcfs, t = 0.0, 0.0
        for ri, pi in zip(r, p):
            t = max(t, ri) + pi
            fcfs += t - ri
        assert p.sum() - 1e-9 <= v <= fcfs + 1e-9


def _tiny(seed, n=4, R=1):
    rng = np.random.default_rng(seed)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 0.2, n)),
                              prompt_tokens=rng.integers(30, 1200, n),
                              output_tokens=rng.integers(2, 50, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=R))


def test_certified_bound_matches_the_lp_and_stays_below_the_optimum():
    inst = _tiny(0)
    sol = solve("cost-lp", inst)
    assert sol.solved and sol.objective == sol.bound
    rounds = sol.info["rounds"]
    assert all(r["status"] == "optimal" for r in rounds)
    iso = solve("srpt-bound", inst).info["floors_total_s"]
    exact = solve("schedule-exact", inst)
    assert exact.status == Status.OPTIMAL
    assert iso <= sol.bound <= exact.objective


def test_time_limit_gives_limit_never_a_wrong_bound():
    inst = _tiny(1, n=6, R=2)
    full = solve("cost-lp", inst)
    quick = solve("cost-lp", inst, time_limit_s=1e-3)
    assert quick.status in (Status.LIMIT, Status.OPTIMAL, Status.FEASIBLE)
    if quick.status == Status.LIMIT:
        assert math.isnan(quick.objective)
    assert not quick.bound > full.bound + 1e-6  # NaN or at most the full LP's


def test_unsupported_instances_say_why():
    inst = _tiny(2)
    table = lp.TableCost(linear=([1, 1000], [1e-4, 1e-3]))
    sol = solve("cost-lp", inst.with_(cost=table))
    assert sol.status == Status.ERROR and "not supported" in sol.message
    tr = inst.trace
    dep = lp.Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                               output_tokens=tr.output_tokens, parent=[-1, 0, -1, -1])
    sol = solve("cost-lp", inst.with_(trace=dep))
    assert sol.status == Status.ERROR and "parent" in sol.message


def test_bad_interval_is_a_clear_error():
    with pytest.raises(ValueError, match="dt_s"):
        solve("cost-lp", _tiny(3), dt_s=-1.0)
    with pytest.raises(ValueError, match="dt_scale"):
        solve("cost-lp", _tiny(3), dt_scale=0.0)
    with pytest.raises(ValueError, match="window_rounds"):
        solve("cost-lp", _tiny(3), window_rounds=0)


def test_the_default_grid_is_finer_for_small_instances():
    """models/cost-lp.md §3: the median least latency over 5, divided by min(4, 200 / n)
    below 200 requests, at least 1 ms."""
    from lpserve.opt.cost_lp_build import default_dt_s

    ell = np.array([0.5, 1.0, 3.0])
    assert default_dt_s(np.repeat(ell, 400)) == pytest.approx(1.0 / 5.0)    # 1,200 requests
    assert default_dt_s(np.repeat(ell, 50)) == pytest.approx(1.0 / 5.0 / (200 / 150))
    assert default_dt_s(ell) == pytest.approx(1.0 / 20.0)                   # 4x finer at most
    assert default_dt_s(np.full(3, 1e-3)) == 1e-3
    assert default_dt_s(np.zeros(0)) == 1.0
    inst = _tiny(4, n=5)
    floors = request_floors(inst, inst.cost_model())
    assert solve("cost-lp", inst).info["dt_s"] == pytest.approx(
        default_dt_s(floors.prefill_s + floors.decode_s))


def test_a_coarser_grid_in_one_round_is_still_below_the_optimum():
    """``lpserve gap``'s default LP (a grid four times coarser, one round): its step is
    four times the default's, it solves in one round and its bound stays below the exact
    optimum of the simulator's schedules."""
    inst = _tiny(4, n=5)
    fine = solve("cost-lp", inst)
    coarse = solve("cost-lp", inst, dt_scale=4.0, window_rounds=1)
    assert coarse.solved and len(coarse.info["rounds"]) == 1
    assert coarse.info["dt_s"] == pytest.approx(4.0 * fine.info["dt_s"])
    exact = solve("schedule-exact", inst)
    assert exact.status == Status.OPTIMAL
    assert coarse.bound <= exact.objective * (1 + 1e-9)


def test_certificate_uses_the_bounds_the_mass_rows_imply():
    """models/cost-lp.md §4: a token column holds at most its request's mass, which the
    certificate uses in place of the interval's time at its level, and columns are priced by
    what they could take off the bound. Arrivals late in the trace (a large objective, so
    a relative pricing tolerance lets columns through) once cost the certificate 4 %
    (150 requests: 2.447 s certified against the LP's 2.550 s); now it is the LP's own."""
    from lpserve.opt.cost_lp import _run_highs, lagrangian_bound, mass_capped_hi
    from lpserve.opt.cost_lp_build import build_cost_lp

    rng = np.random.default_rng(5)
    n = 150
    tr = lp.Trace.from_arrays(arrival_s=1000.0 + np.sort(rng.uniform(0, 6.0, n)),
                              prompt_tokens=rng.integers(50, 2000, n),
                              output_tokens=rng.integers(20, 300, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=2))
    model = build_cost_lp(inst, dt_scale=4)
    cap = mass_capped_hi(model)
    assert np.all(cap <= model.col_hi)
    o, s = np.asarray(tr.output_tokens), np.asarray(tr.prompt_tokens)
    dec = model.columns("decode")
    assert np.all(cap[dec] <= o[model.col_req[dec]] - 1)
    pre = model.columns("prefill")
    assert np.all(cap[pre] <= s[model.col_req[pre]])
    assert np.any(cap[pre] < model.col_hi[pre])
    st, lb, _, x, y, _ = _run_highs(model, None, "highs")
    assert st == Status.OPTIMAL
    assert np.all(x <= cap + 1e-6)          # the LP's optimum is inside the implied box
    lp_value = float(model.c @ x + model.const)
    assert lb <= lp_value + 1e-6 * abs(lp_value)
    assert lb >= lp_value - 1e-6 * abs(lp_value)
    assert lagrangian_bound(model, y) <= lb + 1e-9   # the interval's time is a looser box
