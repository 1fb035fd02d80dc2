"""Step graphs: a sequence of named phases captured once into a CUDA graph and replayed.

A phase is a callable with no arguments that enqueues work on the graph's stream (CuPy's
current stream while phases run). During :meth:`StepGraph.capture`:

* kernels resolve from modules of the graph's own context (``cudarl.kernels``), so a
  captured function handle is never launched eagerly nor shared with another graph;
* any CuPy allocation raises (DESIGN.md rule 9: a graph that baked in a pooled address would
  later write into someone else's array);
* a host synchronisation ends the capture cleanly and raises :class:`GraphCaptureError`
  naming the phase; the stream stays usable.

A phase may put independent work on a :class:`SideStream` (``with side.fork(): ...``), which runs
concurrently with the graph's stream and becomes parallel branches of the captured graph; the
consumer calls ``side.join()``, and every branch still open is joined when the phases end (a
capture must end joined).

On the NumPy backend there are no graphs: :meth:`replay` runs the phases in order, with the
same state machine (capture before replay), so the CPU path is the same program.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from . import backend as _backend
from . import kernels

Phase = tuple[str, Callable[[], None]]


class GraphError(RuntimeError):
    """The graph API was used out of order or with bad arguments."""


class GraphCaptureError(GraphError):
    """A phase failed while being captured; the capture was abandoned."""


def _validate_phases(phases: Sequence[Phase]) -> list[Phase]:
    phases = list(phases)
    if not phases:
        raise GraphError("phases: a graph needs at least one phase")
    seen = set()
    for i, ph in enumerate(phases):
        if not (isinstance(ph, tuple) and len(ph) == 2 and isinstance(ph[0], str) and callable(ph[1])):
            raise GraphError(f"phases[{i}] must be a (name, callable) pair, got {ph!r}")
        if not ph[0] or ph[0] in seen:
            raise GraphError(f"phases[{i}]: phase names must be unique and non-empty, got {ph[0]!r}")
        seen.add(ph[0])
    return phases


@contextmanager
def _no_allocation(where: Callable[[], str]):
    import cupy

    def refuse(size):
        raise GraphCaptureError(
            f"{where()}: allocation of {size} bytes inside a capture; "
            "allocate every buffer before capture (DESIGN.md rule 9)"
        )

    with cupy.cuda.using_allocator(refuse):
        yield


class StepGraph:
    """Named phases, run eagerly or captured and replayed on a dedicated stream.

    Args:
        name: the graph's name; also the kernel context of its captured launches.
        phases: ``[(phase_name, fn), ...]``, run in order.
        stream: the CuPy stream to capture on (default: a new non-blocking stream).
        xp: ``numpy`` or ``cupy`` (default: the process backend).
    """

    def __init__(self, name: str, phases: Sequence[Phase], *, stream=None, xp=None):
        kernels.check_context(name)
        if name == kernels.UNGRAPHED:
            raise GraphError("name: 'ungraphed' is reserved for eager launches")
        self.name = name
        self.phases = _validate_phases(phases)
        self.xp = xp if xp is not None else _backend.get().xp
        self.is_gpu = self.xp.__name__ == "cupy"
        self.stream = None
        if self.is_gpu:
            import cupy

            if stream is None:
                from . import blas

                stream = cupy.cuda.Stream(non_blocking=True)
                blas.release_with(self, stream)  # its own stream: its handle goes with it
            self.stream = stream
        self._graph = None
        self._captured = False
        self._phase = None
        self._after = None  # event: the caller's stream's work so far, which run_eager and replay follow

    @property
    def captured(self) -> bool:
        return self._captured

    def _run(self, phases: Sequence[Phase]) -> None:
        for pname, fn in phases:
            self._phase = pname
            kernels.trace({"kind": "phase", "name": pname})
            fn()
        self._phase = None
        SideStream.join_all()

    def run_eager(self) -> None:
        """Run every phase now, with ungraphed kernels (the reference for graphed == eager)."""
        if not self.is_gpu:
            self._run(self.phases)
            return
        if self.stream.is_capturing():
            raise GraphError(f"graph {self.name!r}: run_eager while its stream is capturing")
        self._follow_caller()
        with self.stream, kernels.use_context(kernels.UNGRAPHED):
            self._run(self.phases)

    def _capture(self, phases: Sequence[Phase], context: str):
        import cupy

        from . import blas

        if self.stream.is_capturing():
            raise GraphError(f"graph {self.name!r}: capture while its stream is already capturing")
        blas.prepare(self.stream)  # cuBLAS handle + workspace must exist before capture
        where = lambda: f"graph {self.name!r}, phase {self._phase!r}"  # noqa: E731
        rt = cupy.cuda.runtime
        mode = getattr(rt, "streamCaptureModeThreadLocal", 1)
        # The cyclic garbage collector may free objects that own CUDA resources (pinned host memory,
        # events) at any moment; a cudaFreeHost inside a capture invalidates it. Seen on the H200 as
        # a rare cudaErrorStreamCaptureInvalidated, so no collection runs while capturing.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        with self.stream:
            self.stream.begin_capture(mode)
            try:
                with kernels.use_context(context), _no_allocation(where):
                    self._run(phases)
            except BaseException as exc:
                failed = where()
                self._phase = None
                SideStream.abandon_all()
                try:
                    self.stream.end_capture()
                except Exception:
                    pass  # an invalidated capture refuses to end cleanly; the stream is out of capture now
                if gc_was_enabled:
                    gc.enable()
                if isinstance(exc, GraphCaptureError):
                    raise
                raise GraphCaptureError(
                    f"{failed}: failed during capture ({type(exc).__name__}: {exc}); "
                    "a host synchronisation or host read cannot be captured"
                ) from exc
            try:
                graph = self.stream.end_capture()
            finally:
                if gc_was_enabled:
                    gc.enable()
        return graph

    def capture(self) -> None:
        """Capture every phase into one graph (replacing any earlier capture)."""
        if not self.is_gpu:
            self._captured = True
            return
        self._graph = self._capture(self.phases, self.name)
        self._captured = True

    def kernel_ops(self) -> set[tuple[str, str]]:
        """The kernels the phases launch, as ``(family, op)`` (empty on the NumPy backend).

        The phases run once inside a capture that is then thrown away, with
        :func:`cudarl.kernels.discovering` noting each launch's kernel instead of launching it: no
        kernel is compiled, loaded or run, and the captured graph is never launched.
        """
        if not self.is_gpu:
            return set()
        with kernels.discovering() as found:
            self._capture(self.phases, self.name)
        return set(found)

    def prefetch(self) -> None:
        """Start compiling, in parallel, the compile units holding the kernels the phases launch
        (:func:`cudarl.kernels.prefetch`): a family's other units are not waited for."""
        if self.is_gpu:
            kernels.prefetch(sorted(self.kernel_ops()))

    def replay(self) -> None:
        """Launch the captured graph on :attr:`stream` (NumPy: run the phases)."""
        if not self._captured:
            raise GraphError(f"graph {self.name!r}: replay before capture; call capture() first")
        if not self.is_gpu:
            self._run(self.phases)
            return
        self._follow_caller()
        self._graph.launch(self.stream)

    def _follow_caller(self) -> None:
        """Order :attr:`stream` after the work already issued on the caller's current stream
        (:func:`follow_caller`; seen on the H200 as ``test_causal``'s eager run reading a pooled
        counter's stale value)."""
        self._after = follow_caller(self.stream, self._after)

    def synchronize(self) -> None:
        """Wait for the graph's stream (a no-op on the NumPy backend)."""
        if self.is_gpu:
            self.stream.synchronize()

    def profile(self, repeats: int = 20) -> dict[str, float]:
        """Median milliseconds per phase and for the whole graph.

        On the GPU each phase is captured alone, in a context of its own
        (``<graph>.<phase>``, so no handle is shared with the whole-step graph), and its replays
        are timed with events. On the NumPy backend phases are timed with a host clock.
        """
        if repeats < 1:
            raise GraphError("repeats must be at least 1")
        out: dict[str, float] = {}
        if not self.is_gpu:
            for pname, fn in self.phases:
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t0) * 1e3)
                out[pname] = statistics.median(ts)
            out["total"] = sum(out.values())
            return out
        import cupy

        def time_graph(g) -> float:
            g.launch(self.stream)  # warm
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            ts = []
            for _ in range(repeats):
                start.record(self.stream)
                g.launch(self.stream)
                end.record(self.stream)
                end.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(start, end))
            return statistics.median(ts)

        for pname, fn in self.phases:
            g = self._capture([(pname, fn)], f"{self.name}.{pname}")
            out[pname] = time_graph(g)
        if self._captured:
            out["total"] = time_graph(self._graph)
        return out


