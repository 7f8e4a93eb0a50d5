"""Per-instance load from fleet arrivals: what a candidate's instances see when the fleet is resized.

One home for the service model that both the planner (analytically) and the fleet
simulator (`fleetcast plan simulate`, by sampling) use, so the two differ only in
how they treat arrivals, routing and batching, never in what an instance does:

- An instance holding b requests (prefilling or decoding, continuous batching)
  advances every decoding request by one token per step; a step takes the
  curve's mean ITL at b. A request's TTFT is drawn from a lognormal fitted to the
  curve's mean and P99 TTFT at the batch it joins; its own ITL multiplier from a
  lognormal with mean 1 fitted to the curve's P99/mean ITL at that batch. In a
  closed loop at concurrency c this reproduces the measured curve at c.
- Analytically (Poisson arrivals split at random by the NLB's flow hash): the
  requests on one instance form a birth-death chain whose departure rate with b in
  flight is b / W(b), W(b) the mean time a request holds an instance at batch b
  (Little's law per batch level); its mean L is Little's law L = lambda * E[W]. With W
  constant the count is Poisson(lambda W) (M/G/inf); W growing with b widens it. An
  arrival joins 1 + K requests (PASTA), which gives the P99 TTFT as a mixture quantile;
  a request's ITL follows the life-averaged batch, 1 + L with 2/3 of the count's
  variance (an M/D/inf count averaged over one service time).
- Sizing is per hour at that hour's busiest minute (rate x burstiness): the P99s
  are per 1-minute window, the window the SLO alarms and SLO scaling read.
Above the highest measured concurrency nothing is known: a load whose arrivals
join a batch above it more than 1% of the time is out of the measured range.
"""

from __future__ import annotations

import functools
import math
import operator
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .curves import Curve, LoadPoint

Z99 = 2.3263478740408408  # standard normal 0.99 quantile
MAX_OUT_OF_RANGE = 0.01  # share of arrivals allowed to join a batch above the highest measured level
# 7-point Gauss-Hermite (probabilists') nodes and weights for E[f(Z)], Z ~ N(0, 1).
_GH = ((-3.750439717725742, 0.000548268855972), (-2.366759410734541, 0.030757123967586),
       (-1.154405394739968, 0.240123178605013), (0.0, 0.457142857142857), (1.154405394739968, 0.240123178605013),
       (2.366759410734541, 0.030757123967586), (3.750439717725742, 0.000548268855972))


@dataclass(frozen=True)
class LogNormal:
    """A lognormal given by its mean and P99 (degenerate at the P99 when the mean is unknown)."""

    mu: float
    sigma: float

    @classmethod
    def fit(cls, mean: float | None, p99: float) -> LogNormal:
        p99 = max(p99, 1e-9)
        if mean is None or mean <= 0 or mean >= p99:
            return cls(math.log(p99), 0.0)
        r = math.log(p99 / mean)
        disc = Z99 * Z99 - 2 * r
        sigma = Z99 - math.sqrt(disc) if disc > 0 else Z99
        return cls(math.log(mean) - sigma * sigma / 2, sigma)

    def cdf(self, x: float) -> float:
        if x <= 0:
            return 0.0
        if self.sigma == 0:
            return 1.0 if math.log(x) >= self.mu else 0.0
        return 0.5 * math.erfc(-(math.log(x) - self.mu) / (self.sigma * math.sqrt(2)))

    def sample(self, rng: random.Random) -> float:
        return math.exp(self.mu + self.sigma * rng.gauss(0.0, 1.0)) if self.sigma else math.exp(self.mu)


@dataclass(frozen=True)
class Stream:
    """Arrivals of one consumer region on one pool: rate (requests/s) and mean output tokens."""

    rate_rps: float
    output_mean: float


# One batch level's fit: the curve's point, its TTFT lognormal, its ITL-over-mean lognormal, mean ITL, mean TTFT.
_Fit = tuple[LoadPoint, LogNormal, LogNormal, float, float]


