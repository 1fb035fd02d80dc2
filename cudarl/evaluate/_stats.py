"""Honest statistics of per-bar returns: how sure a Sharpe ratio is, and whether it beats a benchmark.

Per-bar returns ``r`` float64 [N]; ``SR`` below is the per-bar Sharpe ratio ``mean(r) / std(r, ddof=1)``
(annualised values multiply it by ``sqrt(periods_per_year)``); ``skew`` and ``kurt`` are the sample
skewness and (non-excess) kurtosis, ``m_k / m_2^(k/2)`` with central moments ``m_k``.

- :func:`sharpe_standard_error`: ``sqrt((1 - skew SR + (kurt - 1) / 4 SR^2) / (N - 1))`` (Lo 2002;
  Mertens 2002 for non-normal returns).
- :func:`probabilistic_sharpe_ratio`: ``PSR(SR*) = Phi((SR - SR*) sqrt(N - 1) / sqrt(1 - skew SR +
  (kurt - 1) / 4 SR^2))``, the probability that the true Sharpe exceeds ``SR*`` (Bailey and Lopez de
  Prado 2012, "The Sharpe ratio efficient frontier").
- :func:`expected_max_sharpe`: ``SR*_0 = sqrt(V) ((1 - g) Phi^-1(1 - 1/K) + g Phi^-1(1 - 1/(K e)))``,
  ``g`` the Euler-Mascheroni constant: the largest Sharpe expected among ``K`` independent trials of no
  skill whose estimates have variance ``V``; the deflated Sharpe ratio is ``DSR = PSR(SR*_0)``
  (Bailey and Lopez de Prado 2014, "The deflated Sharpe ratio"). Without the trials' variance, ``V`` is
  the estimator's variance under no skill, ``1 / (N - 1)``.
- :func:`stationary_bootstrap`: resamples of blocks of geometric length with mean ``b`` (Politis and
  Romano 1994), ``b`` chosen by :func:`optimal_block_length` (Politis and White 2004, with the
  correction of Patton, Politis and White 2009); :func:`sharpe_interval` is the percentile interval
  of the resampled Sharpe ratios.
- :func:`paired_comparison`: the same resamples applied to two return series over the same bars
  (the policy and buy-and-hold), so their dependence is kept; plus the mean per-bar difference with
  its Newey-West (Bartlett kernel) standard error.

Undefined values are ``NaN`` here; :func:`cudarl.evaluate.json_safe` writes them as ``null`` with the
reason stored beside them (``null_reasons``).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

EULER_GAMMA = 0.5772156649015329
LEVEL = 0.95
RESAMPLES = 1000
_SQRT_HALF = math.sqrt(0.5)


def normal_cdf(x: float) -> float:
    """``Phi(x)``, the standard normal CDF, as Cephes' ``ndtr`` (scipy's ``norm.cdf``) computes it:
    ``0.5 + 0.5 erf(x / sqrt 2)`` near 0, ``0.5 erfc(|x| / sqrt 2)`` (or 1 minus it) in the tails, so
    the far lower tail keeps its relative precision (within 5e-14 of scipy's to x = -30, a test; ``scipy.stats``
    cost 0.6-0.7 s of an evaluation's start, docs/perf-notes.md)."""
    v = x * _SQRT_HALF
    z = abs(v)
    if z < _SQRT_HALF:
        return 0.5 + 0.5 * math.erf(v)
    y = 0.5 * math.erfc(z)
    return 1.0 - y if v > 0 else y


def normal_ppf(p: float) -> float:
    """``Phi^-1(p)`` (Wichura's AS241 in :class:`statistics.NormalDist`; within 1e-15 of scipy's)."""
    return NormalDist().inv_cdf(p)


def sharpe_per_bar(r) -> float:
    """``mean(r) / std(r, ddof=1)``; NaN for fewer than 2 returns or constant returns."""
    r = np.asarray(r, dtype=np.float64)
    if r.size < 2 or r.max() == r.min():
        return math.nan
    return float(r.mean() / r.std(ddof=1))


def moments(r) -> tuple[float, float]:
    """(skewness, non-excess kurtosis) of ``r``; NaN when the returns are constant."""
    r = np.asarray(r, dtype=np.float64)
    d = r - r.mean()
    m2 = float(np.mean(d * d))
    if r.size < 2 or m2 == 0:
        return math.nan, math.nan
    return float(np.mean(d**3) / m2**1.5), float(np.mean(d**4) / m2**2)


def sharpe_standard_error(sr: float, n: int, skew: float = 0.0, kurt: float = 3.0) -> float:
    """Per-bar standard error of a Sharpe estimate ``sr`` from ``n`` returns (Lo 2002; Mertens 2002)."""
    if n < 2:
        return math.nan
    return math.sqrt(max(1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr * sr, 0.0) / (n - 1))


def probabilistic_sharpe_ratio(sr: float, n: int, skew: float, kurt: float, benchmark: float = 0.0) -> float:
    """``P(true per-bar Sharpe > benchmark)`` given the estimate ``sr`` from ``n`` returns."""
    se = sharpe_standard_error(sr, n, skew, kurt)
    if not (se > 0 and math.isfinite(sr)):
        return math.nan
    return float(normal_cdf((sr - benchmark) / se))


def expected_max_sharpe(trials: int, variance: float) -> float:
    """The expected largest per-bar Sharpe of ``trials`` independent no-skill trials with estimate
    variance ``variance`` (0 for one trial)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if trials == 1:
        return 0.0
    return math.sqrt(variance) * (
        (1.0 - EULER_GAMMA) * normal_ppf(1.0 - 1.0 / trials) + EULER_GAMMA * normal_ppf(1.0 - 1.0 / (trials * math.e))
    )


def optimal_block_length(r) -> float:
    """The stationary bootstrap's mean block length for ``r`` (Politis and White 2004; Patton,
    Politis and White 2009): ``b = (2 G^2 / D)^(1/3) N^(1/3)`` with ``G = sum_k lambda(k/M) |k| R(k)``,
    ``D = 2 (sum_k lambda(k/M) R(k))^2``, ``R`` the sample autocovariances, ``lambda`` the flat-top
    window, ``M = 2 m`` with ``m`` the first lag after which ``K = max(5, sqrt(log10 N))`` autocorrelations
    in a row are below ``2 sqrt(log10 N / N)``; at least 1, at most ``min(3 sqrt(N), N / 3)``."""
    x = np.asarray(r, dtype=np.float64)
    n = x.size
    if n < 4 or x.max() == x.min():
        return 1.0
    x = x - x.mean()
    max_lag = min(n - 1, int(math.ceil(math.sqrt(n))) + 5)
    acov = np.array([x[: n - k] @ x[k:] / n for k in range(max_lag + 1)])
    rho = acov / acov[0]
    K = max(5, int(math.sqrt(math.log10(n))))
    crit = 2.0 * math.sqrt(math.log10(n) / n)
    m = max_lag - K
    for lag in range(1, max_lag - K + 1):
        if np.all(np.abs(rho[lag : lag + K]) < crit):
            m = lag - 1
            break
    M = min(2 * max(m, 1), max_lag)
    k = np.arange(-M, M + 1)
    t = np.abs(k) / M
    lam = np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2.0 * (1.0 - t), 0.0))
    R = acov[np.abs(k)]
    G = float(np.sum(lam * np.abs(k) * R))
    g0 = float(np.sum(lam * R))
    if g0 <= 0 or G == 0:
        return 1.0
    b = (2.0 * G * G / (2.0 * g0 * g0)) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return float(min(max(b, 1.0), min(3.0 * math.sqrt(n), n / 3.0)))


def stationary_bootstrap(n: int, block: float, resamples: int, seed: int = 0) -> np.ndarray:
    """int32 [resamples, n]: indices of stationary-bootstrap resamples of ``n`` bars (Politis and Romano
    1994): each index is the previous plus one (wrapping around) except with probability ``1 / block``,
    when a new block starts at a uniform bar."""
    rng = np.random.default_rng([int(seed), 0xB007])
    # Made in chunks of about 2^16 bars (rows whole), in the fewest fresh bytes: a fresh process pays
    # for every page it touches, and the uniforms of all [resamples, n] at once were 8 bytes a bar. The
    # uniforms drawn a chunk at a time are the same stream; the block starts are drawn as int32, the
    # same values as int64 (one bounded 32-bit draw each), after all the uniforms as before.
    rows = max(1, (1 << 16) // n)
    new = np.empty((resamples, n), bool)
    for r0 in range(0, resamples, rows):
        np.less(rng.random((min(rows, resamples - r0), n)), 1.0 / max(block, 1.0), out=new[r0 : r0 + rows])
    new[:, 0] = True
    starts = rng.integers(0, n, size=(resamples, n), dtype=np.int32)
    # Each chunk flattened: every row starts a block, so the running maximum of the flat positions where
    # a block starts never reaches back into an earlier row, and ``p - last`` is the offset within the
    # block. One 1-D scan and gather per chunk, in buffers that stay in cache (the 2-D scan and gather
    # over [resamples, n] took 0.85 s at 1000 x 10k bars).
    out = starts  # written over in place, chunk by chunk, after its chunk of starts is read
    p = np.arange(rows * n, dtype=np.int32)
    last, off, got = np.empty_like(p), np.empty_like(p), np.empty_like(p)
    for r0 in range(0, resamples, rows):
        k = min(rows, resamples - r0) * n
        pk, lk, ok, o = p[:k], last[:k], off[:k], got[:k]
        np.multiply(new[r0 : r0 + k // n].reshape(-1), pk, out=lk)
        np.maximum.accumulate(lk, out=lk)
        np.take(starts[r0 : r0 + k // n].reshape(-1), lk, out=o, mode="clip")  # in range; "raise" buffers
        np.subtract(pk, lk, out=ok)
        o += ok  # start + offset < 2 n
        np.subtract(o, n, out=o, where=o >= n)
        out[r0 : r0 + k // n].reshape(-1)[:] = o
    return out


def _sharpe_rows(x) -> np.ndarray:
    """Per-row ``mean / std(ddof=1)`` of ``x`` [B, N]; NaN where the std is 0. The sums are NumPy's
    ``x.mean(axis=1)`` and ``x.std(axis=1, ddof=1)`` as they compute them (the same bits), the row sum
    taken once."""
    n = x.shape[1]
    mean = np.add.reduce(x, axis=1) / n
    d = x - mean[:, None]
    np.multiply(d, d, out=d)
    sd = np.sqrt(np.add.reduce(d, axis=1) / max(n - 1, 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > 0, mean / np.where(sd > 0, sd, 1.0), np.nan)


def resampled_sharpe(r, idx, rows: int = 64) -> np.ndarray:
    """float64 [B]: :func:`_sharpe_rows` of ``r[idx]`` for resamples ``idx`` [B, N], gathered ``rows``
    resamples at a time (the same values; the [B, N] gather is never made whole). All-zero returns (a
    flat policy) have Sharpe NaN in every resample without a gather."""
    r = np.asarray(r, dtype=np.float64)
    if not r.any():
        return np.full(len(idx), np.nan)
    return np.concatenate([_sharpe_rows(r[idx[i : i + rows]]) for i in range(0, len(idx), rows)])


def sharpe_interval(r, idx, periods_per_year: float, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of the annualised Sharpe over resamples ``idx`` [B, N]; NaN when the
    resampled Sharpe is undefined in more than half of them (constant returns)."""
    sr = resampled_sharpe(r, idx) * math.sqrt(periods_per_year)
    ok = sr[np.isfinite(sr)]
    if ok.size < sr.size / 2:
        return math.nan, math.nan
    a = (1.0 - level) / 2.0
    return float(np.quantile(ok, a)), float(np.quantile(ok, 1.0 - a))


