#!/usr/bin/env python3
"""Check that every kernel family has its four faces (STYLE.md), and every launch its kernel's signature.

For each cuda_src/<family>.cu: every kernel is named cudarl_<family>_<op>; cudarl/reference/<family>.py
and cudarl/ops/<family>.py exist and define a function named <op> for every kernel op; and
tests/parity/test_<family>.py exists. An op may have several kernels, ``cudarl_<family>_<op>_<variant>``,
where cudarl/ops/<family>.py declares them (``KERNEL_VARIANTS = {op: (variant, ...)}``: one launcher and
one twin for the op, the launcher choosing the kernel; the op's own kernel ``cudarl_<family>_<op>`` may be
one of them too): every declared variant must exist, and the kernels of an op must take the same parameters.
Every kernel's ``extern "C"`` parameters can be read (cudarl.signatures: the one source of a signature,
which kernels.launch checks arguments against),
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

# an attribute macro may stand between void and the name (gemm.cu's GEMM_CHAIN_DIMS), as cudarl.signatures reads it
KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(?:[A-Z][A-Z0-9_]*\s+)?(\w+)\s*\('
)


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


def kernel_variants(path: Path) -> dict[str, tuple[str, ...]]:
    """``KERNEL_VARIANTS`` of a launcher module (op -> its kernels' suffixes), a literal read without
    importing it; ``{}`` if it declares none. Raises ``ValueError`` if it is not a literal of that form."""
    if not path.is_file():
        return {}
    for n in ast.parse(path.read_text()).body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "KERNEL_VARIANTS" for t in targets):
            found = ast.literal_eval(n.value)
            if not (isinstance(found, dict) and all(isinstance(v, tuple) and v for v in found.values())):
                raise ValueError("KERNEL_VARIANTS is not {op: (variant, ...)}")
            return found
    return {}


def problems() -> list[str]:
    out = []
    for cu in sorted((ROOT / "cuda_src").glob("*.cu")):
        fam = cu.stem
        names = KERNEL_RE.findall(cu.read_text())
        if not names:
            out.append(f'cuda_src/{fam}.cu: no extern "C" __global__ kernels found')
        try:
            variants = kernel_variants(face(f"cudarl/ops/{fam}.py"))
        except ValueError as exc:
            out.append(f"cudarl/ops/{fam}.py: {exc} (write KERNEL_VARIANTS as a literal)")
            variants = {}
        of_variant = {f"{op}_{v}": op for op, vs in variants.items() for v in vs}
        ops, kernel_ops = set(), set()
        for n in names:
            prefix = f"cudarl_{fam}_"
            if not n.startswith(prefix):
                out.append(f"cuda_src/{fam}.cu: kernel {n} is not named {prefix}<op>")
            else:
                kernel_ops.add(n[len(prefix) :])
                ops.add(of_variant.get(n[len(prefix) :], n[len(prefix) :]))
        for v in sorted(set(of_variant) - kernel_ops):
            out.append(f"cudarl/ops/{fam}.py: KERNEL_VARIANTS names cudarl_{fam}_{v}, which cuda_src/{fam}.cu lacks")
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
        for op, vs in variants.items():
            params = {sigs[k].params for k in [op] + [f"{op}_{v}" for v in vs] if k in sigs}
            if len(params) > 1:
                out.append(f"cuda_src/{fam}.cu: the kernels of {op} ({', '.join(vs)}) take different parameters")
        out += signatures.forwarding_problems(cu)
        if (ROOT / f"cudarl/ops/{fam}.py").is_file():
            out += launch_problems(ROOT / f"cudarl/ops/{fam}.py", sigs, variants)
    return out


def launch_ops(op: ast.expr, variants: dict) -> list[str] | None:
    """The kernel ops a launch's ``op`` argument names: a string; ``f"<op>_{variant}"`` for an op with
    declared variants, every variant; ``a if cond else b``, those of both; ``None`` for anything else
    (kernels.launch checks it when it runs)."""
    if isinstance(op, ast.Constant) and isinstance(op.value, str):
        return [op.value]
    if isinstance(op, ast.IfExp):
        both = launch_ops(op.body, variants), launch_ops(op.orelse, variants)
        return None if None in both else both[0] + both[1]
    if isinstance(op, ast.JoinedStr) and len(op.values) == 2:
        head, tail = op.values
        if isinstance(head, ast.Constant) and isinstance(tail, ast.FormattedValue) and head.value.endswith("_"):
            base = head.value[:-1]
            if base in variants:
                return [f"{base}_{v}" for v in variants[base]]
    return None


def launch_problems(path: Path, sigs: dict, variants: dict | None = None) -> list[str]:
    """The launches in ``path`` that disagree with the kernels' C signatures ``sigs`` (op -> Signature);
    ``variants``: the ops' declared kernel variants (``KERNEL_VARIANTS``)."""
    out, rel = [], path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for n in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "launch"):
            continue
        where = f"{rel}:{n.lineno}"
        if len(n.args) > 5 or any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in n.args[4:5]):
            out.append(f"{where}: launch passes a signature string; the kernel's C declaration is the signature")
            continue
        ops = launch_ops(n.args[1], variants or {}) if len(n.args) > 1 else None
        if ops is None:
            continue  # the op is a variable: kernels.launch checks it when it runs
        for op in ops:
            if op not in sigs:
                out.append(f"{where}: no kernel for op {op!r} (ops: {', '.join(sorted(sigs))})")
                continue
            args = n.args[4] if len(n.args) > 4 else None
            if isinstance(args, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in args.elts):
                want = sigs[op].params
                if len(args.elts) != len(want):
                    out.append(
                        f"{where}: {len(args.elts)} arguments for {sigs[op].kernel}, which takes {len(want)} "
                        f"({sigs[op].text()})"
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
