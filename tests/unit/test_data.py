"""Loading, strict validation, repairs, warnings, report and the built-in data sets."""

import configparser
import fnmatch
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

import cudarl.datasets as ds
from cudarl.data import Bars, DataError, load, write_report
from cudarl.data.bars import NS_PER_DAY

ROOT = Path(__file__).resolve().parents[2]
GOOD_ROWS = [
    ("2020-01-02", 10.0, 11.0, 9.5, 10.5, 1000),
    ("2020-01-03", 10.5, 10.8, 10.1, 10.2, 1100),
    ("2020-01-06", 10.2, 10.9, 10.0, 10.7, 900),
    ("2020-01-07", 10.7, 11.2, 10.6, 11.0, 1200),
    ("2020-01-08", 11.0, 11.1, 10.4, 10.6, 800),
]
HEADER = "Date,Open,High,Low,Close,Volume"


def write(path, rows, header=HEADER):
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


def days(*iso):
    return np.array(iso, dtype="datetime64[ns]").view(np.int64)


# ------------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    "stamps, expected",
    [
        (["2020-01-02", "2020-01-03"], ["2020-01-02T00:00", "2020-01-03T00:00"]),
        (["2020-01-02T14:30:00Z", "2020-01-02T15:30:00Z"], ["2020-01-02T14:30", "2020-01-02T15:30"]),
        (["2020-01-02 16:30:00+02:00", "2020-01-02 17:30:00+02:00"], ["2020-01-02T14:30", "2020-01-02T15:30"]),
        (["1/2/2020", "12/31/2020"], ["2020-01-02T00:00", "2020-12-31T00:00"]),
        (["02.01.2020 14:30:00.250", "02.01.2020 15:30:00.000"], ["2020-01-02T14:30:00.250", "2020-01-02T15:30"]),
        (["1577975400", "1577979000"], ["2020-01-02T14:30", "2020-01-02T15:30"]),
        (["1577975400000", "1577979000500"], ["2020-01-02T14:30", "2020-01-02T15:30:00.500"]),
    ],
)
def test_time_formats_are_recognised_and_read_as_utc(tmp_path, stamps, expected):
    rows = [(s,) + GOOD_ROWS[i][1:] for i, s in enumerate(stamps)]
    bars = load(write(tmp_path / "x.csv", rows))
    assert bars.time.tolist() == days(*expected).tolist()


def test_explicit_format_and_time_zone(tmp_path):
    rows = [("20200102 0930",) + GOOD_ROWS[0][1:], ("20200102 1030",) + GOOD_ROWS[1][1:]]
    bars = load(write(tmp_path / "x.csv", rows), date_format="%Y%m%d %H%M", tz="America/New_York")
    assert bars.time.tolist() == days("2020-01-02T14:30", "2020-01-02T15:30").tolist()  # EST is UTC-5
    summer = [("2020-07-01 09:30",) + GOOD_ROWS[0][1:], ("2020-07-01 10:30",) + GOOD_ROWS[1][1:]]
    bars = load(write(tmp_path / "y.csv", summer), tz="America/New_York")
    assert bars.time.tolist() == days("2020-07-01T13:30", "2020-07-01T14:30").tolist()  # EDT is UTC-4


def test_columns_matched_case_insensitively_with_aliases(tmp_path):
    rows = [(r[0] + " 00:00", r[0]) + r[1:5] + (r[4], r[5]) for r in GOOD_ROWS]
    p = write(
        tmp_path / "x.csv",
        [
            (a, b, c, d, e, f, g, h)
            for a, b, c, d, e, f, g, h in [(r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[0]) for r in rows]
        ],
        header="junk,OPEN,high,Low,CLOSE,Adj_Close,VOL,DateTime",
    )
    bars = load(p)
    assert (
        bars.columns["time"] == "DateTime"
        and bars.columns["adj_close"] == "Adj_Close"
        and bars.columns["volume"] == "VOL"
    )
    np.testing.assert_array_equal(bars.close, [r[4] for r in GOOD_ROWS])
    # volume and adjusted close are optional; separate Date and Time columns are joined
    p = write(
        tmp_path / "y.csv", [(r[0], "13:00", r[1], r[2], r[3], r[4]) for r in GOOD_ROWS], header="date,time,o,h,l,c"
    )
    bars = load(p)
    assert bars.volume is None and bars.time[0] == days("2020-01-02T13:00")[0]
    bars = load(p, columns={"close": "o"})  # an override wins over the alias
    np.testing.assert_array_equal(bars.close, bars.open)


