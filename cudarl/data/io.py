"""Reading bar files: CSV (optionally gzipped) and Parquet, column matching, time parsing.

Nothing here judges the data beyond what is needed to read it; :mod:`cudarl.data.validate`
does the checks and repairs. Times come out as int64 ns since the epoch, UTC.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .bars import NS_PER_SECOND, DataError, Problem, where

#: Accepted column names (after lower-casing and mapping ``_``/``-`` to spaces), by field.
ALIASES = {
    "time": ("date", "time", "timestamp", "datetime", "date time", "gmt time", "utc time", "open time"),
    "open": ("open", "o"),
    "high": ("high", "h"),
    "low": ("low", "l"),
    "close": ("close", "c"),
    "adj_close": ("adj close", "adjclose", "adjusted close"),
    "volume": ("volume", "vol", "v"),
}
REQUIRED = ("time", "open", "high", "low", "close")
MISSING_TOKENS = {"", "nan", "na", "n/a", "null", "none", "-"}

_TIME = r"(?:[T ](?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.(?P<f>\d{1,9}))?)?)?"
_OFFSET = r"\s*(?P<tz>Z|UTC|[+-]\d{2}:?\d{2})?"
#: Auto-detected string formats: name -> (regex, human description).
FORMATS = {
    "iso": (
        re.compile(r"^(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})" + _TIME + _OFFSET + r"$"),
        "YYYY-MM-DD[ HH:MM[:SS[.fff]]][Z|+hh:mm]",
    ),
    "mdy": (
        re.compile(r"^(?P<m>\d{1,2})/(?P<d>\d{1,2})/(?P<y>\d{4})" + _TIME + _OFFSET + r"$"),
        "M/D/YYYY[ HH:MM[:SS[.fff]]]",
    ),
    "dmy_dots": (
        re.compile(r"^(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.(?P<y>\d{4})" + _TIME + _OFFSET + r"$"),
        "dd.mm.YYYY[ HH:MM[:SS[.fff]]]",
    ),
}
EPOCH_UNITS = {"epoch_s": 1_000_000_000, "epoch_ms": 1_000_000, "epoch_us": 1_000, "epoch_ns": 1}


def _norm(name: str) -> str:
    return " ".join(str(name).strip().lower().replace("_", " ").replace("-", " ").split())


# ---------------------------------------------------------------------------------- tables


def read_table(path: str | Path) -> tuple[list[str], dict]:
    """``(column names in file order, name -> values)`` of a CSV, CSV.gz or Parquet file.

    CSV values are lists of str; Parquet values are NumPy arrays (timestamps as int64 ns UTC,
    marked by a ``datetime64[ns]`` dtype).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(str(path), [Problem("no_file", "file not found")])
    suffixes = "".join(path.suffixes[-2:]).lower()
    if path.suffix.lower() in (".parquet", ".pq"):
        return _read_parquet(path)
    if suffixes.endswith(".gz"):
        with gzip.open(path, "rt", newline="") as fh:
            text = fh.read()
    else:
        with open(path, newline="") as fh:
            text = fh.read()
    return _read_csv_text(str(path), text)


def _read_csv_text(source: str, text: str):
    if text.startswith("\ufeff"):
        text = text[1:]
    first = text.split("\n", 1)[0]
    delim = max(",;\t|", key=first.count)
    reader = csv.reader(io.StringIO(text), delimiter=delim)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(source, [Problem("empty", "the file is empty")]) from None
    header = [h.strip() for h in header]
    cols = [[] for _ in header]
    for i, row in enumerate(reader):
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(
                source,
                [
                    Problem(
                        "bad_row",
                        f"{where(source, [i])} has {len(row)} fields, the header has {len(header)}",
                        rows=(i,),
                    )
                ],
            )
        for c, v in zip(cols, row, strict=True):
            c.append(v.strip())
    return header, dict(zip(header, cols, strict=True))


