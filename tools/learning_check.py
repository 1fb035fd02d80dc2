#!/usr/bin/env python3
"""Does cudarl learn, and can its results be trusted? Train and evaluate on markets with known answers
and on real held-out series, with honest statistics.

Tasks (``TASKS``; docs/data.md has the markets and their references):

- ``canary``: a random walk plus a column that leaks the next return, named in ``features.extra``; a
  correct learner must exploit it.
- ``regime``, ``ar``, ``ou`` (and ``*-b``: the same kinds with other parameters): markets whose
  full-information and best causal policies :mod:`cudarl.datasets.references` computes; each run
  reports its test Sharpe as a percentage of both, realised on the same test split with the same
  fills and costs.
- ``lag``: a signal that no single built-in feature isolates (table only).
- ``noise`` (and ``noise-b``): martingales; the right answer is to stay flat. Reported: |Sharpe|
  against twice its standard error, and the share of test bars on which the position changes.
- ``default``: ``builtin:regime`` at its defaults, as ``cudarl-train train`` runs it: the validation
  Sharpe over the budget (decay: the final one against the best).
- ``sp500``, ``nasdaq``, ``eurusd-1h``: real series against buy-and-hold, with the bootstrap interval,
  PSR, DSR and the paired comparison.

Every run also evaluates its final weights under other deployment rules (``VIEW_MARGINS``, the
validation gate at ``VIEW_GATE``): the on/off tables of those mechanisms from one training.
``--results-md`` writes the results page (docs/results.md, :mod:`learning_report`); ``--workers``
spreads the runs over processes (:func:`run_jobs`, shared with ``tools/sweep.py``); ``--quick`` is
the CPU-sized version. JSON output is strict (null with a reason, never NaN).

``--run-root DIR`` gives every run a run directory there (:mod:`run_dirs`: named from its task, head,
seed, variant and overrides; checkpoints after each validation evaluation and when SIGTERM or SIGINT
stops it), and adds the view ``best validation weights``: the test split under the weights of the best
validation evaluation (early stopping; chosen on validation only), beside the last weights' headline.
With ``--resume`` (and ``--jsonl``), the runs whose rows are there are skipped and the others continue
from their checkpoints, to the same rows as runs never cut.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import commit  # noqa: E402

from cudarl import interrupt  # noqa: E402
from cudarl.config import from_dict, resolve_for_backend  # noqa: E402

#: Task settings on top of the defaults (the budgets are part of the result). ``kind`` picks the
#: acceptance rule of :mod:`learning_report`.
TASKS = {
    "canary": {
        "kind": "canary",
        "config": {
            "data": {"source": "builtin:canary?n=6000"},
            "features": {"extra": ["next_return"]},  # the leak, named explicitly
            "agent": {"gamma": 0.5},
            "replay": {"n_step": 1},
        },
    },
    "regime": {"kind": "hidden", "config": {"data": {"source": "builtin:regime?n=20000"}}},
    "regime-b": {"kind": "hidden", "config": {"data": {"source": "builtin:regime?n=20000&seed=7&mu=0.003&p=0.01"}}},
    "ar": {"kind": "observed", "config": {"data": {"source": "builtin:ar?n=20000"}}},
    "ar-b": {"kind": "observed", "config": {"data": {"source": "builtin:ar?n=20000&seed=7&phi=-0.12&sigma=0.02"}}},
    "ou": {"kind": "observed", "config": {"data": {"source": "builtin:ou?n=20000"}}},
    "ou-b": {"kind": "observed", "config": {"data": {"source": "builtin:ou?n=20000&seed=7&kappa=0.02&sigma=0.003"}}},
    "lag": {"kind": "history", "config": {"data": {"source": "builtin:lag?n=20000"}}},
    "noise": {"kind": "noise", "config": {"data": {"source": "builtin:noise?n=5000"}}},
    "noise-b": {"kind": "noise", "config": {"data": {"source": "builtin:randomwalk?n=20000&seed=7"}}},
    "default": {"kind": "decay", "config": {"data": {"source": "builtin:regime"}}},
    "sp500": {"kind": "real", "config": {"data": {"source": "builtin:sp500"}}},
    "nasdaq": {"kind": "real", "config": {"data": {"source": "builtin:nasdaq"}}},
    "eurusd-1h": {"kind": "real", "config": {"data": {"source": "builtin:eurusd-1h"}}},
}
#: The CPU-sized budget (NumPy backend): the CPU defaults, fewer updates, validation every 250.
QUICK = {"run": {"steps": 1500, "eval_every": 250}, "env": {"n_envs": 16, "episode_len": 256}}
#: The GPU budget: the default 10,000 updates, validated every 1,000 (the decay measurement).
GPU_BUDGET = {"run": {"steps": 10_000, "eval_every": 1_000}}
#: No-trade margins (``eval.margin``) and the validation gate (``eval.gate_psr``) every run is also
#: evaluated with, on the same final weights.
VIEW_MARGINS = (0.0, 0.05, 0.1, 0.2)
VIEW_GATE = 0.95
#: The view of the best-validation weights (early stopping; runs with a run directory only).
BEST_VIEW = "best validation weights"
#: The canary's bar, every head and seed (tests/unit/test_learning.py's, measured there with and
#: without PopArt): a run below it is a named failure of the check.
CANARY_BAR = 10.0


def merge(*dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for sec, vals in d.items():
            out.setdefault(sec, {}).update(vals)
    return out


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def trade_bars_pct(positions) -> float:
    """Percentage of bars on which the position changes (entering from flat at the first bar counts)."""
    import numpy as np

    p = np.asarray(positions, dtype=np.float64)
    return 100.0 * float(np.count_nonzero(np.diff(p, prepend=0.0))) / max(p.size, 1)


def _summary_row(ev) -> dict:
    """The numbers of one test evaluation that the tables use."""
    s = ev.summary
    pol, st = s["policy"], s["statistics"]
    return {
        "sharpe": pol["sharpe"],
        "trades": pol.get("trades"),
        "trade_bars_pct": trade_bars_pct(ev.position),
        "exposure": pol.get("exposure"),
        "total_return": pol["total_return"],
        "max_drawdown": pol.get("max_drawdown"),
        "sharpe_se": st.get("sharpe_se"),
        "sharpe_interval": st.get("sharpe_interval"),
        "psr": st.get("psr"),
        "dsr": st.get("dsr"),
        "versus_buy_and_hold": st.get("versus_benchmark"),
        "cost_sweep": {k: v["sharpe"] for k, v in s["cost_sweep"].items()},
    }


def positions_sharpe(bars, positions, split, env, periods_per_year: float):
    """The annualised Sharpe (None if undefined) of holding ``positions`` over ``split``, with the env
    config ``env``'s costs and fills."""
    from cudarl.evaluate import evaluate_positions

    ev = evaluate_positions(
        bars,
        positions,
        split,
        cost_bps=env.cost_bps,
        slippage_bps=env.slippage_bps,
        periods_per_year=periods_per_year,
        fill=env.fill,
        resamples=10,
    )
    return ev.summary["policy"]["sharpe"]


