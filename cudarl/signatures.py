"""Kernel signatures read from the CUDA source: the ``extern "C"`` parameter list is the one source.

``of(family, op)`` parses ``cuda_src/<family>.cu`` (comments dropped, object-like ``#define`` macros
in a parameter list expanded) and returns the :class:`Signature` of ``cudarl_<family>_<op>``: its
parameters as ``(name, dtype, is_pointer)``, in order. A kernel whose one parameter is a struct
passed by value (``extern "C" __global__ void k(const XArgs a)``, a ``struct XArgs`` of the same file)
has that struct's fields as its parameters, and :attr:`Signature.struct` is the NumPy dtype with the
C layout (``align=True``: each field at its natural alignment), so a launcher still passes one flat
tuple and :func:`cudarl.kernels.launch` packs it (CuPy passes a one-element NumPy array by value).

:func:`unit_of` reads which compile unit (``cudarl/units.cuh``: ``#if CUDARL_UNIT_IS(name)`` ... ``#endif``)
holds a kernel, which is the program ``cudarl.kernels`` compiles and loads it from.

Pure Python: ``tools/check_faces.py`` and the CPU tests use it without a GPU.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: C types of kernel parameters and struct fields (the project's i64/u64/u32 aliases included).
C_TYPES = {
    "float": np.float32,
    "double": np.float64,
    "int": np.int32,
    "unsigned int": np.uint32,
    "unsigned": np.uint32,
    "long long": np.int64,
    "unsigned long long": np.uint64,
    "unsigned char": np.uint8,
    "signed char": np.int8,
    "char": np.int8,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "u64": np.uint64,
}
#: Short names of the dtypes (``f32``, ``u64``, ...), for messages.
_SHORT = {np.dtype(t): f"{np.dtype(t).kind}{np.dtype(t).itemsize * 8}" for t in set(C_TYPES.values())}
_QUALIFIERS = ("const", "__restrict__", "volatile")
_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(?:[A-Z][A-Z0-9_]*\s+)?(\w+)\s*\(([^)]*)\)'
)
_STRUCT_RE = re.compile(r"\bstruct\s+(\w+)\s*\{([^}]*)\}\s*;")
_DEFINE_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(?![\w(])[ \t]*(.*)$", re.M)


class SignatureError(ValueError):
    """A kernel's C signature could not be read (the message names the file and the parameter)."""


@dataclass(frozen=True)
class Signature:
    """The parameters of one kernel. ``params``: ``(name, dtype, is_pointer)`` in order; ``struct``: the
    NumPy dtype of the struct the kernel takes by value (its fields are ``params``), else None."""

    kernel: str
    params: tuple
    struct: np.dtype | None = None

    def text(self) -> str:
        """``"f32* out, i64 n"``: the form error messages use."""
        return ", ".join(f"{_SHORT[d]}{'*' if p else ''} {n}" for n, d, p in self.params)


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _macros(src: str) -> dict:
    """Object-like ``#define NAME body`` (continuation lines joined)."""
    joined = src.replace("\\\n", " ")
    return {m.group(1): m.group(2).strip() for m in _DEFINE_RE.finditer(joined)}


def _declaration(where: str, text: str) -> tuple[str, np.dtype, bool]:
    """``"const float* __restrict__ x"`` -> ``("x", float32, True)``."""
    words = [w for w in re.findall(r"\w+|\*", text) if w not in _QUALIFIERS]
    if len(words) < 2 or not re.fullmatch(r"[A-Za-z_]\w*", words[-1]):
        raise SignatureError(f"{where}: cannot read the declaration {text.strip()!r}")
    is_ptr = "*" in words
    base = " ".join(w for w in words[:-1] if w != "*")
    if base not in C_TYPES or words.count("*") > 1:
        raise SignatureError(f"{where}: unsupported type {base + '*' * words.count('*')!r} in {text.strip()!r}")
    return words[-1], np.dtype(C_TYPES[base]), is_ptr


