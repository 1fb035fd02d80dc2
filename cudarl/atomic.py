"""Atomic file writes: a temporary file in the same folder, flushed and fsync'd, then renamed.

A crash or kill mid-write leaves the previous file (or none) at the path, never a partial one.
Every file cudarl writes for the user (checkpoints, reports, CSVs) goes through :func:`atomic_open`.
"""

from __future__ import annotations

import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path, mode: str = "w", newline: str | None = None):
    """Open ``path`` for writing through a temporary file; rename it into place on success.

    ``mode`` is ``"w"`` (text) or ``"wb"``. On an exception the temporary file is removed and the
    exception propagates; ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"newline": newline})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_link(src, dst) -> None:
    """Make ``dst`` a second name of the finished file ``src`` (a hard link, or a copy where links are
    not supported), put in place by an atomic rename; a later atomic write of ``src`` replaces
    ``src``'s name only, so ``dst`` keeps today's contents."""
    import shutil

    src, dst = Path(src), Path(dst)
    if dst.exists() and os.path.samefile(src, dst):
        return  # already; and rename() between two links of one file does nothing, leaving the temporary
    # a name of this thread's own: two processes linking the same dst (a kernel cache shared by
    # the workers of a sweep) must not remove each other's temporary
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}-{threading.get_ident()}.link.tmp")
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