def references(bars, split, env, periods_per_year: float) -> dict:
    """Sharpe of the market's full-information and causal reference policies on ``split`` (``{}`` for
    bars that are no built-in market with references), with the env config ``env``'s costs and fills."""
    from cudarl.datasets import MARKETS, parse
    from cudarl.datasets.references import reference_positions

    if not (bars.source or "").startswith("builtin:"):
        return {}
    name = bars.source[len("builtin:") :].partition("?")[0]
    if name not in MARKETS or not MARKETS[name].has_references:
        return {}
    parse(bars.source)  # the market's parameters, checked
    refs = reference_positions(
        bars,
        split.start,
        len(split) - 2,
        cost_rate=(env.cost_bps + env.slippage_bps) * 1e-4,
        levels=tuple(float(v) for v in env.position_levels()),
        fill=env.fill,
    )
    out = {"method": refs["method"]}
    for k in ("full_information", "causal"):
        sharpe = positions_sharpe(bars, refs[k], split, env, periods_per_year)
        out[k] = {"sharpe": sharpe, "trade_bars_pct": trade_bars_pct(refs[k])}
    return out


def fraction(x, ref) -> float:
    """``x / ref`` when the reference has an edge (Sharpe > 0); a flat policy (NaN Sharpe) counts 0."""
    if not _finite(ref) or ref <= 0:
        return math.nan
    return (x if _finite(x) else 0.0) / ref


