"""Metrics agree with empyrical on the real series; hand cases; the greedy rollout; the outputs."""

import csv
import json
import math

import numpy as np
import pytest

import cudarl.datasets as ds
from cudarl.costs import bar_net_return
from cudarl.data import load
from cudarl.evaluate import evaluate_policy, evaluate_positions, greedy_positions, metrics, trades, write_outputs
from cudarl.splits import Split

EMPYRICAL = {  # our key -> empyrical function name
    "total_return": "cum_returns_final",
    "annual_return": "annual_return",
    "annual_volatility": "annual_volatility",
    "sharpe": "sharpe_ratio",
    "sortino": "sortino_ratio",
    "max_drawdown": "max_drawdown",
    "calmar": "calmar_ratio",
}


def momentum_positions(close):
    """A simple causal long/short/flat rule, to give returns with costs and flat bars."""
    r = np.zeros(len(close))
    r[1:] = np.diff(np.log(close))
    fast = np.convolve(r, np.ones(5) / 5)[: len(r)]
    return np.where(fast > 1e-3, 1.0, np.where(fast < -1e-3, -1.0, 0.0))


@pytest.mark.parametrize("name", ["sp500", "nasdaq", "eurusd-1h"])
def test_metrics_agree_with_empyrical_on_the_real_series(name):
    ep = pytest.importorskip("empyrical", reason="empyrical-reloaded is a test dependency: pip install -e '.[test]'")
    bars = load(f"builtin:{name}")
    ppy, _ = bars.infer_periods_per_year()
    R = bars.close[1:] / bars.close[:-1] - 1
    pos = momentum_positions(bars.close)[:-1]
    policy = bar_net_return(np.concatenate([[0.0], pos[:-1]]), pos, R, cost_bps=1.0)
    for returns in (R, policy):
        ours = metrics(returns, ppy)
        for key, fn in EMPYRICAL.items():
            kw = {} if key in ("total_return", "max_drawdown") else {"annualization": ppy}
            theirs = float(getattr(ep, fn)(returns, **kw))
            assert abs(ours[key] - theirs) <= 1e-9 * max(1.0, abs(theirs)), (name, key, ours[key], theirs)


def test_hand_case_trades_costs_turnover():
    # bars:      0     1     2     3     4     5
    pos = np.array([1.0, 1.0, 0.0, -1.0, 1.0, 1.0])
    R = np.array([0.01, -0.02, 0.03, -0.01, 0.02, 0.01])
    c = 0.001
    prev = np.concatenate([[0.0], pos[:-1]])
    costs = c * np.abs(pos - prev)  # 1, 0, 1, 1, 2, 0 units
    net = pos * R - costs
    m = metrics(net, 252, positions=pos, costs=costs)
    assert m["costs_paid"] == pytest.approx(5 * c)
    assert m["turnover"] == pytest.approx(5 / 6 * 252)
    assert m["exposure"] == pytest.approx(5 / 6)
    assert m["trades"] == 3
    tr = trades(pos, net, costs)
    # long [0, 2): 0.01 - c - 0.02, closed on bar 2 paying c
    assert tr[0] == {
        "start": 0,
        "stop": 2,
        "side": 1,
        "bars": 2,
        "return": pytest.approx(0.01 - 0.02 - 2 * c),
        "open": False,
    }
    # short [3, 4): entry c on bar 3, the flip on bar 4 costs 2c of which half closes the short
    assert tr[1]["return"] == pytest.approx(0.01 - c - c)
    # long [4, 6): entry share c (the other c went to the short), still open
    assert tr[2]["return"] == pytest.approx(0.02 + 0.01 - c) and tr[2]["open"]
    assert sum(t["return"] for t in tr) == pytest.approx(net.sum())
    assert m["trade_win_rate"] == pytest.approx(2 / 3)
    held = pos != 0
    assert m["bar_hit_rate"] == pytest.approx(np.mean(net[held] > 0))
    assert m["profit_factor"] == pytest.approx(net[net > 0].sum() / -net[net < 0].sum())


