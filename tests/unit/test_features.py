"""Features are causal, the normaliser sees only the training split, and splits are chronological."""

import dataclasses
import math

import numpy as np
import pytest

import cudarl.datasets as ds
from cudarl.config import ConfigError, from_dict
from cudarl.data import load
from cudarl.features import (
    BUILTIN,
    FeatureConfig,
    FeatureContext,
    Normaliser,
    compute,
    ew_filter_loop,
    ewm_mean,
    return_sign,
    with_position,
)
from cudarl.splits import Split, by_date, chronological, walk_forward


def perturb_after(bars, t, rng):
    """A copy of ``bars`` where every bar after ``t`` is different (still valid bars)."""
    n = len(bars)
    scale = np.ones(n)
    scale[t + 1 :] = np.exp(rng.normal(0, 0.05, n - t - 1))
    wick = np.ones(n)
    wick[t + 1 :] = 1 + rng.uniform(0.0, 0.02, n - t - 1)
    o, c = bars.open * scale, bars.close * scale * np.where(np.arange(n) > t, 1.01, 1.0)
    time = bars.time.copy()
    time[t + 1 :] += np.int64(3_600_000_000_000)  # one hour later, order kept
    extra = {k: np.where(np.arange(n) > t, -v, v) for k, v in bars.extra.items()}
    vol = None if bars.volume is None else np.where(np.arange(n) > t, bars.volume * 3 + 7, bars.volume)
    return dataclasses.replace(
        bars,
        time=time,
        open=o,
        close=c,
        high=np.maximum(bars.high * scale, np.maximum(o, c)) * wick,
        low=np.minimum(bars.low * scale, np.minimum(o, c)) / wick,
        volume=vol,
        extra=extra,
    )


def assert_causal(bars, config, rng):
    """Changing every bar after t never moves rows 0..t of ``compute(bars, config)``."""
    base = compute(bars, config)
    ts = [0, 1, config.warmup - 1, config.warmup, config.warmup + 1, len(bars) - 2] + rng.integers(
        0, len(bars) - 1, 10
    ).tolist()
    for t in ts:
        changed = compute(perturb_after(bars, t, rng), config)
        assert changed.names == base.names
        same = changed.values[: t + 1] == base.values[: t + 1]
        assert same.all(), f"bar {t}: features {[base.names[j] for j in np.flatnonzero(~same.all(0))]} moved"
        if t >= config.warmup:  # the perturbation is visible after t, so the check can fail
            assert not np.array_equal(changed.values[t + 1 :], base.values[t + 1 :])


@pytest.mark.parametrize("source", ["builtin:regime?n=800", "builtin:eurusd-1h"])
def test_no_lookahead_changing_bars_after_t_never_changes_features_up_to_t(source, rng):
    assert_causal(load(source).take(slice(0, 800)), FeatureConfig(horizons=(1, 3, 10, 50), vol_halflife=20), rng)


def test_normaliser_is_fitted_on_train_only_and_round_trips(rng):
    bars = ds.regime(n=1000, seed=2)
    config = FeatureConfig()
    splits = chronological(len(bars), warmup=config.warmup)
    f1 = compute(bars, config)
    f2 = compute(perturb_after(bars, splits.train.stop - 1, rng), config)
    n1, n2 = Normaliser.fit(f1, splits.train), Normaliser.fit(f2, splits.train)
    assert np.array_equal(n1.mean, n2.mean) and np.array_equal(n1.std, n2.std)
    assert not np.array_equal(f1.values[splits.test.slice], f2.values[splits.test.slice])
    x = f1.values[splits.train.start : splits.train.stop].astype(np.float64)
    np.testing.assert_allclose(n1.mean, x.mean(0), rtol=1e-12)
    z = n1.transform(f1.values[splits.train.slice])
    assert z.dtype == np.float32 and np.abs(z).max() <= n1.clip
    restored = Normaliser.from_state_dict(n1.state_dict())
    assert np.array_equal(restored.transform(f1.values), n1.transform(f1.values))
    assert restored.fitted_on == (splits.train.start, splits.train.stop)


