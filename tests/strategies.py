"""Hypothesis strategies for lpserve: traces of every shape, including adversarial ones.

Sections are owned by topic: traces first; simulator, cost and policy strategies follow.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from lpserve.instance import SLO
from lpserve.trace import Trace

# ----------------------------------------------------------------------------- traces
token_counts = st.integers(min_value=1, max_value=8192)


@st.composite
def arrival_times(draw, n: int, *, adversarial: bool = True) -> np.ndarray:
    """``n`` sorted arrival times; adversarial draws include ties, bursts and huge gaps."""
    kind = draw(st.sampled_from(["poissonish", "ties", "burst", "gaps"] if adversarial
                                else ["poissonish"]))
    if kind == "ties":
        gaps = [draw(st.sampled_from([0.0, 0.0, 1e-9, 1.0])) for _ in range(n)]
    elif kind == "burst":
        gaps = [0.0] * (n // 2) + [draw(st.floats(0, 10)) for _ in range(n - n // 2)]
    elif kind == "gaps":
        gaps = [draw(st.floats(0, 1e6)) for _ in range(n)]
    else:
        gaps = [draw(st.floats(1e-3, 5.0)) for _ in range(n)]
    t = np.cumsum(np.asarray(gaps, dtype=np.float64))
    start = draw(st.floats(0, 1e5))
    return start + t - (t[0] if n else 0.0)


@st.composite
def block_lists(draw, prompt_tokens: np.ndarray, block_tokens: int) -> list[list[int]]:
    """Prefix-block ids consistent with the prompts: requests share leading runs of an
    earlier request's ids, then continue with fresh ids."""
    out: list[list[int]] = []
    next_id = 0
    for p in prompt_tokens.tolist():
        nb = -(-p // block_tokens)
        row: list[int] = []
        if out and draw(st.booleans()):
            src = out[draw(st.integers(0, len(out) - 1))]
            row = src[:draw(st.integers(0, min(nb, len(src))))]
        while len(row) < nb:
            row.append(next_id)
            next_id += 1
        out.append(row)
    return out


@st.composite
def traces(draw, *, min_size: int = 0, max_size: int = 40, blocks: bool | None = None,
           ids: bool | None = None, adversarial: bool = True) -> Trace:
    """Valid traces: any size in range, optional blocks, ids, parents and predictions."""
    n = draw(st.integers(min_size, max_size))
    arrival = draw(arrival_times(n, adversarial=adversarial))
    prompt = np.asarray(draw(st.lists(token_counts, min_size=n, max_size=n)), np.int64)
    output = np.asarray(draw(st.lists(st.integers(1, 2048), min_size=n, max_size=n)),
                        np.int64)
    kw: dict = {}
    if blocks if blocks is not None else draw(st.booleans()):
        bt = draw(st.sampled_from([1, 16, 512]))
        kw["block_ids"] = draw(block_lists(prompt, bt))
        kw["block_tokens"] = bt
    if ids if ids is not None else draw(st.booleans()):
        kw["session_id"] = draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n))
        kw["tenant"] = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
        kw["program_id"] = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
        kw["parent"] = [draw(st.integers(-1, i - 1)) for i in range(n)]
        lo = [draw(st.integers(1, 2048)) for _ in range(n)]
        kw["predicted_lo"] = lo
        kw["predicted_hi"] = [x + draw(st.integers(0, 500)) for x in lo]
    return Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output,
                             name="hyp", **kw)


# ============================================================================ simulator
# (owned by the simulator; small instances that exercise preemption, swap, prefix hits)
SIM_ENGINES = ("vllm", "vllm-v0", "vllm-chunked", "sarathi", "orca", "static")


@st.composite
def sim_traces(draw, *, max_size: int = 24) -> Trace:
    """Small traces whose requests fit a tight KV pool; ties and bursts included."""
    n = draw(st.integers(1, max_size))
    arrival = draw(arrival_times(n, adversarial=True))
    arrival = np.minimum(arrival - arrival[0], 50.0 * np.arange(1, n + 1))  # bounded gaps
    arrival = np.maximum.accumulate(arrival)
    prompt = np.asarray(draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), np.int64)
    output = np.asarray(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), np.int64)
    kw: dict = {}
    if draw(st.booleans()):
        bt = draw(st.sampled_from([4, 16, 32]))
        kw["block_ids"] = draw(block_lists(prompt, bt))
        kw["block_tokens"] = bt
    return Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output,
                             name="sim-hyp", **kw)


