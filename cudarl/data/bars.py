"""The in-memory bar series, the data error, and the bar-frequency inference.

Everything downstream (features, splits, the environment, evaluation) reads a :class:`Bars`.
Times are int64 nanoseconds since the Unix epoch in UTC; prices are float64.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
DAYS_PER_YEAR = 365.2425

#: Conventional bars per year that an estimate within 5% snaps to (empyrical's daily,
#: weekly, monthly factors and calendar days).
CONVENTIONAL_PERIODS = (252.0, 365.0, 52.0, 12.0)

PRICE_COLUMNS = ("open", "high", "low", "close")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a data set.

    ``code`` is a stable identifier (``nan``, ``non_positive``, ``high_low``, ``unsorted``,
    ``duplicate``, ``missing_column``, ``too_few_bars``, ``bad_time``, ``negative_volume``),
    ``rows`` the offending data rows (0-based, in file order), ``column`` the column as named
    in the file, and ``fix`` the option that repairs it (or what to change when none does).
    """

    code: str
    message: str
    rows: tuple = ()
    column: str | None = None
    fix: str | None = None


def where(source: str, rows, limit: int = 5) -> str:
    """Name rows the way the user can find them: file lines for CSV (header is line 1)."""
    rows = [int(r) for r in rows]
    if source.lower().endswith((".csv", ".csv.gz", ".txt")):
        named = [f"line {r + 2}" for r in rows[:limit]]
    else:
        named = [f"row {r}" for r in rows[:limit]]
    more = f" (and {len(rows) - limit} more)" if len(rows) > limit else ""
    return ", ".join(named) + more


class DataError(ValueError):
    """Bad input data. ``problems`` lists every :class:`Problem` found; ``source`` the file."""

    def __init__(self, source: str, problems):
        self.source = source
        self.problems = list(problems)
        lines = []
        for p in self.problems:
            line = f"{source}: {p.message}"
            if p.fix:
                line += f" [fix: {p.fix}]"
            lines.append(line)
        super().__init__("\n".join(lines))

    @property
    def codes(self) -> list[str]:
        return [p.code for p in self.problems]


@dataclass(frozen=True, eq=False)
class Bars:
    """An OHLCV bar series, sorted by time, one row per bar.

    Fields (``T`` bars):
      time    int64 [T]   bar timestamps, ns since the epoch, UTC
      open, high, low, close  float64 [T]
      volume  float64 [T] or None when the source has none
      adj_close float64 [T] or None
      extra   dict name -> float64 [T]: further numeric columns carried as features
              (the regime signal of ``builtin:regime``)
      rows    int64 [T]   each bar's data row in the source (0-based), for error messages
      source  the file or ``builtin:<name>`` it came from
      columns dict field -> the column name in the source
      periods_per_year  the data set's own bar frequency when it is known by construction
              (synthetic sets); otherwise inferred, see :meth:`infer_periods_per_year`
      repairs what the loader changed (counts by repair), for the report
      warnings  human-readable warnings (gaps, split-like moves)
    """

    time: np.ndarray
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray | None = None
    adj_close: np.ndarray | None = None
    extra: dict = field(default_factory=dict)
    rows: np.ndarray | None = None
    source: str = "<memory>"
    columns: dict = field(default_factory=dict)
    periods_per_year: float | None = None
    repairs: dict = field(default_factory=dict)
    warnings: tuple = ()

    def __post_init__(self):
        n = len(self.time)
        for name in PRICE_COLUMNS:
            if len(getattr(self, name)) != n:
                raise ValueError(f"Bars: {name} has {len(getattr(self, name))} rows, time has {n}")
        if self.rows is None:
            object.__setattr__(self, "rows", np.arange(n, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.time)

    def take(self, index) -> Bars:
        """A new :class:`Bars` with rows ``index`` (a slice, int array or bool mask)."""

        def pick(a):
            return None if a is None else np.ascontiguousarray(a[index])

        return dataclasses.replace(
            self,
            time=pick(self.time),
            open=pick(self.open),
            high=pick(self.high),
            low=pick(self.low),
            close=pick(self.close),
            volume=pick(self.volume),
            adj_close=pick(self.adj_close),
            extra={k: pick(v) for k, v in self.extra.items()},
            rows=pick(self.rows),
        )

    def simple_returns(self) -> np.ndarray:
        """float64 [T]: ``close[t] / close[t-1] - 1``, with ``0`` at ``t = 0``."""
        r = np.zeros(len(self), dtype=np.float64)
        r[1:] = self.close[1:] / self.close[:-1] - 1.0
        return r

    def infer_periods_per_year(self) -> tuple[float, str]:
        """``(periods_per_year, how)``: the constructed value if known, else inferred.

        Inferred as bars per year of calendar span, ``(T - 1) / (span_days / 365.2425)``, so
        weekends, holidays and market hours are accounted for (5031 S&P 500 days over 20
        years give ~251.6); an estimate within 5% of 252, 365, 52 or 12 snaps to it.
        """
        if self.periods_per_year is not None:
            return float(self.periods_per_year), "given by the data set"
        return infer_periods_per_year(self.time)


def infer_periods_per_year(time) -> tuple[float, str]:
    """``(periods_per_year, how)`` from int64 ns timestamps [T]; see :meth:`Bars.infer_periods_per_year`."""
    time = np.asarray(time, dtype=np.int64)
    if len(time) < 2 or time[-1] <= time[0]:
        raise ValueError("cannot infer periods_per_year from fewer than two distinct timestamps; pass periods_per_year")
    span_years = (int(time[-1]) - int(time[0])) / NS_PER_DAY / DAYS_PER_YEAR
    estimate = (len(time) - 1) / span_years
    for conventional in CONVENTIONAL_PERIODS:
        if abs(estimate / conventional - 1.0) <= 0.05:
            return conventional, f"inferred from bar spacing ({estimate:.1f} bars/year, snapped to {conventional:g})"
    return float(round(estimate, 1)), f"inferred from bar spacing ({estimate:.1f} bars/year)"


def iso(ns: int) -> str:
    """An ISO-8601 UTC string for int64 ns."""
    return str(np.datetime64(int(ns), "ns").astype("datetime64[ms]")) + "Z"
