"""One dispatch point: every object reaches a kernel family through ``cudarl.backend.family``."""

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest

from cudarl.backend import family

PKG = Path(__file__).resolve().parents[2] / "cudarl"


def test_family_picks_the_numpy_twin_for_numpy():
    for name in ("c51", "nn", "optim", "replay", "env", "util"):
        assert family(name, np) is importlib.import_module(f"cudarl.reference.{name}")


def test_family_picks_the_launchers_for_anything_else():
    class FakeCupy:
        __name__ = "cupy"

    assert family("util", FakeCupy()) is importlib.import_module("cudarl.ops.util")


def test_an_unknown_family_is_an_import_error():
    with pytest.raises(ModuleNotFoundError, match="cudarl.reference.nope"):
        family("nope", np)


def _ops_imports(path: Path) -> list[str]:
    """Every import of ``cudarl.ops`` in ``path`` (relative or absolute), as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            rel_ops = node.level > 0 and (mod == "ops" or mod.startswith("ops."))
            pkg_ops = node.level > 0 and mod == "" and "ops" in names
            if rel_ops or pkg_ops or mod == "cudarl.ops" or mod.startswith("cudarl.ops."):
                found.append(f"{node.lineno}: from {'.' * node.level}{mod} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("cudarl.ops")]
    return found


def test_no_object_imports_the_launchers_itself():
    """Outside ``cudarl/ops`` (the launchers import each other) and ``backend.family``, nothing imports
    ``cudarl.ops``: the former ``_agent_ops``, ``nn_ops``, ``optim_ops`` and inline imports are gone."""
    offenders = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("ops/"):
            continue
        hits = _ops_imports(path)
        if hits:
            offenders[rel] = hits
    assert not offenders, f"import the launchers through cudarl.backend.family: {offenders}"


def test_the_scan_sees_an_inline_import(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(xp):\n    from .ops import nn as ops\n    from ..ops.c51 import loss\n    return ops\n")
    assert [h.split(":")[0] for h in _ops_imports(p)] == ["2", "3"]