def test_gzip_csv_with_semicolons(tmp_path):
    p = tmp_path / "x.csv.gz"
    p.write_bytes(
        gzip.compress(("Date;Open;High;Low;Close\n" + "\n".join(";".join(map(str, r[:5])) for r in GOOD_ROWS)).encode())
    )
    bars = load(p)
    assert len(bars) == 5 and bars.close[-1] == 10.6 and bars.volume is None


def test_parquet_naive_and_zoned_timestamps(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
    import pyarrow.parquet as pq

    t = days(*[r[0] for r in GOOD_ROWS]).astype("datetime64[ns]")
    for zone in (None, "Europe/Berlin"):
        ts = pa.array(t, type=pa.timestamp("ns"))
        if zone:  # the same instants, marked with a zone: must read back as the same UTC times
            ts = pa.array(t.view(np.int64), type=pa.timestamp("ns", tz=zone))
        table = pa.table(
            {
                "Timestamp": ts,
                **{k: [r[i] for r in GOOD_ROWS] for i, k in enumerate(["Open", "High", "Low", "Close"], 1)},
            }
        )
        pq.write_table(table, tmp_path / "x.parquet")
        bars = load(tmp_path / "x.parquet")
        assert bars.time.tolist() == t.view(np.int64).tolist()


# ------------------------------------------------------------------------------ bad data

BAD = {
    # case: (edit to the good rows, code, column, where, fix)
    "nan": (
        lambda r: r.__setitem__(2, (r[2][0], r[2][1], r[2][2], r[2][3], "nan", r[2][5])),
        "nan",
        "Close",
        "line 4",
        "drop_nan",
    ),
    "missing": (
        lambda r: r.__setitem__(3, (r[3][0], "", r[3][2], r[3][3], r[3][4], r[3][5])),
        "nan",
        "Open",
        "line 5",
        "ffill",
    ),
    "inf": (
        lambda r: r.__setitem__(1, (r[1][0], r[1][1], "inf", r[1][3], r[1][4], r[1][5])),
        "nan",
        "High",
        "line 3",
        "drop_nan",
    ),
    "non_positive": (
        lambda r: r.__setitem__(2, (r[2][0], r[2][1], r[2][2], -1.0, r[2][4], r[2][5])),
        "non_positive",
        "Low",
        "line 4",
        "correct or delete",
    ),
    "high": (
        lambda r: r.__setitem__(4, (r[4][0], r[4][1], 10.9, r[4][3], r[4][4], r[4][5])),
        "high_low",
        "High",
        "line 6",
        "correct or delete",
    ),
    "low": (
        lambda r: r.__setitem__(0, (r[0][0], r[0][1], r[0][2], 10.2, r[0][4], r[0][5])),
        "high_low",
        "Low",
        "line 2",
        "correct or delete",
    ),
    "unsorted": (lambda r: r.insert(1, r.pop(3)), "unsorted", "Date", "line 4", "sort=True"),
    "duplicate": (lambda r: r.__setitem__(2, (r[1][0],) + r[2][1:]), "duplicate", "Date", "line 3, line 4", "dedupe="),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_case_gives_its_own_error(tmp_path, case):
    edit, code, column, where, fix = BAD[case]
    rows = list(GOOD_ROWS)
    edit(rows)
    p = write(tmp_path / "bad.csv", rows)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(DataError) as info:
        load(p)
    err = info.value
    assert err.codes == [code], str(err)
    (prob,) = err.problems
    assert prob.column == column
    text = str(err)
    assert str(p) in text and where in text and column in text and fix in text, text
    assert sorted(tmp_path.iterdir()) == before  # loading writes nothing


def test_missing_column_and_too_few_bars(tmp_path):
    p = write(tmp_path / "x.csv", [r[:4] for r in GOOD_ROWS], header="Date,Open,High,Low")
    with pytest.raises(DataError) as info:
        load(p)
    assert (
        info.value.codes == ["missing_column"]
        and "no close column" in str(info.value)
        and "--column close=NAME" in str(info.value)
    )
    with pytest.raises(DataError) as info:
        load(write(tmp_path / "y.csv", GOOD_ROWS), min_bars=6)
    assert info.value.codes == ["too_few_bars"] and "--window" in str(info.value)


def test_every_problem_is_reported_at_once(tmp_path):
    rows = list(GOOD_ROWS)
    BAD["nan"][0](rows)
    BAD["high"][0](rows)
    BAD["unsorted"][0](rows)
    with pytest.raises(DataError) as info:
        load(write(tmp_path / "x.csv", rows))
    assert sorted(info.value.codes) == ["high_low", "nan", "unsorted"]


def test_unreadable_time_names_row_and_option(tmp_path):
    rows = list(GOOD_ROWS)
    rows[3] = ("2020-13-01",) + rows[3][1:]
    with pytest.raises(DataError) as info:
        load(write(tmp_path / "x.csv", rows))
    assert info.value.codes == ["bad_time"] and "line 5" in str(info.value) and "date_format" in str(info.value)


# -------------------------------------------------------------------------------- repairs


def test_sort_and_dedupe_keep_the_row_asked_for(tmp_path):
    rows = list(GOOD_ROWS)
    rows.insert(1, rows.pop(3))
    rows.append((GOOD_ROWS[1][0], 10.5, 10.6, 10.0, 10.3, 5))  # a second 2020-01-03, last in the file
    p = write(tmp_path / "x.csv", rows)
    with pytest.raises(DataError) as info:
        load(p, sort=True)
    assert info.value.codes == ["duplicate"]
    first = load(p, sort=True, dedupe="first")
    last = load(p, sort=True, dedupe="last")
    assert np.all(np.diff(first.time) > 0) and len(first) == 5
    assert first.close[1] == 10.2 and last.close[1] == 10.3
    assert first.repairs == {"sorted_rows_out_of_order": 2, "dropped_duplicates_kept_first": 1}
    assert first.rows.tolist() == [0, 2, 3, 1, 4]  # file rows, for later messages


def test_drop_nan_and_ffill(tmp_path):
    rows = list(GOOD_ROWS)
    rows[2] = (rows[2][0], "nan", "", 10.0, 10.7, "")
    p = write(tmp_path / "x.csv", rows)
    dropped = load(p, drop_nan=True)
    assert len(dropped) == 4 and dropped.repairs == {"dropped_nan_rows": 1}
    filled = load(p, ffill=True)
    assert len(filled) == 5 and filled.repairs == {"forward_filled_rows": 1}
    assert [filled.open[2], filled.high[2], filled.low[2], filled.close[2], filled.volume[2]] == [10.2] * 4 + [0.0]
    rows[0] = (rows[0][0], "nan") + rows[0][2:]
    with pytest.raises(DataError) as info:  # nothing to fill the first bar from
        load(write(tmp_path / "y.csv", rows), ffill=True)
    assert "first row" in str(info.value)


def test_gap_and_split_warnings(tmp_path):
    n = 60
    t = np.datetime64("2020-01-01T00:00") + np.arange(n) * np.timedelta64(1, "h")
    t[40:] += np.timedelta64(30, "h")
    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.002, n)))
    close[30:] /= 2.0  # an unadjusted 2:1 split
    rows = [(str(t[i]), close[i], close[i] * 1.001, close[i] * 0.999, close[i]) for i in range(n)]
    bars = load(write(tmp_path / "x.csv", rows, header="time,open,high,low,close"))
    gaps = [w for w in bars.warnings if w.startswith("gap")]
    splits = [w for w in bars.warnings if w.startswith("split?")]
    assert len(gaps) == 1 and "line 42" in gaps[0] and "1 spacings" in gaps[0]
    assert len(splits) == 1 and "line 32" in splits[0] and "2:1" in splits[0]
    assert load("builtin:sp500").warnings == ()  # 2008 does not look like a split


