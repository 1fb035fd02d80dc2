"""Fast CSV reading (pyarrow, and the NumPy path without it) gives the same bars as the csv module;
from_pandas and from_arrow; the ISO fast parser agrees with the regex path (issue 16, point 13)."""

import numpy as np
import pytest

import cudarl.data.io as dio
import cudarl.data.text as dtext
from cudarl.data import DataError, from_arrow, from_pandas, load, write_csv
from cudarl.datasets import resolve

FIELDS = ("time", "open", "high", "low", "close", "volume")


def readers(monkeypatch):
    """Each CSV reader alone: (name, undo) with the others switched off."""

    def no_arrow(path):
        raise dio._FallBack

    def no_plain(*a):
        return None

    yield "arrow"
    monkeypatch.setattr(dio, "_read_csv_arrow", no_arrow)
    yield "numpy"
    monkeypatch.setattr(dio, "split_bytes", no_plain)
    yield "csv"


def same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=f)
    assert a.extra.keys() == b.extra.keys()


STAMPS = {
    "daily": lambda t: np.datetime_as_string(t.astype("datetime64[D]")),
    "minutes_z": lambda t: np.char.add(np.datetime_as_string(t.astype("datetime64[s]")), "Z"),
    "space_minutes": lambda t: np.char.replace(np.datetime_as_string(t.astype("datetime64[m]")), "T", " "),
    "millis": lambda t: np.datetime_as_string(t.astype("datetime64[ms]")),
    "mdy": lambda t: np.array(
        [f"{s[5:7]}/{s[8:10]}/{s[:4]}" for s in np.datetime_as_string(t.astype("datetime64[D]"))]
    ),
}


@pytest.mark.parametrize("stamps", sorted(STAMPS))
@pytest.mark.parametrize("layout", ["plain", "crlf_spaces", "quoted", "gz"])
def test_every_reader_gives_the_same_bars(tmp_path, monkeypatch, stamps, layout):
    pytest.importorskip("pyarrow")
    bars = resolve("builtin:randomwalk?n=300")
    step = np.timedelta64(1, "D") + np.timedelta64(7, "m")  # distinct days and distinct minutes
    t = np.datetime64("2001-02-03T04:05:06.123", "ns") + step * np.arange(300)
    cols = [STAMPS[stamps](t)] + [np.array([repr(float(v)) for v in getattr(bars, f)]) for f in FIELDS[1:]]
    sep, end, q = ",", "\n", ""
    if layout == "crlf_spaces":
        sep, end = " , ", "\r\n"
    if layout == "quoted":
        q = '"'
    text = sep.join(["Date", "Open", "High", "Low", "Close", "Volume"]) + end
    text += "".join(sep.join(f"{q}{c[i]}{q}" for c in cols) + end for i in range(len(t)))
    path = tmp_path / ("b.csv.gz" if layout == "gz" else "b.csv")
    if layout == "gz":
        import gzip

        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, newline="")
    got = {name: load(str(path)) for name in readers(monkeypatch)}
    for name in ("arrow", "numpy"):
        same(got[name], got["csv"])
    assert len(got["csv"]) == 300