def test_feature_values_by_hand():
    bars = ds.regime(n=300, seed=5)
    cfg = FeatureConfig(horizons=(1, 5), vol_halflife=10, time_features=False, extra=("regime",))
    f = compute(bars, cfg)
    assert f.names == ("ret_1", "ret_5", "log_vol", "range", "body", "close_loc", "volume", "regime")
    t = 123
    a = 1 - 0.5 ** (1 / 10)
    r = np.diff(np.log(bars.close))  # r[s - 1] is the return into bar s
    w = np.array([(1 - a) ** (t - s) for s in range(1, t + 1)])
    sigma = math.sqrt((w * r[:t] ** 2).sum() / w.sum())
    assert f.values[t, 0] == pytest.approx(r[t - 1] / sigma, rel=1e-5)
    assert f.values[t, 1] == pytest.approx(
        math.log(bars.close[t] / bars.close[t - 5]) / (sigma * math.sqrt(5)), rel=1e-5
    )
    assert f.values[t, 2] == pytest.approx(math.log(sigma), rel=1e-5)
    assert f.values[t, 7] == bars.extra["regime"][t]
    assert np.all(f.values[: cfg.warmup] == 0) and f.warmup == 10
    assert np.all(np.abs(f.values[:, 5]) <= 1.0)


def test_ewm_mean_matches_a_loop(rng):
    x = rng.normal(size=50)
    present = rng.random(50) < 0.7
    present[0] = False
    got = ewm_mean(x, 4.0, present)
    a = 1 - 0.5**0.25
    num = den = 0.0
    for t in range(50):
        num, den = num * (1 - a) + (a * x[t] if present[t] else 0.0), den * (1 - a) + (a if present[t] else 0.0)
        if den == 0:
            assert np.isnan(got[t])
        else:
            assert got[t] == pytest.approx(num / den, rel=1e-12)