def _read_parquet(path: Path):
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        import pyarrow.types as pat
    except ImportError:
        raise DataError(
            str(path), [Problem("no_pyarrow", "reading Parquet needs pyarrow", fix="pip install 'cudarl[parquet]'")]
        ) from None
    table = pq.read_table(path)
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pat.is_timestamp(col.type) or pat.is_date(col.type):
            # int64 ns: UTC for zoned timestamps, wall-clock for naive ones and dates
            zone = getattr(col.type, "tz", None)
            ns = pc.cast(pc.cast(col, pa.timestamp("ns", tz=zone)), pa.int64()).to_numpy(zero_copy_only=False)
            out[name] = (
                np.asarray(ns, dtype=np.int64).astype("datetime64[ns]")
                if zone
                else ("naive", np.asarray(ns, dtype=np.int64))
            )
        elif pat.is_integer(col.type) or pat.is_floating(col.type):
            out[name] = (
                col.to_numpy(zero_copy_only=False).astype(np.float64)
                if pat.is_floating(col.type)
                else col.to_numpy(zero_copy_only=False)
            )
        else:
            out[name] = ["" if v is None else str(v) for v in col.to_pylist()]
    return list(table.column_names), out


# ------------------------------------------------------------------------- column matching


def match_columns(source: str, names: list[str], columns: dict | None = None) -> dict:
    """Map fields (time, open, high, low, close, adj_close, volume) to column names.

    ``columns`` overrides by field, e.g. ``{"close": "Last"}``. A file with separate Date and
    Time columns gets both, joined as ``"date time"`` (field ``time`` -> a tuple of two names).
    Raises :class:`DataError` (code ``missing_column``) naming every required field not found.
    """
    columns = dict(columns or {})
    by_norm = {}
    for n in names:
        by_norm.setdefault(_norm(n), n)
    found = {}
    for field, aliases in ALIASES.items():
        if field in columns:
            if columns[field] not in names:
                raise DataError(
                    source,
                    [
                        Problem(
                            "missing_column",
                            f"column {columns[field]!r} (given for {field}) is not in the file; it has {names}",
                            column=columns[field],
                            fix=f"name an existing column: columns={{'{field}': NAME}} (CLI --column {field}=NAME)",
                        )
                    ],
                )
            found[field] = columns[field]
            continue
        for a in aliases:
            if a in by_norm:
                found[field] = by_norm[a]
                break
    if "time" not in columns and "date" in by_norm and "time" in by_norm:
        found["time"] = (by_norm["date"], by_norm["time"])
    missing = [f for f in REQUIRED if f not in found]
    if missing:
        problems = [
            Problem(
                "missing_column",
                f"no {f} column (accepted names: {', '.join(ALIASES[f])}); the file has {names}",
                column=f,
                fix=f"columns={{'{f}': NAME}} (CLI --column {f}=NAME)",
            )
            for f in missing
        ]
        raise DataError(source, problems)
    return found


# --------------------------------------------------------------------------------- numbers


def to_float(values) -> np.ndarray:
    """float64 [T] from a column; missing tokens and unparsable text become NaN."""
    if isinstance(values, np.ndarray):
        return values.astype(np.float64)
    try:
        return np.array(values, dtype=np.float64)
    except ValueError:
        out = np.empty(len(values), dtype=np.float64)
        for i, v in enumerate(values):
            try:
                out[i] = np.nan if v.lower() in MISSING_TOKENS else float(v)
            except ValueError:
                out[i] = np.nan
        return out


# ----------------------------------------------------------------------------------- times


def _days_from_civil(y, m, d):
    """Days since 1970-01-01 of proleptic Gregorian dates (int64 arrays)."""
    y = y - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _days_in_month(y, m):
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    base = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m - 1]
    return base + ((m == 2) & leap)


def _local_to_utc_ns(naive_ns: np.ndarray, tz: str) -> np.ndarray:
    if tz.upper() in ("UTC", "Z", "GMT"):
        return naive_ns
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(tz)
    out = np.empty_like(naive_ns)
    for i, ns in enumerate(naive_ns.tolist()):
        sec, rem = divmod(ns, NS_PER_SECOND)
        local = datetime.fromtimestamp(sec, timezone.utc).replace(tzinfo=zone)
        out[i] = (sec - int(local.utcoffset().total_seconds())) * NS_PER_SECOND + rem
    return out


