"""Evaluation (layer 5): policies x instances -> tidy results, ratios to lower bounds,
robustness over workloads and loads. Plots live in :mod:`lpserve.evaluate.plots`.

>>> import lpserve as lp
>>> from lpserve.evaluate import compare
>>> inst = lp.Instance(trace=lp.bundled_trace().window(0, 60),
...                    cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2))
>>> table = compare(inst, ["vllm", "vllm+least-outstanding", "sarathi"])  # doctest: +SKIP

Every comparison asserts that no lower bound exceeds a simulated policy's value of the same
metric over the same requests (:class:`BoundViolation` otherwise).
"""
from __future__ import annotations

from lpserve.evaluate.bounds import (
                                     BOUNDS,
                                     METRIC_KEYS,
                                     Bound,
                                     BoundViolation,
                                     ClaimedBound,
                                     CostModelBound,
                                     PerRequestBound,
                                     check_bound,
                                     flatten,
                                     resolve_bounds,
)
from lpserve.evaluate.capacity import CapacityResult, bisect_capacity, capacity, meets_slo
from lpserve.evaluate.compare import (
                                     BASELINES,
                                     PREFERRED_PRINCIPLED,
                                     SOLVED_POLICIES,
                                     PolicyUnavailable,
                                     Samples,
                                     common_cases,
                                     compare,
                                     default_policies,
                                     resolve_policies,
                                     robustness,
                                     robustness_summary,
                                     solved_policy,
)

__all__ = ["BASELINES", "BOUNDS", "METRIC_KEYS", "PREFERRED_PRINCIPLED", "SOLVED_POLICIES",
           "Bound", "BoundViolation", "CapacityResult", "bisect_capacity", "capacity",
           "meets_slo", "ClaimedBound", "CostModelBound", "PerRequestBound",
           "PolicyUnavailable", "Samples", "check_bound", "common_cases",
           "compare", "default_policies", "flatten", "resolve_bounds", "resolve_policies",
           "robustness", "robustness_summary", "solved_policy"]