def newey_west_se(d) -> float:
    """Standard error of ``mean(d)`` with Bartlett-kernel HAC variance, lag ``floor(4 (N / 100)^(2/9))``."""
    d = np.asarray(d, dtype=np.float64)
    n = d.size
    if n < 2:
        return math.nan
    x = d - d.mean()
    L = min(n - 1, int(4 * (n / 100.0) ** (2.0 / 9.0)))
    s = x @ x / n
    for k in range(1, L + 1):
        s += 2.0 * (1.0 - k / (L + 1)) * (x[k:] @ x[:-k]) / n
    return math.sqrt(max(s, 0.0) / n)


def paired_comparison(r, benchmark, idx, periods_per_year: float, level: float = LEVEL) -> dict:
    """Policy returns ``r`` against ``benchmark`` returns over the same bars, both [N].

    ``sharpe_difference``: annualised Sharpe of ``r`` minus that of ``benchmark`` (a flat policy or a
    constant benchmark counts as Sharpe 0), its percentile interval over the shared resamples ``idx``,
    and ``p_not_better`` = the share of resamples where the difference is <= 0. ``mean_excess`` = the mean
    per-bar difference ``r - benchmark``, with ``t_newey_west`` its Newey-West t statistic.
    """
    r, b = np.asarray(r, dtype=np.float64), np.asarray(benchmark, dtype=np.float64)
    ann = math.sqrt(periods_per_year)

    def sr0(v):  # constant returns: Sharpe 0 for the comparison (flat earns nothing, risks nothing)
        return np.where(np.isfinite(v), v, 0.0)

    diff = (sr0(resampled_sharpe(r, idx)) - sr0(resampled_sharpe(b, idx))) * ann
    point = float((sr0(_sharpe_rows(r[None])) - sr0(_sharpe_rows(b[None])))[0] * ann)
    a = (1.0 - level) / 2.0
    d = r - b
    se = newey_west_se(d)
    return {
        "sharpe_difference": point,
        "sharpe_difference_interval": [float(np.quantile(diff, a)), float(np.quantile(diff, 1.0 - a))],
        "p_not_better": float(np.mean(diff <= 0.0)),
        "mean_excess_per_bar": float(d.mean()),
        "t_newey_west": float(d.mean() / se) if se > 0 else math.nan,
    }