def test_empyrical_edge_conventions():
    assert metrics([0.01], 252)["sharpe"] != metrics([0.01], 252)["sharpe"]  # NaN with one bar
    flat = metrics(np.zeros(10), 252)
    assert math.isnan(flat["sharpe"]) and math.isnan(flat["calmar"]) and flat["max_drawdown"] == 0.0
    # the start counts as a peak: a loss on the first bar is a drawdown
    assert metrics([-0.1, 0.05], 252)["max_drawdown"] == pytest.approx(-0.1)
    assert metrics([0.1, -0.05, 0.2], 12)["annual_return"] == pytest.approx((1.1 * 0.95 * 1.2) ** 4 - 1)


def test_periods_per_year_is_inferred_and_recorded_or_demanded():
    bars = load("builtin:sp500")
    R = bars.close[1:] / bars.close[:-1] - 1
    m = metrics(R, times=bars.time[1:])
    assert m["periods_per_year"] == 252.0 and "inferred" in m["periods_per_year_source"]
    assert metrics(R, 260)["periods_per_year_source"] == "given"
    with pytest.raises(ValueError, match="periods_per_year"):
        metrics(R)


def test_evaluate_positions_benchmarks_and_cost_sweep():
    bars = load("builtin:regime?n=600&seed=4")
    split = Split("val", 100, 400)
    pos = ds.regime_optimal_positions(bars)[100:399]
    ev = evaluate_positions(bars, pos, split, cost_bps=3.0, slippage_bps=1.0)
    R = bars.close[101:400] / bars.close[100:399] - 1
    expected = bar_net_return(np.concatenate([[0.0], pos[:-1]]), pos, R, 3.0, 1.0)
    np.testing.assert_array_equal(ev.net, expected)
    s = ev.summary
    assert s["periods_per_year"] == 252.0 and s["split"]["start"] == 100
    assert s["flat"]["total_return"] == 0.0 and s["flat"]["trades"] == 0
    assert s["buy_and_hold"]["costs_paid"] == pytest.approx(4e-4) and s["buy_and_hold"]["trades"] == 1
    # the entry cost is subtracted from the first bar's return (cudarl.costs), not compounded apart
    assert s["buy_and_hold"]["total_return"] == pytest.approx((1 + R[0] - 4e-4) * np.prod(1 + R[1:]) - 1, rel=1e-9)
    sweep = s["cost_sweep"]
    assert sweep["1x"]["total_return"] == s["policy"]["total_return"]
    assert sweep["1x"]["total_return"] > sweep["2x"]["total_return"] > sweep["3x"]["total_return"]
    assert sweep["3x"]["costs_paid"] == pytest.approx(3 * sweep["1x"]["costs_paid"])
    assert sweep["2x"]["cost_bps"] == 6.0
    with pytest.raises(ValueError, match="expected 299 positions"):
        evaluate_positions(bars, pos[:-1], split, cost_bps=1.0)


def test_greedy_policy_on_regime_finds_the_signal():
    bars = load("builtin:regime?n=3000&seed=9")
    feats = np.stack([bars.extra["regime"], np.zeros(len(bars))], axis=1).astype(np.float32)
    seen = []

    def policy(obs):  # Q = (-s, 0, s): short, flat, long
        seen.append(float(obs[0, -1]))
        s = obs[:, 0:1]
        return np.concatenate([-s, np.zeros_like(s), s], axis=1)

    split = Split("test", 1000, 3000)
    ev = evaluate_policy(policy, bars, feats, split, cost_bps=2.0)
    np.testing.assert_array_equal(ev.position, bars.extra["regime"][1000:2999])
    assert seen[0] == 0.0 and seen[1:] == ev.position[:-1].tolist()  # the held position is in the observation
    fast = greedy_positions(lambda x: np.where(x[:, 0] > 0, 2, 0), feats, 1000, 3000, include_position=False)
    np.testing.assert_array_equal(fast, ev.position)
    assert ev.summary["policy"]["sharpe"] > ev.summary["buy_and_hold"]["sharpe"]
    with pytest.raises(ValueError, match="expected Q-values"):
        greedy_positions(lambda x: x[:, 0], feats, 0, 10, include_position=False)


