"""Causal market features from a registry, and a normaliser fitted on the training split only.

Every feature at bar ``t`` is a function of bars ``0..t`` alone (tests/unit/test_features.py
changes every bar after ``t`` and checks that rows ``0..t`` do not move). Exponential
averages run forward through a first-order recursive filter (``scipy.signal.lfilter``, or the
same recurrence in Python for shorter series: :func:`ewm_mean`), which cannot look ahead; nothing
is centred, back-filled or smoothed in both directions.

:data:`FEATURES` maps a group name to a small pure function ``(ctx, config) -> [(name, column)]``
(each column float64 [T]; ``ctx`` a :class:`FeatureContext`); each built-in one documents its
equation. ``FeatureConfig.groups`` picks which groups :func:`compute` runs and in what order, and
:func:`register_feature` adds your own. The agent's position is appended by the environment at
run time (:func:`with_position`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cudarl.data.bars import NS_PER_DAY, Bars

POSITION_FEATURES = ("position",)
#: Rows a block of :func:`compute` and :meth:`Normaliser.transform` (a few MB of float64).
_ROWS_PER_BLOCK = 16384
SIGMA_FLOOR = 1e-8


@dataclass(frozen=True)
class Features:
    """``values`` float32 [T, F] (rows before ``warmup`` are zeros), ``names`` F strings."""

    values: np.ndarray
    names: tuple
    warmup: int


#: Up to this many bars :func:`ewm_mean` runs its recurrence in Python (about 0.2 us a bar and
#: series) rather than through ``scipy.signal.lfilter``, whose import alone takes most of a second
#: (evaluating a policy on 10,000 bars would spend most of its time on it). The two give the
#: same bits (tests/unit/test_features.py), and the choice depends on the length alone, so a
#: series gets the same features in training and in evaluation.
EW_LOOP_MAX_BARS = 1 << 18


def ewm_mean(x: np.ndarray, halflife: float, present: np.ndarray | None = None) -> np.ndarray:
    """Causal, bias-corrected EW mean, float64 [T]: ``sum_s<=t w_s x_s / sum_s<=t w_s``.

    ``w_s = (1 - a)^(t - s)`` for present rows, ``a = 1 - 2^(-1/halflife)``; rows with
    ``present`` False carry no weight (NaN before the first present row).
    """
    a = 1.0 - 0.5 ** (1.0 / halflife)
    present = np.ones(len(x), dtype=bool) if present is None else present
    w = present.astype(np.float64)
    xs = np.where(present, x, 0.0)
    if len(x) <= EW_LOOP_MAX_BARS:
        num, den = ew_filter_loop(xs, w, a)
    else:
        from scipy.signal import lfilter  # here, not at the top: importing scipy.signal takes ~0.9 s

        num, den = (lfilter([a], [1.0, a - 1.0], v) for v in (xs, w))
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def ew_filter_loop(x: np.ndarray, w: np.ndarray, a: float) -> tuple:
    """``y_t = a x_t + (1 - a) y_{t-1}``, ``y_{-1} = 0``, of float64 [T] ``x`` and of ``w`` (a Python
    loop over the rows), bit for bit as ``scipy.signal.lfilter([a], [1, a - 1], x)`` computes it: its
    direct form II transposed, ``y_t = z + a x_t``, then ``z = 0 x_t - (a - 1) y_t``.

    ``w`` is a presence weight: 0 or 1. Once ``w`` holds 1 to its end and the state ``z`` repeats, every
    later ``y`` repeats too (the same operations on the same operands), so the rest is filled: the
    weights of a series with every row present cost ~50 half-lives of loop, not ``T`` rows."""
    c1 = a - 1.0
    return np.array(_ew_filter(x.tolist(), a, c1)), np.array(_ew_filter(w.tolist(), a, c1, settles=_ones_from(w)))


def _ones_from(w: np.ndarray) -> int:
    """The first index from which ``w`` is 1.0 to its end (``len(w)`` if its last row is not 1)."""
    not_one = np.flatnonzero(w != 1.0)
    return 0 if not_one.size == 0 else int(not_one[-1]) + 1


def _ew_filter(xs: list, a: float, c1: float, settles: int | None = None) -> list:
    """:func:`ew_filter_loop`'s recurrence over ``xs`` (floats). From index ``settles`` on (every input
    1.0 there) it stops at the first repeated state and fills the rest with the ``y`` that repeats:
    ``y = z + a`` of an equal ``z`` (a zero of either sign gives ``a``) is the same bits."""
    n = len(xs) if settles is None else min(settles, len(xs))
    out = []
    push = out.append
    z = 0.0
    for u in xs[:n]:
        y = z + a * u
        z = u * 0.0 - y * c1
        push(y)
    for t in range(n, len(xs)):  # xs[t] == 1.0: a * u is a, u * 0.0 is 0.0
        y = z + a
        push(y)
        z_next = 0.0 - y * c1
        if z_next == z:
            return out + [y] * (len(xs) - t - 1)
        z = z_next
    return out


@dataclass(frozen=True)
class FeatureContext:
    """What several features share, computed once per :func:`compute`; arrays [T], each causal.

    ``close``, ``open``, ``high``, ``low`` (C, O, H, L) float64; ``log_close`` log C_t; ``r`` the
    1-bar log returns ``r_t = log(C_t / C_{t-1})``, ``r_0 = 0``; ``sigma`` the volatility
    ``sigma_t = sqrt(max(EW mean of r_s^2 over 1 <= s <= t, SIGMA_FLOOR^2))`` (:func:`ewm_mean`,
    half-life ``vol_halflife``; NaN at t = 0); ``time`` int64 ns UTC; ``bars`` the bars themselves
    (``volume``, ``extra``).
    """

    bars: Bars
    close: np.ndarray
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    log_close: np.ndarray
    r: np.ndarray
    sigma: np.ndarray
    time: np.ndarray

    @classmethod
    def of(cls, bars: Bars, config: FeatureConfig) -> FeatureContext:
        T = len(bars)
        c, o, h, low = (np.asarray(getattr(bars, k), dtype=np.float64) for k in ("close", "open", "high", "low"))
        logc = np.log(c)
        r = np.zeros(T)
        r[1:] = np.diff(logc)
        sigma = np.sqrt(np.maximum(ewm_mean(r * r, config.vol_halflife, np.arange(T) >= 1), SIGMA_FLOOR**2))
        return cls(bars, c, o, h, low, logc, r, sigma, np.asarray(bars.time, dtype=np.int64))


#: A feature: ``(ctx, config) -> [(column name, values float64 [T])]``, row t a function of bars 0..t.
FeatureFn = Callable[[FeatureContext, "FeatureConfig"], list]


def returns(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``ret_<h>`` = log(C_t / C_{t-h}) / (sigma_t sqrt(h)) for each h of ``horizons`` (0 for t < h)."""
    out = []
    for hz in config.horizons:
        lr = np.zeros(len(ctx.log_close))
        lr[hz:] = ctx.log_close[hz:] - ctx.log_close[:-hz]
        out.append((f"ret_{hz}", lr / (ctx.sigma * math.sqrt(hz))))
    return out