def run_one(
    task: str, head: str, seed: int, device: str, quick: bool, extra: dict, run_dir=None, resume: bool = False
) -> dict:
    """Train and evaluate one run; its result row.

    ``run_dir``: the run directory the trainer writes as a normal run (checkpoints, metrics, ``best``;
    :mod:`run_dirs`), and with ``resume`` continues from its ``checkpoints/latest.npz`` (exact: the row
    is the one an uninterrupted run gives, less its wall times; ``resumed_from`` says the update).
    None: no directory, nothing saved (a signal then loses the run)."""
    import run_dirs

    from cudarl.trainer import Trainer

    over = merge(
        {"run": {"device": device, "seed": seed, "checkpoint_every": 0, "log_every": 10**9}},
        QUICK if quick else GPU_BUDGET,
        TASKS[task]["config"],
        {"net": {"head": head}},
        extra,
    )
    cfg = resolve_for_backend(from_dict(over), device == "gpu", over)
    t0 = time.perf_counter()
    quiet = lambda m: None  # noqa: E731
    if run_dir is None:
        tr, resumed_from = Trainer(cfg, run_dir=False, echo=quiet), None
    else:
        tr, resumed_from = run_dirs.open_trainer(cfg, run_dir, resume, quiet)
        tr.plot_evaluations = False  # the rows are the result; a plot per validation costs ~0.5 s of CPU
    tr.run()
    train_s = time.perf_counter() - t0
    split = tr.data.splits.test
    test = tr.evaluate("test", write=False)
    row = {
        "task": task,
        "kind": TASKS[task]["kind"],
        "source": tr.data.bars.source,
        "head": head,
        "seed": seed,
        "updates": cfg.run.steps,
        "envs": cfg.env.n_envs,
        "test_bars": len(split) - 2,
        "deployment": test["deployment"],
        "buy_and_hold_sharpe": test["buy_and_hold"]["sharpe"],
        **{f"test_{k}": v for k, v in _summary_row(tr.last_evaluation).items()},
    }
    # agent.aux selectivity's gates, causal's sensitivities (training-time, and over this test split)
    for k in ("features_used", "causal_sensitivity", "causal_sensitivity_heldout"):
        if k in test:
            row[k] = test[k]
    # the same weights under other deployment rules: the mechanisms' on/off tables from one training
    views = {}
    for m in VIEW_MARGINS:
        views[f"margin={m:g}"] = _summary_row(tr._evaluation("test", gate=False, margin=m))
    if tr.average is not None:  # eval.average_halflife: the same run's last weights, for the on/off table
        views["last weights"] = _summary_row(tr._evaluation("test", gate=False, averaged=False))
    best = best_weights_view(tr)
    if best is not None:
        views[BEST_VIEW] = best
    psr = tr.validation_psr()
    gate_open = _finite(psr) and psr >= VIEW_GATE
    base = views[f"margin={cfg.eval.margin:g}"] if f"margin={cfg.eval.margin:g}" in views else None
    if base is None:
        base = _summary_row(tr._evaluation("test", gate=False))
    flat = {"sharpe": math.nan, "trades": 0, "trade_bars_pct": 0.0, "exposure": 0.0}
    views[f"gate={VIEW_GATE:g}"] = {**(base if gate_open else flat), "validation_psr": psr, "open": gate_open}
    row["views"] = views
    row["references"] = references(tr.data.bars, split, cfg.env, tr.data.periods_per_year)
    for k in ("full_information", "causal"):
        if k in row["references"]:
            ref = row["references"][k]["sharpe"]
            row[f"fraction_of_{k}"] = fraction(row["test_sharpe"], ref)
            for v in views.values():
                v[f"fraction_of_{k}"] = fraction(v["sharpe"], ref)
    val = [(r["step"], r["sharpe"]) for r in tr.history if r["split"] == "val" and r["trading"]]
    row["val_history"] = val
    finite = [s for _, s in val if _finite(s)]
    row["val_best"] = max(finite) if finite else math.nan
    row["val_final"] = val[-1][1] if val else math.nan
    row["decay_ratio"] = (
        row["val_final"] / row["val_best"] if _finite(row["val_final"]) and row["val_best"] > 0 else math.nan
    )
    row["wall_s"] = time.perf_counter() - t0
    row["train_s"] = train_s
    row["run_dir"] = None if run_dir is None else str(run_dir)
    row["resumed_from"] = resumed_from
    return row


