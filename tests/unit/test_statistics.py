"""The evaluation's statistics against hand computations, the papers' formulas and simulation."""

import json
import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy.signal import lfilter

from cudarl.data import load
from cudarl.evaluate import (
    evaluate_positions,
    expected_max_sharpe,
    json_safe,
    optimal_block_length,
    paired_comparison,
    probabilistic_sharpe_ratio,
    return_statistics,
    seed_summary,
    sharpe_standard_error,
    stationary_bootstrap,
)
from cudarl.evaluate._stats import moments, newey_west_se, sharpe_per_bar
from cudarl.splits import Split

PHI = NormalDist().cdf


def test_psr_against_a_direct_normal_cdf_computation():
    r = [0.012, -0.004, 0.007, 0.021, -0.015, 0.003, 0.009, -0.001, 0.016, -0.008, 0.002]
    n = len(r)
    mean = sum(r) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1))
    m2 = sum((x - mean) ** 2 for x in r) / n
    skew = sum((x - mean) ** 3 for x in r) / n / m2**1.5
    kurt = sum((x - mean) ** 4 for x in r) / n / m2**2
    sr = mean / sd
    want = PHI((sr - 0.1) * math.sqrt(n - 1) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr * sr))
    assert sharpe_per_bar(r) == pytest.approx(sr, rel=1e-12)
    assert moments(r) == pytest.approx((skew, kurt), rel=1e-12)
    assert probabilistic_sharpe_ratio(sr, n, skew, kurt, 0.1) == pytest.approx(want, rel=1e-12)
    # normal returns, SR 0: PSR(0) is 1/2; the SE is 1 / sqrt(n - 1)
    assert probabilistic_sharpe_ratio(0.0, 101, 0.0, 3.0) == 0.5
    assert sharpe_standard_error(0.0, 101) == pytest.approx(0.1)


def test_expected_max_sharpe_is_the_papers_formula_and_close_to_simulation():
    g = 0.5772156649015329
    for trials, var in ((10, 1.0), (100, 0.04)):
        inv = NormalDist().inv_cdf
        want = math.sqrt(var) * ((1 - g) * inv(1 - 1 / trials) + g * inv(1 - 1 / (trials * math.e)))
        assert expected_max_sharpe(trials, var) == pytest.approx(want, rel=1e-12)
        draws = np.random.default_rng(trials).normal(0, math.sqrt(var), size=(20000, trials)).max(axis=1)
        assert expected_max_sharpe(trials, var) == pytest.approx(draws.mean(), rel=0.03)
    assert expected_max_sharpe(1, 1.0) == 0.0
    with pytest.raises(ValueError):
        expected_max_sharpe(0, 1.0)


def test_dsr_deflates_by_the_trials_and_is_psr_for_one():
    r = np.random.default_rng(3).normal(0.0008, 0.01, 1000)
    one, many = return_statistics(r, 252, trials=1), return_statistics(r, 252, trials=50)
    assert one["dsr"] == one["psr"] and 0.5 < one["psr"] < 1
    assert many["dsr"] < one["dsr"]
    assert many["expected_max_sharpe"] == pytest.approx(expected_max_sharpe(50, 1 / 999) * math.sqrt(252))


def test_sharpe_standard_error_matches_the_spread_of_estimates():
    rng = np.random.default_rng(5)
    n, sr = 250, 0.1
    est = [sharpe_per_bar(rng.normal(sr, 1.0, n)) for _ in range(4000)]
    se = sharpe_standard_error(sr, n)
    assert np.std(est) == pytest.approx(se, rel=0.06)


def test_block_length_follows_politis_white_for_an_ar1():
    """For AR(1) with coefficient rho the population value is (2 rho / (1 - rho^2))^(2/3) N^(1/3)."""
    n = 20000
    e = np.random.default_rng(9).normal(size=n)
    for rho in (0.3, 0.5):
        x = lfilter([1.0], [1.0, -rho], e)  # x[t] = rho x[t-1] + e[t]
        want = (2 * rho / (1 - rho * rho)) ** (2 / 3) * n ** (1 / 3)
        assert optimal_block_length(x) == pytest.approx(want, rel=0.15), rho
    assert optimal_block_length(e) < 4
    assert optimal_block_length(np.ones(10)) == 1.0


