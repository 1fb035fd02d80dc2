#!/usr/bin/env python3
"""Check that every kernel family has its four faces (STYLE.md), and every launch its kernel's signature.

For each cuda_src/<family>.cu: every kernel is named cudarl_<family>_<op>; cudarl/reference/<family>.py
and cudarl/ops/<family>.py exist and define a function named <op> for every kernel op; and
tests/parity/test_<family>.py exists. Every kernel's ``extern "C"`` parameters can be read
(cudarl.signatures: the one source of a signature, which kernels.launch checks arguments against),
a family split into compile units (cuda_src/include/cudarl/units.cuh) has every kernel in exactly one,
and every ``launch(family, op, grid, block, args)`` in cudarl/ops names a kernel that exists, passes no
signature string, and (where ``args`` is a tuple written out) as many arguments as the kernel takes.
Prints one line per problem; exit status 1 if any.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl import signatures  # noqa: E402 (the checkout's, not an installed one)

KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(')


def functions(path: Path) -> set[str]:
    """The functions a face module defines or imports from its own package (a twin split by concept)."""
    tree = ast.parse(path.read_text())
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.level for a in n.names}
    return own | imported


def face(rel: str) -> Path:
    """``cudarl/<face>/<family>.py``, or the package ``cudarl/<face>/<family>/__init__.py``."""
    p = ROOT / rel
    pkg = p.with_suffix("") / "__init__.py"
    return pkg if not p.is_file() and pkg.is_file() else p


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
        for rel in (f"cudarl/reference/{fam}.py", f"cudarl/ops/{fam}.py"):
            p = face(rel)
            if not p.is_file():
                out.append(f"{rel}: missing (face of cuda_src/{fam}.cu)")
                continue
            missing = sorted(ops - functions(p))
            if missing:
                out.append(f"{p.relative_to(ROOT).as_posix()}: no function for op(s) {', '.join(missing)}")
        if not (ROOT / f"tests/parity/test_{fam}.py").is_file():
            out.append(f"tests/parity/test_{fam}.py: missing (parity test of cuda_src/{fam}.cu)")
        try:
            sigs = signatures.parse_source(cu, fam)
        except signatures.SignatureError as exc:
            out.append(str(exc))
            continue
        try:
            signatures.parse_units(cu, fam)  # compile units: each kernel in exactly one, or none at all
        except signatures.SignatureError as exc:
            out.append(str(exc))
        out += signatures.forwarding_problems(cu)
        if (ROOT / f"cudarl/ops/{fam}.py").is_file():
            out += launch_problems(ROOT / f"cudarl/ops/{fam}.py", sigs)
    return out


def launch_problems(path: Path, sigs: dict) -> list[str]:
    """The launches in ``path`` that disagree with the kernels' C signatures ``sigs`` (op -> Signature)."""
    out, rel = [], path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for n in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "launch"):
            continue
        where = f"{rel}:{n.lineno}"
        if len(n.args) > 5 or any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in n.args[4:5]):
            out.append(f"{where}: launch passes a signature string; the kernel's C declaration is the signature")
            continue
        op = n.args[1] if len(n.args) > 1 else None
        if not (isinstance(op, ast.Constant) and isinstance(op.value, str)):
            continue  # the op is a variable: kernels.launch checks it when it runs
        if op.value not in sigs:
            out.append(f"{where}: no kernel for op {op.value!r} (ops: {', '.join(sorted(sigs))})")
            continue
        args = n.args[4] if len(n.args) > 4 else None
        if isinstance(args, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in args.elts):
            want = sigs[op.value].params
            if len(args.elts) != len(want):
                out.append(
                    f"{where}: {len(args.elts)} arguments for {sigs[op.value].kernel}, which takes {len(want)} "
                    f"({sigs[op.value].text()})"
                )
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} problem(s) in kernel-family faces")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
