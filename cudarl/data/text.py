"""Columns of CSV text read in bulk and converted on demand, by pyarrow or by NumPy.

A reader hands :func:`cudarl.data.io.read_table`'s callers a :class:`TextColumn` per column instead
of a list of Python strings: numbers are cast by one C call (:meth:`TextColumn.floats`), ISO times
are read from a ``[T, w]`` matrix of their characters (:meth:`TextColumn.codes`), and Python
strings (:meth:`TextColumn.strings`, each stripped as the ``csv`` path strips it) are made only for a
column that needs reading value by value (missing tokens, other time formats, text). ``floats`` and
``codes`` return None where the bulk conversion does not apply, and the caller then takes the
value-by-value path, which also words any error (file, line, column); so a bulk result is always
the value-by-value one (tests/unit/test_data_fast.py holds every reader to the ``csv`` module's).
"""

from __future__ import annotations

import re

import numpy as np

#: Longest field :meth:`BytesText.floats` reads in bulk (longer numbers are read one by one).
MAX_NUMBER_WIDTH = 40


class TextColumn:
    """A column of ``T`` text values; ``len``, iteration (stripped str), and the bulk conversions."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self):
        return iter(self.strings())

    def floats(self) -> np.ndarray | None:
        """float64 ``[T]`` when every value is a number that ``float()`` reads, else None."""
        raise NotImplementedError

    def codes(self) -> np.ndarray | None:
        """uint8 ``[T, w]``: the bytes of the values when all have one width ``w >= 1``, else None."""
        raise NotImplementedError

    def strings(self) -> list:
        """The values as str, stripped of surrounding white space."""
        raise NotImplementedError

    def head(self, n: int = 8) -> list:
        """The first ``n`` values as :meth:`strings` gives them."""
        raise NotImplementedError


class ArrowText(TextColumn):
    """A string column read by pyarrow (``pyarrow.ChunkedArray``); nothing is trimmed until a value
    fails to convert as it stands (trimming every column cost more than the casts)."""

    def __init__(self, column):
        self.column = column
        self._trimmed = None

    def __len__(self) -> int:
        return len(self.column)

    def trimmed(self):
        if self._trimmed is None:
            import pyarrow.compute as pc

            self._trimmed = pc.utf8_trim_whitespace(self.column)
        return self._trimmed

    def floats(self) -> np.ndarray | None:
        for col in (self.column, None):
            f = _arrow_floats(self.trimmed() if col is None else col)
            if f is not None:
                return f
        return None

    def codes(self) -> np.ndarray | None:
        m = _arrow_codes(self.column)
        return m if m is not None else _arrow_codes(self.trimmed())

    def strings(self) -> list:
        return self.trimmed().to_pylist()

    def head(self, n: int = 8) -> list:
        import pyarrow.compute as pc

        return pc.utf8_trim_whitespace(self.column.slice(0, n)).to_pylist()


def _arrow_floats(column) -> np.ndarray | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        a = pc.cast(column, pa.float64()).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if a.null_count:
        return None
    # from the buffer: to_numpy() would import pandas (most of a second)
    return np.frombuffer(a.buffers()[1], np.float64, count=len(a), offset=a.offset * 8).copy()


def _arrow_codes(column) -> np.ndarray | None:
    import pyarrow as pa

    a = column.combine_chunks()
    if a.null_count or not len(a) or not pa.types.is_string(a.type):
        return None
    off = np.frombuffer(a.buffers()[1], np.int32, count=len(a) + 1, offset=a.offset * 4)
    w = int(off[1] - off[0])
    if w < 1 or not np.all(np.diff(off) == w):
        return None
    return np.frombuffer(a.buffers()[2], np.uint8, count=int(off[-1] - off[0]), offset=int(off[0])).reshape(-1, w)


#: Widest column :func:`plain_decimals` reads (at most 15 digits, so every ``M < 10^15 < 2^53``);
#: past it NumPy's ``float()`` of each value costs about as much as the fast path.
PLAIN_DECIMAL_WIDTH = 15
_POW10 = 10.0 ** np.arange(23)  # exact doubles


def plain_decimals(m: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(float64 [T], ok bool [T])`` of the fields ``m`` uint8 ``[T, w]`` (``inside`` marks each
    field's bytes; NUL after them) written ``-?d*(.d*)?`` with a digit, whose digits make an integer
    ``M <= 2^53`` with ``k <= 22`` of them after the point. For those (prices and volumes as
    exchanges write them) ``M / 10^k`` is one IEEE division of two exact doubles, hence correctly
    rounded, which is what ``float()`` gives (Clinger's fast path); other rows are not ok and their
    values are to be read by ``float()``."""
    m, inside = np.ascontiguousarray(m.T), np.ascontiguousarray(inside.T)  # [w, T]: a column of characters a row
    d = m - np.uint8(48)
    digit = d <= 9
    dot = m == ord(".")
    minus = m[0] == ord("-")
    known = digit | dot | ~inside
    known[0] |= minus
    ok = known.all(axis=0) & (np.count_nonzero(dot, axis=0) <= 1) & digit.any(axis=0)
    k = np.count_nonzero(digit & np.logical_or.accumulate(dot, axis=0), axis=0)
    d *= digit  # 0 where no digit, and there M is multiplied by 1, not 10
    scale = 1 + 9 * digit.view(np.uint8)
    M = np.zeros(m.shape[1], np.int64)
    for c in range(m.shape[0]):
        M *= scale[c]
        M += d[c]
    ok &= (M <= 2**53) & (k <= 22)
    v = M.astype(np.float64) / _POW10[np.minimum(k, 22)]
    return np.where(minus, -v, v), ok