@st.composite
def sim_instances(draw, *, max_size: int = 24, disaggregated: bool | None = None):
    """(Instance, Policy) pairs: unit-round or analytic costs, tight memory, any engine."""
    from lpserve.cluster import Cluster
    from lpserve.cost import UnitRoundCost
    from lpserve.instance import Instance
    from lpserve.registry import make_policy

    trace = draw(sim_traces(max_size=max_size))
    disagg = draw(st.booleans()) if disaggregated is None else disaggregated
    layout = (dict(replicas=1, prefill_replicas=draw(st.integers(1, 2)),
                   decode_replicas=draw(st.integers(1, 2)))
              if disagg else dict(replicas=draw(st.integers(1, 3))))
    if draw(st.booleans()):
        bt = draw(st.sampled_from([1, 4, 16]))
        cost = UnitRoundCost(memory_tokens=draw(st.integers(200, 3000)))
        cl = Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=bt,
                     host_memory_gb=draw(st.sampled_from([0.0, 1e-6, 64.0])), **layout)
    else:
        cost = None
        cl = Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=16,
                     gpu_memory_fraction=draw(st.sampled_from([0.171, 0.175, 0.9])),
                     host_memory_gb=draw(st.sampled_from([0.0, 0.01, 64.0])), **layout)
    engine = draw(st.sampled_from(SIM_ENGINES))
    params: dict = {"router": draw(st.sampled_from(["round-robin", "least-outstanding",
                                                    "power-of-two", "prefix-affinity"]))}
    if engine in ("vllm", "vllm-v0", "vllm-chunked", "sarathi"):
        params["preemption"] = draw(st.sampled_from(["recompute", "swap", "compress-swap"]))
        params["max_num_seqs"] = draw(st.integers(1, 8))
        params["max_num_batched_tokens"] = draw(st.sampled_from([64, 256, 512, 4096]))
        params["prefix_caching"] = draw(st.booleans())
        params["evict_batch_blocks"] = draw(st.sampled_from([1, 4, 32]))
    else:
        params["max_num_seqs"] = draw(st.integers(1, 6))
        params["reserve_tokens"] = draw(st.sampled_from([512, 1024]))
        params["max_model_len"] = params["reserve_tokens"]
    policy = make_policy(engine, **params)
    inst = Instance(trace=trace, cluster=cl, cost=cost,
                    horizon_s=draw(st.sampled_from([None, None, 5.0, 500.0])))
    return inst, policy


# ----------------------------------------------------------------------------- results
#: per-request result fields that must agree between fast and reference simulations
RESULT_FIELDS = ("first_scheduled_s", "first_token_s", "finish_s", "preemptions",
                 "cached_prompt_tokens", "replica", "decode_replica", "status", "reason",
                 "generated_tokens")


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays (NaN equal to NaN for floats, element-wise for object arrays)."""
    if a.dtype == object:
        return list(a) == list(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def fallback_predictor(inst, policy) -> str | None:
    """``"none"`` when ``policy`` (a Policy or registered name) reads predicted output
    lengths and ``inst``'s trace carries none, else ``None``: simulator tests run such a
    policy on its documented fallback on purpose (``lp.simulate`` refuses it otherwise)."""
    import lpserve as lp

    pol = lp.make_policy(policy) if isinstance(policy, str) else policy
    has = inst.trace.predicted_lo is not None and inst.trace.predicted_hi is not None
    return "none" if pol.reads_predictions and not has else None


def python_copy(role):
    """A copy of policy ``role`` whose class is a user's subclass of its class that defines
    no ``kernel_spec``: the simulator asks it in Python, in pauses of the compiled
    replicas, never through the role's compiled twin."""
    cls = type("User" + type(role).__name__, (type(role),), {})
    user = cls.__new__(cls)
    user.__dict__.update(role.__dict__)
    return user


