#!/usr/bin/env python3
"""Loading bars and evaluating a trained policy, timed from the start of a fresh process.

Arms (each run in its own Python process, ``--repeats`` rounds that run each arm of a kind once in turn,
after one uncounted run of each; ``--only load|evaluate``; the minimum and the median are
reported, with the processes' CPU time, and the load average around the runs in the JSON: on a
busy machine the wall times grow and the minimum is the one to read):
* load: ``cudarl.data.load`` of a CSV of 1,000,000 one-minute bars (Date, OHLC, Volume; about
  110 MB of ``repr`` floats), with pyarrow's CSV reader (when pyarrow is installed) and with the
  NumPy path (pyarrow hidden). Rows: the ``load()`` call itself (imports it triggers included) and
  the whole process. Targets: 1M rows in < 1 s with pyarrow, < 3 s without.
* evaluate: ``cudarl.load_policy(best.safetensors).evaluate(split="test")`` over a test split of
  10,000 bars (``builtin:regime?n=66700``), on the CPU and on the GPU when one is usable: from the
  process's spawn to the evaluation's result (interpreter, imports, features of every bar, the greedy
  walk, the metrics; the issue's "evaluating 10,000 bars takes under 1 s after the process starts",
  target < 1 s), the whole process to its exit (which adds the interpreter's and, on the GPU, the CUDA
  context's teardown: about 0.1 s more than the CPU's on the H200 host at 29f4555, 0.1 s even with
  ``os._exit``), and the part inside Python after ``import cudarl``. On the GPU also
  without :func:`cudarl.backend.warm_up` (CuPy's import, the device's start and the policy's network on
  it then wait for the first forward, after the bars' features): the difference is the warm-up's share
  (the policy's network and walk plans are made in the warm-up thread since ``41cbc02``). The policy
  is trained with the validation gate off (``eval.gate_psr = 0``), so the test split is walked bar
  by bar (a closed gate would leave it flat without a forward; the bench refuses that case). Its
  trades are in the JSON: the host walk evaluates a block of bars per forward up to the first
  position change, so its cost grows with the trades (this barely trained policy changes position
  on about a third of the bars).

The CSV and the policy are made once in a temporary folder (not timed), and cudarl's modules are
byte-compiled first (``compileall``), as an installed package has them: where a checkout's processes
write no ``.pyc`` (``PYTHONDONTWRITEBYTECODE=1`` on the development box; on the H200 host at 3795f4e a
profiled evaluation after the timed runs still compiled 242 modules from source, 0.57 s under the
profiler) every timed process would compile every module. Prints a table and writes JSON (``--out``,
default ``docs/bench/bench_load_eval_<cpu|gpu>.json``).
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import commit, parser, report, row  # noqa: E402

LOAD_ROWS = 1_000_000
EVAL_DATA = "builtin:regime?n=66700"  # the test split (15% of the bars after the warm-up) has ~10,000 bars

LOAD_CODE = """
import sys, time, json
t0 = time.perf_counter()
if {hide}:
    sys.modules["pyarrow"] = None  # as if pyarrow were not installed
import cudarl.data
t1 = time.perf_counter()
bars = cudarl.data.load({path!r})
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "bars": len(bars)}}))
"""

EVAL_CODE = """
import time, json
t0 = time.perf_counter()
import cudarl
t1 = time.perf_counter()
if {no_warm_up}:  # the comparison arm: CuPy's import and the device's start after the file is read
    import cudarl.backend
    cudarl.backend.warm_up = lambda *a, **k: None
policy = cudarl.load_policy({path!r}, device={device!r})
ev = policy.evaluate(split="test")
t2, done_at = time.perf_counter(), time.time()
out = {{"import_s": t1 - t0, "eval_s": t2 - t1, "done_at": done_at, "bars": len(ev.position)}}
print(json.dumps({{**out, "trading": ev.summary["deployment"]["trading"], "trades": ev.summary["policy"]["trades"]}}))
"""


def timed_process(code: str) -> tuple[float, float, dict]:
    """(wall seconds of a fresh ``python -c code`` from spawn to exit, its CPU seconds (user and
    system, all its threads), the JSON it printed). A ``done_at`` it printed (its ``time.time()`` when
    its work was done) becomes ``result_s``, seconds from the spawn to then."""
    before = _children_cpu()
    t0, spawned_at = time.perf_counter(), time.time()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "done_at" in out:
        out["result_s"] = out.pop("done_at") - spawned_at
    return wall, _children_cpu() - before, out


def _children_cpu() -> float:
    """CPU seconds of this process's finished children so far (one runs at a time here)."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def timed_runs(codes: dict, repeats: int) -> dict:
    """``{arm: {"wall": [s], "cpu": [s], <each float the process printed>: [values]}}`` for each arm's
    code of ``codes``, over ``repeats`` rounds that run every arm once, in turn: so a drift of the host's
    load hits every arm alike. Before them, one more run of each arm that is not counted: the first
    process of an arm reads what the others find in the page cache (on a freshly started H200 host at
    87a5720, every arm's runs were slower when the bench ran first). That run's wall time is kept as
    ``"uncounted_wall"``."""
    uncounted = {arm: timed_process(code)[0] for arm, code in codes.items()}
    runs = {arm: [] for arm in codes}
    for _ in range(repeats):
        for arm, code in codes.items():
            runs[arm].append(timed_process(code))
    out = {}
    for arm, got in runs.items():
        o = out[arm] = {"wall": [w for w, _, _ in got], "cpu": [c for _, c, _ in got], "uncounted_wall": uncounted[arm]}
        for k, v in got[0][2].items():
            o[k] = [r[k] for _, _, r in got] if isinstance(v, float) else v
    return out


