"""Cross-stream hazards of a step graph, found on the NumPy backend (no GPU needed).

A step graph's phases fork work onto side streams (:class:`cudarl.graph.SideStream`) that run beside the
main stream until a join. The rule (its docstring) is the caller's: a side body must not write what the
main stream reads or writes before the join, nor read what the main stream writes before it. A break of
that rule is a race on the GPU: most replays order the two the same way, so the bits agree, until another
process's time slice or a different schedule reorders them (the run-to-run differences under load,
``docs/bench/gpu-bc80c04/``).

On the NumPy backend a fork's body runs in place, so the order of the kernel calls and of the forks and
joins is the GPU's capture order. :func:`find_hazards` replays a graph's phases with every kernel family
op (``cudarl.reference.*``) and every GEMM (``cudarl.blas``) wrapped. Reads: each call's array arguments,
as the contiguous byte runs of each view (conservative: an output argument counts as read too). Writes:
the bytes of every array reachable from the phases that changed between two boundaries (an op's start and
end, a fork, a join, a phase), on the stream current between them: an op's own writes, and those of the
NumPy expressions after it (a twin that returns its output leaves the write to its caller). A ticket
counter (an argument named in :data:`TICKETS`: 0 before the launch and left 0) counts as written: on the
GPU every block of a ticketed launch increments it, so two launches that share one must be ordered.
Each logical stream keeps a vector clock (Lamport 1978; Fidge 1988): a fork orders the side after the
forking stream's work so far, a join the joining stream after the side's. Two accesses to overlapping
bytes from different streams, at least one a write, neither ordered before the other, are a hazard.

What it cannot see: reads by NumPy expressions in a phase (only ops' arguments are reads), a write of the
values already there, arrays made inside a phase (the phases of a captured graph allocate nothing), and
memory a GPU launcher touches that its twin does not take (workspaces, scratch). A clean report is
evidence, not proof.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
import traceback
import types
from dataclasses import dataclass, field

import numpy as np

from . import graph as _graph


@dataclass
class Access:
    """One access: an op's read of an argument (or write of a ticket), or the writes a boundary found in one
    array. Its bytes (the sorted runs ``[starts, ends)``), whether it wrote, the logical stream and that
    stream's vector clock then, the op, the phase and the call site."""

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


@dataclass(frozen=True)
class Node:
    """One op on a chain of ops (:func:`longest_chain`): its label, phase and call site, the ops before it on
    the chain (``prev``) and the chain's length in ops up to and including it."""

    op: str
    phase: str
    where: str
    prev: Node | None
    length: int

    def path(self) -> list:
        """The chain's ops, first to last."""
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.prev
        return out[::-1]


def _longer(a: Node | None, b: Node | None) -> Node | None:
    return b if a is None or (b is not None and b.length > a.length) else a


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
    last_op: str = ""  # the op before the writes a boundary finds (a returning twin's caller writes after it)
    chain: dict = field(default_factory=dict)  # stream -> the longest chain of ops ending at its last (a Node)


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
    """Whether two accesses' runs share a byte (an access's runs are sorted and disjoint, or of one length:
    either way their ends sort as their starts)."""
    if not (a.starts[0] < b.ends[-1] and b.starts[0] < a.ends[-1]):  # the bounds first
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


class _Owner:
    """An array that owns its memory, as bytes, with the copy the last boundary saw."""

    def __init__(self, a: np.ndarray):
        self.ptr = a.__array_interface__["data"][0]
        self.bytes = a.reshape(-1, order="A").view(np.uint8)
        self.seen = self.bytes.copy()


def _root(a: np.ndarray):
    """The array that owns ``a``'s memory (None if that is not a NumPy array)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a if a.base is None else None


def _add_owner(owners: dict, a: np.ndarray) -> None:
    """Track the array owning ``a``'s memory (if it is a writable, contiguous NumPy array), by address."""
    r = _root(a)
    if r is not None and r.nbytes and r.flags.writeable and (r.flags.c_contiguous or r.flags.f_contiguous):
        owners.setdefault(r.__array_interface__["data"][0], _Owner(r))