class ServiceModel:
    """What one instance of a candidate does at each batch size (from its measured curve)."""

    def __init__(self, curve: Curve) -> None:
        self.curve = curve
        self.top = curve.points[-1].concurrency
        self._cache: dict[float, _Fit] = {}
        self._levels: list[_Fit] = []  # _at(j) for integer batches j = 0, 1, ... (the same tuples, by index)
        self.predictions: dict[tuple[tuple[Stream, ...], float], Prediction] = {}  # predict() is pure in (streams, share)

    def _at(self, b: float) -> _Fit:
        b = round(min(max(b, 1.0), self.top), 2)  # the cache stays small; 0.01 of a request changes nothing
        hit = self._cache.get(b)
        if hit is None:
            p = self.curve.at(b)
            itl_mean = p.itl_mean if p.itl_mean is not None else p.itl_p99
            ttft_mean = p.ttft_mean if p.ttft_mean is not None else p.ttft_p99
            hit = (p, LogNormal.fit(p.ttft_mean, p.ttft_p99), LogNormal.fit(1.0, p.itl_p99 / itl_mean),
                   itl_mean, ttft_mean)
            self._cache[b] = hit
        return hit

    def _level(self, j: int) -> _Fit:
        """_at(float(j)) for an integer batch j >= 0, read from a list (occupancy and predict walk every level)."""
        levels = self._levels
        if j >= len(levels):
            levels.extend(self._at(float(i)) for i in range(len(levels), j + 1))
        return levels[j]

    def point(self, b: float) -> LoadPoint:
        return self._at(b)[0]

    def ttft(self, b: float) -> LogNormal:
        return self._at(b)[1]

    def itl_factor(self, b: float) -> LogNormal:
        return self._at(b)[2]

    def step_ms(self, b: float) -> float:
        return self._at(b)[3]

    def hold_ms(self, b: float, output_tokens: float) -> float:
        """Mean time a request holds an instance at batch b: TTFT plus its decode steps."""
        _, _, _, itl, ttft = self._at(b)
        return ttft + max(output_tokens - 1.0, 0.0) * itl


@functools.lru_cache(maxsize=128)
def model_for(curve: Curve) -> ServiceModel:
    """The process's one ServiceModel for a curve. Everything a ServiceModel remembers (its per-batch fits, the
    predictions of predict()) is a pure function of the curve, so plans built again from the same results (a
    `plan --check` after a `plan`, each scenario of a test run, the drift check's re-plan) reuse what an earlier
    plan computed instead of computing it again. Equal curves (the same results file read twice) share a model;
    a Curve is frozen and all tuples, so it hashes."""
    return ServiceModel(curve)


def occupancy(model: ServiceModel, rate_rps: float, output_mean: float) -> list[float] | None:
    """P(K = k requests on the instance) for Poisson arrivals at rate_rps: the birth-death chain whose departure
    rate with j in flight is b / W(b), b = min(j, top) in service (the rest wait). With W constant this is
    Poisson(rate x W); a W that grows with the batch widens it, as the simulation shows. None if the rate is
    beyond what the highest measured batch drains (the queue grows without bound)."""
    top = int(model.top)
    per_ms = rate_rps / 1000.0
    drain = top / model.hold_ms(float(top), output_mean)
    if per_ms >= drain:
        return None
    tail = max(output_mean - 1.0, 0.0)  # hold_ms(b, output_mean) = ttft + tail * itl at b, inlined below
    model._level(top)
    levels = model._levels
    weights, w = [1.0], 1.0
    for b in range(1, top + 1):
        _, _, _, itl, ttft = levels[b]
        w *= per_ms / (b / (ttft + tail * itl))
        weights.append(w)
    # Above the top every level is the top one (b = top in service): the same factor, the same float each time.
    # max(weights) is kept as it grows (taking it afresh at every level made the walk quadratic).
    _, _, _, itl, ttft = levels[top]
    factor = per_ms / (top / (ttft + tail * itl))
    peak = max(weights)
    for _ in range(top + 1, 50 * top + 1002):
        w *= factor
        weights.append(w)
        if w > peak:
            peak = w
        elif w < 1e-12 * peak:
            break
    else:
        return None
    total = sum(weights)
    return [x / total for x in weights]


