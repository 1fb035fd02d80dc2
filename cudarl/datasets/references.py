"""Reference policies of the synthetic markets: the full-information optimum and the best causal policy.

Both trade as the agent does: positions from the environment's levels (default -1, 0, +1), chosen at
the close of bar ``t``, filled at the next open (``fill="open"``; a synthetic bar opens at the previous
close, so the position earns ``R_{t+1}``) or the next close (``fill="close"``: it earns ``R_{t+2}``),
paying ``cost_rate * |p_t - p_{t-1}|`` (cudarl.costs), starting flat at the split's first bar.
Each maximises the expected net return per bar (the agent's reward; docs/data.md gives the formulas).

- **full information** knows the model and its hidden state (the answer columns);
- **causal** knows the model but only the prices up to ``t``.

How each is computed:

- ``regime``: full information is a dynamic programme over the two-state chain ``s_t``; causal is a
  dynamic programme over the Hamilton filter's belief ``q_t = P(s_t = +1 | R_1..R_t)`` (a Markov
  process of its own), on a grid of beliefs whose transitions come from Gauss-Hermite quadrature.
- ``ou`` and ``ar`` with one lag: the state (deviation ``x_t - theta``, or the last return) is observed,
  so both references are the same dynamic programme over the discretised AR(1) state.
- ``ar`` with more lags and ``lag``: the state is the last ``p`` returns; both references are the best
  *no-trade-band rule* on the conditional mean ``m_t = E[R_{t+1} | past]`` (enter long when
  ``m_t > enter``, hold it while ``m_t > hold``, symmetric for short, flat between), with ``(enter, hold)``
  chosen on a long path simulated from the model (not the data), scored by the expected return ``m_t``
  each position earns (not the noisy realised one), or flat when no band earns its costs. For one lag the
  band rule and the dynamic programme agree (tests/unit/test_references.py).
- ``noise``, ``randomwalk``: ``E[R_{t+1} | past] = 0``, so every trade loses its cost: both are flat.

The dynamic programme (:func:`solve_positions`) is policy iteration on the discounted criterion with
``gamma = 0.9995`` (a horizon of 2,000 bars, far beyond every chain's mixing time), over states
(signal grid point, previous position).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from cudarl.data.bars import Bars

from . import markets

LEVELS = (-1.0, 0.0, 1.0)
GAMMA = 0.9995
GRID = 201
#: Gauss-Hermite nodes (probabilists') of the quadratures of the next return.
NODES = 48


# --- filters and signals ---------------------------------------------------------------------------
def hamilton_filter(R, mu: float, sigma: float, p: float) -> np.ndarray:
    """float64 [T]: ``q_t = P(s_t = +1 | R_1..R_t)`` for ``builtin:regime`` (Hamilton 1989).

    ``R`` float64 [T], ``R[t] = close[t] / close[t-1] - 1`` (``R[0]`` unused). ``s_0`` is +1 or -1 with
    probability 1/2. ``R_t`` depends on ``s_{t-1}``, so the update is: the posterior of ``s_{t-1}``,
    ``logit pi = logit q_{t-1} + 2 mu R_t / sigma^2`` (the log-likelihood ratio of N(+mu, sigma^2)
    against N(-mu, sigma^2)), then the flip: ``q_t = pi (1 - p) + (1 - pi) p``.
    """
    R = np.asarray(R, dtype=np.float64)
    q = np.empty(len(R))
    q[0] = 0.5
    k = 2.0 * mu / (sigma * sigma)
    for t in range(1, len(R)):
        lo = math.log(q[t - 1]) - math.log1p(-q[t - 1]) + k * R[t]
        pi = 1.0 / (1.0 + math.exp(-lo)) if lo > -700 else 0.0
        q[t] = pi * (1.0 - p) + (1.0 - pi) * p
    return q


def ar_forecast(R, phi, lead: int = 1) -> np.ndarray:
    """float64 [T]: ``E[R_{t+lead} | R_1..R_t]`` of ``R_{t+1} = sum_i phi_i R_{t+1-i} + noise``
    (returns before the first bar taken as 0)."""
    R = np.asarray(R, dtype=np.float64)
    phi = np.asarray(phi, dtype=np.float64)
    T = len(R)
    terms = np.flatnonzero(phi).tolist()  # a zero coefficient adds +0.0: skipping it keeps every bit

    @functools.cache
    def hist(j: int) -> np.ndarray:  # the (forecast of the) return j steps from t, [T]
        if j <= 0:  # known: R shifted by -j bars, zeros before the first (even when -j > T)
            return np.concatenate([np.zeros(min(-j, T)), R[: max(T + j, 0)]])
        return sum((phi[i] * hist(j - 1 - i) for i in terms), np.zeros(T))

    return hist(lead)


# --- Markov chains and the dynamic programme ---------------------------------------------------------
def _hermite():
    x, w = np.polynomial.hermite_e.hermegauss(NODES)
    return x, w / w.sum()


def chain_from_draws(grid, nxt, weight) -> np.ndarray:
    """float64 [G, G]: the transition matrix on sorted ``grid`` [G] when grid point ``i`` moves to
    ``nxt[i, k]`` with probability ``weight[i, k]`` ([G, K]); each draw is split between the two grid
    points around it in proportion to its distance (so the mean move is kept), ends clipped."""
    grid = np.asarray(grid, dtype=np.float64)
    G = grid.size
    x = np.clip(nxt, grid[0], grid[-1])
    j = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, G - 2)
    frac = (x - grid[j]) / (grid[j + 1] - grid[j])
    P = np.zeros((G, G))
    rows = np.repeat(np.arange(G)[:, None], x.shape[1], axis=1)
    np.add.at(P, (rows, j), weight * (1.0 - frac))
    np.add.at(P, (rows, j + 1), weight * frac)
    return P / P.sum(axis=1, keepdims=True)


def _rewards(g, levels, cost_rate) -> np.ndarray:
    """float64 [G, A_prev, A]: ``g_i level_a - cost_rate |level_a - level_prev|``."""
    lev = np.asarray(levels, dtype=np.float64)
    cost = cost_rate * np.abs(lev[None, :] - lev[:, None])
    return np.asarray(g, dtype=np.float64)[:, None, None] * lev[None, None, :] - cost[None, :, :]


def policy_value(P, g, levels, cost_rate, table, gamma: float = GAMMA) -> np.ndarray:
    """float64 [G, A]: discounted value of the deterministic policy ``table`` int [G, A] (action chosen at
    grid point ``i`` holding action ``a_prev``) from each state ``(i, a_prev)``."""
    G, A = table.shape
    r = _rewards(g, levels, cost_rate)
    i = np.repeat(np.arange(G), A)
    act = table.reshape(-1)
    M = np.zeros((G * A, G * A))
    M[np.arange(G * A)[:, None], np.arange(G)[None, :] * A + act[:, None]] = P[i]
    v = np.linalg.solve(np.eye(G * A) - gamma * M, r.reshape(G * A, A)[np.arange(G * A), act])
    return v.reshape(G, A)


def solve_positions(P, g, levels=LEVELS, cost_rate: float = 0.0, gamma: float = GAMMA, max_iter: int = 100):
    """The optimal stationary policy of the trading MDP on a Markov chain, by policy iteration.

    State ``(i, a_prev)``: the chain's state ``i`` (transition matrix ``P`` [G, G]) and the position held;
    action ``a``: the next position ``levels[a]``; reward ``g_i levels[a] - cost_rate |levels[a] -
    levels[a_prev]|`` with ``g`` [G] the expected return the position earns; discount ``gamma``.
    Returns ``(table int [G, A], value float64 [G, A])``; ties keep the held position.
    """
    P, g = np.asarray(P, dtype=np.float64), np.asarray(g, dtype=np.float64)
    r = _rewards(g, levels, cost_rate)
    table = np.argmax(r, axis=2)
    for _ in range(max_iter):
        v = policy_value(P, g, levels, cost_rate, table, gamma)
        q = r + gamma * (P @ v)[:, None, :]
        best = np.argmax(q, axis=2)
        cur = np.take_along_axis(q, table[..., None], axis=2)[..., 0]
        better = np.take_along_axis(q, best[..., None], axis=2)[..., 0] > cur + 1e-12 * (1.0 + np.abs(cur))
        if not better.any():
            return table, v
        table = np.where(better, best, table)
    raise RuntimeError("policy iteration did not converge")  # pragma: no cover (finite MDP)


# --- policies over a signal ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TablePolicy:
    """The dynamic programme's policy over a signal: nearest grid point, then the table."""

    grid: np.ndarray
    table: np.ndarray
    levels: tuple

    def positions(self, z, start: int, n: int) -> np.ndarray:
        """float64 [n]: positions at bars ``start .. start + n - 1`` from signal ``z`` [T], starting flat."""
        g = self.grid
        zz = np.asarray(z[start : start + n], dtype=np.float64)
        idx = np.clip(np.searchsorted((g[1:] + g[:-1]) / 2, zz), 0, g.size - 1)
        lev = np.asarray(self.levels, dtype=np.float64)
        a = int(np.argmin(np.abs(lev)))  # flat (or the smallest position)
        out = np.empty(n)
        for k in range(n):
            a = int(self.table[idx[k], a])
            out[k] = lev[a]
        return out