def python_scheduler(policy):
    """``policy`` with its scheduler replaced by its :func:`python_copy`: ranked in Python,
    asked at every planning step with candidates; a scheduler that is also the engine's budget controller
    (VTC's meter) is replaced there too."""
    import dataclasses

    sched = policy.scheduler
    user = python_copy(sched)
    if policy.engine.budget_controller is sched:  # VTC meters its own service
        return policy.with_(scheduler=user, engine=dataclasses.replace(
            policy.engine, budget_controller=user))
    return policy.with_(scheduler=user)


def fast_and_reference(inst, policy, seed: int = 0, label: str = ""):
    """Simulate ``policy`` on ``inst`` in the fast and the reference mode (both with the
    invariant checker), assert every per-request result field and the digest agree, and
    return ``(fast, ref)``. A prediction-reading policy on a trace without predictions
    runs its fallback (:func:`fallback_predictor`)."""
    import lpserve as lp

    pred = fallback_predictor(inst, policy)
    fast = lp.simulate(inst, policy, seed=seed, check=True, predictor=pred)
    ref = lp.simulate(inst, policy, seed=seed, reference=True, check=True, predictor=pred)
    for f in RESULT_FIELDS:
        assert same_array(fast.arrays[f], ref.arrays[f]), (label, f)
    assert fast.digest() == ref.digest(), label
    return fast, ref


def preempting_instance(seed: int, host_memory_gb: float):
    """Twelve requests of 400-700 prompt tokens within 0.5 s on a Llama-2-7B replica with
    a tight KV pool (gpu_memory_fraction 0.171): FastServe preempts often."""
    import lpserve as lp

    rng = np.random.default_rng(seed)
    n = 12
    tr = Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 0.5, n)),
                           prompt_tokens=rng.integers(400, 700, n),
                           output_tokens=rng.integers(40, 80, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=0.171,
        host_memory_gb=host_memory_gb))


# ====================================================================== quantum ticks
# (owned by the tick arithmetic of lpserve.policy.roles; what found the empty decode run)
#: quanta of the registered schedulers and decimal ones whose multiples round in float64
QUANTA_S = (0.05, 0.1, 0.01, 0.3, 0.5, 0.7, 1.0 / 3.0, 2.5e-3)
#: decimal offsets of fractional arrivals in round-model instances (``8.1 / 0.05`` rounds)
ARRIVAL_OFFSETS_S = (0.0, 0.1, 0.05, 0.3, 0.15, 0.7, 0.01, 0.25, 1.0 / 3.0)


@st.composite
def quantum_boundaries(draw) -> tuple[float, float]:
    """``(now_s, quantum_s)`` on, just below and just above tick boundaries, produced the
    ways the simulator produces times: a product ``k * q``, a running sum of ``k`` quanta,
    a decimal offset plus whole rounds (``0.1 + 8``), the decimal literal ``round(k q)``,
    and one ulp either side of each."""
    q = draw(st.sampled_from(QUANTA_S) | st.floats(1e-4, 100.0))
    k = draw(st.integers(0, 200_000))
    how = draw(st.sampled_from(["product", "sum", "offset", "decimal"]))
    if how == "product":
        now = k * q
    elif how == "sum":
        now = float(np.cumsum(np.full(min(k, 5000) + 1, q))[-1])
    elif how == "offset":
        now = draw(st.sampled_from(ARRIVAL_OFFSETS_S)) + float(k % 5000)
    else:
        now = float(f"{k * q:.6f}")
    side = draw(st.sampled_from([0, 0, -1, 1]))
    if side:
        now = float(np.nextafter(now, side * np.inf))
    return max(now, 0.0), q


#: an SLO in round units (one iteration = 1 s) for the policies whose targets mirror it
#: (slo-aware, the Lyapunov controller); it changes no other policy's decisions
ROUND_SLO = SLO(ttft_s=4.0, tpot_s=2.0)
#: the same for instances of the analytic GPU cost model (seconds: interactive chat targets)
ANALYTIC_SLO = SLO(ttft_s=2.0, tpot_s=0.1)


