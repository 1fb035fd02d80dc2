"""Reading bar files: CSV (optionally gzipped) and Parquet, column matching, time parsing.

Nothing here judges the data beyond what is needed to read it; :mod:`cudarl.data.validate`
does the checks and repairs. Times come out as int64 ns since the epoch, UTC.

CSV files are read by pyarrow's CSV reader when pyarrow is installed, and otherwise by a NumPy
path that splits the text once and converts each column in one call; both fall back to Python's
``csv`` module for anything unusual (quoted fields, ragged rows, bytes that are not UTF-8), which
also words the errors (file, line, column). ISO times are parsed by NumPy in one call when every
value has the same plain form, and one at a time otherwise.
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

    Values are float64 NumPy arrays for columns that are all numbers, lists of str otherwise
    (CSV); Parquet timestamps are int64 ns UTC, marked by a ``datetime64[ns]`` dtype.
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
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            str(path),
            [
                Problem(
                    "encoding",
                    f"line {line} is not UTF-8 text (byte 0x{raw[exc.start]:02x}); cudarl reads UTF-8 files",
                    fix="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)",
                )
            ],
        ) from None
    return _read_csv_text(str(path), text)


class _FallBack(Exception):
    """The fast reader does not take this file; the general one reads it (and words any error)."""


def _read_csv_arrow(path: Path):
    """pyarrow's multithreaded CSV reader: every column read as text, then numbers cast in C."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv
    except ImportError:
        raise _FallBack from None
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        first = fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff")
    delim = max(",;\t|", key=first.count)
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
    return names, {n: ArrowText(pc.utf8_trim_whitespace(c)) for n, c in zip(names, table.columns, strict=True)}


class ArrowText:
    """A text column read by pyarrow: :meth:`floats` casts it in C; :meth:`strings` only when needed
    (times, or numbers with missing tokens, which :func:`to_float` reads one by one)."""

    def __init__(self, column):
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __iter__(self):
        return iter(self.strings())

    def floats(self) -> np.ndarray | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            a = pc.cast(self.column, pa.float64()).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if a.null_count:
            return None
        # from the buffer: to_numpy() would import pandas (most of a second)
        return np.frombuffer(a.buffers()[1], np.float64, count=len(a), offset=a.offset * 8).copy()

    def head(self, n: int = 8) -> list:
        return self.column.slice(0, n).to_pylist()

    def strings(self) -> list:
        return self.column.to_pylist()

    def codes(self) -> np.ndarray | None:
        """uint8 ``[T, w]``: the bytes of a column whose values all have ``w`` ASCII characters, else None."""
        import pyarrow as pa

        a = self.column.combine_chunks()
        if a.null_count or not len(a) or not pa.types.is_string(a.type):
            return None
        off = np.frombuffer(a.buffers()[1], np.int32, count=len(a) + 1, offset=a.offset * 4)
        w = int(off[1] - off[0])
        if w < 1 or not np.all(np.diff(off) == w):
            return None
        return np.frombuffer(a.buffers()[2], np.uint8, count=int(off[-1] - off[0]), offset=int(off[0])).reshape(-1, w)


def _read_csv_text(source: str, text: str):
    if text.startswith("\ufeff"):
        text = text[1:]
    first, _, body = text.partition("\n")
    delim = max(",;\t|", key=first.count)
    if "\r\n" in text:  # Windows line ends (csv.writer's default)
        first, body = first.rstrip("\r"), body.replace("\r\n", "\n")
    if '"' not in text and "\r" not in body:
        fast = _split_plain(source, first, body, delim)
        if fast is not None:
            return fast
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
    if not cols or not cols[0]:
        raise DataError(source, [Problem("empty", "the file has a header but no data rows")])
    return header, dict(zip(header, cols, strict=True))


def _split_plain(source: str, first: str, body: str, delim: str):
    """A file without quotes: split once, check every row's field count, columns of str.

    Returns None when a row has the wrong number of fields (the ``csv`` path then names it)."""
    header = [h.strip() for h in first.split(delim)]
    body = body.rstrip("\n")
    if "\n\n" in body:  # blank lines carry no row
        body = "\n".join(ln for ln in body.split("\n") if ln)
    if not body:
        raise DataError(source, [Problem("empty", "the file has a header but no data rows")])
    k = len(header)
    codes = np.frombuffer(body.encode(), np.uint8)
    ends = np.append(np.flatnonzero(codes == 10), len(codes))
    per_line = np.diff(np.searchsorted(np.flatnonzero(codes == ord(delim)), ends), prepend=0)
    if not (per_line == k - 1).all():
        return None
    fields = body.replace("\n", delim).split(delim)
    cols = [fields[c::k] for c in range(k)]
    if " " in body or (delim != "\t" and "\t" in body):
        cols = [[v.strip() for v in col] for col in cols]
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
    if isinstance(values, ArrowText):
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
    if isinstance(values, ArrowText):
        if (date_format or detect_format(values.head())) == "iso":
            m = values.codes()
            fast = None if m is None else _parse_iso_codes(m, tz)
            if fast is not None:
                return fast
        values = values.strings()
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


def _digits(m: np.ndarray, lo: int, hi: int):
    d = m[:, lo:hi].astype(np.int64) - 48
    if ((d < 0) | (d > 9)).any():
        return None
    v = np.zeros(len(m), np.int64)
    for k in range(hi - lo):
        v = v * 10 + d[:, k]
    return v


def _parse_iso_codes(m: np.ndarray, tz: str) -> np.ndarray | None:
    """int64 ns UTC from the characters ``m`` ``[T, w]`` of ISO times that all have one plain form:
    ``YYYY-MM-DD``, then optionally ``(T| )HH:MM``, ``:SS``, ``.f`` (1-9 digits), and ``Z`` on all
    or none. The same arithmetic and range checks as the regex path; None when anything differs
    (that path then reads the values one by one and names a bad row)."""
    n, w = m.shape
    zulu = bool((m[:, -1] == ord("Z")).all())
    if zulu:
        m, w = m[:, :-1], w - 1
    if w < 10 or (w > 10 and w not in (16, 19) and not (21 <= w <= 29)):
        return None
    seps = {4: b"-", 7: b"-"}
    if w > 10:
        seps.update({13: b":"} if w == 16 else {13: b":", 16: b":"})
        if w >= 21:
            seps[19] = b"."
    for i, ch in seps.items():
        if not (m[:, i] == ch[0]).all():
            return None
    if w > 10 and not ((m[:, 10] == ord("T")) | (m[:, 10] == ord(" "))).all():
        return None
    parts = [_digits(m, 0, 4), _digits(m, 5, 7), _digits(m, 8, 10)]
    if w > 10:
        parts += [_digits(m, 11, 13), _digits(m, 14, 16), _digits(m, 17, 19) if w >= 19 else np.zeros(n, np.int64)]
    else:
        parts += [np.zeros(n, np.int64)] * 3
    frac = np.zeros(n, np.int64) if w < 21 else _digits(m, 20, w)
    if any(p is None for p in parts) or frac is None:
        return None
    y, mo, d, hh, mi, ss = parts
    if w >= 21:
        frac = frac * 10 ** (9 - (w - 20))
    ok = (mo >= 1) & (mo <= 12) & (d >= 1) & (hh <= 23) & (mi <= 59) & (ss <= 60)
    if not ok.all() or not (d <= _days_in_month(y, mo)).all():
        return None
    naive = (_days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss) * NS_PER_SECOND + frac
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
