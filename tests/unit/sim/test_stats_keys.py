"""``Result.stats`` has the same keys on every run, whichever engine ran it and whichever
engine features are on (an off feature reads None or zero)."""
from __future__ import annotations

import numpy as np

import lpserve as lp
from lpserve.policy import as_scheduler


def _trace(n: int = 60) -> lp.Trace:
    rng = np.random.default_rng(3)
    return lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0.0, 3.0, n)),
                                prompt_tokens=rng.integers(20, 600, n),
                                output_tokens=rng.integers(1, 80, n))


def _python_ranks(view):  # a scheduler written in Python
    return np.asarray(view.arrival_s, np.float64)


def test_every_run_has_the_same_stats_keys():
    one = lp.Instance(trace=_trace(), cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    two = one.with_(cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2))
    vllm = lp.make_policy("vllm")
    runs = {
        "compiled": lp.simulate(one, vllm),
        "reference": lp.simulate(one, vllm, reference=True),
        "python ranks": lp.simulate(one, vllm.with_(scheduler=as_scheduler(_python_ranks),
                                                     name="py")),
        "host link": lp.simulate(one, "fastserve"),
        "speculation": lp.simulate(one, "spec-fixed"),
        "rebalancer": lp.simulate(two, "rebalance-llumnix"),
        "offload": lp.simulate(one, lp.make_policy("vllm", kv_offload_gib=4)),
        "predictor": lp.simulate(one, "mcsf", predictor="history"),
        "python evictor": lp.simulate(one, "vllm-chunked+ttl-pin"),
    }
    keys = {name: sorted(r.stats) for name, r in runs.items()}
    assert all(k == keys["compiled"] for k in keys.values()), keys
    engines = {r.stats["engine"] for r in runs.values()}
    assert {"compiled", "compiled+reference", "compiled+python-ranks",
            "compiled+python-evictor"} <= engines
    assert runs["compiled"].stats["speculation"] is None
    assert runs["compiled"].stats["offload"] is None
    assert runs["compiled"].stats["migrations"] == 0
    assert runs["speculation"].stats["speculation"]["steps"] > 0
    assert runs["offload"].stats["offload"]["tier_blocks"] > 0
    summaries = {name: sorted(r.summary()) for name, r in runs.items()}
    assert all(k == summaries["compiled"] for k in summaries.values())