@st.composite
def unit_round_instances(draw, *, max_size: int = 8, disaggregated: bool | None = False):
    """Round-model instances (``UnitRoundCost``, one token per block, tight memory) whose
    arrivals are whole rounds plus a decimal offset: iteration ends then fall on quantum
    boundaries through float rounding, as in the two-request reproducer of the empty
    decode run (arrivals 0.1 and 1.1, memory 64)."""
    from lpserve.cluster import Cluster
    from lpserve.cost import UnitRoundCost
    from lpserve.instance import Instance

    n = draw(st.integers(1, max_size))
    rounds = np.sort(np.asarray(draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)),
                                np.float64))
    offset = draw(st.sampled_from(ARRIVAL_OFFSETS_S))
    frac = np.asarray(draw(st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.05, 0.5]),
                                    min_size=n, max_size=n)), np.float64)
    arrival = np.maximum.accumulate(rounds + offset + frac)
    prompt = np.asarray(draw(st.lists(st.integers(1, 8), min_size=n, max_size=n)), np.int64)
    output = np.asarray(draw(st.lists(st.integers(1, 16), min_size=n, max_size=n)), np.int64)
    need = int((prompt + output).max())
    memory = draw(st.integers(max(need // 2, 2), 4 * need + 8))
    disagg = draw(st.booleans()) if disaggregated is None else disaggregated
    layout = (dict(replicas=1, prefill_replicas=1, decode_replicas=draw(st.integers(1, 2)))
              if disagg else dict(replicas=draw(st.integers(1, 2))))
    tr = Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output,
                           name="unit-round-hyp")
    return Instance(trace=tr, cluster=Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                              block_tokens=1, **layout),
                    cost=UnitRoundCost(memory_tokens=memory), slo=ROUND_SLO)


def needs_analytic_cost(name: str) -> bool:
    """Whether registered policy ``name`` refuses ``UnitRoundCost`` by design (speculative
    decoding prices its draft model with an analytic cost model)."""
    from lpserve.registry import make_policy

    return make_policy(name).engine.speculation is not None


@st.composite
def registry_cases(draw):
    """``(instance, registered policy name)``: any registered policy on a round-model
    instance with fractional arrivals or on a small analytic-cost instance of
    :func:`sim_instances` (tight memory, bursts, disaggregation, horizons); speculative
    policies, which refuse the round model, always get the analytic cost."""
    from lpserve.registry import policy_names

    name = draw(st.sampled_from(policy_names()))
    if not needs_analytic_cost(name) and draw(st.booleans()):
        return draw(unit_round_instances(max_size=10, disaggregated=None)), name
    cases = sim_instances(max_size=16)
    if needs_analytic_cost(name):
        cases = cases.filter(lambda case: case[0].cost is None)
    inst = draw(cases)[0]
    # the SLO-mirroring policies (slo-aware, dpp, the Lyapunov controller) refuse an
    # instance without targets; the SLO changes no other policy's decisions
    return inst.with_(slo=ANALYTIC_SLO if inst.cost is None else ROUND_SLO), name


# ====================================================================== hostile inputs
# (owned by the loaders and the sweep store: what found their tracebacks)
#: field texts no loader may accept as a token count, with why
BAD_COUNTS = ("nan", "NaN", "inf", "-inf", "Infinity", "1e20", "99999999999999999999",
              "9007199254740993", "-1", "12.5", "0x10", "", "abc", "1e400", "-0.5")


@st.composite
def bad_count_texts(draw) -> str:
    """A token-count field that must be refused: non-finite, huge (past 2^53 or int64),
    negative, fractional or not a number."""
    return draw(st.sampled_from(BAD_COUNTS) | st.integers(2 ** 53, 10 ** 30).map(str)
                | st.floats(allow_nan=True, allow_infinity=True).filter(
                    lambda x: not (x == x and abs(x) < 2 ** 53 and x >= 0 and x == int(x)))
                .map(repr))


@st.composite
def azure_texts(draw, *, n_max: int = 12) -> tuple[str, int]:
    """A valid Azure CSV (text) and its request count."""
    n = draw(st.integers(1, n_max))
    gaps = draw(st.lists(st.integers(0, 5_000_000), min_size=n, max_size=n))
    t, rows = 0, []
    for g in gaps:
        t += g
        s, frac = divmod(t, 1_000_000)
        rows.append(f"2023-11-16 18:{15 + s // 60 % 40:02d}:{s % 60:02d}.{frac:06d},"
                    f"{draw(st.integers(1, 9000))},{draw(st.integers(1, 900))}")
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n", n


@st.composite
def file_wrappings(draw, data: bytes) -> tuple[bytes, str]:
    """``data`` as a file might arrive: plain or gzipped, with or without a UTF-8
    byte-order mark, with LF or CRLF line ends; returns (bytes, suffix)."""
    import gzip

    if draw(st.booleans()):
        data = data.replace(b"\n", b"\r\n")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    if draw(st.booleans()):
        return gzip.compress(data, mtime=0), ".gz"
    return data, ""


#: ways a sweep store's part file gets damaged
STORE_DAMAGE = ("truncate", "edit", "forge", "garbage", "empty")


# ================================================================================ bounds
# (owned by the lower bounds: the instances where KV sharing, preemption and chunking decide
# whether a bound stays below every simulated schedule, proofs/cost-bound.md)
BOUND_ENGINES = ("vllm", "vllm-chunked", "sarathi")


@st.composite
def shared_prefix_traces(draw, *, min_size: int = 2, max_size: int = 16, token_scale: int = 1,
                         parents: bool | None = None, one_prefix: bool | None = None) -> Trace:
    """Many requests on a few long shared prefixes, most of them at once.

    Two shapes: *one long prefix* (the adversary of the old cost bound: a chain of 8-40
    blocks that three requests in four take whole, short tails and outputs, so full blocks
    are shared by many running requests and the sum of contexts far exceeds the pool) and
    *mixed* (up to three chains of 1-40 blocks taken whole, in part or not at all). Each
    request then has 0-2 fresh blocks and a partial last block. Block ids are in the trace
    (``block_tokens`` 1, 2 or 4 times ``token_scale``); arrivals are a burst at 0, ties or
    a spread; with ``parents`` some requests depend on an earlier one.
    """
    bt = draw(st.sampled_from([1, 2, 4])) * token_scale
    n = draw(st.integers(min_size, max_size))
    one = draw(st.booleans()) if one_prefix is None else one_prefix
    lengths = [draw(st.integers(8, 40))] if one else \
        [draw(st.integers(1, 40)) for _ in range(draw(st.integers(1, 3)))]
    chains = [list(range(1000 * (g + 1), 1000 * (g + 1) + k)) for g, k in enumerate(lengths)]
    out_max = max(2, (lengths[0] * bt) // (4 * token_scale)) if one else 12
    fresh = iter(range(10**6, 10**7))
    prompts, blocks = [], []
    for _ in range(n):
        g = 0 if one else draw(st.integers(-1, len(chains) - 1))
        row: list[int] = []
        if g >= 0:
            ch = chains[g]
            whole = draw(st.sampled_from([True, True, True, False]) if one else st.booleans())
            row = ch[:len(ch) if whole else draw(st.integers(0, len(ch)))]
        row = row + [next(fresh) for _ in range(draw(st.integers(0, 1 if one else 2)))]
        partial = draw(st.integers(0, bt - 1))
        if partial or not row:
            partial = partial or 1
            row.append(next(fresh))
            prompts.append((len(row) - 1) * bt + partial)
        else:
            prompts.append(len(row) * bt)
        blocks.append(row)
    outputs = [draw(st.integers(1, out_max)) * token_scale for _ in range(n)]
    kind = draw(st.sampled_from(["burst", "burst", "ties", "spread"]))
    if kind == "burst":
        arrival = np.cumsum([0.0] + [draw(st.sampled_from([0.0, 1e-4])) for _ in range(n - 1)])
    elif kind == "ties":
        arrival = np.repeat(np.arange(n // 2 + 1, dtype=float), 2)[:n]
    else:
        arrival = np.cumsum([0.0] + [draw(st.floats(0.0, 3.0)) for _ in range(n - 1)])
    kw: dict = {}
    if parents if parents is not None else draw(st.booleans()):
        kw["parent"] = [-1] + [draw(st.integers(-1, i - 1)) if draw(st.booleans()) else -1
                               for i in range(1, n)]
    return Trace.from_arrays(arrival_s=np.asarray(arrival, float), prompt_tokens=prompts,
                             output_tokens=outputs, block_ids=blocks, block_tokens=bt,
                             name="shared-prefix", **kw)


@st.composite
def bound_policies(draw, names: tuple[str, ...]):
    """A registered policy (no speculative decoding, outside every bound) or an engine
    with drawn preemption (recompute or swap), prefix caching, chunking budget and seats."""
    from lpserve.registry import make_policy

    name = draw(st.sampled_from(names))
    if name in BOUND_ENGINES and draw(st.booleans()):
        params = {"preemption": draw(st.sampled_from(["recompute", "swap"])),
                  "max_num_seqs": draw(st.integers(1, 16)),
                  "prefix_caching": draw(st.booleans())}
        if name != "vllm":
            params["max_num_batched_tokens"] = draw(st.sampled_from([8, 32, 512]))
        return name, make_policy(name, **params)
    return name, make_policy(name)


@st.composite
def tight_shared_prefix_instances(draw, names: tuple[str, ...], *, max_size: int = 16,
                                  analytic: bool = False):
    """(Instance, name, Policy): :func:`shared_prefix_traces` on a KV pool that holds the
    largest request but only a tenth to three fifths of the summed contexts (preemption
    and admission stalls happen; sharing decides how many run at once), one or two
    replicas, the unit-round cost model (or the analytic Llama-2-7B A100 model with
    ``gpu_memory_fraction`` near the weights, prompts in 16-token blocks)."""
    from lpserve.cluster import Cluster
    from lpserve.cost import UnitRoundCost
    from lpserve.instance import Instance

    scale = 16 if analytic else 1
    name, policy = draw(bound_policies(names))
    # live migration needs a trace without parent dependencies (models/simulator.md)
    no_parents = False if policy.rebalancer is not None else None
    # the adversary: a burst of many requests on one long prefix, one replica, a pool of a
    # tenth to a fifth of the summed contexts
    adversary = draw(st.booleans())
    trace = draw(shared_prefix_traces(
        min_size=max(2, max_size // 2) if adversary else 2, max_size=max_size,
        token_scale=scale, parents=no_parents, one_prefix=True if adversary else None))
    peak = int(np.max(trace.prompt_tokens + trace.output_tokens))
    bc = draw(st.sampled_from([1, 2, 4])) * scale
    host = draw(st.sampled_from([0.0, 1e-6, 64.0]))
    replicas = 1 if adversary else draw(st.integers(1, 2))
    if analytic:
        # Llama-2-7B on an A100-80GB: 2,968 / 3,787 / 7,064 tokens of KV at these fractions
        frac = draw(st.sampled_from([0.175, 0.18, 0.2]))
        cl = Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=replicas, block_tokens=bc,
                     gpu_memory_fraction=frac, host_memory_gb=host)
        inst = Instance(trace=trace, cluster=cl, slo=ANALYTIC_SLO)
    else:
        # a share of the summed contexts: only with sharing do many requests fit at once
        total = int(np.sum(trace.prompt_tokens + trace.output_tokens))
        share = draw(st.sampled_from([0.1, 0.15, 0.2] if adversary else [0.1, 0.2, 0.35, 0.6]))
        want = max(peak + 1 + bc, int(total * share))
        memory = -(-want // bc) * bc + bc
        cl = Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=replicas, block_tokens=bc,
                     host_memory_gb=host)
        inst = Instance(trace=trace, cluster=cl, cost=UnitRoundCost(memory_tokens=memory),
                        slo=ROUND_SLO)
    return inst, name, policy