def _struct_fields(where: str, body: str) -> list:
    """The fields of a struct body, in order (``int B, A, K;`` declares three)."""
    out = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *more = [p.strip() for p in decl.split(",")]
        name, dtype, is_ptr = _declaration(where, first)
        out.append((name, dtype, is_ptr))
        for extra in more:
            if not re.fullmatch(r"[A-Za-z_]\w*", extra):
                raise SignatureError(f"{where}: declare pointer fields one per line, not {decl!r}")
            out.append((extra, dtype, is_ptr))
    return out


def parse_source(path: Path, family: str) -> dict[str, Signature]:
    """Every kernel of one ``.cu`` file, by op name (``cudarl_<family>_<op>``)."""
    raw = path.read_text()
    macros = _macros(raw)
    src = strip_comments(raw)
    structs = {m.group(1): m.group(2) for m in _STRUCT_RE.finditer(src)}
    prefix = f"cudarl_{family}_"
    out = {}
    for m in _KERNEL_RE.finditer(src):
        kernel, plist = m.group(1), m.group(2)
        where = f"cuda_src/{path.name}: {kernel}"
        parts = []
        for p in (p.strip() for p in plist.split(",")):
            parts += [q.strip() for q in macros[p].split(",")] if p in macros else [p]
        parts = [p for p in parts if p and p != "void"]
        words = [w for w in re.findall(r"\w+", parts[0]) if w not in _QUALIFIERS] if len(parts) == 1 else []
        if len(words) == 2 and words[0] in structs and "*" not in parts[0]:  # one struct by value
            fields = _struct_fields(f"{where} (struct {words[0]})", structs[words[0]])
            dtype = np.dtype({"names": [f[0] for f in fields], "formats": [_slot(f) for f in fields]}, align=True)
            sig = Signature(kernel, tuple(fields), dtype)
        else:
            sig = Signature(kernel, tuple(_declaration(where, p) for p in parts))
        if kernel.startswith(prefix):
            out[kernel[len(prefix) :]] = sig
    return out


_FORWARD_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(\s*(?:const\s+)?(\w+)\s+(\w+)\s*\)'
    r"\s*\{\s*(\w+)\s*\(([^)]*)\)\s*;\s*\}"
)


def forwarding_problems(path: Path) -> list[str]:
    """A struct-taking kernel that forwards its fields to a body (``k(const KArgs a) { k_impl(a.x, a.n); }``)
    must pass every field, in the struct's order, to parameters of the same names: so the struct (the
    signature the launch checks) and the body's parameters cannot drift apart."""
    src = strip_comments(path.read_text())
    structs = {m.group(1): m.group(2) for m in _STRUCT_RE.finditer(src)}
    out = []
    for m in _FORWARD_RE.finditer(src):
        kernel, sname, var, body, call = m.groups()
        if sname not in structs:
            continue
        where = f"cuda_src/{path.name}: {kernel}"
        fields = [f[0] for f in _struct_fields(where, structs[sname])]
        passed = [a.strip() for a in call.split(",") if a.strip()]
        if passed != [f"{var}.{f}" for f in fields]:
            out.append(f"{where} passes {passed} to {body}, not the fields of {sname} in order")
            continue
        decl = re.search(rf"\bvoid\s+{body}\s*\(([^)]*)\)", src)
        names = [re.findall(r"\w+", p)[-1] for p in decl.group(1).split(",")] if decl else None
        if names != fields:
            out.append(f"{where}: the parameters of {body} are {names}, the fields of {sname} {fields}")
    return out


_UNIT_RE = re.compile(r"^[ \t]*#[ \t]*if[ \t]+CUDARL_UNIT_IS\((\w+)\)[ \t]*$(.*?)^[ \t]*#[ \t]*endif\b", re.M | re.S)
_UNIT_OPEN_RE = re.compile(r"^[ \t]*#[ \t]*if\b.*\bCUDARL_UNIT_IS\b", re.M)


