"""``run_sweep``: a spec's trials trained in populations, recorded, summarised and ranked."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import interrupt
from ..atomic import atomic_open
from ..config import data_options
from ..data import load as load_bars
from ..evaluate import json_safe
from . import report
from .core import LocalExecutor, SweepDir, make_trials, pack, population_capacity, resume_plan
from .spec import SweepSpec

#: Said when sweep.png could not be drawn.
NO_PLOT = "sweep.png not written: matplotlib is not installed (pip install 'cudarl[plot]')"


def sweep_dir_of(spec: SweepSpec, out=None) -> Path:
    """Where a sweep of ``spec`` lives: ``out``, else ``<spec.out>/<spec.name>`` (so running the same
    command again resumes it)."""
    return Path(out) if out is not None else spec.out / spec.name


def sweep_bars(spec: SweepSpec):
    """The bars a sweep of ``spec`` trains on (its driver loads them once; Ray actors get them through the
    object store)."""
    return load_bars(spec.base.data.source, min_bars=spec.base.env.episode_len + 3, **data_options(spec.base.data))


def run_sweep(spec: SweepSpec, *, out=None, executor=None, optuna_rounds: int = 0, echo=print) -> dict:
    """Run (or resume) the sweep of ``spec``; returns the report written to ``sweep.json``.

    A resume skips the trials in the ledger and continues a population cut mid-training from its
    members' checkpoints in ``runs/`` (:func:`cudarl.sweep.core.resume_plan`: else it starts over and
    ``echo`` says why); its trials end with the numbers of a sweep never cut.

    ``executor``: where populations run (default :class:`cudarl.sweep.core.LocalExecutor`, this
    process; :class:`cudarl.sweep.cluster.RayExecutor` shards them over Ray actors).
    ``optuna_rounds``: drive ``random.n`` configurations a round with Optuna instead of drawing them
    (:mod:`cudarl.sweep.tune`)."""
    from .. import backend as _backend

    t0 = time.perf_counter()
    bars = sweep_bars(spec)
    if executor is None:
        be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy"}[spec.base.run.device])
        executor = LocalExecutor(be.is_gpu)
    sd = SweepDir(sweep_dir_of(spec, out), spec, echo)
    try:
        with interrupt.deferred() as stop:  # a signal stops the sweep between trials (or a trainer mid-run)
            return _sweep(spec, sd, executor, bars, optuna_rounds, echo, stop, t0)
    finally:
        sd.close()
        executor.close()


def _sweep(spec, sd, executor, bars, optuna_rounds, echo, stop, t0) -> dict:
    """The sweep inside run_sweep's signal handling: train what is left, then report."""
    echo(f"sweep directory {sd.path}; populations run in {executor.describe()}")
    stats = {"trained": 0, "skipped": 0, "populations": 0, "packed": 0}

    def train(configurations, first_id=0):
        ts = make_trials(spec, configurations, executor.gpu, bars, first_id)
        _train(spec, ts, sd, executor, bars, echo, stats, stop)
        return ts

    if optuna_rounds:
        from .tune import optuna_trials

        trials = optuna_trials(spec, optuna_rounds, train, sd, echo)
    else:
        trials = train(spec.configurations())
    ledger = sd.ledger()
    records = [ledger[t.key] for t in trials]
    e = spec.base.eval
    rows = report.summarise(records, e.level, e.resamples)
    dsr = report.trial_dsr(records)
    report.write_csv(records, sd.path / "sweep.csv", dsr)
    rep = {
        "spec": str(spec.path),
        "sweep_dir": str(sd.path),
        "executor": executor.describe(),
        "trials": len(records),
        "trained_now": stats["trained"],
        "skipped_finished": stats["skipped"],
        "populations_now": stats["populations"],
        "retried": executor.retried,
        "configurations": rows,
        "wall_s": time.perf_counter() - t0,
    }
    with atomic_open(sd.path / "sweep.json") as f:
        json.dump(json_safe(rep), f, indent=1, allow_nan=False)
    for line in report.table_lines(rows):
        echo(line)
    if not report.plot(records, rows, sd.path / "sweep.png"):
        echo(NO_PLOT)
    if executor.retried:
        for r in executor.retried:
            echo(f"retried: population {r['population']} ({len(r['trials'])} trial(s)) after {r['reason']}")
    echo(f"wrote {sd.path / 'sweep.csv'}, {sd.path / 'sweep.json'}")
    return rep


def _train(spec, trials, sd: SweepDir, executor, bars, echo, stats, stop) -> None:
    """Train the trials of ``trials`` not yet in the ledger, recording each population as it ends.

    All of ``trials`` are packed, finished ones too, and then left out: a population keeps its index
    and its unfinished members from one run of the sweep to the next, so a cut population continues
    from its members' checkpoints (:func:`cudarl.sweep.core.resume_plan`) where the executor keeps them."""
    done_keys = set(sd.ledger())
    sd.remove_runs(t.key for t in trials if t.key in done_keys)  # left by a kill after the ledger entry
    todo = [t for t in trials if t.key not in done_keys]
    skipped = len(trials) - len(todo)
    stats["skipped"] += skipped
    if skipped:
        echo(f"resuming: {skipped} of {len(trials)} trial(s) already finished in {sd.path}; skipping them")
    groups = pack(
        trials,
        lambda t: population_capacity(t.config, executor.gpu, spec.population, executor.gpu_free, bars, t.splits),
        slots=executor.slots,
    )
    base = stats["packed"]  # indices go on over Optuna's rounds, finished populations counted
    stats["packed"] += len(groups)
    if not todo:
        return
    by_key = {t.key: t for t in todo}
    checkpoints = getattr(executor, "checkpoints", False)
    jobs, lines = [], []
    for i, g in enumerate(groups):
        members = [t for t in g if t.key not in done_keys]
        if not members:
            continue
        job = {"index": base + i, "splits": g[0].splits, "trials": [t.job_entry() for t in members]}
        paths, line = resume_plan(sd, base + i, members, checkpoints)
        if checkpoints:
            job["run_dirs"] = [str(sd.run_dir(t.key)) for t in members]
            job["resume"] = None if paths is None else [str(p) for p in paths]
        lines += [line] if line else []
        jobs.append(job)
    echo(f"{len(todo)} trial(s) in {len(jobs)} population(s)")
    for line in lines:
        echo(line)
    t0 = time.perf_counter()

    def done(result: dict) -> None:
        recs = [sd.record(by_key[r["key"]], r, result) for r in result["results"]]
        sd.remove_runs(r["key"] for r in recs)  # recorded: their checkpoints are not needed any more
        sd.append_log([f"[population {result['index']}] {line}" for line in result["log"]])
        stats["trained"] += len(recs)
        stats["populations"] += 1
        vals = [r["val"]["sharpe"] for r in recs if r["val"]["sharpe"] is not None]
        mean = f"{sum(vals) / len(vals):.2f}" if vals else "n/a"
        w = result["worker"]
        echo(
            f"population {result['index']} done: {len(recs)} trial(s) in {result['wall_s']:.1f} s on "
            f"{w['host']} ({w['backend']}, {w['device']}); mean validation Sharpe {mean}; "
            f"{left[0] - len(recs)} of {len(todo)} trial(s) left, {time.perf_counter() - t0:.0f} s so far"
        )
        left[0] -= len(recs)

    left = [len(todo)]
    executor.run(jobs, bars, done, echo, stop)
