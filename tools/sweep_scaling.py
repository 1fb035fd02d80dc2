"""The ``sweep-scaling`` arm of ``tools/bench_population.py`` (named outside ``bench_*.py``, so ``gpu_check.sh`` does
not run it as a benchmark of its own) (issue 21, point 2): one sweep spec run twice
through the real Ray path (:func:`cudarl.sweep.run_sweep` with :class:`cudarl.sweep.cluster.RayExecutor`),
on a local Ray instance with 1 worker and then with G workers (one actor a GPU on a GPU host, CPU actors on
the NumPy backend otherwise), each timed from submit (``run_sweep`` called) to the last trial recorded.

Rows: trials, wall, trials per hour at 1 and at G workers, the speed-up and the scaling efficiency
(speed-up / G); where the time went, per run: the local Ray's start, the actors' start, the driver before
the first hand-out (data load, sweep directory, trials, packing), the bars put into the object store, the
time inside populations (their ``wall_s`` as the workers report it) against the workers' hand-out window
(utilisation), Ray's round trip beyond a population's own time, the driver recording results, the workers'
idle tail (uneven packing) and populations per worker; and whether the two runs' ``sweep.csv`` hold the same
numbers per trial (every column but ``population`` and ``worker_host``, compared as text by trial key: the
floats are written with ``repr``, so equal text is equal bits).

The timing wraps the executor (:class:`TimedExecutor`, a proxy that notes when each population goes out and
comes back); nothing of the sweep is copied here.
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchlib import row

from cudarl.testing import TINY_SWEEP_SET

ROOT = Path(__file__).resolve().parents[1]
CASE = "sweep scaling (Ray)"
#: The spec's trials: one configuration a learning rate, one seed; a tiny network (quick on either backend).
SPEC = """name = "scaling"
data = "builtin:ar?n=1500"
seeds = 1
population = {population}
out = "{out}"

[set]
{tiny_set}
[grid]
"optim.lr" = [{lrs}]
"""
#: ``sweep.csv`` columns that say where a trial ran, not what it gave.
PLACEMENT_COLUMNS = ("population", "worker_host")


def write_spec(path: Path, trials: int, steps: int, device: str, population: int = 0) -> Path:
    """The arm's spec at ``path``: ``trials`` learning rates from 1e-4 to 1e-3 (one trial each)."""
    lrs = [1e-4 * 10 ** (i / max(1, trials - 1)) for i in range(trials)]
    tiny_set = TINY_SWEEP_SET.format(device=device, steps=steps)
    lr_list = ", ".join(map(repr, lrs))
    text = SPEC.format(population=population, out=path.parent / "sweeps", tiny_set=tiny_set, lrs=lr_list)
    path.write_text(text)
    return path


class TimedExecutor:
    """A proxy of an executor (:class:`cudarl.sweep.cluster.RayExecutor`) that notes, in
    ``time.perf_counter`` seconds, when ``run`` starts and ends, when each population is handed out
    (through the executor's ``on_dispatch``) and when it comes back and is recorded, with the population's
    own ``wall_s`` and worker."""

    def __init__(self, inner):
        self.inner = inner
        self.t_run = self.t_end = None
        self.sent: dict[int, float] = {}
        self.back: list[dict] = []
        inner.on_dispatch = self._dispatched

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _dispatched(self, executor, actor, job) -> None:
        self.sent.setdefault(job["index"], time.perf_counter())

    def run(self, jobs, bars, done, echo, stop=()) -> None:
        self.t_run = time.perf_counter()

        def timed(result: dict) -> None:
            t = time.perf_counter()
            done(result)
            w = result["worker"]
            self.back.append(
                {
                    "index": result["index"],
                    "members": len(result["results"]),
                    "wall_s": result["wall_s"],
                    "worker": f"{w['host']}:{w['pid']}",
                    "returned": t,
                    "recorded": time.perf_counter(),
                }
            )

        try:
            self.inner.run(jobs, bars, timed, echo, stop)
        finally:
            self.t_end = time.perf_counter()


