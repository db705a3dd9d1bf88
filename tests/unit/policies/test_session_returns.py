"""Sessions between turns as the locality router sees them (``models/routing-lp.md`` (21)):
the bookkeeping of :class:`SessionReturns`, the term's closed form against a direct
expectation, and the decision it changes."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies import _routing_kernels as K
from lpserve.policies.routers_locality import LocalityIndexRouter
from lpserve.policies.session_returns import SessionReturns
from tests.unit.policies.test_routers_deployed import view


def _done(request, replica, ttft, tpot, out):
    return {"request": np.asarray(request), "replica": np.asarray(replica),
            "ttft_s": np.asarray(ttft, float), "tpot_s": np.asarray(tpot, float),
            "output_tokens": np.asarray(out)}


def test_sessions_away_come_back_and_give_their_gaps():
    s = SessionReturns(3)
    s.routed(np.array([0, 1]), np.array([7, 8]), np.array([2, 0]), np.array([0.0, 1.0]))
    s.observe(2.0, None, np.array([-1]))
    assert s.resident.tolist() == [0, 0, 0] and s.rate_per_s == 0.0
    # request 0 finishes at 0 + 0.5 + 0.1 x 9 = 1.4 s, request 1 (one token) at 4.0 s
    s.observe(5.0, _done([0, 1], [2, 0], [0.5, 3.0], [0.1, np.nan], [10, 1]), np.array([-1]))
    assert s.resident.tolist() == [1, 0, 1]
    s.observe(100.0, None, np.array([-1]))          # no gap seen yet: nobody has ended
    assert s.resident.tolist() == [1, 0, 1]
    s.observe(11.4, None, np.array([7]))            # session 7 back after 10 s
    assert s.resident.tolist() == [1, 0, 0] and s.rate_per_s == pytest.approx(0.1)
    # session 8 away 10.5 s by now: longer than every gap seen, taken as ended
    s.observe(14.5, None, np.array([-1]))
    assert s.resident.tolist() == [0, 0, 0]
    s.observe(34.0, None, np.array([8]))            # it comes back after 30 s after all
    assert s.resident.tolist() == [0, 0, 0]
    assert s.rate_per_s == pytest.approx(2 / 40.0)


def test_an_older_request_finishing_does_not_send_its_session_away():
    s = SessionReturns(2)
    s.routed(np.array([0]), np.array([4]), np.array([1]), np.array([0.0]))
    s.routed(np.array([1]), np.array([4]), np.array([0]), np.array([0.5]))   # same session
    s.observe(3.0, _done([0], [1], [0.2], [0.01], [5]), np.array([-1]))
    assert s.resident.tolist() == [0, 0]
    s.observe(4.0, _done([1], [0], [0.2], [0.01], [5]), np.array([-1]))
    assert s.resident.tolist() == [1, 0]


@pytest.mark.parametrize("nu,wait,own", [(0.05, 0.0, 14.0), (0.5, 2.0, 3.0), (3.0, 0.3, 1.0)])
def test_session_term_is_the_expected_delay(nu, wait, own):
    """The kernel's (21) equals E[delay] of an Exp(nu) return behind wait + own seconds of
    prefill, of which own is this request's, by quadrature."""
    t = np.linspace(0.0, 60.0 / nu, 400_001)
    delay = np.clip(np.minimum(own, wait + own - t), 0.0, None)
    direct = np.trapezoid(delay * nu * np.exp(-nu * t), t)
    assert K.session_delay_s(nu, wait, own) == pytest.approx(direct, rel=1e-5)


def _router(R, **kw):
    from lpserve.opt.routing_profile import replica_profile

    p = replica_profile(lp.cost_model(gpu="h100-sxm", llm="llama-3-8b"), c_max=131072)
    return LocalityIndexRouter.from_profiles([p] * R, chunk_tokens=8192, **kw)


def test_a_cold_long_prompt_avoids_the_replica_sessions_will_come_back_to():
    """Two idle replicas; sessions 1 and 2 last ran on replica 0 and come back about every
    20 s. A cold 100k-token prompt goes to replica 1 with the session term (the default)
    and to replica 0 (the tie's lowest index) without it."""
    def run(r):
        r.reset(None, np.random.default_rng(0))
        # sessions 1, 2 (and 3, which gives the gap) each send a request to replica 0
        r.route(view([2000, 2000, 2000], pending=[0, 10**6], session=[1, 2, 3],
                     request=[0, 1, 2]))
        done = _done([0, 1, 2], [0, 0, 0], [0.2] * 3, [0.02] * 3, [11] * 3)  # done by 0.4 s
        r.route(view([2000], cached=[[1920, 0]], pending=[0, 0], session=[3], request=[3],
                     now=20.4, completions=done))   # session 3 back after 20 s, to replica 0
        return int(r.route(view([100_000], pending=[0, 0], session=[9], request=[4],
                                now=20.4, completions=_done([], [], [], [], [])))[0])
    assert run(_router(2)) == 1                    # the default: the session term
    assert run(_router(2, sessions=False)) == 0


def test_kernel_twin_agree_with_the_session_term_and_backlog_attention():
    rng = np.random.default_rng(3)
    r = _router(4)
    for _ in range(30):
        n = int(rng.integers(1, 4))
        args = (r.coef, rng.integers(1, 120_000, n).astype(np.float64), rng.uniform(1, 900, n),
                rng.integers(0, 60_000, (n, 4)), rng.integers(0, 10**5, 4),
                rng.integers(0, 10**10, 4), rng.integers(0, 8, 4), rng.integers(0, 9000, 4),
                16.0, rng.integers(10**5, 2 * 10**5, 4), np.array([0, 0, 0], np.int64),
                rng.integers(0, 4, 4).astype(float), float(rng.uniform(0.0, 0.2)))
        assert np.array_equal(K.locality_route(*args), K.locality_route_ref(*args))