def _quantile(cdf: Callable[[float], float], q: float, hi: float) -> float:
    """The q-quantile of a non-decreasing cdf by bisection, to a relative 1e-9: far below a microsecond at
    these latencies, and each step evaluates a whole mixture, so steps past that bound cost time for nothing.

    The bisection's path (and so its answer, to the bit) is fixed by the sign of cdf(mid) - q at each midpoint;
    a bracketing secant (Illinois) first finds points A < root < B whose cdf sits clearly (by _CDF_MARGIN, far
    above a mixture sum's rounding) below and above q. Every midpoint at or below A then reads "below" and every
    one at or above B "above" without evaluating the mixture (the cdf is monotone), so only the few midpoints
    between A and B evaluate it: about a third of the evaluations of a plain bisection, the same answer."""
    lo = 0.0
    known = [(hi, cdf(hi))]
    while known[-1][1] < q and hi < 1e9:
        hi *= 2
        known.append((hi, cdf(hi)))
    below, above = _bracket(cdf, q, known[-2:])
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        mid = (lo + hi) / 2
        if mid <= below or (mid < above and cdf(mid) < q):
            lo = mid
        else:
            hi = mid
    return hi


_CDF_MARGIN = 1e-12  # a cdf this far from q has its side of q settled: a mixture's float sum errs by ~1e-15
_BRACKET_STEPS = 12  # secant steps at most; the bisection after them is exact whatever they found
_AIM = 2e-10  # how far past its estimate a secant step aims: a cdf slope of 0.01 per unit log x still settles
_NORMAL = statistics.NormalDist()


def _bracket(cdf: Callable[[float], float], q: float, known: list[tuple[float, float]]) -> tuple[float, float]:
    """Points (below, above) with cdf(below) < q - _CDF_MARGIN and cdf(above) >= q + _CDF_MARGIN, as close to
    the q-quantile as a few secant steps get them, taken on the probit of the cdf against log x: a straight
    line for one lognormal and nearly one for a mixture, so a few steps land within 1e-10. Each step aims a
    hair (_AIM) past its estimate, on the side still loosest, so that both sides settle; a step that leaves
    the bracket found so far bisects it. `known` holds the (x, cdf) already evaluated. (0, inf) when nothing
    is settled: the bisection needs no more than the cdf's monotonicity from these points."""
    below, above = 0.0, math.inf
    zq = _probit(q)
    pts: list[tuple[float, float]] = []  # (log x, probit gap) of every evaluated point, newest last
    for x, fx in known:
        if fx < q - _CDF_MARGIN:
            below = max(below, x)
        elif fx >= q + _CDF_MARGIN:
            above = min(above, x)
        pts.append((math.log(x), _probit(fx) - zq))
    for _ in range(_BRACKET_STEPS):
        if above - below <= 5e-10 * above < math.inf:
            break
        neg = [p for p in pts if p[1] < 0]
        pos = [p for p in pts if p[1] >= 0]
        if neg and pos:  # the secant through the newest two points, else regula falsi, inside the bracket
            (u0, z0), (u1, z1) = max(neg), min(pos)
            (v0, y0), (v1, y1) = pts[-2], pts[-1]
            nu = v1 - y1 * (v1 - v0) / (y1 - y0) if y1 != y0 else math.nan
            if not u0 < nu < u1:
                nu = u1 - z1 * (u1 - u0) / (z1 - z0) if z1 != z0 else math.nan
            if not u0 < nu < u1:
                nu = (u0 + u1) / 2
        else:
            (u0, z0), (u1, z1) = (pts[-2], pts[-1]) if len(pts) > 1 else ((pts[-1][0] - 0.05, 0.0), pts[-1])
            nu = u1 - z1 * (u1 - u0) / (z1 - z0) if len(pts) > 1 and z1 != z0 else u1 - math.copysign(0.05, z1)
            nu = min(max(nu, u1 - 1.0), u1 + 1.0)  # a factor e at most while one side is unknown
        x = math.exp(nu)
        if below > 0 and (above == math.inf or x - below < above - x):  # aim past the estimate, on the loose side
            x *= 1.0 + _AIM
        else:
            x *= 1.0 - _AIM
        fx = cdf(x)
        if fx < q - _CDF_MARGIN:
            below = max(below, x)
        elif fx >= q + _CDF_MARGIN:
            above = min(above, x)
        pts.append((math.log(x), _probit(fx) - zq))
    return below, above


