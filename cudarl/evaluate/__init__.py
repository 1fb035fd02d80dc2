"""Evaluation: the greedy policy over a split, per-bar net returns, metrics and reports.

    ev = cudarl.evaluate.evaluate_policy(policy, bars, normed_features, splits.val, cost_bps=2.0)
    cudarl.evaluate.write_outputs(ev, "runs/x/eval")   # summary.json, equity.csv, trades.csv, equity.png
    cudarl.evaluate.metrics(returns, periods_per_year=252)
    cudarl.evaluate.return_statistics(returns, 252, benchmark=buy_and_hold, trials=4)  # CI, PSR, DSR, paired

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
from ._stats import (
    expected_max_sharpe,
    optimal_block_length,
    paired_comparison,
    probabilistic_sharpe_ratio,
    return_statistics,
    seed_summary,
    sharpe_standard_error,
    stationary_bootstrap,
)

__all__ = [
    "metrics",
    "return_statistics",
    "seed_summary",
    "probabilistic_sharpe_ratio",
    "expected_max_sharpe",
    "sharpe_standard_error",
    "optimal_block_length",
    "stationary_bootstrap",
    "paired_comparison",
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