def test_report_contents_and_file(tmp_path):
    bars = load(write(tmp_path / "x.csv", GOOD_ROWS))
    rep = write_report(bars, tmp_path / "out" / "data_report.json")
    on_disk = json.loads((tmp_path / "out" / "data_report.json").read_text())
    assert on_disk == rep
    assert rep["bars"] == 5 and rep["first"] == "2020-01-02T00:00:00.000Z" and rep["has_volume"]
    assert rep["close"]["last"] == 10.6 and len(rep["sha256"]) == 64
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temporary left


# ------------------------------------------------------------------------------- builtins


@pytest.mark.parametrize("name, n, ppy", [("sp500", 5031, 252.0), ("nasdaq", 5031, 252.0), ("eurusd-1h", 6225, None)])
def test_real_series_load_clean_with_their_licences(name, n, ppy):
    bars = load(f"builtin:{name}")
    assert len(bars) == n and np.all(np.diff(bars.time) > 0)
    got, how = bars.infer_periods_per_year()
    if ppy:
        assert got == ppy and "snapped" in how
    else:
        assert 6000 < got < 6400  # ~24 h x 5 days x 52 weeks
    notice = ds.licence_notice(name)
    assert ("Kevin Sheppard" in notice) if name != "eurusd-1h" else ("MIT License" in notice)


