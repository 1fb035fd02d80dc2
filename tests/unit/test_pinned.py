"""Device scalars and pinned readback: the state machine on the CPU, the guarantees on the GPU."""

import numpy as np
import pytest

from cudarl.backend import to_numpy
from cudarl.pinned import DeviceScalars, PinnedReadback, ReadbackError


def test_scalars_roundtrip_numpy():
    s = DeviceScalars({"step": np.int64, "tau": np.float32, "gamma": np.float64}, np, initial={"tau": 0.005})
    assert s.get("step") == 0 and s.get("tau") == np.float32(0.005)
    s.set("step", 2**40 + 3)
    s.set("gamma", 0.99)
    assert s.get("step") == 2**40 + 3 and s.get("gamma") == 0.99
    assert s.view("tau").dtype == np.float32 and s.view("tau").shape == (1,)
    state = s.state_dict()
    t = DeviceScalars({"step": np.int64, "tau": np.float32, "gamma": np.float64}, np)
    t.load_state_dict(state)
    assert t.state_dict() == state


def test_scalars_errors():
    s = DeviceScalars({"n": np.int32}, np)
    with pytest.raises(KeyError, match="no device scalar 'm'"):
        s.view("m")
    with pytest.raises(ValueError, match="does not fit"):
        s.set("n", 2**40)
    with pytest.raises(ValueError, match="not a supported scalar"):
        DeviceScalars({"x": np.complex64}, np)
    with pytest.raises(ValueError):
        DeviceScalars({}, np)
    with pytest.raises(KeyError, match="missing"):
        s.load_state_dict({})


def test_readback_refuses_a_read_before_a_recorded_write():
    r = PinnedReadback(2, np.float32, np)
    assert not r.ready()
    with pytest.raises(ReadbackError, match="before any write was recorded"):
        r.read()
    r.device[:] = [1.5, 2.5]
    r.mark_written()
    assert r.ready() and r.read().tolist() == [1.5, 2.5]
    with pytest.raises(ValueError):
        PinnedReadback(0, np.float32, np)


@pytest.mark.gpu
def test_gpu_readback_never_older_than_its_writer(cp):
    """A kernel spins ~50 ms before writing; read() after mark_written must see the new value."""
    from cudarl.ops import testing as ops

    r = PinnedReadback(1, np.float32, cp)
    s = cp.cuda.Stream(non_blocking=True)
    for i in range(3):
        r.host[0] = -1.0  # stale marker the kernel will overwrite
        ops.spin_then_write(r.device, float(i), 100_000_000, stream=s)  # ~50 ms at ~2 GHz
        r.mark_written(s)
        assert r.read()[0] == float(i)


def _fresh_rings_are_zero(xp, rounds: int = 32) -> None:
    """Rings of the train step's sizes (the Q statistics of 1 and 3 members, the loss ring), each
    allocated ``rounds`` times after as many of its size were filled with NaN and freed: every value of
    every slot of a new ring has all bits zero, on the host and through the device pointer."""
    for n, slots in ((8, 2), (24, 2), (2, 2), (12, 1)):
        dirty = [PinnedReadback(n, np.float32, xp, slots=slots) for _ in range(rounds)]
        for r in dirty:
            r.host[...] = np.nan
        del dirty, r  # freed: a small cudaHostAlloc block is handed out again
        for r in [PinnedReadback(n, np.float32, xp, slots=slots) for _ in range(rounds)]:
            for what, values in (("host", r.host), ("device", np.asarray(to_numpy(r.device)))):
                bits = values.view(np.uint32)
                assert not bits.any(), f"a fresh [{slots} x {n}] ring's {what} values are not zero: {values}"


def test_readback_starts_zeroed():
    _fresh_rings_are_zero(np)


@pytest.mark.gpu
def test_gpu_readback_starts_zeroed_over_reused_memory(cp):
    """cudaHostAlloc does not clear what it hands out, and a small block freed is handed out again:
    without the ring's own zeroing a population's Q statistics ring held stale statistics in a slot no
    update had written, and the bitwise member-against-agent test failed there."""
    _fresh_rings_are_zero(cp)


@pytest.mark.gpu
def test_gpu_scalars_set_get_and_ordering(cp):
    s = DeviceScalars({"size": np.int64, "tau": np.float32}, cp)
    s.set("size", 123)
    s.set("tau", 0.25)
    assert s.get("size") == 123 and s.get("tau") == np.float32(0.25)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ReadbackError, match="inside a graph capture"):
                s.set("size", 5, stream=stream)
            with pytest.raises(ReadbackError, match="inside a graph capture"):
                s.get("size")
        finally:
            stream.end_capture()
    assert s.get("size") == 123


def test_readback_slots_are_independent():
    r = PinnedReadback(2, np.float32, np, slots=3)
    r.slot_view(1)[:] = [3.0, 4.0]
    r.mark_written(slot=1)
    assert r.read(1).tolist() == [3.0, 4.0] and r.ready(1) and not r.ready(0)
    with pytest.raises(ReadbackError, match="slot=0"):
        r.read(0)
    with pytest.raises(ValueError, match="out of range"):
        r.read(3)
    with pytest.raises(ValueError):
        PinnedReadback(1, np.float32, np, slots=0)