def return_statistics(
    r,
    periods_per_year: float,
    *,
    benchmark=None,
    trials: int = 1,
    trial_variance: float | None = None,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict:
    """Every statistic above for per-bar returns ``r`` [N] (and ``benchmark`` [N], e.g. buy-and-hold).

    Returns a dict: ``sharpe``, ``sharpe_se`` (annualised), ``sharpe_interval`` [low, high] at ``level``,
    ``block_length``, ``resamples``, ``skew``, ``kurtosis``, ``psr`` (against 0), ``dsr`` with
    ``trials``, ``expected_max_sharpe`` (annualised) and ``trial_variance``, ``versus_benchmark``
    (:func:`paired_comparison`) when a benchmark is given, and ``null_reasons`` for what is undefined.
    """
    r = np.asarray(r, dtype=np.float64)
    n, ann = r.size, math.sqrt(periods_per_year)
    sr = sharpe_per_bar(r)
    skew, kurt = moments(r)
    reasons = {}
    out = {"bars": int(n), "level": level, "trials": int(trials)}
    if not math.isfinite(sr):
        why = "fewer than 2 returns" if n < 2 else "the returns are constant (no position held: flat)"
        for k in ("sharpe", "sharpe_se", "sharpe_interval", "psr", "dsr", "expected_max_sharpe", "skew", "kurtosis"):
            reasons[k] = why
        out.update({k: math.nan for k in ("sharpe", "sharpe_se", "psr", "dsr", "expected_max_sharpe", "skew")})
        out.update({"kurtosis": math.nan, "sharpe_interval": None, "trial_variance": math.nan})
        out.update({"block_length": math.nan, "resamples": 0})
        reasons["block_length"] = reasons["trial_variance"] = why
    else:
        block = optimal_block_length(r)
        idx = stationary_bootstrap(n, block, resamples, seed)
        lo, hi = sharpe_interval(r, idx, periods_per_year, level)
        var = (1.0 / (n - 1)) if trial_variance is None else float(trial_variance)
        sr0 = expected_max_sharpe(trials, var)
        out.update(
            {
                "sharpe": sr * ann,
                "sharpe_se": sharpe_standard_error(sr, n, skew, kurt) * ann,
                "sharpe_interval": [lo, hi],
                "block_length": block,
                "resamples": resamples,
                "skew": skew,
                "kurtosis": kurt,
                "psr": probabilistic_sharpe_ratio(sr, n, skew, kurt, 0.0),
                "dsr": probabilistic_sharpe_ratio(sr, n, skew, kurt, sr0),
                "expected_max_sharpe": sr0 * ann,
                "trial_variance": var,
            }
        )
    if benchmark is not None:
        b = np.asarray(benchmark, dtype=np.float64)
        if b.shape != r.shape:
            raise ValueError(f"benchmark {b.shape} and returns {r.shape} differ")
        if n >= 2:
            block = optimal_block_length(r - b) if math.isfinite(sr) else optimal_block_length(b)
            idx = stationary_bootstrap(n, block, resamples, seed + 1)
            out["versus_benchmark"] = paired_comparison(r, b, idx, periods_per_year, level)
            out["versus_benchmark"]["block_length"] = block
        else:
            out["versus_benchmark"] = None
            reasons["versus_benchmark"] = "fewer than 2 returns"
    if reasons:
        out["null_reasons"] = reasons
    return out


def seed_summary(values, level: float = LEVEL) -> dict:
    """Mean, spread and interval of one result over seeds: ``n`` (finite values), ``mean``, ``sd``
    (ddof 1), ``interval`` (Student-t interval of the mean at ``level``), ``min``, ``max``, ``undefined``
    (how many were NaN, e.g. a flat policy's Sharpe)."""
    from scipy.stats import t as student_t  # here: its import is most of an evaluation's start

    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    ok = v[np.isfinite(v)]
    n = int(ok.size)
    out = {"n": n, "undefined": int(len(values) - n), "level": level}
    if n == 0:
        return {**out, "mean": math.nan, "sd": math.nan, "interval": None, "min": math.nan, "max": math.nan}
    mean = float(ok.mean())
    sd = float(ok.std(ddof=1)) if n > 1 else math.nan
    half = float(student_t.ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)) if n > 1 else math.nan
    return {
        **out,
        "mean": mean,
        "sd": sd,
        "interval": [mean - half, mean + half] if n > 1 else None,
        "min": float(ok.min()),
        "max": float(ok.max()),
    }