class BytesText(TextColumn):
    """Field ``i`` is ``codes[starts[i]:ends[i]]``, bytes of a file (UTF-8, already checked).

    ``codes`` uint8 (the file's bytes, shared by its columns; no copy); ``starts``, ``ends`` int64 ``[T]``.
    """

    def __init__(self, codes: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self.buf = codes
        self.starts, self.ends = np.ascontiguousarray(starts), np.ascontiguousarray(ends)

    def __len__(self) -> int:
        return len(self.starts)

    def _matrix(self, w: int) -> np.ndarray:
        """uint8 ``[T, w]``: the ``w`` bytes from each field's start (past its end too)."""
        n = len(self.buf)
        win = np.lib.stride_tricks.sliding_window_view(self.buf, w)  # row i: buf[i : i + w], no copy
        starts = self.starts
        m = win[np.minimum(starts, n - w)]
        for i in np.flatnonzero(starts > n - w).tolist():  # the last few fields of the file
            tail = self.buf[starts[i] :]
            m[i, : len(tail)], m[i, len(tail) :] = tail, 0
        return m

    def floats(self) -> np.ndarray | None:
        if not len(self):
            return None
        lengths = self.ends - self.starts
        w = int(lengths.max())
        if lengths.min() < 1 or w > MAX_NUMBER_WIDTH:
            return None
        m = self._matrix(w)
        inside = np.arange(w) < lengths[:, None]
        m *= inside  # NUL after each field: NumPy's S type ends there
        out, rest = np.empty(len(self)), slice(None)
        if w <= PLAIN_DECIMAL_WIDTH:
            out, ok = plain_decimals(m, inside)
            rest = ~ok
        try:
            # NumPy reads bytes as float() reads str (the same forms, correctly rounded; tested)
            out[rest] = m[rest].view(f"S{w}")[:, 0].astype(np.float64)
        except ValueError:
            return None
        return out

    def codes(self) -> np.ndarray | None:
        if not len(self):
            return None
        w = int(self.ends[0] - self.starts[0])
        if w < 1 or not np.all(self.ends - self.starts == w):
            return None
        return self._matrix(w)

    def strings(self) -> list:
        return self.head(len(self))

    def head(self, n: int = 8) -> list:
        b = self.buf
        return [
            b[s:e].tobytes().decode("utf-8").strip()
            for s, e in zip(self.starts[:n].tolist(), self.ends[:n].tolist(), strict=True)
        ]


def split_bytes(raw: bytes, delim: str):
    """``(header, {name: BytesText})`` of a CSV file's bytes (UTF-8, BOM removed) without quotes,
    or None when the ``csv`` module must read it (quotes, a stray CR, a row with another number
    of fields than the header, no data row): that path reads it or names the line at fault.

    NumPy finds every delimiter and line end in one pass; nothing is done per row in Python, and
    the file's bytes are not copied (unless blank lines must be taken out).
    """
    if b'"' in raw:
        return None
    eol = raw.find(b"\n")
    if eol < 0:
        return None
    header = [h.strip() for h in raw[:eol].rstrip(b"\r").decode("utf-8").split(delim)]
    start, end = eol + 1, len(raw)
    while start < end and raw[start] in b"\r\n":  # blank lines after the header
        start += 1
    while end > start and raw[end - 1] in b"\r\n":  # the last line end, and blank lines
        end -= 1
    if start == end:
        return None
    codes = np.frombuffer(raw, np.uint8)[start:end]
    grid = _field_ends(codes, len(header), ord(delim))
    if grid is None and _has_blank_lines(codes):  # rare: take them out (a copy), then split again
        body = re.sub(b"\n(?:\r?\n)+", b"\n", raw[start:end])
        codes = np.frombuffer(body, np.uint8)
        grid = _field_ends(codes, len(header), ord(delim))
    if grid is None:
        return None
    starts, ends = grid
    return header, {h: BytesText(codes, starts[:, c], ends[:, c]) for c, h in enumerate(header)}


def _field_ends(codes: np.ndarray, k: int, delim: int):
    """int64 ``(starts, ends)`` ``[rows, k]`` of the fields of ``codes`` (rows split by LF or CRLF,
    no blank line at either end), or None unless every row has ``k`` fields and every CR ends a row."""
    ends, rows, crs = _find_ends(codes, delim)
    if len(ends) != rows * k:
        return None
    ends = ends.reshape(rows, k)
    row_ends = ends[:-1, -1]
    if not (codes[row_ends] == 10).all():  # each row ends at a line end, so has k - 1 delimiters
        return None
    starts = np.empty_like(ends)
    flat = starts.reshape(-1)  # a view (.flat assigns element by element)
    flat[0] = 0
    np.add(ends.reshape(-1)[:-1], 1, out=flat[1:])
    if crs:  # Windows line ends (csv.writer's default): the CR is no part of the last field
        cr = codes[row_ends - 1] == 13
        if int(np.count_nonzero(cr)) != crs:
            return None  # a CR inside a row: the csv module decides what it means
        ends[:-1, -1] -= cr
    return starts, ends


#: Bytes :func:`_find_ends` scans at a time: its masks stay in cache and are allocated once (a mask
#: of a whole 100 MB file cost more in page faults than the comparisons themselves).
_BLOCK = 1 << 20


def _find_ends(codes: np.ndarray, delim: int):
    """``(positions of every delimiter and LF, then len(codes); the number of lines; of CRs)``."""
    nl, dl = np.empty(_BLOCK, bool), np.empty(_BLOCK, bool)
    found, lines, crs = [], 1, 0
    for lo in range(0, len(codes), _BLOCK):
        block = codes[lo : lo + _BLOCK]
        a, b = nl[: len(block)], dl[: len(block)]
        np.equal(block, 10, out=a)
        lines += int(np.count_nonzero(a))
        np.equal(block, 13, out=b)
        crs += int(np.count_nonzero(b))
        np.equal(block, delim, out=b)
        a |= b
        found.append(np.flatnonzero(a) + lo)
    found.append(np.array([len(codes)]))
    return np.concatenate(found), lines, crs


def _has_blank_lines(codes: np.ndarray) -> bool:
    nl = codes == 10
    return bool((nl[1:] & nl[:-1]).any() or (nl[2:] & (codes[1:-1] == 13) & nl[:-2]).any())
