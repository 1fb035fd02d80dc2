#!/usr/bin/env python3
"""Hyper-parameter sweep: each variant of the defaults trained and evaluated on one task, several seeds.

A variant is a name and a set of ``SECTION.FIELD=VALUE`` overrides on top of the defaults (and of
the task's settings in ``tools/learning_check.py``); every run is ``learning_check.run_one``, so a
sweep row and a learning-check row are the same measurement. Runs are spread over ``--workers``
processes (on one GPU they share it; the step is latency-bound, so several processes keep it
busier than one). Each finished run is appended to ``--jsonl`` at once, so a sweep cut short keeps
what it measured; ``--md`` writes the summary table (mean, spread, per-seed values). A sweep larger
than one GPU call runs over several: ``--seed-list`` picks the seeds of a call and ``--resume`` skips
the runs ``--jsonl`` already holds (its table then covers every call's rows). With ``--run-root DIR`` each
run has a run directory there (``tools/run_dirs.py``), checkpointed as it trains and when SIGTERM or SIGINT
(``timeout``) stops the sweep; ``--resume`` then continues a run cut short from its checkpoint, to the row
an uncut run gives (docs/sweeps.md, "Runs that survive being cut").

    python3 tools/sweep.py --tasks regime,noise --heads c51 --seeds 3 --workers 4 \\
        --variant base --variant "gamma0.9:agent.gamma=0.9" --variant "lr3e-4:optim.lr=3e-4"
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import learning_check  # noqa: E402
import run_plan  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"name:a.b=1,c.d=2"`` -> ``("name", ["a.b=1", "c.d=2"])``; ``"base"`` -> ``("base", [])``."""
    name, _, rest = text.partition(":")
    # split at commas that start a new SECTION.FIELD=, so list values like [128,128] stay whole
    sets = [s.strip() for s in re.split(r",(?=\s*[A-Za-z_]+\.[A-Za-z_]+\s*=)", rest) if s.strip()] if rest else []
    if not name:
        raise SystemExit(f"variant {text!r}: expected NAME[:SECTION.FIELD=VALUE,...]")
    return name, sets


def _mean_min(values) -> tuple[float, float]:
    ok = [v for v in values if learning_check._finite(v)]
    return (statistics.mean(ok), min(ok)) if ok else (float("nan"), float("nan"))


def _mean_max(values) -> tuple[float, float]:
    ok = [v for v in values if learning_check._finite(v)]
    return (statistics.mean(ok), max(ok)) if ok else (float("nan"), float("nan"))


def summarise(rows: list[dict]) -> list[dict]:
    """One entry per (variant, task, head): the seeds' test Sharpe, % of the causal reference, share of
    bars traded, validation decay, how many seeds meet the task's target (learning_report.TARGETS), and
    the same for the validation-gated view of the same weights."""
    import learning_report

    out = []
    for key in dict.fromkeys((r["variant"], r["task"], r["head"]) for r in rows):
        rs = [r for r in rows if (r["variant"], r["task"], r["head"]) == key]
        ok = [r for r in rs if r.get("error") is None]
        mean, spread, _ = learning_check.mean_spread([r["test_sharpe"] for r in ok])  # (nan, nan, n) for none
        target = learning_report.TARGETS.get(ok[0]["kind"]) if ok else None
        gate = [r["views"].get(f"gate={learning_check.VIEW_GATE:g}", {}) for r in ok]
        out.append(
            {
                "variant": key[0],
                "task": key[1],
                "head": key[2],
                "sets": rs[0]["sets"],
                "n": len(ok),
                "errors": len(rs) - len(ok),
                "sharpe_mean": mean,
                "sharpe_spread": spread,
                "sharpes": [r["test_sharpe"] for r in ok],
                "fraction_causal": _mean_min([r.get("fraction_of_causal") for r in ok]),
                "trade_pct": _mean_max([r["test_trade_bars_pct"] for r in ok]),
                "decay": _mean_min([r.get("decay_ratio") for r in ok]),
                "target_met": sum(target[2](r) for r in ok) if target else None,
                "gate_fraction_causal": _mean_min([g.get("fraction_of_causal") for g in gate]),
                "gate_trade_pct": _mean_max([g.get("trade_bars_pct", 0.0) for g in gate]),
                "wall_s": statistics.mean(r["wall_s"] for r in rs),
            }
        )
    return out


