#!/usr/bin/env python3
"""One epoch over 4M synthetic bars, collected and trained (DESIGN.md target: <= 30 s on one H200).

The epoch arm of tools/bench_step.py, in a process of its own so that no PyTorch state shares it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_step import _failed, epoch_arm  # noqa: E402
from benchlib import parser, report  # noqa: E402


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--epoch-bars", type=int, default=4_000_000)
    args = ap.parse_args()
    rows, extra = [], {}
    t0 = time.perf_counter()
    try:
        epoch_arm(args, rows, extra)
    except Exception as exc:  # report the failure as a row, like every arm
        _failed(rows, "epoch", exc)
    extra["wall_s"] = time.perf_counter() - t0
    report("bench_epoch", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
