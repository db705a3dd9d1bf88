"""Live migration: token conservation, block release, transfer time, bad moves, fast mode."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt.rebalance import AssignmentRebalancer
from lpserve.policies.rebalancers import LlumnixFreeness, NoMigration
from lpserve.policy import PolicyError, Rebalancer, as_router
from lpserve.sim.engine import Simulation
from lpserve.sim.state import RUNNING, TRANSFER

A100 = dict(gpu="a100-80gb", llm="llama-2-7b")


def _inst(n=3, replicas=2, link_gbps=5.0, **cluster):
    tr = lp.Trace.from_arrays(arrival_s=np.zeros(n), prompt_tokens=np.full(n, 300),
                              output_tokens=np.full(n, 40))
    return lp.Instance(trace=tr, cluster=lp.Cluster(**A100, replicas=replicas,
                                                    link_gbps=link_gbps, **cluster))


def _started(inst, policy=None):
    """A simulation whose requests all sit decoding on replica 0."""
    policy = policy or lp.make_policy("vllm", prefix_caching=False).with_(
        rebalancer=NoMigration())
    sim = Simulation(inst, policy, seed=0, check=True)
    A = sim.front[0]
    for i in range(len(inst.trace)):
        A.enqueue(i, 0.0)
    A.advance(0.05)  # prefill and a few decode iterations
    assert all(sim.state.gen[i] >= 1 for i in A.running)
    return sim


def test_migration_conserves_tokens_and_frees_source_blocks():
    inst = _inst()
    sim = _started(inst)
    S, A, B, mig = sim.state, sim.front[0], sim.front[1], sim.migrator
    ctx, gen, used_a = int(S.computed[0]), int(S.gen[0]), A.bm.used
    nb = -(-ctx // inst.cluster.block_tokens)
    mig.start(0, 1)
    assert S.status[0] == TRANSFER and 0 not in A.running
    assert B.inbound[0] == nb and B.bm.used == nb          # reserved on the destination
    assert A.bm.used == used_a                             # source blocks held during copy
    end = mig.heap[0][0]
    A.advance(end)
    assert A.bm.used == int(S.anon[A.running].sum())       # ... and freed after it
    while mig.heap and mig.next_landing_s <= end:
        mig.land()
    assert S.status[0] == RUNNING and 0 in B.running and not B.inbound
    assert (int(S.computed[0]), int(S.gen[0]), int(S.anon[0])) == (ctx, gen, nb)
    assert S.migrations[0] == 1 and S.migrated_to[0] == 1 and S.replica[0] == 0
    for r in sim.front:
        r.advance(np.inf)
    assert np.all(S.gen == S.out)


def test_transfer_time_follows_the_cost_model_and_serializes_on_the_link():
    inst = _inst(link_gbps=2.0)
    sim = _started(inst)
    S, A, mig = sim.state, sim.front[0], sim.migrator
    cost = inst.cost_model()
    c0, c1 = int(S.computed[0]), int(S.computed[1])
    t0 = A.now
    mig.start(0, 1)
    mig.start(1, 1)
    ends = sorted(e for e, *_ in mig.heap)
    assert ends[0] == pytest.approx(t0 + cost.transfer_time_s(c0, 2.0), rel=1e-12)
    assert ends[1] == pytest.approx(ends[0] + cost.transfer_time_s(c1, 2.0), rel=1e-12)
    st = mig.stats()
    assert st["migrated_gb"] == pytest.approx((c0 + c1) * cost.kv_bytes_per_token / 1e9)
    assert st["migration_s"] == pytest.approx(ends[1] - t0)


def test_capacity_and_seats_are_enforced_with_the_value_named():
    sim = _started(_inst())
    B = sim.front[1]
    B.bm.take_anon(B.bm.available - B.wm_blocks - 3)  # leave 3 above the watermark
    with pytest.raises(PolicyError, match=r"request 0 needs \d+ KV blocks, destination 1 "
                                          r"has 3 free \(capacity exceeded\)"):
        sim.migrator.start(0, 1)
    # two seats per replica: requests 0, 1 decode on replica 0, requests 2, 3 on replica 1
    inst = _inst(n=4)
    pol = lp.make_policy("vllm", max_num_seqs=2).with_(rebalancer=NoMigration())
    sim = Simulation(inst, pol, seed=0, check=True)
    for i in range(4):
        sim.front[i // 2].enqueue(i, 0.0)
    for r in sim.front:
        r.advance(0.05)
    with pytest.raises(PolicyError, match="destination 1 has no seat for request 0"):
        sim.migrator.start(0, 1)


class _Scripted(Rebalancer):
    """Returns ``rows`` at the first decision that has candidates."""

    name = "scripted"
    period_s = 0.05

    def __init__(self, rows):
        self.rows = rows
        self.done = False

    def migrate(self, view):
        if self.done:
            return np.zeros((0, 2), np.int64)
        self.done = True
        return np.asarray(self.rows)


@pytest.mark.parametrize("rows, match", [
    ([[999, 1]], "unknown request 999"),
    ([[0, 7]], "destination 7 of request 0 outside"),
    ([[0, -1]], "destination -1 of request 0 outside"),
    ([[2, 1]], r"request 2 is not a running decoding request \(status pending\)"),
    ([[0, 1], [0, 1]], "request 0 migrates twice"),
    ([[0, 0]], "request 0 is already on destination 0"),
    ([[0.5, 1]], r"expected \(n_moves, 2\) integer rows"),
    ([0, 1], r"expected \(n_moves, 2\) integer rows"),
])
def test_bad_moves_raise_errors_naming_the_value(rows, match):
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.0, 0.5], prompt_tokens=[300, 300, 300],
                              output_tokens=[400, 400, 400])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100, replicas=2))
    router = as_router(lambda v: np.zeros(len(v), np.int64), name="zero")
    pol = lp.make_policy("vllm", router=router).with_(rebalancer=_Scripted(rows))
    with pytest.raises(PolicyError, match=match):
        lp.simulate(inst, pol)


def test_rebalancer_is_validated_by_the_policy():
    with pytest.raises(ValueError, match="Policy.rebalancer must be None or a Rebalancer"):
        lp.Policy(rebalancer=object())
    with pytest.raises(ValueError, match="period_s must be > 0, got 0"):
        NoMigration(period_s=0)
    with pytest.raises(ValueError, match="max_moves must be a positive integer, got 0"):
        LlumnixFreeness(max_moves=0)


def _bursty(n=90, replicas=3):
    from lpserve.trace import generate as G

    tr = G.synthetic(n, arrivals=G.GammaRenewal(rate_per_s=6.0, cv=3.0),
                     prompt=G.Uniform(200, 1500),
                     output=G.LogNormal(mean=300, cv=1.5, max_tokens=2000), seed=1)
    return lp.Instance(trace=tr, cluster=lp.Cluster(**A100, replicas=replicas,
                                                    gpu_memory_fraction=0.22))


@pytest.mark.parametrize("name", ["rebalance-llumnix", "rebalance-lp"])
def test_fast_equals_reference_with_migration_and_invariants_hold(name):
    inst = _bursty()
    fast = lp.simulate(inst, name, check=True)
    ref = lp.simulate(inst, name, reference=True, check=True)
    assert fast.digest() == ref.digest()
    for k in ("migrations", "migrated_to", "generated_tokens"):
        assert np.array_equal(fast.arrays[k], ref.arrays[k]), k
    a = fast.arrays
    assert fast.stats["migrations"] == int(a["migrations"].sum()) > 0
    assert np.all(a["generated_tokens"] == a["output_tokens"])
    assert np.all(a["first_token_s"] < a["finish_s"])
    assert fast.summary()["migrations"] == fast.stats["migrations"]


def test_a_rebalancer_that_never_moves_changes_nothing():
    inst = _bursty(60)
    base = lp.simulate(inst, "vllm")
    none = lp.simulate(inst, lp.make_policy("vllm").with_(rebalancer=NoMigration(0.2)),
                       check=True)
    assert none.digest() == base.digest()
    assert none.stats["migrations"] == 0


class _NeverAsked(Rebalancer):
    name = "never-asked"
    period_s = 0.05

    def migrate(self, view):
        raise AssertionError("a pool of one replica has no move to ask for")


def test_a_rebalancer_of_one_replica_is_never_asked():
    """No move exists on one replica (a destination must differ from the source): the run
    is the plain loop's, arrivals in one call."""
    from lpserve.sim.engine import Simulation

    inst = _bursty(60, replicas=1)
    pol = lp.make_policy("vllm").with_(rebalancer=_NeverAsked())
    assert Simulation(inst, pol)._arrivals_in_one_call()
    res = lp.simulate(inst, pol)
    assert res.digest() == lp.simulate(inst, "vllm").digest()
    assert res.stats["migrations"] == 0
    assert lp.simulate(inst, "rebalance-llumnix").digest() == \
        lp.simulate(inst, lp.make_policy("rebalance-llumnix").with_(rebalancer=None)).digest()