def _owners(roots) -> dict:
    """The writable, contiguous NumPy arrays owning memory reachable from ``roots`` (the graph's phases:
    their closures, bound objects and those objects' attributes, containers followed), by address."""
    out, seen, todo = {}, set(), list(roots)
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, str, bytes, int, float)):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            _add_owner(out, o)
            continue
        if isinstance(o, dict):
            todo += o.values()
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += o
        elif isinstance(o, types.MethodType):
            todo += [o.__self__, o.__func__]
        elif isinstance(o, types.FunctionType):
            todo += [c.cell_contents for c in o.__closure__ or () if _filled(c)]
        elif isinstance(o, functools.partial):
            todo += [o.func, o.args, o.keywords]
        else:
            todo += getattr(o, "__dict__", {}).values()
            todo += [getattr(o, k) for k in getattr(type(o), "__slots__", ()) if hasattr(o, k)]
    return out


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


#: Unchanged gaps up to this many bytes inside a changed stretch belong to it (a float whose first bytes
#: kept their value was still written).
GAP = 16


class _Checker:
    def __init__(self, owners: dict):
        self.s = _State()
        self.patched: list = []
        self.owners = owners  # address -> _Owner

    def discover(self, arrays: list) -> None:
        """Owners of op arguments the walk from the phases missed (seen from their first op on)."""
        for a in arrays:
            _add_owner(self.owners, a)

    def boundary(self) -> None:
        """Attribute the bytes changed since the last boundary to the stream current since then: the writes
        of the op just run, or of the NumPy expressions after it (a returning twin's caller's)."""
        s = self.s
        if not s.phase:
            return
        for o in self.owners.values():
            if np.array_equal(o.bytes, o.seen):
                continue
            idx = np.flatnonzero(o.bytes != o.seen)
            cut = np.flatnonzero(np.diff(idx) > GAP)
            starts = o.ptr + idx[np.r_[0, cut + 1]].astype(np.int64)
            ends = o.ptr + idx[np.r_[cut, len(idx) - 1]].astype(np.int64) + 1
            what = f"writes after {s.last_op}" if s.last_op else "writes"
            self._access(starts, ends, True, what, _caller())
            o.seen[...] = o.bytes
        s.last_op = ""

    def settle(self) -> None:
        """Take the owners' bytes as they are now, recording nothing."""
        for o in self.owners.values():
            o.seen[...] = o.bytes
        self.s.last_op = ""

    def _access(self, starts, ends, write: bool, label: str, where: str) -> None:
        s = self.s
        here = s.current[-1]
        s.clocks[here][here] += 1
        acc = Access(starts, ends, write, here, dict(s.clocks[here]), label, s.phase, where)
        for o in s.accesses:
            if o.stream != here and (o.write or write) and not _ordered_before(o, acc.clock) and _overlap(o, acc):
                s.hazards.append(Hazard(o, acc))
        s.accesses.append(acc)

    # --- streams ------------------------------------------------------------------------------------
    def _name(self, side) -> str:
        key = id(side)
        if key not in self.s.names:
            self.s.names[key] = f"side{len(self.s.names)}@{_caller()}"
        return self.s.names[key]

    @contextlib.contextmanager
    def fork(self, side):
        s = self.s
        self.boundary()
        name, here = self._name(side), s.current[-1]
        clock = s.clocks.setdefault(name, {name: 0})
        _merge(clock, s.clocks[here])  # the side waits for the forking stream's work so far
        s.chain[name] = _longer(s.chain.get(name), s.chain.get(here))
        if all(n != name for n, _ in s.open):
            s.open.append((name, here))
        with self._on(name):
            yield

    @contextlib.contextmanager
    def resume(self, side):
        self.boundary()
        name = self._name(side)
        self.s.clocks.setdefault(name, {name: 0})  # its own work so far only: nothing of the current stream's
        with self._on(name):
            yield

    @contextlib.contextmanager
    def _on(self, name: str):
        """The body on logical stream ``name``, its trailing writes attributed to it."""
        self.s.current.append(name)
        try:
            yield
        finally:
            self.boundary()
            self.s.current.pop()

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
        self.boundary()
        if all(n != name for n, _ in s.open):  # SideStream.join: nothing pending (no fork since a join) orders
            return  # nothing, wherever that earlier join went
        self._order(name, into)
        s.open = [(n, m) for n, m in s.open if n != name]

    def wait(self, side) -> None:
        self.boundary()
        name = self._name(side)
        if any(n == name for n, _ in self.s.open):  # SideStream.wait: a no-op where nothing is pending
            self._order(name, self.s.current[-1])

    def _order(self, name: str, into: str) -> None:
        """Stream ``into`` after ``name``'s work so far."""
        s = self.s
        _merge(s.clocks[into], s.clocks[name])
        s.clocks[into][into] = s.clocks[into].get(into, 0) + 1
        s.chain[into] = _longer(s.chain.get(into), s.chain.get(name))

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
            self.boundary()  # what ran before this op is not its doing
            self.discover(arrays)
            where = _caller()
            here, prev = s.current[-1], s.chain.get(s.current[-1])
            s.chain[here] = Node(label, s.phase, where, prev, (prev.length if prev else 0) + 1)
            for a in arrays:
                self._access(*_runs(a), id(a) in forced, label, where)
            s.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                s.depth -= 1
                s.last_op = label
                self.boundary()  # the op's own writes
                s.last_op = label  # and its caller's, until the next op (a returning twin's outputs)

        setattr(module, fname, recorded)
        self.patched.append((module, fname, fn))


