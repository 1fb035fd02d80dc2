#!/usr/bin/env python3
"""Check that every kernel family has its four faces (STYLE.md).

For each cuda_src/<family>.cu: every kernel is named cudarl_<family>_<op>; cudarl/reference/<family>.py
and cudarl/ops/<family>.py exist and define a function named <op> for every kernel op; and
tests/parity/test_<family>.py exists. Prints one line per problem; exit status 1 if any.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(')


def functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def problems() -> list[str]:
    out = []
    for cu in sorted((ROOT / "cuda_src").glob("*.cu")):
        fam = cu.stem
        names = KERNEL_RE.findall(cu.read_text())
        if not names:
            out.append(f'cuda_src/{fam}.cu: no extern "C" __global__ kernels found')
        ops = set()
        for n in names:
            prefix = f"cudarl_{fam}_"
            if not n.startswith(prefix):
                out.append(f"cuda_src/{fam}.cu: kernel {n} is not named {prefix}<op>")
            else:
                ops.add(n[len(prefix) :])
        for face in (f"cudarl/reference/{fam}.py", f"cudarl/ops/{fam}.py"):
            p = ROOT / face
            if not p.is_file():
                out.append(f"{face}: missing (face of cuda_src/{fam}.cu)")
                continue
            missing = sorted(ops - functions(p))
            if missing:
                out.append(f"{face}: no function for op(s) {', '.join(missing)}")
        if not (ROOT / f"tests/parity/test_{fam}.py").is_file():
            out.append(f"tests/parity/test_{fam}.py: missing (parity test of cuda_src/{fam}.cu)")
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} problem(s) in kernel-family faces")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
