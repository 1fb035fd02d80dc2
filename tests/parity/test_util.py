"""util family: fills, scalar sets and device-side increments."""

import numpy as np
import pytest

from cudarl.reference import util as ref


def test_reference_ops():
    a = np.arange(5, dtype=np.float32)
    ref.fill_u32(a, 0)
    assert not a.any()
    ref.fill_u32(a, 0x3F800000)
    assert (a == 1.0).all()
    b = np.zeros(1, np.uint64)
    ref.set_u64(b, 2**63 + 5)
    assert int(b[0]) == 2**63 + 5
    c = np.array([41], np.int64)
    ref.add_i64(c, 1)
    assert c[0] == 42


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 256, 257, 100_003])
def test_gpu_fill_matches_reference(cp, n):
    from cudarl.ops import util as ops
    from cudarl.testing import assert_bitwise

    x = cp.arange(n, dtype=np.float32) + 1
    ops.fill_u32(x.view(np.uint32), 0xBF800000)
    expected = np.arange(n, dtype=np.float32) + 1
    ref.fill_u32(expected, 0xBF800000)
    assert_bitwise(x, expected)


@pytest.mark.gpu
def test_gpu_set_and_add(cp):
    from cudarl.ops import util as ops

    b = cp.zeros(1, np.uint64)
    ops.set_u64(b, 2**63 + 5)
    c = cp.asarray(np.array([41], np.int64))
    ops.add_i64(c, 1)
    ops.add_i64(c, -3)
    assert int(b.get()[0]) == 2**63 + 5 and int(c.get()[0]) == 39


def test_reference_add_f32_in_place(rng):
    a, b = rng.standard_normal(9).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    want = a + b
    ref.add_f32(a, a, b)
    assert a.dtype == np.float32 and np.array_equal(a, want)
    with pytest.raises(ValueError, match="sizes"):
        ref.add_f32(a, a, b[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 257, 100_003])
def test_gpu_add_f32_matches_reference(cp, rng, n):
    from cudarl.ops import util as ops
    from cudarl.testing import assert_bitwise, poison

    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = cp.zeros(n, np.float32)
    poison(out)
    ops.add_f32(out, cp.asarray(a), cp.asarray(b))
    want = np.zeros(n, np.float32)
    ref.add_f32(want, a, b)
    assert_bitwise(out, want)


def test_reference_weighted_mean_is_the_float64_sum():
    v = np.float32([1.0, 2.0, -4.0])
    w = np.float32([0.5, 0.25, 1.0])
    got = ref.weighted_mean(v, w, 1 / 3)
    assert got.dtype == np.float32 and got == np.float32((0.5 + 0.5 - 4.0) / 3)
    assert ref.weighted_mean(v, w, 0.5, np.float64) == -1.5


def test_reference_copy_u32_keeps_the_bits(rng):
    src = np.array([-0.0, 1.5, np.nan, -np.inf], np.float32)
    dst = np.ones(4, np.float32)
    ref.copy_u32(dst.view(np.uint32), src.view(np.uint32))
    assert np.array_equal(dst.view(np.uint32), src.view(np.uint32))
    with pytest.raises(ValueError, match="one size"):
        ref.copy_u32(dst.view(np.uint32), src[:3].view(np.uint32))
    with pytest.raises(ValueError, match="uint32"):
        ref.copy_u32(dst, src)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 257, 100_003])
def test_gpu_copy_u32_matches_reference(cp, rng, n):
    from cudarl.ops import util as ops
    from cudarl.testing import assert_bitwise, poison

    src = rng.standard_normal(n).astype(np.float32)
    src[::5] = -0.0
    out = cp.zeros(n, np.float32)
    poison(out)
    ops.copy_u32(out.view(np.uint32), cp.asarray(src).view(np.uint32))
    want = np.zeros(n, np.float32)
    ref.copy_u32(want.view(np.uint32), src.view(np.uint32))
    assert_bitwise(out, want)
