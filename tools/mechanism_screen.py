#!/usr/bin/env python3
"""The on/off screen of the mechanisms issues 18 and 19 wired: each one trained with and without it, 3 seeds.

Every run is ``tools/learning_check.py``'s (``learning_check.run_jobs``: the same budget, tasks and
evaluation as the learning check, so a row here and a row there are the same measurement). Rows
(``SCREEN``: name, the task, the heads, the overrides) pair each mechanism's "on" with the defaults
(``base``) or with its own "off"; the offline rows first record one behaviour run per seed
(``run.record``, the C51 defaults on the task) and then train each head offline from it, plain double
DQN against CQL; that chain runs beside the online rows on a quarter of the workers. Each finished
run is appended to ``--jsonl`` at once (a call cut short keeps what it measured); at the end
``--out`` gets every row and the on/off table as JSON and ``--md`` the table (docs/results.md's
section). ``--tasks`` and ``--heads`` narrow the screen; ``--resume`` skips the runs ``--jsonl``
already holds and ``--deadline-s`` starts no run that would end after it (``tools/run_plan.py``), so a
screen larger than one GPU call is measured over several. GPU calls: ``tools/gpu_mechanisms.sh``
(issue 18), ``tools/screens_gpu.sh`` (issue 19's signals, ``--only aux``).

    python3 tools/mechanism_screen.py --seeds 3 --workers 14 --out $OUT/mechanisms.json \\
        --jsonl $OUT/mechanisms.jsonl --md $OUT/mechanisms.md
    python3 tools/mechanism_screen.py --quick --seeds 1 --workers 2 --only plan,popart   # CPU-sized
    python3 tools/mechanism_screen.py --table-only --jsonl aux.jsonl --out /tmp/aux.json --md aux.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import learning_check  # noqa: E402
import run_plan  # noqa: E402

from cudarl.evaluate import json_safe  # noqa: E402

#: (row name, the mechanism it measures, task, heads, overrides). "base" rows are the defaults; each
#: other row is compared with the base row of its task and head, or with the row named in COMPARE.
#: The Q statistics (and the guard's collapse rule, which never trips on these tasks) have no row: they
#: change no bit of training (tests/unit/test_mechanisms.py), so their on/off table is that test.
SCREEN = [
    ("base", "defaults", "regime", ("c51", "iqn"), []),
    ("base", "defaults", "canary", ("c51",), []),
    ("base", "defaults", "noise", ("c51",), []),
    ("popart off", "PopArt", "regime", ("c51", "iqn"), ["agent.popart=false"]),
    ("popart never frozen", "PopArt (C51 warm-up)", "regime", ("c51",), ["agent.popart_warmup=0"]),
    ("plan head", "plan head", "regime", ("c51", "iqn"), ["net.plan=true"]),
    ("plan head", "plan head", "canary", ("c51",), ["net.plan=true"]),
    ("plan head", "plan head", "noise", ("c51",), ["net.plan=true"]),
    ("spectral enc.1", "spectral norm", "regime", ("c51", "iqn"), ["net.spectral=[enc.1]"]),
    ("shrink-perturb 2000", "shrink-and-perturb", "regime", ("c51", "iqn"), ["optim.shrink_every=2000"]),
    ("offline ddqn", "offline (CQL)", "regime", ("c51", "iqn"), ["run.offline={rec}"]),
    ("offline cql 1", "offline (CQL)", "regime", ("c51", "iqn"), ["run.offline={rec}", "agent.cql_alpha=1.0"]),
    # issue 19's auxiliary signals (agent.aux; --only aux selects all seven): each on the hidden-regime
    # market and the real series (sp500) with C51; IQN where the signal applies to it (homeostatic
    # holds C51's atoms); the canary (must still exploit its leak) and noise (must stay flat) as checks
    ("base", "defaults", "sp500", ("c51",), []),
    *[
        (f"aux {name}", f"aux: {mech}", task, heads, [f"agent.aux=[{name}]"])
        for name, mech in (("horizons", "multi-horizon returns"), ("risk", "risk head"), ("denoise", "denoising"))
        for task, heads in (("regime", ("c51", "iqn")), ("sp500", ("c51",)), ("canary", ("c51",)), ("noise", ("c51",)))
    ],
    # Gradient Vaccine needs a head to align: horizons (read its row against "aux horizons" of its task)
    *[
        ("aux horizons + vaccine", "aux: Gradient Vaccine", task, heads, ["agent.aux=[horizons,vaccine]"])
        for task, heads in (("regime", ("c51", "iqn")), ("sp500", ("c51",)), ("canary", ("c51",)))
    ],
    *[
        ("homeostatic 0.5", "aux: homeostatic regulariser", task, ("c51",), ["agent.aux=[homeostatic]"])
        for task in ("regime", "sp500", "canary")
    ],
    *[
        ("causal 0.1", "aux: causal intervention", task, heads, ["agent.aux=[causal]"])
        for task, heads in (("regime", ("c51", "iqn")), ("sp500", ("c51",)), ("noise", ("c51",)))
    ],
    *[
        ("selectivity features", "aux: selectivity", task, heads, ["agent.aux=[selectivity]"])
        for task, heads in (("regime", ("c51", "iqn")), ("sp500", ("c51",)), ("canary", ("c51",)))
    ],
    (
        "selectivity bars",
        "aux: selectivity",
        "regime",
        ("c51",),
        ["agent.aux=[selectivity]", "agent.selectivity_over=positions"],
    ),
]
#: Rows compared with another row than their task's base.
COMPARE = {"offline cql 1": "offline ddqn"}
#: The behaviour runs the offline rows learn from (one per seed; C51 defaults on this task).
RECORD_TASK = "regime"


def jobs_for(rows, seeds: int, device: str, quick: bool, rec_dir: Path) -> list[dict]:
    out = []
    for name, mech, task, heads, sets in rows:
        for head in heads:
            for seed in range(seeds):
                rec = str(rec_dir / f"behaviour-{seed}.safetensors")
                out.append(
                    {
                        "task": task,
                        "head": head,
                        "seed": seed,
                        "variant": name,
                        "mechanism": mech,
                        "sets": [s.format(rec=rec) for s in sets],
                        "row_sets": list(sets),  # as the row names them ({rec}: the seed's recording)
                        "device": device,
                        "quick": quick,
                    }
                )
    return out


def _mean(xs):
    ok = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return (statistics.mean(ok), statistics.stdev(ok) if len(ok) > 1 else 0.0, len(ok)) if ok else (math.nan, 0, 0)


def table(rows: list[dict]) -> list[dict]:
    """One entry per (row, task, head) that is not a base or reference: its test Sharpe over seeds against
    the one it is compared with, and the per-seed difference."""
    by = {}
    for r in rows:
        by.setdefault((r["variant"], r["task"], r["head"]), []).append(r)
    out = []
    for (name, task, head), rs in by.items():
        if name == "base" or name in COMPARE.values():
            ref_name = None
        else:
            ref_name = COMPARE.get(name, "base")
        ok = [r for r in rs if r.get("error") is None]
        entry = {
            "row": name,
            "mechanism": rs[0]["mechanism"],
            "task": task,
            "head": head,
            "sets": rs[0].get("row_sets", rs[0]["sets"]),
            "n": len(ok),
            "errors": [r["error"] for r in rs if r.get("error")],
            "sharpe": _mean([_sharpe(r) for r in ok]),
            "per_seed": {r["seed"]: _sharpe(r) for r in ok},
            "ungated_sharpe": _mean([_ungated(r) for r in ok]),
            "flat": sum(1 for r in ok if _flat(r)),
            "compared_with": ref_name,
        }
        if ref_name is not None:
            ref = {r["seed"]: _sharpe(r) for r in by.get((ref_name, task, head), []) if r.get("error") is None}
            entry["reference_sharpe"] = _mean(list(ref.values()))
            entry["difference"] = _mean([entry["per_seed"][s] - ref[s] for s in entry["per_seed"] if s in ref])
            own = {r["seed"]: _ungated(r) for r in ok}
            ref = {r["seed"]: _ungated(r) for r in by.get((ref_name, task, head), []) if r.get("error") is None}
            entry["ungated_difference"] = _mean([own[s] - ref[s] for s in own if s in ref and _finite(own[s], ref[s])])
        out.append(entry)
    return out


def _flat(r: dict) -> bool:
    """A run whose deployed policy stayed flat on the test split (the gate shut, or no trade)."""
    return r.get("test_trades") == 0


def _sharpe(r: dict) -> float:
    """The run's test Sharpe, a flat run's as 0: it earned nothing (its own ratio is undefined), and a
    mechanism that leaves the agent flat must count against it in the paired difference."""
    return 0.0 if _flat(r) else r["test_sharpe"]


def _ungated(r: dict):
    """The same final weights' test Sharpe with the validation gate off (``margin=0``, the learning
    check's view): what the mechanism did to the policy where the gate keeps the deployed one flat (on
    the real series it mostly does). None without the view; NaN when the policy never traded."""
    return r.get("views", {}).get("margin=0", {}).get("sharpe")


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def cell(m) -> str:
    """A table cell of :func:`_mean`'s (mean, sd, n): ``—`` when no seed gave a finite value."""
    return "—" if not math.isfinite(m[0]) else f"{m[0]:.2f} ± {m[1]:.2f} (n={m[2]})"