def test_normal_cdf_and_ppf_are_scipys_without_importing_it():
    """PSR and the expected maximum Sharpe use the standard library's erf/erfc and NormalDist (scipy.stats
    cost 0.7 s of an evaluation's start): within 5e-14 of scipy's (relative) down to x = -30."""
    from scipy.stats import norm

    from cudarl.evaluate._stats import normal_cdf, normal_ppf

    xs = np.concatenate([np.linspace(-30, 8, 4001), [0.0, -0.7071, 0.7072, -1e-300]])
    for x in xs:
        assert normal_cdf(x) == pytest.approx(float(norm.cdf(x)), rel=5e-14, abs=0), x
    for p in np.concatenate([np.linspace(1e-6, 1 - 1e-6, 2001), [1e-300, 0.5]]):
        assert normal_ppf(p) == pytest.approx(float(norm.ppf(p)), rel=1e-14, abs=1e-300), p


def _bootstrap_2d(n, block, resamples, seed):
    """The stationary bootstrap as it was first drawn: a uniform and a start for every bar, a block
    starting where the uniform is below 1 / block (the law the cheaper draw must keep)."""
    rng = np.random.default_rng([int(seed), 0xB007])
    new = rng.random((resamples, n)) < 1.0 / max(block, 1.0)
    new[:, 0] = True
    starts = rng.integers(0, n, size=(resamples, n))
    t = np.broadcast_to(np.arange(n), (resamples, n))
    last = np.maximum.accumulate(np.where(new, t, 0), axis=1)
    return (np.take_along_axis(starts, last, axis=1) + t - last) % n


# both draws of the block starts (one uniform a bar; geometric gaps), block 1, one block a resample,
# one bar, a chunk of one resample (n > 2^16) and chunks of several
BOOTSTRAPS = [(1, 1.0, 3), (7, 1.0, 13), (500, 2.5, 400), (500, 40.0, 400), (70_000, 9.0, 3), (2, 1e9, 5)]


@pytest.mark.parametrize("n, block, resamples", BOOTSTRAPS)
def test_the_bootstrap_is_seeded_int32_in_range_and_a_block_starts_each_resample(n, block, resamples):
    idx = stationary_bootstrap(n, block, resamples, seed=n)
    assert idx.dtype == np.int32 and idx.shape == (resamples, n)  # int32: half the bytes of int64
    assert idx.min() >= 0 and idx.max() < n
    assert np.array_equal(idx, stationary_bootstrap(n, block, resamples, seed=n))
    if n > 2 and resamples > 2:
        assert not np.array_equal(idx, stationary_bootstrap(n, block, resamples, seed=n + 1))
    if block >= n:  # one block a resample: consecutive bars from a start, wrapping around
        assert np.array_equal(idx, (idx[:, :1] + np.arange(n)) % n)


