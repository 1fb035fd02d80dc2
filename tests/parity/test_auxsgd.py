"""The auxiliary signals' own SGD steps, every span in one launch: twin by hand, kernel bit for bit."""

import numpy as np
import pytest

from cudarl import signatures, testing
from cudarl.reference import auxsgd as ref
from cudarl.testing import assert_bitwise

F32 = np.float32


def test_steps_by_hand_and_clear():
    p, g = np.float32([1.0, -2.0, 0.5]), np.float32([0.5, 1.0, -4.0])
    q, h = np.float32([3.0]), np.float32([2.0])
    ref.steps([(p, g, 0.1, False), (q, h, 0.5, True)])
    np.testing.assert_allclose(p, [0.95, -2.1, 0.9], rtol=1e-6)
    np.testing.assert_allclose(g, [0.5, 1.0, -4.0])
    np.testing.assert_allclose(q, [2.0])
    assert not h.any()
    ref.steps([(p, g, 0.1, True)])
    np.testing.assert_allclose(p, [0.9, -2.2, 1.3], rtol=1e-6)
    assert not g.any()


def test_the_launcher_passes_the_span_table_by_value(monkeypatch):
    """Three spans: one launch whose struct holds them in order and a fourth slot of n = 0 (the last span's
    arrays again: no null pointer); the kernel's slot count is the twin's; 0 or 5 spans, or spans whose
    memory overlaps, are refused (one launch steps them all at once); adjacent views of one buffer are not."""
    from cudarl.ops import auxsgd as ops

    assert signatures.define("auxsgd", "AS_MAX_SPANS") == ref.MAX_SPANS == 4
    calls = []
    monkeypatch.setattr(ops, "launch", lambda fam, op, grid, block, args, **kw: calls.append((op, grid, block, args)))
    flat, own = np.zeros(1000, F32), np.zeros(600, F32)
    spans = [
        (flat[0:10], flat[500:510], 0.5, True),
        (flat[10:400], own[:390], 0.25, False),
        (own[400:], flat[600:800], 1.0, True),
    ]
    ops.steps(spans)
    ((op, grid, block, args),) = calls
    assert (op, grid, block) == ("steps", 2, 256)  # the largest span's 390 elements
    testing.assert_launch_args("auxsgd", op, args)
    pointers, ns, lrs, clears = args[:8], args[8:12], args[12:16], args[16:]
    slots = [(p, g) for p, g, _, _ in spans] + [spans[-1][:2]]
    assert all(a is b for a, b in zip(pointers, [a for s in slots for a in s], strict=True))
    assert list(ns) == [10, 390, 200, 0] and list(lrs) == [0.5, 0.25, 1.0, 0.0] and list(clears) == [1, 0, 1, 0]
    for bad, match in (([], "1 to 4 spans"), (spans + spans[:2], "1 to 4 spans")):
        with pytest.raises(ValueError, match=match):
            ops.steps(bad)
    with pytest.raises(ValueError, match="must not overlap"):
        ops.steps([(flat[0:10], flat[500:510], 0.5, True), (flat[5:20], own[:15], 0.5, True)])
    with pytest.raises(ValueError, match="must not overlap"):
        ops.steps([(flat[0:10], flat[5:15], 0.5, True)])


# ---- GPU ------------------------------------------------------------------------------------
def _spans(rng, cp, sizes, clears):
    host = [(rng.normal(size=n).astype(F32), rng.normal(size=n).astype(F32)) for n in sizes]
    lrs = [0.037 * (k + 1) for k in range(len(sizes))]
    dev = [(cp.asarray(p), cp.asarray(g), lr, c) for (p, g), lr, c in zip(host, lrs, clears, strict=True)]
    return [(p, g, lr, c) for (p, g), lr, c in zip(host, lrs, clears, strict=True)], dev


@pytest.mark.gpu
@pytest.mark.parametrize(
    "sizes,clears",
    [
        ((1,), (False,)),
        ((257,), (True,)),
        ((300_001,), (True,)),
        ((514, 83_456, 16_448), (True, True, True)),  # risk's head, an encoder, a decoder
        ((1, 300_001, 257, 3), (False, True, False, True)),
    ],
)
def test_gpu_steps_match_reference_bitwise(cp, rng, sizes, clears):
    from cudarl.ops import auxsgd as ops

    host, dev = _spans(rng, cp, sizes, clears)
    ops.steps(dev)
    ref.steps(host)
    for k, ((p, g, _, _), (dp, dg, _, _)) in enumerate(zip(host, dev, strict=True)):
        assert_bitwise(dp, p, f"span {k} params")
        assert_bitwise(dg, g, f"span {k} grads")


@pytest.mark.gpu
def test_gpu_graphed_steps_equal_eager_bitwise(cp, rng):
    """The one launch captured and replayed from the same start: the eager run's bits, every span."""
    from cudarl.graph import StepGraph
    from cudarl.ops import auxsgd as ops
    from cudarl.testing import assert_reruns_bitwise

    _, dev = _spans(rng, cp, (514, 83_456, 16_448), (True, True, True))
    start = [(p.copy(), g.copy()) for p, g, _, _ in dev]
    outs = {f"{w}{k}": a for k, (p, g, _, _) in enumerate(dev) for w, a in (("p", p), ("g", g))}
    graph = StepGraph("auxsgd_parity", [("sgd", lambda: ops.steps(dev))], xp=cp)

    def restore():
        for (p, g, _, _), (p0, g0) in zip(dev, start, strict=True):
            p[...], g[...] = p0, g0

    graph.run_eager()
    graph.synchronize()
    first = {k: v.get() for k, v in outs.items()}
    assert_reruns_bitwise(graph, outs, first, ("eager",), reset=restore)
    graph.capture()
    assert_reruns_bitwise(graph, outs, first, ("graphed", "graphed"), reset=restore)