def best_weights_view(tr):
    """The test evaluation (gate off, margin ``eval.margin``) of the run's best-validation weights, the
    trainer's ``checkpoints/best.safetensors`` (early stopping): ``_summary_row`` plus ``step`` and
    ``val_sharpe`` of the validation evaluation that chose them; None without a run directory or a
    best. The best is chosen on validation evaluations only (``Trainer._save_evaluated``), never test.

    The weights are loaded into the trainer's agent (or its moving average, which is what the policy
    file holds with ``eval.average_halflife``) for the evaluation and put back after it."""
    from cudarl.policy import PolicyState

    path = None if tr.run_dir is None else tr.run_dir / "checkpoints" / "best.safetensors"
    if tr.best is None or path is None or not path.is_file():
        return None
    import numpy as np

    st = PolicyState.read(path)
    own = tr.agent.state_dict()
    layout = own["online"]["layout"]
    flat = np.empty_like(own["online"]["params"])
    for layer, off, shape in layout:
        flat[int(off) : int(off) + int(np.prod(shape))] = np.asarray(st.weights[layer]).reshape(-1)
    if tr.average is not None:  # the policy file holds the average; evaluation deploys the average
        keep = tr.xp.array(tr.average)
        tr.average[...] = tr.xp.asarray(flat)
    else:
        best = {**own, "online": {**own["online"], "params": flat, "spectral": st.spectral or {}}}
        if st.tau_counter is not None and "iqn" in own:
            best["iqn"] = {**own["iqn"], "tau": np.asarray(st.tau_counter, dtype=np.asarray(own["iqn"]["tau"]).dtype)}
        tr.agent.load_state_dict(best)
        tr.agent.online.spectral_step(iterate=False)
    try:
        row = _summary_row(tr._evaluation("test", gate=False))
    finally:
        if tr.average is not None:
            tr.average[...] = keep
        else:
            tr.agent.load_state_dict(own)
            tr.agent.online.spectral_step(iterate=False)
    return {**row, "step": st.best["step"], "val_sharpe": st.best["sharpe"]}


def _overrides(sets: list[str]) -> dict:
    from cudarl.config import parse_override

    extra: dict = {}
    for s in sets:
        sec, f, v = parse_override(s)
        extra.setdefault(sec, {})[f] = v
    return extra


