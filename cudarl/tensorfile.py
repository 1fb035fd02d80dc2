"""A small reader and writer of the safetensors format (no pickle; reads are memory-mapped).

The format (huggingface/safetensors, its README's "Format" section): an unsigned 64-bit
little-endian ``N``; ``N`` bytes of UTF-8 JSON, ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {str: str}}``; then the byte buffer, in which each tensor is the
little-endian, C-ordered bytes ``[begin, end)``. The tensors tile the buffer without gaps or
overlaps. This writer pads the header with spaces to a multiple of 8 bytes and orders tensors by
decreasing item size, so every tensor is aligned within the file.

Any safetensors reader (the ``safetensors`` package, with NumPy, PyTorch, JAX, ...) reads these
files; this reader refuses a file that breaks the rules above, naming the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .atomic import atomic_open

#: safetensors dtype names <-> NumPy dtypes (little-endian).
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {v.str: k for k, v in DTYPES.items()}
#: Headers larger than this are refused (the reference implementation's limit is 100 MB).
MAX_HEADER = 100_000_000


class TensorFileError(ValueError):
    """A file is not a readable safetensors file."""


def dumps_header(tensors: dict, metadata: dict | None) -> tuple[bytes, list]:
    """``(the 8 length bytes + padded JSON header, [(name, contiguous little-endian array)])``."""
    arrays = []
    for name, a in tensors.items():
        a = np.asarray(a)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt.str not in _NAMES:
            raise TypeError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        arrays.append((name, np.ascontiguousarray(a, dtype=dt)))
    arrays.sort(key=lambda na: (-na[1].dtype.itemsize, na[0]))
    header: dict = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"__metadata__ maps strings to strings; not {bad}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, a in arrays:
        header[name] = {
            "dtype": _NAMES[a.dtype.str],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, arrays


def save(path, tensors: dict, metadata: dict | None = None) -> Path:
    """Write ``tensors`` (name -> array) and ``metadata`` (str -> str) to ``path`` atomically."""
    head, arrays = dumps_header(tensors, metadata)
    path = Path(path)
    with atomic_open(path, "wb") as f:
        f.write(head)
        for _, a in arrays:
            f.write(a.reshape(-1).view(np.uint8).data)
    return path


def read_header(path) -> tuple[dict, dict, int]:
    """``(tensor entries, metadata, byte offset of the buffer)``, validated against the file size."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise TensorFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > min(MAX_HEADER, size - 8):
                raise TensorFileError(f"{path}: not a safetensors file (header length {n} for {size} bytes)")
            header = json.loads(f.read(n).decode("utf-8"))
    except FileNotFoundError:
        raise TensorFileError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorFileError(f"{path}: not a safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{path}: not a safetensors file (its header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    start, span = 8 + n, size - 8 - n
    spans = []
    for name, e in header.items():
        try:
            dt = DTYPES[e["dtype"]]
            shape = tuple(int(s) for s in e["shape"])
            begin, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise TensorFileError(f"{path}: tensor {name!r}: a bad entry {e!r}") from None
        if any(s < 0 for s in shape) or end - begin != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise TensorFileError(f"{path}: tensor {name!r}: {end - begin} bytes for {e['dtype']} {list(shape)}")
        spans.append((begin, end, name))
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin != at:
            raise TensorFileError(f"{path}: tensor {name!r} starts at byte {begin}, expected {at} (gap or overlap)")
        at = end
    if at != span:
        raise TensorFileError(f"{path}: the tensors cover {at} bytes of a {span}-byte buffer")
    return header, meta, start


def load(path, mmap: bool = True) -> tuple[dict, dict]:
    """``(name -> array, metadata)``. With ``mmap`` the arrays are read-only views of a memory map
    (nothing is read until used); otherwise they are read into memory."""
    header, meta, start = read_header(path)
    total = max((e["data_offsets"][1] for e in header.values()), default=0)
    if total == 0:
        buf = np.zeros(0, np.uint8)
    elif mmap:
        buf = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(total,))
    else:
        with open(path, "rb") as f:
            f.seek(start)
            buf = np.frombuffer(f.read(total), dtype=np.uint8)
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        out[name] = buf[begin:end].view(DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, meta
