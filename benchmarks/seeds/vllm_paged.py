"""vLLM (Kwon et al., SOSP 2023): paged KV memory against reservation for the maximum
sequence length, on the paper's own set-up.

Set-up: OPT-13B on one A100-40GB (the paper's Fig. 12a), ShareGPT requests (first turns
of ShareGPT V3's lengths with prompt + output <= 2,048, OPT's context: the shared table,
or the same rows bundled with lpserve), Poisson
arrivals, no prefix caching (the paper's requests share nothing).

Engines: ``vllm-v0`` (the vLLM the paper measured: paged blocks allocated as tokens are
produced, prefill-first), ``vllm`` (today's V1: paged, chunked prefill), and ``orca``
with ``reserve_tokens = max_model_len = 2048`` (the paper's "Orca (Max)": each request
reserves KV for the longest sequence at admission).

Tables printed:

1. KV memory at one moderate rate: share of the KV pool held (time average of blocks held
   over the pool) and share of the held memory that stores token states
   (:func:`lpserve.objectives.kv_token_seconds` over block-seconds held; requests that were
   preempted are left out of the token count and counted);
2. capacity at equal latency: the highest Poisson rate whose mean normalized latency
   (end-to-end seconds per output token, the paper's metric) stays within 0.3 s/token,
   and the ratio to Orca (Max);
3. the claims table (paper's figure, lpserve's, ratio, verdict).

The paper's figures: share of KV memory storing token states 96.3 % for vLLM and 20.4 % /
26.8 % / 38.2 % for Orca (Max / Pow2 / Oracle) (Fig. 2); on ShareGPT vLLM sustains
1.7-2.7x the request rate of Orca (Oracle) and 2.7-8x that of Orca (Max) at similar
latency, and batches 4.3x more requests than Orca (Max) for OPT-13B (section 6.2,
Fig. 13a; lpserve counts the mean number of running requests at vLLM's capacity). Orca (Pow2) and (Oracle) reserve per request, which ``EngineConfig`` (one
``reserve_tokens`` per engine) does not express; they are not simulated.

Run: ``python benchmarks/seeds/vllm_paged.py [--requests 600] [--seed 0]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

import lpserve as lp
from lpserve import objectives as obj

GPU, LLM = "a100-40gb", "opt-13b"
MAX_LEN = 2048
LATENCY_TARGET_S = 0.3  # normalized latency (s/token) at which throughput is compared
ENGINES = {
    "vllm-v0": lambda: lp.make_policy("vllm-v0", prefix_caching=False),
    "vllm": lambda: lp.make_policy("vllm", prefix_caching=False),
    "orca-max": lambda: lp.make_policy("orca", reserve_tokens=MAX_LEN,
                                       max_model_len=MAX_LEN).with_(name="orca-max"),
}


def cluster() -> lp.Cluster:
    """One A100-40GB serving OPT-13B."""
    return lp.Cluster(gpu=GPU, llm=LLM, replicas=1)


def run(engine: str, trace: lp.Trace, seed: int = 0) -> lp.sim.Result:
    """Simulate ``engine`` on ``trace``."""
    return lp.simulate(lp.Instance(trace=trace, cluster=cluster()), ENGINES[engine](),
                       seed=seed)


def memory_row(res: lp.sim.Result, block_tokens: int = 16) -> dict[str, float]:
    """KV pool held, share of the held memory storing tokens, preempted requests."""
    a, st = res.arrays, res.stats
    fin = (a["status"] == "finished") & (a["preemptions"] == 0)
    span = float(np.nanmax(a["finish_s"]) - a["arrival_s"][0])
    held_token_s = st["kv_utilization"] * st["total_blocks"] * block_tokens * span
    tok = obj.kv_token_seconds(a["first_scheduled_s"][fin], a["first_token_s"][fin],
                               a["finish_s"][fin], a["prompt_tokens"][fin],
                               a["output_tokens"][fin])
    done = a["status"] == "finished"
    batched = float(np.sum(a["finish_s"][done] - a["first_scheduled_s"][done])) / span
    return {"held": float(st["kv_utilization"]), "token_share": tok / held_token_s,
            "batched": batched, "preempted": int((a["preemptions"] > 0).sum()),
            "finished": int(done.sum())}


def normalized_latency(engine: str, trace: lp.Trace, seed: int = 0) -> float:
    """Mean end-to-end latency per output token (s/token); inf when a request fails."""
    res = run(engine, trace, seed)
    a = res.arrays
    if not np.all(a["status"] == "finished"):
        return float("inf")
    return obj.normalized_latency_s(a["e2e_s"], a["output_tokens"])


def capacity_rps(engine: str, n: int, seed: int = 0, rel_tol: float = 0.05) -> float:
    """Highest Poisson rate with mean normalized latency <= LATENCY_TARGET_S."""
    base = C.sharegpt_requests(n, 1.0, seed=seed, max_total_tokens=MAX_LEN)

    def ok(rate: float) -> bool:
        return normalized_latency(engine, base.with_rate(rate), seed) <= LATENCY_TARGET_S

    return C.max_rate(ok, 0.05, 40.0, rel_tol)


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Print the three tables; returns the measured figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=2.0,
                    help="request rate of the memory table (req/s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(f"vLLM seed: {LLM} on one {GPU}, {C.data_source()}, {args.requests} requests, "
          f"Poisson; Orca (Max) reserves {MAX_LEN} tokens per request")
    tr = C.sharegpt_requests(args.requests, args.rate, seed=args.seed,
                             max_total_tokens=MAX_LEN)
    print(f"lengths: {obj_stats(tr)}")
    mem = {}
    print(f"\n## KV memory at {args.rate} req/s")
    print(f"{'engine':<10} {'pool held':>10} {'token share':>12} {'batched':>8} "
          f"{'preempted':>10} {'finished':>9}")
    for e in ENGINES:
        mem[e] = memory_row(run(e, tr, args.seed))
        m = mem[e]
        print(f"{e:<10} {m['held']:>10.3f} {m['token_share']:>12.3f} {m['batched']:>8.1f} "
              f"{m['preempted']:>10d} {m['finished']:>9d}")
    cap = {}
    print(f"\n## capacity at mean normalized latency <= {LATENCY_TARGET_S} s/token")
    for e in ENGINES:
        cap[e] = capacity_rps(e, args.requests, args.seed)
    for e in ENGINES:
        print(f"{e:<10} {cap[e]:8.3f} req/s   x{cap[e] / max(cap['orca-max'], 1e-9):5.2f} "
              "over orca-max")
    # requests batched at once where vLLM is at its capacity (Orca (Max) is saturated)
    at = C.sharegpt_requests(args.requests, cap["vllm-v0"], seed=args.seed,
                             max_total_tokens=MAX_LEN)
    batched = {e: memory_row(run(e, at, args.seed))["batched"] for e in ("vllm-v0", "orca-max")}
    print(f"\nrequests batched at {cap['vllm-v0']:.2f} req/s: vllm-v0 {batched['vllm-v0']:.1f}, "
          f"orca-max {batched['orca-max']:.1f}")
    v0, orca = mem["vllm-v0"]["token_share"], mem["orca-max"]["token_share"]
    r_cap = cap["vllm-v0"] / cap["orca-max"] if cap["orca-max"] > 0 else float("inf")
    C.claims_table("vLLM: claims", [
        ("paged KV: share of held KV memory storing tokens", "96.3 %", 100 * v0, 96.3,
         C.verdict(v0 > 0.9, abs(v0 - 0.963) < 0.03)),
        ("Orca (Max): share storing tokens", "20.4 %", 100 * orca, 20.4,
         C.verdict(orca < 0.4, abs(orca - 0.204) < 0.1)),
        ("throughput at equal latency, vLLM / Orca (Max)", "2.7-8x", r_cap, None,
         C.verdict(r_cap > 1.0, 2.7 <= r_cap <= 8.0)),
        ("requests batched at once, vLLM / Orca (Max), OPT-13B", "4.3x",
         batched["vllm-v0"] / batched["orca-max"], 4.3,
         C.verdict(batched["vllm-v0"] > batched["orca-max"],
                   abs(batched["vllm-v0"] / batched["orca-max"] / 4.3 - 1) < 0.25)),
        ("same, vLLM V1 (chunked) / Orca (Max)", "-",
         cap["vllm"] / max(cap["orca-max"], 1e-9), None, C.verdict(cap["vllm"] > cap["orca-max"])),
    ])
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return {"memory": mem, "capacity": cap}


def obj_stats(tr: lp.Trace) -> str:
    """Mean and CV of the trace's lengths, as text."""
    p, o = tr.prompt_tokens.astype(float), tr.output_tokens.astype(float)
    return (f"prompt mean {p.mean():.0f} (CV {p.std() / p.mean():.2f}), output mean "
            f"{o.mean():.0f} (CV {o.std() / o.mean():.2f})")


if __name__ == "__main__":
    main()
