"""Vidur device and model names to lpserve catalog keys (no Vidur needed)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lpserve.adapters._vidur_names import cluster_of, lpserve_keys


def _replica(device: str = "a100", model: str = "meta-llama/Llama-2-7b-hf", tp: int = 2):
    return SimpleNamespace(device=device, model_name=model, tensor_parallel_size=tp)


def test_vidur_names_map_to_catalog_keys():
    assert lpserve_keys("", "", _replica()) == ("a100-80gb", "llama-2-7b")
    assert lpserve_keys("h100-sxm", "llama-2-70b", _replica()) == ("h100-sxm", "llama-2-70b")


@pytest.mark.parametrize("replica, flag", [
    (_replica(device="tpu-v5"), "--lpserve_cost_predictor_config_gpu"),
    (_replica(model="org/not-a-model"), "--lpserve_cost_predictor_config_llm"),
])
def test_unknown_names_say_which_flag_sets_them(replica, flag):
    with pytest.raises(ValueError, match=flag):
        lpserve_keys("", "", replica)


def test_cluster_keeps_vidur_names_outside_the_catalog():
    c = cluster_of(_replica(), SimpleNamespace(block_size=16), 3)
    assert (c.gpu, c.llm, c.tp, c.replicas, c.block_tokens) == ("a100-80gb", "llama-2-7b", 2,
                                                               3, 16)
    c = cluster_of(_replica(device="tpu-v5", model="org/x"), SimpleNamespace(block_size=32), 1)
    assert (c.gpu, c.llm) == ("tpu-v5", "org/x")
