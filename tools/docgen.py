"""Shared plumbing of the generated documentation pages (docs/config.md, docs/api.md)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, tool: str) -> int:
    """Write ``text`` to ``path``; with ``--check`` in argv only compare (exit 1 if stale)."""
    if "--check" in sys.argv:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale: run python tools/{tool}")
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0
