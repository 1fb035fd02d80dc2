"""The greedy policy over a split, per-bar net returns, benchmarks and the cost sweep.

Timing: the position chosen at the close of bar ``t`` is held over bar ``t + 1`` and earns
``R_{t+1} = close_{t+1} / close_t - 1``; moving there from the previous position pays the
cost of cudarl.costs. The first decision starts from flat; nothing is closed at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cudarl.costs import bar_net_return
from cudarl.data.bars import Bars, iso

from ._metrics import drawdown, metrics, resolve_periods_per_year, trades
from ._stats import LEVEL, RESAMPLES, return_statistics

ACTION_POSITIONS = (-1.0, 0.0, 1.0)
COST_MULTIPLIERS = (1, 2, 3)


def greedy_positions(
    policy, features, start: int, stop: int, *, action_positions=ACTION_POSITIONS, include_position: bool = True
) -> np.ndarray:
    """float64 [stop - start - 1]: the greedy policy's position at bars ``start .. stop - 2``.

    ``policy(obs)`` takes float32 ``[B, F]`` (``[B, F + 1]`` with the held position appended
    when ``include_position``) and returns Q-values ``[B, A]`` (the argmax is taken, ties to the
    lowest action) or action indices int ``[B]``. With the position in the observation the
    bars are walked one at a time; without it, in one call.
    """
    x = np.asarray(features[start : stop - 1], dtype=np.float32)
    table = np.asarray(action_positions, dtype=np.float64)

    def act(obs):
        out = np.asarray(policy(obs))
        if out.ndim == 2:
            return np.argmax(out, axis=1)
        if out.ndim == 1 and out.dtype.kind in "iu":
            return out
        raise ValueError(f"the policy returned {out.shape} {out.dtype}; expected Q-values [B, A] or int actions [B]")

    if not include_position:
        return table[act(x)]
    pos = np.empty(len(x))
    held = 0.0
    obs = np.empty((1, x.shape[1] + 1), dtype=np.float32)
    for k in range(len(x)):
        obs[0, :-1] = x[k]
        obs[0, -1] = held
        held = table[int(act(obs)[0])]
        pos[k] = held
    return pos


@dataclass
class Evaluation:
    """Per-bar results of positions over one split (``N = len(split) - 1`` bars).

    time int64 [N] (end of each bar), decision_time int64 [N] (its start, when the position
    was chosen), bar_return, position, gross, costs, net float64 [N];
    ``summary`` holds the metrics of the policy, buy-and-hold and flat, and the cost sweep.
    """

    time: np.ndarray
    decision_time: np.ndarray
    bar_return: np.ndarray
    position: np.ndarray
    gross: np.ndarray
    costs: np.ndarray
    net: np.ndarray
    buy_and_hold: np.ndarray
    summary: dict = field(default_factory=dict)
    trades: list = field(default_factory=list)

    @property
    def equity(self) -> np.ndarray:
        return np.cumprod(1.0 + self.net)

    @property
    def drawdown(self) -> np.ndarray:
        return drawdown(self.net)


def net_returns(position, bar_return, cost_rate: float):
    """``(gross, costs, net)`` float64 [N] for positions [N] over bars with returns [N], from flat."""
    p = np.asarray(position, dtype=np.float64)
    prev = np.concatenate([[0.0], p[:-1]])
    net = bar_net_return(prev, p, bar_return, cost_bps=cost_rate * 1e4)
    gross = p * bar_return
    return gross, gross - net, net


def evaluate_positions(
    bars: Bars,
    position,
    split,
    *,
    cost_bps: float,
    slippage_bps: float = 0.0,
    periods_per_year: float | None = None,
    fill: str | None = None,
    trials: int = 1,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
) -> Evaluation:
    """Evaluate positions float64 ``[N]`` decided at the closes of bars ``split.start ..``.

    ``fill`` None (idealised): the position decided at close[t] is held over bar t + 1 and earns
    ``close[t+1] / close[t] - 1``; ``N = len(split) - 1``. ``fill="open"`` or ``"close"``: the
    :class:`cudarl.TradingEnv` timing, filled at open[t+1] (close[t+1]) and earning
    ``px[t+2] / px[t+1] - 1`` with ``px`` the opens (closes); ``N = len(split) - 2``. Use the
    env's fill to evaluate what the agent was trained on.
    ``periods_per_year`` None: ``bars.infer_periods_per_year()`` (recorded in the summary).
    ``summary["statistics"]``: :func:`cudarl.evaluate.return_statistics` of the net returns against
    buy-and-hold over the same bars (``trials``: configurations tried, for the deflated Sharpe ratio;
    ``level``: of the intervals; ``resamples``: of the stationary bootstrap, seeded by the split).
    """
    start, stop = (split.start, split.stop) if hasattr(split, "start") else split
    position = np.asarray(position, dtype=np.float64)
    if fill not in (None, "open", "close"):
        raise ValueError(f"fill must be None, 'open' or 'close', got {fill!r}")
    n = stop - start - (1 if fill is None else 2)
    if position.shape != (n,):
        raise ValueError(f"expected {n} positions for bars [{start}, {stop}), got {position.shape}")
    if periods_per_year is None:
        ppy, how = bars.infer_periods_per_year()
    else:
        ppy, how = resolve_periods_per_year(periods_per_year)
    if fill is None:
        c = np.asarray(bars.close, dtype=np.float64)
        R = c[start + 1 : stop] / c[start : stop - 1] - 1.0
    else:
        px = np.asarray(bars.open if fill == "open" else bars.close, dtype=np.float64)
        R = px[start + 2 : stop] / px[start + 1 : stop - 1] - 1.0
    rate = (cost_bps + slippage_bps) * 1e-4
    gross, costs, net = net_returns(position, R, rate)
    _, bh_costs, bh = net_returns(np.ones(n), R, rate)
    _, _, flat = net_returns(np.zeros(n), R, rate)

    def m(r, p, cst):
        out = metrics(r, ppy, positions=p, costs=cst)
        out["periods_per_year_source"] = how
        return out

    sweep = {}
    for mult in COST_MULTIPLIERS:
        _, cst, r = net_returns(position, R, rate * mult)
        sweep[f"{mult}x"] = {"cost_bps": cost_bps * mult, "slippage_bps": slippage_bps * mult, **m(r, position, cst)}
    name = getattr(split, "name", "split")
    summary = {
        "split": {
            "name": name,
            "start": int(start),
            "stop": int(stop),
            "first": iso(bars.time[start]),
            "last": iso(bars.time[stop - 1]),
        },
        "source": bars.source,
        "periods_per_year": ppy,
        "periods_per_year_source": how,
        "cost_bps": cost_bps,
        "slippage_bps": slippage_bps,
        "fill": fill or "idealised (close of the decision bar)",
        "policy": m(net, position, costs),
        "buy_and_hold": m(bh, np.ones(n), bh_costs),
        "flat": m(flat, np.zeros(n), np.zeros(n)),
        "cost_sweep": sweep,
        "statistics": return_statistics(
            net, ppy, benchmark=bh, trials=trials, level=level, resamples=resamples, seed=int(start)
        ),
    }
    lag = 1 if fill is None else 2
    return Evaluation(
        time=np.asarray(bars.time[start + lag : stop]),
        decision_time=np.asarray(bars.time[start : start + n]),
        bar_return=R,
        position=position,
        gross=gross,
        costs=costs,
        net=net,
        buy_and_hold=bh,
        summary=summary,
        trades=trades(position, net, costs),
    )


def evaluate_policy(
    policy,
    bars: Bars,
    features,
    split,
    *,
    cost_bps: float,
    slippage_bps: float = 0.0,
    periods_per_year: float | None = None,
    action_positions=ACTION_POSITIONS,
    include_position: bool = True,
) -> Evaluation:
    """The greedy ``policy`` over ``split``: :func:`greedy_positions` then :func:`evaluate_positions`.

    ``features`` float32 [T, F], already normalised (the normaliser fitted on train).
    """
    start, stop = (split.start, split.stop) if hasattr(split, "start") else split
    pos = greedy_positions(
        policy, features, start, stop, action_positions=action_positions, include_position=include_position
    )
    return evaluate_positions(
        bars, pos, split, cost_bps=cost_bps, slippage_bps=slippage_bps, periods_per_year=periods_per_year
    )