def test_the_python_recurrence_is_lfilter_bit_for_bit(rng):
    """ewm_mean's loop (short series: no scipy.signal import) and scipy's lfilter (long series) give
    the same bits, so the features do not depend on which one ran."""
    from scipy.signal import lfilter

    for trial in range(80):
        n = int(rng.integers(1, 6000))
        halflife = float(rng.choice([0.3, 1.0, 4.0, 32.0, 64.0, 1e4, rng.uniform(0.1, 500)]))
        a = 1.0 - 0.5 ** (1.0 / halflife)
        x = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8)
        x = x * x if trial % 3 == 0 else x
        x[rng.random(n) < 0.05] = 0.0
        # weights: some rows absent, every row present (the loop stops once its state repeats and fills
        # the rest), absent only first (the volatility's), absent then present to the end
        kind = trial % 4
        w = (rng.random(n) < 0.8) if kind == 0 else np.ones(n) if kind == 1 else np.arange(n) >= 1
        w = np.r_[rng.random(n // 2) < 0.5, np.ones(n - n // 2)] if kind == 3 else w
        w = w.astype(np.float64)
        got = ew_filter_loop(x, w, a)
        for g, v in zip(got, (x, w), strict=True):
            want = lfilter([a], [1.0, a - 1.0], v)
            np.testing.assert_array_equal(g.view(np.int64), want.view(np.int64))


def test_features_are_the_same_bits_whichever_filter_runs(monkeypatch):
    import cudarl.features as feats

    bars = ds.randomwalk(n=3000, seed=4)
    loop = compute(bars)
    monkeypatch.setattr(feats, "EW_LOOP_MAX_BARS", 0)  # every series through lfilter
    np.testing.assert_array_equal(compute(bars).values.view(np.int32), loop.values.view(np.int32))
    assert "volume" in loop.names


def test_time_features_and_position():
    f = compute(load("builtin:eurusd-1h").take(slice(0, 200)))
    assert {"hod_sin", "hod_cos", "dow_sin", "dow_cos"} <= set(f.names)
    assert "hod_sin" not in compute(ds.regime(n=200)).names
    i = f.names.index("dow_sin")
    # 2017-01-02 (the bar at index 2, 00:00 UTC) is a Monday: day 0
    assert f.values[2, i] == pytest.approx(0.0, abs=1e-7)
    x = with_position(f.values[:4], np.array([1, 0, -1, 1]))
    assert x.shape == (4, len(f.names) + 1) and x.dtype == np.float32 and x[2, -1] == -1


def test_chronological_and_date_splits():
    s = chronological(1000, train=0.6, val=0.2, warmup=50)
    assert (s.train.start, s.train.stop, s.val.start, s.val.stop, s.test.start, s.test.stop) == (
        50,
        620,
        620,
        810,
        810,
        1000,
    )
    bars = load("builtin:sp500")
    d = by_date(bars.time, "2015-01-01", "2017-01-01", warmup=64)
    assert str(np.datetime64(int(bars.time[d.val.start]), "ns"))[:10] == "2015-01-02"
    assert d.train.stop == d.val.start and d.val.stop == d.test.start and d.test.stop == len(bars)
    with pytest.raises(ValueError):
        chronological(100, train=0.8, val=0.3)
    with pytest.raises(ValueError):
        Split("test", 5, 6)


def test_walk_forward_folds_tile_the_end_without_overlap():
    folds = walk_forward(1000, folds=4, warmup=20)
    assert folds[-1].test.stop == 1000
    for a, b in zip(folds, folds[1:], strict=False):
        assert a.test.stop == b.test.start and a.test.start < b.test.start
    for f in folds:
        assert f.train.start == 20 and f.train.stop == f.val.start and f.val.stop == f.test.start
    rolling = walk_forward(1000, folds=3, test_size=100, val_size=50, train_size=200)
    assert [len(f.train) for f in rolling] == [200, 200, 200]
    with pytest.raises(ValueError, match="no room"):
        walk_forward(100, folds=10, test_size=10)


def test_return_sign_and_uncentred_columns_make_the_mirror_exact():
    from cudarl import datasets
    from cudarl.features import FeatureConfig, Normaliser, compute, return_sign

    bars = datasets.regime(n=600, seed=1)
    f = compute(bars, FeatureConfig(extra=("regime",)))
    sign = return_sign(f.names)
    names = dict(zip(f.names, sign, strict=True))
    assert names["ret_1"] and names["body"] and names["close_loc"] and names["regime"]
    assert not names["log_vol"] and not names["range"] and not names["dow_sin"]
    norm = Normaliser.fit(f, (0, 400), center=~sign)
    x = f.values[100:110]
    np.testing.assert_array_equal(norm.transform(-x)[:, sign], -norm.transform(x)[:, sign])
    assert np.all(norm.mean[sign] == 0) and np.all(norm.mean[~sign] != 0)


# --- the registry ----------------------------------------------------------------------------------------------
def _compute_before_registry(bars, config):
    """The oracle: ``compute`` as it was before the feature registry (commit 8b26b5c), frozen here.
    With the built-in groups the registry must give these bits exactly."""
    from cudarl.data.bars import NS_PER_DAY
    from cudarl.features import SIGMA_FLOOR, Features

    T = len(bars)
    c, o, h, low = (np.asarray(getattr(bars, k), dtype=np.float64) for k in ("close", "open", "high", "low"))
    logc = np.log(c)
    r = np.zeros(T)
    r[1:] = np.diff(logc)
    present = np.arange(T) >= 1
    sigma = np.sqrt(np.maximum(ewm_mean(r * r, config.vol_halflife, present), SIGMA_FLOOR**2))
    cols, names = [], []
    with np.errstate(invalid="ignore", divide="ignore"):
        for hz in config.horizons:
            lr = np.zeros(T)
            lr[hz:] = logc[hz:] - logc[:-hz]
            cols.append(lr / (sigma * math.sqrt(hz)))
            names.append(f"ret_{hz}")
        cols.append(np.log(sigma))
        names.append("log_vol")
        cols.append(np.log(h / low) / sigma)
        names.append("range")
        cols.append(np.log(c / o) / sigma)
        names.append("body")
        span = h - low
        cols.append(np.where(span > 0, (2 * c - h - low) / np.where(span > 0, span, 1.0), 0.0))
        names.append("close_loc")
        if bars.volume is not None:
            lv = np.log1p(np.asarray(bars.volume, dtype=np.float64))
            m = ewm_mean(lv, config.volume_halflife)
            var = np.maximum(ewm_mean(lv * lv, config.volume_halflife) - m * m, 0.0)
            cols.append(np.where(var > 1e-12, (lv - m) / np.sqrt(np.maximum(var, 1e-12)), 0.0))
            names.append("volume")
    if config.time_features and T:
        t = np.asarray(bars.time, dtype=np.int64)
        days = np.floor_divide(t, NS_PER_DAY)
        dow = (days + 3) % 7
        cols += [np.sin(2 * np.pi * dow / 7), np.cos(2 * np.pi * dow / 7)]
        names += ["dow_sin", "dow_cos"]
        intraday = (
            config.time_of_day
            if config.time_of_day is not None
            else bool(T >= 2 and np.median(np.diff(t)) < NS_PER_DAY)
        )
        if intraday:
            frac = (t - days * NS_PER_DAY) / NS_PER_DAY
            cols += [np.sin(2 * np.pi * frac), np.cos(2 * np.pi * frac)]
            names += ["hod_sin", "hod_cos"]
    for k in config.extra:
        cols.append(np.asarray(bars.extra[k], dtype=np.float64))
        names.append(k)
    values = np.stack(cols, axis=1) if cols else np.zeros((T, 0))
    warm = min(config.warmup, T)
    values[:warm] = 0.0
    return Features(values=values.astype(np.float32), names=tuple(names), warmup=config.warmup)


ORACLE_CONFIGS = [
    dict(),
    dict(horizons=(1, 3, 10, 50), vol_halflife=20, volume_halflife=7.5),
    dict(time_features=False),
    dict(time_of_day=True),
    dict(time_of_day=False),
    dict(extra=("regime",)),
]


@pytest.mark.parametrize("source", ["builtin:regime", "builtin:sp500", "builtin:eurusd-1h", "no volume"])
def test_default_groups_are_bit_identical_to_the_compute_before_the_registry(source):
    bars = dataclasses.replace(load("builtin:randomwalk"), volume=None) if source == "no volume" else load(source)
    for kw in ORACLE_CONFIGS:
        if kw.get("extra") and "regime" not in bars.extra:
            continue
        config = FeatureConfig(**kw)
        got, want = compute(bars, config), _compute_before_registry(bars, config)
        assert got.names == want.names and got.warmup == want.warmup, kw
        assert got.values.dtype == want.values.dtype and got.values.tobytes() == want.values.tobytes(), kw
    got = compute(bars, FeatureConfig())
    assert ("hod_sin" in got.names) == (source == "builtin:eurusd-1h")
    assert ("volume" in got.names) == (source != "no volume")


def momentum(ctx, config):
    """A user's feature: ``mom_<h>`` = EW mean of r up to t (half-life h) / sigma_t; signed."""
    return [(f"mom_{h}", ewm_mean(ctx.r, h) / ctx.sigma) for h in (4, 16)]


@pytest.fixture
def registry(monkeypatch):
    """cudarl.features with its registry restored after the test."""
    import cudarl.features as features

    monkeypatch.setattr(features, "FEATURES", dict(features.FEATURES))
    monkeypatch.setattr(features, "REGISTERED", dict(features.REGISTERED))
    return features


def test_default_groups_are_every_builtin_but_level_in_the_order_of_the_columns():
    assert FeatureConfig().groups == ("returns", "log_vol", "range", "body", "close_loc", "volume", "time", "extra")
    assert BUILTIN == FeatureConfig().groups + ("level",)


def test_level_is_the_distance_from_the_ewm_mean_causal_and_signed(rng):
    bars = ds.ou(n=1500, seed=2)
    config = FeatureConfig(groups=("level",), level_halflives=(8, 100))
    f = compute(bars, config)
    assert f.names == ("level_8", "level_100") and return_sign(f.names, config).all()
    ctx = FeatureContext.of(bars, config)
    t = 900
    a = 1 - 0.5 ** (1 / 100)
    w = (1 - a) ** np.arange(t, -1, -1.0)  # weights of bars 0..t
    m = (w * ctx.log_close[: t + 1]).sum() / w.sum()
    assert f.values[t, 1] == pytest.approx((ctx.log_close[t] - m) / (ctx.sigma[t] * 10.0), rel=1e-5)
    assert_causal(bars.take(slice(0, 800)), FeatureConfig(groups=("returns", "level"), vol_halflife=20), rng)


def test_selected_groups_give_exactly_their_columns_in_their_order():
    bars = load("builtin:eurusd-1h").take(slice(0, 1000))
    full = compute(bars)
    sub = compute(bars, FeatureConfig(groups=("time", "returns", "volume")))
    assert sub.names == ("dow_sin", "dow_cos", "hod_sin", "hod_cos", "ret_1", "ret_4", "ret_16", "ret_64", "volume")
    for j, n in enumerate(sub.names):
        assert sub.values[:, j].tobytes() == full.values[:, full.names.index(n)].tobytes(), n
    assert compute(ds.regime(n=300), FeatureConfig(groups=("body", "extra"))).names == ("body",)
    assert compute(ds.regime(n=300), FeatureConfig(groups=("body", "extra"), extra=("regime",))).names == (
        "body",
        "regime",
    )


def test_unknown_repeated_or_no_groups_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"unknown feature group\(s\) \['nope'\]; known: \['returns', 'log_vol', .*'extra', 'level'\]"
    ):
        FeatureConfig(groups=("returns", "nope"))
    with pytest.raises(ConfigError, match=r"features: unknown feature group\(s\) \['nope'\]"):
        from_dict({"features": {"groups": ["returns", "nope"]}})
    for bad in ((), ("body", "body"), "body"):
        with pytest.raises(ValueError, match="groups"):
            FeatureConfig(groups=bad)


def test_a_registered_feature_is_computed_causal_and_signed(registry, rng):
    registry.register_feature("mom", momentum, signed=True)
    registry.register_feature("absret", lambda ctx, config: [("absret", np.abs(ctx.r) / ctx.sigma)])
    bars = load("builtin:regime?n=800")
    config = FeatureConfig(groups=BUILTIN + ("mom", "absret"), horizons=(1, 3, 10, 50), vol_halflife=20)
    f, base = compute(bars, config), compute(bars, dataclasses.replace(config, groups=BUILTIN))
    assert "level_32" in base.names
    assert f.names == base.names + ("mom_4", "mom_16", "absret")
    assert f.values[:, : len(base.names)].tobytes() == base.values.tobytes()
    ctx = FeatureContext.of(bars, config)
    np.testing.assert_array_equal(
        f.values[config.warmup :, -2], (ewm_mean(ctx.r, 16) / ctx.sigma)[config.warmup :].astype(np.float32)
    )
    sign = return_sign(f.names, config)
    assert sign[-3:].tolist() == [True, True, False]
    np.testing.assert_array_equal(sign[: len(base.names)], return_sign(base.names, config))
    assert_causal(bars, config, rng)


def test_a_registered_feature_of_the_wrong_length_non_finite_or_misnamed_is_refused(registry):
    bars = ds.regime(n=300)
    at = np.arange(len(bars))

    def refused(name, fn, match, signed=False):
        registry.register_feature(name, fn, signed=signed)
        with pytest.raises(ValueError, match=match):
            compute(bars, FeatureConfig(groups=("returns", "log_vol", name)))

    refused(
        "short",
        lambda ctx, config: [("short", ctx.r[1:])],
        r"feature 'short': column 'short' has shape \(299,\), expected \(300,\)",
    )
    refused(
        "holes",
        lambda ctx, config: [("holes", np.where(at == 200, np.nan, ctx.r))],
        r"feature 'holes' \(group 'holes'\) is not finite at bar 200, after the 64-bar warm-up",
    )
    refused(
        "other", lambda ctx, config: [("ret_x", ctx.r)], r"column 'ret_x' must be named 'other' or 'other_<suffix>'"
    )
    refused(
        "log", lambda ctx, config: [("log_x", ctx.r)], r"call column 'log_vol' of feature 'log_vol' signed", signed=True
    )
    refused("ret_x", lambda ctx, config: [("ret_x", ctx.r)], r"call column 'ret_x' of feature 'ret_x' signed")
    refused("pair", lambda ctx, config: [ctx.r], r"feature 'pair' must return \[\(column name, values\)\]")
    # non-finite rows inside the warm-up are zeroed, like the built-ins' own
    registry.register_feature("late", lambda ctx, config: [("late", np.where(at < config.warmup, np.nan, 1.0))])
    f = compute(bars, FeatureConfig(groups=("late",)))
    assert f.values[: f.warmup].sum() == 0 and np.all(f.values[f.warmup :] == 1)
    for name, match in (("volume", "built-in"), ("my feature", "identifier")):
        with pytest.raises(ValueError, match=match):
            registry.register_feature(name, momentum)


def test_a_registered_feature_is_selectable_from_toml_and_set(registry, tmp_path):
    from cudarl.cli import build_config
    from cudarl.config import tomllib
    from cudarl.prepare import prepare_data

    registry.register_feature("mom", momentum, signed=True)
    (tmp_path / "run.toml").write_text('[features]\ngroups = ["returns", "mom"]\n')
    cfg, _ = build_config(config_file=tmp_path / "run.toml", device="cpu")
    assert cfg.features.groups == ("returns", "mom")
    cfg, _ = build_config(data="builtin:regime?n=1000", sets=["features.groups=[mom, volume]"], device="cpu")
    assert cfg.features.groups == ("mom", "volume") and from_dict(tomllib.loads(cfg.to_toml())) == cfg
    prep = prepare_data(cfg)
    assert prep.names == ("mom_4", "mom_16", "volume") and prep.sign.tolist() == [True, True, False]
    assert np.all(prep.normaliser.mean[:2] == 0)  # signed columns are scaled, not centred
    with pytest.raises(ConfigError, match=r"unknown feature group\(s\) \['nope'\]"):
        build_config(sets=['features.groups=["returns", "nope"]'], device="cpu")