def log_row(fh, r: dict) -> None:
    """Append one finished run's row to an open JSONL file at once (a call cut short keeps what it
    measured), as strict JSON: NaN and infinities become null with their reason (``json_safe``)."""
    from cudarl.evaluate import json_safe

    fh.write(json.dumps(json_safe(r), allow_nan=False) + "\n")
    fh.flush()


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The options every multi-run tool shares (this one, tools/sweep.py and the screens)."""
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    ap.add_argument("--quick", action="store_true", help="CPU-sized budgets")
    ap.add_argument("--workers", type=int, default=1, help="processes to spread the runs over")
    ap.add_argument(
        "--run-root",
        type=Path,
        default=None,
        help="give each run a directory here (tools/run_dirs.py: checkpoints, metrics, best weights); with "
        "--resume a run cut short continues from its checkpoint. Default: none (nothing saved)",
    )


def resolve_device(device: str) -> str:
    from cudarl import backend

    if device == "auto":
        return "gpu" if backend.cupy_unavailable_reason() is None else "cpu"
    return device


#: Fields of a job that say how it runs, not what it is: kept out of its row.
_PLUMBING = ("resume",)


def _run_job(job: dict, shared_gpu: bool = False) -> dict:
    """The row of one job; a signal raises :class:`cudarl.interrupt.Interrupted` (after the trainer's
    checkpoint when it came during training)."""
    t0 = time.perf_counter()
    try:
        ov = _overrides(job["sets"])
        if shared_gpu:  # other runs' kernels share the SMs: no launch may wait for all its blocks
            ov.setdefault("run", {}).setdefault("grid_barrier", False)  # unless --set run.grid_barrier=...
        row = run_one(
            job["task"],
            job["head"],
            job["seed"],
            job["device"],
            job["quick"],
            ov,
            job.get("run_dir"),
            job.get("resume", False),
        )
        row["error"] = None
    except Exception as exc:  # a diverged or invalid run is a result, not a crash of the whole check
        row = _failed(job, exc, time.perf_counter() - t0)
    return {**row, **{k: job[k] for k in job if k not in row and k not in _PLUMBING}}


def _failed(job: dict, exc: BaseException, wall_s: float) -> dict:
    """The row of a run that raised ``exc``."""
    row = {"task": job["task"], "head": job["head"], "seed": job["seed"]}
    row.update(error=f"{type(exc).__name__}: {exc}", wall_s=wall_s)
    return {**row, **{k: job[k] for k in job if k not in row and k not in _PLUMBING}}


def run_jobs(jobs: list[dict], workers: int, on_row, start_if=None, run_root=None, resume: bool = False) -> list[dict]:
    """Run ``jobs`` (dicts with task, head, seed, device, quick, sets and any labels) and return their rows.

    ``workers > 1`` spreads them over spawned processes (CUDA state must not be forked); on one GPU
    the processes share it, which pays because one run's step is latency-bound. Then a job on device
    ``gpu`` runs with ``run.grid_barrier`` off (MPS overlaps the processes' kernels, so no launch may
    wait for all its blocks; the same bits), unless its ``sets`` give ``run.grid_barrier`` explicitly.
    ``on_row(row)`` is called as each run ends (rows then come in completion order; the returned list
    is in job order). Jobs start in list order, each when a worker is free; ``start_if(job)``, asked
    at that moment, may decline it (a deadline: ``run_plan.StartBy``): a declined job has no row.

    ``run_root``: each job runs in its own run directory there (:mod:`run_dirs`), and with ``resume``
    continues from the checkpoint an earlier call left in it (said on stdout, job by job).

    SIGTERM or SIGINT (``timeout`` signals the whole process group; a signal to this process alone is
    passed on to the workers as SIGTERM) starts no further job and waits for the running ones: each
    writes its checkpoint (with a run root) and ends without a row. Then :class:`cudarl.interrupt.Interrupted`
    is raised (``exit_code`` 130 or 143; :func:`exit_code`), after every finished row went to ``on_row``.
    """
    if run_root is not None:
        import run_dirs

        for line in run_dirs.plan(jobs, run_root, resume):
            print(line, flush=True)
    with _signals_stop() as stopped:
        if workers <= 1:
            rows = _run_here(jobs, on_row, start_if, stopped)
        else:
            rows = _run_pool(jobs, workers, on_row, start_if, stopped)
    if stopped.signum is not None:
        raise interrupt.Interrupted(
            stopped.signum,
            f"interrupted by {stopped.name}: {len(rows)} run(s) finished, {stopped.cut} cut short"
            + (" (each saved its checkpoint; --resume continues them)" if run_root is not None else ""),
        )
    return rows


def _run_here(jobs, on_row, start_if, stopped) -> list[dict]:
    """:func:`run_jobs` in this process, one job after the other."""
    rows = []
    for job in jobs:
        if stopped or not (start_if is None or start_if(job)):
            continue
        try:
            with _in_job():
                rows.append(_run_job(job))
        except interrupt.Interrupted as exc:
            _said_cut(job, {"interrupted": str(exc), "signum": exc.signum}, stopped)
            break
        on_row(rows[-1])
    return rows


def _run_pool(jobs, workers, on_row, start_if, stopped) -> list[dict]:
    """:func:`run_jobs` over ``workers`` spawned processes. The pool is closed and joined, not
    terminated: every job it was given has answered (a row, or cut short after its save)."""
    done: dict = {}
    finished: queue.SimpleQueue = queue.SimpleQueue()
    todo = iter(enumerate(jobs))
    ctx = mp.get_context("spawn")
    stopped.event = ctx.Event()  # set with the flag: a worker that starts a job after the signal declines it

    def submit(pool) -> bool:
        """Start the next job that ``start_if`` accepts; False when none is left (or a signal came)."""
        for i, job in todo:
            if stopped:
                return False
            if start_if is None or start_if(job):
                # gpu: processes share it; a crash in the pool's plumbing ends the wait, not a hang
                pool.apply_async(
                    _indexed,
                    ((i, job, job["device"] == "gpu"),),
                    callback=finished.put,
                    error_callback=lambda e, i=i, job=job: finished.put((i, _failed(job, e, 0.0))),
                )
                return True
        return False

    # each worker (a new process a job: maxtasksperchild) reads its BLAS threads at NumPy's import
    with _blas_threads(workers):
        pool = ctx.Pool(workers, initializer=_worker_init, initargs=(stopped.event,), maxtasksperchild=1)
        try:
            running = sum(submit(pool) for _ in range(workers))
            while running:
                i, row = finished.get()
                running -= 1
                if "interrupted" in row:
                    _said_cut(jobs[i], row, stopped)
                    continue
                done[i] = row
                on_row(row)
                running += submit(pool)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
    return [done[i] for i in sorted(done)]


#: The variables BLAS libraries (OpenBLAS, MKL, OpenMP builds) read for their thread count.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _blas_threads(workers: int):
    """The CPUs shared out among ``workers`` processes: each one's BLAS gets ``cpus // workers`` threads
    (at least one) unless the caller set them. OpenBLAS's threads wait by spinning, so workers that each
    start one per CPU take the CPUs from one another: with two NumPy ssm runs on two cores an update
    took 0.75 s, against 0.28 s with a thread each (fourteenth session)."""
    n = str(max(1, (os.cpu_count() or 1) // workers))
    unset = [v for v in BLAS_THREAD_VARS if v not in os.environ]
    os.environ.update({v: n for v in unset})
    try:
        yield
    finally:
        for v in unset:
            os.environ.pop(v, None)


def _said_cut(job: dict, cut: dict, stopped) -> None:
    """Count and say a job a signal cut short (``cut["interrupted"]``, the trainer's message, names the
    checkpoint it wrote)."""
    stopped.cut += 1
    if stopped.signum is None:  # a worker heard it first (the parent's handler may not have run yet)
        stopped.signum = cut.get("signum", signal.SIGTERM)
    label = " ".join(str(job[k]) for k in ("variant", "task", "head") if job.get(k) is not None)
    print(f"cut short: {label} seed {job['seed']}: {cut['interrupted']}", flush=True)


class _Stop(interrupt.StopFlag):
    """The first SIGINT / SIGTERM a job runner heard, how many jobs it cut short, and the event that
    tells its pool's workers."""

    def __init__(self):
        super().__init__()
        self.cut = 0
        self.event = None


