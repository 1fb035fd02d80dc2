"""Checkpoints: one ``.npz`` of named arrays plus a JSON header, written atomically, loaded without pickle.

Layout: every array of a nested ``state_dict`` is stored under its ``/``-joined key
(``model/params``, ``replay/priorities``, ...); scalars become 0-d arrays; strings, booleans and
``None`` go into the JSON header (``__meta__``, a uint8 array), along with the format version.
Loading uses ``np.load(..., allow_pickle=False)``: a pickle, or an ``.npz`` holding object
arrays, is refused before anything in it runs.

Writes go to a temporary file in the same directory, are flushed and fsync'd, then renamed over
the target (and the directory fsync'd), so a crash mid-write leaves the previous file intact.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from .atomic import atomic_open

FORMAT = "cudarl-checkpoint"
VERSION = 1
_META = "__meta__"


class CheckpointError(RuntimeError):
    """A file is not a loadable cudarl checkpoint."""


def _flatten(tree, prefix: str, arrays: dict, meta: dict) -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            if not isinstance(k, str) or "/" in k or not k:
                raise CheckpointError(f"state key {prefix}{k!r}: keys must be non-empty strings without '/'")
            _flatten(v, f"{prefix}{k}/", arrays, meta)
        if not tree:
            meta[prefix[:-1]] = {}
        return
    key = prefix[:-1]
    if tree is None or isinstance(tree, (str, bool)) or (isinstance(tree, (list, tuple)) and _plain(tree)):
        meta[key] = json.loads(json.dumps(tree))  # tuples become lists
        return
    if hasattr(tree, "get") and type(tree).__module__.startswith("cupy"):
        tree = tree.get()
    a = np.asarray(tree)
    if a.dtype == object:
        raise CheckpointError(f"state entry {key!r} is not numeric (dtype object)")
    arrays[key] = a


def _plain(x) -> bool:
    """A list of numbers, strings, booleans, None and such lists (no arrays): stored as JSON."""
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (str, bool, int, float))


class State(dict):
    """A loaded state tree: a missing entry raises :class:`CheckpointError` naming the file and
    the entry's full path (``agent/adam/m``), not a bare ``KeyError('m')``."""

    def __init__(self, source: str = "", prefix: str = ""):
        super().__init__()
        self.source, self.prefix = source, prefix

    def __missing__(self, key):
        raise CheckpointError(
            f"{self.source}: the checkpoint has no entry {self.prefix + str(key)!r} "
            "(written by another version of cudarl, or not a training checkpoint)"
        )


def _unflatten(arrays: dict, meta: dict, source: str = "") -> dict:
    out = State(source)

    def put(key, value):
        node = out
        parts = key.split("/")
        for p in parts[:-1]:
            if p not in node:
                dict.__setitem__(node, p, State(source, f"{node.prefix}{p}/"))
            node = node[p]
        if isinstance(value, dict) and not value:
            value = State(source, f"{node.prefix}{parts[-1]}/")
        node[parts[-1]] = value

    for k, v in meta.items():
        put(k, v)
    for k, v in arrays.items():
        put(k, v)
    return out


def save(path, state: dict, info: dict | None = None) -> Path:
    """Write ``state`` (a nested dict of arrays and scalars) to ``path`` atomically.

    ``info`` (JSON-serialisable: config, versions, step) is stored in the header.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict = {}
    meta: dict = {}
    _flatten(state, "", arrays, meta)
    header = {"format": FORMAT, "version": VERSION, "meta": meta, "info": info or {}}
    arrays[_META] = np.frombuffer(json.dumps(header, default=_json_default).encode(), dtype=np.uint8)
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def load(path, only=None) -> tuple[dict, dict]:
    """Read a checkpoint: ``(state, info)``. Refuses pickles and anything not written by :func:`save`.

    ``only``: key prefixes to read (e.g. ``("agent/", "normaliser/")``); the other arrays (the
    replay buffer) are not read from the file at all."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a cudarl checkpoint (not an .npz archive; pickles are never loaded)")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _META not in z.files:
                raise CheckpointError(f"{path}: not a cudarl checkpoint (no {_META} header)")
            header = json.loads(bytes(z[_META]).decode())
            if header.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not a cudarl checkpoint (format {header.get('format')!r})")
            if int(header.get("version", -1)) > VERSION:
                raise CheckpointError(
                    f"{path}: checkpoint version {header['version']} is newer than this cudarl ({VERSION})"
                )
            keep = [k for k in z.files if k != _META and (only is None or k.startswith(tuple(only)))]
            arrays = {k: z[k] for k in keep}
    except CheckpointError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a loadable cudarl checkpoint ({exc})") from None
    meta = {k: v for k, v in header.get("meta", {}).items() if only is None or k.startswith(tuple(only))}
    return _unflatten(arrays, meta, str(path)), header.get("info", {})


def trainer_step(path) -> int:
    """The update a trainer's resume checkpoint at ``path`` was written at (reads its header, not its
    arrays): what a resume continues from."""
    return int(load(path, only=("trainer/",))[1]["step"])