def follow_caller(stream, event=None):
    """Order ``stream`` after the work already issued on the caller's current stream; returns the event it
    recorded (pass it back to reuse it), or ``event`` when there is nothing to order (``stream`` None: the
    NumPy backend, or the caller already on ``stream``).

    Our streams are non-blocking, so the legacy default stream, current wherever no ``with stream:`` is
    active, does not wait for them nor they for it: without this, a buffer the caller just made or wrote
    there (``cp.zeros``, ``a[...] = 0``, a host-to-device copy) could be read on ``stream`` before the
    write lands. It lands first unless the GPU is busy (another process's time slice), so such a race
    shows only under load. One event record and one wait, no host synchronisation."""
    if stream is None:
        return event
    import cupy

    caller = cupy.cuda.get_current_stream()
    if caller.ptr == stream.ptr:
        return event
    if event is None:
        event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
    event.record(caller)
    stream.wait_event(event)
    return event


def capture_all(graphs: Sequence[StepGraph]) -> None:
    """Capture ``graphs`` in order, after starting the compiles of every kernel any of them launches
    (its family's compile unit): a cold start compiles them side by side, not one at a time at each
    first launch."""
    for g in graphs:
        g.prefetch()
    for g in graphs:
        g.capture()


class SideStream:
    """A second stream for work independent of what follows on the main stream.

    ``with side.fork():`` orders its body after everything enqueued so far on the current (main)
    stream and runs it on :attr:`stream`; the main stream goes on at once. ``side.join()`` makes
    the main stream wait for all the side work so far. Inside a capture the fork and join are event
    edges, so the body becomes a parallel branch of the graph. Every fork must be joined before a
    capture ends; :class:`StepGraph` joins open side streams after its last phase.

    The side stream gets its own cuBLAS handle and workspace at construction (before any capture), unless
    ``gemms=False``: a branch that launches no GEMM (homeostatic's) then holds no 32 MiB workspace; a GEMM
    on it outside a capture would make one then, and inside one raises :class:`cudarl.blas.BlasError`.
    On the NumPy backend the body runs in place and both calls are no-ops.

    Hazards are the caller's: the body must not write what the main stream reads or writes before
    the join, nor read what the main stream writes before the join.
    """

    _open: list = []

    def __init__(self, xp=None, *, gemms: bool = True):
        self.xp = xp if xp is not None else _backend.get().xp
        self.stream = None
        self._pending = False
        if self.xp.__name__ == "cupy":
            import cupy

            from . import blas

            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._forked = cupy.cuda.Event(disable_timing=True)
            self._done = cupy.cuda.Event(disable_timing=True)
            if gemms:
                blas.prepare(self.stream)
            blas.release_with(self, self.stream)

    @contextmanager
    def fork(self):
        """``with side.fork():``: run the body on the side stream, after everything enqueued so far."""
        if self.stream is None:
            yield
            return
        import cupy

        main = cupy.cuda.get_current_stream()
        if main.ptr == self.stream.ptr:
            raise GraphError("SideStream.fork: already on the side stream")
        self._forked.record(main)
        self.stream.wait_event(self._forked)
        kernels.trace({"kind": "fork", "from": main.ptr, "to": self.stream.ptr})
        if not self._pending:
            self._pending = True
            SideStream._open.append((self, main))
        with self.stream:
            yield

    @contextmanager
    def resume(self):
        """``with side.resume():`` the body enqueued on the side stream itself, after the work forked onto it
        so far (joined since or not), without waiting for the current stream: a :meth:`fork` in the body
        then orders its branch after that side's work only, not after the current stream's (a branch that
        reads what the side wrote and nothing the main stream wrote since). The body should only fork:
        work launched on the side stream itself would be joined by nobody. On the NumPy backend the body
        runs in place."""
        if self.stream is None:
            yield
            return
        with self.stream:
            yield

    @contextmanager
    def branch(self):
        """``with side.branch():`` a :meth:`fork` whose body is closed at its end: every side stream the
        body forked and left open is joined back into the stream it forked from, innermost first, so
        the body is one self-contained parallel branch (a population member's step). The caller still
        joins this side stream with :meth:`join`."""
        with self.fork():
            mark = len(SideStream._open)  # this side is registered by now; what opens after is the body's
            yield
            for side, main in reversed(SideStream._open[mark:]):
                with main:
                    side.join()

    def join(self) -> None:
        """The current stream waits for every fork so far (no-op if nothing is pending)."""
        if self.wait():
            self._pending = False
            SideStream._open[:] = [(s, m) for s, m in SideStream._open if s is not self]

    def wait(self) -> bool:
        """The current stream waits for the side's work so far, which stays pending: its own :meth:`join` (into
        the stream it forked from) still orders that stream after it. A :meth:`join` into another stream would
        clear it, and the owner's join would then order nothing (a no-op where nothing is pending). Returns
        whether it waited (something was pending)."""
        if self.stream is None or not self._pending:
            return False
        import cupy

        self._done.record(self.stream)
        cupy.cuda.get_current_stream().wait_event(self._done)
        kernels.trace({"kind": "join", "from": self.stream.ptr, "to": cupy.cuda.get_current_stream().ptr})
        return True

    @classmethod
    def abandon_all(cls) -> None:
        """Forget pending forks (a failed capture: its stream is out of capture, nothing to join)."""
        for side, _ in cls._open:
            side._pending = False
        cls._open.clear()

    @classmethod
    def join_all(cls) -> None:
        """Join every side stream with pending work into the stream it forked from, the last opened
        first: a branch forked from another side stream (an extra head's, inside a forward on a branch)
        is joined into that stream before that stream is joined into its own."""
        for side, main in reversed(list(cls._open)):
            with main:
                side.join()