#: This process's part for the signal handler: ``stop``, the job runner's :class:`_Stop` (None in a pool
#: worker); ``job``: "idle" (none yet), "running", "cut" (a signal raised in it) or "done"; ``event``:
#: a pool worker's copy of the runner's stop event.
_HERE: dict = {"stop": None, "job": "idle", "event": None}


@contextlib.contextmanager
def _in_job():
    _HERE["job"] = "running"
    try:
        yield
    finally:
        _HERE["job"] = "done"


def _on_signal(signum, frame):
    """SIGINT / SIGTERM in a job runner or a pool worker. A job running here stops: the trainer's own
    handler (:mod:`cudarl.interrupt`) saves and raises during training; outside it this raises
    ``Interrupted`` (nothing unsaved: before training, or after its last checkpoint). The runner marks
    itself stopped and passes the signal on; an idle worker (before its job: ``Pool.terminate``) ends;
    one whose job ended or was cut ignores it (it is sending its answer, and exits after)."""
    stop = _HERE["stop"]
    if stop is not None:
        if stop.signum is None:
            stop.signum = signum
        if stop.event is not None:
            stop.event.set()
        _tell_workers()
    if _HERE["job"] == "running":
        _HERE["job"] = "cut"
        raise interrupt.Interrupted(signum)
    if stop is None and _HERE["job"] == "idle":
        raise SystemExit(128 + signum)