def markdown(summary: list[dict], header: str) -> str:
    f, pct = learning_check._f, (lambda x: f"{100 * x:.0f}%" if learning_check._finite(x) else "—")
    lines = [
        header,
        "",
        "| variant | overrides | task | head | test Sharpe mean ± spread | % of causal mean (min) | "
        "trades, % of bars mean (max) | val final/best mean (min) | target met | gated: % of causal, trades % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        err = f" ({s['errors']} failed)" if s["errors"] else ""
        fc, tp, dc = s["fraction_causal"], s["trade_pct"], s["decay"]
        gfc, gtp = s["gate_fraction_causal"], s["gate_trade_pct"]
        met = "" if s["target_met"] is None else f"{s['target_met']} of {s['n']}"
        lines.append(
            f"| {s['variant']} | {', '.join(f'`{x}`' for x in s['sets']) or '(defaults)'} | {s['task']} | "
            f"{s['head']} | {f(s['sharpe_mean'])} ± {f(s['sharpe_spread'])}{err} | {pct(fc[0])} ({pct(fc[1])}) | "
            f"{f(tp[0], '.1f')} ({f(tp[1], '.1f')}) | {pct(dc[0])} ({pct(dc[1])}) | {met} | "
            f"{pct(gfc[0])}, {f(gtp[0], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def seeds(args) -> list[int]:
    """The seeds to run: ``--seed-list``, else 0 .. ``--seeds`` - 1."""
    if args.seed_list:
        return [int(x) for x in args.seed_list.split(",")]
    return list(range(args.seeds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="regime", help="comma-separated tasks of tools/learning_check.py")
    ap.add_argument("--heads", default="c51")
    learning_check.add_run_args(ap)
    ap.add_argument("--variant", action="append", default=[], help="NAME[:SECTION.FIELD=VALUE,...] (repeatable)")
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE applied to every variant")
    ap.add_argument("--jsonl", type=Path, default=ROOT / "docs" / "bench" / "sweep.jsonl")
    ap.add_argument("--md", type=Path, default=None, help="write the summary table here")
    ap.add_argument(
        "--seed-list", default=None, help="comma-separated seeds to run instead of 0 .. --seeds - 1 (one call a seed)"
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="skip the runs whose row --jsonl already holds (and is not an error); the table covers every row",
    )
    args = ap.parse_args()
    device = learning_check.resolve_device(args.device)
    variants = [(n, args.set + sets) for n, sets in (parse_variant(v) for v in (args.variant or ["base"]))]
    for _, sets in variants:
        learning_check._overrides(sets)  # fail on a bad override before anything runs
    jobs = [
        {"task": t, "head": h, "seed": s, "variant": n, "sets": sets, "device": device, "quick": args.quick}
        for n, sets in variants
        for t in args.tasks.split(",")
        for h in args.heads.split(",")
        for s in seeds(args)
    ]
    if args.resume:  # the runs an earlier call finished are not repeated
        old = run_plan.read_rows(args.jsonl)
        jobs = run_plan.pending(jobs, old)
        print(f"resume: {len(old)} rows in {args.jsonl}; {len(jobs)} runs left", flush=True)
    print(
        f"sweep: {len(jobs)} runs ({len(variants)} variants x {args.tasks} x {args.heads} x seeds {seeds(args)}) "
        f"on {device}, "
        f"{args.workers} worker(s)",
        flush=True,
    )
    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    t0, log = time.perf_counter(), args.jsonl.open("a")
    n_done = []

    def on_row(r):  # each finished run is on disk at once: a sweep cut short keeps what it measured
        n_done.append(1)
        learning_check.log_row(log, r)
        res = learning_check.describe(r)
        print(
            f"[{len(n_done)}/{len(jobs)} {time.perf_counter() - t0:.0f}s] {r['variant']:16s} {r['task']} {r['head']} "
            f"seed {r['seed']}: {res}",
            flush=True,
        )

    with log:
        rows = learning_check.run_jobs(jobs, args.workers, on_row, run_root=args.run_root, resume=args.resume)
    if args.resume:  # the table of every call's rows
        rows = run_plan.read_rows(args.jsonl)
    summary = summarise(rows)
    table = markdown(
        summary,
        f"Sweep on `{args.tasks}`, seeds {seeds(args)}, device {device}, "
        f"{time.perf_counter() - t0:.0f} s wall with {args.workers} worker(s).",
    )
    print("\n" + table)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(table)
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(learning_check.exit_code(main))
