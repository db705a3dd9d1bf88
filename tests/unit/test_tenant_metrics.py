"""Per-tenant metrics in every summary (lpserve/objectives.py, Result.summary): service
received, Jain's index, TTFT/E2E percentiles and SLO attainment per tenant and per tier."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.objectives import jain_index


def test_jain_index():
    assert jain_index(np.array([3.0, 3.0, 3.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert np.isnan(jain_index(np.zeros(3)))


def _inst(**kw):
    rng = np.random.default_rng(0)
    n = 40
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 2, n)),
                              prompt_tokens=rng.integers(50, 300, n),
                              output_tokens=rng.integers(5, 60, n),
                              tenant=np.r_[np.zeros(30, int), np.ones(10, int)])
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       slo=lp.SLO(ttft_s=0.5, tpot_s=0.05), **kw)


def test_summary_has_per_tenant_service_latency_and_attainment():
    inst = _inst()
    res = lp.simulate(inst, "vllm")
    s = res.summary()
    a = res.arrays
    assert set(s["tenants"]) == {"0", "1"}
    for t, row in s["tenants"].items():
        m = a["tenant"] == int(t)
        assert row["n_requests"] == int(m.sum())
        assert row["prompt_tokens"] == int(a["prompt_tokens"][m].sum())
        assert row["output_tokens"] == int(a["generated_tokens"][m].sum())
        assert row["ttft_s"]["p99"] == pytest.approx(np.percentile(a["ttft_s"][m], 99))
        ok = (a["ttft_s"][m] <= 0.5) & ~(a["tpot_s"][m] > 0.05)
        assert row["slo_attainment"] == pytest.approx(ok.mean())
    svc = [s["tenants"][t]["service_tokens"] for t in ("0", "1")]
    assert s["jain_index"] == pytest.approx(jain_index(np.array(svc, float)))
    assert set(s["tiers"]) == {"default"}


def test_tiers_have_their_own_objectives():
    gold = lp.Tier(name="gold", slo=lp.SLO(ttft_s=10.0, tpot_s=1.0), tenants=(1,))
    inst = _inst(tiers=(gold,))
    s = lp.simulate(inst, "vllm").summary()
    assert set(s["tiers"]) == {"gold", "default"}
    assert s["tiers"]["gold"]["n_requests"] == 10 and s["tiers"]["gold"]["ttft_s"] == 10.0
    assert s["tiers"]["gold"]["slo_attainment"] == 1.0        # loose objectives all met
    assert s["tenants"]["1"]["slo_attainment"] == 1.0
    assert inst.digest() != _inst().digest()
    with pytest.raises(ValueError, match="tenant 1 is in tiers"):
        _inst(tiers=(gold, lp.Tier(name="x", slo=lp.SLO(), tenants=(1,))))
    with pytest.raises(ValueError, match="Tier.name"):
        lp.Tier(name="default", slo=lp.SLO(), tenants=(0,))


def test_tiered_shedding_reports_shed_requests_as_held_back():
    inst = _inst()
    pol = lp.make_policy("tiered-vtc", tiers={1: 1}, shed_after_s={1: 0.2}, max_num_seqs=2)
    res = lp.simulate(inst, pol)
    a = res.arrays
    shed = a["reason"] == "held_back"
    assert shed.any() and (a["tenant"][shed] == 1).all()
    assert pol.scheduler.shed == set(np.flatnonzero(shed).tolist())
    assert res.summary()["tenants"]["0"]["n_finished"] == 30
    ref = lp.simulate(inst, lp.make_policy("tiered-vtc", tiers={1: 1}, shed_after_s={1: 0.2},
                                           max_num_seqs=2), reference=True)
    assert ref.digest() == res.digest()
    assert lp.capacity is not None   # the capacity search is part of the public surface
