"""The command line, issue 16 points 7 and 8: train takes the data options of data validate and
says its warnings; the small things a new user met (each reproduced first on b682a3c)."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cudarl.cli import app
from cudarl.data import write_csv
from cudarl.datasets import resolve

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--device", "cpu", "--steps", "20", "--set", "run.eval_every=0", "--set", "run.log_every=10",
    "--set", "env.n_envs=4", "--set", "env.episode_len=32", "--set", "agent.learning_starts=64",
    "--set", "net.hidden=[16]", "--set", "agent.batch_size=16", "--set", "replay.capacity=1000",
]  # fmt: skip


def bars_csv(tmp_path, n=600, name="bars.csv"):
    path = tmp_path / name
    write_csv(resolve(f"builtin:regime?n={n}"), path)
    return path


def test_train_takes_the_repairs_its_errors_suggest(tmp_path):
    p = bars_csv(tmp_path)
    lines = p.read_text().splitlines()
    lines[5], lines[6] = lines[6], lines[5]  # two rows out of order
    p.write_text("\n".join(lines).replace("Close", "Last") + "\n")
    r = runner.invoke(app, ["train", str(p), "--out", str(tmp_path / "runs"), *TINY, "--column", "close=Last"])
    assert r.exit_code == 1 and "--sort" in r.output, r.output  # the error names the flag ...
    r = runner.invoke(
        app, ["train", str(p), "--out", str(tmp_path / "runs"), *TINY, "--sort", "--column", "close=Last"]
    )
    assert r.exit_code == 0, r.output  # ... and train takes it
    (run,) = (tmp_path / "runs").iterdir()
    rep = json.loads((run / "data_report.json").read_text())
    assert rep["repairs"] == {"sorted_rows_out_of_order": 1} and rep["columns"]["close"] == "Last"
    cfg = (run / "config.toml").read_text()
    assert "sort = true" in cfg and 'columns = ["close=Last"]' in cfg  # recorded: --config reruns it
    r = runner.invoke(
        app,
        ["train", "--config", str(run / "config.toml"), "--out", str(tmp_path / "again"), "--steps", "20"],
    )
    assert r.exit_code == 0, r.output


def test_train_says_the_data_warnings(tmp_path):
    p = bars_csv(tmp_path)
    lines = p.read_text().splitlines()
    # a 400-day hole in daily bars: the gap warning of data validate
    first = np.datetime64(lines[301].split(",")[0])
    shifted = [f"{np.datetime64(x.split(',')[0]) + np.timedelta64(400, 'D')},{x.split(',', 1)[1]}" for x in lines[301:]]
    p.write_text("\n".join(lines[:301] + shifted) + "\n")
    assert first
    r = runner.invoke(app, ["train", str(p), "--out", str(tmp_path / "runs"), *TINY])
    assert r.exit_code == 0, r.output
    assert re.search(r"data: warning: gap: .*longer than", r.stderr), r.stderr


def test_data_flags_and_config_section_are_one_thing(tmp_path):
    from cudarl.cli import build_config, data_flags

    cfg, explicit = build_config(
        device="cpu", data_fields=data_flags(True, "last", False, True, "%Y", "Europe/Paris", ["close=Last"], ["x"])
    )
    d = cfg.data
    assert (d.sort, d.dedupe, d.ffill, d.date_format, d.tz) == (True, "last", True, "%Y", "Europe/Paris")
    assert d.columns == ("close=Last",) and d.extra_columns == ("x",)
    cfg, _ = build_config(device="cpu", sets=["data.dedupe=first", 'data.columns=["open=O"]'])
    assert cfg.data.dedupe == "first" and cfg.data.columns == ("open=O",)
    r = runner.invoke(app, ["train", "--device", "cpu", "--tz", "Mars/Olympus"])
    assert r.exit_code == 1 and "Mars/Olympus" in r.output and "IANA" in r.output


# --- point 8 -------------------------------------------------------------------------------------
def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes("Date,Open,High,Low,Close,Note\n2020-01-02,1,1,1,1,caf\xe9\n".encode("latin-1"))
    r = runner.invoke(app, ["data", "validate", str(p)])
    assert r.exit_code == 1 and str(p) in r.stderr and "UTF-8" in r.stderr and "line 2" in r.stderr, r.stderr


def test_a_header_only_file_says_it_has_no_rows(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text("Date,Open,High,Low,Close\n")
    r = runner.invoke(app, ["data", "validate", str(p)])
    assert r.exit_code == 1 and "no data rows" in r.stderr and "time format" not in r.stderr, r.stderr


def test_messages_carry_no_exception_class_names(tmp_path):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    for args in (["train", "--config", str(folder)], ["data", "validate", str(folder)]):
        r = subprocess.run(
            [sys.executable, "-m", "cudarl.cli", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert r.returncode != 0 and str(folder) in r.stderr, r.stderr
        assert not re.search(r"\b[A-Z]\w+(Error|Exception)\b", r.stderr), r.stderr


def test_a_missing_checkpoint_array_is_named_in_full(tmp_path):
    from test_trainer import small

    from cudarl import checkpoint as ckpt
    from cudarl.trainer import Trainer

    t = Trainer(small(tmp_path / "runs"), echo=lambda m: None)
    t.run(30)
    state, info = ckpt.load(t.run_dir / "checkpoints" / "latest.npz")
    del state["agent"]["adam"]["m"]
    ckpt.save(tmp_path / "old.npz", state, info)
    r = runner.invoke(app, ["train", "--resume", str(tmp_path / "old.npz")])
    assert r.exit_code == 1 and "agent/adam/m" in r.output and str(tmp_path / "old.npz") in r.output, r.output


def test_a_missing_matplotlib_is_said_once_with_the_fix(tmp_path, monkeypatch):
    from test_trainer import small

    from cudarl.trainer import Trainer

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    said = []
    Trainer(small(tmp_path / "runs", run={"eval_every": 20}), echo=said.append).run(40)
    hints = [m for m in said if "equity.png" in m]
    assert len(hints) == 1 and "matplotlib" in hints[0] and "cudarl[plot]" in hints[0], said


def test_bench_without_a_gpu_points_at_cpu_and_its_help_cites_no_missing_file():
    from cudarl.backend import cupy_unavailable_reason

    if cupy_unavailable_reason() is None:
        pytest.skip("a GPU is usable here: bench runs")
    r = runner.invoke(app, ["bench", "--steps", "1"])
    assert r.exit_code == 1 and "--cpu" in r.output, r.output
    r = runner.invoke(app, ["bench", "--help"])
    for cited in re.findall(r"[\w/.-]+\.md", r.output):
        assert (ROOT / cited).is_file() or (ROOT / "docs" / cited).is_file(), cited


def test_config_shows_this_hosts_defaults():
    from cudarl.backend import cupy_unavailable_reason
    from cudarl.config import Config, from_dict, resolve_for_backend, tomllib

    r = runner.invoke(app, ["config"])
    assert r.exit_code == 0
    shown = from_dict(tomllib.loads(r.stdout))
    assert shown == resolve_for_backend(Config(), cupy_unavailable_reason() is None, {})


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs /sys, a folder nobody can create files in")
def test_evaluate_into_a_read_only_place_fails_first_with_the_out_hint(tmp_path, monkeypatch):
    from test_trainer import small

    from cudarl.trainer import Trainer

    t = Trainer(small(tmp_path / "runs"), echo=lambda m: None)
    t.run(30)
    import cudarl.evaluate

    ran = []
    monkeypatch.setattr(cudarl.evaluate, "evaluate_positions", lambda *a, **k: ran.append(1))
    r = runner.invoke(app, ["evaluate", str(t.run_dir / "checkpoints" / "latest.npz"), "--out", "/sys/cudarl-x/ev"])
    assert r.exit_code == 1 and "--out" in r.output and "/sys" in r.output, r.output
    assert not ran  # refused before evaluating


def test_lines_said_during_the_progress_bar_start_on_their_own_line():
    from rich.console import Console

    from cudarl.cli import Say, _progress_printer

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    prog, update = _progress_printer(100, console=console)
    say = Say()
    say.prog = prog
    with prog:
        update(40, {"updates_per_s": 10.0, "loss": 1.0}, None)
        prog.refresh()
        say("eval val @ 40: Sharpe 1.23")
        update(50, {"updates_per_s": 10.0, "loss": 1.0}, None)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n")
    assert any(line == "eval val @ 40: Sharpe 1.23" for line in text.split("\n")), repr(text)
