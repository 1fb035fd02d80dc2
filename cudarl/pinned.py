"""Device scalars the kernels read, and pinned host memory the host reads.

* :class:`DeviceScalars` holds counters, sizes and schedules in device memory so that a graph
  replay sees their current values (DESIGN.md rule 2; the seed system baked a capture-time
  buffer size into its graphs). The host updates a slot between replays with a stream-ordered
  kernel; kernels increment counters on the device.
* :class:`PinnedReadback` is mapped pinned host memory that kernels write through its device
  pointer. The host reads it only through :meth:`PinnedReadback.read`, which waits on the event
  recorded after the writing kernel (DESIGN.md rule 4; the seed system read before the device
  wrote).

Both work on the NumPy backend with the same state machine, so misuse fails on the CPU too.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import backend as _backend
from .backend import family


class ReadbackError(RuntimeError):
    """A host read of device values was attempted where it cannot be correct."""


def _is_cupy(xp) -> bool:
    return xp.__name__ == "cupy"


def _refuse_if_capturing(what: str, stream=None) -> None:
    import cupy

    s = stream if stream is not None else cupy.cuda.get_current_stream()
    if s.is_capturing():
        raise ReadbackError(
            f"{what} inside a graph capture: a host synchronisation cannot be captured; do it between replays"
        )


def _device_pointer_of_host(hptr: int) -> int:
    """The device address of mapped pinned memory (cuMemHostGetDevicePointer; CuPy has no wrapper)."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuMemHostGetDevicePointer_v2
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    d = ctypes.c_uint64()
    status = fn(ctypes.byref(d), ctypes.c_void_p(hptr), 0)
    if status != 0:
        raise ReadbackError(f"cuMemHostGetDevicePointer failed with CUDA error {status}")
    return int(d.value)


_SLOT_TYPES = (np.int64, np.uint64, np.float32, np.float64, np.int32, np.uint32)


def _slot_dtypes(spec: dict) -> dict:
    """``{name: np.dtype}`` of a ``{name: dtype}`` spec, each a type an 8-byte slot holds, else ValueError."""
    dtypes = {}
    for name, dt in spec.items():
        dt = np.dtype(dt)
        if dt.type not in _SLOT_TYPES:
            raise ValueError(f"spec[{name!r}]: dtype {dt} is not a supported scalar type")
        dtypes[name] = dt
    return dtypes


def _check_state_names(names: tuple, state: dict, what: str) -> None:
    """KeyError naming the ``names`` that ``state`` lacks (``what``: the scalars' kind, for the message)."""
    missing = set(names) - set(state)
    if missing:
        raise KeyError(f"state is missing {what}: {sorted(missing)}")


class _NamedSlots:
    """What :class:`DeviceScalars` and :class:`MemberScalars` share over their ``names`` and ``_views``
    (``_KIND`` names their scalars in errors; ``set`` and ``get`` are each class's own)."""

    _KIND = "device scalar"

    def view(self, name: str):
        """The device array of ``name`` that kernels read (and may write): :class:`DeviceScalars`' 1-element
        slot, :class:`MemberScalars`' ``[members]`` array (element ``i`` member ``i``'s)."""
        try:
            return self._views[name]
        except KeyError:
            raise KeyError(f"no {self._KIND} {name!r} (have {', '.join(self.names)})") from None

    def state_dict(self) -> dict:
        return {name: self.get(name) for name in self.names}

    def load_state_dict(self, state: dict) -> None:
        _check_state_names(self.names, state, f"{self._KIND}s")
        for name in self.names:
            self.set(name, state[name])