def _tell_workers() -> None:
    """SIGTERM to this process's worker processes, for a signal sent to this process alone (never
    SIGINT: a second SIGINT stops a trainer's save)."""
    try:
        children = list(mp.active_children())
    except RuntimeError:  # the pool's thread changed the set meanwhile; the stop event tells them
        return
    for p in children:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except (ProcessLookupError, TypeError):
            pass


@contextlib.contextmanager
def _signals_stop():
    """A :class:`_Stop` that SIGINT and SIGTERM set while jobs run (main thread only; elsewhere it is
    set when a worker reports a job cut short)."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    _HERE["stop"] = stop
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _HERE["stop"] = None


def _worker_init(event) -> None:
    """A pool worker: SIGINT and SIGTERM cut its job short (the trainer saves first) or end it idle."""
    _HERE["event"] = event
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _on_signal)


def _indexed(item):
    """A pool worker's job: ``(i, row)``, or ``(i, {"interrupted": message, "signum": n})`` when a
    signal cut it short or came before it started."""
    i, job, shared_gpu = item
    event = _HERE["event"]
    try:
        if event is not None and event.is_set():
            raise interrupt.Interrupted(signal.SIGTERM, "not started: the runner was stopped")
        with _in_job():
            return i, _run_job(job, shared_gpu)
    except interrupt.Interrupted as exc:
        return i, {"interrupted": str(exc), "signum": exc.signum}


def exit_code(main) -> int:
    """``main()``'s exit code, or 128 + the signal when a signal stopped its runs (said on stderr)."""
    try:
        return main()
    except interrupt.Interrupted as exc:
        print(exc, file=sys.stderr, flush=True)
        return exc.exit_code


def _gpu_name(device: str) -> str:
    if device != "gpu":
        return f"CPU ({platform.processor() or platform.machine()})"
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()