def markdown(entries: list[dict], header: str) -> str:
    f = cell
    lines = [
        header,
        "",
        "| mechanism | row | overrides | task | head | test Sharpe | compared with | its test Sharpe "
        "| difference, paired by seed | Sharpe, gate off | difference, gate off |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        ref = e.get("compared_with")
        err = f" ({len(e['errors'])} failed)" if e["errors"] else ""
        err += f" ({e['flat']} flat)" if e.get("flat") else ""
        lines.append(
            f"| {e['mechanism']} | {e['row']} | {', '.join(f'`{s}`' for s in e['sets']) or '(defaults)'} | {e['task']} "
            f"| {e['head']} | {f(e['sharpe'])}{err} | {ref or ''} | {f(e['reference_sharpe']) if ref else ''} "
            f"| {f(e['difference']) if ref else ''} | {f(e['ungated_sharpe'])} "
            f"| {f(e['ungated_difference']) if ref else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    learning_check.add_run_args(ap)
    run_plan.add_args(ap)
    ap.add_argument("--only", default="", help="comma-separated mechanisms (words of their names) to run")
    ap.add_argument("--tasks", default="", help="comma-separated tasks to keep (default: every task of a row)")
    ap.add_argument("--heads", default="", help="comma-separated heads to keep (default: every head of a row)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "mechanisms.json")
    ap.add_argument("--jsonl", type=Path, default=ROOT / "docs" / "bench" / "mechanisms.jsonl")
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--recordings", type=Path, default=None, help="folder of the behaviour recordings")
    ap.add_argument("--table-only", action="store_true", help="write --out and --md from the rows in --jsonl")
    args = ap.parse_args()
    if args.table_only:  # e.g. after a call cut short: the rows finished so far
        rows = run_plan.read_rows(args.jsonl)
        return write_table(rows, args, f"Mechanism screen: {len(rows)} runs read from {args.jsonl.name}.")
    device = learning_check.resolve_device(args.device)
    rows = select(args.only, args.tasks, args.heads)
    learning_check._overrides([x for r in rows for x in r[4] if "{rec}" not in x] + args.set)  # fail early
    rec_dir = args.recordings or args.out.parent / "recordings"
    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    t0, done = time.perf_counter(), []
    jobs = jobs_for(rows, args.seeds, device, args.quick, rec_dir)
    record = [
        {
            "task": RECORD_TASK,
            "head": "c51",
            "seed": s,
            "variant": "behaviour (recorded)",
            "mechanism": "offline (CQL)",
            "sets": [f"run.record={rec_dir / f'behaviour-{s}.safetensors'}"],
            "device": device,
            "quick": args.quick,
        }
        for s in range(args.seeds)
    ]
    for j in jobs + record:
        j["sets"] = j["sets"] + args.set
    offline = [j for j in jobs if any(x.startswith("run.offline=") for x in j["sets"])]
    online = [j for j in jobs if j not in offline]
    if args.resume:  # the runs an earlier call finished are not repeated
        old = run_plan.read_rows(args.jsonl)
        online, offline = run_plan.pending(online, old), run_plan.pending(offline, old)
        print(f"resume: {len(old)} rows in {args.jsonl}; {len(online) + len(offline)} runs left", flush=True)
    # a recording is made when an offline run needs it and it is not on disk (a call's folder is not kept)
    record = [r for r in record if offline and not Path(r["sets"][0].partition("=")[2]).is_file()]
    if record:
        rec_dir.mkdir(parents=True, exist_ok=True)
    if args.run_root is not None and not args.resume:  # refused here, not in the offline chain's thread
        import run_dirs

        run_dirs.plan([dict(j) for j in online + offline + record], args.run_root, resume=False)
    walls = run_plan.recorded_walls()
    online = run_plan.seed_major(online, walls)  # a deadline cuts the last seed's short runs
    start_if = run_plan.StartBy(args.deadline_s, walls)
    if args.resume:
        for r in old:
            start_if.saw(r)
    with args.jsonl.open("a") as log:

        def on_row(r):
            done.append(r)
            start_if.saw(r)
            learning_check.log_row(log, r)
            print(
                f"[{len(done)} {time.perf_counter() - t0:.0f}s] {r.get('variant')} {r['task']} {r['head']} "
                f"seed {r['seed']}: {learning_check.describe(r)}",
                flush=True,
            )

        # the offline chain (the behaviour runs, then the offline rows that learn from them) beside the
        # online rows, on a share of the workers: the GPU is never idle while the recordings are made
        n_online, k = split_workers(args.workers, bool(online), bool(record or offline))
        lock = threading.Lock()

        def locked(r):
            with lock:
                on_row(r)

        def chain():
            if record:
                print(f"recording {len(record)} behaviour runs into {rec_dir}", flush=True)
                learning_check.run_jobs(record, k, locked, start_if, run_root=args.run_root, resume=args.resume)
            if offline:
                learning_check.run_jobs(offline, k, locked, start_if, run_root=args.run_root, resume=args.resume)

        side = threading.Thread(target=chain)
        side.start()
        n = len(online) + len(offline) + len(record)
        print(f"mechanism screen: {n} runs on {device}, {args.workers} worker(s)", flush=True)
        if online:
            learning_check.run_jobs(online, n_online, locked, start_if, run_root=args.run_root, resume=args.resume)
        side.join()
    wall = time.perf_counter() - t0
    if start_if.declined:
        print(f"{len(start_if.declined)} runs not started (--deadline-s {args.deadline_s:g}); --resume runs them")
    header = (
        f"Mechanism screen: {args.seeds} seeds, device {device}, "
        f"{'CPU-sized' if args.quick else 'the learning check budget'}; {len(done)} runs in {wall:.0f} s wall"
        f"{f', {len(start_if.declined)} left for a later call' if start_if.declined else ''}."
    )
    if args.resume:  # the table of every call's rows
        return write_table(run_plan.read_rows(args.jsonl), args, header)
    return write_table(done, args, header)


def split_workers(workers: int, online: bool, offline: bool) -> tuple[int, int]:
    """``(online, offline)`` workers: a quarter (at least one) to the offline chain when both kinds of
    run are there, else every worker to the one there is (at 3795f4e the online rows got one worker of
    nine whenever no offline row was selected, and the aux screen ran one run at a time)."""
    if online and offline:
        side = min(max(1, workers // 4), workers - 1) if workers > 1 else 1
        return max(1, workers - side), side
    return (workers, 0) if online else (0, workers)


def select(only: str, tasks: str, heads: str) -> list[tuple]:
    """The rows of ``SCREEN`` whose mechanism names a word of ``only`` (all if empty), narrowed to
    ``tasks`` and ``heads`` (comma-separated; all if empty), with the base rows they are compared with
    first."""
    keep = [w.strip().lower() for w in only.split(",") if w.strip()]
    ts = {t for t in tasks.split(",") if t} or None
    hs = {h for h in heads.split(",") if h} or None

    def narrow(rows):
        rows = [(n, m, t, tuple(h for h in hh if hs is None or h in hs), s) for n, m, t, hh, s in rows]
        return [r for r in rows if r[3] and (ts is None or r[2] in ts)]

    rows = narrow([r for r in SCREEN if r[0] != "base" and (not keep or any(w in r[1].lower() for w in keep))])
    # the base rows the selected rows are compared with (task and head)
    need = {(r[2], h) for r in rows if r[0] not in COMPARE and r[0] not in COMPARE.values() for h in r[3]}
    base = [(n, m, t, tuple(h for h in hh if (t, h) in need), s) for n, m, t, hh, s in SCREEN if n == "base"]
    return [r for r in base if r[3]] + rows


def write_table(rows: list[dict], args, header: str) -> int:
    """The on/off table of ``rows`` printed and written to ``--out`` (JSON, with the rows) and ``--md``."""
    entries = table([r for r in rows if r.get("variant") != "behaviour (recorded)"])
    md = markdown(entries, header)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(json_safe({"rows": rows, "table": entries}), indent=1, allow_nan=False))
    if args.md:
        args.md.write_text(md)
    return 0 if all(r.get("error") is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(learning_check.exit_code(main))
