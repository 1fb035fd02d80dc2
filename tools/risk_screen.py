#!/usr/bin/env python3
"""Risk-sensitive acting (``agent.act_by``, issue 19 item 8): test Sharpe and maximum drawdown as the
CVaR level ``alpha`` (and mean - lambda std's ``lambda``) varies, against acting on the mean.

Every run is ``tools/learning_check.py``'s (``learning_check.run_jobs``: the same budget, tasks and
evaluation as the learning check). ``VARIANTS`` are trained on each task and head for ``--seeds``
seeds; the table gives, per (task, head, variant), the deployed test Sharpe and maximum drawdown
(``eval.gate_psr`` applies: a shut gate is flat, Sharpe undefined and drawdown 0) and the same final
weights' own positions with the gate off (``margin=0`` view: the trade-off the measure makes), each as
mean +- sd over seeds, with the difference from ``mean`` paired by seed. Rows are appended to
``--jsonl`` as runs end; ``--out`` gets rows and table as JSON, ``--md`` the table; ``--table-only``
writes both from ``--jsonl`` (after a call cut short, or over several calls: ``--resume`` skips the runs
``--jsonl`` holds, ``--deadline-s`` starts no run that would end after it; ``tools/run_plan.py``).
One GPU call with the auxiliary signals' screen: ``tools/screens_gpu.sh``.

    python3 tools/risk_screen.py --seeds 3 --workers 14 --out $OUT/risk.json --jsonl $OUT/risk.jsonl \\
        --md $OUT/risk.md                                     # one GPU call: regime, ar, ou, sp500
    python3 tools/risk_screen.py --quick --seeds 1 --tasks regime --heads c51 --only "cvar 0.1"  # CPU
    python3 tools/risk_screen.py --table-only --jsonl risk.jsonl --out /tmp/risk.json --md risk.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import learning_check  # noqa: E402
import run_plan  # noqa: E402
from mechanism_screen import _mean as _stats  # noqa: E402  (mean, sd, n of the finite values)
from mechanism_screen import cell  # noqa: E402

from cudarl.evaluate import json_safe  # noqa: E402

#: (variant, overrides). "mean" is today's acting, the reference of every other row.
VARIANTS = [
    ("mean", ["agent.act_by=mean"]),
    ("cvar 0.05", ["agent.act_by=cvar", "agent.act_alpha=0.05"]),
    ("cvar 0.1", ["agent.act_by=cvar", "agent.act_alpha=0.1"]),
    ("cvar 0.25", ["agent.act_by=cvar", "agent.act_alpha=0.25"]),
    ("cvar 0.5", ["agent.act_by=cvar", "agent.act_alpha=0.5"]),
    ("mean-std 0.5", ["agent.act_by=mean_std", "agent.act_lambda=0.5"]),
    ("mean-std 1", ["agent.act_by=mean_std", "agent.act_lambda=1.0"]),
]
#: Known-answer markets and a real series (learning_check.TASKS).
TASKS = ("regime", "ar", "ou", "sp500")
HEADS = ("c51", "iqn")


def jobs_for(variants, tasks, heads, seeds: int, device: str, quick: bool) -> list[dict]:
    return [
        {"task": t, "head": h, "seed": s, "variant": v, "sets": list(sets), "device": device, "quick": quick}
        for v, sets in variants
        for t in tasks
        for h in heads
        for s in range(seeds)
    ]


def _measures(r: dict) -> dict:
    """Deployed (gated) and ungated test Sharpe and maximum drawdown of one run."""
    own = r.get("views", {}).get("margin=0", {})
    return {
        "sharpe": r.get("test_sharpe"),
        "max_drawdown": r.get("test_max_drawdown"),
        "ungated_sharpe": own.get("sharpe"),
        "ungated_max_drawdown": own.get("max_drawdown"),
    }


def table(rows: list[dict]) -> list[dict]:
    """One entry per (task, head, variant): each measure's mean, sd and n over seeds, and (not for
    ``mean``) its difference from ``mean``'s, paired by seed."""
    by: dict = {}
    for r in rows:
        if r.get("error") is None:
            by.setdefault((r["task"], r["head"], r["variant"]), {})[r["seed"]] = _measures(r)
    out = []
    for (task, head, variant), seeds in by.items():
        e = {"task": task, "head": head, "variant": variant, "n": len(seeds)}
        ref = by.get((task, head, "mean"), {}) if variant != "mean" else {}
        for k in ("sharpe", "max_drawdown", "ungated_sharpe", "ungated_max_drawdown"):
            e[k] = _stats([m[k] for m in seeds.values()])
            if ref:
                e[f"{k}_difference"] = _stats(
                    [m[k] - ref[s][k] for s, m in seeds.items() if s in ref and _num(m[k], ref[s][k])]
                )
        out.append(e)
    return sorted(out, key=lambda e: (e["task"], e["head"], [v for v, _ in VARIANTS].index(e["variant"])))


