"""Synthetic markets with known answers, generated from a seed (docs/data.md gives every model).

Each market is a function ``(n, seed, <model parameters>, periods_per_year, bar_minutes) -> Bars``
and an entry of :data:`MARKETS`, which names its defaults and its *answer columns*: the columns of
``bars.extra`` that hold the model's hidden state or conditional mean. Answer columns are for
evaluation only; no extra column becomes a feature unless ``features.extra`` names it.

Timing, as the environment trades (fill at the next open; a synthetic bar opens at the previous
close): the position chosen at the close of bar ``t`` earns ``R_{t+1} = close[t+1] / close[t] - 1``.
Every ``drift`` column holds ``E[R_{t+1} | the model's state at t]`` at row ``t``.

``bars.source`` is the full specification, ``builtin:<name>?<every parameter>``, so the same bars can be
made again from it and :mod:`cudarl.datasets.references` can read the model's parameters.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cudarl.data.bars import Bars

from .calendar import bar_times

DAILY = {"periods_per_year": 252.0, "bar_minutes": 0}
HOURLY = {"periods_per_year": 8760.0, "bar_minutes": 60}  # around the clock, 24 x 365
#: The most coefficients of ``ar`` and the longest ``lag``: the stationarity check takes the
#: eigenvalues of a ``p x p`` companion matrix, and the burn-in is ``50 p + 500`` bars.
MAX_LAG = 1000


def spec(name: str, params: dict) -> str:
    """``builtin:<name>?k=v&...`` with every parameter; floats as ``repr`` (they read back exactly)."""

    def fmt(v):
        if isinstance(v, (tuple, list)):
            return ",".join(fmt(x) for x in v)
        return str(int(v)) if isinstance(v, (int, np.integer)) else repr(float(v))

    return f"builtin:{name}?" + "&".join(f"{k}={fmt(v)}" for k, v in params.items())


def bars_from_close(name: str, close, rng, params: dict, extra: dict | None = None, wick_scale=None) -> Bars:
    """OHLCV around a close path: each bar opens at the previous close, High and Low add a random
    wick (``wick_scale`` times |N(0, 0.25)|; default the spread of the close-to-close returns),
    Volume is log-normal. ``params`` (every parameter of the market, in order) make ``source`` and
    carry ``periods_per_year`` and ``bar_minutes``."""
    close = np.asarray(close, dtype=np.float64)
    n = len(close)
    if not np.all(np.isfinite(close)) or np.any(close <= 0):
        raise ValueError("a simulated price is not positive and finite: choose a smaller sigma")
    if wick_scale is None:
        wick_scale = np.std(close[1:] / close[:-1] - 1.0) if n > 1 else 0.0
    open_ = np.concatenate([[close[0]], close[:-1]])
    wick = np.abs(rng.normal(0.0, 0.25, size=(2, n))) * wick_scale if n > 1 else np.zeros((2, n))
    high = np.maximum(open_, close) * (1.0 + wick[0])
    low = np.minimum(open_, close) * (1.0 - np.minimum(wick[1], 0.5))
    volume = np.round(rng.lognormal(13.0, 0.3, size=n))
    return Bars(
        time=bar_times(n, int(params["bar_minutes"])),
        open=open_,
        high=high,
        low=low,
        close=close,
        volume=volume,
        extra=extra or {},
        source=spec(name, params),
        periods_per_year=float(params["periods_per_year"]),
        columns={"time": "Date", "open": "Open", "high": "High", "low": "Low", "close": "Close", "volume": "Volume"},
    )


def bars_from_returns(name: str, r, rng, params: dict, extra: dict | None = None) -> Bars:
    """:func:`bars_from_close` of ``100 * prod(1 + r)``; ``r[0]`` is ignored (the first close is 100)."""
    growth = 1.0 + np.asarray(r, dtype=np.float64)
    growth[0] = 1.0
    if np.any(growth <= 0):
        raise ValueError("a simulated return <= -100%: choose a smaller sigma")
    scale = np.std(np.asarray(r, dtype=np.float64)[1:]) if len(growth) > 1 else 0.0
    return bars_from_close(name, 100.0 * np.cumprod(growth), rng, params, extra, wick_scale=scale)


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _finite(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and math.isfinite(float(x))


def _integer(x) -> bool:
    return _finite(x) and float(x).is_integer()


def _in(market: str, name: str, value, ok: bool, allowed: str) -> None:
    """``ValueError("<market>: <name> must be <allowed>, got <value>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{market}: {name} must be {allowed}, got {value!r}")


