"""testing family: the helper kernels the foundation's GPU guarantees are proven with."""

import numpy as np
import pytest

from cudarl.reference import testing as ref


def test_reference_iota_sized_and_axpb():
    out = np.full(6, np.nan, np.float32)
    ref.iota_sized(out, np.array([4], np.int64))
    assert out.tolist() == [1, 2, 3, 4, 0, 0]
    x = np.array([1.0, -2.0], np.float32)
    ref.axpb(x, 3.0, 0.5)
    assert x.tolist() == [3.5, -5.5]


@pytest.mark.gpu
@pytest.mark.parametrize("n,cap", [(0, 1), (1, 1), (300, 1000), (1000, 1000)])
def test_gpu_iota_sized(cp, n, cap):
    from cudarl.ops import testing as ops
    from cudarl.testing import assert_bitwise

    out = cp.full(cap, np.nan, np.float32)
    ops.iota_sized(out, cp.asarray(np.array([n], np.int64)))
    expected = np.empty(cap, np.float32)
    ref.iota_sized(expected, np.array([n], np.int64))
    assert_bitwise(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 257, 100_000])
def test_gpu_axpb(cp, rng, n):
    from cudarl.ops import testing as ops
    from cudarl.testing import assert_parity

    x = rng.standard_normal(n).astype(np.float32)
    d = cp.asarray(x)
    ops.axpb(d, 1.25, -0.5)
    ref.axpb(x, 1.25, -0.5)
    assert_parity(d, x)


def test_finite_difference_recovers_a_known_gradient():
    from cudarl.testing import finite_difference

    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.25]])
    np.testing.assert_allclose(finite_difference(lambda t: float(np.sum(t**3)), x), 3 * x**2, rtol=1e-7, atol=1e-8)


def test_reference_empty_and_its_signature():
    from cudarl import kernels, signatures

    assert ref.empty(3, 64) is None
    sig = signatures.of("testing", "empty")  # read from cuda_src/testing.cu: no parameters
    assert sig.params == () and kernels.check_args("k", sig.params, ()) == ()
    with pytest.raises(kernels.KernelError, match="expected 0 arguments"):
        kernels.check_args("k", sig.params, (1,))


@pytest.mark.gpu
def test_gpu_empty_runs_eager_and_graphed(cp):
    """The floor probe launches on any shape, alone and as graph nodes, and touches nothing."""
    from cudarl.graph import StepGraph
    from cudarl.ops import testing as ops

    x = cp.arange(8, dtype=np.float32)
    ops.empty()
    ops.empty(264, 1024)
    g = StepGraph(
        "empty_probe", [(f"e{i}", lambda: ops.empty(2, 64)) for i in range(3)] + [("t", lambda: ops.axpb(x, 2.0, 0.0))]
    )
    g.capture()
    g.replay()
    g.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(x), 2 * np.arange(8, dtype=np.float32))


def test_reference_fma_iterates():
    x = np.array([1.0, -2.0, 0.0], np.float32)
    ref.fma(x, 0.5, 1.0, 3)  # x -> x/2 + 1, three times
    np.testing.assert_array_equal(x, np.float32([1.875, 1.5, 1.75]))


@pytest.mark.gpu
@pytest.mark.parametrize("n,iters", [(1, 1), (257, 5), (100_000, 64)])
def test_gpu_fma(cp, rng, n, iters):
    from cudarl.ops import testing as ops
    from cudarl.testing import assert_parity

    x = rng.standard_normal(n).astype(np.float32)
    d = cp.asarray(x)
    ops.fma(d, 0.75, 0.125, iters)
    ref.fma(x, 0.75, 0.125, iters)
    assert_parity(d, x)


def test_state_differences_lists_every_differing_leaf_and_the_assert_names_them():
    """Two state trees that differ in a scalar statistic, an array, a plain value and a key: every one is a
    line (the scalar with its values), in the expected tree's order, and assert_state_bitwise's message
    carries them all; equal trees (NaN equal to NaN) have none."""
    from cudarl.testing import assert_state_bitwise, state_differences

    want = {"trainer": {"best": np.float64(1.5), "step": 7, "nan": float("nan")}, "w": np.arange(6, dtype=np.float32)}
    assert state_differences(want, want) == []
    w = want["w"].copy()
    w[4] = -1.0
    got = {"trainer": {"best": np.float64(1.25), "step": 8, "nan": float("nan"), "extra": 0}, "w": w}
    diffs = state_differences(got, want)
    assert len(diffs) == 4
    assert diffs[0].startswith("state/trainer: keys ['best', 'extra', 'nan', 'step']")
    assert diffs[1] == "state/trainer/best: 1 bytes differ (first at byte 6): [1.25] vs [1.5]"
    assert diffs[2] == "state/trainer/step: 8, expected 7"
    assert diffs[3] == "state/w: 1 bytes differ (first at byte 19)"  # 4.0 -> -1.0: the sign byte
    with pytest.raises(AssertionError, match=r"4 differing leaves:(.|\n)*trainer/step: 8(.|\n)*state/w: 1 bytes"):
        assert_state_bitwise(got, want)
    assert state_differences({"w": w.astype(np.float64)}, {"w": w})[0] == "state/w: (6,)/float64 vs (6,)/float32"