def _probit(p: float) -> float:
    """The standard normal quantile of p, clamped away from 0 and 1 (where a mixture's cdf saturates)."""
    return _NORMAL.inv_cdf(min(max(p, 1e-300), 1.0 - 1e-16))


def _mixture_cdf(mix: list[tuple[float, LogNormal]], norm: float) -> Callable[[float], float]:
    """x -> sum(w * d.cdf(x) for w, d in mix) / norm, the same sum in the same order, evaluated faster: the
    components share few distinct lognormals (every batch above the highest measured level is the top one), so
    each distinct one is evaluated once per x, with log(x) taken once; the weighted sum then runs in C. Every
    term is the float LogNormal.cdf returns, so the result is identical to the bit."""
    # Told apart by identity (every level above the top is the same object): equal ones kept apart evaluate to
    # the same float, and a dataclass's hash, taken per component, cost more than the evaluations it saved.
    dists = {id(d): d for _, d in mix}
    pos = {key: i for i, key in enumerate(dists)}
    idx = [pos[id(d)] for _, d in mix]
    weights = [w for w, _ in mix]
    params = [(d.mu, d.sigma * math.sqrt(2)) for d in dists.values()]
    log, erfc, mul = math.log, math.erfc, operator.mul

    def cdf(x: float) -> float:
        if x <= 0:
            vals = [0.0] * len(params)
        else:
            lx = log(x)
            vals = [0.5 * erfc(-(lx - mu) / s) if s else (1.0 if lx >= mu else 0.0) for mu, s in params]
        total: float = sum(map(mul, weights, map(vals.__getitem__, idx)))
        return total / norm
    return cdf


def _scaled_mixture_cdf(mix: list[tuple[float, LogNormal, float]]) -> Callable[[float], float]:
    """x -> sum(w * d.cdf(x / s) for w, d, s in mix), LogNormal.cdf inlined (the same floats, in the same order)."""
    terms = [(w, d.mu, d.sigma, d.sigma * math.sqrt(2), s) for w, d, s in mix]
    log, erfc = math.log, math.erfc

    def cdf(x: float) -> float:
        total = 0.0
        for w, mu, sigma, s2, s in terms:
            y = x / s
            if y <= 0:
                c = 0.0
            elif sigma == 0:
                c = 1.0 if log(y) >= mu else 0.0
            else:
                c = 0.5 * erfc(-(log(y) - mu) / s2)
            total += w * c
        return total
    return cdf


@dataclass(frozen=True)
class Prediction:
    """One instance's steady state at a per-instance arrival rate."""

    rate_rps: float
    in_flight: float  # L, the mean requests in flight (what ActiveRequests averages)
    ttft_p99_ms: float  # in-region, before network
    itl_p99_ms: float
    error_rate: float
    out_of_range: float  # share of arrivals joining a batch above the highest measured level
    stable: bool = True


def predict(model: ServiceModel, streams: list[Stream], per_instance_share: float) -> Prediction:
    """Steady state of one of 1/per_instance_share instances sharing `streams` (random routing)."""
    key = (tuple(streams), per_instance_share)
    known = model.predictions.get(key)
    if known is None:
        known = model.predictions[key] = _predict(model, streams, per_instance_share)
    return known


