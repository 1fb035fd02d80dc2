"""Built-in data sets, addressed as ``builtin:<name>[?key=value&...]``.

Real series (files beside this module, licences and provenance in README.md):
``sp500``, ``nasdaq`` (daily, from ``arch``, NCSA) and ``eurusd-1h`` (hourly, from
``gym-anytrading``, MIT). Synthetic series, generated from a seed:

``regime``: a two-state Markov regime ``s_t`` in {-1, +1} that flips with probability
``p`` per bar, observed at bar ``t`` (column ``regime``), drives the next bar's simple return::

    R_{t+1} = mu * s_t + sigma * eps_{t+1},   eps ~ N(0, 1) i.i.d.

The policy ``position_t = s_t`` earns ``mu + sigma * s_t * eps_{t+1}`` per bar, with mean ``mu``
and standard deviation ``sigma``; see :func:`regime_sharpe` for its Sharpe with costs.

``randomwalk``: ``R_{t+1} = sigma * eps_{t+1}``; no policy has an expected edge.

``canary``: ``randomwalk`` plus a leaked column ``next_return``: at bar ``t`` it holds the
return that a position chosen at close[t] earns in the environment (filled at open[t+1] and
held to open[t+2] for ``fill=open``; close to close for ``fill=close``), divided by ``sigma``.
A correct learner must exploit it; one that does not has a bug (tools/learning_check.py).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from cudarl.data.bars import NS_PER_DAY, Bars, DataError, Problem

HERE = Path(__file__).resolve().parent

#: name -> (file, licence notice file)
REAL = {
    "sp500": ("sp500.csv.gz", "LICENSE-arch.md"),
    "nasdaq": ("nasdaq.csv.gz", "LICENSE-arch.md"),
    "eurusd-1h": ("eurusd-1h.csv.gz", "LICENSE-gym-anytrading.txt"),
}

#: Defaults of the synthetic sets (one place: the CLI and docs read them from here).
REGIME_DEFAULTS = {"n": 5000, "seed": 0, "mu": 0.002, "sigma": 0.01, "p": 0.02, "periods_per_year": 252.0, "bar_minutes": 0}
RANDOMWALK_DEFAULTS = {"n": 5000, "seed": 0, "sigma": 0.01, "periods_per_year": 252.0, "bar_minutes": 0}
CANARY_DEFAULTS = {**RANDOMWALK_DEFAULTS, "fill_close": 0}
START = np.datetime64("2000-01-03", "D")  # a Monday


def names() -> list[str]:
    """Every built-in name."""
    return sorted(REAL) + ["canary", "randomwalk", "regime"]


def _params(spec: str, defaults: dict) -> dict:
    name, _, query = spec.partition("?")
    out = dict(defaults)
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in defaults:
            raise DataError(spec, [Problem("bad_builtin", f"unknown parameter {key!r}; {name} takes {sorted(defaults)}")])
        try:
            out[key] = type(defaults[key])(float(value)) if isinstance(defaults[key], int) else float(value)
        except ValueError:
            raise DataError(spec, [Problem("bad_builtin", f"parameter {key}={value!r} is not a number")]) from None
    return out


def resolve(spec: str):
    """``builtin:<name>[?params]`` -> a ``Path`` (real series) or a synthetic :class:`Bars`."""
    body = spec[len("builtin:"):] if spec.startswith("builtin:") else spec
    name = body.partition("?")[0]
    if name in REAL:
        if "?" in body:
            raise DataError(spec, [Problem("bad_builtin", f"{name} takes no parameters")])
        return HERE / REAL[name][0]
    makers = {"regime": (regime, REGIME_DEFAULTS), "randomwalk": (randomwalk, RANDOMWALK_DEFAULTS),
              "canary": (canary, CANARY_DEFAULTS)}
    if name in makers:
        make, defaults = makers[name]
        try:
            return make(**_params(body, defaults))
        except ValueError as exc:  # parameters out of range: a data error, reported like the others
            raise DataError(spec, [Problem("bad_builtin", str(exc))]) from None
    raise DataError(spec, [Problem("bad_builtin", f"no built-in data set {name!r}; there are {names()}")])


def business_days(n: int, start=START) -> np.ndarray:
    """int64 ns [n]: ``n`` consecutive Monday-to-Friday dates from ``start``, at 00:00 UTC."""
    # Integer arithmetic only: np.busday_offset and datetime64 array arithmetic both crashed
    # (segfault) for 4M dates with NumPy 2.5.2 on the GPU host. Five business days per calendar
    # week from a Monday.
    d0 = int(np.datetime64(start, "D").astype(np.int64))
    if (d0 + 3) % 7 != 0:  # 1970-01-01 was a Thursday
        raise ValueError(f"business_days starts on a Monday, got {start}")
    # int64 nanoseconds end in April 2262: past that the product wraps and time would run backwards.
    last_day = int(np.iinfo(np.int64).max // NS_PER_DAY)
    if n > 0 and d0 + 7 * ((n - 1) // 5) + (n - 1) % 5 > last_day:
        most = 5 * ((last_day - d0) // 7) + min((last_day - d0) % 7 + 1, 5)
        raise ValueError(f"{n} daily bars from {start} run past 2262-04-11, the last date int64 nanoseconds hold; "
                         f"at most {most} bars (or intraday bars: bar_minutes=1)")
    k = np.arange(n, dtype=np.int64)
    return (d0 + 7 * (k // 5) + k % 5) * np.int64(NS_PER_DAY)


def bar_times(n: int, bar_minutes: int = 0, start=START) -> np.ndarray:
    """int64 ns [n]: business days (``bar_minutes = 0``) or bars every ``bar_minutes`` minutes, around
    the clock from ``start`` (for series longer than daily dates can hold: 68,425 bars)."""
    if bar_minutes == 0:
        return business_days(n, start)
    if bar_minutes < 0:
        raise ValueError(f"bar_minutes must be >= 0, got {bar_minutes}")
    t0, step = int(np.datetime64(start, "ns").astype(np.int64)), int(bar_minutes) * 60 * 10**9
    if n > 0 and t0 + (n - 1) * step > np.iinfo(np.int64).max:
        raise ValueError(f"{n} bars of {bar_minutes} minutes from {start} run past 2262-04-11 (int64 nanoseconds)")
    return t0 + np.arange(n, dtype=np.int64) * np.int64(step)


def _bars_from_returns(name, r, rng, periods_per_year, extra=None, bar_minutes=0) -> Bars:
    """OHLCV around a close path ``100 * prod(1 + r)``; ``r[0]`` is ignored (the first close is 100)."""
    n = len(r)
    growth = 1.0 + r
    growth[0] = 1.0
    if np.any(growth <= 0):
        raise ValueError("a simulated return <= -100%: choose a smaller sigma")
    close = 100.0 * np.cumprod(growth)
    open_ = np.concatenate([[close[0]], close[:-1]])
    wick = np.abs(rng.normal(0.0, 0.25, size=(2, n))) * np.std(r[1:]) if n > 1 else np.zeros((2, n))
    high = np.maximum(open_, close) * (1.0 + wick[0])
    low = np.minimum(open_, close) * (1.0 - np.minimum(wick[1], 0.5))
    volume = np.round(rng.lognormal(13.0, 0.3, size=n))
    return Bars(time=bar_times(n, bar_minutes), open=open_, high=high, low=low, close=close, volume=volume,
                extra=extra or {}, source=f"builtin:{name}", periods_per_year=periods_per_year,
                columns={"time": "Date", "open": "Open", "high": "High", "low": "Low", "close": "Close", "volume": "Volume"})


def regime(n=5000, seed=0, mu=0.002, sigma=0.01, p=0.02, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """The regime-switching market (module docstring); ``extra["regime"]`` is ``s_t`` (float64 [n]).

    Bars are business days from 2000-01-03 (``bar_minutes`` > 0: bars that many minutes apart, see
    :func:`bar_times`); ``periods_per_year`` is recorded on the bars.
    """
    if not (0.0 < p < 1.0) or sigma <= 0 or n < 2:
        raise ValueError("regime needs 0 < p < 1, sigma > 0, n >= 2")
    rng = np.random.default_rng([int(seed), 0x5EED])
    flips = np.where(rng.random(n) < p, -1.0, 1.0)
    flips[0] = 1.0 if rng.random() < 0.5 else -1.0
    s = np.cumprod(flips)
    r = np.empty(n)
    r[0] = 0.0
    r[1:] = mu * s[:-1] + sigma * rng.standard_normal(n - 1)
    return _bars_from_returns("regime", r, rng, periods_per_year, extra={"regime": s}, bar_minutes=bar_minutes)


def randomwalk(n=5000, seed=0, sigma=0.01, periods_per_year=252.0, bar_minutes=0) -> Bars:
    """A driftless walk in simple returns, ``R_t = sigma * eps_t``; business days from 2000-01-03
    (or bars ``bar_minutes`` apart)."""
    if sigma <= 0 or n < 2:
        raise ValueError("randomwalk needs sigma > 0, n >= 2")
    rng = np.random.default_rng([int(seed), 0xAA1C])
    r = np.empty(n)
    r[0] = 0.0
    r[1:] = sigma * rng.standard_normal(n - 1)
    return _bars_from_returns("randomwalk", r, rng, periods_per_year, bar_minutes=bar_minutes)


def canary(n=5000, seed=0, sigma=0.01, periods_per_year=252.0, fill_close=0, bar_minutes=0) -> Bars:
    """``randomwalk`` with the leaked column ``next_return`` (module docstring).

    ``fill_close`` 0: the env's default fill at the next open; 1: at the next close.
    """
    bars = randomwalk(n=n, seed=seed, sigma=sigma, periods_per_year=periods_per_year, bar_minutes=bar_minutes)
    px = np.asarray(bars.close if fill_close else bars.open, dtype=np.float64)
    leak = np.zeros(len(px))
    leak[:-2] = (px[2:] / px[1:-1] - 1.0) / sigma
    bars.extra["next_return"] = leak
    return dataclasses.replace(bars, source="builtin:canary")


def regime_optimal_positions(bars: Bars) -> np.ndarray:
    """float64 [T]: the optimal position at each bar of ``builtin:regime``, ``s_t``."""
    return np.asarray(bars.extra["regime"], dtype=np.float64).copy()


def regime_sharpe(mu=0.002, sigma=0.01, p=0.02, cost_rate=0.0, periods_per_year=252.0) -> float:
    """Annualised Sharpe of ``position_t = s_t`` on ``builtin:regime``, with costs.

    ``cost_rate = (cost_bps + slippage_bps) * 1e-4`` (cudarl.costs). A flip moves the position
    by 2, paying ``2c``; flips happen with probability ``p`` per bar, independently of the
    next bar's noise, so per bar (stationary, ignoring the first entry)::

        mean = mu - 2 c p,   var = sigma^2 + 4 c^2 p (1 - p)
        Sharpe = (mu - 2 c p) / sqrt(sigma^2 + 4 c^2 p (1 - p)) * sqrt(periods_per_year)

    The policy maximises expected return among positions in [-1, 1] when ``mu >= c p``
    (keeping the old position through a regime of expected length ``1/p`` loses ``2 mu / p``;
    flipping costs ``2c``); with ``c = 0`` it also maximises the Sharpe ratio.
    """
    c = float(cost_rate)
    return (mu - 2 * c * p) / math.sqrt(sigma ** 2 + 4 * c * c * p * (1 - p)) * math.sqrt(periods_per_year)


def licence_notice(name: str) -> str:
    """The licence text shipped with real series ``name``."""
    return (HERE / REAL[name][1]).read_text()
