"""Flat parameter buffers with named views, activation workspaces, and the float64-aware matmul.

Layout of a network's parameters (:class:`ParamLayout`)
--------------------------------------------------------
All parameters live in one flat 1-D buffer (float32 on the GPU) and all gradients in a
second buffer of the same layout. Tensors are placed in the order they are declared, each
starting at a multiple of :data:`ALIGN` elements (256 bytes in float32, so every view is
aligned for vector loads and cuBLAS), with zero padding between them. A weight of a linear
layer is stored ``[n_in, n_out]`` row-major so that ``y = x @ W`` needs no transpose.
``ParamLayout.describe()`` prints the table (name, offset, shape, init).

Because Adam, the gradient norm, the soft target update and shrink-and-perturb each run as
one kernel over the flat buffer, their cost does not grow with the number of tensors.

Initialisation is drawn from Philox on the host (bit-identical on both backends): tensor
number ``k`` of the layout uses stream ``(seed, counter=0, stream_id=k)``, ``u ~ U[0, 1)``,
``w = (2u - 1) * limit`` with ``limit = gain * sqrt(6 / fan_in)`` (He, for layers followed by
ReLU) or ``gain * sqrt(6 / (fan_in + fan_out))`` (Xavier/Glorot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import blas
from ..reference import philox

ALIGN = 64


def matmul(a, b, out, *, trans_a: bool = False, trans_b: bool = False, beta: float = 0.0, tf32: bool = False) -> None:
    """``out = op(a) @ op(b) + beta * out`` through :func:`cudarl.blas.gemm`.

    float64 NumPy arrays (finite-difference checks only) take the same math in float64,
    since ``blas.gemm`` is float32.
    """
    if isinstance(out, np.ndarray) and out.dtype == np.float64:
        opa = a.T if trans_a else a
        opb = b.T if trans_b else b
        res = opa @ opb
        out[...] = res + beta * out if beta != 0.0 else res
        return
    blas.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, beta=beta, tf32=tf32)


@dataclass(frozen=True)
class Entry:
    """One tensor of a layout: ``buf[offset : offset + size]`` viewed as ``shape``."""

    name: str
    offset: int
    shape: tuple
    init: tuple  # ("he", gain) | ("xavier", gain) | ("const", value)
    decay: bool  # weight decay applies (weights yes, biases and norms no)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


class ParamLayout:
    """Ordered named tensors in one flat buffer (see the module docstring for the layout)."""

    def __init__(self):
        self.entries: list[Entry] = []
        self._by_name: dict[str, Entry] = {}
        self.size = 0

    def add(self, name: str, shape, init=("const", 0.0), decay: bool = False) -> Entry:
        if name in self._by_name:
            raise ValueError(f"parameter {name!r} declared twice")
        shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in shape):
            raise ValueError(f"parameter {name!r}: bad shape {shape}")
        off = -(-self.size // ALIGN) * ALIGN
        e = Entry(name, off, shape, tuple(init), bool(decay))
        self.entries.append(e)
        self._by_name[name] = e
        self.size = off + e.size
        return e

    def __getitem__(self, name: str) -> Entry:
        return self._by_name[name]

    @property
    def padded_size(self) -> int:
        return -(-self.size // ALIGN) * ALIGN

    def views(self, buf) -> dict:
        """``{name: view}`` of a flat buffer of :attr:`padded_size` elements (views, no copies)."""
        if buf.ndim != 1 or buf.shape[0] != self.padded_size:
            raise ValueError(f"flat buffer must be [{self.padded_size}], got {buf.shape}")
        return {e.name: buf[e.offset : e.offset + e.size].reshape(e.shape) for e in self.entries}

    def init_host(self, seed: int, dtype=np.float32) -> np.ndarray:
        """The initial flat parameters as a NumPy array (Philox draws, see the module docstring)."""
        out = np.zeros(self.padded_size, dtype=dtype)
        for k, e in enumerate(self.entries):
            kind, arg = e.init
            if kind in ("he", "xavier"):
                fan_in, fan_out = e.shape[0], int(np.prod(e.shape[1:]))
                limit = arg * math.sqrt(6.0 / (fan_in if kind == "he" else fan_in + fan_out))
                u = philox.uniform(seed, 0, k, e.size).astype(np.float64)
                vals = (2.0 * u - 1.0) * limit
            elif kind == "const":
                vals = np.full(e.size, float(arg))
            elif kind == "values":  # per-element constants, e.g. the plan head's bias
                vals = np.resize(np.asarray(arg, dtype=np.float64), e.size)
            else:
                raise ValueError(f"{e.name}: unknown init {e.init}")
            out[e.offset : e.offset + e.size] = vals.astype(dtype)
        return out

    def decay_mask(self) -> np.ndarray:
        """uint8 ``[padded_size]``: 1 where weight decay applies, 0 elsewhere (biases, norms, padding)."""
        m = np.zeros(self.padded_size, dtype=np.uint8)
        for e in self.entries:
            if e.decay:
                m[e.offset : e.offset + e.size] = 1
        return m

    def describe(self) -> str:
        rows = [f"{'name':32s} {'offset':>9s} {'size':>9s}  shape / init"]
        for e in self.entries:
            rows.append(f"{e.name:32s} {e.offset:9d} {e.size:9d}  {e.shape} {e.init[0]}")
        rows.append(f"{'total (padded)':32s} {'':9s} {self.padded_size:9d}")
        return "\n".join(rows)


def stacked_zeros(xp, members: int, shape: tuple, dtype=np.float32):
    """A zero ``[members, *shape]`` array of ``dtype`` whose entries are C-contiguous and start a multiple of
    :data:`cudarl.nn.params.ALIGN` elements apart (256 bytes in float32): each entry padded, so a batched
    GEMM over the entries keeps entry 0's alignment class (:func:`cudarl.blas.gemm_lt_batched`)."""
    size = math.prod(shape)
    flat = xp.zeros((int(members), -(-size // ALIGN) * ALIGN), dtype=dtype)
    return member_view(xp, flat, 0, shape)


def member_view(xp, flat, offset: int, shape: tuple):
    """``flat[:, offset : offset + prod(shape)]`` of a 2-D ``[P, stride]`` buffer as ``[P, *shape]``, a view
    (never a copy: the strides are given explicitly), each entry C-contiguous."""
    shape = tuple(int(s) for s in shape)
    inner, step = [], flat.itemsize
    for s in reversed(shape):
        inner.insert(0, step)
        step *= s
    view = flat[:, offset:]
    return xp.lib.stride_tricks.as_strided(view, shape=(flat.shape[0], *shape), strides=(flat.strides[0], *inner))


class Workspace:
    """Activation and activation-gradient buffers for batches up to ``max_batch``.

    ``add(name, row_shape)`` allocates ``[max_batch, *row_shape]`` once; ``rows(name, B)`` is
    the contiguous view of the first ``B`` batch rows reshaped to ``[B * row_shape[0], ...]``
    when ``merge`` was asked (IQN's ``[B * N, D]``). Allocation happens only in ``add``, so a
    forward/backward pass over a workspace can be captured in a graph.
    """

    def __init__(self, xp, dtype, max_batch: int):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.xp, self.dtype, self.max_batch = xp, np.dtype(dtype), int(max_batch)
        self.bufs: dict = {}
        self._merge: dict[str, bool] = {}
        self.batch = None
        self.x = None  # the input of the last forward over this workspace
        self.raw_head = False  # whether that forward gave the head's raw output (C51's va)
        self.heads: tuple = ()  # the names of the extra heads that forward ran (QNetwork.forward's heads)
        self.chained = False  # whether that forward ran the network's chain launch (net.gemm = "chain")
        #: the :class:`cudarl.graph.SideStream` the extra heads of a forward over this workspace run on
        #: (:meth:`cudarl.nn.QNetwork.branch_extras`), or None: on the forward's own stream
        self.extras_side = None

    def add(self, name: str, row_shape, dtype=None, merge: bool = False):
        if name in self.bufs:
            raise ValueError(f"workspace buffer {name!r} added twice")
        self.bufs[name] = self._zeros((self.max_batch,) + tuple(row_shape), dtype or self.dtype)
        self._merge[name] = merge
        return self.bufs[name]

    def _zeros(self, shape: tuple, dtype):
        """A new zero buffer of ``shape`` (what :meth:`add` allocates)."""
        return self.xp.zeros(shape, dtype=dtype)

    def shadow(self, own) -> Workspace:
        """A workspace over this one's buffers but for the names in ``own``, which get zero buffers of their
        own (allocated here): a second backward over this workspace's forward that writes only ``own``
        (:meth:`cudarl.nn.QNetwork.backward_writes`) can run beside one over this workspace. The last
        forward's input, raw flag, heads and chain flag are copied; no extra heads' branch."""
        ws = Workspace(self.xp, self.dtype, self.max_batch)
        for name, buf in self.bufs.items():
            ws.bufs[name] = self._zeros(buf.shape, buf.dtype) if name in own else buf
            ws._merge[name] = self._merge[name]
        ws.batch, ws.x, ws.raw_head, ws.heads, ws.chained = self.batch, self.x, self.raw_head, self.heads, self.chained
        return ws

    def rows(self, name: str, B: int | None = None):
        B = self.batch if B is None else B
        v = self.bufs[name][:B]
        if self._merge[name]:
            v = v.reshape((B * v.shape[1],) + tuple(v.shape[2:]))
        return v

    def set_batch(self, B: int) -> int:
        if not 1 <= int(B) <= self.max_batch:
            raise ValueError(f"batch {B} outside [1, {self.max_batch}] of this workspace")
        self.batch = int(B)
        return self.batch