class DeviceScalars(_NamedSlots):
    """Named scalars in one device buffer of 8-byte slots.

    Args:
        spec: ``{name: dtype}``; dtypes among int64, uint64, float32, float64, int32, uint32.
        xp: ``numpy`` or ``cupy`` (default: the process backend).
        initial: optional ``{name: value}``.

    ``view(name)`` is a 1-element array (of the slot's dtype) to pass to kernels as a pointer.
    """

    def __init__(self, spec: dict, xp=None, initial: dict | None = None):
        if not spec:
            raise ValueError("spec: at least one scalar is needed")
        self.xp = xp if xp is not None else _backend.get().xp
        self.dtypes = _slot_dtypes(spec)
        self.names = tuple(self.dtypes)
        self.buffer = self.xp.zeros(len(self.names), dtype=np.uint64)
        self._views = {}
        for i, name in enumerate(self.names):
            dt = self.dtypes[name]
            self._views[name] = self.buffer[i : i + 1].view(dt)[:1]
        for name, value in (initial or {}).items():
            self.set(name, value)

    @staticmethod
    def _bits(dt: np.dtype, value) -> int:
        v = np.zeros(1, dtype=np.uint64)
        try:
            cast = dt.type(value)
        except (OverflowError, ValueError, TypeError) as exc:
            raise ValueError(f"value {value!r} does not fit {dt}: {exc}") from None
        if dt.kind in "iu" and int(cast) != int(value):
            raise ValueError(f"value {value!r} does not fit {dt}")
        v.view(np.uint8)[: dt.itemsize] = np.frombuffer(np.array([cast], dtype=dt).tobytes(), dtype=np.uint8)
        return int(v[0])

    def set(self, name: str, value, stream=None) -> None:
        """Write ``value`` into slot ``name``, ordered on ``stream`` (not inside a capture)."""
        dt = self.view(name).dtype
        bits = self._bits(dt, value)
        i = self.names.index(name)
        if not _is_cupy(self.xp):
            self.buffer[i] = np.uint64(bits)
            return
        _refuse_if_capturing(f"DeviceScalars.set({name!r})", stream)
        family("util", self.xp).set_u64(self.buffer[i : i + 1], bits, stream=stream)

    def get(self, name: str):
        """The current value of ``name`` as a NumPy scalar (synchronises; for debugging and checkpoints)."""
        v = self.view(name)
        if _is_cupy(self.xp):
            _refuse_if_capturing(f"DeviceScalars.get({name!r})")
            return v.get()[0]
        return v[0].copy()


def member_index(i, members: int) -> int:
    """``i`` as a member index of ``members`` (an integer in ``[0, members)``), else IndexError."""
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) < members:
        raise IndexError(f"member {i!r} out of range [0, {members})")
    return int(i)


