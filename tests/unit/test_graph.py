"""StepGraph: API misuse on the CPU; capture, replay, isolation and failure handling on the GPU."""

import numpy as np
import pytest

from cudarl import kernels
from cudarl.graph import GraphCaptureError, GraphError, SideStream, StepGraph, follow_caller


def test_cpu_replay_requires_capture_and_runs_phases_in_order():
    log = []
    g = StepGraph("train", [("a", lambda: log.append("a")), ("b", lambda: log.append("b"))], xp=np)
    with pytest.raises(GraphError, match="replay before capture"):
        g.replay()
    g.run_eager()
    g.capture()
    g.replay()
    assert log == ["a", "b", "a", "b"] and g.captured


def test_cpu_side_stream_runs_its_body_in_place():
    log = []
    side = SideStream(xp=np)

    def phase():
        with side.fork():
            log.append("side")
        log.append("main")
        side.join()

    g = StepGraph("train", [("a", phase)], xp=np)
    g.capture()
    g.replay()
    assert log == ["side", "main"] and not SideStream._open


@pytest.mark.parametrize(
    "phases,match",
    [
        ([], "at least one phase"),
        ([("a", 1)], r"phases\[0\] must be a \(name, callable\) pair"),
        ([("a", print), ("a", print)], "unique"),
        ([("", print)], "unique and non-empty"),
        (["a"], "pair"),
    ],
)
def test_bad_phases(phases, match):
    with pytest.raises(GraphError, match=match):
        StepGraph("train", phases, xp=np)


def test_reserved_and_invalid_names():
    with pytest.raises(GraphError, match="reserved"):
        StepGraph("ungraphed", [("a", print)], xp=np)
    with pytest.raises(kernels.KernelError):
        StepGraph("bad name", [("a", print)], xp=np)


def test_profile_cpu_times_every_phase():
    g = StepGraph("train", [("a", lambda: None), ("b", lambda: sum(range(100)))], xp=np)
    p = g.profile(repeats=3)
    assert set(p) == {"a", "b", "total"} and all(v >= 0 for v in p.values())
    with pytest.raises(GraphError):
        g.profile(repeats=0)


# --- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_module_isolation(cp):
    """A kernel loaded for two contexts comes from two modules with distinct function handles."""
    fu = kernels.get_function("util", "add_i64", kernels.UNGRAPHED)
    fg = kernels.get_function("util", "add_i64", "train")
    fc = kernels.get_function("util", "add_i64", "collect")
    assert kernels.get_module("util", "train") is not kernels.get_module("util", kernels.UNGRAPHED)
    ptrs = {fu.kernel.ptr, fg.kernel.ptr, fc.kernel.ptr}
    assert len(ptrs) == 3, "function handles shared between contexts"
    mods = {fu.kernel.module.ptr, fg.kernel.module.ptr, fc.kernel.module.ptr}
    assert len(mods) == 3, "CUmodule shared between contexts"
    assert kernels.get_function("util", "add_i64", "train") is fg  # cached


def _step_phases(cp, state):
    from cudarl import blas
    from cudarl.ops import philox, testing, util

    def sample():
        philox.uniform(state["u"], 99, state["counter"].view(np.uint64), 1)

    def mix():
        blas.gemm(state["u"].reshape(64, 32), state["w"], state["h"])
        testing.axpb(state["h"], 0.5, 0.25)

    def advance():
        util.add_i64(state["counter"], 1)

    return [("sample", sample), ("mix", mix), ("advance", advance)]


def _fresh_state(cp):
    rng = np.random.default_rng(0)
    return {
        "u": cp.zeros(64 * 32, np.float32),
        "w": cp.asarray(rng.standard_normal((32, 16)).astype(np.float32)),
        "h": cp.zeros((64, 16), np.float32),
        "counter": cp.zeros(1, np.int64),
    }


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise(cp):
    from cudarl.testing import assert_bitwise

    eager, graphed = _fresh_state(cp), _fresh_state(cp)
    ge = StepGraph("eagerref", _step_phases(cp, eager))
    gg = StepGraph("stepgraph", _step_phases(cp, graphed))
    gg.capture()
    outs = []
    for _ in range(5):
        ge.run_eager()
        gg.replay()
        gg.synchronize(), ge.synchronize()
        assert_bitwise(gg_h := graphed["h"], eager["h"], "graphed vs eager")
        outs.append(gg_h.get())
    assert int(graphed["counter"].get()[0]) == 5
    assert not np.array_equal(outs[0], outs[1]), "the device counter must change the draws between replays"