def detect_format(values) -> str | None:
    """The name of the format the first non-empty value matches (``FORMATS`` or ``epoch``)."""
    for v in values:
        if v:
            if re.fullmatch(r"-?\d+(\.\d+)?", v):
                return "epoch"
            for name, (rx, _) in FORMATS.items():
                if rx.match(v):
                    return name
            return None
    return None


def parse_times(source: str, column: str, values, date_format: str | None = None, tz: str = "UTC") -> np.ndarray:
    """int64 ns UTC [T] from a column of strings, numbers or datetime64.

    ``date_format``: ``None`` (detect ISO, M/D/YYYY, dd.mm.YYYY, or epoch seconds or
    milliseconds by magnitude), ``"epoch_s" | "epoch_ms" | "epoch_us" | "epoch_ns"``, or a
    ``strptime`` format. Naive times are read in zone ``tz`` (an IANA name); times with an
    offset are converted. Raises :class:`DataError` (code ``bad_time``) naming the rows.
    """
    fix = "pass date_format=... (CLI --date-format), a strptime format or epoch_s/epoch_ms"
    if isinstance(values, tuple) and values and values[0] == "naive":
        return _local_to_utc_ns(values[1].copy(), tz)
    if isinstance(values, np.ndarray) and values.dtype.kind == "M":
        return values.astype("datetime64[ns]").view(np.int64).copy()
    if isinstance(values, np.ndarray):  # numeric Parquet column
        values = [repr(v) for v in values.tolist()]
    fmt = date_format or detect_format(values)
    if fmt is None:
        first = next((v for v in values if v), "")
        raise DataError(
            source,
            [
                Problem(
                    "bad_time",
                    f"column {column!r}: cannot recognise the time format of {first!r}",
                    rows=(0,),
                    column=column,
                    fix=fix,
                )
            ],
        )
    if fmt == "epoch" or fmt in EPOCH_UNITS:
        nums = to_float(values)
        bad = np.flatnonzero(~np.isfinite(nums))
        if bad.size:
            raise DataError(
                source,
                [
                    Problem(
                        "bad_time",
                        f"column {column!r}: not a number at {where(source, bad)}",
                        rows=tuple(bad),
                        column=column,
                        fix=fix,
                    )
                ],
            )
        if fmt == "epoch":
            mag = float(np.median(np.abs(nums))) if nums.size else 0.0
            if mag < 1e8:
                raise DataError(
                    source,
                    [
                        Problem(
                            "bad_time",
                            f"column {column!r}: numbers like {nums[0]:g} are too small for epoch seconds",
                            rows=(0,),
                            column=column,
                            fix=fix,
                        )
                    ],
                )
            fmt = "epoch_s" if mag < 1e11 else "epoch_ms" if mag < 1e14 else "epoch_us" if mag < 1e17 else "epoch_ns"
        scale = EPOCH_UNITS[fmt]
        if scale == 1:
            return np.array([int(float(v)) if "." in v or "e" in v.lower() else int(v) for v in values], dtype=np.int64)
        whole = np.floor(nums)
        return whole.astype(np.int64) * scale + np.round((nums - whole) * scale).astype(np.int64)
    if fmt in FORMATS:
        return _parse_regex(source, column, values, FORMATS[fmt][0], tz, fix)
    return _parse_strptime(source, column, values, fmt, tz, fix)


