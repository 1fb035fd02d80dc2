"""A run's data made ready: bars loaded, causal features computed and normalised, chronological splits.

Its own module (not the trainer's) so that evaluating a saved policy imports no trainer, agent, replay
or graph code."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config, data_options
from .data import load as load_bars
from .features import Normaliser, compute, return_sign
from .splits import chronological


@dataclass
class Prepared:
    """Bars, normalised causal features and the chronological splits of a run, and the window of bars
    the network reads at each decision (``net.window``: every env over these features gathers it)."""

    bars: object
    x: np.ndarray  # float32 [T, F], normalised with train-split statistics
    names: tuple
    sign: np.ndarray  # bool [F], the columns the mirror negates
    splits: object
    normaliser: Normaliser
    periods_per_year: float
    window: int


def prepare_data(cfg: Config, bars=None, normaliser: Normaliser | None = None, stopwatch=None, splits=None) -> Prepared:
    """Load (or take) the bars, compute causal features, split (or take ``splits``, e.g. a walk-forward
    fold), and fit the normaliser on train (or use ``normaliser``, a trained model's, when evaluating
    on other data). ``stopwatch`` (:class:`cudarl.timing.Stopwatch`) gets the laps ``data`` and ``features``."""
    if bars is None:
        bars = load_bars(cfg.data.source, min_bars=cfg.env.episode_len + 3, **data_options(cfg.data))
    if stopwatch is not None:
        stopwatch.lap("data")
    feats = compute(bars, cfg.features)
    if splits is None:
        splits = chronological(len(bars), cfg.data.train_frac, cfg.data.val_frac, warmup=feats.warmup)
    sign = return_sign(feats.names, cfg.features)
    if normaliser is not None and tuple(normaliser.names) != tuple(feats.names):
        raise ValueError(
            f"the model was trained on features {list(normaliser.names)}; these bars give {list(feats.names)}"
        )
    norm = normaliser or Normaliser.fit(feats, splits.train, center=~sign)
    ppy = cfg.data.periods_per_year or bars.infer_periods_per_year()[0]
    x = norm.transform(feats.values)
    if stopwatch is not None:
        stopwatch.lap("features")
    return Prepared(bars, x, feats.names, sign, splits, norm, float(ppy), cfg.net.window)
