#!/usr/bin/env python3
"""Does cudarl learn? Train and evaluate on data with known answers and on real held-out series.

1. canary: builtin:canary, a random walk plus a column that leaks the next bar's return; a correct
   learner must exploit it (held-out greedy Sharpe far above any real edge).
2. regime: builtin:regime, whose optimal policy's Sharpe is known (cudarl.datasets.regime_sharpe).
3. real: builtin:sp500, builtin:nasdaq, builtin:eurusd-1h with chronological splits, costs on,
   next-bar fills; held-out metrics against buy-and-hold and flat at 1x, 2x, 3x costs.

Each task runs for every head (c51, iqn) where listed and every seed; results go to a table and
JSON (``--out``), and ``--results-md`` writes docs/results.md. ``--quick`` is the CPU-sized
version. The budget of each task (updates, envs) is printed with the results.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl.config import from_dict, resolve_for_backend  # noqa: E402
from cudarl.datasets import REGIME_DEFAULTS, regime_sharpe  # noqa: E402

#: Task settings on top of the defaults (the budgets are part of the result).
TASKS = {
    "canary": {"data": {"source": "builtin:canary?n=6000"}, "agent": {"gamma": 0.5}, "replay": {"n_step": 1}},
    "regime": {"data": {"source": "builtin:regime?n=20000"}},
    "sp500": {"data": {"source": "builtin:sp500"}},
    "nasdaq": {"data": {"source": "builtin:nasdaq"}},
    "eurusd-1h": {"data": {"source": "builtin:eurusd-1h"}},
}
QUICK = {"run": {"steps": 1500, "eval_every": 0}, "env": {"n_envs": 16, "episode_len": 256}}
GPU_BUDGET = {"run": {"steps": 20_000, "eval_every": 0}}


def merge(*dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for sec, vals in d.items():
            out.setdefault(sec, {}).update(vals)
    return out


def run_one(task: str, head: str, seed: int, device: str, quick: bool, extra: dict) -> dict:
    from cudarl.trainer import Trainer

    over = merge({"run": {"device": device, "seed": seed, "checkpoint_every": 0, "log_every": 10**9}},
                 QUICK if quick else GPU_BUDGET, TASKS[task], {"net": {"head": head}}, extra)
    cfg = from_dict(over)
    cfg = resolve_for_backend(cfg, device == "gpu", over)
    t0 = time.perf_counter()
    tr = Trainer(cfg, run_dir=False, echo=lambda m: None)
    tr.run()
    test = tr.evaluate("test", write=False)
    wall = time.perf_counter() - t0
    pol, bh = test["policy"], test["buy_and_hold"]
    row = {"task": task, "head": head, "seed": seed, "updates": cfg.run.steps, "envs": cfg.env.n_envs,
           "wall_s": wall, "test_sharpe": pol["sharpe"], "buy_and_hold_sharpe": bh["sharpe"],
           "flat_sharpe": test["flat"]["sharpe"], "test_total_return": pol["total_return"],
           "trades": pol.get("trades"), "cost_sweep": {k: v["sharpe"] for k, v in test["cost_sweep"].items()}}
    if task == "regime":
        # The optimum: the population Sharpe of position = s_t (the formula), and what that policy
        # realised on this very test split with the env's fill and costs (the fair comparison).
        from cudarl.datasets import regime_optimal_positions
        from cudarl.evaluate import evaluate_positions

        e, sp = cfg.env, tr.data.splits.test
        row["optimal_sharpe_formula"] = regime_sharpe(REGIME_DEFAULTS["mu"], REGIME_DEFAULTS["sigma"], REGIME_DEFAULTS["p"],
                                                      (e.cost_bps + e.slippage_bps) * 1e-4, REGIME_DEFAULTS["periods_per_year"])
        opt = regime_optimal_positions(tr.data.bars)[sp.start:sp.stop - 2]
        ev = evaluate_positions(tr.data.bars, opt, sp, cost_bps=e.cost_bps, slippage_bps=e.slippage_bps,
                                periods_per_year=tr.data.periods_per_year, fill=e.fill)
        row["optimal_sharpe"] = ev.summary["policy"]["sharpe"]
        row["fraction_of_optimum"] = row["test_sharpe"] / row["optimal_sharpe"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="canary,regime,sp500,nasdaq,eurusd-1h")
    ap.add_argument("--heads", default="c51,iqn")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    ap.add_argument("--quick", action="store_true", help="CPU-sized budgets")
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE applied to every run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "learning_check.json")
    args = ap.parse_args()
    from cudarl import backend
    from cudarl.config import parse_override

    device = args.device
    if device == "auto":
        device = "gpu" if backend.cupy_unavailable_reason() is None else "cpu"
    extra: dict = {}
    for s in args.set:
        sec, f, v = parse_override(s)
        extra.setdefault(sec, {})[f] = v
    rows = []
    for task in args.tasks.split(","):
        heads = args.heads.split(",") if task in ("canary", "regime") else args.heads.split(",")[:1]
        for head in heads:
            for seed in range(args.seeds):
                r = run_one(task, head, seed, device, args.quick, extra)
                rows.append(r)
                opt = (f"  optimum on this split {r['optimal_sharpe']:.2f} ({100 * r['fraction_of_optimum']:.0f}%), "
                       f"population {r['optimal_sharpe_formula']:.2f}") if "optimal_sharpe" in r else ""
                print(f"{task:10s} {head:4s} seed {seed}: test Sharpe {r['test_sharpe']:.2f} (buy-and-hold "
                      f"{r['buy_and_hold_sharpe']:.2f}){opt}  [{r['updates']} updates, {r['wall_s']:.0f} s]", flush=True)
    print("\nsummary (mean and spread over seeds):")
    for task in dict.fromkeys(r["task"] for r in rows):
        for head in dict.fromkeys(r["head"] for r in rows if r["task"] == task):
            sh = [r["test_sharpe"] for r in rows if r["task"] == task and r["head"] == head]
            spread = statistics.pstdev(sh) if len(sh) > 1 else 0.0
            print(f"  {task:10s} {head:4s} test Sharpe {statistics.mean(sh):.2f} ± {spread:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": device, "quick": args.quick, "rows": rows}, indent=1, default=float))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
