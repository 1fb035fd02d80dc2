"""Cross-stream hazards of a step graph, found on the NumPy backend (no GPU needed).

A step graph's phases fork work onto side streams (:class:`cudarl.graph.SideStream`) that run beside the
main stream until a join. The rule (its docstring) is the caller's: a side body must not write what the
main stream reads or writes before the join, nor read what the main stream writes before it. A break of
that rule is a race on the GPU: most replays order the two the same way, so the bits agree, until another
process's time slice or a different schedule reorders them (the run-to-run differences under load,
``docs/bench/gpu-bc80c04/``).

On the NumPy backend a fork's body runs in place, so the order of the kernel calls and of the forks and
joins is the GPU's capture order. :func:`find_hazards` replays a graph's phases with every kernel family
op (``cudarl.reference.*``) and every GEMM (``cudarl.blas``) wrapped: each call's array arguments are
regions of memory (its contiguous byte runs); the arguments whose bytes the call changed are its writes, all
of them its reads (conservative: an output-only argument counts as read). A ticket counter (an argument
named in :data:`TICKETS`: 0 before the launch and left 0, so its bytes never change) counts as written:
on the GPU every block of a ticketed launch increments it, so two launches that share one must be ordered.
Each logical stream keeps a vector clock (Lamport 1978; Fidge 1988): a fork orders the side after the
forking stream's work so far, a join the joining stream after the side's. Two accesses to overlapping
regions from different streams, at least one a write, neither ordered before the other, are a hazard.

What it cannot see: work that is not a family op or a GEMM (NumPy expressions written in a phase), a
write of the values already there, an array made inside a phase whose memory a later one reuses (the
phases of a captured graph allocate nothing), and kernels whose GPU launcher touches memory its twin does not (a
scratch buffer the twin never uses). A clean report is evidence, not proof.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
import traceback
from dataclasses import dataclass, field

import numpy as np

from . import graph as _graph


@dataclass
class Access:
    """One kernel call's access to one argument: its region ``[lo, hi)`` in bytes, whether it wrote
    it, the logical stream and that stream's vector clock at the call, and where the call was made."""

    lo: int
    hi: int
    starts: np.ndarray
    ends: np.ndarray
    write: bool
    stream: str
    clock: dict
    op: str
    phase: str
    where: str


@dataclass
class Hazard:
    """Two unordered accesses to overlapping memory, at least one a write."""

    first: Access
    second: Access

    def kind(self) -> str:
        a, b = self.first.write, self.second.write
        return "write-write" if a and b else ("read-write" if b else "write-read")

    def message(self) -> str:
        f, s = self.first, self.second
        return (
            f"{self.kind()}: {f.op} ({f.stream}, phase {f.phase}, {f.where}) and "
            f"{s.op} ({s.stream}, phase {s.phase}, {s.where}) touch the same bytes, unordered"
        )


@dataclass
class _State:
    clocks: dict = field(default_factory=lambda: {"main": {"main": 0}})
    current: list = field(default_factory=lambda: ["main"])
    names: dict = field(default_factory=dict)  # id(side) -> its name
    open: list = field(default_factory=list)  # (side name, the stream it forked from), in fork order
    accesses: list = field(default_factory=list)
    hazards: list = field(default_factory=list)
    phase: str = ""
    depth: int = 0


def _merge(into: dict, other: dict) -> None:
    for k, v in other.items():
        if into.get(k, -1) < v:
            into[k] = v


#: Names of the ticket counters of kernels that finish with ``cudarl::last_block`` or wait at a grid
#: barrier (``cudarl.ops._arrays.check_counter``): written by every launch, though left as they were.
TICKETS = frozenset({"done", "barrier"})


def _is_ticket(a) -> bool:
    """A uint32 ``[1]`` (or ``[P]``) counter: another argument of the same name (an episode's done flags) is not."""
    return isinstance(a, np.ndarray) and a.dtype == np.uint32 and a.ndim == 1


#: A strided view of more contiguous runs than this is taken as its byte bounds (conservative).
MAX_RUNS = 1 << 14


def _runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte intervals ``[starts, ends)`` an array covers, sorted: one per contiguous run of its
    innermost dimensions (a member's rows of a ``[P, ...]`` parameter view are one run each, so views
    of different members' rows do not overlap though their byte bounds do)."""
    shape, strides, run, k = a.shape, a.strides, a.itemsize, a.ndim
    while k and (shape[k - 1] == 1 or strides[k - 1] == run):
        run *= shape[k - 1]
        k -= 1
    if int(np.prod(shape[:k], dtype=np.int64)) > MAX_RUNS:
        lo, hi = _byte_bounds(a)
        return np.array([lo]), np.array([hi])
    starts = np.array([a.__array_interface__["data"][0]], dtype=np.int64)
    for n, st in zip(shape[:k], strides[:k], strict=True):
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * st).reshape(-1)
    starts = np.sort(starts)
    return starts, starts + run


def _overlap(a: Access, b: Access) -> bool:
    """Whether two accesses' runs share a byte (runs of one access have one length: ends sort as starts)."""
    if not (a.lo < b.hi and b.lo < a.hi):
        return False
    i = np.searchsorted(a.starts, b.ends, side="left") - 1  # a's last run starting before each of b's ends
    ok = i >= 0
    return bool(np.any(a.ends[i[ok]] > b.starts[ok]))


def _ordered_before(a: Access, clock: dict) -> bool:
    """Whether access ``a`` happens before an access made at vector clock ``clock``."""
    return a.clock[a.stream] <= clock.get(a.stream, -1)


