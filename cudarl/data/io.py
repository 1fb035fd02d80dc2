"""Reading bar files: CSV (optionally gzipped) and Parquet, column matching, time parsing.

Nothing here judges the data beyond what is needed to read it; :mod:`cudarl.data.validate`
does the checks and repairs. Times come out as int64 ns since the epoch, UTC.

CSV files are read by pyarrow's CSV reader when pyarrow is installed, and otherwise by NumPy
(:func:`cudarl.data.text.split_bytes`: one pass over the bytes); either gives columns of text
that are converted in bulk (:mod:`cudarl.data.text`). Anything unusual (quoted fields, ragged
rows, stray CRs, bytes that are not UTF-8) goes to Python's ``csv`` module, which also words the
errors (file, line, column). ISO times are parsed by NumPy in one call when every value has the
same plain form, and one at a time otherwise.
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
from .text import ArrowText, TextColumn, split_bytes

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

    CSV values are :class:`~cudarl.data.text.TextColumn` (converted on demand: :func:`to_float`,
    :func:`parse_times`) or lists of str; Parquet gives float64 NumPy arrays for numbers and
    int64 ns UTC timestamps marked by a ``datetime64[ns]`` dtype.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(str(path), [Problem("no_file", "file not found")])
    if path.is_dir():
        raise DataError(str(path), [Problem("no_file", "is a folder, not a file of bars")])
    if path.suffix.lower() in (".parquet", ".pq"):
        return _read_parquet(path)
    try:
        return _read_csv_arrow(path)
    except _FallBack:
        pass
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    if not raw.isascii():
        _check_utf8(str(path), raw)
    eol = raw.find(b"\n")
    fast = split_bytes(raw, _delimiter((raw if eol < 0 else raw[:eol]).decode("utf-8")))
    return fast if fast is not None else _read_csv_text(str(path), raw.decode("utf-8"))


BOM = "\ufeff".encode()


def _delimiter(header_line: str) -> str:
    return max(",;\t|", key=header_line.count)


def _check_utf8(source: str, raw: bytes) -> None:
    """Raise a :class:`DataError` naming the line of the first byte that is not UTF-8."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            source,
            [
                Problem(
                    "encoding",
                    f"line {line} is not UTF-8 text (byte 0x{raw[exc.start]:02x}); cudarl reads UTF-8 files",
                    fix="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)",
                )
            ],
        ) from None


class _FallBack(Exception):
    """The fast reader does not take this file; the general one reads it (and words any error)."""


def _read_csv_arrow(path: Path):
    """pyarrow's multithreaded CSV reader: every column read as text, converted on demand in C."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        raise _FallBack from None
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        first = fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff")
    delim = _delimiter(first)
    header = next(csv.reader([first], delimiter=delim), [])
    if not header or len(set(header)) != len(header):
        raise _FallBack
    try:
        table = pacsv.read_csv(
            path,
            parse_options=pacsv.ParseOptions(delimiter=delim),
            convert_options=pacsv.ConvertOptions(
                column_types={h: pa.string() for h in header},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        raise _FallBack from None  # ragged rows, bad UTF-8, ...: the general reader says where
    if table.num_rows == 0 or table.column_names != header:
        raise _FallBack
    names = [h.strip() for h in header]
    return names, {n: ArrowText(c) for n, c in zip(names, table.columns, strict=True)}


def _read_csv_text(source: str, text: str):
    """The ``csv`` module's reading of a file the bulk reader does not take; it names bad lines."""
    if text.startswith("\ufeff"):
        text = text[1:]
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=_delimiter(text.partition("\n")[0]))
    try:  # newline="": a lone CR ends a line, as in a spreadsheet's export
        return _csv_columns(source, reader)
    except csv.Error as exc:
        raise DataError(source, [Problem("bad_row", f"line {reader.line_num} is not CSV ({exc})")]) from None


def _csv_columns(source: str, reader):
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
    if not cols or not cols[0]:
        raise DataError(source, [Problem("empty", "the file has a header but no data rows")])
    return header, dict(zip(header, cols, strict=True))


def _read_parquet(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            str(path), [Problem("no_pyarrow", "reading Parquet needs pyarrow", fix="pip install 'cudarl[parquet]'")]
        ) from None
    return arrow_columns(pq.read_table(path))