def test_errors_are_the_same_whatever_the_reader(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    p = tmp_path / "x.csv"
    write_csv(resolve("builtin:randomwalk?n=50"), p)
    lines = p.read_text().splitlines()
    lines[7] = lines[7].replace(",", ",,", 1)  # line 8 has one field too many
    lines[20] = lines[20].split(",")[0] + ",nan,1,1,1,1"  # and a NaN open
    p.write_text("\n".join(lines) + "\n")
    msgs = set()
    for _ in readers(monkeypatch):
        with pytest.raises(DataError) as e:
            load(str(p))
        msgs.add(str(e.value))
    assert len(msgs) == 1 and "line 8 has 7 fields" in msgs.pop()


def test_iso_fast_parser_matches_the_regex_path():
    rng = np.random.default_rng(5)
    ns = rng.integers(-(2**62), 2**62, 500) // 1000 * 1000
    ns[:3] = [0, 951782400 * 10**9, 4107542399 * 10**9]  # 1970, 2000-02-29, 2100-02-28T23:59:59
    for unit in ("D", "m", "s", "ms", "us", "ns"):
        s = list(np.datetime_as_string(ns.astype("datetime64[ns]").astype(f"datetime64[{unit}]")))
        s = [v for v in s if len(v.split("-")[0]) == 4]  # four-digit years
        for vals in (s, [v + "Z" for v in s]):
            fast = dio._parse_iso_numpy(vals, "UTC")
            assert fast is not None
            slow = dio._parse_regex("s", "c", vals, dio.FORMATS["iso"][0], "UTC", "")
            np.testing.assert_array_equal(fast, slow)
    # forms it leaves to the regex path (which reads or names them)
    for vals in (["2020-1-02"], ["2020-01-02T10:00+01:00"], ["2020-02-30"], ["2020-01-02", "2020-01-02 10:00"]):
        assert dio._parse_iso_numpy(vals, "UTC") is None
    np.testing.assert_array_equal(
        dio._parse_iso_numpy(["2020-07-01 12:00"], "America/New_York"),
        dio._parse_regex("s", "c", ["2020-07-01 12:00"], dio.FORMATS["iso"][0], "America/New_York", ""),
    )


def test_from_pandas_and_from_arrow_equal_the_file(tmp_path):
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    bars = resolve("builtin:regime?n=200")
    p = tmp_path / "r.csv"
    write_csv(bars, p)
    want = load(str(p), extra_columns=("regime",))
    df = pd.read_csv(p)
    same(from_pandas(df, extra_columns=("regime",)), want)
    indexed = df.assign(Date=pd.to_datetime(df["Date"])).set_index("Date")
    got = from_pandas(indexed, extra_columns=("regime",))
    same(got, want)
    zoned = indexed.tz_localize("UTC").tz_convert("Asia/Tokyo")  # converted back to UTC
    same(from_pandas(zoned, extra_columns=("regime",)), want)
    same(from_arrow(pa.Table.from_pandas(indexed.reset_index()), extra_columns=("regime",)), want)
    bad = indexed.copy()
    bad.iloc[5, 0] = -1.0
    with pytest.raises(DataError, match=r"<DataFrame>.*'Open': price <= 0 at row 5"):
        from_pandas(bad)
    with pytest.raises(DataError, match="unsorted|backwards"):
        from_pandas(indexed.iloc[::-1])
    same(from_pandas(indexed.iloc[::-1], sort=True, extra_columns=("regime",)), want)


# --- the bulk conversions: the same values as one by one, and no Python string per value -------------
def outcome(path, monkeypatch, **options):
    """``{reader: bars or the DataError's text}`` of ``load(path)`` by each CSV reader alone."""
    out = {}
    for name in readers(monkeypatch):
        try:
            out[name] = load(str(path), **options)
        except DataError as e:
            out[name] = str(e)
    return out


def assert_same_outcome(got):
    want = got["csv"]
    for name in ("arrow", "numpy"):
        if isinstance(want, str):
            assert got[name] == want, name
        else:
            assert not isinstance(got[name], str), got[name]
            same(got[name], want)


ROWS = ["2020-01-02,10.0,11.0,9.5,10.5,1000", "2020-01-03,10.5,10.8,10.1,10.2,1100"]
ROWS += ["2020-01-06,10.2,10.9,10.0,10.7,900", "2020-01-07,10.7,11.2,10.6,11.0,1200"]


@pytest.mark.parametrize(
    "token",
    ["10.7", " 10.7", "10.7\t", "1_0.7", "+10.7", ".107e2", "10.", "010.70", "-10.7", "1-0.7", "nan", "NA", "n/a",
     "", "-", "inf", "Infinity", "0x10", "10,7", "1e400", "١٠٫٧", "10.70000000000000000000000000000000000000000000001",
     "2.5e-324", "abc"],
)  # fmt: skip
def test_every_number_form_reads_as_the_value_by_value_path_reads_it(tmp_path, monkeypatch, token):
    """Whatever a bulk cast takes it reads as float() does; what it leaves, the value-by-value path
    reads (or names): each reader gives the same bars or the same error."""
    pytest.importorskip("pyarrow")
    rows = list(ROWS)
    rows[2] = rows[2].replace("10.2,", f"{token},", 1)  # Open of line 4
    p = tmp_path / "x.csv"
    p.write_text("Date,Open,High,Low,Close,Volume\n" + "\n".join(rows) + "\n", encoding="utf-8")
    got = outcome(p, monkeypatch, drop_nan=token in ("nan", "NA", "", "-"))
    assert_same_outcome(got)


LAYOUTS = {
    "no_final_line_end": lambda h, rows: h + "\n" + "\n".join(rows),
    "blank_lines": lambda h, rows: h + "\n\n" + "\n\n\n".join(rows) + "\n\n",
    "crlf_blank_lines": lambda h, rows: h + "\r\n" + "\r\n\r\n".join(rows) + "\r\n\r\n",
    "tabs": lambda h, rows: (h + "\n" + "\n".join(rows) + "\n").replace(",", "\t"),
    "semicolons_bom": lambda h, rows: "\ufeff" + (h + "\n" + "\n".join(rows) + "\n").replace(",", ";"),
    "text_column": lambda h, rows: h + ",Symbol\n" + "\n".join(r + ",ÅBC" for r in rows) + "\n",
    "short_last_field": lambda h, rows: h + "\n" + "\n".join(rows[:-1] + [rows[-1].rsplit(",", 1)[0] + ",7"]),
    "bare_cr": lambda h, rows: h + "\n" + "\n".join(rows[:2]) + "\r" + "\n".join(rows[2:]) + "\n",
    "ragged": lambda h, rows: h + "\n" + "\n".join(rows[:2] + [rows[2] + ",1"] + rows[3:]) + "\n",
    "header_only": lambda h, rows: h + "\n",
    "crlf_time_last": lambda h, rows: "\r\n".join(",".join(r.split(",")[1:] + r.split(",")[:1]) for r in [h, *rows]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_reads_as_the_csv_module_reads_it(tmp_path, monkeypatch, layout):
    pytest.importorskip("pyarrow")
    rows = [
        f"2020-01-{d:02d}T10:00:00Z,{100 + d}.25,{102 + d}.5,{99 + d}.125,{101 + d}.0,{1000 + d}" for d in range(1, 29)
    ]
    p = tmp_path / "x.csv"
    p.write_bytes(LAYOUTS[layout]("Date,Open,High,Low,Close,Volume", rows).encode("utf-8"))
    got = outcome(p, monkeypatch)
    assert_same_outcome(got)
    if layout not in ("bare_cr", "ragged", "header_only"):
        assert len(got["csv"]) == 28


@pytest.mark.parametrize("reader", ["arrow", "numpy"])
@pytest.mark.parametrize("stamps", ["minutes_z", "epoch_ms", "minutes_z_last"])
def test_a_plain_file_is_read_without_a_python_string_per_value(tmp_path, monkeypatch, reader, stamps):
    """Numbers and ISO or epoch times go through the bulk conversions; no column is turned into a
    list of str (the per-row Python that made loading 1M rows take seconds)."""
    if reader == "arrow":
        pytest.importorskip("pyarrow")
    else:
        monkeypatch.setattr(dio, "_read_csv_arrow", lambda path: (_ for _ in ()).throw(dio._FallBack))
    bars = resolve("builtin:randomwalk?n=2000&bar_minutes=1")
    p = tmp_path / "b.csv"
    write_csv(bars, p)
    if stamps == "epoch_ms":
        lines = p.read_text().splitlines()
        ms = bars.time // 1_000_000
        p.write_text(
            "\n".join([lines[0]] + [f"{t}," + ln.split(",", 1)[1] for t, ln in zip(ms, lines[1:], strict=True)]) + "\n"
        )
    if stamps == "minutes_z_last":  # the time in the last field, before each CR of the CRLF line ends
        lines = p.read_bytes().decode().split("\r\n")
        p.write_bytes("\r\n".join(",".join(ln.split(",")[1:] + ln.split(",")[:1]) for ln in lines).encode())
    want = load(str(p))

    def no_strings(self):
        raise AssertionError(f"{type(self).__name__} made a list of str")

    for cls in (dtext.ArrowText, dtext.BytesText):
        monkeypatch.setattr(cls, "strings", no_strings)
    same(load(str(p)), want)
    np.testing.assert_array_equal(load(str(p)).time, bars.time)


def test_iso_runs_of_one_date_parse_as_the_regex_path():
    """Days are counted once per run of equal dates: minute bars over midnight, month and year ends,
    29 February, and dates that come back (unsorted rows), against the regex path."""
    t = [np.arange("1999-12-31T23:00", "2000-01-01T01:00", dtype="datetime64[m]")]
    t += [np.arange("2000-02-28T23:58", "2000-03-01T00:02", dtype="datetime64[m]")]
    t += [np.array(["2000-02-29T12:00", "1999-12-31T00:00", "2000-02-29T12:01", "2100-02-28T23:59"], "datetime64[m]")]
    stamps = np.concatenate(t)
    for unit, suffix in (("m", ""), ("s", "Z"), ("ms", "")):
        vals = [v + suffix for v in np.datetime_as_string(stamps.astype(f"datetime64[{unit}]"))]
        fast = dio._parse_iso_numpy(vals, "UTC")
        slow = dio._parse_regex("s", "c", vals, dio.FORMATS["iso"][0], "UTC", "")
        np.testing.assert_array_equal(fast, slow)
        np.testing.assert_array_equal(fast, stamps.astype("datetime64[ns]").view(np.int64))
    for bad in (["2000-02-29 10:00", "2001-02-29 10:00"], ["2000-13-01"], ["2000-00-10"], ["2000-01-01T24:00"]):
        assert dio._parse_iso_numpy(bad, "UTC") is None


def test_what_the_csv_module_cannot_read_is_named_by_line():
    text = "Date,Open\n2020-01-02,1\n2020-01-03," + "9" * 200_000 + "\n"  # over the csv module's field limit
    with pytest.raises(DataError, match=r"x\.csv: line 3 is not CSV \(field larger than field limit"):
        dio._read_csv_text("x.csv", text)


def test_plain_decimals_are_float_to_the_bit(rng):
    """The fast path for prices and volumes (M / 10^k, one exact division) gives float()'s bits, and
    leaves every other form to float()."""
    vals = []
    for _ in range(50_000):
        nd = int(rng.integers(1, 16))
        digits = "".join(rng.choice(list("0123456789"), nd))
        k = int(rng.integers(0, nd + 3))
        s = digits if k == 0 else (digits[:-k] + "." + digits[-k:] if k <= nd else "." + "0" * (k - nd) + digits)
        vals.append(("-" if rng.random() < 0.3 else "") + s)
    vals += ["9007199254740991", "-0", "-0.0", ".5", "5.", "000000.000001", "0.1", "0.3", "2.675", "1.005"]
    others = ["1e5", "+1", " 1", "1 ", "1_0", "1.2.3", "-", ".", "1-2", "--1", "nan", "inf", "١", "12\x0034"]
    vals += others
    raw = [v.encode() for v in vals]
    w = max(map(len, raw))
    m = np.frombuffer(b"".join(r.ljust(w, b"\0") for r in raw), np.uint8).reshape(len(raw), w).copy()
    inside = np.arange(w) < np.array([len(r) for r in raw])[:, None]
    got, ok = dtext.plain_decimals(m, inside)
    assert ok[: -len(others)].all() and not ok[-len(others) :].any()
    want = np.array([float(v) for v in vals[: -len(others)]])
    np.testing.assert_array_equal(got[ok].view(np.int64), want.view(np.int64))