def parse_units(path: Path, family: str) -> dict[str, str | None]:
    """The compile unit of every kernel of one ``.cu`` file, by op name (``cudarl/units.cuh``).

    A unit's kernels sit between ``#if CUDARL_UNIT_IS(name)`` and the next ``#endif`` (no ``#if``
    nested inside); a file without such blocks is one unit, ``None`` for every op. In a file with
    units every kernel must sit in exactly one: one outside them would be compiled by no unit.
    """
    src = strip_comments(path.read_text())
    blocks = list(_UNIT_RE.finditer(src))
    if len(blocks) != len(_UNIT_OPEN_RE.findall(src)):
        raise SignatureError(f"cuda_src/{path.name}: write each unit as '#if CUDARL_UNIT_IS(name)' ... '#endif'")
    for b in blocks:
        if re.search(r"^[ \t]*#[ \t]*if", b.group(2), re.M):
            raise SignatureError(f"cuda_src/{path.name}: unit {b.group(1)} holds a nested #if; keep units flat")
    prefix = f"cudarl_{family}_"
    out: dict[str, str | None] = {}
    for m in _KERNEL_RE.finditer(src):
        if not m.group(1).startswith(prefix):
            continue
        op = m.group(1)[len(prefix) :]
        inside = [b.group(1) for b in blocks if b.start(2) <= m.start() < b.end(2)]
        if blocks and not inside:
            raise SignatureError(f"cuda_src/{path.name}: kernel {m.group(1)} is in no compile unit (CUDARL_UNIT_IS)")
        out[op] = inside[0] if inside else None
    return out


def _src_dir(src_dir: Path | None) -> Path:
    """``src_dir``, or the loader's ``cuda_src/`` (:data:`cudarl.kernels.SRC_DIR`, read at the call: tests move it)."""
    if src_dir is None:
        from .kernels import SRC_DIR

        return SRC_DIR
    return src_dir


@functools.cache
def _units(src_dir: str, family: str) -> dict[str, str | None]:
    return parse_units(Path(src_dir) / f"{family}.cu", family)


def unit_of(family: str, op: str, src_dir: Path | None = None) -> str | None:
    """The compile unit holding ``cudarl_<family>_<op>`` (``None``: the family is one unit)."""
    src_dir = _src_dir(src_dir)
    units = _units(str(src_dir), family)
    if op not in units:
        of(family, op, src_dir)  # raises, naming the ops
    return units[op]


def units(family: str, src_dir: Path | None = None) -> list[str | None]:
    """The compile units of ``family`` in order of first appearance (``[None]``: one unit, the file)."""
    src_dir = _src_dir(src_dir)
    return list(dict.fromkeys(_units(str(src_dir), family).values())) or [None]


def define(family: str, name: str, src_dir: Path | None = None) -> int:
    """The integer value of ``#define name`` in ``cuda_src/<family>.cu``: for the tests that hold a Python
    constant a launcher or twin mirrors (a block shape, a slice count) equal to the kernel's."""
    path = _src_dir(src_dir) / f"{family}.cu"
    macros = _macros(strip_comments(path.read_text()))
    if name not in macros:
        raise SignatureError(f"cuda_src/{family}.cu has no #define {name}")
    try:
        return int(macros[name], 0)
    except ValueError:
        body = macros[name]
        raise SignatureError(f"cuda_src/{family}.cu: #define {name} is {body!r}, not an integer literal") from None


def _slot(field) -> np.dtype:
    """A struct field's storage: a device pointer is a 64-bit address."""
    return np.dtype(np.uint64) if field[2] else field[1]


@functools.cache
def _family(src_dir: str, family: str) -> dict[str, Signature]:
    return parse_source(Path(src_dir) / f"{family}.cu", family)


def of(family: str, op: str, src_dir: Path | None = None) -> Signature:
    """The signature of ``cudarl_<family>_<op>`` (parsed once per family)."""
    src_dir = _src_dir(src_dir)
    sigs = _family(str(src_dir), family)
    if op not in sigs:
        raise SignatureError(f"cuda_src/{family}.cu has no kernel cudarl_{family}_{op} (ops: {sorted(sigs)})")
    return sigs[op]
