"""Tensor-parallel scaling on H100: more GPUs never make a batch-1 request slower.

For every dense catalog model of 7 B to 75 B parameters, every engine profile and the
default calibration, the predicted latency of one request (a prefill of ``prompt`` tokens
and ``output - 1`` decode iterations) is non-increasing from TP1 to TP8 over the degrees
the model supports (heads divisible, weights fitting in 80 GB). Measurements show this
(NeMo's TensorRT-LLM Llama-2-7B latencies fall to 0.63x from TP1 to TP8); the cost model
inverted it before communication came from the interconnect (NVLink 4's measured
latency instead of an A100 NCCL fit).
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lpserve.cost import cost_model, get_llm, llm_names

DENSE = [k for k in llm_names()
         if get_llm(k).experts == 0 and 6e9 <= get_llm(k).n_params <= 75e9]
ENGINES = (None, "vllm", "trtllm", "sglang", "kernels")


def _models(llm: str, engine: str | None) -> dict[int, object]:
    out = {}
    for tp in (1, 2, 4, 8):
        try:
            out[tp] = cost_model(gpu="h100-sxm", llm=llm, tp=tp, engine=engine)
        except ValueError:  # heads not divisible, or weights too large for the GPUs
            continue
    return out


MODELS = {(m, e): _models(m, e) for m in DENSE for e in ENGINES}


def request_s(model, prompt: int, output: int) -> float:
    """Seconds of one request alone: its prefill, then output - 1 decode iterations."""
    return (model.batch_time_s([prompt], [0], [])
            + model.decode_run_s([prompt + 1], output - 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DENSE), st.sampled_from(ENGINES), st.integers(1, 32768),
       st.integers(1, 1024))
def test_request_latency_non_increasing_in_tp(llm, engine, prompt, output):
    models = MODELS[(llm, engine)]
    tps = sorted(models)
    assert len(tps) >= 2, llm
    times = [request_s(models[tp], prompt, output) for tp in tps]
    for a, b, ta, tb in zip(tps, tps[1:], times, times[1:]):
        assert tb <= ta * (1 + 1e-12), (llm, engine, prompt, output, a, b, ta, tb)


def test_every_model_of_the_range_is_covered():
    assert {"llama-2-7b", "llama-3.1-8b", "qwen3-8b", "qwen3-32b", "llama-3.1-70b",
            "llama-2-70b"} <= set(DENSE)
    assert all(8 in MODELS[(m, None)] for m in ("llama-2-7b", "llama-3.1-70b"))
    lat = [request_s(MODELS[("llama-2-7b", "trtllm")][tp], 128, 20) for tp in (1, 2, 4, 8)]
    assert np.all(np.diff(lat) < 0)  # strictly falling where NeMo measured it
