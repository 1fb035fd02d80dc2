#!/usr/bin/env python3
"""The auxiliary signals' cost in the train step (issue 19): the reference workload's train-graph replay
with no signal, with each of ``horizons``, ``risk``, ``denoise`` alone and with all of them, and each one's
added microseconds and share of the step without signals. Target (issue 19): all of them together add at
most 40% to the train step. ``--encoder ssm`` (or ``attention``) times the temporal encoders' workload
(:data:`cudarl.bench.ENCODER_WORKLOAD`) instead of the MLP.

Each arm is :func:`cudarl.bench.step_benchmark` (CUDA events, median of ``--repeats`` replays; replay
capacity 100k, which the train step does not depend on). Prints a table and writes JSON (``--out``,
default ``docs/bench/bench_aux.json``).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parser, report, row, skipped_without_gpu  # noqa: E402

ARMS = {"none": [], "horizons": ["horizons"], "risk": ["risk"], "denoise": ["denoise"]}
ARMS["all"] = ["horizons", "risk", "denoise"]
TRAIN = "train step (graph replay)"


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--encoder", default="mlp", choices=["mlp", "ssm", "attention"])
    args = ap.parse_args()
    if skipped_without_gpu("bench_aux", "aux signals", args.out):
        return 0
    from cudarl.bench import ENCODER_WORKLOAD, reference_config, step_benchmark

    net = {} if args.encoder == "mlp" else {"encoder": args.encoder, **ENCODER_WORKLOAD}
    rows, us = [], {}
    for arm, signals in ARMS.items():
        case = f"{args.encoder}, aux {arm}"
        try:
            cfg = reference_config("gpu", capacity=100_000, net=net, agent={"aux": signals})
            got = step_benchmark(args.repeats, cfg=cfg, phases=False, label=f" aux {arm}")
            us[arm] = next(r["value"] for r in got if r["metric"] == TRAIN)
            rows.append(row(case, TRAIN, us[arm], "us"))
        except Exception as exc:  # one failing arm says why; the others still run
            traceback.print_exc()
            rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))
    if "none" in us:
        for arm in (a for a in ARMS if a != "none" and a in us):
            case = f"{args.encoder}, aux {arm}"
            rows.append(row(case, "added to the train step", us[arm] - us["none"], "us"))
            share = 100 * (us[arm] - us["none"]) / us["none"]
            rows.append(row(case, "added, share of the step", share, "%", "<= 40%" if arm == "all" else ""))
    report("bench_aux", rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