def _start_ray(workers: int, gpu: bool) -> float:
    """A local Ray instance for ``workers`` actors (``workers`` GPUs, or ``workers`` CPUs); its start in s.
    The checkout goes on the workers' ``PYTHONPATH`` (they import the cudarl this tool runs)."""
    import ray

    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    res = {"num_gpus": workers, "num_cpus": max(workers, os.cpu_count() or 1)} if gpu else {"num_cpus": workers}
    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False, **res)
    return time.perf_counter() - t0


def timed_sweep(spec_path: Path, out: Path, workers: int, gpu: bool) -> dict:
    """Run the spec at ``spec_path`` into ``out`` on a fresh local Ray with ``workers`` workers; its timings."""
    import ray

    from cudarl.sweep import load_spec, run_sweep
    from cudarl.sweep.cluster import RayExecutor

    spec = load_spec(spec_path)
    old_path = os.environ.get("PYTHONPATH")
    try:
        ray_s = _start_ray(workers, gpu)
        ex = TimedExecutor(RayExecutor(workers=workers, device=spec.base.run.device, echo=lambda m: None))
        actors_s, n_actors = ex.inner.startup_s, len(ex.inner.actors)
        t0 = time.perf_counter()
        rep = run_sweep(spec, out=out, executor=ex, echo=lambda m: None)
        t_ret = time.perf_counter()
    finally:
        ray.shutdown()
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    back = ex.back
    last = max(b["recorded"] for b in back)
    first = min(ex.sent.values())
    window = last - first
    busy: dict = defaultdict(float)
    pops: dict = defaultdict(int)
    last_back: dict = {}
    for b in back:
        busy[b["worker"]] += b["wall_s"]
        pops[b["worker"]] += 1
        last_back[b["worker"]] = max(last_back.get(b["worker"], 0.0), b["recorded"])
    unused = n_actors - len(pops)  # actors that got no population
    return {
        "workers": n_actors,
        "trials": rep["trials"],
        "ray_start_s": ray_s,
        "actors_start_s": actors_s,
        "wall_s": last - t0,
        "driver_before_s": ex.t_run - t0,
        "put_s": first - ex.t_run,
        "populations": sorted((b["members"] for b in back), reverse=True),
        "populations_per_worker": sorted(pops.values(), reverse=True) + [0] * unused,
        "inside_populations_s": sum(busy.values()),
        "window_s": window,
        "utilisation": sum(busy.values()) / (n_actors * window) if window > 0 else float("nan"),
        "ray_round_trip_s": sum(b["returned"] - ex.sent[b["index"]] - b["wall_s"] for b in back),
        "recording_s": sum(b["recorded"] - b["returned"] for b in back),
        "idle_tail_s": sum(last - t for t in last_back.values()) + unused * window,
        "after_last_s": t_ret - last,
        "retried": len(rep["retried"]),
    }


def compare_csv(a: Path, b: Path) -> dict:
    """Two ``sweep.csv`` files by trial key, every column but :data:`PLACEMENT_COLUMNS`: ``{"trials",
    "same_keys", "differing": {key: [columns]}}``."""

    def read(p):
        with open(p, newline="") as f:
            return {r["key"]: r for r in csv.DictReader(f)}

    ra, rb = read(a), read(b)
    differing = {}
    for k in sorted(set(ra) & set(rb)):
        cols = [
            c for c in sorted(set(ra[k]) | set(rb[k])) if c not in PLACEMENT_COLUMNS and ra[k].get(c) != rb[k].get(c)
        ]
        if cols:
            differing[k] = cols
    return {"trials": len(ra), "same_keys": set(ra) == set(rb), "differing": differing}