def _num(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def markdown(entries: list[dict], header: str) -> str:
    f = cell
    d = lambda e, k: f(e[f"{k}_difference"]) if f"{k}_difference" in e else ""  # noqa: E731
    lines = [
        header,
        "",
        "| task | head | act_by | test Sharpe (gated) | max drawdown (gated) | Sharpe, gate off | vs mean "
        "| max drawdown, gate off | vs mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        lines.append(
            f"| {e['task']} | {e['head']} | {e['variant']} | {f(e['sharpe'])} | {f(e['max_drawdown'])} "
            f"| {f(e['ungated_sharpe'])} | {d(e, 'ungated_sharpe')} | {f(e['ungated_max_drawdown'])} "
            f"| {d(e, 'ungated_max_drawdown')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    learning_check.add_run_args(ap)
    run_plan.add_args(ap)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--only", default="", help="comma-separated variants to run besides mean (e.g. 'cvar 0.1')")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "risk_screen.json")
    ap.add_argument("--jsonl", type=Path, default=ROOT / "docs" / "bench" / "risk_screen.jsonl")
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--table-only", action="store_true", help="write --out and --md from the rows in --jsonl")
    args = ap.parse_args()
    if args.table_only:
        rows = run_plan.read_rows(args.jsonl)
        return write_table(
            rows, args, f"Risk-sensitive acting (issue 19 item 8): {len(rows)} runs read from {args.jsonl.name}."
        )
    device = learning_check.resolve_device(args.device)
    keep = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in keep if w not in [v for v, _ in VARIANTS]]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; variants are {[v for v, _ in VARIANTS]}")
    variants = [(v, sets + args.set) for v, sets in VARIANTS if v == "mean" or not keep or v in keep]
    learning_check._overrides([x for _, sets in variants for x in sets])  # fail on a bad override at once
    tasks, heads = args.tasks.split(","), args.heads.split(",")
    unknown = [t for t in tasks if t not in learning_check.TASKS]
    if unknown:
        ap.error(f"unknown task(s) {unknown}; tasks are {list(learning_check.TASKS)}")
    jobs = jobs_for(variants, tasks, heads, args.seeds, device, args.quick)
    if args.resume:  # the runs an earlier call finished are not repeated
        old = run_plan.read_rows(args.jsonl)
        jobs = run_plan.pending(jobs, old)
        print(f"resume: {len(old)} rows in {args.jsonl}; {len(jobs)} runs left", flush=True)
    walls = run_plan.recorded_walls()
    jobs = run_plan.seed_major(jobs, walls)  # a deadline cuts the last seed's short runs
    start_if = run_plan.StartBy(args.deadline_s, walls)
    for r in old if args.resume else []:
        start_if.saw(r)
    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"risk screen: {len(jobs)} runs on {device}, {args.workers} worker(s)", flush=True)
    with args.jsonl.open("a") as log:

        def on_row(r):
            start_if.saw(r)
            learning_check.log_row(log, r)
            print(
                f"[{time.perf_counter() - t0:.0f}s] {r['variant']} {r['task']} {r['head']} seed {r['seed']}: "
                f"{learning_check.describe(r) if r.get('error') is None else r['error']}",
                flush=True,
            )

        rows = learning_check.run_jobs(jobs, args.workers, on_row, start_if, run_root=args.run_root, resume=args.resume)
    if start_if.declined:
        print(f"{len(start_if.declined)} runs not started (--deadline-s {args.deadline_s:g}); --resume runs them")
    header = (
        f"Risk-sensitive acting (issue 19 item 8): {len(rows)} runs on {device}, {args.seeds} seed(s), "
        f"{time.perf_counter() - t0:.0f} s wall"
        f"{f', {len(start_if.declined)} left for a later call' if start_if.declined else ''}."
    )
    return write_table(run_plan.read_rows(args.jsonl) if args.resume else rows, args, header)


def write_table(rows: list[dict], args, header: str) -> int:
    """The table of ``rows`` printed and written to ``--out`` (JSON, with the rows) and ``--md``; 1 if a
    run failed."""
    entries = table(rows)
    md = markdown(entries, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe({"rows": rows, "table": entries}), indent=1, allow_nan=False))
    if args.md:
        args.md.write_text(md)
    print(md)
    return 0 if all(r.get("error") is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(learning_check.exit_code(main))