def _parse_regex(source, column, values, rx, tz, fix):
    n = len(values)
    parts = np.zeros((7, n), dtype=np.int64)  # y m d H M S ns
    offset = np.zeros(n, dtype=np.int64)  # seconds east of UTC
    has_offset = np.zeros(n, dtype=bool)
    bad = []
    for i, v in enumerate(values):
        m = rx.match(v)
        if m is None:
            bad.append(i)
            continue
        g = m.groupdict()
        f = g["f"] or ""
        parts[:, i] = (
            int(g["y"]),
            int(g["m"]),
            int(g["d"]),
            int(g["H"] or 0),
            int(g["M"] or 0),
            int(g["S"] or 0),
            int((f + "000000000")[:9]),
        )
        z = g["tz"]
        if z:
            has_offset[i] = True
            if z not in ("Z", "UTC"):
                sign = -1 if z[0] == "-" else 1
                digits = z[1:].replace(":", "")
                offset[i] = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    y, mo, d, hh, mi, ss, ns = parts
    if n:
        ok = (mo >= 1) & (mo <= 12) & (d >= 1) & (hh <= 23) & (mi <= 59) & (ss <= 60)
        ok &= d <= _days_in_month(y, np.clip(mo, 1, 12))
        ok[bad] = True
        bad = sorted(set(bad) | set(np.flatnonzero(~ok).tolist()))
    if bad:
        raise DataError(
            source,
            [
                Problem(
                    "bad_time",
                    f"column {column!r}: cannot read {values[bad[0]]!r} at {where(source, bad)}",
                    rows=tuple(bad),
                    column=column,
                    fix=fix,
                )
            ],
        )
    naive = (_days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss) * NS_PER_SECOND + ns
    if has_offset.all():
        return naive - offset * NS_PER_SECOND
    if has_offset.any():
        i = int(np.flatnonzero(~has_offset)[0])
        raise DataError(
            source,
            [
                Problem(
                    "bad_time",
                    f"column {column!r}: some times carry a UTC offset and some do not "
                    f"(first without at {where(source, [i])})",
                    rows=(i,),
                    column=column,
                    fix="give every time an offset, or none and pass tz=...",
                )
            ],
        )
    return _local_to_utc_ns(naive, tz)


def _parse_strptime(source, column, values, fmt, tz, fix):
    out = np.empty(len(values), dtype=np.int64)
    naive = np.zeros(len(values), dtype=bool)
    bad = []
    epoch = datetime(1970, 1, 1)
    for i, v in enumerate(values):
        try:
            t = datetime.strptime(v, fmt)
        except ValueError:
            bad.append(i)
            continue
        if t.tzinfo is not None:
            t = t.astimezone(timezone.utc).replace(tzinfo=None)
        else:
            naive[i] = True
        delta = t - epoch
        out[i] = (delta.days * 86400 + delta.seconds) * NS_PER_SECOND + delta.microseconds * 1000
    if bad:
        raise DataError(
            source,
            [
                Problem(
                    "bad_time",
                    f"column {column!r}: {values[bad[0]]!r} does not match {fmt!r} at {where(source, bad)}",
                    rows=tuple(bad),
                    column=column,
                    fix=fix,
                )
            ],
        )
    if naive.any():
        out[naive] = _local_to_utc_ns(out[naive], tz)
    return out


def write_csv(bars, path) -> None:
    """Write bars as CSV (Date ISO-8601 UTC, Open, High, Low, Close[, Volume][, extras]).

    Floats are written with ``repr`` so that reading the file back gives the same numbers.
    The file appears whole or not at all (temporary file, fsync, rename).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.asarray(bars.time, dtype=np.int64)
    daily = bool(len(t)) and bool(np.all(t % (86400 * NS_PER_SECOND) == 0))
    stamps = np.asarray(t).astype("datetime64[ns]").astype("datetime64[D]" if daily else "datetime64[s]").astype(str)
    if not daily:
        stamps = np.char.add(stamps, "Z")
    header = ["Date", "Open", "High", "Low", "Close"]
    cols = [bars.open, bars.high, bars.low, bars.close]
    if bars.volume is not None:
        header.append("Volume")
        cols.append(bars.volume)
    for k in sorted(bars.extra):
        header.append(k)
        cols.append(bars.extra[k])
    from cudarl.atomic import atomic_open

    with atomic_open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for i in range(len(t)):
            w.writerow([stamps[i]] + [repr(float(c[i])) for c in cols])