def test_decode_pool_migration_in_a_disaggregated_cluster():
    inst = _bursty(60)
    inst = inst.with_(cluster=inst.cluster.with_(replicas=1, prefill_replicas=1,
                                                 decode_replicas=3))
    fast = lp.simulate(inst, "rebalance-lp", check=True)
    ref = lp.simulate(inst, "rebalance-lp", reference=True, check=True)
    assert fast.digest() == ref.digest()
    assert np.all(fast.arrays["generated_tokens"] == fast.arrays["output_tokens"])


def test_assignment_rebalancer_reports_its_solve():
    inst = _bursty(60)
    rb = AssignmentRebalancer(period_s=0.5)
    lp.simulate(inst, lp.make_policy("vllm").with_(rebalancer=rb))
    assert rb.info["status"] == "optimal"


def test_a_copy_cut_by_the_horizon_is_counted_and_reported():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.0], prompt_tokens=[300, 300],
                              output_tokens=[400, 400])
    inst = lp.Instance(trace=tr, horizon_s=1.0,
                       cluster=lp.Cluster(**A100, replicas=2, link_gbps=1e-3))
    router = as_router(lambda v: np.zeros(len(v), np.int64), name="zero")
    pol = lp.make_policy("vllm", router=router).with_(rebalancer=_Scripted([[0, 1]]))
    res = lp.simulate(inst, pol, check=True)
    a = res.arrays
    assert (a["status"][0], a["reason"][0]) == ("transfer", "horizon")
    assert a["migrations"][0] == 1 and a["migrated_to"][0] == 1
    assert res.stats["migrations"] == 1 and res.stats["migration_s"] > 1.0


