"""Start-up: the stopwatch behind ``Trainer.timings``, tools/bench_startup.py, and the set-up cuts
(features and the normaliser in row blocks, the fit in place) that must keep every bit."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudarl import features, kernels
from cudarl.bench import reference_bars
from cudarl.config import from_dict
from cudarl.features import FeatureConfig, Features, Normaliser, compute
from cudarl.timing import Stopwatch

ROOT = Path(__file__).resolve().parents[2]


def test_stopwatch_moves_kernel_time_to_compile(monkeypatch):
    monkeypatch.setattr(kernels, "load_seconds", {"wait": 0.0, "load": 0.0})
    t = {}
    sw = Stopwatch(t)
    sw.lap("a")
    assert set(t) == {"a"} and t["a"] >= 0
    kernels.load_seconds["wait"] += 0.25  # as if a lap had waited for a compile
    kernels.load_seconds["load"] += 0.05
    sw.lap("b")
    assert t["compile"] == pytest.approx(0.30)
    assert t["b"] < 0  # the fake 0.3 s did not pass on the clock: it was taken out of the lap
    sw.lap("a")
    assert t["compile"] == pytest.approx(0.30)  # laps add up; no new kernel time


def test_trainer_timings_cover_construction_and_prime():
    import time

    from cudarl.trainer import Trainer

    cfg = from_dict(
        {
            "run": {"device": "cpu", "eval_every": 0, "checkpoint_every": 0},
            "env": {"n_envs": 8, "episode_len": 64},
            "replay": {"capacity": 4096},
            "agent": {"batch_size": 32, "learning_starts": 64},
            "net": {"hidden": [32, 32]},
        }
    )
    t0 = time.perf_counter()
    tr = Trainer(cfg, run_dir=False, bars=reference_bars(3000), echo=lambda m: None)
    tr.prime()
    wall = time.perf_counter() - t0
    stages = {"backend", "data", "features", "allocation", "run_dir", "capture", "prime_collect"}
    assert set(tr.timings) == stages  # no kernels on the CPU: no "compile"
    assert all(v >= 0 for v in tr.timings.values())
    assert sum(tr.timings.values()) <= wall
    assert tr.timings["prime_collect"] > 0 and tr.collect_steps > 0


# --- the set-up cuts keep every bit -----------------------------------------------------------------


def test_features_in_row_blocks_equal_the_whole_matrix(monkeypatch):
    bars = reference_bars(1500, n_features=20)
    whole = compute(bars, FeatureConfig(extra=("*",)))
    monkeypatch.setattr(features, "_ROWS_PER_BLOCK", 7)  # block edges inside and across the warm-up
    blocks = compute(bars, FeatureConfig(extra=("*",)))
    assert blocks.names == whole.names and blocks.values.dtype == np.float32
    np.testing.assert_array_equal(blocks.values.view(np.uint32), whole.values.view(np.uint32))
    assert not blocks.values[: whole.warmup].any() and blocks.values[whole.warmup :].any()


def test_a_non_finite_feature_is_named_at_its_bar_across_blocks(monkeypatch):
    monkeypatch.setattr(features, "_ROWS_PER_BLOCK", 64)
    bars = reference_bars(1500, n_features=20)
    bars.extra["noise_03"][1234] = np.nan
    with pytest.raises(ValueError, match=r"feature 'noise_03' .*not finite at bar 1234,"):
        compute(bars, FeatureConfig(extra=("*",)))


def test_normaliser_in_blocks_equals_the_formula(monkeypatch, rng):
    x = (rng.standard_normal((1000, 9)) * rng.uniform(0.1, 50, 9) + rng.uniform(-5, 5, 9)).astype(np.float32)
    x[17, 3] = np.nan
    center = np.arange(9) % 2 == 0
    f = Features(values=x, names=tuple(f"c{j}" for j in range(9)), warmup=10)
    n = Normaliser.fit(f, (0, 1000), center=center)
    ok = np.asarray(x[10:1000], np.float64)  # the fit as written before: copies, no in-place steps
    mean = np.where(center, ok.mean(axis=0), 0.0)
    std = np.sqrt(((ok - mean) ** 2).mean(axis=0))
    np.testing.assert_array_equal(n.mean, mean)
    np.testing.assert_array_equal(n.std, np.where(std > 1e-12, std, 1.0))
    want = np.clip((x.astype(np.float64) - n.mean) / n.std, -n.clip, n.clip).astype(np.float32)
    monkeypatch.setattr(features, "_ROWS_PER_BLOCK", 33)
    got = n.transform(x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(n.transform(x[5]).view(np.uint32), want[5].view(np.uint32))  # one row [F]
    three = n.transform(x.reshape(10, 100, 9))
    np.testing.assert_array_equal(three.reshape(1000, 9).view(np.uint32), want.view(np.uint32))
    assert n.transform(np.zeros((0, 9), np.float32)).shape == (0, 9)


def test_reference_bars_count_features_on_a_short_series():
    bars = reference_bars(3000, n_features=20)
    assert len(compute(bars, FeatureConfig(extra=("*",))).names) == 20  # the short series gave the right count


# --- tools/bench_startup.py ---------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_startup_reports_each_stage_on_the_cpu(tmp_path):
    out = tmp_path / "startup.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "bench_startup.py"),
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    rows = {(x["case"].split(" kernel cache")[0], x["metric"].strip()): x["value"] for x in rep["rows"]}
    for state in ("warm", "cold"):
        case = f"CPU (cpu), {state}"
        total = rows[(case, "start to first update, median of 1")]
        parts = [
            rows[(case, k)]
            for k in ("interpreter", "import", "config", "backend", "data", "features", "allocation")
            + ("run_dir", "capture", "compile", "prime", "first_update", "other")
        ]
        assert total > 0 and sum(parts) == pytest.approx(total)
        assert rows[(case, "import")] > 0 and rows[(case, "first_update")] > 0 and rows[(case, "compile")] == 0
    (run,) = rep["runs"]["cpu"]["warm"]
    assert run["backend"] == "numpy" and run["families_compiled"] == 0
    # the children imported byte-compiled modules (a host with PYTHONDONTWRITEBYTECODE and a fresh tree
    # would otherwise compile every module in every child)
    assert rep["bytecode"] == "compiled before the runs (compileall)"
    src = ROOT / "cudarl" / "trainer.py"
    assert Path(importlib.util.cache_from_source(str(src))).stat().st_mtime >= src.stat().st_mtime
