"""Run directories: created exclusively, marked as cudarl's, never reused; where a resume continues.

A run directory is ``<run.out_dir>/<name>-<time>-<seed>`` (``-2``, ``-3``, ... when that name is
taken: two runs started in the same second with the same seed get two directories). It is
claimed by ``mkdir`` without ``exist_ok`` and marked with :data:`MARKER`, a small JSON file;
cudarl writes only into directories that carry the marker.

A resume (:func:`resume_in_place`) continues in the checkpoint's own run directory only when the
checkpoint is that run's newest state (nothing in ``checkpoints/latest.npz`` is later); a
checkpoint from an older step, or from a folder cudarl did not make, continues in a new run
directory, so no later ``best`` or metric row of the first run is touched.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import __version__
from .atomic import remove_stale_temporaries

#: The file that marks a directory as a cudarl run directory.
MARKER = ".cudarl-run"
#: Numbered suffixes tried after the plain name is taken.
MAX_SUFFIX = 1000


class RunDirError(FileExistsError):
    """A run directory cannot be created or is not cudarl's."""


def _mark(d: Path, info: dict) -> None:
    """Write the marker exclusively (O_EXCL: of two processes claiming one folder, one wins)."""
    fd = os.open(d / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "w") as f:
        json.dump({"cudarl": __version__, "pid": os.getpid(), "created": time.time(), **info}, f)
        f.write("\n")


def create(parent, name: str, seed: int, **info) -> Path:
    """Create and mark a new run directory ``<parent>/<name>-<time>-<seed>[-k]``; return it."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{seed}"
    for k in range(1, MAX_SUFFIX + 1):
        d = parent / (base if k == 1 else f"{base}-{k}")
        try:
            d.mkdir()
        except FileExistsError:
            continue
        _mark(d, info)
        return d
    raise RunDirError(f"{parent}: {MAX_SUFFIX} run directories named {base}[-k] exist already")


def claim(path, **info) -> Path:
    """Make ``path`` a new run directory: create it, or take an empty folder; never reuse one."""
    d = Path(path)
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir()
    except FileExistsError:
        if not d.is_dir() or any(d.iterdir()):
            raise RunDirError(
                f"{d} exists and is not empty; cudarl never reuses a folder as a run directory "
                "(pick a new one, or leave it out for <run.out_dir>/<name>-<time>-<seed>)"
            ) from None
    try:
        _mark(d, info)
    except FileExistsError:
        raise RunDirError(f"{d}: another run claimed it first; cudarl never reuses a run directory") from None
    return d


def is_run_dir(path) -> bool:
    """Whether ``path`` carries cudarl's marker."""
    return (Path(path) / MARKER).is_file()


def run_dir_of(checkpoint) -> Path | None:
    """The run directory a checkpoint file lies in (``<run>/checkpoints/<file>``), if cudarl made it."""
    d = Path(checkpoint).resolve().parent.parent
    return d if Path(checkpoint).resolve().parent.name == "checkpoints" and is_run_dir(d) else None


def resume_in_place(checkpoint, step: int, latest_step) -> tuple[Path | None, str]:
    """``(run_dir, why)``: where a resume from ``checkpoint`` at update ``step`` continues.

    ``latest_step(path)`` reads the update of a checkpoint file. The run directory itself when
    ``checkpoint`` lies in a cudarl run directory whose ``checkpoints/latest.npz`` is not later;
    ``None`` (a new run directory) otherwise, with the reason in words.
    """
    d = run_dir_of(checkpoint)
    if d is None:
        return None, f"{Path(checkpoint).parent} is not the checkpoints folder of a cudarl run directory"
    latest = d / "checkpoints" / "latest.npz"
    if latest.is_file() and not os.path.samefile(latest, checkpoint):
        newest = latest_step(latest)
        if newest > step:
            return None, f"{d} went on to update {newest}; its later checkpoints and metrics stay as they are"
    return d, ""


def sweep(run_dir, echo=print) -> None:
    """Remove the temporaries of killed writes in a run directory and its ``checkpoints/``, saying so."""
    d = Path(run_dir)
    removed = remove_stale_temporaries(d) + remove_stale_temporaries(d / "checkpoints")
    if removed:
        echo(
            f"removed {len(removed)} temporary file(s) left by an interrupted write in {d}: "
            + ", ".join(p.name for p in removed)
        )
