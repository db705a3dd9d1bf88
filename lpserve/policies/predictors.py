"""Output-length predictors (:class:`~lpserve.policy.hooks.Predictor`).

The simulator owns a predictor and is the only party that shows it true output lengths:
at arrival it asks for a prediction of each request's output length as an interval
``[lo, hi]`` plus a point estimate, and hands non-clairvoyant policies only those. When a
request completes, the simulator reports its true length with ``observe``, so a learning
predictor trains on completed requests only -- never on the future.

``Oracle``           the truth (``lo == hi == point``); for clairvoyant baselines.
``NoisyOracle``      the truth times a log-normal multiplicative error of chosen spread.
``IntervalClasses``  the geometric class ``[b·r^k, b·r^(k+1))`` holding the truth, with
                     ``alpha = lo / hi = 1 / r`` (the interval predictions of Chen, Ye, Zhou).
``History``          online, history-based: empirical quantiles of completed requests in
                     the same (prompt-length bucket, tenant) bucket, falling back to coarser
                     buckets and finally to a stated prior.

The first three are clairvoyant (``meta.clairvoyant``): their views carry the truth.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from lpserve.kernels import history as HK
from lpserve.policy import Meta, Prediction, Predictor, PredictorView

__all__ = ["PREDICTORS", "History", "IntervalClasses", "NoisyOracle", "Oracle",
           "make_predictor", "parse_predictor", "predictor_parameters"]

_CLAIRVOYANT = Meta(clairvoyant=True)


def _ints(name: str, x) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.size and (a.dtype.kind not in "iu"):
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{name} must hold integers, got {a[:5]!r}")
    return a.astype(np.int64)


def _truth(p: Predictor, view: PredictorView) -> np.ndarray:
    if view.output_tokens is None:
        raise ValueError(f"predictor {p.name!r} is clairvoyant: its view needs the true "
                         "output_tokens")
    return _ints("true output_tokens", view.output_tokens)


@dataclass
class Oracle(Predictor):
    """The truth: ``lo == hi == point == output_tokens``."""

    name = "oracle"
    meta = _CLAIRVOYANT

    def predict(self, view: PredictorView) -> Prediction:
        """The true output lengths of the arriving requests as ``lo``, ``hi`` and ``point``
        (int64 ``(n,)`` copies); a ValueError when the view carries no truth."""
        t = _truth(self, view)
        return Prediction(t.copy(), t.copy(), t.copy())


@dataclass
class NoisyOracle(Predictor):
    """``point = round(truth · exp(N(0, sigma)))``; the interval is ``point · exp(±z·sigma)``
    with ``z = interval_z`` (``interval_z = 0`` gives a point prediction)."""

    sigma: float = 0.5
    interval_z: float = 0.0
    name = "noisy-oracle"
    meta = _CLAIRVOYANT

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"NoisyOracle.sigma must be >= 0, got {self.sigma!r}")
        if not (math.isfinite(self.interval_z) and self.interval_z >= 0):
            raise ValueError(f"NoisyOracle.interval_z must be >= 0, got {self.interval_z!r}")

    def predict(self, view: PredictorView) -> Prediction:
        """Log-normal noise around the truth: ``point = max(1, round(o e^N(0, sigma)))``,
        ``lo = max(1, floor(point / w))``, ``hi = max(lo, ceil(point w))`` with
        ``w = e^(interval_z sigma)``; int64 ``(n,)`` tokens, noise from the predictor's ``rng``."""
        t = _truth(self, view)
        noise = self.rng.normal(0.0, self.sigma, size=t.size)
        point = np.maximum(1, np.rint(t * np.exp(noise))).astype(np.int64)
        w = math.exp(self.interval_z * self.sigma)
        lo = np.maximum(1, np.floor(point / w)).astype(np.int64)
        hi = np.maximum(lo, np.ceil(point * w)).astype(np.int64)
        return Prediction(lo, hi, point)


