"""The trading cost model, shared by the environment's reward and the evaluation.

One bar's net return of holding ``position`` over a bar with simple return ``ret``, having
moved there from ``prev_position``::

    net = position * ret - (cost_bps + slippage_bps) * 1e-4 * |position - prev_position|

Positions are fractions of equity (-1 short, 0 flat, +1 long at one unit of leverage).
"""

from __future__ import annotations

import numpy as np


def bar_net_return(prev_position, position, ret, cost_bps: float, slippage_bps: float = 0.0):
    """Net return per bar (float64 or the inputs' float dtype), elementwise over arrays."""
    position = np.asarray(position)
    rate = (float(cost_bps) + float(slippage_bps)) * 1e-4
    return position * ret - rate * np.abs(position - prev_position)
