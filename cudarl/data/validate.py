"""Strict checks, opt-in repairs, warnings, and the data report.

:func:`load` is the one way bars enter cudarl. It is strict by default: every problem found
is collected and raised together as one :class:`DataError`, each naming the file, the rows,
the column and the option that repairs it. Nothing is written on failure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .bars import NS_PER_SECOND, PRICE_COLUMNS, Bars, DataError, Problem, iso, where
from .io import match_columns, parse_times, read_table, to_float

FIX_ORDER = "sort=True (CLI --sort)"
FIX_DUP = "dedupe='first' or 'last' (CLI --dedupe first|last)"
FIX_NAN = "drop_nan=True (CLI --drop-nan) or ffill=True (CLI --ffill)"
FIX_BAD_PRICE = "no option repairs this: correct or delete these rows in the file"


def load(
    source,
    *,
    date_format: str | None = None,
    tz: str = "UTC",
    columns: dict | None = None,
    extra_columns=(),
    sort: bool = False,
    dedupe: str | None = None,
    drop_nan: bool = False,
    ffill: bool = False,
    min_bars: int = 2,
    gap_factor: float = 10.0,
    split_threshold: float = 0.25,
) -> Bars:
    """Read, check and (only where asked) repair a bar file or ``builtin:<name>``.

    Args:
      source: a CSV / CSV.gz / Parquet path, or ``builtin:<name>[?key=value&...]``.
      date_format, tz: see :func:`cudarl.data.io.parse_times`; naive times are in ``tz``.
      columns: field -> column name overrides (``{"close": "Last"}``).
      extra_columns: further numeric columns to keep in ``Bars.extra`` (used as features).
      sort: sort rows by time (stable) instead of refusing unsorted data.
      dedupe: ``"first"`` or ``"last"``: keep that row of each duplicated timestamp.
      drop_nan: drop rows with a NaN or inf in any column read.
      ffill: replace such rows by a flat bar at the previous close (volume 0, extras carried).
      min_bars: the fewest bars the caller needs (the window plus what follows it).
      gap_factor: warn for spacings longer than this many median spacings.
      split_threshold: warn for a one-bar |log return| above this that is also 20 robust
        standard deviations out (an unadjusted split looks like this).
    Returns: a validated :class:`Bars`. Raises :class:`DataError` listing every problem.
    """
    repairs = dict(
        sort=sort,
        dedupe=dedupe,
        drop_nan=drop_nan,
        ffill=ffill,
        min_bars=min_bars,
        gap_factor=gap_factor,
        split_threshold=split_threshold,
    )
    _check_repairs(dedupe, drop_nan, ffill)
    if isinstance(source, str) and source.startswith("builtin:"):
        from cudarl.datasets import resolve

        resolved = resolve(source)
        if isinstance(resolved, Bars):
            return check(resolved, **repairs)
        source = resolved  # a shipped real series goes through the same reader and checks
    path = str(source)
    names, table = read_table(path)
    return from_table(
        path, names, table, date_format=date_format, tz=tz, columns=columns, extra_columns=extra_columns, **repairs
    )


def _check_repairs(dedupe, drop_nan, ffill) -> None:
    if dedupe not in (None, "first", "last"):
        raise ValueError(f"dedupe must be None, 'first' or 'last', not {dedupe!r}")
    if drop_nan and ffill:
        raise ValueError("choose one of drop_nan and ffill")


def from_pandas(df, *, source: str = "<DataFrame>", **options) -> Bars:
    """Bars from a pandas ``DataFrame`` (columns matched by name as in files; a ``DatetimeIndex`` is
    the time when no column is), with the checks and repairs of :func:`load` (same ``options``).
    Naive timestamps are read in ``tz``; zoned ones are converted to UTC."""
    from .io import pandas_columns

    names, table = pandas_columns(df)
    return from_table(source, names, table, **options)


def from_arrow(table, *, source: str = "<arrow.Table>", **options) -> Bars:
    """Bars from a ``pyarrow.Table`` (as :func:`from_pandas`; the options of :func:`load`)."""
    from .io import arrow_columns

    names, cols = arrow_columns(table)
    return from_table(source, names, cols, **options)


def from_table(
    path: str,
    names: list,
    table: dict,
    *,
    date_format: str | None = None,
    tz: str = "UTC",
    columns: dict | None = None,
    extra_columns=(),
    **repairs,
) -> Bars:
    """Bars from columns already read (``names`` in order, ``table`` name -> values): match the
    fields, parse the times, then :func:`check` with ``repairs`` (its keyword options). Errors name
    ``path`` (a file, or ``<DataFrame>``)."""
    _check_repairs(repairs.get("dedupe"), repairs.get("drop_nan"), repairs.get("ffill"))
    found = match_columns(path, names, columns)
    missing_extra = [c for c in extra_columns if c not in table]
    if missing_extra:
        raise DataError(
            path,
            [
                Problem(
                    "missing_column",
                    f"extra column {c!r} is not in the file; it has {names}",
                    column=c,
                    fix="drop it from extra_columns",
                )
                for c in missing_extra
            ],
        )
    tcol = found["time"]
    if isinstance(tcol, tuple):
        tvals = [f"{d} {t}" for d, t in zip(table[tcol[0]], table[tcol[1]], strict=True)]
        tname = "+".join(tcol)
    else:
        tvals, tname = table[tcol], tcol
    time = parse_times(path, tname, tvals, date_format, tz)
    cols = {k: v for k, v in found.items() if k != "time"}
    bars = Bars(
        time=time,
        **{k: to_float(table[found[k]]) for k in PRICE_COLUMNS},
        volume=to_float(table[found["volume"]]) if "volume" in found else None,
        adj_close=to_float(table[found["adj_close"]]) if "adj_close" in found else None,
        extra={c: to_float(table[c]) for c in extra_columns},
        source=path,
        columns={"time": tname, **cols},
    )
    return check(bars, **repairs)


def _column_name(bars: Bars, field: str) -> str:
    return bars.columns.get(field, field)


def _fields(bars: Bars):
    """(field, array) of every numeric column read."""
    out = [(k, getattr(bars, k)) for k in PRICE_COLUMNS]
    out += [(k, getattr(bars, k)) for k in ("volume", "adj_close") if getattr(bars, k) is not None]
    out += list(bars.extra.items())
    return out


def check(
    bars: Bars,
    *,
    sort=False,
    dedupe=None,
    drop_nan=False,
    ffill=False,
    min_bars=2,
    gap_factor=10.0,
    split_threshold=0.25,
) -> Bars:
    """Check ``bars`` (in source order), apply the repairs asked for, and return the result.

    Raises :class:`DataError` listing every problem left. See :func:`load` for the options.
    """
    src = bars.source
    problems: list[Problem] = []
    repairs: dict = {}

    # order
    t = bars.time
    back = np.flatnonzero(t[1:] < t[:-1]) + 1
    if back.size:
        if sort:
            bars = bars.take(np.argsort(t, kind="stable"))
            repairs["sorted_rows_out_of_order"] = int(back.size)
        else:
            problems.append(
                Problem(
                    "unsorted",
                    f"column {_column_name(bars, 'time')!r}: time goes backwards at {where(src, bars.rows[back])}",
                    rows=tuple(bars.rows[back].tolist()),
                    column=_column_name(bars, "time"),
                    fix=FIX_ORDER,
                )
            )
    # duplicates (found in time order, so they are found whether or not the file is sorted)
    order = np.argsort(bars.time, kind="stable")
    ts = bars.time[order]
    same = np.flatnonzero(ts[1:] == ts[:-1])
    if same.size:
        if dedupe:
            # within a run of equal times (stable order = file order) keep the first or the last
            drop_sorted = same + 1 if dedupe == "first" else same
            keep = np.ones(len(bars), dtype=bool)
            keep[order[drop_sorted]] = False
            bars = bars.take(keep)
            repairs[f"dropped_duplicates_kept_{dedupe}"] = int(drop_sorted.size)
        else:
            dup_rows = np.unique(bars.rows[order[np.concatenate([same, same + 1])]])
            problems.append(
                Problem(
                    "duplicate",
                    f"column {_column_name(bars, 'time')!r}: {same.size} duplicated timestamps "
                    f"at {where(src, dup_rows)}",
                    rows=tuple(dup_rows.tolist()),
                    column=_column_name(bars, "time"),
                    fix=FIX_DUP,
                )
            )

    # non-finite values
    bad_any = np.zeros(len(bars), dtype=bool)
    for _, a in _fields(bars):
        bad_any |= ~np.isfinite(a)
    if bad_any.any():
        if drop_nan:
            bars = bars.take(~bad_any)
            repairs["dropped_nan_rows"] = int(bad_any.sum())
        elif ffill and not bad_any[0]:
            bars = _ffill(bars, bad_any)
            repairs["forward_filled_rows"] = int(bad_any.sum())
        else:
            for field, a in _fields(bars):
                bad = np.flatnonzero(~np.isfinite(a))
                if bad.size:
                    fix = (
                        FIX_NAN
                        if not (ffill and bad_any[0])
                        else "drop_nan=True (CLI --drop-nan): the first row has nothing before it to fill from"
                    )
                    problems.append(
                        Problem(
                            "nan",
                            f"column {_column_name(bars, field)!r}: NaN, inf or missing "
                            f"at {where(src, bars.rows[bad])}",
                            rows=tuple(bars.rows[bad].tolist()),
                            column=_column_name(bars, field),
                            fix=fix,
                        )
                    )

    # prices
    with np.errstate(invalid="ignore"):
        for field in PRICE_COLUMNS + (("adj_close",) if bars.adj_close is not None else ()):
            bad = np.flatnonzero(getattr(bars, field) <= 0)
            if bad.size:
                problems.append(
                    Problem(
                        "non_positive",
                        f"column {_column_name(bars, field)!r}: price <= 0 at {where(src, bars.rows[bad])}",
                        rows=tuple(bars.rows[bad].tolist()),
                        column=_column_name(bars, field),
                        fix=FIX_BAD_PRICE,
                    )
                )
        hi = np.flatnonzero(bars.high < np.maximum(bars.open, bars.close))
        if hi.size:
            problems.append(
                Problem(
                    "high_low",
                    f"column {_column_name(bars, 'high')!r}: High < max(Open, Close) at {where(src, bars.rows[hi])}",
                    rows=tuple(bars.rows[hi].tolist()),
                    column=_column_name(bars, "high"),
                    fix=FIX_BAD_PRICE,
                )
            )
        lo = np.flatnonzero(bars.low > np.minimum(bars.open, bars.close))
        if lo.size:
            problems.append(
                Problem(
                    "high_low",
                    f"column {_column_name(bars, 'low')!r}: Low > min(Open, Close) at {where(src, bars.rows[lo])}",
                    rows=tuple(bars.rows[lo].tolist()),
                    column=_column_name(bars, "low"),
                    fix=FIX_BAD_PRICE,
                )
            )
        if bars.volume is not None:
            neg = np.flatnonzero(bars.volume < 0)
            if neg.size:
                problems.append(
                    Problem(
                        "negative_volume",
                        f"column {_column_name(bars, 'volume')!r}: negative volume at {where(src, bars.rows[neg])}",
                        rows=tuple(bars.rows[neg].tolist()),
                        column=_column_name(bars, "volume"),
                        fix=FIX_BAD_PRICE,
                    )
                )
    if len(bars) < min_bars:
        problems.append(
            Problem(
                "too_few_bars",
                f"{len(bars)} bars after repairs, the window needs at least {min_bars}",
                fix="a smaller window (CLI --window) or a longer file",
            )
        )
    if problems:
        raise DataError(src, problems)

    return dataclasses.replace(
        bars,
        repairs={**bars.repairs, **repairs},
        warnings=tuple(bars.warnings) + tuple(_warnings(bars, gap_factor, split_threshold)),
    )


def _ffill(bars: Bars, bad: np.ndarray) -> Bars:
    """Rows flagged ``bad`` become flat bars at the last good close; volume 0; extras carried."""
    idx = np.where(~bad, np.arange(len(bars)), -1)
    np.maximum.accumulate(idx, out=idx)
    src_close = bars.close[idx]
    changes = {k: np.where(bad, src_close, getattr(bars, k)) for k in PRICE_COLUMNS}
    if bars.adj_close is not None:
        changes["adj_close"] = np.where(bad, bars.adj_close[idx], bars.adj_close)
    if bars.volume is not None:
        changes["volume"] = np.where(bad, 0.0, bars.volume)
    changes["extra"] = {k: np.where(bad, v[idx], v) for k, v in bars.extra.items()}
    return dataclasses.replace(bars, **changes)


def _human_span(ns: float) -> str:
    s = ns / NS_PER_SECOND
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s:.0f} s"


def _warnings(bars: Bars, gap_factor: float, split_threshold: float) -> list[str]:
    out = []
    src = bars.source
    if len(bars) >= 3:
        dt = np.diff(bars.time)
        med = float(np.median(dt))
        big = np.flatnonzero(dt > gap_factor * med)
        if big.size:
            worst = big[np.argmax(dt[big])]
            out.append(
                f"gap: {big.size} spacings longer than {gap_factor:g}x the median ({_human_span(med)}); "
                f"the longest is {_human_span(float(dt[worst]))} before {where(src, [bars.rows[worst + 1]])} "
                f"({iso(bars.time[worst + 1])})"
            )
        r = np.diff(np.log(bars.close))
        sigma = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        jumps = np.flatnonzero((np.abs(r) > split_threshold) & (np.abs(r) > 20 * sigma))
        for j in jumps[:10]:
            ratio = bars.close[j] / bars.close[j + 1]
            out.append(
                f"split?: close moved by a factor {ratio:.3g}:1 in one bar at {where(src, [bars.rows[j + 1]])} "
                f"({iso(bars.time[j + 1])}); "
                f"if this is an unadjusted split, use adjusted prices"
            )
        if jumps.size > 10:
            out.append(f"split?: {jumps.size - 10} more one-bar moves like these")
    return out


def report(bars: Bars) -> dict:
    """The ``data_report.json`` contents: source, bars, span, frequency, repairs, warnings, stats."""
    ppy, how = bars.infer_periods_per_year() if len(bars) >= 2 else (None, "fewer than two bars")
    r = np.diff(np.log(bars.close))
    rep = {
        "source": bars.source,
        "bars": len(bars),
        "first": iso(bars.time[0]) if len(bars) else None,
        "last": iso(bars.time[-1]) if len(bars) else None,
        "columns": {k: (list(v) if isinstance(v, tuple) else v) for k, v in bars.columns.items()},
        "has_volume": bars.volume is not None,
        "extra_columns": sorted(bars.extra),
        "median_spacing_seconds": float(np.median(np.diff(bars.time))) / NS_PER_SECOND if len(bars) >= 2 else None,
        "periods_per_year": ppy,
        "periods_per_year_source": how,
        "repairs": dict(bars.repairs),
        "warnings": list(bars.warnings),
        "close": {
            "min": float(bars.close.min()),
            "max": float(bars.close.max()),
            "first": float(bars.close[0]),
            "last": float(bars.close[-1]),
        },
        "log_return": {
            "mean": float(r.mean()) if r.size else None,
            "std": float(r.std(ddof=1)) if r.size > 1 else None,
            "min": float(r.min()) if r.size else None,
            "max": float(r.max()) if r.size else None,
        },
    }
    if os.path.isfile(bars.source):
        rep["sha256"] = hashlib.sha256(Path(bars.source).read_bytes()).hexdigest()
    return rep


def write_json_atomic(obj, path) -> None:
    """Write JSON through a temporary file in the same folder, fsync, then rename."""
    from cudarl.atomic import atomic_open

    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=2, allow_nan=False)
        fh.write("\n")


def write_report(bars: Bars, path) -> dict:
    """Write ``data_report.json`` for validated ``bars`` to ``path``; return the report."""
    rep = report(bars)
    write_json_atomic(rep, path)
    return rep
