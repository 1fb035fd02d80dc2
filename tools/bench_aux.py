#!/usr/bin/env python3
"""The auxiliary signals' cost in the train step (issue 19): the reference workload's train-graph replay
with no signal, with each of the seven signals alone and with all of them together, each one's added
microseconds and share of the step without signals. Target (issue 19): all signals together add at most
40% to the encoder's train step on the H200. ``--encoder ssm`` (or ``attention``) times the temporal
encoders' workload (:data:`cudarl.bench.ENCODER_WORKLOAD`) instead of the MLP.

Gradient Vaccine needs a signal with a head: its arm is ``horizons + vaccine`` and its added cost is
measured against the ``horizons`` arm (vaccine's own phase), beside its cost against no signal. Causal
intervenes on ``calendar`` and ``offset`` here (the reference bars have no level columns; ``offset``
always has one), in every arm that has it.

Each arm is :func:`cudarl.bench.step_benchmark` (CUDA events, median of ``--repeats`` replays; replay
capacity 100k, which the train step does not depend on). Prints a table and writes JSON (``--out``,
default ``docs/bench/bench_aux.json``)::

    python3 tools/bench_aux.py --encoder mlp --out $OUT/bench_aux_mlp.json
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parser, report, row, skipped_without_gpu  # noqa: E402

HEADS = ["horizons", "risk", "denoise"]
REGULARISERS = ["homeostatic", "causal", "selectivity"]
#: arm -> (its signals, the arm its added cost is measured against)
ARMS = {"none": ([], None)}
ARMS.update({s: ([s], "none") for s in HEADS + REGULARISERS})
ARMS["vaccine"] = (["horizons", "vaccine"], "horizons")
ARMS["all"] = ([*HEADS, *REGULARISERS, "vaccine"], "none")
TRAIN = "train step (graph replay)"


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--encoder", default="mlp", choices=["mlp", "ssm", "attention"])
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"], help="cpu: a smoke run of the arms only")
    args = ap.parse_args()
    if args.device == "gpu" and skipped_without_gpu("bench_aux", "aux signals", args.out):
        return 0
    from cudarl.bench import ENCODER_WORKLOAD, reference_config, step_benchmark

    net = {} if args.encoder == "mlp" else {"encoder": args.encoder, **ENCODER_WORKLOAD}
    rows, us = [], {}
    for arm, (signals, _) in ARMS.items():
        case = f"{args.encoder}, aux {arm}"
        try:
            agent = {"aux": signals, "causal_groups": ["calendar", "offset"]}
            cfg = reference_config(args.device, capacity=100_000, net=net, agent=agent)
            got = step_benchmark(args.repeats, args.device, cfg=cfg, phases=False, label=f" aux {arm}")
            us[arm] = next(r["value"] for r in got if r["metric"] == TRAIN)
            rows.append(row(case, TRAIN, us[arm], "us"))
        except Exception as exc:  # one failing arm says why; the others still run
            traceback.print_exc()
            rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))
    for arm, (_, against) in ARMS.items():
        if against is None or arm not in us or "none" not in us:
            continue
        case = f"{args.encoder}, aux {arm}"
        bases = [("none", "")] if against == "none" else [("none", " (with horizons)"), (against, f" over {against}")]
        for base, what in bases:
            added = us[arm] - us[base]
            rows.append(row(case, f"added to the train step{what}", added, "us"))
            target = "<= 40%" if arm == "all" else ""
            rows.append(row(case, f"added, share of the step{what}", 100 * added / us["none"], "%", target))
    report("bench_aux", rows, args.out, {"encoder": args.encoder, "target": "all signals <= +40% of the step"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
