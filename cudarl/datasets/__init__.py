"""Built-in data sets, addressed as ``builtin:<name>[?key=value&...]``.

Real series (files beside this module, licences and provenance in README.md):
``sp500``, ``nasdaq`` (daily, from ``arch``, NCSA) and ``eurusd-1h`` (hourly, from
``gym-anytrading``, MIT).

Synthetic markets with known answers (:mod:`cudarl.datasets.markets`, docs/data.md): ``regime``
(hidden two-state drift), ``ar`` (AR(p) returns), ``lag`` (the return ``lag`` bars ago echoes),
``ou`` (mean-reverting log price, hourly), ``noise`` (a martingale with volatility clustering),
``randomwalk`` and ``canary`` (a random walk plus a column that leaks the next return). Their
answer columns (hidden state, conditional mean) are in ``bars.extra`` for evaluation only: none
is a feature unless ``features.extra`` names it. :mod:`cudarl.datasets.references` computes each
market's full-information and best causal policies.
"""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from cudarl.data.bars import Bars, DataError, Problem

from .calendar import START as START  # re-exported: the first bar's date
from .calendar import bar_times, business_days
from .markets import MARKETS, ar, canary, lag, noise, ou, randomwalk, regime

HERE = Path(__file__).resolve().parent

#: name -> (file, licence notice file)
REAL = {
    "sp500": ("sp500.csv.gz", "LICENSE-arch.md"),
    "nasdaq": ("nasdaq.csv.gz", "LICENSE-arch.md"),
    "eurusd-1h": ("eurusd-1h.csv.gz", "LICENSE-gym-anytrading.txt"),
}

#: Defaults of the synthetic sets (one place: :data:`MARKETS`; these names stay for old callers).
REGIME_DEFAULTS = MARKETS["regime"].defaults
RANDOMWALK_DEFAULTS = MARKETS["randomwalk"].defaults
CANARY_DEFAULTS = MARKETS["canary"].defaults

__all__ = [
    "ar",
    "answer_columns",
    "bar_times",
    "business_days",
    "canary",
    "lag",
    "licence_notice",
    "names",
    "noise",
    "ou",
    "parse",
    "randomwalk",
    "regime",
    "regime_optimal_positions",
    "regime_sharpe",
    "resolve",
]


def names() -> list[str]:
    """Every built-in name."""
    return sorted(REAL) + sorted(MARKETS)


def _value(default, text: str):
    if isinstance(default, tuple):
        return tuple(float(v) for v in text.split(",") if v.strip())
    if isinstance(default, int):
        v = float(text)
        if not v.is_integer():
            raise ValueError(text)
        return int(v)
    return float(text)


def parse(spec: str) -> tuple[str, dict]:
    """``builtin:<name>[?k=v&...]`` -> ``(name, parameters)`` of a synthetic market, defaults filled in."""
    body = spec[len("builtin:") :] if spec.startswith("builtin:") else spec
    name, _, query = body.partition("?")
    if name not in MARKETS:
        raise DataError(spec, [Problem("bad_builtin", f"no synthetic market {name!r}; there are {sorted(MARKETS)}")])
    defaults = MARKETS[name].defaults
    out = dict(defaults)
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in defaults:
            raise DataError(
                spec, [Problem("bad_builtin", f"unknown parameter {key!r}; {name} takes {sorted(defaults)}")]
            )
        try:
            out[key] = _value(defaults[key], value)
        except ValueError:
            d = defaults[key]
            kind = {tuple: "a comma list of numbers", int: "an integer"}.get(type(d), "a number")
            raise DataError(spec, [Problem("bad_builtin", f"parameter {key}={value!r} is not {kind}")]) from None
    return name, out


def resolve(spec: str):
    """``builtin:<name>[?params]`` -> a ``Path`` (real series) or a synthetic :class:`Bars`."""
    body = spec[len("builtin:") :] if spec.startswith("builtin:") else spec
    name = body.partition("?")[0]
    if name in REAL:
        if "?" in body:
            raise DataError(spec, [Problem("bad_builtin", f"{name} takes no parameters")])
        return HERE / REAL[name][0]
    if name in MARKETS:
        _, params = parse(body)
        try:
            return MARKETS[name].make(**params)
        except ValueError as exc:  # parameters out of range: a data error, reported like the others
            raise DataError(spec, [Problem("bad_builtin", str(exc))]) from None
    raise DataError(spec, [Problem("bad_builtin", f"no built-in data set {name!r}; there are {names()}")])


def answer_columns(bars: Bars) -> tuple:
    """The evaluation-only columns of ``bars.extra`` (those of a synthetic market; none for other bars)."""
    src = bars.source or ""
    name = src[len("builtin:") :].partition("?")[0] if src.startswith("builtin:") else None
    return MARKETS[name].answers if name in MARKETS else ()


def regime_optimal_positions(bars: Bars) -> np.ndarray:
    """float64 [T]: the full-information position at each bar of ``builtin:regime``, ``s_t``
    (optimal when ``mu >= c p``; :mod:`cudarl.datasets.references` solves the general case)."""
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
    return (mu - 2 * c * p) / math.sqrt(sigma**2 + 4 * c * c * p * (1 - p)) * math.sqrt(periods_per_year)


def licence_notice(name: str) -> str:
    """The licence text shipped with real series ``name``."""
    return (HERE / REAL[name][1]).read_text()
