"""Numba kernels shared by the policies and the simulator (layer between the policy
contract and its implementations), each rule written once: the drift-plus-penalty
controller (:mod:`lpserve.kernels.dpp`), which the Python controller
(:mod:`lpserve.policies.lyapunov`) and the compiled replica engine both run; the History
predictor's buckets (:mod:`lpserve.kernels.history`), which
:class:`lpserve.policies.predictors.History` and the compiled arrivals kernels both run;
a min-heap over parallel arrays (:mod:`lpserve.kernels.heap`); and the StructRef types
of their structures (:mod:`lpserve.kernels.structs`)."""
