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
import os
import threading
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


#: Block starts per bar above which :func:`stationary_bootstrap` draws one 32-bit uniform per bar
#: rather than the geometric gaps between starts (the cheaper of the two draws of the same process).
_PER_BAR_ABOVE = 1.0 / 8.0


def _chunk_rows(n: int) -> int:
    """Resamples of one chunk of draws: about 2^16 bars, so a chunk and what is made from it stay in cache."""
    return max(1, (1 << 16) // n)


def _chunk_blocks(n: int, block: float, resamples: int, seed: int, c: int) -> tuple:
    """``(r0, new, first, start)`` of chunk ``c``: :func:`stationary_bootstrap`'s rows ``r0 = c * rows ..``
    (:func:`_chunk_rows`) laid end to end, ``new`` bool [rows * n] marking the bars that start a block
    (every row's first does), ``first`` int64 [blocks] where they are, and ``start`` int32 [blocks] the
    bar each block starts from. Each chunk draws from a generator of its own, seeded by ``(seed, c)``:
    its marks then its starts. So chunks can be drawn in any order, or at once in threads, with the same
    bits (and the chunk size is part of the random stream)."""
    p = 1.0 / max(block, 1.0)
    rng = np.random.default_rng([int(seed), 0xB007, int(c)])
    rows = _chunk_rows(n)
    r0 = c * rows
    m = min(rows, resamples - r0) * n  # the chunk's rows laid end to end
    if p >= 1.0:
        new = np.ones(m, bool)
    elif p > _PER_BAR_ABOVE:
        below = np.uint32(min(round(p * 2.0**32), 2**32 - 1))  # P(u32 < below) = p to within 2^-33
        new = rng.bit_generator.random_raw((m + 1) // 2).view(np.uint32)[:m] < below
    else:  # the gaps between starts: 1 + floor(log(1 - U) / log(1 - p)), geometric with mean 1 / p
        log_q = math.log1p(-p)
        new = np.zeros(m, bool)
        at = 0
        while at < m:
            mean = (m - at) * p
            gap = np.log1p(-rng.random(int(mean + 6.0 * math.sqrt(mean) + 16)))
            gap /= log_q
            pos = np.cumsum(np.minimum(gap, m).astype(np.int64) + 1) + at
            at = int(pos[-1])
            new[pos[pos < m]] = True
    new[::n] = True  # every resample starts a block
    first = np.flatnonzero(new)
    return r0, new, first, rng.integers(0, n, first.size, dtype=np.int32)


def _chunks(n: int, resamples: int) -> range:
    """The chunk numbers of ``resamples`` resamples of ``n`` bars."""
    return range(-(-resamples // _chunk_rows(n)))


def _bootstrap_blocks(n: int, block: float, resamples: int, seed: int):
    """Yield :func:`_chunk_blocks` of every chunk, in order."""
    for c in _chunks(n, resamples):
        yield _chunk_blocks(n, block, resamples, seed, c)


#: Threads :func:`bootstrap_sharpes` draws and sums chunks in (NumPy lets go of the GIL in its loops)
_POOL: list = []


def _pool():
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="cudarl-bootstrap"))
    return _POOL[0]


def _bootstrap_chunks(n: int, block: float, resamples: int, seed: int):
    """Yield ``(r0, idx)``: :func:`stationary_bootstrap`'s rows ``r0 .. r0 + len(idx)`` as int32
    ``[k, n]``, a chunk of :func:`_bootstrap_blocks` at a time. ``idx`` is one buffer written over for
    each chunk: copy what must outlive the next."""
    rows = _chunk_rows(n)
    buf = np.empty(rows * n, np.int32)
    bar = np.arange(rows * n, dtype=np.int32)
    wrapped = np.empty(rows * n, np.int32)
    for r0, new, first, start in _bootstrap_blocks(n, block, resamples, seed):
        m = new.size
        # delta[j] = start - first bar of block j - 1 (delta[0] unused): bar t of that block is
        # start + (t - first), before the wrap
        delta = np.zeros(first.size + 1, np.int32)
        np.subtract(start, first, out=delta[1:], casting="unsafe")  # |values| < 2^31
        o = buf[:m]
        np.cumsum(new, dtype=np.int32, out=o)  # block number + 1 of each bar
        np.take(delta, o, out=o, mode="clip")  # in range; "raise" would buffer
        o += bar[:m]  # start + offset, in [0, 2 n)
        # the wrap: as uint32, o - n is o - n where o >= n and above 2^31 > o where o < n
        np.subtract(o, n, out=wrapped[:m])
        np.minimum(o.view(np.uint32), wrapped[:m].view(np.uint32), out=o.view(np.uint32))
        yield r0, o.reshape(-1, n)


def stationary_bootstrap(n: int, block: float, resamples: int, seed: int = 0) -> np.ndarray:
    """int32 [resamples, n]: indices of stationary-bootstrap resamples of ``n`` bars (Politis and Romano
    1994): blocks of consecutive bars (wrapping from ``n - 1`` to 0) whose lengths are geometric with
    mean ``block`` (at least 1), each from a uniform start; every resample starts a block. Each bar
    after the first of a resample starts a block with probability ``p = 1 / block``, independently.

    Deterministic in ``(n, block, resamples, seed)``. Drawn with one random number per block, not two
    per bar: where ``p > 1/8`` a 32-bit uniform per bar (``p`` held to within ``2^-33``) marks the
    starts, otherwise the geometric gaps between them (one double each); then one int32 start, uniform
    over ``[0, n)``, per block. The draws come in chunks of about 2^16 bars, each chunk from a generator
    seeded by ``(seed, chunk)`` (:func:`_chunk_blocks`), so :func:`bootstrap_sharpes` draws chunks in
    threads with the same bits. (Each change of the random stream changed the indices, and the bootstrap
    intervals of an evaluation, with it: before, one generator drew every chunk in turn; before that, a
    double and an int32 were drawn for every bar, the start used only where a block began.)"""
    out = np.empty((resamples, n), np.int32)
    for r0, idx in _bootstrap_chunks(n, block, resamples, seed):
        out[r0 : r0 + len(idx)] = idx
    return out


def _sharpe_rows(x) -> np.ndarray:
    """Per-row ``mean / std(ddof=1)`` of ``x`` [B, N]; NaN where a row is constant (as
    :func:`sharpe_per_bar`) or its std is 0, and for fewer than 2 columns. The sums are NumPy's
    ``x.mean(axis=1)`` and ``x.std(axis=1, ddof=1)`` as they compute them (the same bits), the row sum
    taken once. (A constant row's std is not always 0 in floating point: 300 times 0.1 has mean
    0.1 + 1.4e-17, std 1.4e-17 and "Sharpe" 7e15; it is NaN here.)"""
    n = x.shape[1]
    if n < 2:
        return np.full(x.shape[0], np.nan)
    mean = np.add.reduce(x, axis=1) / n
    flat = np.maximum.reduce(x, axis=1) == np.minimum.reduce(x, axis=1)
    d = x - mean[:, None]
    np.multiply(d, d, out=d)
    sd = np.sqrt(np.add.reduce(d, axis=1) / (n - 1))
    ok = (sd > 0) & ~flat
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, mean / np.where(ok, sd, 1.0), np.nan)


def resampled_sharpe(r, idx, rows: int = 16) -> np.ndarray:
    """float64 [B]: :func:`_sharpe_rows` of ``r[idx]`` for resamples ``idx`` [B, N], gathered ``rows``
    resamples at a time into one buffer (the same values; the [B, N] gather is never made whole). All-zero
    returns (a flat policy) have Sharpe NaN in every resample without a gather. The reference that
    :func:`bootstrap_sharpes` (an evaluation's intervals) is tested against."""
    r = np.asarray(r, dtype=np.float64)
    if not r.any():
        return np.full(len(idx), np.nan)
    buf = np.empty((min(rows, len(idx)), r.size))
    out = []
    for i in range(0, len(idx), rows):
        part = idx[i : i + rows]
        out.append(_sharpe_rows(np.take(r, part, out=buf[: len(part)], mode="clip")))  # in range; "raise" buffers
    return np.concatenate(out or [[]])


#: float64's unit roundoff: a sum's rounding is at most this times its magnitude.
_U = 2.0**-53


def _prefix_table(x) -> tuple[np.ndarray, float, float, float]:
    """``(t, mean, err1, err2)`` for returns ``x`` [n] (n >= 2) centred on their mean, ``c = x - mean(x)``,
    taken twice round the circle: ``t`` complex128 [2 n], ``t[i] = P1[i] + 1j P2[i]`` with ``P1``,
    ``P2`` the prefix sums of ``c`` and ``c^2`` over bars ``0 .. i - 1``, so a block of ``L <= n`` bars
    from ``s < n`` sums to ``t[s + L] - t[s]`` (both parts). ``err1``, ``err2``: bounds on the rounding
    of one block's sum in the two parts and of its share of a resample's sum (J blocks: J times these):
    a running sum rounds each partial sum ``P`` by at most ``u |P|``, so ``|P1[i] error| <= u A1`` with
    ``A1 = sum |P1|``, a difference adds ``u`` of itself, a sum of J terms ``(J - 1) u`` of their
    absolute sum (at most ``n max |c|``): ``err1 = u (2 A1 + n max |c|)`` (and ``P2``, ``c^2`` the same)."""
    n, mean = x.size, float(x.mean())
    c = x - mean
    twice = np.concatenate([c, c[:-1]])
    t = np.empty(2 * n, np.complex128)
    t[0] = 0.0
    np.cumsum(twice, out=t.real[1:])
    np.multiply(twice, twice, out=twice)
    np.cumsum(twice, out=t.imag[1:])
    err1 = _U * (2.0 * float(np.abs(t.real).sum()) + n * float(np.abs(c).max()))
    err2 = _U * (2.0 * float(t.imag.sum()) + n * float(twice.max()))
    return t, mean, err1, err2


def bootstrap_sharpes(series, block: float, resamples: int, seed: int = 0) -> np.ndarray:
    """float64 [len(series), resamples]: the per-bar Sharpe of each of ``series`` (each float64 [N])
    over the same :func:`stationary_bootstrap` resamples ``(N, block, resamples, seed)``, from its
    blocks, not its bars: the same blocks (the same draws), each summed as the difference of two
    circular prefix sums of the returns centred on their mean (and of their squares), a resample's
    sum the sum of its blocks', so each resample costs its blocks (about ``N / block``), not ``N``
    gathers. The reference is :func:`resampled_sharpe` of the resamples' indices: these values are not
    its bits (the sums are taken another way), but a test holds them to it within 1e-9 relative (or
    1e-10 of the Sharpe's standard error ``1 / sqrt(N)``, near 0) on normal, heavy-tailed, mostly
    flat, short and long series.

    NaN where the reference is, exactly: a resample whose centred variance does not exceed four times
    a bound on its rounding (:func:`_prefix_table`; every constant resample, which the reference
    makes NaN, and any near it) is gathered and computed by the reference instead. All-zero returns
    (a flat policy) and fewer than 2 bars are NaN without a draw."""
    series = [np.asarray(s, dtype=np.float64) for s in series]
    n = series[0].size
    out = np.full((len(series), resamples), np.nan)
    live = [i for i, s in enumerate(series) if s.any()]  # all zeros: NaN without a draw
    if not live or n < 2:
        return out
    tables = [_prefix_table(series[i]) for i in live]
    sums = np.empty((len(live), resamples), np.complex128)
    blocks = np.empty(resamples, np.int64)  # each resample's

    size = _chunk_rows(n) * n
    local = threading.local()  # each thread's buffers, made once: fresh large arrays fault in their pages

    def chunk(c: int) -> None:  # writes only its own columns of sums and blocks
        r0, new, first, start = _chunk_blocks(n, block, resamples, seed, c)
        k, J = new.size // n, first.size
        if not hasattr(local, "e"):
            local.e, local.d, local.ds = (
                np.empty(size, np.intp),
                np.empty(size, np.complex128),
                np.empty(size, np.complex128),
            )
        e, d, ds = local.e[:J], local.d[:J], local.ds[:J]  # e: one past each block's last bar, in [1, 2 n)
        np.subtract(first[1:], first[:-1], out=e[: J - 1])
        e[J - 1] = new.size - first[J - 1]
        e += start
        heads = np.searchsorted(first, np.arange(0, k * n, n))  # each resample's first block
        np.subtract(heads[1:], heads[:-1], out=blocks[r0 : r0 + k - 1])
        blocks[r0 + k - 1] = J - heads[-1]
        for j, (t, _, _, _) in enumerate(tables):
            np.take(t, e, out=d, mode="clip")  # in range; "raise" would buffer
            np.subtract(d, np.take(t, start, out=ds, mode="clip"), out=d)
            sums[j, r0 : r0 + k] = np.add.reduceat(d, heads)

    list(_pool().map(chunk, _chunks(n, resamples)))  # raises what a chunk raised
    s1, s2 = sums.real, sums.imag
    mean_c = s1 / n
    q = s2 - s1 * mean_c  # (n - 1) times the variance
    means, e1, e2 = (np.array([[t[i]] for t in tables]) for i in (1, 2, 3))
    e1, e2 = blocks * e1, blocks * e2
    bound = e2 + (2.0 * np.abs(s1) + e1) * e1 / n + 4.0 * _U * (s2 + np.abs(s1 * mean_c))
    ok = q > 4.0 * bound  # not constant; NaN (non-finite returns) fails too
    with np.errstate(divide="ignore", invalid="ignore"):
        out[live] = np.where(ok, (means + mean_c) / np.sqrt(np.where(ok, q, 1.0) / (n - 1)), np.nan)
    if not ok.all():  # the reference for these: draw the same resamples again, as indices
        last = int(np.flatnonzero(~ok.all(axis=0))[-1])
        for r0, idx in _bootstrap_chunks(n, block, resamples, seed):  # not last + 1: a chunk's draws depend on its size
            if r0 > last:
                break
            for j, i in enumerate(live):
                here = np.flatnonzero(~ok[j, r0 : r0 + len(idx)])
                if here.size:
                    out[i, r0 + here] = _sharpe_rows(series[i][idx[here]])
    return out


def _percentile_interval(v, level: float) -> tuple[float, float]:
    a = (1.0 - level) / 2.0
    return float(np.quantile(v, a)), float(np.quantile(v, 1.0 - a))


def _interval_of(resampled, periods_per_year: float, level: float) -> tuple[float, float]:
    """:func:`sharpe_interval` from the per-bar Sharpe of each resample."""
    sr = resampled * math.sqrt(periods_per_year)
    ok = sr[np.isfinite(sr)]
    if ok.size < sr.size / 2:
        return math.nan, math.nan
    return _percentile_interval(ok, level)


def sharpe_interval(r, idx, periods_per_year: float, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of the annualised Sharpe over resamples ``idx`` [B, N]; NaN when the
    resampled Sharpe is undefined in more than half of them (constant returns)."""
    return _interval_of(resampled_sharpe(r, idx), periods_per_year, level)


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
    return _paired(r, benchmark, resampled_sharpe(r, idx), resampled_sharpe(benchmark, idx), periods_per_year, level)


def _paired(r, benchmark, sr_r, sr_b, periods_per_year: float, level: float) -> dict:
    """:func:`paired_comparison` from the per-bar Sharpe of each resample of ``r`` and of ``benchmark``."""
    r, b = np.asarray(r, dtype=np.float64), np.asarray(benchmark, dtype=np.float64)
    ann = math.sqrt(periods_per_year)

    def sr0(v):  # constant returns: Sharpe 0 for the comparison (flat earns nothing, risks nothing)
        return np.where(np.isfinite(v), v, 0.0)

    diff = (sr0(sr_r) - sr0(sr_b)) * ann
    point = float((sr0(_sharpe_rows(r[None])) - sr0(_sharpe_rows(b[None])))[0] * ann)
    d = r - b
    se = newey_west_se(d)
    return {
        "sharpe_difference": point,
        "sharpe_difference_interval": list(_percentile_interval(diff, level)),
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
        lo, hi = _interval_of(bootstrap_sharpes([r], block, resamples, seed)[0], periods_per_year, level)
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
            sr_r, sr_b = bootstrap_sharpes([r, b], block, resamples, seed + 1)
            out["versus_benchmark"] = _paired(r, b, sr_r, sr_b, periods_per_year, level)
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