def mean_spread(values) -> tuple[float, float, int]:
    """Mean and population spread of the finite values, and how many were not finite (a policy that
    stayed flat has no returns, so its Sharpe is undefined: NaN)."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return float("nan"), float("nan"), len(values)
    return statistics.mean(finite), (statistics.pstdev(finite) if len(finite) > 1 else 0.0), len(values) - len(finite)


def _f(x, spec=".2f") -> str:
    return format(x, spec) if _finite(x) else "—"


def describe(r: dict) -> str:
    if r.get("error"):
        return f"error {r['error']}"
    parts = [f"test Sharpe {_f(r['test_sharpe'])} (buy-and-hold {_f(r['buy_and_hold_sharpe'])})"]
    if _finite(r.get("fraction_of_causal")):
        parts.append(
            f"{_f(100 * r['fraction_of_causal'], '.0f')}% of causal, "
            f"{_f(100 * r['fraction_of_full_information'], '.0f')}% of full information"
        )
    parts.append(f"trades on {_f(r['test_trade_bars_pct'], '.1f')}% of bars")
    if _finite(r.get("decay_ratio")):
        parts.append(f"val final/best {_f(r['decay_ratio'])}")
    return "  ".join(parts) + f"  [{r['updates']} updates, {r['wall_s']:.0f} s]"


def dump_json(obj, path: Path) -> None:
    """Strict JSON (NaN and infinities as null, with reasons) written atomically."""
    from cudarl.data.validate import write_json_atomic
    from cudarl.evaluate import json_safe

    write_json_atomic(json_safe(obj), path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--heads", default="c51,iqn")
    add_run_args(ap)
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE applied to every run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "learning_check.json")
    ap.add_argument("--results-md", type=Path, default=None, help="write the results page (docs/results.md) here")
    ap.add_argument(
        "--screen",
        type=Path,
        default=None,
        help="a tools/sweep.py JSON-lines file of mechanism variants "
        "on these tasks: the results page gets their on/off table against these runs",
    )
    ap.add_argument(
        "--jsonl", type=Path, default=None, help="append each finished run here at once (kept if cut short)"
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="skip the runs whose row --jsonl already holds (and is not an error) and, with --run-root, continue "
        "the others from their checkpoints; --out covers every row",
    )
    args = ap.parse_args()
    if args.resume and args.jsonl is None:
        ap.error("--resume reads the rows of earlier calls from --jsonl")
    device = resolve_device(args.device)
    unknown = [t for t in args.tasks.split(",") if t not in TASKS]
    if unknown:
        ap.error(f"unknown task(s) {unknown}; tasks are {list(TASKS)}")
    heads = args.heads.split(",")
    # the configurations this check tries (one per head) are the deflated Sharpe ratio's trials
    sets = ([f"eval.trials={len(heads)}"] if not any(s.startswith("eval.trials") for s in args.set) else []) + args.set
    _overrides(sets)  # fail on a bad override before anything runs
    jobs = [
        {"task": task, "head": head, "seed": seed, "device": device, "quick": args.quick, "sets": sets}
        for task in args.tasks.split(",")
        for head in heads
        for seed in range(args.seeds)
    ]
    old = []
    if args.resume:  # the runs an earlier call finished are not repeated
        import run_plan

        old = [r for r in run_plan.read_rows(args.jsonl) if r.get("error") is None]
        jobs = run_plan.pending(jobs, old)
        print(f"resume: {len(old)} finished rows in {args.jsonl}; {len(jobs)} runs left", flush=True)
    t0 = time.perf_counter()

    def on_row(r):
        print(f"{r['task']:10s} {r['head']:4s} seed {r['seed']}: {describe(r)}", flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as fh:
                log_row(fh, r)

    rows = old + run_jobs(jobs, args.workers, on_row, run_root=args.run_root, resume=args.resume)
    wall = time.perf_counter() - t0
    failed = [r for r in rows if r.get("error")]
    rows = [r for r in rows if not r.get("error")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": device,
        "quick": args.quick,
        "seeds": args.seeds,
        "workers": args.workers,
        "wall_s": wall,
        "sets": sets,
        "commit": commit(),
        "gpu": _gpu_name(device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "view_margins": list(VIEW_MARGINS),
        "view_gate": VIEW_GATE,
    }
    dump_json({**meta, "rows": rows, "failed": failed}, args.out)
    print(f"wrote {args.out}")  # before the summary: a crash there must not lose the runs
    import learning_report

    print("\n" + learning_report.summary_text(rows))
    if args.results_md:
        args.results_md.write_text(learning_report.results_markdown(meta, rows, failed, args.screen))
        print(f"wrote {args.results_md}")
    return 1 if failed or not canary_passes(rows) else 0


def canary_passes(rows: list[dict]) -> bool:
    """Every canary run (each head, each seed) clears :data:`CANARY_BAR`; prints the runs that do not
    (the named failure of a learning regression: PopArt removed, a sign flipped)."""
    bad = [r for r in rows if r["task"] == "canary" and not r["test_sharpe"] > CANARY_BAR]
    for r in bad:
        print(f"FAILED canary[{r['head']}] seed {r['seed']}: test Sharpe {r['test_sharpe']:.2f} <= {CANARY_BAR:g}")
    return not bad


if __name__ == "__main__":
    sys.exit(exit_code(main))
