#!/usr/bin/env python3
"""The cost of issue 19's regularising auxiliary signals in the train step: the reference workload's
train-graph replay (``cudarl.bench.step_benchmark``) with no signal, each alone and all together, on
the MLP and on the temporal encoders; the overhead of each in µs and as a share of the plain step
(issue 19's target: all signals together within 40% of the encoder's step on the H200).

Gradient Vaccine needs a signal with a head: ``--head-signal NAME`` (a registered one, e.g. from the
aux/heads branch) adds ``NAME`` and ``NAME + vaccine`` rows. Prints a table and writes JSON.

    python3 tools/bench_aux.py --out $OUT/bench_aux.json [--encoders mlp,ssm,attention] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl.bench import ENCODER_WORKLOAD, reference_bars, reference_config, step_benchmark  # noqa: E402

SIGNALS = ("homeostatic", "causal", "selectivity")


def variants(head_signal: str | None) -> list[tuple[str, list]]:
    out = [("none", []), *((s, [s]) for s in SIGNALS), ("all three", list(SIGNALS))]
    if head_signal:
        out += [(head_signal, [head_signal]), (f"{head_signal} + vaccine", [head_signal, "vaccine"])]
        out += [(f"all + {head_signal} + vaccine", [*SIGNALS, head_signal, "vaccine"])]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoders", default="mlp,ssm,attention")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--head-signal", default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "bench_aux.json")
    args = ap.parse_args()
    bars = reference_bars()
    rows = []
    for enc in args.encoders.split(","):
        net = {} if enc == "mlp" else {"encoder": enc, **ENCODER_WORKLOAD}
        base_us = None
        for name, aux in variants(args.head_signal):
            # causal: its cost is one forward and one backward whatever the group (offset: always a column)
            cfg = reference_config(args.device, net=net, agent={"aux": aux, "causal_groups": ["calendar", "offset"]})
            try:
                got = step_benchmark(args.repeats, args.device, cfg=cfg, bars=bars, phases=False, label=f" {enc}")
            except Exception as e:  # one failing variant prints its reason; the others still run
                print(f"{enc:10s} {name:28s} FAILED: {type(e).__name__}: {e}", flush=True)
                continue
            us = next(r["value"] for r in got if r["metric"] == "train step (graph replay)")
            base_us = us if name == "none" else base_us
            extra = None if base_us is None else us - base_us
            share = None if base_us is None else 100.0 * extra / base_us
            rows.append({"encoder": enc, "signals": name, "train_us": us, "extra_us": extra, "extra_pct": share})
            shown = "" if extra is None else f"  +{extra:8.1f} us  ({share:+.1f}%)"
            print(f"{enc:10s} {name:28s} {us:10.1f} us{shown}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "target": "all signals <= +40% of the encoder's step"}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
