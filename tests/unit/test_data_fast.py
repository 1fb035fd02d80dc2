"""Fast CSV reading (pyarrow, and the NumPy path without it) gives the same bars as the csv module;
from_pandas and from_arrow; the ISO fast parser agrees with the regex path (issue 16, point 13)."""

import numpy as np
import pytest

import cudarl.data.io as dio
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
    monkeypatch.setattr(dio, "_split_plain", no_plain)
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
