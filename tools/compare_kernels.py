#!/usr/bin/env python3
"""Compare the machine code of every kernel between two git revisions (nvcc, no GPU needed).

Each ``cuda_src/*.cu`` of both revisions is compiled with nvcc to a cubin (``-arch``, the options
of tools/compile_cuda.py), and each kernel's ``.text.<kernel>`` section (its SASS, as bytes) is
compared by kernel name, wherever the kernel lives: a kernel moved to another file keeps its
name's match, and ``--rename OLD=NEW`` pairs a renamed one. A kernel whose bytes are equal
computes what it did (the same instructions); one that differs needs the GPU bitwise suite.

Usage: python tools/compare_kernels.py BASE [HEAD] [--arch sm_90] [--rename old=new ...]
Prints one line per kernel (same, DIFFERENT, only in BASE, only in HEAD); exit status 1 if any
kernel differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def elf_sections(data: bytes) -> dict[str, bytes]:
    """``{name: bytes}`` of the sections of a little-endian ELF64 file (a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]
    out = {}
    for name_off, kind, _flags, _addr, off, size, *_ in heads:
        name = names[name_off : names.index(b"\0", name_off)].decode()
        out[name] = b"" if kind == 8 else data[off : off + size]  # SHT_NOBITS has no bytes
    return out


def kernel_texts(src_dir: Path, arch: str) -> dict[str, tuple[str, bytes]]:
    """``{kernel: (file, text bytes)}`` of every ``.cu`` under ``src_dir`` (with its ``include/``)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:

        def build(cu: Path) -> tuple[Path, Path]:
            cubin = Path(tmp) / f"{cu.stem}.cubin"
            cmd = [nvcc, f"-arch={arch}", "-std=c++17", f"-I{src_dir / 'include'}", "-cubin", str(cu), "-o", str(cubin)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"{cu.name} does not compile:\n{p.stdout}{p.stderr}")
            return cu, cubin

        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            for cu, cubin in pool.map(build, sorted(src_dir.glob("*.cu"))):
                for name, body in elf_sections(cubin.read_bytes()).items():
                    if name.startswith(".text."):
                        out[name[len(".text.") :]] = (cu.name, body)
    return out


def checkout(rev: str, dest: Path) -> Path:
    """``cuda_src/`` of ``rev`` written under ``dest`` (``rev`` "WORKTREE": the working tree's)."""
    if rev == "WORKTREE":
        return ROOT / "cuda_src"
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, "cuda_src"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        p = dest / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(
            subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{f}"], capture_output=True, check=True).stdout
        )
    return dest / "cuda_src"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default="WORKTREE", help="a revision, or WORKTREE (default)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    args = ap.parse_args(argv)
    renames = dict(r.split("=", 1) for r in args.rename)
    with tempfile.TemporaryDirectory() as tmp:
        base = kernel_texts(checkout(args.base, Path(tmp) / "base"), args.arch)
        head = kernel_texts(checkout(args.head, Path(tmp) / "head"), args.arch)
    base = {renames.get(k, k): v for k, v in base.items()}
    same = bad = 0
    for k in sorted(set(base) | set(head)):
        if k not in head:
            print(f"only in {args.base}: {k} ({base[k][0]})")
        elif k not in base:
            print(f"only in {args.head}: {k} ({head[k][0]})")
        elif base[k][1] == head[k][1]:
            print(f"same        {k} ({base[k][0]} -> {head[k][0]}, {len(head[k][1])} bytes)")
            same += 1
            continue
        else:
            print(f"DIFFERENT   {k} ({base[k][0]} -> {head[k][0]})")
        bad += 1
    print(f"{same} kernel(s) the same, {bad} not")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