def _view(free, running_src, blocks, waiting, ctx=None, seats=None):
    R = len(free)
    n = len(running_src)
    ctx = np.full(n, 500) if ctx is None else np.asarray(ctx)
    ro = lambda a, t=np.int64: np.asarray(a, t)
    from lpserve.policy import RebalanceView

    return RebalanceView(
        now_s=1.0, block_tokens=16, free_blocks=ro(free), total_blocks=ro([100] * R),
        running=ro(np.bincount(running_src, minlength=R)),
        waiting=ro([len(w) for w in waiting]),
        seats=ro(seats if seats is not None else [8] * R),
        waiting_blocks=tuple(ro(w) for w in waiting), request=ro(np.arange(n) + 10),
        replica=ro(running_src), prompt_tokens=ro(ctx - 5), generated_tokens=ro([6] * n),
        context_tokens=ro(ctx), blocks=ro(blocks), migration_s=np.full(n, 0.01),
        predicted_lo=None, predicted_hi=None, output_tokens=None,
        decode_iteration_s=lambda c: 0.01 + 1e-6 * float(np.sum(c)))


def test_llumnix_moves_the_cheapest_request_from_least_to_most_free():
    # replica 0: full, a waiting head of 20 blocks; replica 1: 60 blocks free
    v = _view(free=[2, 60], running_src=[0, 0, 0], blocks=[30, 10, 20], waiting=[[20], []])
    moves = LlumnixFreeness(threshold_blocks=5, source_below_blocks=0).migrate(v)
    assert moves.tolist()[0] == [11, 1]          # request 11 holds the fewest blocks
    quiet = LlumnixFreeness(threshold_blocks=1000).migrate(v)
    assert quiet.shape == (0, 2)


def test_assignment_model_data_follow_the_equations():
    from lpserve.opt.rebalance import build_rebalance

    # replica 0: requests of 30 and 10 blocks, a queue of 20 + 15 blocks and 5 free
    v = _view(free=[5, 60], running_src=[0, 0], blocks=[30, 10], waiting=[[20, 15], []])
    m = build_rebalance(v, default_remaining_tokens=100)
    assert m.deficit_blocks[0].tolist() == [15, 30] and m.deficit_blocks[1].size == 0  # (6)
    tau1 = v.decode_iteration_s(np.full(2, 500))
    # (7): the 10-block request finishes first (ties: index order), both after 100 tokens
    assert m.wait_s[0] == pytest.approx([100 * tau1, 100 * tau1])
    assert m.capacity_blocks.tolist() == [0, 60]                                       # (8)
    assert m.cost_s == pytest.approx([0.01 * 3, 0.01 * 3])                             # (5)
    assert m.phi_s[2] == pytest.approx(2 * 100 * v.decode_iteration_s(np.full(2, 500)))


class _Inspector(Rebalancer):
    """Records whether every array of every view is read-only; never moves."""

    name = "inspector"
    period_s = 0.1

    def __init__(self):
        self.views = 0
        self.writeable = []

    def migrate(self, view):
        self.views += 1
        arrays = [(k, v) for k, v in vars(view).items() if isinstance(v, np.ndarray)]
        arrays += [("waiting_blocks", w) for w in view.waiting_blocks]
        self.writeable += [k for k, v in arrays if v.flags.writeable]
        assert view.output_tokens is None  # a non-clairvoyant policy never sees lengths
        return None


def test_views_are_read_only_and_carry_no_output_lengths():
    rb = _Inspector()
    lp.simulate(_bursty(40), lp.make_policy("vllm").with_(rebalancer=rb))
    assert rb.views > 0 and rb.writeable == []