def _late_write(cp):
    """A one-thread kernel ``(c, v, cycles)``: spins ``cycles`` clock ticks, then writes ``c[0] = v`` (int64)."""
    return cp.RawKernel(
        r"""extern "C" __global__ void late_write(long long* c, long long v, long long cycles) {
          const long long t0 = clock64();
          while (clock64() - t0 < cycles) {}
          c[0] = v;
        }""",
        "late_write",
    )


@pytest.mark.gpu
def test_gpu_eager_runs_and_replays_follow_the_callers_stream(cp):
    """A write still running on the caller's (default) stream is seen by the next run_eager and replay:
    the graph's non-blocking stream waits for it (test_causal's eager run once read a stale counter)."""
    late = _late_write(cp)
    counter, seen = cp.zeros(1, np.int64), cp.zeros(1, np.int64)
    g = StepGraph("follows", [("copy", lambda: seen.__setitem__(Ellipsis, counter))])
    g.run_eager()
    g.capture()
    cp.cuda.Device().synchronize()
    for k, run in enumerate((g.run_eager, g.replay), start=1):
        late((1,), (1,), (counter, np.int64(k), np.int64(40_000_000)))  # ~20 ms on the default stream
        run()
        g.synchronize()
        assert int(seen.get()[0]) == k, f"{run.__name__} read the counter before the caller's write landed"


@pytest.mark.gpu
def test_gpu_a_new_streams_cublas_warm_up_waits_for_the_callers_pending_work(cp):
    """blas.prepare on a new stream while a copy on the default stream has yet to read a temporary just
    freed: the warm-up GEMMs' operands are carved from that block (CuPy reuses it in the default stream's
    order), so the GEMMs must wait for the copy. Without the wait the copy read the GEMM's output: an
    agent's weight-decay mask had 256 wrong bytes under load (docs/bench/gpu1_s22.sh D)."""
    import gc

    from cudarl import blas

    gc.collect()
    blas.release_queued()  # earlier owners' handles: their cublasDestroy would synchronise inside prepare
    cp.cuda.Device().synchronize()
    cp.get_default_memory_pool().free_all_blocks()  # the temporary's block is the only free one
    want = np.arange(1, 257, dtype=np.float32)  # 1 KiB: the warm-up's x and y, 512 bytes each
    dst, dummy = cp.zeros(256, np.float32), cp.zeros(1, np.int64)
    tmp = cp.asarray(want)
    _late_write(cp)((1,), (1,), (dummy, np.int64(1), np.int64(400_000_000)))  # ~200 ms on the default stream
    dst[...] = tmp  # queued behind the spin
    del tmp
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        blas.prepare(stream)
        cp.cuda.Device().synchronize()
        got = dst.get()
        assert np.array_equal(got, want), f"{int(np.count_nonzero(got != want))} of 256 values overwritten"
    finally:
        blas.release(stream.ptr)


@pytest.mark.gpu
def test_gpu_size_read_from_device_memory(cp):
    """Captured at size N1, replayed after the host sets N2: the kernel sees N2 (no baked sizes)."""
    from cudarl.ops import testing
    from cudarl.pinned import DeviceScalars

    sizes = DeviceScalars({"n": np.int64}, cp, initial={"n": 10})
    out = cp.full(1000, np.nan, np.float32)
    g = StepGraph("sized", [("iota", lambda: testing.iota_sized(out, sizes.view("n")))])
    g.capture()
    g.replay()
    g.synchronize()
    assert int((out.get() > 0).sum()) == 10
    sizes.set("n", 777, stream=g.stream)
    g.replay()
    g.synchronize()
    got = out.get()
    assert int((got > 0).sum()) == 777 and got[776] == 777.0 and got[777] == 0.0