def _arrays(obj, out: list) -> None:
    if isinstance(obj, np.ndarray):
        if obj.size:
            out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _arrays(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _arrays(o, out)


def _caller() -> str:
    """The innermost frame outside this module and the reference twins: who launched the op."""
    for f in reversed(traceback.extract_stack(limit=12)[:-2]):
        skip = ("hazards.py", "/reference/", "blas.py", "contextlib.py", "cudarl/graph.py")
        if not any(k in f.filename for k in skip):
            return f"{f.filename.rsplit('cudarl/', 1)[-1]}:{f.lineno}"
    return "?"


class _Checker:
    def __init__(self):
        self.s = _State()
        self.patched: list = []

    # --- streams ------------------------------------------------------------------------------------
    def _name(self, side) -> str:
        key = id(side)
        if key not in self.s.names:
            self.s.names[key] = f"side{len(self.s.names)}@{_caller()}"
        return self.s.names[key]

    @contextlib.contextmanager
    def fork(self, side):
        s = self.s
        name, here = self._name(side), s.current[-1]
        clock = s.clocks.setdefault(name, {name: 0})
        _merge(clock, s.clocks[here])  # the side waits for the forking stream's work so far
        if all(n != name for n, _ in s.open):
            s.open.append((name, here))
        s.current.append(name)
        try:
            yield
        finally:
            s.current.pop()

    @contextlib.contextmanager
    def branch(self, side):
        with self.fork(side):
            mark = len(self.s.open)
            yield
            for name, main in reversed(self.s.open[mark:]):
                self._join(name, main)

    def join(self, side) -> None:
        self._join(self._name(side), self.s.current[-1])

    def _join(self, name: str, into: str) -> None:
        s = self.s
        if name not in s.clocks:
            return
        _merge(s.clocks[into], s.clocks[name])
        s.clocks[into][into] = s.clocks[into].get(into, 0) + 1
        s.open = [(n, m) for n, m in s.open if n != name]

    def join_all(self) -> None:
        for name, main in reversed(list(self.s.open)):
            self._join(name, main)

    # --- accesses -----------------------------------------------------------------------------------
    def wrap(self, module, fname: str, label: str):
        fn = getattr(module, fname)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        tickets = sig is not None and bool(TICKETS & set(sig.parameters))

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            s = self.s
            if s.depth or not s.phase:  # an op inside an op, or outside a step graph's phases
                return fn(*args, **kwargs)
            arrays: list = []
            _arrays(args, arrays)
            _arrays(kwargs, arrays)
            forced: set = set()
            if tickets:
                bound = sig.bind_partial(*args, **kwargs).arguments
                forced = {id(bound[n]) for n in TICKETS if _is_ticket(bound.get(n))}
            before = [a.copy() for a in arrays]
            s.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                s.depth -= 1
                self._record(label, arrays, before, forced)

        setattr(module, fname, recorded)
        self.patched.append((module, fname, fn))

    def _record(self, label: str, arrays: list, before: list, forced: set) -> None:
        s = self.s
        here = s.current[-1]
        clock = s.clocks[here]
        clock[here] += 1
        snap, where = dict(clock), _caller()
        for a, b in zip(arrays, before, strict=True):
            lo, hi = _byte_bounds(a)
            raw = lambda x: np.ascontiguousarray(x).reshape(-1).view(np.uint8)  # noqa: E731
            wrote = id(a) in forced or not np.array_equal(raw(a), raw(b))  # bits: NaN payloads and -0.0 count
            acc = Access(lo, hi, *_runs(a), wrote, here, snap, label, s.phase, where)
            for o in s.accesses:
                if o.stream != here and (o.write or wrote) and not _ordered_before(o, snap) and _overlap(o, acc):
                    s.hazards.append(Hazard(o, acc))
            s.accesses.append(acc)


try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds  # NumPy 2
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds


def _twin_modules():
    import cudarl.reference as ref

    for info in pkgutil.walk_packages(ref.__path__, "cudarl.reference."):
        yield importlib.import_module(info.name)


def find_hazards(graph, replays: int = 1) -> list[Hazard]:
    """Replay ``graph`` (a NumPy-backend :class:`cudarl.graph.StepGraph`) ``replays`` times with every
    twin op and GEMM recorded (module docstring); the hazards found, each once per (ops, phases, kind)."""
    if graph.is_gpu:
        raise ValueError("find_hazards runs on the NumPy backend (run.device = 'cpu')")
    from . import blas

    chk = _Checker()
    for mod in _twin_modules():
        for name in dir(mod):
            obj = getattr(mod, name)
            if callable(obj) and not name.startswith("_") and getattr(obj, "__module__", None) == mod.__name__:
                if isinstance(obj, type):
                    continue
                chk.wrap(mod, name, f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
    for name in ("gemm", "gemm_lt", "gemm_lt_batched"):
        chk.wrap(blas, name, f"blas.{name}")
    SS = _graph.SideStream
    saved = (SS.fork, SS.branch, SS.join, SS.__dict__["join_all"])
    SS.fork = lambda self: chk.fork(self)
    SS.branch = lambda self: chk.branch(self)
    SS.join = lambda self: chk.join(self)
    SS.join_all = classmethod(lambda cls: chk.join_all())
    try:
        for _ in range(replays):
            chk.s.accesses.clear()
            for pname, fn in graph.phases:
                chk.s.phase = pname
                fn()
            chk.s.phase = ""
            chk.join_all()
    finally:
        SS.fork, SS.branch, SS.join = saved[:3]
        SS.join_all = saved[3]
        for module, fname, fn in reversed(chk.patched):
            setattr(module, fname, fn)
    seen, out = set(), []
    for h in chk.s.hazards:
        key = (h.first.op, h.first.where, h.second.op, h.second.where, h.kind())
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out
