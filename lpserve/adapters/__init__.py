"""Engine adapters (layer 5): run lpserve policies inside serving engines and peer
simulators.

* :mod:`lpserve.adapters.vllm` — ``PolicyScheduler``, a vLLM V1 scheduler class
  (``--scheduler-cls lpserve.adapters.vllm.PolicyScheduler``); vLLM 0.32.x.
* :mod:`lpserve.adapters.vidur` — lpserve router / replica scheduler / cost model
  registered in Vidur's registries; ``vidur==0.0.26``.
* :mod:`lpserve.adapters._order` — the engine-independent core both use (policy
  resolution, views from plain request records, rank ordering, error wrapping, view
  recording).

Importing this package imports no engine; each engine module imports its engine and
checks the version when it is imported.
"""