@pytest.mark.parametrize("block", [1.0, 2.5, 6.0, 10.0, 40.0])
def test_the_bootstraps_blocks_are_geometric_from_uniform_starts_and_wrap(block):
    """The law of the stationary bootstrap, whichever way its starts are drawn (per bar above 1/8 a
    bar, geometric gaps below): each later bar starts a block with probability 1 / block wherever it
    is (in a resample, in a chunk), the gaps between starts are geometric, and blocks start at uniform
    bars and run on past the last bar to the first."""
    n, resamples, p = 500, 800, 1.0 / block
    idx = stationary_bootstrap(n, block, resamples, seed=5).astype(np.int64)
    cont = (idx[:, 1:] - idx[:, :-1]) % n == 1  # a new block continues the last one by chance 1 / n
    new = ~cont
    rate = p * (1 - 1 / n)
    se = math.sqrt(rate * (1 - rate) / new.size)
    assert abs(new.mean() - rate) < 5 * se + 1e-12
    for part in (new[:, : n // 2], new[:, n // 2 :], new[: resamples // 2], new[resamples // 2 :]):
        assert abs(part.mean() - rate) < 5 * math.sqrt(rate * (1 - rate) / part.size) + 1e-12
    if p < 1:  # gaps from a start to the next one, cut at k bars: E[min(G, k)] = (1 - (1 - p)^k) / p
        k = 20
        starts = np.argwhere(new[:, : n - 1 - k])
        ahead = np.stack([new[starts[:, 0], starts[:, 1] + j] for j in range(1, k + 1)], axis=1)
        gap = np.where(ahead.any(axis=1), ahead.argmax(axis=1) + 1, k)
        want = (1 - (1 - p) ** k) / p
        assert abs(gap.mean() - want) < 5 * gap.std() / math.sqrt(gap.size)
        assert abs(np.mean(gap == 1) - p) < 5 * math.sqrt(p * (1 - p) / gap.size) + 1e-12
    first = np.concatenate([idx[:, 0], idx[:, 1:][new]])  # the starts (and a few continuations)
    counts = np.bincount(first, minlength=n)
    chi2 = ((counts - first.size / n) ** 2 / (first.size / n)).sum()  # n - 1 dof
    assert chi2 < (n - 1) + 5 * math.sqrt(2 * (n - 1))
    wraps = ((idx[:, :-1] == n - 1) & (idx[:, 1:] == 0)).sum()  # blocks running past the last bar
    want = idx[:, :-1].size / n * ((1 - p) + p / n)
    assert abs(wraps - want) < 5 * math.sqrt(want) and (wraps > 0 or p == 1)


def test_the_bootstrap_resamples_as_the_per_bar_draw_did():
    """The variance of the resampled mean of an AR(1) series, and the share of resamples whose mean is
    above the series', agree with those of the per-bar draw the bootstrap had before (another random
    stream, the same process)."""
    x = lfilter([1.0], [1.0, -0.5], np.random.default_rng(4).normal(size=1000))
    for block in (2.0, 12.0):
        new = x[stationary_bootstrap(1000, block, 3000, seed=1)].mean(axis=1)
        old = x[_bootstrap_2d(1000, block, 3000, 1)].mean(axis=1)
        assert new.var() == pytest.approx(old.var(), rel=0.12), block
        assert np.mean(new > x.mean()) == pytest.approx(np.mean(old > x.mean()), abs=0.05)


def _close_to_the_reference(got, want, n):
    """Equal NaN, and within 1e-9 relative or 1e-10 of the Sharpe's standard error ``1 / sqrt(n)``."""
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10 / math.sqrt(n))


def test_return_statistics_uses_the_bootstraps_resamples():
    """The intervals :func:`return_statistics` makes from the resamples' blocks are those of the whole
    :func:`stationary_bootstrap` indices (the reference), to 1e-9."""
    from cudarl.evaluate._stats import sharpe_interval

    rng = np.random.default_rng(8)
    r, b = rng.standard_t(4, 2500) * 0.01, rng.normal(0.0003, 0.01, 2500)
    st = return_statistics(r, 252, benchmark=b, resamples=300, seed=17)
    idx = stationary_bootstrap(2500, st["block_length"], 300, 17)
    _close_to_the_reference(np.array(st["sharpe_interval"]), np.array(sharpe_interval(r, idx, 252)), 2500)
    vb = st["versus_benchmark"]
    idx = stationary_bootstrap(2500, vb["block_length"], 300, 18)
    flat = return_statistics(np.zeros(2500), 252, benchmark=b, resamples=300, seed=17)["versus_benchmark"]
    flat_idx = stationary_bootstrap(2500, flat["block_length"], 300, 18)
    for got, want in (
        (vb, paired_comparison(r, b, idx, 252)),
        (flat, paired_comparison(np.zeros(2500), b, flat_idx, 252)),
    ):
        assert got.keys() == {*want, "block_length"} and got["p_not_better"] == want["p_not_better"]
        for k in ("sharpe_difference", "mean_excess_per_bar", "t_newey_west"):
            assert got[k] == want[k]
        _close_to_the_reference(
            np.array(got["sharpe_difference_interval"]), np.array(want["sharpe_difference_interval"]), 2500
        )


def _series(kind, rng):
    n = 2000
    return {
        "normal": lambda: rng.normal(3e-4, 0.01, n),
        "heavy tails": lambda: rng.standard_t(1.5, n) * 0.01,
        "cauchy": lambda: rng.standard_cauchy(n) * 0.01,
        "mostly flat": lambda: np.where(rng.random(n) < 0.02, rng.normal(0.001, 0.01, n), 0.0),
        "far from 0": lambda: 0.01 + 1e-7 * rng.normal(size=n),
        "constant": lambda: np.full(n, 0.001),
        "zeros": lambda: np.zeros(n),
        "one bar": lambda: np.array([0.01]),
        "two bars": lambda: np.array([0.01, -0.02]),
        "constant resamples": lambda: np.array([0.0, 0.0, 1.0]),
        "flat, then not": lambda: np.r_[np.full(5, 0.1), rng.normal(size=2)],
        "almost constant": lambda: np.r_[np.full(50, 0.01), 0.01 + 1e-9],
        "above 2^16 bars": lambda: rng.normal(1e-4, 0.01, 70_001),
    }[kind]()


@pytest.mark.parametrize("block", [1.0, 2.2, 14.7, 1e6])
@pytest.mark.parametrize(
    "kind",
    [
        "normal",
        "heavy tails",
        "cauchy",
        "mostly flat",
        "far from 0",
        "constant",
        "zeros",
        "one bar",
        "two bars",
        "constant resamples",
        "flat, then not",
        "almost constant",
        "above 2^16 bars",
    ],
)
def test_block_sums_give_each_resamples_sharpe(kind, block, rng):
    """:func:`bootstrap_sharpes` sums each resample's blocks (prefix-sum differences), not its bars: the
    reference is :func:`resampled_sharpe` of :func:`stationary_bootstrap`'s indices with the same seed,
    NaN where it is NaN (constant resamples: every one of constant returns, some of a short or flat
    series), within 1e-9 elsewhere; block 1 (one bar a block), 1e6 (one block a resample, wrapping)."""
    from cudarl.evaluate._stats import bootstrap_sharpes, resampled_sharpe

    r = _series(kind, rng)
    resamples = 7 if r.size > 65_536 else 300
    got = bootstrap_sharpes([r], block, resamples, seed=4)
    assert got.shape == (1, resamples)
    want = resampled_sharpe(r, stationary_bootstrap(r.size, block, resamples, seed=4))
    _close_to_the_reference(got[0], want, r.size)
    if kind in ("constant", "zeros", "one bar"):
        assert np.isnan(got).all()
    if kind in ("constant resamples", "flat, then not") and block < 20:
        assert np.isnan(got).any() and not np.isnan(got).all()


@pytest.mark.parametrize("block", [1.0, 2.2, 14.7])
def test_block_sums_of_two_series_use_the_same_resamples(block, rng):
    """A policy and its benchmark are resampled by the same blocks: each series' Sharpe is the
    reference over the same indices, a flat policy NaN and a constant benchmark NaN in each."""
    from cudarl.evaluate._stats import bootstrap_sharpes, resampled_sharpe

    b = rng.normal(0.0, 0.01, 3000)
    r = np.where(rng.random(3000) < 0.3, 0.0, b)
    idx = stationary_bootstrap(3000, block, 200, seed=9)
    for pair in ([r, b], [b, r], [np.zeros(3000), b], [r, np.full(3000, 0.001)]):
        got = bootstrap_sharpes(pair, block, 200, seed=9)
        for g, x in zip(got, pair, strict=True):
            _close_to_the_reference(g, resampled_sharpe(x, idx), 3000)
    same = bootstrap_sharpes([b, b], block, 200, seed=9)
    assert np.array_equal(same[0], same[1])


def test_resampled_sharpe_is_numpys_mean_over_std_bit_for_bit(rng):
    """NumPy's mean over its std (ddof 1), bit for bit, and NaN where a resample is constant: 300 times
    0.1 has a std of 1.4e-17 in floating point, not 0, and would have a Sharpe of 7e15."""
    from cudarl.evaluate._stats import resampled_sharpe

    flat_once = np.r_[np.full(5, 0.1), rng.normal(size=2)]
    for r in (rng.standard_t(4, 3001) * 0.01, np.zeros(300), np.full(300, 0.1), rng.normal(size=2), flat_once):
        idx = stationary_bootstrap(len(r), 3.0, 150, seed=3)
        x = r[idx]
        sd = x.std(axis=1, ddof=1)
        ok = (sd > 0) & (x.max(axis=1) > x.min(axis=1))
        with np.errstate(divide="ignore", invalid="ignore"):
            want = np.where(ok, x.mean(axis=1) / np.where(ok, sd, 1.0), np.nan)
        np.testing.assert_array_equal(resampled_sharpe(r, idx), want)
    assert np.isnan(resampled_sharpe(np.full(300, 0.1), stationary_bootstrap(300, 3.0, 10))).all()
    assert np.isnan(resampled_sharpe(flat_once, stationary_bootstrap(7, 3.0, 150, seed=3))).any()


def test_sharpe_interval_covers_the_truth_about_as_often_as_it_says():
    rng = np.random.default_rng(11)
    mu, sd, n = 0.001, 0.01, 400
    truth = mu / sd * math.sqrt(252)
    covered = 0
    for _ in range(120):
        lo, hi = return_statistics(rng.normal(mu, sd, n), 252, resamples=300)["sharpe_interval"]
        covered += lo <= truth <= hi
    assert 0.86 <= covered / 120 <= 0.995, covered


def test_paired_comparison_by_hand():
    rng = np.random.default_rng(2)
    b = rng.normal(0.0, 0.01, 600)
    idx = stationary_bootstrap(600, 3.0, 400)
    same = paired_comparison(b, b, idx, 252)
    assert same["sharpe_difference"] == 0 and same["p_not_better"] == 1.0 and same["mean_excess_per_bar"] == 0
    better = paired_comparison(b + 0.003, b, idx, 252)
    assert better["sharpe_difference"] > 0 and better["p_not_better"] < 0.01
    assert better["mean_excess_per_bar"] == pytest.approx(0.003)
    flat = paired_comparison(np.zeros(600), b + 0.002, idx, 252)
    assert flat["sharpe_difference"] == pytest.approx(-sharpe_per_bar(b + 0.002) * math.sqrt(252))
    steady = paired_comparison(b, np.full(600, 0.001), idx, 252)  # a constant benchmark counts as Sharpe 0
    assert steady["sharpe_difference"] == pytest.approx(sharpe_per_bar(b) * math.sqrt(252))
    assert (
        steady["sharpe_difference_interval"]
        == paired_comparison(b, np.zeros(600), idx, 252)["sharpe_difference_interval"]
    )


def test_newey_west_by_hand():
    d = np.array([1.0, -2.0, 3.0, 0.5, -1.5, 2.0, 0.0, 1.0])
    n = d.size
    x = d - d.mean()
    L = int(4 * (n / 100) ** (2 / 9))
    s = sum(x * x) / n + sum(2 * (1 - k / (L + 1)) * sum(x[k:] * x[:-k]) / n for k in range(1, L + 1))
    assert newey_west_se(d) == pytest.approx(math.sqrt(s / n), rel=1e-12)


def test_seed_summary_by_hand():
    s = seed_summary([1.0, 2.0, 3.0, float("nan")])
    assert s["n"] == 3 and s["undefined"] == 1 and s["mean"] == 2.0 and s["sd"] == 1.0
    half = 4.302652729911275 / math.sqrt(3)  # t(2) 97.5% quantile
    assert s["interval"] == pytest.approx([2 - half, 2 + half])
    assert seed_summary([float("nan")])["interval"] is None


def test_evaluation_summary_is_strict_json_with_reasons_for_every_null():
    bars = load("builtin:regime?n=1200")
    sp = Split("test", 1000, 1200)
    for pos in (np.zeros(198), bars.extra["regime"][1000:1198]):
        ev = evaluate_positions(bars, pos, sp, cost_bps=1.0, fill="open", trials=3)
        text = json.dumps(json_safe(ev.summary), allow_nan=False)

        def walk(node, path="summary"):
            if isinstance(node, dict):
                for k, v in node.items():
                    if v is None:
                        assert k in node.get("null_reasons", {}), f"{path}.{k} is null without a reason"
                    walk(v, f"{path}.{k}")
            elif isinstance(node, list):
                for v in node:
                    walk(v, path)

        walk(json.loads(text))
    stats = json.loads(text)["statistics"]
    assert stats["trials"] == 3 and 0 <= stats["psr"] <= 1 and stats["sharpe_interval"][0] < stats["sharpe"]
    assert "versus_benchmark" in stats


def test_bootstrap_sharpes_has_the_same_bits_whatever_its_threads(monkeypatch):
    """Each chunk of draws has a generator of its own, so the chunks drawn in 1, 2 or 4 threads, or in
    reverse order, give the same bits; and chunk c's draws are those the index reference makes."""
    from concurrent.futures import ThreadPoolExecutor

    from cudarl.evaluate import _stats

    rng = np.random.default_rng(3)
    r, b = rng.standard_normal(3000) * 0.01, rng.standard_normal(3000) * 0.01
    got = []
    for workers in (1, 2, 4):
        monkeypatch.setattr(_stats, "_POOL", [ThreadPoolExecutor(workers)])
        got.append(_stats.bootstrap_sharpes([r, b], 2.5, 300, seed=7))

    class Reversed:
        def map(self, f, items):
            return list(map(f, reversed(list(items))))

    monkeypatch.setattr(_stats, "_POOL", [Reversed()])
    got.append(_stats.bootstrap_sharpes([r, b], 2.5, 300, seed=7))
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    c = 3
    r0, new, first, start = _stats._chunk_blocks(3000, 2.5, 300, 7, c)
    assert r0 == c * _stats._chunk_rows(3000) and list(_stats._bootstrap_blocks(3000, 2.5, 300, 7))[c][0] == r0
    np.testing.assert_array_equal(list(_stats._bootstrap_blocks(3000, 2.5, 300, 7))[c][3], start)
