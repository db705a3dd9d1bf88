"""Metric definitions and instance digests."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve import objectives as obj


def test_definitions():
    arr = np.array([0.0, 1.0, 2.0])
    first = np.array([0.5, 1.5, np.nan])
    fin = np.array([2.5, 1.5, np.nan])
    out = np.array([5, 1, 3])
    assert obj.ttft_s(arr, first)[:2].tolist() == [0.5, 0.5]
    tp = obj.tpot_s(first, fin, out)
    assert tp[0] == pytest.approx(0.5) and np.isnan(tp[1])  # 1-token output has no TPOT
    assert obj.meets_slo(np.array([0.5, 2.0]), np.array([np.nan, 0.1]), 1.0, 1.0).tolist() \
        == [True, False]
    d = obj.distribution(np.array([1.0, 2.0, np.nan, 3.0]))
    assert d["mean"] == 2.0 and d["p50"] == 2.0
    s = obj.summarize(arrival_s=arr, first_token_s=first, finish_s=fin,
                      first_scheduled_s=arr, output_tokens=out,
                      finished=np.array([True, True, False]),
                      rejected=np.array([False, False, True]),
                      cached_prompt_tokens=np.array([0, 10, 0]),
                      prompt_tokens_seen=np.array([10, 10, 0]), slo_ttft_s=1.0,
                      slo_tpot_s=1.0, wall_s=0.1)
    assert s["n_finished"] == 2 and s["n_rejected"] == 1 and s["prefix_hit_rate"] == 0.5
    assert s["throughput_rps"] == pytest.approx(2 / 2.5)


def test_instance_digest_is_stable_and_sensitive():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[5, 6], output_tokens=[1, 2])
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b")
    a = lp.Instance(trace=tr, cluster=cl).digest()
    assert a == lp.Instance(trace=tr, cluster=cl).digest()
    assert a != lp.Instance(trace=tr, cluster=cl.with_(replicas=2)).digest()
    assert a != lp.Instance(trace=tr, cluster=cl, horizon_s=5.0).digest()
    tr2 = lp.Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[5, 7], output_tokens=[1, 2])
    assert a != lp.Instance(trace=tr2, cluster=cl).digest()
    with pytest.raises(ValueError, match="SLO.ttft_s"):
        lp.SLO(ttft_s=0.0)