def arrow_columns(table) -> tuple[list[str], dict]:
    """``(names, name -> values)`` of a ``pyarrow.Table``, as :func:`read_table` gives them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pat

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
    return [str(n) for n in table.column_names], out


def pandas_columns(df) -> tuple[list[str], dict]:
    """``(names, name -> values)`` of a pandas ``DataFrame``; a ``DatetimeIndex`` becomes a column
    (named after the index, or ``time``) when no column is a time already."""
    import pandas as pd

    frame = df
    if isinstance(df.index, pd.DatetimeIndex):
        name = df.index.name or "time"
        if name not in df.columns:
            frame = df.reset_index(names=name)
    out = {}
    for name in frame.columns:
        col = frame[name]
        key = str(name)
        if isinstance(col.dtype, pd.DatetimeTZDtype):
            out[key] = col.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy("datetime64[ns]")
        elif col.dtype.kind == "M":
            out[key] = ("naive", col.to_numpy("datetime64[ns]").view(np.int64))
        elif col.dtype.kind in "biuf":
            out[key] = col.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            out[key] = ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in col.tolist()]
    return list(out), out


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
    if isinstance(values, TextColumn):
        f = values.floats()
        if f is not None:
            return f
        values = values.strings()
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
    fmt = date_format
    if isinstance(values, TextColumn):
        fmt = fmt or detect_format(values.head())
        if fmt == "iso":
            m = values.codes()
            fast = None if m is None else _parse_iso_codes(m, tz)
            if fast is not None:
                return fast
        if fmt not in ("epoch", *EPOCH_UNITS):  # epoch numbers are cast in bulk by to_float
            values = values.strings()
            fmt = date_format or detect_format(values)
    if isinstance(values, tuple) and values and values[0] == "naive":
        return _local_to_utc_ns(values[1].copy(), tz)
    if isinstance(values, np.ndarray) and values.dtype.kind == "M":
        return values.astype("datetime64[ns]").view(np.int64).copy()
    if isinstance(values, np.ndarray):  # numeric Parquet column
        values = [repr(v) for v in values.tolist()]
    fmt = fmt or detect_format(values)
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
    if fmt == "iso":
        fast = _parse_iso_numpy(values, tz)
        if fast is not None:
            return fast
    if fmt in FORMATS:
        return _parse_regex(source, column, values, FORMATS[fmt][0], tz, fix)
    return _parse_strptime(source, column, values, fmt, tz, fix)


def _parse_iso_numpy(values, tz: str) -> np.ndarray | None:
    """:func:`_parse_iso_codes` of a list of str (None unless every value has one width and is ASCII)."""
    if not values:
        return None
    try:
        a = np.array(values, dtype="S")  # ASCII only; one width (the longest)
    except UnicodeEncodeError:
        return None
    m = a.view(np.uint8).reshape(len(values), -1)
    if m.shape[1] == 0 or (m[:, -1] == 0).any():  # a shorter value was padded with NUL
        return None
    return _parse_iso_codes(m, tz)


def _parse_iso_codes(m: np.ndarray, tz: str) -> np.ndarray | None:
    """int64 ns UTC from the characters ``m`` ``[T, w]`` of ISO times that all have one plain form:
    ``YYYY-MM-DD``, then optionally ``(T| )HH:MM``, ``:SS``, ``.f`` (1-9 digits), and ``Z`` on all
    or none. The same arithmetic and range checks as the regex path; None when anything differs
    (that path then reads the values one by one and names a bad row). Days are counted once per
    run of equal dates (a day of minute bars is one run)."""
    n, w = m.shape
    zulu = bool((m[:, -1] == ord("Z")).all())
    if zulu:
        m, w = m[:, :-1], w - 1
    if w < 10 or (w > 10 and w not in (16, 19) and not (21 <= w <= 29)):
        return None
    seps = {4: "-", 7: "-"}
    if w > 10:
        seps.update({10: "T ", 13: ":"} if w == 16 else {10: "T ", 13: ":", 16: ":"})
        if w >= 21:
            seps[19] = "."
    for i, chars in seps.items():
        col = m[:, i]
        hit = col == ord(chars[0])
        for ch in chars[1:]:
            hit |= col == ord(ch)
        if not hit.all():
            return None
    digit_at = [i for i in range(w) if i not in seps]
    digits = m.T[digit_at] - np.uint8(48)  # [columns, T], each contiguous; a non-digit wraps past 9
    if (digits > 9).any():
        return None
    col = {c: j for j, c in enumerate(digit_at)}

    def number(lo: int, hi: int) -> np.ndarray:
        v = digits[col[lo]].astype(np.int64)
        for c in range(lo + 1, hi):
            v *= 10
            v += digits[col[c]]
        return v

    zero = np.zeros(n, np.int64)
    y, mo, d = number(0, 4), number(5, 7), number(8, 10)
    hh, mi, ss = (number(11, 13), number(14, 16), number(17, 19) if w >= 19 else zero) if w > 10 else (zero,) * 3
    frac = number(20, w) * 10 ** (9 - (w - 20)) if w >= 21 else zero
    if not ((hh <= 23) & (mi <= 59) & (ss <= 60)).all():
        return None
    first = np.flatnonzero(np.diff(y * 10000 + mo * 100 + d, prepend=-1))  # where each run of one date begins
    y, mo, d = y[first], mo[first], d[first]
    if not ((mo >= 1) & (mo <= 12) & (d >= 1)).all() or not (d <= _days_in_month(y, mo)).all():
        return None
    day_ns = np.repeat(_days_from_civil(y, mo, d) * (86400 * NS_PER_SECOND), np.diff(first, append=n))
    naive = day_ns + (hh * 3600 + mi * 60 + ss) * NS_PER_SECOND + frac
    return naive if zulu else _local_to_utc_ns(naive, tz)


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

    text = [list(map(repr, np.asarray(c, dtype=np.float64).tolist())) for c in cols]
    with atomic_open(path, "w", newline="") as fh:
        csv.writer(fh).writerow(header)
        fh.writelines(",".join(row) + "\r\n" for row in zip(stamps.tolist(), *text, strict=True))
