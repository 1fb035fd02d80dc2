"""The batched-GEMM probe's verdicts on disk (``net.batched_algo = "probe"``, :mod:`cudarl.blas`).

A probe runs the heuristic's candidates of a batched problem against the single GEMM's algorithm, keeps
those whose output is bitwise the single one's and times them (seconds per population build at P = 64).
Its verdict is a function of the problem, the single algorithm, the GPU model and the cuBLASLt build, not
of the data: so it is kept here, one file per verdict, and a later process with the same key adopts the
same algorithm without probing again. Entries live under ``$CUDARL_CACHE_DIR/probes`` (default
``~/.cache/cudarl/probes``, beside the compiled kernels), are named by the sha256 of everything that
decides the verdict (:meth:`ProbeVerdicts.name`), and are written atomically (:mod:`cudarl.atomic`), so
processes may share the folder. A file that cannot be read, parsed or matched is ignored (the probe runs
again and writes it anew); a folder that cannot be written costs only the probe's time, with one warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from .kernels import CACHE_ENV

#: The entries' layout: a change makes every older entry a miss.
FORMAT = 1


def default_dir() -> Path:
    """``$CUDARL_CACHE_DIR/probes`` (default ``~/.cache/cudarl/probes``)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "cudarl")
    return Path(root) / "probes"


class ProbeVerdicts:
    """``load(name, key) -> record | None`` and ``store(name, key, record)`` over one folder (``root``,
    default :func:`default_dir`). A record is a JSON object; :meth:`load` returns it only if the file
    holds this :data:`FORMAT` and exactly ``key`` (the plan key's ``repr``: a hash collision or a stale
    file is a miss)."""

    #: the folders a store failed in, this process (each is warned about once, whichever instance found it)
    _unwritable: set = set()

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_dir()

    @staticmethod
    def name(*parts) -> str:
        """The entry's file stem: sha256 over ``parts`` (each as text, length-prefixed, so no two splits
        collide) and :data:`FORMAT`."""
        h = hashlib.sha256()
        for p in (f"cudarl-probe-cache {FORMAT}", *parts):
            b = str(p).encode()
            h.update(len(b).to_bytes(8, "little") + b)
        return h.hexdigest()

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def load(self, name: str, key: str) -> dict | None:
        try:
            with open(self.path(name), encoding="utf-8") as fh:
                entry = json.load(fh)
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
            return None
        record = entry.get("record")
        return record if isinstance(record, dict) else None

    def store(self, name: str, key: str, record: dict) -> bool:
        """Write the entry; False (and one warning per folder and process) where the folder is not writable."""
        from .atomic import atomic_open

        try:
            with atomic_open(self.path(name)) as fh:
                json.dump({"format": FORMAT, "key": key, "record": record}, fh, indent=1, sort_keys=True)
            return True
        except OSError as exc:
            if self.root not in self._unwritable:
                self._unwritable.add(self.root)
                warnings.warn(
                    f"probe verdicts cannot be kept in {self.root} ({exc}); each process probes again "
                    f"(set {CACHE_ENV} to a writable folder to keep them)",
                    stacklevel=2,
                )
            return False