@dataclass
class IntervalClasses(Predictor):
    """Geometric length classes with ratio ``1/alpha``: the truth ``o`` lies in
    ``[lo, hi]`` with ``lo = ceil(base·r^k)``, ``hi = ceil(base·r^(k+1)) - 1`` and
    ``lo / hi ≈ alpha``. The point estimate is the geometric mean of the class."""

    alpha: float = 0.5
    base_tokens: float = 1.0
    name = "interval-classes"
    meta = _CLAIRVOYANT

    def __post_init__(self) -> None:
        if not (0.0 < self.alpha < 1.0):
            raise ValueError(f"IntervalClasses.alpha must be in (0, 1), got {self.alpha!r}")
        if not self.base_tokens > 0:
            raise ValueError(f"IntervalClasses.base_tokens must be > 0, got "
                             f"{self.base_tokens!r}")

    def classes(self, truth) -> np.ndarray:
        """Class index ``k >= 0`` of each true length (int64 ``(n,)`` tokens in, int64
        ``(n,)`` out): ``floor(log_r(o / base_tokens))`` with ``r = 1/alpha``, 0 below
        ``base_tokens``."""
        t = _ints("true output_tokens", truth)
        r = 1.0 / self.alpha
        k = np.floor(np.log(np.maximum(t, 1) / self.base_tokens) / math.log(r) + 1e-12)
        return np.maximum(k, 0).astype(np.int64)

    def predict(self, view: PredictorView) -> Prediction:
        """The class interval ``[lo, hi]`` of each true length (widened where rounding at
        a class edge would leave the truth outside) and its rounded geometric mean as the point;
        int64 ``(n,)`` tokens."""
        t = _truth(self, view)
        r = 1.0 / self.alpha
        k = self.classes(t)
        lo = np.ceil(self.base_tokens * r ** k - 1e-9).astype(np.int64)
        hi = np.ceil(self.base_tokens * r ** (k + 1) - 1e-9).astype(np.int64) - 1
        lo = np.where(k == 0, 1, lo)
        hi = np.maximum(hi, lo)
        # rounding at class edges: keep the truth inside
        lo, hi = np.minimum(lo, t), np.maximum(hi, t)
        point = np.rint(np.sqrt(lo * hi)).astype(np.int64)
        return Prediction(lo, hi, point)


@dataclass
class History(Predictor):
    """Online predictor from completed requests.

    Buckets are ``(floor(log2(prompt_tokens)), tenant)``; a bucket with at least
    ``min_samples`` completions predicts its empirical ``[q_lo, q_hi]`` quantiles and
    median; otherwise the prompt bucket over all tenants, then all completions, then the
    stated prior interval ``prior``. Only the newest ``window`` completions per bucket are
    kept, so the predictor follows drift. The buckets are :mod:`lpserve.kernels.history`'s,
    which the compiled replica engine also runs at each arrival (``kernel_spec``).
    """

    q_lo: float = 0.1
    q_hi: float = 0.9
    min_samples: int = 20
    window: int = 500
    prior: tuple[int, int, int] = (16, 1024, 256)  # lo, hi, point before any data
    name = "history"
    _state: Any = field(default=None, repr=False, compare=False)  # the kernels' buckets

    def __post_init__(self) -> None:
        if not (0.0 <= self.q_lo <= self.q_hi <= 1.0):
            raise ValueError(f"History needs 0 <= q_lo <= q_hi <= 1, got {self.q_lo}, "
                             f"{self.q_hi}")
        if self.min_samples < 1 or self.window < self.min_samples:
            raise ValueError("History needs 1 <= min_samples <= window, got "
                             f"{self.min_samples}, {self.window}")
        lo, hi, pt = self.prior
        if not (1 <= lo <= pt <= hi):
            raise ValueError(f"History.prior must be (lo, hi, point) with 1 <= lo <= point "
                             f"<= hi, got {self.prior!r}")

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Take the new ``rng`` and forget every completion seen."""
        super().reset(cluster, rng)
        self._state = HK.new_state()

    def kernel_spec(self) -> tuple[str, tuple]:
        """``("history", (state, ip, fp))``: the live buckets and parameters the compiled
        replica engine predicts with and adds completions to (see
        :mod:`lpserve.kernels.history`); a subclass without its own ``kernel_spec`` is asked
        in Python."""
        return "history", (self._live(), *self._params())

    def _params(self) -> tuple[np.ndarray, np.ndarray]:
        """The kernels' ``(ip, fp)``: int64 ``IP_*`` and float64 ``(q_lo, q_hi)``, from the
        fields as they are now."""
        ip = np.zeros(HK.N_IP, np.int64)
        ip[HK.IP_MIN_SAMPLES], ip[HK.IP_WINDOW] = self.min_samples, self.window
        ip[[HK.IP_PRIOR_LO, HK.IP_PRIOR_HI, HK.IP_PRIOR_PT]] = self.prior
        return ip, np.array([self.q_lo, self.q_hi], np.float64)

    def __getstate__(self) -> dict:
        """The buckets as their arrays (pickling, ``copy.deepcopy``)."""
        d = self.__dict__.copy()
        if self._state is not None:
            d["_state"] = HK.to_arrays(self._state)
        return d

    def __setstate__(self, d: dict) -> None:
        if d.get("_state") is not None:
            d = {**d, "_state": HK.from_arrays(*d["_state"])}
        self.__dict__.update(d)

    def _live(self) -> Any:
        """The buckets, empty until the first completion (created on first use)."""
        if self._state is None:
            self._state = HK.new_state()
        return self._state

    def predict(self, view: PredictorView) -> Prediction:
        """``(q_lo, q_hi)`` quantiles and the median of the most specific bucket with
        ``min_samples`` completions (prompt bucket and tenant, then prompt bucket, then all);
        ``prior`` when none has. int64 ``(n,)`` tokens."""
        p = _ints("prompt_tokens", view.prompt_tokens)
        ten = _ints("tenant", view.tenant)
        if ten.size != p.size:
            raise ValueError(f"tenant has {ten.size} entries for {p.size} prompts")
        lo, hi, pt = (np.empty(p.size, np.int64) for _ in range(3))
        HK.predict(self._live(), *self._params(), p, ten, lo, hi, pt)
        return Prediction(lo, hi, pt)

    def observe(self, view: PredictorView) -> None:
        """Add each completed request's true output length to its three buckets, keeping
        the newest ``window`` per bucket."""
        p = _ints("prompt_tokens", view.prompt_tokens)
        o = _ints("output_tokens", view.output_tokens)
        ten = _ints("tenant", view.tenant)
        if not (ten.size == o.size == p.size):
            raise ValueError(f"observe needs as many prompts ({p.size}), tenants "
                             f"({ten.size}) and output lengths ({o.size})")
        HK.observe(self._live(), self._params()[0], p, ten, o)


PREDICTORS = {"oracle": Oracle, "noisy-oracle": NoisyOracle,
              "interval-classes": IntervalClasses, "history": History}


def make_predictor(name: str, **params) -> Predictor:
    """A predictor by name (``oracle``, ``noisy-oracle``, ``interval-classes``, ``history``)."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(PREDICTORS)}")
    return PREDICTORS[name](**params)


