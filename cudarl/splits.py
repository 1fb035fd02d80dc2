"""Chronological train / validation / test splits and walk-forward folds.

A split is a half-open bar range ``[start, stop)``. Its decisions are made at bars
``start .. stop - 2`` and each earns the return over the next bar, which is still inside the
split, so no reward crosses a boundary. Features at a split's first bars look back into the
previous split: that is the past, and allowed. Train always starts at the feature warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    """Bars ``[start, stop)`` of the series, named ``train``, ``val`` or ``test``."""

    name: str
    start: int
    stop: int

    def __post_init__(self):
        if self.stop - self.start < 2:
            raise ValueError(f"split {self.name!r} [{self.start}, {self.stop}) has fewer than 2 bars")

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def slice(self) -> slice:
        return slice(self.start, self.stop)


@dataclass(frozen=True)
class Splits:
    """One train / validation / test partition, in time order and adjacent."""

    train: Split
    val: Split
    test: Split

    def as_dict(self) -> dict:
        return {s.name: [s.start, s.stop] for s in (self.train, self.val, self.test)}


def chronological(n: int, train: float = 0.7, val: float = 0.15, warmup: int = 0) -> Splits:
    """Split ``n`` bars: train ``[warmup, a)``, val ``[a, b)``, test ``[b, n)``.

    ``train`` and ``val`` are fractions of the ``n - warmup`` usable bars; test takes the rest.
    """
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
        raise ValueError(f"need 0 < train, val and train + val < 1, got train={train}, val={val}")
    usable = n - warmup
    a = warmup + int(round(train * usable))
    b = a + int(round(val * usable))
    return Splits(Split("train", warmup, a), Split("val", a, b), Split("test", b, n))


def by_date(time, val_start, test_start, warmup: int = 0) -> Splits:
    """Split at dates: val from the first bar at or after ``val_start``, test likewise.

    ``time`` int64 ns [T]; the dates are ISO strings or ``numpy.datetime64`` (UTC).
    """
    t = np.asarray(time, dtype=np.int64)
    a = int(np.searchsorted(t, np.datetime64(val_start, "ns").astype(np.int64)))
    b = int(np.searchsorted(t, np.datetime64(test_start, "ns").astype(np.int64)))
    return Splits(Split("train", warmup, a), Split("val", a, b), Split("test", b, len(t)))


def walk_forward(
    n: int,
    folds: int = 4,
    test_size: int | None = None,
    val_size: int | None = None,
    train_size: int | None = None,
    warmup: int = 0,
) -> list[Splits]:
    """Walk-forward folds over ``n`` bars; the test windows tile the end of the series.

    Fold ``i`` (0-based) tests on ``[n - (folds - i) * test_size, + test_size)``, validates on
    the ``val_size`` bars before it, and trains on everything from ``warmup`` before that
    (expanding), or on the last ``train_size`` bars (rolling) when given. Defaults:
    ``test_size = (n - warmup) // (folds + 2)``, ``val_size = test_size``.
    """
    if folds < 1:
        raise ValueError("folds must be >= 1")
    usable = n - warmup
    test_size = test_size or usable // (folds + 2)
    val_size = val_size or test_size
    out = []
    for i in range(folds):
        t0 = n - (folds - i) * test_size
        v0 = t0 - val_size
        tr0 = warmup if train_size is None else max(warmup, v0 - train_size)
        if v0 - tr0 < 2:
            raise ValueError(f"fold {i}: no room to train ({n} bars, warm-up {warmup}, {folds} folds of {test_size})")
        out.append(Splits(Split("train", tr0, v0), Split("val", v0, t0), Split("test", t0, t0 + test_size)))
    return out
