"""Atomic file writes: a temporary file in the same folder, flushed and fsync'd, then renamed.

A crash or kill mid-write leaves the previous file (or none) at the path, never a partial one.
Every file cudarl writes for the user (checkpoints, reports, CSVs) goes through :func:`atomic_open`.

Files are created with mode ``0o666`` less the umask, as ``open()`` would (``tempfile.mkstemp``
makes them ``0o600`` whatever the umask). A temporary is named ``.<name>.<pid>.<random>.tmp`` so
that :func:`remove_stale_temporaries` can tell the leftovers of a killed writer (whose process is
gone) from a write in progress.
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path

#: ``.<name>.<pid>.<token>.tmp`` (this module's), or ``.<name>.<token>.tmp`` (mkstemp's, before the pid).
_TMP = re.compile(r"^\..+?(?:\.(?P<pid>\d+)\.[0-9a-z]+|\.[0-9a-z_]+)\.tmp(?:\.png)?$")


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
    fd, tmp = create_temporary(path)
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


def temporary_name(path) -> Path:
    """A fresh temporary name beside ``path``: ``.<name>.<pid>.<random>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def create_temporary(path) -> tuple[int, Path]:
    """``(fd, name)`` of a new, exclusively created temporary beside ``path``, mode 0o666 less the umask."""
    for _ in range(100):
        tmp = temporary_name(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: could not create a temporary file beside it")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(folder) -> list[Path]:
    """Remove the temporaries of killed writes in ``folder`` (not recursive); return what was removed.

    A temporary whose writer's pid is still alive is left alone (a write in progress); one without
    a pid (written by an older cudarl, through ``mkstemp``) is stale by now."""
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _TMP.match(p.name)
        if m is None or not p.is_file():
            continue
        pid = m.group("pid")
        if pid is not None and _alive(int(pid)):
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def atomic_link(src, dst) -> None:
    """Make ``dst`` a second name of the finished file ``src`` (a hard link, or a copy where links are
    not supported), put in place by an atomic rename; a later atomic write of ``src`` replaces
    ``src``'s name only, so ``dst`` keeps today's contents."""
    import shutil

    src, dst = Path(src), Path(dst)
    if dst.exists() and os.path.samefile(src, dst):
        return  # already; and rename() between two links of one file does nothing, leaving the temporary
    # a fresh name (pid and a random token): two processes or threads linking the same dst (a kernel
    # cache shared by the workers of a sweep) never touch each other's temporary
    tmp = temporary_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
