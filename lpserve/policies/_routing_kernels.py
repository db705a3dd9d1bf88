"""Numba kernel of the locality-aware dual-index router (``models/routing-lp.md``
(18)-(20)), beside its plain-Python twin :func:`locality_route_ref` (tests assert equal
choices).

Arrays
------
``coef`` (float64, ``(N_COEF, R)``), rows ``C_*``: seconds per prompt token of a prefill
chunk, the quadratic attention coefficient, the chunk's time, the prices per uncached
token (``Bp``), per output token (``Cp``) and per KV token-second (``E``), the decode
iteration fit ``d0 + d1 k + d2 c`` and the ``requests`` backlog weight ``W``.
``modes`` (int64, 3): backlog (0 tokens, 1 requests), prefill (0 live, 1 static),
decode (0 live, 1 marginal, 2 reference, 3 none). ``tau`` the reference TPOT.
``backlog_sq`` (``(R,)``): the backlog's ``end^2 - start^2`` tokens^2 (its attention;
zeros with the ``requests`` backlog). ``resident`` (float64, ``(R,)``): sessions waiting between turns whose last request ran on
each replica, ``nu`` their return rate (1/s; 0: no session term (21)).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

C_PER_TOKEN, C_ATTN, C_CHUNK, C_BP, C_CP, C_E, C_D0, C_D1, C_D2, C_W, C_TAU = range(11)
N_COEF = 11


@njit(cache=True)
def session_delay_s(nu, wait_s, own_s):
    """(21) per session: the expected delay (s) that ``own_s`` seconds of prefill queued
    behind ``wait_s`` seconds of backlog add to a session returning after an exponential
    time of rate ``nu`` (1/s, > 0)."""
    return own_s - math.exp(-nu * wait_s) * (1.0 - math.exp(-nu * own_s)) / nu


def _route(coef, P, D, H, backlog, backlog_sq, run, kv_blocks, block_tokens, maxp, modes,
           resident, nu):
    R = coef.shape[1]
    n = P.shape[0]
    out = np.empty(n, np.int64)
    wait = np.empty(R)
    slow = np.empty(R)
    dec = np.empty(R)
    for m in range(R):
        dec[m] = (coef[C_D0, m] + coef[C_D1, m] * run[m]
                  + coef[C_D2, m] * kv_blocks[m] * block_tokens)
        slow[m] = 1.0 + dec[m] / coef[C_CHUNK, m] if modes[1] == 0 else 1.0       # (19)
        if modes[0] == 0:
            wait[m] = (backlog[m] * coef[C_PER_TOKEN, m]
                       + backlog_sq[m] * coef[C_ATTN, m]) * slow[m]
        else:
            wait[m] = backlog[m] * coef[C_W, m]
    for k in range(n):
        p, d = P[k], D[k]
        ctx = p + 0.5 * d
        fit_any = False
        for m in range(R):
            if p <= maxp[m]:
                fit_any = True
        best, best_m = math.inf, -1
        for m in range(R):
            if fit_any and p > maxp[m]:
                continue
            h = float(H[k, m])
            new = p - h
            own = (new * coef[C_PER_TOKEN, m] + coef[C_ATTN, m] * (p * p - h * h)) * slow[m]
            s = wait[m] + own + coef[C_BP, m] * new + (p * d + 0.5 * d * d) * coef[C_E, m]
            if nu > 0.0 and resident[m] > 0.0:  # (21): sessions resident on m coming back
                s += resident[m] * session_delay_s(nu, wait[m], own)
            if modes[2] == 2:
                s += d * (coef[C_TAU, m] + coef[C_CP, m])
            elif modes[2] != 3:
                tpot = dec[m] + coef[C_D1, m] + coef[C_D2, m] * ctx                  # (20)
                if modes[2] == 1:
                    tpot += run[m] * (coef[C_D1, m] + coef[C_D2, m] * ctx)
                s += d * (tpot + coef[C_CP, m])
            if not fit_any:  # fits nowhere: the replica with the most room
                s = -float(maxp[m])
            if s < best:
                best, best_m = s, m
        out[k] = best_m
        if modes[0] == 0:  # requests routed in the same call join the backlog
            h = float(H[k, best_m])
            wait[best_m] += ((p - h) * coef[C_PER_TOKEN, best_m]
                             + coef[C_ATTN, best_m] * (p * p - h * h)) * slow[best_m]
        else:
            wait[best_m] += coef[C_W, best_m]
    return out


#: the plain-Python twin (same code, interpreted)
locality_route_ref = _route
#: the compiled kernel: replica index per request (int64 (n,))
locality_route = njit(cache=True)(_route)