def log_vol(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``log_vol`` = log(sigma_t)."""
    return [("log_vol", np.log(ctx.sigma))]


def bar_range(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``range`` = log(H_t / L_t) / sigma_t."""
    return [("range", np.log(ctx.high / ctx.low) / ctx.sigma)]


def body(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``body`` = log(C_t / O_t) / sigma_t."""
    return [("body", np.log(ctx.close / ctx.open) / ctx.sigma)]


def close_loc(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``close_loc`` = (2 C_t - H_t - L_t) / (H_t - L_t), in [-1, 1] (0 when H = L)."""
    c, h, low = ctx.close, ctx.high, ctx.low
    span = h - low
    return [("close_loc", np.where(span > 0, (2 * c - h - low) / np.where(span > 0, span, 1.0), 0.0))]


def volume(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``volume`` = (log1p V_t - m_t) / s_t, m and s^2 the EW mean and variance of log1p V up to t
    (half-life ``volume_halflife``; 0 where s^2 <= 1e-12). Nothing when the bars have no volume."""
    if ctx.bars.volume is None:
        return []
    lv = np.log1p(np.asarray(ctx.bars.volume, dtype=np.float64))
    m = ewm_mean(lv, config.volume_halflife)
    var = np.maximum(ewm_mean(lv * lv, config.volume_halflife) - m * m, 0.0)
    return [("volume", np.where(var > 1e-12, (lv - m) / np.sqrt(np.maximum(var, 1e-12)), 0.0))]


def calendar(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``dow_sin``, ``dow_cos`` = sin, cos(2 pi d / 7), d the UTC day of week (Monday 0); for intraday
    bars (``time_of_day``) also ``hod_sin``, ``hod_cos`` = sin, cos(2 pi f), f the UTC fraction of
    the day. Nothing when ``time_features`` is off."""
    t = ctx.time
    if not config.time_features or not len(t):
        return []
    days = np.floor_divide(t, NS_PER_DAY)
    dow = (days + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    out = [("dow_sin", np.sin(2 * np.pi * dow / 7)), ("dow_cos", np.cos(2 * np.pi * dow / 7))]
    intraday = (
        config.time_of_day
        if config.time_of_day is not None
        else bool(len(t) >= 2 and np.median(np.diff(t)) < NS_PER_DAY)
    )
    if intraday:
        frac = (t - days * NS_PER_DAY) / NS_PER_DAY
        out += [("hod_sin", np.sin(2 * np.pi * frac)), ("hod_cos", np.cos(2 * np.pi * frac))]
    return out


def level(ctx: FeatureContext, config: FeatureConfig) -> list:
    """``level_<h>`` = (log C_t - m_t) / (sigma_t sqrt(h)) for each h of ``level_halflives``, ``m_t`` the
    causal EW mean of log C up to t with half-life h (:func:`ewm_mean`): how far the price is from its
    recent average, in units of the volatility over h bars (a mean-reversion or trend state that no sum
    of recent returns gives). Not in the default groups."""
    return [
        (f"level_{h:g}", (ctx.log_close - ewm_mean(ctx.log_close, h)) / (ctx.sigma * math.sqrt(h)))
        for h in config.level_halflives
    ]


def extra(ctx: FeatureContext, config: FeatureConfig) -> list:
    """The columns of ``bars.extra`` named in ``config.extra``, as given, in that order (``["*"]``: every
    one, in sorted order). Nothing by default: a synthetic market's answer columns (its hidden state)
    stay out of the observation."""
    if config.extra == ("*",):
        return [(k, np.asarray(ctx.bars.extra[k], dtype=np.float64)) for k in sorted(ctx.bars.extra)]
    missing = [k for k in config.extra if k not in ctx.bars.extra]
    if missing:
        raise ValueError(
            f"features.extra names {missing}, which {ctx.bars.source} does not have; "
            f"its extra columns are {sorted(ctx.bars.extra)}"
        )
    return [(k, np.asarray(ctx.bars.extra[k], dtype=np.float64)) for k in config.extra]


#: The feature registry (STYLE.md: a dict, not an if/elif chain): group name -> :data:`FeatureFn`.
FEATURES: dict[str, FeatureFn] = {
    "returns": returns,
    "log_vol": log_vol,
    "range": bar_range,
    "body": body,
    "close_loc": close_loc,
    "volume": volume,
    "time": calendar,
    "extra": extra,
    "level": level,
}
#: The built-in groups (their names cannot be registered again).
BUILTIN = tuple(FEATURES)
#: The groups computed by default, in order.
DEFAULT_GROUPS = ("returns", "log_vol", "range", "body", "close_loc", "volume", "time", "extra")
#: Features added by :func:`register_feature` -> whether their columns are signed.
REGISTERED: dict[str, bool] = {}


def _check_groups(groups) -> None:
    if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
        raise ValueError(f"groups must be a list of feature names, got {groups!r}")
    unknown = [g for g in groups if g not in FEATURES]
    if unknown:
        raise ValueError(
            f"unknown feature group(s) {unknown}; known: {list(FEATURES)} "
            "(cudarl.features.register_feature adds your own)"
        )
    if not groups or len(set(groups)) != len(groups):
        raise ValueError(f"groups must name each feature once, and at least one, got {list(groups)}")


@dataclass(frozen=True)
class FeatureConfig:
    """What :func:`compute` builds."""

    groups: tuple = DEFAULT_GROUPS
    """Feature groups (``cudarl.features.FEATURES``) computed, in this order; the default is every
    built-in one except ``level``. Add your own with ``cudarl.features.register_feature`` (docs/guide.md).
    ``time_features = false`` still leaves the time columns out, and the ``extra`` group adds only the
    columns ``extra`` names."""
    horizons: tuple = (1, 4, 16, 64)
    """Log-return horizons in bars (each >= 1)."""
    level_halflives: tuple = (32, 128, 512)
    """Half-lives, in bars, of the price averages the ``level`` group measures the price against (each > 0)."""
    vol_halflife: float = 32.0
    """Half-life, in bars, of the volatility that normalises returns and ranges."""
    volume_halflife: float = 64.0
    """Half-life, in bars, of the volume mean and spread."""
    time_features: bool = True
    """Day-of-week (and, for intraday bars, time-of-day) as sine and cosine."""
    time_of_day: bool | None = None
    """Time-of-day columns; ``None``: on when the series' median spacing is under a day.
    (That choice names columns once per series; it never changes a value.)"""
    extra: tuple = ()
    """Columns of ``bars.extra`` appended as features, by name (e.g. ``["next_return"]``, the leak of
    ``builtin:canary``), or ``["*"]`` for every one. None by default: the synthetic markets' extra
    columns are their answers (hidden state, conditional mean), for evaluation only."""
    signed_extra: tuple = ("regime", "next_return", "drift", "deviation")
    """Extra columns whose sign follows the market's direction (negated by the env's mirror)."""

    def __post_init__(self):
        _check_groups(self.groups)
        object.__setattr__(self, "groups", tuple(self.groups))
        if not self.horizons or min(self.horizons) < 1:
            raise ValueError(f"horizons must be >= 1, got {self.horizons}")
        if self.vol_halflife <= 0 or self.volume_halflife <= 0 or min(self.level_halflives, default=1) <= 0:
            raise ValueError("half-lives must be > 0")
        if isinstance(self.extra, (bool, str)) or not all(isinstance(k, str) for k in self.extra):
            raise ValueError(
                f"extra names the extra columns to use as features (a list of names, e.g. ['next_return']), "
                f"got {self.extra!r}"
            )
        if len(set(self.extra)) != len(tuple(self.extra)) or ("*" in self.extra and len(self.extra) > 1):
            raise ValueError(f"extra must name each column once (or be ['*'] alone), got {list(self.extra)}")
        object.__setattr__(self, "extra", tuple(self.extra))

    @property
    def warmup(self) -> int:
        """Bars before the first row whose every feature is defined and settled."""
        return int(max(max(self.horizons), math.ceil(self.vol_halflife)))


def register_feature(name: str, fn: FeatureFn, *, signed: bool = False) -> FeatureFn:
    """Add ``fn`` to :data:`FEATURES` as group ``name`` (then ``FeatureConfig(groups=(..., name))``).

    ``fn(ctx, config)`` returns ``[(column, values [T])]`` with each column named ``name`` or
    ``name_<suffix>``. It must be causal (row t from bars 0..t only; nothing can check that for
    you, so test it as tests/unit/test_features.py does) and finite after the first
    ``config.warmup`` rows, which are zeroed. ``signed``: the columns' sign follows the market's
    direction (a momentum, not a volatility), so :func:`return_sign` marks them and the env's
    mirror negates them. Registering a name again replaces it; built-in names are refused.
    Returns ``fn``.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a feature name must be an identifier, got {name!r}")
    if name in BUILTIN:
        raise ValueError(f"{name!r} is a built-in feature; pick another name")
    if not callable(fn):
        raise TypeError(f"feature {name!r}: fn must be callable, got {fn!r}")
    FEATURES[name] = fn
    REGISTERED[name] = bool(signed)
    return fn


def _builtin_signed(name: str, config: FeatureConfig) -> bool:
    return name.startswith(("ret_", "level_")) or name in {"body", "close_loc", *config.signed_extra}


def _signed(name: str, config: FeatureConfig) -> bool:
    return _builtin_signed(name, config) or any(
        REGISTERED.get(k) and (name == k or name.startswith(k + "_")) for k in config.groups
    )


def _columns(group: str, ctx: FeatureContext, config: FeatureConfig) -> list:
    """``[(group, column name, values float64 [T])]`` of one group, checked."""
    out = []
    for item in FEATURES[group](ctx, config):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"feature {group!r} must return [(column name, values)], got an item {item!r:.80}")
        name, col = item[0], np.asarray(item[1], dtype=np.float64)
        if col.shape != ctx.close.shape:
            raise ValueError(
                f"feature {group!r}: column {name!r} has shape {col.shape}, expected {ctx.close.shape} "
                "(one value per bar)"
            )
        if group not in BUILTIN and name != group and not name.startswith(group + "_"):
            raise ValueError(f"feature {group!r}: column {name!r} must be named {group!r} or '{group}_<suffix>'")
        out.append((group, name, col))
    return out


def compute(bars: Bars, config: FeatureConfig = FeatureConfig()) -> Features:
    """The columns of each of ``config.groups`` in order (see :data:`FEATURES`); float32 [T, F].

    Rows before ``config.warmup`` are zeros; any other non-finite value, a column of the wrong
    length, a repeated column name, or a column that :func:`return_sign` would misread is an error.
    """
    _check_groups(config.groups)  # a registration may have gone since the config was built
    T = len(bars)
    with np.errstate(invalid="ignore", divide="ignore"):
        ctx = FeatureContext.of(bars, config)
        cols = [c for g in config.groups for c in _columns(g, ctx, config)]
    groups, names = [g for g, _, _ in cols], [n for _, n, _ in cols]
    for j, (g, n) in enumerate(zip(groups, names, strict=True)):
        if n in names[:j]:
            raise ValueError(f"column {n!r} of feature {g!r} repeats a name of feature {groups[names.index(n)]!r}")
        want = REGISTERED[g] if g in REGISTERED else _builtin_signed(n, config)
        if _signed(n, config) != want:
            raise ValueError(
                f"return_sign goes by names and would call column {n!r} of feature {g!r} "
                f"{'unsigned' if want else 'signed'}; rename it (signed: ret_*, level_*, body, close_loc, "
                "features.signed_extra and the columns of features registered signed)"
            )
    values = np.empty((T, len(cols)), np.float32)
    warm = min(config.warmup, T)
    # Row blocks, so the float64 [T, F] matrix never exists whole (4M bars: 2 GB, then a float32
    # copy); each block is stacked, checked and rounded to float32 as the whole matrix was.
    for r0 in range(0, T, _ROWS_PER_BLOCK):
        block = np.stack([v[r0 : r0 + _ROWS_PER_BLOCK] for _, _, v in cols], axis=1) if cols else values[r0:r0]
        block[: max(0, warm - r0)] = 0.0
        bad = ~np.isfinite(block)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(
                f"feature {names[j]!r} (group {groups[j]!r}) is not finite at bar {r0 + i}, after the "
                f"{warm}-bar warm-up; were the bars validated?"
            )
        values[r0 : r0 + len(block)] = block
    return Features(values=values, names=tuple(names), warmup=config.warmup)


def return_sign(names, config: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """bool [F]: True for features whose sign follows the market's direction.

    Mirroring the market (negating every log price) negates ``ret_<h>``, ``body``,
    ``close_loc``, the extras named in ``config.signed_extra`` and the columns of the features of
    ``config.groups`` registered with ``signed=True``; it leaves volatility, range, volume and time unchanged. The
    env's directional mirror negates exactly these columns. (It goes by names; :func:`compute`
    refuses a column it would misread.)
    """
    return np.array([_signed(n, config) for n in names], dtype=bool)


def with_position(x: np.ndarray, position: np.ndarray) -> np.ndarray:
    """float32 [N, F + 1]: features ``x`` [N, F] with the held position [N] appended."""
    x = np.asarray(x, dtype=np.float32)
    return np.concatenate([x, np.asarray(position, dtype=np.float32).reshape(-1, 1)], axis=1)


@dataclass
class Normaliser:
    """Per-feature z-scoring with clipping; statistics come from the training split only.

    ``mean``, ``std`` float64 [F]; ``transform`` returns float32 ``clip((x - mean) / std)``.
    A feature constant over the training split gets ``std = 1``.
    """

    mean: np.ndarray
    std: np.ndarray
    names: tuple = ()
    clip: float = 5.0
    fitted_on: tuple = field(default=(0, 0))

    @classmethod
    def fit(cls, features: Features, train, clip: float = 5.0, center=None) -> Normaliser:
        """Fit on the rows of the training split ``train`` (a :class:`cudarl.splits.Split`
        or ``(start, stop)``), skipping rows before ``features.warmup``. Reads nothing else.

        ``center`` bool [F] (default all True): where False the mean is taken as 0 and the
        scale is the root mean square, so ``transform(-x) == -transform(x)`` for that column
        (pass ``~return_sign(names)``, so the env's mirror of a normalised row is exact)."""
        start, stop = (train.start, train.stop) if hasattr(train, "start") else train
        start = max(int(start), features.warmup)
        if stop - start < 2:
            raise ValueError(f"the training split [{start}, {stop}) has fewer than 2 rows after the warm-up")
        x = np.array(features.values[start:stop], dtype=np.float64)  # a copy, overwritten below
        keep = np.ones(x.shape[1], bool) if center is None else np.asarray(center, bool)
        if keep.shape != (x.shape[1],):
            raise ValueError(f"center must be bool [{x.shape[1]}], got shape {keep.shape}")
        mean = np.where(keep, x.mean(axis=0), 0.0)
        x -= mean  # in place: (x - mean) ** 2 as two more float64 copies cost seconds at 4M bars
        np.multiply(x, x, out=x)
        std = np.sqrt(x.mean(axis=0))
        std = np.where(std > 1e-12, std, 1.0)
        return cls(mean=mean, std=std, names=tuple(features.names), clip=float(clip), fitted_on=(start, int(stop)))

    def transform(self, x) -> np.ndarray:
        """float32 [..., F]: ``clip((x - mean) / std)``, computed in float64, then rounded."""
        x = np.asarray(x)
        if x.size == 0:
            return np.zeros(x.shape, np.float32)
        rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
        out = np.empty(rows.shape, np.float32)
        for r0 in range(0, len(rows), _ROWS_PER_BLOCK):  # blocks: no float64 copies of a 4M-bar matrix
            z = rows[r0 : r0 + _ROWS_PER_BLOCK].astype(np.float64)
            z -= self.mean
            z /= self.std
            out[r0 : r0 + len(z)] = np.clip(z, -self.clip, self.clip, out=z)
        return out.reshape(x.shape)

    def state_dict(self) -> dict:
        """Plain arrays and numbers (no pickle) for the checkpoint."""
        return {
            "mean": self.mean.copy(),
            "std": self.std.copy(),
            "names": list(self.names),
            "clip": float(self.clip),
            "fitted_on": [int(v) for v in self.fitted_on],
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> Normaliser:
        return cls(
            mean=np.asarray(state["mean"], dtype=np.float64),
            std=np.asarray(state["std"], dtype=np.float64),
            names=tuple(state["names"]),
            clip=float(state["clip"]),
            fitted_on=tuple(state["fitted_on"]),
        )