@pytest.mark.gpu
def test_gpu_host_sync_during_capture_is_a_clear_error_and_stream_survives(cp):
    from cudarl.ops import testing

    x = cp.ones(8, np.float32)

    def bad():
        testing.axpb(x, 2.0, 0.0)
        x.get()  # a host read: cannot be captured

    g = StepGraph("badsync", [("ok", lambda: testing.axpb(x, 1.0, 1.0)), ("bad", bad)])
    with pytest.raises(GraphCaptureError, match="phase 'bad'"):
        g.capture()
    assert not g.captured and not g.stream.is_capturing()
    with pytest.raises(GraphError, match="replay before capture"):
        g.replay()
    with g.stream:
        testing.axpb(x, 1.0, 1.0)
    g.stream.synchronize()
    assert x.get().tolist() == [2.0] * 8  # the captured-but-discarded work never ran


@pytest.mark.gpu
def test_gpu_allocation_inside_capture_is_refused(cp):
    def alloc():
        cp.empty(1024, np.float32)

    g = StepGraph("alloc", [("alloc", alloc)])
    with pytest.raises(GraphCaptureError, match="allocation of .* inside a capture"):
        g.capture()
    assert not g.stream.is_capturing()


@pytest.mark.gpu
def test_gpu_ungraphed_launch_into_capture_is_refused(cp):
    from cudarl.ops import testing

    x = cp.ones(8, np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(kernels.KernelError, match="outside cudarl.graph"):
                testing.axpb(x, 1.0, 1.0, stream=s)
        finally:
            s.end_capture()
    with kernels.use_context("train"):
        with pytest.raises(kernels.KernelError, match="not capturing"):
            testing.axpb(x, 1.0, 1.0)


@pytest.mark.gpu
def test_gpu_launch_helper_refuses_bad_pointers(cp):
    from cudarl.ops import testing

    with pytest.raises(kernels.KernelError, match="dtype float64"):
        testing.axpb(cp.ones(4, np.float64), 1.0, 0.0)
    with pytest.raises(kernels.KernelError, match="not C-contiguous"):
        testing.axpb(cp.ones(8, np.float32)[::2], 1.0, 0.0)
    with pytest.raises(kernels.KernelError, match="null pointer"):
        testing.iota_sized(cp.ones(4, np.float32), cp.empty(0, np.int64))


@pytest.mark.gpu
def test_gpu_profile_times_each_phase(cp):
    state = _fresh_state(cp)
    g = StepGraph("profiled", _step_phases(cp, state))
    g.capture()
    p = g.profile(repeats=5)
    assert set(p) == {"sample", "mix", "advance", "total"} and all(v > 0 for v in p.values())


@pytest.mark.gpu
def test_gpu_no_garbage_collection_during_capture(cp):
    """A cyclic-GC pass freeing pinned memory inside a capture invalidated it (seen once on the H200)."""
    import gc

    seen = []
    g = StepGraph("nogc", [("probe", lambda: seen.append(gc.isenabled()))])
    assert gc.isenabled()
    g.capture()
    assert seen == [False] and gc.isenabled()


@pytest.mark.gpu
@pytest.mark.parametrize("explicit_join", [True, False])
def test_gpu_side_stream_branches_join_and_replay(cp, explicit_join):
    """Work forked onto a side stream is ordered after the main stream's earlier work and before the
    main stream's work after the join; an open branch is joined when the phases end, so the capture
    ends cleanly. Checked eager, graphed and by profile (which captures each phase alone)."""
    n = 1 << 20
    a, b, c, d = (cp.zeros(n, cp.float32) for _ in range(4))
    side = SideStream(xp=cp)

    def produce():
        cp.add(a, 1.0, out=a)  # a = k after the k-th step

    def branch():
        with side.fork():
            cp.multiply(a, 2.0, out=b)  # reads main's write of this step
            cp.add(b, 1.0, out=b)
        cp.multiply(a, 3.0, out=c)  # main goes on concurrently
        if explicit_join:
            side.join()
            cp.add(b, c, out=d)  # needs the branch: d = 2k + 1 + 3k

    g = StepGraph("sidegraph" + str(explicit_join), [("produce", produce), ("branch", branch)])
    g.run_eager()
    g.capture()
    for k in range(2, 6):
        g.replay()
        g.synchronize()
        assert float(b[-1]) == 2 * k + 1 and float(c[-1]) == 3 * k
        if explicit_join:
            assert float(d[0]) == 5 * k + 1 and float(d[-1]) == 5 * k + 1
    assert not SideStream._open
    prof = g.profile(repeats=3)
    assert set(prof) == {"produce", "branch", "total"} and not SideStream._open


@pytest.mark.gpu
def test_gpu_branch_closes_the_side_streams_its_body_left_open(cp):
    """SideStream.branch (a population member's step): the body forks side streams of its own and leaves
    one open; the branch joins it back before the caller joins the branch, so two such branches in one
    graph capture, replay with the right values, and leave nothing open."""
    n = 1 << 18
    outs = [(cp.zeros(n, cp.float32), cp.zeros(n, cp.float32)) for _ in range(2)]
    counter = cp.zeros(n, cp.float32)
    members = [SideStream(xp=cp) for _ in outs]
    inner = [SideStream(xp=cp) for _ in outs]

    def produce():
        cp.add(counter, 1.0, out=counter)

    def member(i):
        def run():
            x, y = outs[i]
            with members[i].branch():
                with inner[i].fork():  # left open: the branch must join it
                    cp.multiply(counter, float(i + 2), out=y)
                cp.multiply(counter, 10.0, out=x)

        return run

    def join():
        for m in members:
            m.join()

    g = StepGraph("branchgraph", [("produce", produce), ("m0", member(0)), ("m1", member(1)), ("join", join)])
    g.capture()
    assert not SideStream._open
    for k in range(1, 4):
        g.replay()
        g.synchronize()
        for i, (x, y) in enumerate(outs):
            assert float(x[-1]) == 10 * k and float(y[-1]) == (i + 2) * k


def test_follow_caller_orders_a_stream_after_the_callers_work(monkeypatch):
    """follow_caller(stream): an event recorded on the caller's current stream, which ``stream`` waits for
    (our streams are non-blocking: the legacy default stream's writes would otherwise race the reads on
    ``stream``); reused when passed back; nothing for the caller's own stream or the NumPy backend (None).
    A fake ``cupy`` records the calls."""
    import sys
    from types import SimpleNamespace

    log = []

    class Stream:
        def __init__(self, name, ptr):
            self.name, self.ptr = name, ptr

        def wait_event(self, e):
            log.append(("wait", self.name, e.n))

    class Event:
        made = 0

        def __init__(self, **kw):
            Event.made += 1
            self.n = Event.made
            assert kw == {"block": False, "disable_timing": True, "interprocess": False}

        def record(self, stream):
            log.append(("record", stream.name, self.n))

    caller, mine = Stream("caller", 1), Stream("mine", 2)
    fake = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: caller, Event=Event))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert follow_caller(None) is None
    e = follow_caller(mine)
    assert log == [("record", "caller", 1), ("wait", "mine", 1)]
    assert follow_caller(mine, e) is e and log[2:] == [("record", "caller", 1), ("wait", "mine", 1)]
    assert follow_caller(caller, e) is e and len(log) == 4  # already on it: nothing to order


def test_evaluation_and_a_loaded_state_follow_the_callers_stream(monkeypatch, tmp_path):
    """The trainer's work that reads what the caller's stream just wrote follows it (follow_caller): an
    evaluation's walk (its env and block Q are made on the caller's stream at the first evaluation) and
    what runs after load_state_dict (its writes run on the caller's stream; the graphs follow at their
    next replay, an evaluation straight after would not). On the NumPy backend the stream is None; the
    test holds that both call it (either call removed fails it)."""
    from test_trainer import small

    from cudarl import policy, trainer

    calls = []
    record = lambda stream, event=None: calls.append(stream) or event  # noqa: E731
    monkeypatch.setattr(policy, "follow_caller", record)
    monkeypatch.setattr(trainer, "follow_caller", record)
    t = trainer.Trainer(small(tmp_path), run_dir=False, echo=lambda m: None)
    t.run(20)
    calls.clear()
    t.evaluate("val")
    assert calls == [t.stream]
    calls.clear()
    t.load_state_dict(t.state_dict())
    assert calls == [t.stream]