def _check_common(market: str, n, seed, periods_per_year, bar_minutes) -> None:
    """The parameters every synthetic market takes (``bar_minutes``' bound on ``n`` is checked by
    :func:`cudarl.datasets.calendar.bar_times`)."""
    _in(market, "n", n, _integer(n) and n >= 2, "an integer >= 2")
    _in(market, "seed", seed, _integer(seed) and seed >= 0, "an integer >= 0")
    _in(market, "periods_per_year", periods_per_year, _finite(periods_per_year) and periods_per_year > 0, "> 0")
    _in(market, "bar_minutes", bar_minutes, _integer(bar_minutes) and bar_minutes >= 0, "an integer >= 0")


def _check_sigma(market: str, sigma) -> None:
    _in(market, "sigma", sigma, _finite(sigma) and sigma > 0, "> 0 (and finite)")


# --- the markets ------------------------------------------------------------------------------------
def regime(n=5000, seed=0, mu=0.002, sigma=0.01, p=0.02, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """Hidden two-state drift: ``s_t`` in {-1, +1} flips with probability ``p`` per bar and
    ``R_{t+1} = mu s_t + sigma eps_{t+1}``. Answer column ``regime`` = ``s_t``."""
    _check_common("regime", n, seed, periods_per_year, bar_minutes)
    _in("regime", "mu", mu, _finite(mu), "finite")
    _check_sigma("regime", sigma)
    _in("regime", "p", p, _finite(p) and 0.0 < p < 1.0, "in (0, 1)")
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    rng = np.random.default_rng([int(seed), 0x5EED])
    flips = np.where(rng.random(n) < p, -1.0, 1.0)
    flips[0] = 1.0 if rng.random() < 0.5 else -1.0
    s = np.cumprod(flips)
    r = np.empty(n)
    r[0] = 0.0
    r[1:] = mu * s[:-1] + sigma * rng.standard_normal(n - 1)
    return bars_from_returns("regime", r, rng, params, extra={"regime": s})


def ar_coefficients_ok(phi) -> bool:
    """True when ``R_{t+1} = sum_i phi_i R_{t+1-i} + noise`` is stationary (companion eigenvalues < 1)."""
    phi = np.asarray(phi, dtype=np.float64)
    if phi.size == 0 or not np.all(np.isfinite(phi)):
        return False
    if np.count_nonzero(phi) <= 1:  # z^p = phi_i z^(p-i): roots 0 and the i-th roots of phi_i (no eig of p x p)
        return bool(np.max(np.abs(phi)) < 1.0)
    comp = np.zeros((phi.size, phi.size))
    comp[0] = phi
    comp[1:, :-1] = np.eye(phi.size - 1)
    return bool(np.max(np.abs(np.linalg.eigvals(comp))) < 1.0)


def _ar_path(n, seed, tag, phi, sigma):
    """Returns ``r`` [n] (``r[t] = R_t``) and ``drift`` [n] (``E[R_{t+1} | R_{<=t}]``) of a stationary AR(p)."""
    phi = np.asarray(phi, dtype=np.float64)
    _need(ar_coefficients_ok(phi), f"AR coefficients {phi.tolist()} are not stationary (or empty)")
    _need(sigma > 0 and n >= 2, "needs sigma > 0, n >= 2")
    rng = np.random.default_rng([int(seed), tag])
    burn = 50 * phi.size + 500  # the burn-in forgets the zero start
    e = sigma * rng.standard_normal(n + burn)
    from scipy.signal import lfilter  # here: importing scipy.signal takes ~0.9 s, and regime never needs it

    x = lfilter([1.0], np.concatenate([[1.0], -phi]), e)  # x[j] = sum_i phi_i x[j - i] + e[j]
    drift = np.concatenate([x[1:] - e[1:], [float(phi @ x[::-1][: phi.size])]])  # E[x[j + 1] | x[<= j]]
    # row t of the output is step burn + t: R_t = x[burn + t], E[R_{t+1}] = drift[burn + t]
    return x[burn:], drift[burn:], rng


def ar(n=5000, seed=0, phi=(0.1,), sigma=0.01, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """AR(p) simple returns ``R_{t+1} = sum_i phi_i R_{t+1-i} + sigma eps_{t+1}`` (``phi`` as a
    comma list: ``builtin:ar?phi=0.1,-0.05``). Answer column ``drift``."""
    phi = tuple(float(v) for v in np.atleast_1d(phi))
    _check_common("ar", n, seed, periods_per_year, bar_minutes)
    _in("ar", "phi", list(phi), 1 <= len(phi) <= MAX_LAG, f"a list of 1 to {MAX_LAG} coefficients")
    _need(
        ar_coefficients_ok(phi),
        f"ar: phi={list(phi)} is not stationary: every root of 1 - sum_i phi_i z^i must lie outside the "
        "unit circle (one coefficient: |phi| < 1)",
    )
    _check_sigma("ar", sigma)
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    r, drift, rng = _ar_path(n, seed, 0xA12, phi, sigma)
    return bars_from_returns("ar", r, rng, params, extra={"drift": drift})


def lag_coefficients(lag: int, phi: float) -> tuple:
    """The AR coefficients of :func:`lag`: zeros, then ``phi`` at lag ``lag``."""
    return (0.0,) * (int(lag) - 1) + (float(phi),)


def lag(n=5000, seed=0, lag=5, phi=0.15, sigma=0.01, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """The return ``lag`` bars ago echoes: ``R_{t+1} = phi R_{t+1-lag} + sigma eps_{t+1}``.

    The signal is one bar's return from ``lag - 1`` bars before the decision: the built-in
    ``ret_<h>`` features sum the last ``h`` returns, so none of them isolates it (with the
    default horizons 1, 4, 16, 64 and ``lag = 5`` it is 1/16 of ``ret_16``). Answer column ``drift``.
    """
    _check_common("lag", n, seed, periods_per_year, bar_minutes)
    _in("lag", "lag", lag, _integer(lag) and 1 <= lag <= MAX_LAG, f"an integer in [1, {MAX_LAG}]")
    _in("lag", "phi", phi, _finite(phi) and abs(phi) < 1.0, "in (-1, 1) (stationary)")
    _check_sigma("lag", sigma)
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    r, drift, rng = _ar_path(n, seed, 0x1A6, lag_coefficients(lag, phi), sigma)
    return bars_from_returns("lag", r, rng, params, extra={"drift": drift})


def ou(n=5000, seed=0, kappa=0.05, sigma=0.002, level=100.0, periods_per_year=8760.0, bar_minutes=60) -> Bars:
    """Mean-reverting log price (Ornstein-Uhlenbeck, hourly bars by default):
    ``x_{t+1} = x_t + kappa (theta - x_t) + sigma eps_{t+1}``, ``close_t = exp(x_t)``, ``theta = log(level)``,
    ``x_0`` drawn from the stationary law. Answer columns ``deviation`` = ``x_t - theta`` and
    ``drift`` = ``E[R_{t+1} | x_t] = exp(-kappa d_t + sigma^2 / 2) - 1``."""
    _check_common("ou", n, seed, periods_per_year, bar_minutes)
    _in("ou", "kappa", kappa, _finite(kappa) and 0.0 < kappa < 1.0, "in (0, 1)")
    _check_sigma("ou", sigma)
    _in("ou", "level", level, _finite(level) and level > 0, "> 0 (and finite)")
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    rng = np.random.default_rng([int(seed), 0x0B5])
    e = rng.standard_normal(n)
    e[0] /= math.sqrt(kappa * (2.0 - kappa))  # d_0 from the stationary law
    from scipy.signal import lfilter  # after params = dict(locals()); see _ar_path

    d = lfilter([1.0], [1.0, kappa - 1.0], sigma * e)  # d_t = (1 - kappa) d_{t-1} + sigma eps_t
    close = np.exp(math.log(level) + d)
    drift = np.exp(-kappa * d + 0.5 * sigma * sigma) - 1.0
    return bars_from_close("ou", close, rng, params, extra={"deviation": d, "drift": drift})


def noise(n=5000, seed=0, sigma=0.01, alpha=0.05, beta=0.90, df=5.0, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """A martingale with volatility clustering and fat tails: ``R_{t+1} = sqrt(h_{t+1}) z_{t+1}``,
    ``h_{t+1} = omega + alpha R_t^2 + beta h_t`` (GARCH(1,1), ``omega = sigma^2 (1 - alpha - beta)``,
    so ``sigma`` is the unconditional volatility), ``z`` Student-t with ``df`` degrees of freedom
    scaled to unit variance (``df = 0``: normal). ``E[R_{t+1} | past] = 0``: no policy has an edge
    before costs. Answer column ``vol`` = ``sqrt(h_{t+1})``."""
    _check_common("noise", n, seed, periods_per_year, bar_minutes)
    _check_sigma("noise", sigma)
    _in("noise", "alpha", alpha, _finite(alpha) and alpha >= 0, ">= 0 (and alpha + beta < 1)")
    _in("noise", "beta", beta, _finite(beta) and beta >= 0, ">= 0 (and alpha + beta < 1)")
    _in("noise", "alpha + beta", alpha + beta, alpha + beta < 1, "< 1 (a stationary variance)")
    _in("noise", "df", df, _finite(df) and (df == 0 or df > 2), "> 2, or 0 for normal draws")
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    rng = np.random.default_rng([int(seed), 0x401E])
    z = rng.standard_t(df, size=n) * math.sqrt((df - 2.0) / df) if df else rng.standard_normal(n)
    omega = sigma * sigma * (1.0 - alpha - beta)
    r, h = np.zeros(n), np.empty(n)
    h[0] = sigma * sigma  # h[t] is the variance of R_{t+1}
    for t in range(1, n):
        r[t] = math.sqrt(h[t - 1]) * z[t]
        h[t] = omega + alpha * r[t] * r[t] + beta * h[t - 1]
    return bars_from_returns("noise", r, rng, params, extra={"vol": np.sqrt(h)})


def randomwalk(n=5000, seed=0, sigma=0.01, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """A driftless walk in simple returns, ``R_t = sigma * eps_t`` (i.i.d. normal); no answer columns."""
    _check_common("randomwalk", n, seed, periods_per_year, bar_minutes)
    _check_sigma("randomwalk", sigma)
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    rng = np.random.default_rng([int(seed), 0xAA1C])
    r = np.empty(n)
    r[0] = 0.0
    r[1:] = sigma * rng.standard_normal(n - 1)
    return bars_from_returns("randomwalk", r, rng, params)


def canary(n=5000, seed=0, sigma=0.01, periods_per_year=252.0, fill_close=0, bar_minutes=0) -> Bars:
    """``randomwalk`` with the leaked column ``next_return``: at bar ``t`` the return a position chosen
    at close[t] earns in the environment (open[t+1] to open[t+2] for ``fill_close = 0``; close to
    close for 1), divided by ``sigma``. A learner given it (``features.extra = ["next_return"]``)
    must exploit it; one that does not has a bug (tools/learning_check.py)."""
    _check_common("canary", n, seed, periods_per_year, bar_minutes)
    _check_sigma("canary", sigma)
    _in("canary", "fill_close", fill_close, fill_close in (0, 1), "0 (fills at the open) or 1 (at the close)")
    params = dict(locals())  # every parameter, in order (no other local exists yet)
    walk = randomwalk(n=n, seed=seed, sigma=sigma, periods_per_year=periods_per_year, bar_minutes=bar_minutes)
    px = np.asarray(walk.close if fill_close else walk.open, dtype=np.float64)
    leak = np.zeros(len(px))
    leak[:-2] = (px[2:] / px[1:-1] - 1.0) / sigma
    return dataclasses.replace(walk, extra={"next_return": leak}, source=spec("canary", params))


@dataclass(frozen=True)
class Market:
    """A synthetic market: its generator, parameter defaults (one place: the CLI, the docs and the
    resolver read them here), answer columns, and whether :mod:`cudarl.datasets.references` knows
    its optimal policies."""

    make: Callable[..., Bars]
    defaults: dict
    answers: tuple
    has_references: bool = True


def _defaults(fn) -> dict:
    import inspect

    return {k: p.default for k, p in inspect.signature(fn).parameters.items()}


#: name -> :class:`Market`.
MARKETS = {
    "regime": Market(regime, _defaults(regime), ("regime",)),
    "ar": Market(ar, _defaults(ar), ("drift",)),
    "lag": Market(lag, _defaults(lag), ("drift",)),
    "ou": Market(ou, _defaults(ou), ("deviation", "drift")),
    "noise": Market(noise, _defaults(noise), ("vol",)),
    "randomwalk": Market(randomwalk, _defaults(randomwalk), ()),
    "canary": Market(canary, _defaults(canary), ("next_return",), has_references=False),
}