def test_dataset_files_are_declared_as_package_data():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["cudarl.datasets"].split(",")]
    assert "cudarl.datasets" in cfg["options"]["packages"].split()
    shipped = [p.name for p in (ROOT / "cudarl" / "datasets").iterdir() if p.is_file() and not p.name.endswith(".py")]
    for name in shipped:
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns), f"{name} is not in package_data"
    for file, notice in ds.REAL.values():
        assert file in shipped and notice in shipped


def test_regime_optimal_policy_earns_the_documented_sharpe():
    # Sharpe estimate's standard error ~ sqrt((1 + SR_bar^2 / 2) / n) per bar; 4 of them, annualised
    n, c = 68_000, 2e-4  # the most daily bars int64 nanoseconds hold is 68425
    bars = ds.regime(n=n, seed=11)
    s = ds.regime_optimal_positions(bars)[:-1]
    R = bars.close[1:] / bars.close[:-1] - 1
    net = s * R - c * np.abs(np.diff(np.concatenate([[0.0], s])))
    sr = net.mean() / net.std(ddof=1) * math.sqrt(252)
    expected = ds.regime_sharpe(cost_rate=c)
    tol = 4 * math.sqrt((1 + (expected / math.sqrt(252)) ** 2 / 2) / n) * math.sqrt(252)
    assert abs(sr - expected) < tol, (sr, expected, tol)
    assert abs(ds.regime_sharpe() - 0.2 * math.sqrt(252)) < 1e-12  # mu / sigma * sqrt(252)
    # the signal is the only edge: the opposite policy loses, and so does a lagged one
    assert (-s * R).mean() < 0
    assert (np.roll(s, 60) * R)[60:].mean() < net.mean() / 2


def test_randomwalk_has_no_edge_and_seeds_repeat():
    a, b = ds.randomwalk(n=50_000, seed=3), ds.randomwalk(n=50_000, seed=3)
    assert np.array_equal(a.close, b.close) and not np.array_equal(a.close, ds.randomwalk(n=50_000, seed=4).close)
    R = a.close[1:] / a.close[:-1] - 1
    momentum = np.sign(R[:-1]) * R[1:]
    assert abs(momentum.mean()) < 4 * momentum.std() / math.sqrt(momentum.size)  # |t| < 4
    assert load("builtin:randomwalk?n=100&seed=3").close.tolist() == ds.randomwalk(n=100, seed=3).close.tolist()
    assert load("builtin:regime?n=300").periods_per_year == 252.0


def test_unknown_builtin_and_parameter():
    with pytest.raises(DataError, match="no built-in data set 'spx'"):
        load("builtin:spx")
    with pytest.raises(DataError, match="unknown parameter 'drift'"):
        load("builtin:regime?drift=0.1")


def test_bars_take_keeps_columns_together():
    b = ds.regime(n=50)
    t = b.take(slice(10, 20))
    assert isinstance(t, Bars) and len(t) == 10 and t.extra["regime"].shape == (10,)
    assert t.rows.tolist() == list(range(10, 20)) and t.time[0] == b.time[10]
    assert (b.time[1] - b.time[0]) % NS_PER_DAY == 0


def test_builtin_synthetic_sets_refuse_more_daily_bars_than_int64_nanoseconds_hold():
    # The seed of this test: builtin:regime?n=200000 wrapped past 2262 and failed later as
    # "time goes backwards at row 68425"; now the parameter is refused with the limit named.
    from cudarl.data import load

    with pytest.raises(DataError, match="at most 68425 bars"):
        load("builtin:regime?n=200000")
    with pytest.raises(DataError, match=r"p must be in \(0, 1\)"):
        load("builtin:regime?p=2")
    bars = load("builtin:randomwalk?n=68425")
    assert np.all(np.diff(bars.time) > 0)
    # longer synthetic series: intraday bars (the 4M-bar epoch benchmark uses minute bars)
    bars = load("builtin:regime?n=200000&bar_minutes=1")
    assert len(bars) == 200000 and np.all(np.diff(bars.time) == 60 * 10**9)
    with pytest.raises(DataError, match="bar_minutes must be an integer >= 0"):
        load("builtin:canary?bar_minutes=-5")


def test_business_days_are_weekdays_from_a_monday():
    import numpy as np

    from cudarl.datasets import START, business_days

    d = business_days(12).astype("datetime64[ns]").astype("datetime64[D]")
    assert np.array_equal(d, np.busday_offset(START, np.arange(12), roll="forward"))
    with pytest.raises(ValueError, match="Monday"):
        business_days(3, start=np.datetime64("2000-01-04", "D"))
