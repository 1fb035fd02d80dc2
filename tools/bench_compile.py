#!/usr/bin/env python3
"""NVRTC seconds per compile unit, and the cold-cache compile wait of a set of kernels (no GPU needed).

Each name is a family (every unit of it) or ``family:op`` (the unit holding that kernel, as a graph's
discovery asks for it). Two measurements, each in a fresh temporary kernel cache:

* ``serial``: every unit compiled alone, one after another (one core's seconds per unit);
* ``prefetch``: ``kernels.prefetch`` of all of them at once, as a cold start's capture does, timed
  until the last is done (the wait; on a machine with fewer cores than units it is more than the
  slowest unit).

Usage: python tools/bench_compile.py [NAME ...] [--cc 90] [--skip-serial] [--json OUT]
(default names: every family). Prints a table; ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl import kernels, nvrtc  # noqa: E402 (the checkout's, not an installed one)


def parse(names: list[str]) -> list:
    """``["c51:n_step", "nn"]`` -> ``[("c51", "n_step"), "nn"]`` (what kernels.prefetch takes)."""
    return [tuple(n.split(":", 1)) if ":" in n else n for n in names]


def wanted_units(names: list) -> list[tuple[str, str | None]]:
    out = []
    for n in names:
        out += [(n, u) for u in kernels.units(n)] if isinstance(n, str) else [(n[0], kernels.unit_of(*n))]
    return list(dict.fromkeys(out))


def serial(units: list[tuple[str, str | None]], cc: int) -> dict[str, float]:
    out = {}
    for fam, unit in units:
        opts = kernels.compile_options() + (kernels.target(cc)[0],)
        t0 = time.perf_counter()
        nvrtc.compile_source(kernels.program(fam, unit), f"{fam}.cu", opts)
        out[kernels.unit_name(fam, unit)] = time.perf_counter() - t0
        print(f"  {kernels.unit_name(fam, unit):32s} {out[kernels.unit_name(fam, unit)]:6.2f} s", flush=True)
    return out


def prefetch(names: list, cc: int) -> float:
    with tempfile.TemporaryDirectory(prefix="cudarl-bench-compile-") as tmp:
        os.environ[kernels.CACHE_ENV] = tmp
        t0 = time.perf_counter()
        for f in kernels.prefetch(names, cc):
            f.result()
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="family or family:op (default: every family)")
    ap.add_argument("--cc", type=int, default=90, help="compute capability to compile for (default 90)")
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = parse(args.names) if args.names else kernels.families()
    units = wanted_units(names)
    print(f"NVRTC {'.'.join(map(str, nvrtc.version()))}, sm_{args.cc}, {os.cpu_count()} CPU(s), {len(units)} unit(s)")
    per_unit = {} if args.skip_serial else serial(units, args.cc)
    if per_unit:
        slow = max(per_unit, key=per_unit.get)
        print(f"serial: {sum(per_unit.values()):.2f} s in all; slowest unit {slow} {per_unit[slow]:.2f} s")
    wait = prefetch(names, args.cc)
    print(f"prefetch (cold cache, {kernels._executor()._max_workers} threads): {wait:.2f} s until the last unit")
    if args.json:
        args.json.write_text(json.dumps({"serial_s": per_unit, "prefetch_s": wait, "cpus": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