def band_paths(m, enter, hold) -> np.ndarray:
    """float64 [T, K]: positions in {-1, 0, +1} of K band rules ``(enter[k], hold[k])`` over signal
    ``m`` [T], from flat: long when ``m > enter``, or already long and ``m > hold``; short
    symmetrically (``m < -enter``, or short and ``m < -hold``); flat otherwise."""
    m = np.asarray(m, dtype=np.float64)
    enter = np.atleast_1d(np.asarray(enter, dtype=np.float64))
    hold = np.atleast_1d(np.asarray(hold, dtype=np.float64))
    pos = np.zeros(enter.shape)
    out = np.empty((m.size, enter.size))
    for t in range(m.size):
        long_ = (m[t] > enter) | ((pos > 0) & (m[t] > hold))
        short = (m[t] < -enter) | ((pos < 0) & (m[t] < -hold))
        pos = np.where(long_, 1.0, np.where(short, -1.0, 0.0))
        out[t] = pos
    return out


@dataclass(frozen=True)
class BandPolicy:
    """A no-trade band on a conditional mean: see :func:`band_paths`."""

    enter: float
    hold: float

    def positions(self, m, start: int, n: int) -> np.ndarray:
        """float64 [n]: positions at bars ``start .. start + n - 1`` from signal ``m`` [T], starting flat."""
        enter, hold, pos = self.enter, self.hold, 0.0
        out = np.empty(n)
        for k, x in enumerate(np.asarray(m, dtype=np.float64)[start : start + n].tolist()):  # floats: fast
            if x > enter or (pos > 0 and x > hold):
                pos = 1.0
            elif x < -enter or (pos < 0 and x < -hold):
                pos = -1.0
            else:
                pos = 0.0
            out[k] = pos
        return out