def test_outputs_are_written(tmp_path):
    bars = load("builtin:regime?n=400&seed=1")
    pos = np.sign(ds.regime_optimal_positions(bars))[0:399]
    pos[:50] = 0.0
    ev = evaluate_positions(bars, pos, Split("test", 0, 400), cost_bps=2.0)
    paths = write_outputs(ev, tmp_path / "eval", plot=False)
    assert [p.name for p in paths] == ["summary.json", "equity.csv", "trades.csv"]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["policy"]["total_return"] == pytest.approx(ev.summary["policy"]["total_return"])
    assert summary["flat"]["sharpe"] is None  # NaN is written as null
    with open(tmp_path / "eval" / "equity.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 399 and float(rows[-1]["equity"]) == pytest.approx(1 + ev.summary["policy"]["total_return"])
    assert rows[0]["position"] == "0" and float(rows[0]["drawdown"]) <= 0
    with open(tmp_path / "eval" / "trades.csv") as fh:
        tr = list(csv.DictReader(fh))
    assert len(tr) == ev.summary["policy"]["trades"] and tr[0]["entry_time"].startswith("2000-03-")  # bar 50


def test_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    bars = load("builtin:regime?n=300")
    ev = evaluate_positions(bars, ds.regime_optimal_positions(bars)[:-1], Split("val", 0, 300), cost_bps=1.0)
    paths = write_outputs(ev, tmp_path)
    png = tmp_path / "equity.png"
    assert png in paths and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_env_fill_timing_matches_the_env_reward():
    """With fill="open" the evaluation earns exactly what TradingEnv's reward pays."""
    from cudarl import datasets
    from cudarl.evaluate import evaluate_positions
    from cudarl.reference.env import bar_returns
    from cudarl.splits import Split

    bars = datasets.regime(n=300, seed=3)
    rng = np.random.default_rng(0)
    split = Split("val", 100, 200)
    pos = rng.choice([-1.0, 0.0, 1.0], size=98)
    ev = evaluate_positions(bars, pos, split, cost_bps=2.0, periods_per_year=252, fill="open")
    ret = bar_returns(np.asarray(bars.open, np.float32), np.asarray(bars.close, np.float32), "open").astype(np.float64)
    prev = np.concatenate([[0.0], pos[:-1]])
    want = pos * ret[100:198] - 2e-4 * np.abs(pos - prev)
    # float32 prices round returns by ~1e-7; a timing off by one bar would miss by ~1e-2
    np.testing.assert_allclose(ev.net, want, rtol=0, atol=5e-7)
    with pytest.raises(ValueError, match="expected 98 positions"):
        evaluate_positions(bars, pos[:-1], split, cost_bps=2.0, periods_per_year=252, fill="open")


def _trades_bar_by_bar(p, net, costs):
    """The trade list as a bar-by-bar scan (the oracle of the run-finding one)."""
    side, out, k, n = np.sign(p), [], 0, len(p)

    def share(j, old, new):
        total = abs(old) + abs(new)
        return float(costs[j] * abs(old) / total) if total > 0 else 0.0

    while k < n:
        if side[k] == 0:
            k += 1
            continue
        j = k
        while j < n and side[j] == side[k]:
            j += 1
        ret = float(net[k:j].sum()) + (share(k, p[k - 1], p[k]) if k > 0 and side[k - 1] != 0 else 0.0)
        ret -= share(j, p[j - 1], p[j]) if j < n else 0.0
        out.append({"start": k, "stop": j, "side": int(side[k]), "bars": j - k, "return": ret, "open": j == n})
        k = j
    return out


def test_trades_are_the_bar_by_bar_scans_exactly(rng):
    for trial in range(300):
        n = int(rng.integers(0, 200))
        levels = [-1.0, -0.5, 0.0, 0.5, 1.0]
        p = rng.choice(levels, size=n) if trial % 2 else np.repeat(rng.choice(levels, size=n // 4 + 1), 4)[:n]
        net, costs = rng.normal(size=len(p)) * 0.01, np.abs(rng.normal(size=len(p))) * 1e-4
        assert trades(p, net, costs) == _trades_bar_by_bar(p, net, costs)
