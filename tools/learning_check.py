#!/usr/bin/env python3
"""Does cudarl learn? Train and evaluate on data with known answers and on real held-out series.

1. canary: builtin:canary, a random walk plus a column that leaks the next bar's return; a correct
   learner must exploit it (held-out greedy Sharpe far above any real edge).
2. regime: builtin:regime, whose optimal policy's Sharpe is known (cudarl.datasets.regime_sharpe).
3. real: builtin:sp500, builtin:nasdaq, builtin:eurusd-1h with chronological splits, costs on,
   next-bar fills; held-out metrics against buy-and-hold and flat at 1x, 2x, 3x costs.

Each task runs for every head (c51, iqn) and every seed; results go to a table and JSON (``--out``),
and ``--results-md`` writes the results page (docs/results.md). ``--workers`` spreads the runs over
processes (:func:`run_jobs`, shared with ``tools/sweep.py``). ``--quick`` is the CPU-sized version.
The budget of each task (updates, envs) is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl.config import from_dict, resolve_for_backend  # noqa: E402
from cudarl.datasets import REGIME_DEFAULTS, regime_sharpe  # noqa: E402

#: Task settings on top of the defaults (the budgets are part of the result).
TASKS = {
    "canary": {
        "data": {"source": "builtin:canary?n=6000"},
        "features": {"extra": ["next_return"]},  # the leak, named explicitly
        "agent": {"gamma": 0.5},
        "replay": {"n_step": 1},
    },
    "regime": {"data": {"source": "builtin:regime?n=20000"}},
    "sp500": {"data": {"source": "builtin:sp500"}},
    "nasdaq": {"data": {"source": "builtin:nasdaq"}},
    "eurusd-1h": {"data": {"source": "builtin:eurusd-1h"}},
}
QUICK = {"run": {"steps": 1500, "eval_every": 0}, "env": {"n_envs": 16, "episode_len": 256}}
#: The GPU budget: 10,000 updates. Measured (docs/sweeps.md): on builtin:regime more updates over the
#: same 14,000 training bars overfit (C51 held-out Sharpe 97% of the optimum at 5k updates, 92% at
#: 10k, 70% at 20k, 46% at 50k).
GPU_BUDGET = {"run": {"steps": 10_000, "eval_every": 0}}


def merge(*dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for sec, vals in d.items():
            out.setdefault(sec, {}).update(vals)
    return out


def run_one(task: str, head: str, seed: int, device: str, quick: bool, extra: dict) -> dict:
    from cudarl.trainer import Trainer

    over = merge(
        {"run": {"device": device, "seed": seed, "checkpoint_every": 0, "log_every": 10**9}},
        QUICK if quick else GPU_BUDGET,
        TASKS[task],
        {"net": {"head": head}},
        extra,
    )
    cfg = from_dict(over)
    cfg = resolve_for_backend(cfg, device == "gpu", over)
    t0 = time.perf_counter()
    tr = Trainer(cfg, run_dir=False, echo=lambda m: None)
    tr.run()
    test = tr.evaluate("test", write=False)
    wall = time.perf_counter() - t0
    pol, bh = test["policy"], test["buy_and_hold"]
    row = {
        "task": task,
        "head": head,
        "seed": seed,
        "updates": cfg.run.steps,
        "envs": cfg.env.n_envs,
        "wall_s": wall,
        "test_sharpe": pol["sharpe"],
        "buy_and_hold_sharpe": bh["sharpe"],
        "flat_sharpe": test["flat"]["sharpe"],
        "test_total_return": pol["total_return"],
        "trades": pol.get("trades"),
        "cost_sweep": {k: v["sharpe"] for k, v in test["cost_sweep"].items()},
    }
    if task == "regime":
        # The optimum: the population Sharpe of position = s_t (the formula), and what that policy
        # realised on this very test split with the env's fill and costs (the fair comparison).
        from cudarl.datasets import regime_optimal_positions
        from cudarl.evaluate import evaluate_positions

        e, sp = cfg.env, tr.data.splits.test
        row["optimal_sharpe_formula"] = regime_sharpe(
            REGIME_DEFAULTS["mu"],
            REGIME_DEFAULTS["sigma"],
            REGIME_DEFAULTS["p"],
            (e.cost_bps + e.slippage_bps) * 1e-4,
            REGIME_DEFAULTS["periods_per_year"],
        )
        opt = regime_optimal_positions(tr.data.bars)[sp.start : sp.stop - 2]
        ev = evaluate_positions(
            tr.data.bars,
            opt,
            sp,
            cost_bps=e.cost_bps,
            slippage_bps=e.slippage_bps,
            periods_per_year=tr.data.periods_per_year,
            fill=e.fill,
        )
        row["optimal_sharpe"] = ev.summary["policy"]["sharpe"]
        row["fraction_of_optimum"] = row["test_sharpe"] / row["optimal_sharpe"]
    return row


def _overrides(sets: list[str]) -> dict:
    from cudarl.config import parse_override

    extra: dict = {}
    for s in sets:
        sec, f, v = parse_override(s)
        extra.setdefault(sec, {})[f] = v
    return extra


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """The options every multi-run tool shares (this one and tools/sweep.py)."""
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    ap.add_argument("--quick", action="store_true", help="CPU-sized budgets")
    ap.add_argument("--workers", type=int, default=1, help="processes to spread the runs over")


def resolve_device(device: str) -> str:
    from cudarl import backend

    if device == "auto":
        return "gpu" if backend.cupy_unavailable_reason() is None else "cpu"
    return device


def _run_job(job: dict, shared_gpu: bool = False) -> dict:
    t0 = time.perf_counter()
    try:
        ov = _overrides(job["sets"])
        if shared_gpu:  # other runs' kernels share the SMs: no launch may wait for all its blocks
            ov.setdefault("run", {}).setdefault("grid_barrier", False)  # unless --set run.grid_barrier=...
        row = run_one(job["task"], job["head"], job["seed"], job["device"], job["quick"], ov)
        row["error"] = None
    except Exception as exc:  # a diverged or invalid run is a result, not a crash of the whole check
        row = {
            "task": job["task"],
            "head": job["head"],
            "seed": job["seed"],
            "error": f"{type(exc).__name__}: {exc}",
            "wall_s": time.perf_counter() - t0,
        }
    return {**row, **{k: job[k] for k in job if k not in row}}


def run_jobs(jobs: list[dict], workers: int, on_row) -> list[dict]:
    """Run ``jobs`` (dicts with task, head, seed, device, quick, sets and any labels) and return their rows.

    ``workers > 1`` spreads them over spawned processes (CUDA state must not be forked); on one GPU
    the processes share it, which pays because one run's step is latency-bound. Then a job on device
    ``gpu`` runs with ``run.grid_barrier`` off (MPS overlaps the processes' kernels, so no launch may
    wait for all its blocks; the same bits), unless its ``sets`` give ``run.grid_barrier`` explicitly.
    ``on_row(row)`` is called as each run ends (rows then come in completion order; the returned list
    is in job order).
    """
    if workers <= 1:
        rows = []
        for job in jobs:
            rows.append(_run_job(job))
            on_row(rows[-1])
        return rows
    done = {}
    items = [(i, job, job["device"] == "gpu") for i, job in enumerate(jobs)]  # gpu: processes share it
    with mp.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
        for i, row in pool.imap_unordered(_indexed, items):
            done[i] = row
            on_row(row)
    return [done[i] for i in range(len(jobs))]


def _indexed(item):
    i, job, shared_gpu = item
    return i, _run_job(job, shared_gpu)


def _commit() -> str:
    import os

    if os.environ.get("CUDARL_COMMIT"):  # a GPU host gets a tree without .git
        return os.environ["CUDARL_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _gpu_name(device: str) -> str:
    if device != "gpu":
        return f"CPU ({platform.processor() or platform.machine()})"
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()


def mean_spread(values) -> tuple[float, float, int]:
    """Mean and population spread of the finite values, and how many were not finite (a policy that
    stayed flat has no returns, so its Sharpe is undefined: NaN)."""
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite:
        return float("nan"), float("nan"), len(values)
    return statistics.mean(finite), (statistics.pstdev(finite) if len(finite) > 1 else 0.0), len(values) - len(finite)


def summary_text(sh) -> str:
    m, sd, bad = mean_spread(sh)
    return f"{m:.2f} ± {sd:.2f}" + (f" ({bad} of {len(sh)} undefined: flat)" if bad else "")


def _fmt(x, spec=".2f") -> str:
    return "—" if x is None or x != x else format(x, spec)


#: What each task's acceptance is (issue 8); the summary table says whether the measurement met it.
ACCEPT = {
    "canary": ("held-out Sharpe > 5", lambda rs: all(r["test_sharpe"] > 5 for r in rs)),
    "regime": (">= 80% of the optimum, every seed", lambda rs: all(r["fraction_of_optimum"] >= 0.8 for r in rs)),
}


def results_markdown(meta: dict, rows: list[dict], failed: list[dict]) -> str:
    """The results page: method, every run, the mean and spread per task and head, the acceptance."""
    budgets = sorted({(r["updates"], r["envs"]) for r in rows})
    out = [
        "# Learning results",
        "",
        f"Written by `tools/learning_check.py --results-md` on {meta['gpu']} (device `{meta['device']}`), commit "
        f"`{meta['commit']}`, {meta['date']}; {meta['seeds']} seeds, {meta['workers']} worker process(es), "
        f"{meta['wall_s']:.0f} s of wall time in all.",
        "Configuration: the defaults (`docs/config.md`) plus each task's settings in `tools/learning_check.py` "
        f"(`TASKS`){'; overrides: ' + ', '.join(f'`{x}`' for x in meta['sets']) if meta['sets'] else ''}. "
        "Budget per run: " + "; ".join(f"{u:,} learner updates with {e} environments" for u, e in budgets) + ".",
        "Held-out = the chronological test split (the last 15% of bars), greedy policy, costs on, filled at the "
        "next bar's open. Sharpe ratios are annualised. Wall times overlap when runs share the GPU.",
        "",
        "| task | head | seed | test Sharpe | buy-and-hold | flat | optimum (this split) | % of optimum | "
        "Sharpe at 2x / 3x costs | trades | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        frac = f"{100 * r['fraction_of_optimum']:.0f}%" if "fraction_of_optimum" in r else ""
        flat = _fmt(r["flat_sharpe"]) if r["flat_sharpe"] == r["flat_sharpe"] else "— (no returns)"
        pol = f"{r['test_sharpe']:.2f}" if r["test_sharpe"] == r["test_sharpe"] else "— (stayed flat)"
        out.append(
            f"| {r['task']} | {r['head']} | {r['seed']} | {pol} | {r['buy_and_hold_sharpe']:.2f} | "
            f"{flat} | {_fmt(r.get('optimal_sharpe'))} | {frac} | {_fmt(r['cost_sweep'].get('2x'))} / "
            f"{_fmt(r['cost_sweep'].get('3x'))} | {r.get('trades', '')} | {r['wall_s']:.0f} |"
        )
    out += [
        "",
        "Mean and spread (population standard deviation) over the seeds:",
        "",
        "| task | head | test Sharpe | buy-and-hold | at 3x costs | acceptance |",
        "|---|---|---|---|---|---|",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        for head in dict.fromkeys(r["head"] for r in rows if r["task"] == task):
            rs = [r for r in rows if (r["task"], r["head"]) == (task, head)]
            sh = [r["test_sharpe"] for r in rs]
            c3 = [r["cost_sweep"]["3x"] for r in rs if "3x" in r["cost_sweep"]]
            if task in ACCEPT:
                what, ok = ACCEPT[task]
                acc = f"{what}: {'met' if ok(rs) else 'NOT met'}"
                if task == "regime":
                    fracs = ", ".join(f"{100 * r['fraction_of_optimum']:.0f}%" for r in rs)
                    acc += f" ({fracs})"
            else:
                acc = "table only"
            out.append(
                f"| {task} | {head} | {summary_text(sh)} | "
                f"{mean_spread([r['buy_and_hold_sharpe'] for r in rs])[0]:.2f} | "
                f"{_fmt(mean_spread(c3)[0] if c3 else None)} | {acc} |"
            )
    if failed:
        out += ["", "Runs that failed:", ""] + [
            f"- {r['task']} {r['head']} seed {r['seed']}: {r['error']}" for r in failed
        ]
    out += [
        "",
        "## Reading these numbers",
        "",
        "- **canary**: `builtin:canary` leaks the next bar's return in a feature; a learner with a sign, timing or",
        "  indexing bug does not exploit it. The CPU version runs in CI (`tests/unit/test_learning.py`, NumPy",
        "  backend, held-out Sharpe > 2).",
        "- **regime**: the optimum is what the optimal policy (`position = s_t`) realised on the same test split with",
        "  the same fill and costs; the population value from the formula is printed by the tool (`docs/data.md`).",
        "- **real series**: `builtin:sp500`, `builtin:nasdaq`, `builtin:eurusd-1h`, chronological splits, costs on.",
        "  Honest numbers for the defaults, not a tuned strategy; compare with buy-and-hold in the same row.",
        "- The defaults and the budget come from the sweeps in `docs/sweeps.md`.",
        "",
    ]
    return "\n".join(out)


def describe(r: dict) -> str:
    if r.get("error"):
        return f"error {r['error']}"
    opt = (
        (
            f"  optimum on this split {r['optimal_sharpe']:.2f} ({100 * r['fraction_of_optimum']:.0f}%), "
            f"population {r['optimal_sharpe_formula']:.2f}"
        )
        if "optimal_sharpe" in r
        else ""
    )
    return (
        f"test Sharpe {r['test_sharpe']:.2f} (buy-and-hold {r['buy_and_hold_sharpe']:.2f}){opt}  "
        f"[{r['updates']} updates, {r['wall_s']:.0f} s]"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="canary,regime,sp500,nasdaq,eurusd-1h")
    ap.add_argument("--heads", default="c51,iqn")
    add_run_args(ap)
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE applied to every run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "learning_check.json")
    ap.add_argument("--results-md", type=Path, default=None, help="write the results page (docs/results.md) here")
    args = ap.parse_args()
    device = resolve_device(args.device)
    _overrides(args.set)  # fail on a bad override before anything runs
    jobs = [
        {"task": task, "head": head, "seed": seed, "device": device, "quick": args.quick, "sets": args.set}
        for task in args.tasks.split(",")
        for head in args.heads.split(",")
        for seed in range(args.seeds)
    ]
    t0 = time.perf_counter()

    def on_row(r):
        print(f"{r['task']:10s} {r['head']:4s} seed {r['seed']}: {describe(r)}", flush=True)

    rows = run_jobs(jobs, args.workers, on_row)
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
        "sets": args.set,
        "commit": _commit(),
        "gpu": _gpu_name(device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
    }
    args.out.write_text(json.dumps({**meta, "rows": rows, "failed": failed}, indent=1, default=float))
    print(f"wrote {args.out}")  # before the summary: a crash there must not lose the runs
    print("\nsummary (mean and spread over seeds):")
    for task in dict.fromkeys(r["task"] for r in rows):
        for head in dict.fromkeys(r["head"] for r in rows if r["task"] == task):
            sh = [r["test_sharpe"] for r in rows if r["task"] == task and r["head"] == head]
            print(f"  {task:10s} {head:4s} test Sharpe {summary_text(sh)}")
    if args.results_md:
        args.results_md.write_text(results_markdown(meta, rows, failed))
        print(f"wrote {args.results_md}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
