"""Numba kernels shared by the policies and the simulator (layer between the policy
contract and its implementations): the drift-plus-penalty controller
(:mod:`lpserve.kernels.dpp`), which the Python controller
(:mod:`lpserve.policies.lyapunov`) and the compiled replica engine both run."""
