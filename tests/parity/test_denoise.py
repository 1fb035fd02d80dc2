"""The denoising objective (agent.aux "denoise"): masking noise and the reconstruction loss by hand,
the gradient by finite differences; the kernels against the twin on the GPU, bit for bit."""

import numpy as np
import pytest

from cudarl.reference import denoise as ref
from cudarl.testing import assert_bitwise, finite_difference, poison


def test_masking_zeroes_a_share_p_keyed_by_the_counter(rng):
    x = rng.normal(size=(64, 37)).astype(np.float32) + 5.0  # no zeros of its own
    out, counter = np.empty_like(x), np.zeros(1, np.int64)
    ref_stream = 0xDE
    ref.corrupt(x, out, counter, 0.25, 7, ref_stream)
    masked = out == 0
    assert abs(masked.mean() - 0.25) < 0.03
    np.testing.assert_array_equal(out[~masked], x[~masked])
    again = np.empty_like(x)
    ref.corrupt(x, again, counter, 0.25, 7, ref_stream)
    np.testing.assert_array_equal(again, out)  # the same counter: the same mask
    counter[0] += 1
    ref.corrupt(x, again, counter, 0.25, 7, ref_stream)
    assert not np.array_equal(again, out)  # the next step: a new mask
    ref.corrupt(x, again, counter, 0.0, 7, ref_stream)
    np.testing.assert_array_equal(again, x)


def test_loss_by_hand_advances_the_counter():
    recon, clean = np.float32([[1, 2], [0, -1]]), np.float32([[0, 2], [1, 1]])
    grad, per, counter = np.empty_like(recon), np.empty(2, np.float32), np.zeros(1, np.int64)
    ref.loss(recon, clean, grad, per, counter, 0.25)
    np.testing.assert_allclose(grad, [[0.5, 0], [-0.5, -1]])
    np.testing.assert_allclose(per, [0.25, 1.25])
    assert counter[0] == 1


def test_gradient_matches_finite_differences(rng):
    recon, clean = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))

    def total(r):
        per = np.empty(5)
        ref.loss(r, clean, np.empty_like(r), per, np.zeros(1, np.int64), 1 / 35)
        return per.sum()

    grad = np.empty_like(recon)
    ref.loss(recon, clean, grad, np.empty(5), np.zeros(1, np.int64), 1 / 35)
    np.testing.assert_allclose(grad, finite_difference(total, recon), atol=1e-9, rtol=1e-6)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B,m", [(1, 1), (3, 5), (128, 84), (512, 777)])
def test_gpu_corrupt_and_loss_match_reference_bitwise(cp, rng, B, m):
    from cudarl.ops import denoise as ops

    x = rng.normal(size=(B, m)).astype(np.float32)
    counter = np.int64([41])
    want = np.empty_like(x)
    ref.corrupt(x, want, counter, 0.3, 123, 0xDE)
    got = cp.empty((B, m), np.float32)
    poison(got)
    dc = cp.asarray(counter)
    ops.corrupt(cp.asarray(x), got, dc, 0.3, 123, 0xDE)
    assert_bitwise(got, want, "corrupted")
    recon = rng.normal(size=(B, m)).astype(np.float32)
    g, per = np.empty_like(recon), np.empty(B, np.float32)
    ref.loss(recon, x, g, per, counter, np.float32(1 / (B * m)))
    dg, dper = cp.empty((B, m), np.float32), cp.empty(B, np.float32)
    poison(dg)
    poison(dper)
    ops.loss(cp.asarray(recon), cp.asarray(x), dg, dper, dc, float(np.float32(1 / (B * m))))
    assert_bitwise(dg, g, "grad")
    assert_bitwise(dper, per, "loss_per")
    assert int(dc.get()[0]) == int(counter[0]) == 42