def predictor_parameters(name: str) -> dict[str, Any]:
    """The parameters of predictor ``name`` and their defaults (what a spec may set)."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(PREDICTORS)}")
    return {f.name: (f.default if f.default is not MISSING else None)
            for f in fields(PREDICTORS[name]) if f.init and not f.name.startswith("_")}


def _spec_value(name: str, key: str, text: str, default: Any, where: str) -> Any:
    bad = f"{where}: {name}:{key}={text!r}"
    try:
        if isinstance(default, bool):
            low = text.strip().lower()
            if low not in ("true", "false"):
                raise ValueError
            return low == "true"
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.split("/"))
    except ValueError:
        kind = "lo/hi/point integers" if isinstance(default, tuple) else \
            type(default).__name__
        raise ValueError(f"{bad}: expected {kind} (default {default!r})") from None
    return text


def parse_predictor(spec: str, where: str = "predictor") -> Predictor:
    """A predictor from a text spec ``NAME[:key=value,...]``, e.g. ``"history"``,
    ``"noisy-oracle:sigma=0.3,interval_z=1"`` or ``"history:prior=16/1024/256"`` (tuple
    values separated by ``/``). Errors name ``where`` (e.g. the CLI flag), the name or
    the key, and what is allowed."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{where}: expected NAME[:key=value,...], got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in PREDICTORS:
        raise ValueError(f"{where}: unknown predictor {name!r}; known: {', '.join(PREDICTORS)}")
    allowed = predictor_parameters(name)
    params: dict[str, Any] = {}
    for item in (x for x in rest.split(",") if x.strip()) if rest else ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{where}: {name}: expected key=value, got {item!r}")
        if key not in allowed:
            raise ValueError(f"{where}: predictor {name!r} has no parameter {key!r}; "
                             f"parameters: {', '.join(allowed) or 'none'}")
        params[key] = _spec_value(name, key, text.strip(), allowed[key], where)
    try:
        return PREDICTORS[name](**params)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