def _predict(model: ServiceModel, streams: list[Stream], per_instance_share: float) -> Prediction:
    rate = sum(s.rate_rps for s in streams) * per_instance_share
    if rate <= 0:
        p = model.point(1.0)
        return Prediction(0.0, 0.0, _quantile(model.ttft(1.0).cdf, 0.99, p.ttft_p99),
                          _quantile(model.itl_factor(1.0).cdf, 0.99, 2.0) * model.step_ms(1.0), p.error_rate, 0.0)
    out_mean = sum(s.rate_rps * s.output_mean for s in streams) / sum(s.rate_rps for s in streams)
    pmf = occupancy(model, rate, out_mean)
    if pmf is None:
        return Prediction(rate, math.inf, math.inf, math.inf, 1.0, 1.0, stable=False)
    level = sum(map(operator.mul, range(len(pmf)), pmf))  # sum(k * w for k, w in enumerate(pmf)), in C
    variance = sum((k - level) ** 2 * w for k, w in enumerate(pmf))
    top = int(model.top)
    out_of_range = max(0.0, 1.0 - sum(pmf[:top]))  # an arrival finding `top` in service waits: P(K >= top)
    model._level(len(pmf))
    levels = model._levels  # levels[k + 1] is _at(1.0 + k): the batch an arrival finding k joins
    joined = [(w, levels[j]) for j, w in enumerate(pmf, 1) if w > 1e-9]
    mix = [(w, fit[1]) for w, fit in joined]
    norm = sum(w for w, _ in mix)
    ttft = _quantile(_mixture_cdf(mix, norm), 0.99, model.point(1.0 + level).ttft_p99)
    spread = math.sqrt(2.0 * variance / 3.0)
    itl_mix = []
    for z, w in _GH:
        b = min(max(1.0 + level + spread * z, 1.0), model.top)
        itl_mix.append((w, model.itl_factor(b), model.step_ms(b)))
    itl = _quantile(_scaled_mixture_cdf(itl_mix), 0.99, model.point(1.0 + level).itl_p99)
    error = sum(w * fit[0].error_rate for w, fit in joined) / sum(pmf)
    return Prediction(rate, level, ttft, itl, error, out_of_range)


@dataclass(frozen=True)
class Limits:
    """What a pool must meet: P99 TTFT (in-region, i.e. SLO minus the worst member's network), ITL, errors."""

    ttft_ms: float
    itl_ms: float
    error_rate: float

    def binding(self, p: Prediction) -> str | None:
        """The first limit `p` breaks (None: it meets them all)."""
        if not p.stable:
            return "unstable"
        if p.ttft_p99_ms > self.ttft_ms:
            return "P99 TTFT"
        if p.itl_p99_ms > self.itl_ms:
            return "P99 ITL"
        if p.error_rate > self.error_rate:
            return "error rate"
        if p.out_of_range > MAX_OUT_OF_RANGE:
            return "measured range"
        return None


def instances_needed(model: ServiceModel, streams: list[Stream], limits: Limits, n_min: int = 0,
                     n_cap: int = 100_000) -> tuple[int, Prediction] | None:
    """Fewest instances (>= n_min, >= 1 when there is traffic) meeting `limits`; None if none does."""
    total = sum(s.rate_rps for s in streams)
    if total <= 0:
        n = max(n_min, 0)
        return n, predict(model, streams, 1.0)
    if limits.binding(predict(model, streams, 1.0 / n_cap)) is not None:
        return None
    lo, hi = 0, 1
    while limits.binding(predict(model, streams, 1.0 / hi)) is not None:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if limits.binding(predict(model, streams, 1.0 / mid)) is None:
            hi = mid
        else:
            lo = mid
    n = max(hi, n_min)
    return n, predict(model, streams, 1.0 / n)


def max_safe_rate(model: ServiceModel, output_mean: float, limits: Limits) -> tuple[float, Prediction, str] | None:
    """The highest per-instance arrival rate meeting `limits`, its prediction and the limit that binds above it."""
    stream = [Stream(1.0, output_mean)]
    if limits.binding(predict(model, stream, 1e-6)) is not None:
        return None
    lo, hi = 1e-6, 1.0
    while limits.binding(predict(model, stream, hi)) is None:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            break
    for _ in range(50):
        mid = (lo + hi) / 2
        if limits.binding(predict(model, stream, mid)) is None:
            lo = mid
        else:
            hi = mid
    return lo, predict(model, stream, lo), limits.binding(predict(model, stream, hi)) or "none"
