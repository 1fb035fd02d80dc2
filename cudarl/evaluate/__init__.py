"""Evaluation: the greedy policy over a split, per-bar net returns, metrics and reports.

    ev = cudarl.evaluate.evaluate_policy(policy, bars, normed_features, splits.val, cost_bps=2.0)
    cudarl.evaluate.write_outputs(ev, "runs/x/eval")   # summary.json, equity.csv, trades.csv, equity.png
    cudarl.evaluate.metrics(returns, periods_per_year=252)

Metrics follow empyrical's conventions (docs/metrics.md); costs come from cudarl.costs.
"""

from ._metrics import drawdown, metrics, resolve_periods_per_year, trades
from ._report import json_safe, plot_equity, write_outputs
from ._run import (
    ACTION_POSITIONS,
    COST_MULTIPLIERS,
    Evaluation,
    evaluate_policy,
    evaluate_positions,
    greedy_positions,
    net_returns,
)

__all__ = [
    "metrics",
    "drawdown",
    "trades",
    "resolve_periods_per_year",
    "Evaluation",
    "evaluate_policy",
    "evaluate_positions",
    "greedy_positions",
    "net_returns",
    "write_outputs",
    "plot_equity",
    "json_safe",
    "ACTION_POSITIONS",
    "COST_MULTIPLIERS",
]
