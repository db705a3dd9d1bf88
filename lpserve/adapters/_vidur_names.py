"""Vidur's device and model names as lpserve catalog keys (no Vidur import needed).

Used by :mod:`lpserve.adapters.vidur` for the ``lpserve_cost`` predictor (which needs
catalog keys) and for the cluster a policy's ``reset`` receives.
"""
from __future__ import annotations

from typing import Any

#: Vidur ``--replica_config_device`` -> lpserve catalog GPU
GPU_KEYS = {"a100": "a100-80gb", "h100": "h100-sxm", "a40": "a40", "l40s": "l40s",
            "h200": "h200"}


def lpserve_keys(gpu: str, llm: str, replica_config: Any) -> tuple[str, str]:
    """``(gpu, llm)`` catalog keys: the given ones, else Vidur's device through
    :data:`GPU_KEYS` and the last part of its model name, lower case, without ``-hf``
    (``meta-llama/Llama-2-7b-hf`` -> ``llama-2-7b``). A ValueError names a key the catalog
    lacks and the flag that sets it."""
    from lpserve.cost import catalog

    device = str(getattr(replica_config, "device", "")).lower()
    gpu = gpu or GPU_KEYS.get(device, device)
    if not llm:
        name = str(replica_config.model_name).split("/")[-1].lower()
        llm = name[:-3] if name.endswith("-hf") else name
    gpus, llms = catalog.gpu_names(), catalog.llm_names()
    if gpu not in gpus:
        raise ValueError(f"lpserve_cost predictor: GPU {gpu!r} (Vidur device {device!r}) is "
                         f"not in lpserve's catalog {gpus}; set "
                         "--lpserve_cost_predictor_config_gpu")
    if llm not in llms:
        raise ValueError(f"lpserve_cost predictor: LLM {llm!r} (Vidur model "
                         f"{replica_config.model_name!r}) is not in lpserve's catalog {llms}; "
                         "set --lpserve_cost_predictor_config_llm")
    return gpu, llm


def cluster_of(replica_config: Any, cache_config: Any, num_replicas: int) -> Any:
    """The lpserve :class:`~lpserve.cluster.Cluster` a policy's ``reset`` receives."""
    from lpserve.cluster import Cluster

    try:
        gpu, llm = lpserve_keys("", "", replica_config)
    except ValueError:  # a model outside lpserve's catalog: the names as Vidur has them
        gpu, llm = str(replica_config.device), str(replica_config.model_name)
    return Cluster(gpu=gpu, llm=llm, tp=int(replica_config.tensor_parallel_size),
                   replicas=int(num_replicas), block_tokens=int(cache_config.block_size))