def band_search(m, r_next, cost_rate: float) -> BandPolicy:
    """The band rule with the highest mean net return on a path: signal ``m`` [T] known at ``t``,
    ``r_next`` [T] the return a position taken at ``t`` earns (or its expectation given ``t``: the same
    mean in expectation, without the noise of the realised returns). ``enter`` over quantiles of ``|m|``;
    ``hold`` from ``-enter`` to ``enter``; and staying flat (``enter = hold = inf``) when no band earns
    more than nothing."""
    m, r_next = np.asarray(m, dtype=np.float64), np.asarray(r_next, dtype=np.float64)
    levels = np.quantile(np.abs(m), np.linspace(0.0, 0.9, 13))
    fr = np.linspace(-1.0, 1.0, 9)
    enter = np.repeat(levels, fr.size)
    hold = enter * np.tile(fr, levels.size)
    pos = band_paths(m, enter, hold)
    prev = np.vstack([np.zeros((1, enter.size)), pos[:-1]])
    net = (pos * r_next[:, None] - cost_rate * np.abs(pos - prev)).mean(axis=0)
    k = int(np.argmax(net))
    if not net[k] > 0.0:  # flat earns 0: every band loses its costs
        return BandPolicy(math.inf, math.inf)
    return BandPolicy(float(enter[k]), float(hold[k]))


# --- the markets' references ------------------------------------------------------------------------
def _check_levels(levels, kind):
    if kind == "band" and tuple(float(v) for v in levels) != LEVELS:
        raise ValueError(f"the band references trade the levels {LEVELS}; got {tuple(levels)}")


def _lead(fill: str) -> int:
    if fill not in ("open", "close"):
        raise ValueError(f"fill must be 'open' or 'close', got {fill!r}")
    return 1 if fill == "open" else 2


def _ar1_chain(a: float, s: float, sd: float):
    """Grid [G] over +-6 stationary sd of ``z' = a z + s eps`` and its transition matrix."""
    grid = np.linspace(-6 * sd, 6 * sd, GRID)
    x, w = _hermite()
    nxt = a * grid[:, None] + s * x[None, :]
    return grid, chain_from_draws(grid, nxt, np.broadcast_to(w, nxt.shape))


def _dp(grid, P, g, levels, cost_rate, lead):
    g = np.linalg.matrix_power(P, lead - 1) @ g
    table, _ = solve_positions(P, g, levels, cost_rate)
    return TablePolicy(grid, table, tuple(levels))


@functools.lru_cache(maxsize=32)
def _regime_policies(mu, sigma, p, cost_rate, levels, lead):
    full = _dp(
        np.array([-1.0, 1.0]), np.array([[1 - p, p], [p, 1 - p]]), mu * np.array([-1.0, 1.0]), levels, cost_rate, lead
    )
    grid = np.linspace(0.0, 1.0, GRID)
    x, w = _hermite()
    k = 2.0 * mu / (sigma * sigma)
    q = np.clip(grid, 1e-12, 1 - 1e-12)
    nxt, wt = [], []
    for s in (1.0, -1.0):  # the next return's two components
        R = s * mu + sigma * x[None, :]
        lo = np.log(q)[:, None] - np.log1p(-q)[:, None] + k * R
        pi = 1.0 / (1.0 + np.exp(-np.clip(lo, -700, 700)))
        nxt.append(pi * (1 - p) + (1 - pi) * p)
        wt.append((q if s > 0 else 1 - q)[:, None] * w[None, :])
    P = chain_from_draws(grid, np.hstack(nxt), np.hstack(wt))
    causal = _dp(grid, P, mu * (2 * grid - 1), levels, cost_rate, lead)
    return full, causal