def sweep_scaling_arm(
    workers: int, gpu: bool, rows: list, extra: dict, *, trials=None, steps=None, population=0, spec=None, out_dir=None
) -> dict:
    """The arm: the spec (``spec``, else :func:`write_spec` of ``trials`` (default 4 x ``workers``) trials of
    ``steps`` updates (default 30 on the CPU, 300 on a GPU)) swept at 1 and at ``workers`` workers, into
    ``out_dir`` (default a temporary directory, removed); appends its rows; returns ``extra["sweep_scaling"]``."""
    import ray

    if ray.is_initialized():
        rows.append(row(CASE, "skipped", "Ray is already initialised in this process", ""))
        return {}
    with tempfile.TemporaryDirectory(prefix="cudarl-sweep-scaling-") as tmp:
        base = Path(out_dir) if out_dir is not None else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        if spec is None:
            n = trials or 4 * workers
            spec = write_spec(
                base / "scaling.toml", n, steps or (300 if gpu else 30), "gpu" if gpu else "cpu", population
            )
        from cudarl.sweep import load_spec
        from cudarl.sweep.run import sweep_bars

        t0 = time.perf_counter()  # the driver's first load (later ones in this process are cached): both runs
        sweep_bars(load_spec(spec))  # start with it done, and it is a row of its own
        load_s = time.perf_counter() - t0
        runs = {}
        for n_workers in dict.fromkeys((1, workers)):
            runs[n_workers] = timed_sweep(Path(spec), base / f"workers-{n_workers}", n_workers, gpu)
        same = compare_csv(base / "workers-1" / "sweep.csv", base / f"workers-{workers}" / "sweep.csv")
    kind = "GPU" if gpu else "CPU (NumPy backend)"
    one, many = runs[1], runs[workers]
    speedup = one["wall_s"] / many["wall_s"]

    def with_start(r):
        return r["ray_start_s"] + r["actors_start_s"] + load_s + r["wall_s"]

    for n_workers, r in runs.items():
        c = f"{CASE}, {n_workers} {kind} worker(s)"
        rows += [
            row(c, "trials", r["trials"], ""),
            row(c, "wall (submit -> all trials recorded)", r["wall_s"], "s"),
            row(c, "trials per hour", 3600 * r["trials"] / r["wall_s"], "1/h"),
            row(c, "Ray start (local instance)", r["ray_start_s"], "s"),
            row(c, "actors start", r["actors_start_s"], "s"),
            row(c, "driver before the first hand-out (data load, trials, packing)", r["driver_before_s"], "s"),
            row(c, "bars into the object store (run -> first hand-out)", r["put_s"], "s"),
            row(c, "members per population", ", ".join(map(str, r["populations"])), ""),
            row(c, "populations per worker", ", ".join(map(str, r["populations_per_worker"])), ""),
            row(c, "inside populations (their wall_s, summed)", r["inside_populations_s"], "s"),
            row(c, "worker utilisation (inside / workers x hand-out window)", r["utilisation"], ""),
            row(c, "Ray round trips beyond the populations' time (summed)", r["ray_round_trip_s"], "s"),
            row(c, "driver recording results (summed)", r["recording_s"], "s"),
            row(c, "workers idle after their last population (uneven packing or speed)", r["idle_tail_s"], "s"),
            row(c, "after the last trial (summary, csv, json, plot)", r["after_last_s"], "s"),
        ]
    identical = same["same_keys"] and not same["differing"] and one["trials"] == many["trials"]
    rows += [
        row(CASE, f"speed-up, {workers} over 1 worker", speedup, "x"),
        row(CASE, f"scaling efficiency (speed-up / {workers})", speedup / workers, ""),
        row(
            CASE, f"loss: wall at {workers} minus wall at 1 / {workers}", many["wall_s"] - one["wall_s"] / workers, "s"
        ),
        row(CASE, "data load (driver, first in the process; before both runs)", load_s, "s"),
        row(
            CASE, "speed-up counting Ray start, actors start and the data load", with_start(one) / with_start(many), "x"
        ),
        row(CASE, "trials equal at 1 and at G workers", one["trials"] == many["trials"], ""),
        row(CASE, "per-trial numbers identical (sweep.csv by key)", identical, ""),
        row(CASE, "trials differing", len(same["differing"]), ""),
    ]
    ext = {
        "workers": workers,
        "kind": kind,
        "spec": str(spec),
        "runs": {str(k): v for k, v in runs.items()},
        "data_load_s": load_s,
        "speedup": speedup,
        "speedup_with_start": with_start(one) / with_start(many),
        "efficiency": speedup / workers,
        "identical": identical,
        "differing": same["differing"],
    }
    extra["sweep_scaling"] = ext
    return ext
