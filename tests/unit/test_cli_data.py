"""``cudarl-train data validate`` and ``data synth``: reports, one-line errors, nothing written on failure."""

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import cudarl.datasets as ds
from cudarl.cli import app
from cudarl.data import load

runner = CliRunner()
GOOD = [
    "2020-01-02,10,11,9.5,10.5,1000",
    "2020-01-03,10.5,10.8,10.1,10.2,1100",
    "2020-01-06,10.2,10.9,10,10.7,900",
    "2020-01-07,10.7,11.2,10.6,11,1200",
]
BAD = {  # case -> (the rows, text the error must contain)
    "nan": ([GOOD[0], "2020-01-03,10.5,10.8,10.1,nan,1100"] + GOOD[2:], ["'Close'", "line 3", "--drop-nan"]),
    "non_positive": ([GOOD[0], "2020-01-03,0,10.8,10.1,10.2,1100"] + GOOD[2:], ["'Open'", "line 3", "price <= 0"]),
    "high_low": (GOOD[:3] + ["2020-01-07,10.7,10.9,10.6,11,1200"], ["'High'", "line 5", "High < max(Open, Close)"]),
    "unsorted": ([GOOD[1], GOOD[0]] + GOOD[2:], ["'Date'", "line 3", "--sort"]),
    "duplicate": (GOOD + ["2020-01-07,10.7,11.2,10.6,11,1200"], ["'Date'", "line 5, line 6", "--dedupe"]),
}


def write(path, rows, header="Date,Open,High,Low,Close,Volume"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_validate_prints_the_report_and_writes_it_when_asked(tmp_path):
    p = write(tmp_path / "ok.csv", GOOD)
    r = runner.invoke(app, ["data", "validate", str(p), "--report", str(tmp_path / "data_report.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["bars"] == 4 and rep["source"] == str(p)
    assert json.loads((tmp_path / "data_report.json").read_text()) == rep


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_bad_data_exits_non_zero_names_the_problem_and_writes_nothing(tmp_path, case):
    rows, needles = BAD[case]
    p = write(tmp_path / "bad.csv", rows)
    out = tmp_path / "data_report.json"
    r = runner.invoke(app, ["data", "validate", str(p), "--report", str(out)])
    assert r.exit_code == 1
    assert r.stdout == ""
    for needle in needles + [str(p)]:
        assert needle in r.stderr, (needle, r.stderr)
    assert "Traceback" not in r.stderr
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["bad.csv"]


def test_repair_flags_and_too_few_bars(tmp_path):
    p = write(tmp_path / "x.csv", BAD["unsorted"][0])
    assert runner.invoke(app, ["data", "validate", str(p), "--sort"]).exit_code == 0
    r = runner.invoke(
        app, ["data", "validate", str(write(tmp_path / "d.csv", BAD["duplicate"][0])), "--dedupe", "last"]
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["repairs"] == {"dropped_duplicates_kept_last": 1}
    r = runner.invoke(app, ["data", "validate", str(p), "--sort", "--window", "10"])
    assert r.exit_code == 1 and "--window" in r.stderr
    r = runner.invoke(app, ["data", "validate", str(p), "--dedupe", "middle"])
    assert r.exit_code == 2 and "first or last" in r.stderr
    r = runner.invoke(app, ["data", "validate", str(p), "--column", "close"])
    assert r.exit_code == 2 and "FIELD=NAME" in r.stderr
    r = runner.invoke(app, ["data", "validate", str(tmp_path / "missing.csv")])
    assert r.exit_code == 1 and "file not found" in r.stderr


def test_synth_round_trips_and_never_overwrites(tmp_path):
    out = tmp_path / "regime.csv"
    r = runner.invoke(app, ["data", "synth", "regime", str(out), "--seed", "7", "--n", "250"])
    assert r.exit_code == 0, r.output
    back = load(out, extra_columns=["regime"])
    made = ds.regime(n=250, seed=7)
    for k in ("time", "open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(back, k), getattr(made, k), err_msg=k)
    np.testing.assert_array_equal(back.extra["regime"], made.extra["regime"])
    before = out.read_bytes()
    r = runner.invoke(app, ["data", "synth", "randomwalk", str(out)])
    assert r.exit_code == 1 and "--force" in r.stderr and out.read_bytes() == before
    assert runner.invoke(app, ["data", "synth", "randomwalk", str(out), "--n", "30", "--force"]).exit_code == 0
    assert len(load(out)) == 30
    r = runner.invoke(app, ["data", "synth", "sp500", str(tmp_path / "x.csv")])
    assert (
        r.exit_code == 2
        and "regime, ar, lag, ou, noise, randomwalk, canary" in r.stderr
        and not (tmp_path / "x.csv").exists()
    )


def test_console_entry_point_gives_one_line_and_no_traceback(tmp_path):
    p = write(tmp_path / "bad.csv", BAD["nan"][0])
    r = subprocess.run(
        [sys.executable, "-c", "from cudarl.cli import main; main()", "data", "validate", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr and "NaN" in r.stderr
    r = subprocess.run(
        [sys.executable, "-c", "from cudarl.cli import main; main()", "data", "validate", "builtin:sp500"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["bars"] == 5031