class MemberScalars(_NamedSlots):
    """:class:`DeviceScalars` for ``members`` members (a population's agents): each name a ``[members]``
    device array, element ``i`` member ``i``'s scalar, in one buffer of 8-byte slots (a row of them per
    name).

    Args:
        spec: ``{name: dtype}`` as for :class:`DeviceScalars`.
        members: P.
        xp: ``numpy`` or ``cupy`` (default: the process backend).
        initial: optional ``{name: value}``, the same value for every member or ``[members]`` values.

    ``view(name)`` is the ``[members]`` array to pass to kernels with a member axis; :meth:`get` and
    :meth:`set` copy all members' values (between replays, never inside a capture).
    """

    _KIND = "member scalar"

    def __init__(self, spec: dict, members: int, xp=None, initial: dict | None = None):
        if not spec or int(members) < 1:
            raise ValueError(f"MemberScalars: at least one scalar and one member, got {list(spec)} and {members}")
        self.xp = xp if xp is not None else _backend.get().xp
        self.members = int(members)
        self.dtypes = _slot_dtypes(spec)
        self.names = tuple(self.dtypes)
        self.buffer = self.xp.zeros((len(self.names), self.members), dtype=np.uint64)
        self._views = {n: self.buffer[i].view(self.dtypes[n])[: self.members] for i, n in enumerate(self.names)}
        for name, value in (initial or {}).items():
            self.set(name, value)

    def set(self, name: str, values) -> None:
        """Write ``values`` (one for every member, or ``[members]``) into ``name`` (not inside a capture)."""
        v = self.view(name)
        host = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=v.dtype), (self.members,)))
        if _is_cupy(self.xp):
            _refuse_if_capturing(f"MemberScalars.set({name!r})")
        v[...] = self.xp.asarray(host)

    def get(self, name: str) -> np.ndarray:
        """A host copy of ``name``'s ``[members]`` values (synchronises; for debugging and checkpoints)."""
        v = self.view(name)
        if _is_cupy(self.xp):
            _refuse_if_capturing(f"MemberScalars.get({name!r})")
            return v.get()
        return v.copy()

    def _member(self, i) -> int:
        return member_index(i, self.members)

    def set_member(self, name: str, i: int, value) -> None:
        """Write ``value`` into member ``i``'s element of ``name`` only (not inside a capture)."""
        v, i = self.view(name), self._member(i)
        host = np.asarray([value], dtype=v.dtype)
        if _is_cupy(self.xp):
            _refuse_if_capturing(f"MemberScalars.set_member({name!r})")
        v[i : i + 1] = self.xp.asarray(host)

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s values as the :meth:`DeviceScalars.state_dict` of its scalars alone (NumPy scalars
        of each slot's dtype)."""
        i = self._member(i)
        return {name: self.get(name)[i] for name in self.names}

    def load_member_state_dict(self, i: int, state: dict) -> None:
        """Restore a :meth:`DeviceScalars.state_dict` of these names into member ``i`` (the others keep theirs)."""
        i = self._member(i)
        _check_state_names(self.names, state, "device scalars")
        for name in self.names:
            self.set_member(name, i, state[name])


class _HostAllocation:
    """Owns one cudaHostAlloc block; freed when the last array over it goes (no reference cycle,
    so the cyclic collector never frees it at a random moment, e.g. inside a capture)."""

    def __init__(self, nbytes: int):
        import cupy

        self.ptr = cupy.cuda.runtime.hostAlloc(nbytes, 2)  # cudaHostAllocMapped
        self.nbytes = nbytes

    def __del__(self):
        try:
            import cupy

            cupy.cuda.runtime.freeHost(self.ptr)
        except Exception:
            pass


class PinnedReadback:
    """``slots`` rows of ``n`` values of ``dtype`` in mapped pinned host memory, written by kernels,
    read by the host.

    Kernels write into :attr:`device` (float ``[slots * n]``; slot ``s`` is ``[s * n, (s + 1) * n)``).
    After the launch (or graph replay) that writes a slot, call :meth:`mark_written` with that slot
    on the same stream; :meth:`read` waits on that slot's event and returns a copy. A read of a slot
    with no recorded write raises instead of returning whatever the memory held. Several slots let
    a graph write step ``t`` into one while the host reads step ``t - 1`` from another.

    Every value is zero until a kernel writes it, on both backends: cudaHostAlloc does not clear its
    memory (a small allocation reuses what an earlier, freed one left), so the CuPy ring is zeroed
    here as NumPy's is. Two rings written alike are then equal bit for bit, unwritten slots included.
    """

    def __init__(self, n: int, dtype=np.float32, xp=None, slots: int = 1):
        if int(n) < 1:
            raise ValueError(f"n: need at least one value, got {n}")
        if int(slots) < 1:
            raise ValueError(f"slots: need at least one slot, got {slots}")
        self.xp = xp if xp is not None else _backend.get().xp
        self.n, self.slots, self.dtype = int(n), int(slots), np.dtype(dtype)
        total = self.n * self.slots
        self._events = [None] * self.slots
        self._marked = [False] * self.slots
        if _is_cupy(self.xp):
            import cupy

            nbytes = total * self.dtype.itemsize
            self._alloc = _HostAllocation(nbytes)
            dptr = _device_pointer_of_host(self._alloc.ptr)
            raw = (ctypes.c_uint8 * nbytes).from_address(self._alloc.ptr)
            self.host = np.frombuffer(raw, dtype=self.dtype, count=total)
            self.host[...] = 0  # no kernel has this memory yet: a host write, before any launch
            mem = cupy.cuda.UnownedMemory(dptr, nbytes, self._alloc)
            self.device = cupy.ndarray((total,), dtype=self.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
            self._events = [cupy.cuda.Event(block=False, disable_timing=True) for _ in range(self.slots)]
        else:
            self.host = np.zeros(total, dtype=self.dtype)
            self.device = self.host

    def _slot(self, slot: int) -> int:
        if not 0 <= int(slot) < self.slots:
            raise ValueError(f"slot {slot} out of range [0, {self.slots})")
        return int(slot)

    def slot_view(self, slot: int = 0):
        """The device values of one slot: ``[n]``."""
        s = self._slot(slot)
        return self.device[s * self.n : (s + 1) * self.n]

    def mark_written(self, stream=None, slot: int = 0) -> None:
        """Record that the work enqueued so far on ``stream`` writes ``slot``."""
        s = self._slot(slot)
        if self._events[s] is not None:
            import cupy

            st = stream if stream is not None else cupy.cuda.get_current_stream()
            _refuse_if_capturing("PinnedReadback.mark_written", st)
            self._events[s].record(st)
        self._marked[s] = True

    def ready(self, slot: int = 0) -> bool:
        """True when the last recorded write of ``slot`` has completed (never blocks)."""
        s = self._slot(slot)
        if not self._marked[s]:
            return False
        return True if self._events[s] is None else bool(self._events[s].done)

    def read(self, slot: int = 0) -> np.ndarray:
        """Wait for the recorded write of ``slot``, then return a NumPy copy of its ``n`` values."""
        s = self._slot(slot)
        if not self._marked[s]:
            raise ReadbackError(
                f"PinnedReadback.read(slot={s}) before any write was recorded: "
                "call mark_written(stream, slot) after the writing launch"
            )
        if self._events[s] is not None:
            _refuse_if_capturing("PinnedReadback.read")
            self._events[s].synchronize()
        return self.host[s * self.n : (s + 1) * self.n].copy()