try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds  # NumPy 2
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds


def _twin_modules():
    import cudarl.reference as ref

    for info in pkgutil.walk_packages(ref.__path__, "cudarl.reference."):
        yield importlib.import_module(info.name)


def _replay(graph, replays: int) -> _Checker:
    """Replay ``graph``'s phases ``replays`` times with every twin op and GEMM recorded; the checker after
    the last replay (its hazards from every replay, its chains from the last)."""
    if graph.is_gpu:
        raise ValueError("the stream checks run on the NumPy backend (run.device = 'cpu')")
    from . import blas

    chk = _Checker(_owners([fn for _, fn in graph.phases]))
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
    saved = (SS.fork, SS.branch, SS.join, SS.__dict__["join_all"], SS.resume, SS.wait)
    SS.fork = lambda self: chk.fork(self)
    SS.resume = lambda self: chk.resume(self)
    SS.wait = lambda self: chk.wait(self)
    SS.branch = lambda self: chk.branch(self)
    SS.join = lambda self: chk.join(self)
    SS.join_all = classmethod(lambda cls: chk.join_all())
    try:
        for _ in range(replays):
            chk.s.accesses.clear()
            chk.s.chain.clear()  # a replay's chains start at its first op
            chk.settle()  # what changed before the replay (the host's work between updates) is not its
            for pname, fn in graph.phases:
                chk.boundary()  # the last phase's trailing writes, on the stream they ran on
                chk.s.phase = pname
                fn()
            chk.join_all()
            chk.s.phase = ""
    finally:
        SS.fork, SS.branch, SS.join = saved[:3]
        SS.join_all, SS.resume, SS.wait = saved[3], saved[4], saved[5]
        for module, fname, fn in reversed(chk.patched):
            setattr(module, fname, fn)
    return chk


def longest_chain(graph) -> list:
    """The longest chain of ops through one replay of ``graph`` (a NumPy-backend
    :class:`cudarl.graph.StepGraph`), counted in ops (twin ops and GEMMs, each about one node of the GPU's
    graph): a :class:`Node` list, first to last. An op follows the one before it on its stream, a fork's
    first op the forking stream's last, and a join's (or wait's) next op the joined stream's last; so this
    is the graph's critical path if every node cost the same. On the GPU they do not (a GEMM takes several
    times a small kernel), and kernels on parallel branches share the SMs: the count located nothing that
    moved the all-seven MLP step in the thirty-fourth session (``docs/perf-notes.md``); the replay's own
    timeline is ``tools/profile_step.py --timeline``."""
    chk = _replay(graph, 1)
    end = None
    for n in chk.s.chain.values():
        end = _longer(end, n)
    return end.path() if end is not None else []


def find_hazards(graph, replays: int = 1) -> list[Hazard]:
    """Replay ``graph`` (a NumPy-backend :class:`cudarl.graph.StepGraph`) ``replays`` times with every
    twin op and GEMM recorded (module docstring); the hazards found, one per pair of call sites."""
    chk = _replay(graph, replays)
    rank = {"write-write": 0, "write-read": 1, "read-write": 2}
    out: dict = {}
    for h in chk.s.hazards:  # one per pair of call sites: the write-write one where there is one
        key = (h.first.op.removeprefix("writes after "), h.first.where, h.second.op.removeprefix("writes after "),
               h.second.where)  # fmt: skip
        if key not in out or rank[h.kind()] < rank[out[key].kind()]:
            out[key] = h
    return list(out.values())
