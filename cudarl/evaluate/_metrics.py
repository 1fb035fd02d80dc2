"""Performance metrics of per-bar returns, with empyrical's conventions.

Returns are simple, non-cumulative, one per bar. ``periods_per_year`` is the annualisation
factor (empyrical's ``annualization``), always explicit or inferred and recorded.
"""

from __future__ import annotations

import math

import numpy as np

from cudarl.data.bars import infer_periods_per_year


def _sharpe(r, ppy):
    if r.size < 2:
        return math.nan
    sd = 0.0 if r.max() == r.min() else float(np.std(r, ddof=1))  # empyrical: exact zero for constants
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.divide(r.mean(), sd) * math.sqrt(ppy))


def _sortino(r, ppy):
    if r.size < 2:
        return math.nan
    downside = math.sqrt(float(np.mean(np.minimum(r, 0.0) ** 2))) * math.sqrt(ppy)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.divide(r.mean() * ppy, downside))


def drawdown(r) -> np.ndarray:
    """float64 [N]: ``wealth / running peak - 1`` after each bar, the peak including the start."""
    wealth = np.concatenate([[1.0], np.cumprod(1.0 + np.asarray(r, dtype=np.float64))])
    peak = np.maximum.accumulate(wealth)
    return ((wealth - peak) / peak)[1:]


def trades(positions, net, costs) -> list[dict]:
    """Trades: maximal runs of bars holding a position of one sign (size may change inside).

    ``positions``, ``net``, ``costs`` float64 [N] (bar ``k`` holds ``positions[k]`` and pays
    ``costs[k]`` for moving there). Each trade: ``start``, ``stop`` (bar indices, half open),
    ``side`` (+1/-1), ``bars``, ``return`` = the sum of its bars' net returns plus its exit
    cost, ``open`` (still held after the last bar, so no exit cost yet). On a flip the flip
    bar's cost is shared between the two trades in proportion to the two positions.
    """
    start, stop, side, ret = _trade_table(positions, net, costs)
    n = len(positions)
    return [
        {"start": k, "stop": j, "side": int(sd), "bars": j - k, "return": x, "open": j == n}
        for k, j, sd, x in zip(start.tolist(), stop.tolist(), side.tolist(), ret.tolist(), strict=True)
    ]


#: Trades up to this many bars have their returns summed in one NumPy pass per bar (below 8 numbers,
#: NumPy's ``sum`` adds them one after another from 0.0, so the same order gives the same bits);
#: longer ones call ``sum`` (pairwise) themselves.
_SUMMED_IN_ORDER = 7


def _trade_table(positions, net, costs) -> tuple:
    """:func:`trades` as arrays: ``(start, stop, side, return)``, int64, int64, float64, float64 [trades].

    One NumPy call over the runs per step, not a Python step per trade (which was most of an
    evaluation's metrics), with the same bits: each return is ``net[k:j].sum()`` (short trades summed
    bar by bar in NumPy's order, :data:`_SUMMED_IN_ORDER`), then the cost shares in the order a trade
    meets them, each ``costs[j] * |old| / (|old| + |new|)`` as the scalar computation was."""
    p = np.asarray(positions, dtype=np.float64)
    net = np.asarray(net, dtype=np.float64)
    costs = np.asarray(costs, dtype=np.float64)
    side = np.sign(p)
    n = len(p)
    first = np.flatnonzero(np.diff(side, prepend=np.nan))  # the first bar of each run of one sign
    stop = np.append(first[1:], n)
    held = side[first] != 0
    k, j = first[held], stop[held]
    bars = j - k
    ret = np.zeros(len(k))
    for i in range(_SUMMED_IN_ORDER):
        more = bars > i
        ret[more] += net[k[more] + i]
    for t in np.flatnonzero(bars > _SUMMED_IN_ORDER).tolist():
        ret[t] = net[k[t] : j[t]].sum()
    a = np.abs(p)

    def share(b):  # the part of bar b's cost that closes the position held before it
        return costs[b] * a[b - 1] / (a[b - 1] + a[b])

    opens = (k > 0) & (side[np.maximum(k - 1, 0)] != 0)  # a flip: the closing part belongs to the last trade
    ret[opens] += share(k[opens])
    closes = j < n
    ret[closes] -= share(j[closes])
    return k, j, side[k], ret


def resolve_periods_per_year(periods_per_year=None, times=None) -> tuple[float, str]:
    """``(ppy, how)``: the given value, or one inferred from int64 ns ``times``."""
    if periods_per_year is not None:
        if not periods_per_year > 0:
            raise ValueError(f"periods_per_year must be > 0, got {periods_per_year}")
        return float(periods_per_year), "given"
    if times is None:
        raise ValueError("pass periods_per_year, or times to infer it from")
    return infer_periods_per_year(times)


