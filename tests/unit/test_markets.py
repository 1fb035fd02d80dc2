"""The synthetic markets: their models hold, their specifications round-trip, and no answer column
reaches the agent's observation unless the user names it in ``features.extra``."""

import dataclasses
import math

import numpy as np
import pytest

import cudarl.datasets as ds
from cudarl.config import from_dict, resolve_for_backend
from cudarl.data import DataError, load
from cudarl.features import FeatureConfig, compute

SYNTHETIC = sorted(ds.MARKETS)


def ols_slope(x, y):
    x, y = x - x.mean(), y - y.mean()
    return float(x @ y / (x @ x)), float(np.sqrt(((y - x * (x @ y / (x @ x))) ** 2).mean() / (x @ x)))


@pytest.mark.parametrize("name", SYNTHETIC)
def test_source_is_the_full_specification_and_makes_the_same_bars(name):
    bars = ds.resolve(f"builtin:{name}?n=400&seed=3")
    assert bars.source.startswith(f"builtin:{name}?") and "seed=3" in bars.source
    again = load(bars.source)
    assert again.source == bars.source
    for k in ("open", "high", "low", "close", "volume", "time"):
        np.testing.assert_array_equal(getattr(again, k), getattr(bars, k))
    assert sorted(bars.extra) == sorted(ds.MARKETS[name].answers)
    assert ds.answer_columns(bars) == ds.MARKETS[name].answers


@pytest.mark.parametrize("name", ["ar", "lag", "ou", "regime"])
def test_drift_columns_are_the_conditional_mean_of_the_next_return(name):
    bars = ds.resolve(f"builtin:{name}?n=60000&seed=5&bar_minutes=1")
    R = bars.simple_returns()
    drift = bars.extra["drift"] if "drift" in bars.extra else 0.002 * bars.extra["regime"]
    slope, se = ols_slope(drift[1:-1], R[2:])  # E[R_{t+1} | drift_t] = drift_t: slope 1
    assert abs(slope - 1.0) < 4 * se, (slope, se)


def test_ar_lag_and_ou_have_their_dynamics():
    R = ds.ar(n=60000, seed=1, phi=(0.2, -0.1), bar_minutes=1).simple_returns()[1:]
    X = np.stack([R[1:-1], R[:-2]], axis=1)
    coef, *_ = np.linalg.lstsq(X, R[2:], rcond=None)
    np.testing.assert_allclose(coef, [0.2, -0.1], atol=0.02)
    R = ds.lag(n=60000, seed=2, lag=5, phi=0.15, bar_minutes=1).simple_returns()[1:]
    ac = [np.corrcoef(R[k:], R[:-k])[0, 1] for k in range(1, 7)]
    assert abs(ac[4] - 0.15) < 0.02 and max(abs(a) for i, a in enumerate(ac) if i != 4) < 0.02, ac
    bars = ds.ou(n=60000, seed=3, kappa=0.05, sigma=0.002)
    d = bars.extra["deviation"]
    slope, se = ols_slope(d[:-1], np.diff(np.log(bars.close)))
    assert abs(slope + 0.05) < 4 * se
    np.testing.assert_allclose(np.log(bars.close) - math.log(100.0), d, atol=1e-12)
    assert bars.periods_per_year == 8760.0 and np.all(np.diff(bars.time) == 3600 * 10**9)


def test_noise_is_a_martingale_with_volatility_clustering_and_fat_tails():
    R = ds.noise(n=60000, seed=4, bar_minutes=1).simple_returns()[1:]
    n = R.size
    for k in (1, 2, 5):
        assert abs(np.corrcoef(R[k:], R[:-k])[0, 1]) < 4 / math.sqrt(n)
    a = np.abs(R)
    assert np.corrcoef(a[1:], a[:-1])[0, 1] > 0.05  # GARCH: |R| clusters (0.08; 0.001 with alpha = beta = 0)
    kurt = ((R - R.mean()) ** 4).mean() / R.var() ** 2
    assert kurt > 4.0
    assert abs(R.std() - 0.01) < 0.001
    iid = ds.noise(n=60000, seed=4, alpha=0.0, beta=0.0, df=0.0, bar_minutes=1).simple_returns()[1:]
    assert abs(((iid - iid.mean()) ** 4).mean() / iid.var() ** 2 - 3.0) < 0.15


def test_parameters_are_checked_and_lists_parse():
    assert ds.parse("builtin:ar?phi=0.1,-0.05")[1]["phi"] == (0.1, -0.05)
    with pytest.raises(DataError, match="not stationary"):
        load("builtin:ar?phi=1.2")
    with pytest.raises(DataError, match="alpha \\+ beta must be < 1"):
        load("builtin:noise?alpha=0.5&beta=0.6")
    with pytest.raises(DataError, match="not a number"):
        load("builtin:ou?kappa=fast")
    with pytest.raises(DataError, match="unknown parameter 'mu'"):
        load("builtin:ou?mu=1")
    with pytest.raises(DataError, match="n=1.5"):
        load("builtin:lag?n=1.5")


def scramble(bars, rng):
    """The same bars with every extra column replaced by noise."""
    return dataclasses.replace(bars, extra={k: rng.normal(size=len(bars)) for k in bars.extra})


@pytest.mark.parametrize("name", SYNTHETIC)
def test_no_answer_column_reaches_the_observation_unless_named(name, rng):
    """With the default config nothing of ``bars.extra`` is a feature: scrambling every answer column
    leaves the trainer's environment observations bit for bit the same. Naming a column in
    ``features.extra`` makes it one (so the check can fail)."""
    from cudarl.trainer import Trainer

    bars = ds.resolve(f"builtin:{name}?n=700&seed=1")
    assert bars.extra or name == "randomwalk"
    over = {"run": {"device": "cpu"}, "env": {"n_envs": 4, "episode_len": 32}}
    cfg = resolve_for_backend(from_dict(over), False, over)
    obs = []
    for b in (bars, scramble(bars, rng)):
        tr = Trainer(cfg, run_dir=False, bars=b, echo=lambda m: None)
        assert not set(tr.data.names) & set(b.extra)
        obs.append(np.asarray(tr.data.x).tobytes() + np.asarray(tr.env.obs).tobytes())
    assert obs[0] == obs[1]
    for col in bars.extra:
        named = compute(bars, FeatureConfig(extra=(col,)))
        assert named.names[-1] == col
        j = named.names.index(col)
        np.testing.assert_array_equal(
            named.values[named.warmup :, j], bars.extra[col][named.warmup :].astype(np.float32)
        )


def test_naming_a_missing_extra_column_is_a_clear_error():
    with pytest.raises(ValueError, match=r"features.extra names \['regime'\], which builtin:ou"):
        compute(ds.ou(n=300), FeatureConfig(extra=("regime",)))
    with pytest.raises(ValueError, match="a list of names"):
        FeatureConfig(extra=True)


def test_every_market_can_be_written_by_data_synth(tmp_path):
    from typer.testing import CliRunner

    from cudarl.cli import SYNTHETIC as CLI_SYNTHETIC
    from cudarl.cli import app

    assert sorted(CLI_SYNTHETIC) == SYNTHETIC
    r = CliRunner().invoke(app, ["data", "synth", "ou", str(tmp_path / "ou.csv"), "--n", "300"])
    assert r.exit_code == 0, r.output
    back = load(str(tmp_path / "ou.csv"), extra_columns=["deviation", "drift"])
    np.testing.assert_allclose(back.close, ds.ou(n=300).close, rtol=1e-12)
