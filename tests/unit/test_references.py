"""The synthetic markets' reference policies: the filter against brute force, the dynamic programme
against exhaustive search, the band rule against the dynamic programme, and what they earn."""

import itertools
import math

import numpy as np
import pytest

import cudarl.datasets as ds
from cudarl.datasets import references as ref
from cudarl.evaluate import evaluate_positions
from cudarl.splits import chronological


def brute_force_posterior(R, mu, sigma, p):
    """P(s_t = +1 | R_1..R_t) by summing over every path s_0..s_t (2^(t+1) of them)."""
    T = len(R) - 1
    num = den = 0.0
    for path in itertools.product((-1.0, 1.0), repeat=T + 1):
        w = 0.5
        for k in range(1, T + 1):
            w *= (1 - p) if path[k] == path[k - 1] else p
            w *= math.exp(-0.5 * ((R[k] - mu * path[k - 1]) / sigma) ** 2)
        den += w
        num += w if path[T] > 0 else 0.0
    return num / den


def test_hamilton_filter_matches_the_brute_force_posterior(rng):
    mu, sigma, p = 0.004, 0.01, 0.1
    R = np.concatenate([[0.0], mu * np.array([1, 1, 1, -1, -1, 1, -1, -1, -1, 1]) + sigma * rng.normal(size=10)])
    q = ref.hamilton_filter(R, mu, sigma, p)
    for t in range(len(R)):
        assert q[t] == pytest.approx(brute_force_posterior(R[: t + 1], mu, sigma, p), rel=1e-10, abs=1e-12), t


def exhaustive_best(P, g, levels, c, gamma):
    """Every deterministic stationary policy's value; the best one's value per state."""
    G, A = len(g), len(levels)
    best = np.full((G, A), -np.inf)
    for flat in itertools.product(range(A), repeat=G * A):
        v = ref.policy_value(P, g, levels, c, np.array(flat).reshape(G, A), gamma)
        best = np.maximum(best, v)
    return best


@pytest.mark.parametrize("case", range(4))
def test_dynamic_programme_matches_exhaustive_search_on_tiny_chains(case):
    rng = np.random.default_rng(case)
    G = 2 if case < 2 else 3
    P = rng.random((G, G)) + 0.2 * np.eye(G) * case
    P /= P.sum(axis=1, keepdims=True)
    g = rng.normal(0, 1e-3, G)
    g[0], g[1] = -abs(g[0]), abs(g[1])  # a state to be short in and one to be long in
    levels = (-1.0, 0.0, 1.0) if case != 1 else (-1.0, -0.25, 1.0)
    c, gamma = [2e-4, 1e-3, 5e-4, 3e-3][case], 0.95
    table, v = ref.solve_positions(P, g, levels, c, gamma)
    best = exhaustive_best(P, g, levels, c, gamma)
    np.testing.assert_allclose(v, best, rtol=1e-9, atol=1e-12)
    # and the table is not trivial in every case: costs make the held position matter somewhere
    assert len(set(table.reshape(-1).tolist())) >= 2


def test_chain_from_draws_keeps_the_mean_move():
    grid, P = ref._ar1_chain(0.9, 1.0, 1.0 / math.sqrt(1 - 0.81))
    inner = np.abs(grid) < 3 / math.sqrt(1 - 0.81)
    np.testing.assert_allclose((P @ grid)[inner], 0.9 * grid[inner], atol=1e-9)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)


def test_band_rule_of_ar1_matches_the_dynamic_programme():
    """For one lag the conditional mean is a Markov state, so the best band rule found by search
    should earn what the exact dynamic programme earns, on a path neither was fitted on."""
    phi, sigma, c = 0.1, 0.01, 2e-4
    dp = ref._ar_policy("ar", (phi,), sigma, c, ref.LEVELS, 1)
    assert isinstance(dp, ref.TablePolicy)
    fit, _, _ = ds.markets._ar_path(30_000, 7, 0x7E57, (phi,), sigma)
    band = ref.band_search(phi * fit[:-1], fit[1:], c)
    R, _, _ = ds.markets._ar_path(100_000, 8, 0x7E57, (phi,), sigma)

    def mean_net(pos):
        prev = np.concatenate([[0.0], pos[:-1]])
        return float(np.mean(pos * R[1:] - c * np.abs(pos - prev)))

    a, b = mean_net(dp.positions(R, 0, len(R) - 1)), mean_net(band.positions(phi * R, 0, len(R) - 1))
    assert a > 0 and abs(a - b) < 0.02 * a, (a, b)
    # the band is a real one: entry above exit, a no-trade zone at these costs
    assert band.enter > 0 and band.hold < band.enter
    # the scalar walk is the vector one
    np.testing.assert_array_equal(
        band.positions(phi * R, 5, 3000), ref.band_paths(phi * R[5:3005], band.enter, band.hold)[:, 0]
    )


def test_regime_full_information_policy_follows_the_state_unless_costs_forbid():
    full, _ = ref._regime_policies(0.002, 0.01, 0.02, 1e-4, ref.LEVELS, 1)
    assert full.table[0].tolist() == [0, 0, 0] and full.table[1].tolist() == [2, 2, 2]  # short in -1, long in +1
    full, _ = ref._regime_policies(0.002, 0.01, 0.02, 0.2, ref.LEVELS, 1)  # mu < c p: flipping never pays
    assert (full.table[:, 1] == 1).all()  # from flat it stays flat