def metrics(returns, periods_per_year: float | None = None, *, times=None, positions=None, costs=None) -> dict:
    """Performance of per-bar simple returns ``returns`` float64 [N].

    Conventions are empyrical's (risk-free and required return 0):
      total_return     prod(1 + r) - 1
      annual_return    (1 + total_return) ** (ppy / N) - 1
      annual_volatility  std(r, ddof=1) * sqrt(ppy)
      sharpe           mean(r) / std(r, ddof=1) * sqrt(ppy)
      sortino          mean(r) * ppy / (sqrt(mean(min(r, 0)^2)) * sqrt(ppy))
      max_drawdown     min over bars of wealth / running peak - 1, the start (1.0) a peak
      calmar           annual_return / |max_drawdown| (NaN when there is no drawdown)
    and further, from ``positions`` and ``costs`` float64 [N] when given:
      turnover         sum |position_k - position_{k-1}| / N * ppy (equity traded per year,
                       from flat before the first bar)
      trades, trade_win_rate   see :func:`trades`; the win rate counts trades with return > 0
      bar_hit_rate     share of bars holding a position whose net return is > 0
      exposure         share of bars holding a non-zero position
      costs_paid       sum of costs (fractions of equity, not compounded)
      profit_factor    sum of positive bar returns / |sum of negative bar returns|
    ``periods_per_year`` None: inferred from ``times`` (int64 ns [N]) and recorded as
    ``periods_per_year`` and ``periods_per_year_source``. Undefined values are NaN (or inf), and
    ``null_reasons`` says why for each (strict JSON writes them as null: :func:`json_safe`).
    """
    r = np.asarray(returns, dtype=np.float64)
    ppy, how = resolve_periods_per_year(periods_per_year, times)
    n = r.size
    total = float(np.prod(1.0 + r) - 1.0) if n else math.nan
    annual = float((1.0 + total) ** (ppy / n) - 1.0) if n else math.nan
    mdd = float(np.min(drawdown(r))) if n else math.nan
    gains, losses = float(r[r > 0].sum()), float(-r[r < 0].sum())
    out = {
        "bars": int(n),
        "periods_per_year": ppy,
        "periods_per_year_source": how,
        "total_return": total,
        "annual_return": annual,
        "annual_volatility": float(np.std(r, ddof=1) * math.sqrt(ppy)) if n >= 2 else math.nan,
        "sharpe": _sharpe(r, ppy),
        "sortino": _sortino(r, ppy),
        "max_drawdown": mdd,
        "calmar": annual / abs(mdd) if n and mdd < 0 else math.nan,
        "profit_factor": gains / losses if losses > 0 else (math.inf if gains > 0 else math.nan),
    }
    if positions is not None:
        p = np.asarray(positions, dtype=np.float64)
        if p.shape != r.shape:
            raise ValueError(f"positions {p.shape} and returns {r.shape} differ")
        c = np.zeros(n) if costs is None else np.asarray(costs, dtype=np.float64)
        moved = np.abs(np.diff(p, prepend=0.0))
        held = p != 0
        trade_returns = _trade_table(p, r, c)[3]
        out.update(
            {
                "turnover": float(moved.sum() / n * ppy) if n else math.nan,
                "trades": len(trade_returns),
                "trade_win_rate": float(np.mean(trade_returns > 0)) if len(trade_returns) else math.nan,
                "bar_hit_rate": float(np.mean(r[held] > 0)) if held.any() else math.nan,
                "exposure": float(held.mean()) if n else math.nan,
                "mean_abs_position": float(np.abs(p).mean()) if n else math.nan,
                "costs_paid": float(c.sum()),
            }
        )
    reasons = _null_reasons(out, r)
    if reasons:
        out["null_reasons"] = reasons
    return out


def _null_reasons(out: dict, r: np.ndarray) -> dict:
    """Why each undefined (NaN or infinite) value of :func:`metrics` is so, for strict JSON."""
    flat = "the returns are constant (no position held: flat)"
    few = "fewer than 2 bars"
    why = {
        "sharpe": few if r.size < 2 else flat,
        "annual_volatility": few,
        "sortino": few if r.size < 2 else "no losing bars (no downside deviation)",
        "calmar": "no drawdown",
        "profit_factor": "no losing bars" if r.size and (r > 0).any() else "no winning or losing bars",
        "trade_win_rate": "no trades",
        "bar_hit_rate": "no bar held a position",
    }
    empty = "no bars"
    return {
        k: (why.get(k, empty) if r.size else empty)
        for k, v in out.items()
        if isinstance(v, float) and not math.isfinite(v)
    }
