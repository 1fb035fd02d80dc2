#!/usr/bin/env python3
"""Compile every cuda_src/*.cu with nvcc for sm_90, so a kernel that does not compile fails CI,
and check its PTX for floating-point atomics (DESIGN.md rule 3: a step must be bitwise
reproducible, so reductions are fixed-order; integer atomics are allowed where order cannot matter).

Usage: python tools/compile_cuda.py [--arch sm_90] [--jobs 2]
Exit status 1 if any file fails (or if nvcc is missing while $CI is set).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: A PTX atomic or reduction on a floating-point type, e.g. ``atom.global.add.f32`` or ``red.shared.add.f64``.
FLOAT_ATOMIC = re.compile(r"^\s*(?:@%?\w+\s+)?(?:atom|red)(?:\.\w+)*\.(?:f16|f16x2|bf16|bf16x2|f32|f64)\b", re.M)


def float_atomics(ptx: str) -> list[str]:
    """The PTX lines of ``ptx`` that are floating-point atomics or reductions."""
    return [m.group(0).strip() for m in FLOAT_ATOMIC.finditer(ptx)]


def compile_one(nvcc: str, src: Path, arch: str, outdir: str) -> tuple[Path, int, str]:
    base = [nvcc, f"-arch={arch}", "-std=c++17", f"-I{ROOT / 'cuda_src' / 'include'}"]
    p = subprocess.run(
        base + ["-c", str(src), "-o", os.path.join(outdir, src.stem + ".o")], capture_output=True, text=True
    )
    if p.returncode != 0:
        return src, p.returncode, (p.stdout + p.stderr).strip()
    ptx = os.path.join(outdir, src.stem + ".ptx")
    q = subprocess.run(base + ["-ptx", str(src), "-o", ptx], capture_output=True, text=True)
    if q.returncode != 0:
        return src, q.returncode, (q.stdout + q.stderr).strip()
    bad = float_atomics(Path(ptx).read_text())
    if bad:
        return src, 1, "floating-point atomics (DESIGN.md rule 3):\n  " + "\n  ".join(bad[:10])
    return src, 0, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = ap.parse_args()
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        msg = "nvcc not found: CUDA sources were not compiled"
        print(("ERROR: " if os.environ.get("CI") else "WARNING: ") + msg)
        return 1 if os.environ.get("CI") else 0
    sources = sorted((ROOT / "cuda_src").glob("*.cu"))
    with tempfile.TemporaryDirectory() as out, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda s: compile_one(nvcc, s, args.arch, out), sources))
    failed = 0
    for src, rc, log in results:
        print(f"{'ok  ' if rc == 0 else 'FAIL'} nvcc -arch={args.arch} {src.relative_to(ROOT)}")
        if rc != 0:
            failed += 1
            print(log)
    print(
        f"compiled {len(results) - failed} of {len(results)} CUDA sources for {args.arch} "
        "(PTX free of floating-point atomics)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