def timing_rows(case: str, name: str, values: list, target: str = "") -> list:
    """Rows of the minimum and the median of ``values`` (seconds)."""
    return [
        row(case, f"{name}, min", min(values), "s", target),
        row(case, f"{name}, median", statistics.median(values), "s", target),
    ]


def make_csv(folder: Path) -> Path:
    from cudarl.data import write_csv
    from cudarl.datasets import resolve

    path = folder / "bars_1m.csv"
    write_csv(resolve(f"builtin:randomwalk?n={LOAD_ROWS}&bar_minutes=1"), path)
    return path


def make_policy(folder: Path) -> Path:
    from cudarl.config import from_dict, resolve_for_backend
    from cudarl.trainer import Trainer

    cfg = resolve_for_backend(from_dict({"run": {"device": "cpu"}}), False, {})
    cfg = from_dict(
        {
            "run": {"steps": 20, "eval_every": 20, "checkpoint_every": 0, "out_dir": str(folder)},
            "data": {"source": EVAL_DATA},
            "eval": {"gate_psr": 0.0},  # the gate off: the test split is walked (a closed gate walks nothing)
            "env": {"n_envs": 4, "episode_len": 64},
            "agent": {"learning_starts": 64, "batch_size": 32},
            "replay": {"capacity": 2000},
        },
        base=cfg,
    )
    t = Trainer(cfg, echo=lambda m: None)
    t.run()
    return t.run_dir / "checkpoints" / "best.safetensors"


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.set_defaults(repeats=5)
    ap.add_argument("--only", choices=("all", "load", "evaluate"), default="all", help="run only these arms")
    args = ap.parse_args()
    from cudarl.backend import cupy_unavailable_reason

    gpu_why = cupy_unavailable_reason()
    rows, extra = [], {"load_rows": LOAD_ROWS, "eval_data": EVAL_DATA, "repeats": args.repeats}
    try:
        import pyarrow  # noqa: F401

        arrow = True
    except ImportError:
        arrow = False
        print("skipping the pyarrow load arm: pyarrow is not installed (pip install 'cudarl[parquet]')")
    extra["commit"] = commit()
    extra["bytecode_compiled"] = compileall.compile_dir(str(ROOT / "cudarl"), quiet=1)
    extra["cpus"] = os.cpu_count()
    extra["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        csv = make_csv(folder)
        extra["csv_mb"] = round(csv.stat().st_size / 2**20, 1)
        print(f"wrote {csv.name} ({extra['csv_mb']} MB) in {time.perf_counter() - t0:.1f} s")
        loads = {"pyarrow": (False, 1.0), "numpy": (True, 3.0)} if args.only != "evaluate" else {}
        if not arrow:
            loads.pop("pyarrow", None)
        got = timed_runs(
            {name: LOAD_CODE.format(hide=hide, path=str(csv)) for name, (hide, _) in loads.items()}, args.repeats
        )
        for name, (_, target) in loads.items():
            r = got[name]
            assert r["bars"] == LOAD_ROWS
            case = f"load 1M CSV rows, {name}"
            rows += timing_rows(case, "load() call", r["load_s"], f"< {target:g} s")
            rows += timing_rows(case, "whole process", r["wall"])
            rows += timing_rows(case, "whole process CPU time", r["cpu"])
        policy = make_policy(folder)
        # (device, without load_policy's backend warm-up): the GPU also without it, to show its share
        arms = [("cpu", False)] + ([] if gpu_why else [("gpu", False), ("gpu", True)])
        if gpu_why:
            print(f"skipping the GPU evaluate arms: {gpu_why}")
        codes = {arm: EVAL_CODE.format(path=str(policy), device=arm[0], no_warm_up=arm[1]) for arm in arms}
        got = timed_runs(codes if args.only != "load" else {}, args.repeats)
        for device, no_warm_up in arms if args.only != "load" else []:
            r = got[(device, no_warm_up)]
            extra[f"eval_bars_{device}"] = r["bars"]
            assert r["trading"], "the evaluated policy stayed flat: nothing was walked"
            extra[f"eval_trades_{device}"] = r["trades"]  # the walk's cost grows with the position changes
            case = f"evaluate {r['bars']} bars, {device}" + (", no backend warm-up" if no_warm_up else "")
            rows += timing_rows(case, "process start to the result", r["result_s"], "" if no_warm_up else "< 1 s")
            rows += timing_rows(case, "whole process (to its exit)", r["wall"])
            rows += timing_rows(case, "after import cudarl", r["eval_s"])
            rows += timing_rows(case, "whole process CPU time", r["cpu"])
            arm = f"{device}{'_no_warm_up' if no_warm_up else ''}"
            extra[f"uncounted_first_wall_{arm}"] = r["uncounted_wall"]
            extra[f"result_s_{arm}"] = [round(v, 4) for v in r["result_s"]]  # every counted run, in order
    extra["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    suffix = "gpu" if not gpu_why else "cpu"
    out = args.out or ROOT / "docs" / "bench" / f"bench_load_eval_{suffix}.json"
    report("bench_load_eval", rows, out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
