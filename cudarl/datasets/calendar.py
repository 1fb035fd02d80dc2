"""Bar times of the synthetic markets: business days from a Monday, or bars a fixed number of minutes apart."""

from __future__ import annotations

import numpy as np

from cudarl.data.bars import NS_PER_DAY

START = np.datetime64("2000-01-03", "D")  # a Monday


def business_days(n: int, start=START) -> np.ndarray:
    """int64 ns [n]: ``n`` consecutive Monday-to-Friday dates from ``start``, at 00:00 UTC."""
    # Integer arithmetic only: np.busday_offset and datetime64 array arithmetic both crashed
    # (segfault) for 4M dates with NumPy 2.5.2 on the GPU host. Five business days per calendar
    # week from a Monday.
    d0 = int(np.datetime64(start, "D").astype(np.int64))
    if (d0 + 3) % 7 != 0:  # 1970-01-01 was a Thursday
        raise ValueError(f"business_days starts on a Monday, got {start}")
    # int64 nanoseconds end in April 2262: past that the product wraps and time would run backwards.
    last_day = int(np.iinfo(np.int64).max // NS_PER_DAY)
    if n > 0 and d0 + 7 * ((n - 1) // 5) + (n - 1) % 5 > last_day:
        most = 5 * ((last_day - d0) // 7) + min((last_day - d0) % 7 + 1, 5)
        raise ValueError(
            f"{n} daily bars from {start} run past 2262-04-11, the last date int64 nanoseconds hold; "
            f"at most {most} bars (or intraday bars: bar_minutes=1)"
        )
    k = np.arange(n, dtype=np.int64)
    return (d0 + 7 * (k // 5) + k % 5) * np.int64(NS_PER_DAY)


def bar_times(n: int, bar_minutes: int = 0, start=START) -> np.ndarray:
    """int64 ns [n]: business days (``bar_minutes = 0``) or bars every ``bar_minutes`` minutes, around
    the clock from ``start`` (for series longer than daily dates can hold: 68,425 bars)."""
    if bar_minutes == 0:
        return business_days(n, start)
    if bar_minutes < 0:
        raise ValueError(f"bar_minutes must be >= 0, got {bar_minutes}")
    t0, step = int(np.datetime64(start, "ns").astype(np.int64)), int(bar_minutes) * 60 * 10**9
    if n > 0 and t0 + (n - 1) * step > np.iinfo(np.int64).max:
        raise ValueError(f"{n} bars of {bar_minutes} minutes from {start} run past 2262-04-11 (int64 nanoseconds)")
    return t0 + np.arange(n, dtype=np.int64) * np.int64(step)