def test_belief_programme_beats_the_sign_of_the_filter_with_costs():
    mu, sigma, p, c = 0.002, 0.01, 0.02, 1e-3  # 10 bps: the naive filter churns
    bars = ds.regime(n=60_000, seed=21, mu=mu, sigma=sigma, p=p, bar_minutes=1)
    R = bars.simple_returns()
    q = ref.hamilton_filter(R, mu, sigma, p)
    _, causal = ref._regime_policies(mu, sigma, p, c, ref.LEVELS, 1)
    n = len(R) - 1

    def mean_net(pos):
        prev = np.concatenate([[0.0], pos[:-1]])
        return float(np.mean(pos * R[1:] - c * np.abs(pos - prev)))

    dp, naive = mean_net(causal.positions(q, 0, n)), mean_net(np.sign(q[:n] - 0.5))
    assert dp > naive + 1e-5, (dp, naive)


@pytest.mark.parametrize(
    "spec",
    [
        "builtin:regime?n=20000&mu=0.003&p=0.01",
        "builtin:ar?n=20000",
        "builtin:ar?n=20000&phi=0.08,0.05",
        "builtin:lag?n=20000",
        "builtin:ou?n=20000",
        "builtin:noise?n=20000",
    ],
)
def test_references_earn_what_their_model_promises(spec):
    bars = ds.resolve(spec)
    sp = chronological(len(bars), 0.7, 0.15, warmup=64).test
    refs = ref.reference_positions(bars, sp.start, len(sp) - 2, cost_rate=1e-4, fill="open")
    sharpe = {}
    for k in ("full_information", "causal"):
        pol = evaluate_positions(bars, refs[k], sp, cost_bps=1.0, fill="open").summary["policy"]
        sharpe[k] = pol["sharpe"]
    if "noise" in spec:
        assert not refs["causal"].any() and not refs["full_information"].any()
        return
    assert sharpe["causal"] > 0.5 and sharpe["full_information"] >= sharpe["causal"] - 1e-9
    if "regime" in spec:
        assert sharpe["full_information"] > sharpe["causal"] + 0.3  # the hidden state is worth something
    else:
        np.testing.assert_array_equal(refs["full_information"], refs["causal"])  # the state is observed


def test_close_fills_use_the_two_step_forecast():
    bars = ds.resolve("builtin:ou?n=20000")
    sp = chronological(len(bars), 0.7, 0.15, warmup=64).test
    for fill in ("open", "close"):
        pos = ref.reference_positions(bars, sp.start, len(sp) - 2, cost_rate=1e-4, fill=fill)["causal"]
        assert evaluate_positions(bars, pos, sp, cost_bps=1.0, fill=fill).summary["policy"]["sharpe"] > 3


def test_references_refuse_bars_without_a_model():
    from cudarl.data import load

    with pytest.raises(ValueError, match="synthetic built-in markets only"):
        ref.reference_positions(load("builtin:sp500"), 100, 10, cost_rate=0.0)
    with pytest.raises(ValueError, match="no reference policies"):
        ref.reference_positions(ds.canary(n=300), 100, 10, cost_rate=0.0)
    with pytest.raises(ValueError, match="band references trade the levels"):
        ref.reference_positions(ds.lag(n=300), 100, 10, cost_rate=0.0, levels=(-1.0, -0.5, 0.5, 1.0))


def test_lag_reference_reads_bar_t_minus_4_and_the_env_pays_what_it_is_scored_on():
    """``builtin:lag``'s causal reference trades a band rule on ``phi R_(t-4)``, the answer column
    ``drift`` (``E[R_(t+1) | past]``), computed from the prices alone; and its positions, played as
    actions through a :class:`cudarl.TradingEnv` with the agent's defaults (costs, fills at the next
    open, levels -1, 0, +1, starting flat), earn bar by bar the net returns it is scored on."""
    from cudarl.env import EnvConfig, TradingEnv
    from cudarl.features import compute, return_sign

    bars = ds.resolve("builtin:lag?n=4000")
    R = bars.simple_returns()
    m = ref.ar_forecast(R, ds.markets.lag_coefficients(5, 0.15))
    np.testing.assert_allclose(m[5:], 0.15 * R[1:-4], rtol=0, atol=1e-15)
    np.testing.assert_allclose(m[5:], bars.extra["drift"][5:], rtol=0, atol=1e-12)
    env_cfg = EnvConfig()
    sp = chronological(len(bars), 0.7, 0.15, warmup=64).test
    n = len(sp) - 2
    rate = (env_cfg.cost_bps + env_cfg.slippage_bps) * 1e-4
    pos = ref.reference_positions(bars, sp.start, n, cost_rate=rate, fill=env_cfg.fill)["causal"]
    assert 0.2 < np.mean(pos != 0) and np.mean(np.diff(pos) != 0) > 0.05  # it trades
    ev = evaluate_positions(bars, pos, sp, cost_bps=env_cfg.cost_bps, fill=env_cfg.fill)
    feats = compute(bars)
    one = EnvConfig(n_envs=1, episode_len=n, stagger=False)
    env = TradingEnv(
        bars.open, bars.close, feats.values, return_sign(feats.names), one, t_begin=sp.start, t_end=sp.stop,
        backend="numpy",
    )  # fmt: skip
    levels = list(env_cfg.position_levels())
    paid = []
    for p in pos:
        env.step(np.array([levels.index(p)], np.int32))
        paid.append(float(env.reward[0]))
    # float32 prices round each return by ~1e-7; one bar of timing off would miss by ~1e-2
    np.testing.assert_allclose(paid, ev.net, rtol=0, atol=5e-7)
