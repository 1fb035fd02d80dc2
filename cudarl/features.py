"""Causal market features and a normaliser fitted on the training split only.

Every feature at bar ``t`` is a function of bars ``0..t`` alone (tests/unit/test_features.py
changes every bar after ``t`` and checks that rows ``0..t`` do not move). Exponential
averages run forward through ``scipy.signal.lfilter``, which cannot look ahead; nothing is
centred, back-filled or smoothed in both directions.

Features, in order (``names`` says which are present):
  ret_<h>     log(C_t / C_{t-h}) / (sigma_t * sqrt(h)) for each horizon h
  log_vol     log(sigma_t), sigma_t the exponentially weighted RMS of 1-bar log returns
  range       log(H_t / L_t) / sigma_t
  body        log(C_t / O_t) / sigma_t
  close_loc   (2 C_t - H_t - L_t) / (H_t - L_t), in [-1, 1] (0 when H = L)
  volume      (log1p V_t - m_t) / s_t, the EW mean and std of log1p volume up to t (if volume)
  dow_sin, dow_cos   day of week (UTC)
  hod_sin, hod_cos   time of day (UTC), for intraday bars (FeatureConfig.time_of_day)
  <extra>     each of ``bars.extra`` as given (the regime signal of builtin:regime)
The agent's position is appended by the environment at run time (:func:`with_position`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.signal import lfilter

from cudarl.data.bars import NS_PER_DAY, Bars

POSITION_FEATURES = ("position",)
SIGMA_FLOOR = 1e-8


@dataclass(frozen=True)
class FeatureConfig:
    """What :func:`compute` builds."""

    horizons: tuple = (1, 4, 16, 64)
    """Log-return horizons in bars (each >= 1)."""
    vol_halflife: float = 32.0
    """Half-life, in bars, of the volatility that normalises returns and ranges."""
    volume_halflife: float = 64.0
    """Half-life, in bars, of the volume mean and spread."""
    time_features: bool = True
    """Day-of-week (and, for intraday bars, time-of-day) as sine and cosine."""
    time_of_day: bool | None = None
    """Time-of-day columns; ``None``: on when the series' median spacing is under a day.
    (That choice names columns once per series; it never changes a value.)"""
    extra: bool = True
    """Append ``bars.extra`` columns."""
    signed_extra: tuple = ("regime", "next_return")
    """Extra columns whose sign follows the market's direction (negated by the env's mirror)."""

    def __post_init__(self):
        if not self.horizons or min(self.horizons) < 1:
            raise ValueError(f"horizons must be >= 1, got {self.horizons}")
        if self.vol_halflife <= 0 or self.volume_halflife <= 0:
            raise ValueError("half-lives must be > 0")

    @property
    def warmup(self) -> int:
        """Bars before the first row whose every feature is defined and settled."""
        return int(max(max(self.horizons), math.ceil(self.vol_halflife)))


@dataclass(frozen=True)
class Features:
    """``values`` float32 [T, F] (rows before ``warmup`` are zeros), ``names`` F strings."""

    values: np.ndarray
    names: tuple
    warmup: int


def ewm_mean(x: np.ndarray, halflife: float, present: np.ndarray | None = None) -> np.ndarray:
    """Causal, bias-corrected EW mean, float64 [T]: ``sum_s<=t w_s x_s / sum_s<=t w_s``.

    ``w_s = (1 - a)^(t - s)`` for present rows, ``a = 1 - 2^(-1/halflife)``; rows with
    ``present`` False carry no weight (NaN before the first present row).
    """
    a = 1.0 - 0.5 ** (1.0 / halflife)
    present = np.ones(len(x), dtype=bool) if present is None else present
    w = present.astype(np.float64)
    num = lfilter([a], [1.0, a - 1.0], np.where(present, x, 0.0))
    den = lfilter([a], [1.0, a - 1.0], w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def compute(bars: Bars, config: FeatureConfig = FeatureConfig()) -> Features:
    """Features of ``bars`` (see the module docstring); float32 [T, F]."""
    T = len(bars)
    c, o, h, l = (np.asarray(getattr(bars, k), dtype=np.float64) for k in ("close", "open", "high", "low"))
    logc = np.log(c)
    r = np.zeros(T)
    r[1:] = np.diff(logc)
    present = np.arange(T) >= 1
    sigma = np.sqrt(np.maximum(ewm_mean(r * r, config.vol_halflife, present), SIGMA_FLOOR ** 2))
    cols, names = [], []
    with np.errstate(invalid="ignore", divide="ignore"):
        for hz in config.horizons:
            lr = np.zeros(T)
            lr[hz:] = logc[hz:] - logc[:-hz]
            cols.append(lr / (sigma * math.sqrt(hz)))
            names.append(f"ret_{hz}")
        cols.append(np.log(sigma)); names.append("log_vol")
        cols.append(np.log(h / l) / sigma); names.append("range")
        cols.append(np.log(c / o) / sigma); names.append("body")
        span = h - l
        cols.append(np.where(span > 0, (2 * c - h - l) / np.where(span > 0, span, 1.0), 0.0)); names.append("close_loc")
        if bars.volume is not None:
            lv = np.log1p(np.asarray(bars.volume, dtype=np.float64))
            m = ewm_mean(lv, config.volume_halflife)
            var = np.maximum(ewm_mean(lv * lv, config.volume_halflife) - m * m, 0.0)
            cols.append(np.where(var > 1e-12, (lv - m) / np.sqrt(np.maximum(var, 1e-12)), 0.0)); names.append("volume")
    if config.time_features and T:
        t = np.asarray(bars.time, dtype=np.int64)
        days = np.floor_divide(t, NS_PER_DAY)
        dow = (days + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
        cols += [np.sin(2 * np.pi * dow / 7), np.cos(2 * np.pi * dow / 7)]
        names += ["dow_sin", "dow_cos"]
        intraday = config.time_of_day if config.time_of_day is not None else bool(T >= 2 and np.median(np.diff(t)) < NS_PER_DAY)
        if intraday:
            frac = (t - days * NS_PER_DAY) / NS_PER_DAY
            cols += [np.sin(2 * np.pi * frac), np.cos(2 * np.pi * frac)]
            names += ["hod_sin", "hod_cos"]
    if config.extra:
        for k in sorted(bars.extra):
            cols.append(np.asarray(bars.extra[k], dtype=np.float64)); names.append(k)
    values = np.stack(cols, axis=1) if cols else np.zeros((T, 0))
    warm = min(config.warmup, T)
    values[:warm] = 0.0
    bad = ~np.isfinite(values)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"feature {names[j]!r} is not finite at bar {i}; were the bars validated?")
    return Features(values=values.astype(np.float32), names=tuple(names), warmup=config.warmup)


def return_sign(names, config: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """bool [F]: True for features whose sign follows the market's direction.

    Mirroring the market (negating every log price) negates ``ret_<h>``, ``body``,
    ``close_loc`` and the extras named in ``config.signed_extra``; it leaves volatility, range,
    volume and time unchanged. The env's directional mirror negates exactly these columns.
    """
    signed = {"body", "close_loc", *config.signed_extra}
    return np.array([n.startswith("ret_") or n in signed for n in names], dtype=bool)


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
    def fit(cls, features: Features, train, clip: float = 5.0, center=None) -> "Normaliser":
        """Fit on the rows of the training split ``train`` (a :class:`cudarl.splits.Split`
        or ``(start, stop)``), skipping rows before ``features.warmup``. Reads nothing else.

        ``center`` bool [F] (default all True): where False the mean is taken as 0 and the
        scale is the root mean square, so ``transform(-x) == -transform(x)`` for that column
        (pass ``~return_sign(names)``, so the env's mirror of a normalised row is exact)."""
        start, stop = (train.start, train.stop) if hasattr(train, "start") else train
        start = max(int(start), features.warmup)
        if stop - start < 2:
            raise ValueError(f"the training split [{start}, {stop}) has fewer than 2 rows after the warm-up")
        x = np.asarray(features.values[start:stop], dtype=np.float64)
        keep = np.ones(x.shape[1], bool) if center is None else np.asarray(center, bool)
        if keep.shape != (x.shape[1],):
            raise ValueError(f"center must be bool [{x.shape[1]}], got shape {keep.shape}")
        mean = np.where(keep, x.mean(axis=0), 0.0)
        std = np.sqrt(((x - mean) ** 2).mean(axis=0))
        std = np.where(std > 1e-12, std, 1.0)
        return cls(mean=mean, std=std, names=tuple(features.names), clip=float(clip), fitted_on=(start, int(stop)))

    def transform(self, x) -> np.ndarray:
        """float32 [..., F]."""
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict:
        """Plain arrays and numbers (no pickle) for the checkpoint."""
        return {"mean": self.mean.copy(), "std": self.std.copy(), "names": list(self.names),
                "clip": float(self.clip), "fitted_on": [int(v) for v in self.fitted_on]}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Normaliser":
        return cls(mean=np.asarray(state["mean"], dtype=np.float64), std=np.asarray(state["std"], dtype=np.float64),
                   names=tuple(state["names"]), clip=float(state["clip"]), fitted_on=tuple(state["fitted_on"]))