@functools.lru_cache(maxsize=32)
def _ou_policy(kappa, sigma, cost_rate, levels, lead):
    grid, P = _ar1_chain(1.0 - kappa, sigma, sigma / math.sqrt(kappa * (2.0 - kappa)))
    return _dp(grid, P, np.exp(-kappa * grid + 0.5 * sigma * sigma) - 1.0, levels, cost_rate, lead)


@functools.lru_cache(maxsize=32)
def _ar_policy(name, phi, sigma, cost_rate, levels, lead):
    if len(phi) == 1:  # the state is the last return: the dynamic programme
        a = phi[0]
        grid, P = _ar1_chain(a, sigma, sigma / math.sqrt(1.0 - a * a))
        return _dp(grid, P, a * grid, levels, cost_rate, lead)
    _check_levels(levels, "band")
    R, _, _ = markets._ar_path(50_000, 2**31 - 1, 0x5117, phi, sigma)  # a path of the model, not of the data
    m = ar_forecast(R, phi, lead)  # E[R_(t+lead) | R_(<=t)]: scored on it, not on the noisy realised R_(t+lead)
    return band_search(m[:-lead], m[:-lead], cost_rate)


def reference_positions(bars: Bars, start: int, n: int, *, cost_rate: float, levels=LEVELS, fill: str = "open") -> dict:
    """The references' positions at the decision bars ``start .. start + n - 1`` of a synthetic market.

    ``cost_rate = (cost_bps + slippage_bps) * 1e-4``; ``levels`` the env's positions; ``fill`` the env's.
    Returns ``{"full_information": float64 [n], "causal": float64 [n], "method": {...}}``; raises
    ``ValueError`` for bars without a model (real series, the canary).
    """
    from . import parse

    if not (bars.source or "").startswith("builtin:"):
        raise ValueError(f"references exist for the synthetic built-in markets only, not {bars.source!r}")
    name, prm = parse(bars.source)
    if not markets.MARKETS[name].has_references:
        raise ValueError(f"builtin:{name} has no reference policies")
    levels, lead, c = tuple(float(v) for v in levels), _lead(fill), float(cost_rate)
    R = bars.simple_returns()
    if name == "regime":
        full, causal = _regime_policies(prm["mu"], prm["sigma"], prm["p"], c, levels, lead)
        q = hamilton_filter(R, prm["mu"], prm["sigma"], prm["p"])
        return {
            "full_information": full.positions(bars.extra["regime"], start, n),
            "causal": causal.positions(q, start, n),
            "method": {"full_information": "dp: hidden state", "causal": "dp: Hamilton filter belief"},
        }
    if name == "ou":
        pol = _ou_policy(prm["kappa"], prm["sigma"], c, levels, lead)
        d = np.log(bars.close) - math.log(prm["level"])
        return {
            "full_information": pol.positions(bars.extra["deviation"], start, n),
            "causal": pol.positions(d, start, n),
            "method": {"full_information": "dp: deviation", "causal": "dp: deviation from the prices"},
        }
    if name in ("ar", "lag"):
        phi = tuple(prm["phi"]) if name == "ar" else markets.lag_coefficients(prm["lag"], prm["phi"])
        pol = _ar_policy(name, phi, prm["sigma"], c, levels, lead)
        if isinstance(pol, TablePolicy):
            full_z = bars.extra["drift"] / phi[0] if phi[0] else R
            z, how = R, "dp: last return"
        else:
            z = ar_forecast(R, phi, lead)
            full_z = z if lead > 1 else bars.extra["drift"]  # beyond one bar the model's forecast is all there is
            band = f"band rule enter={pol.enter:.3g}, hold={pol.hold:.3g}"
            band = band if pol.enter < math.inf else "flat (no band earns its costs)"
            how = f"{band} on E[R_(t+{lead})]"
        return {
            "full_information": pol.positions(full_z, start, n),
            "causal": pol.positions(z, start, n),
            "method": {"full_information": how, "causal": how + " from the prices"},
        }
    flat = np.zeros(n)  # noise, randomwalk: no edge before costs
    return {"full_information": flat, "causal": flat.copy(), "method": {"full_information": "flat", "causal": "flat"}}
