"""The multi-horizon return loss (agent.aux "horizons"): the twin by hand, its gradient by finite
differences, the mask at the split end, the mirror; the kernel against the twin on the GPU (its totals,
summed by its last block, against the one-block means they replace, bit for bit)."""

import numpy as np
import pytest

from cudarl.reference import horizons as ref
from cudarl.reference.window import STATE_DIM
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison


def market(rng, T: int, B: int, t_end: int):
    """Random bar returns, their log series, and ``B`` state rows (bars across [0, t_end), a third of
    them near its end so some horizons run past it; every other row a mirror row)."""
    ret = (rng.normal(size=T) * 0.01).astype(np.float32)
    up, down = ref.future_log_returns(ret)
    rows = np.zeros((B, STATE_DIM), np.float32)
    rows[:, 0] = rng.integers(0, t_end - 1, B)
    rows[: B // 3, 0] = rng.integers(max(0, t_end - 20), t_end - 1, B // 3)
    rows[::2, 1] = 1.0
    rows[:, 2] = rng.uniform(-1, 1, B)
    return ret, up, down, rows


def run(pred, rows, up, down, horizons, t_end, weight=1.0, inv_sigma=50.0):
    B, H = pred.shape
    k = np.asarray(horizons, np.int32)
    hscale = (inv_sigma / np.sqrt(k.astype(np.float64))).astype(np.float32)
    per, valid, grad, out = (
        np.zeros(B, pred.dtype),
        np.zeros(B, np.float32),
        np.zeros_like(pred),
        np.zeros(2, pred.dtype),
    )
    ref.loss(pred, rows, up, down, k, hscale, t_end, weight, per, valid, grad, out)
    return per, valid, grad, out


def test_hand_case_targets_mask_and_mirror():
    ret = np.float32([0.1, -0.05, 0.02, 0.0, 0.03, 0.0, 0.0, 0.0])
    up, down = ref.future_log_returns(ret)
    np.testing.assert_allclose(up, np.log1p(ret.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(down, np.log1p(-ret.astype(np.float64)), rtol=1e-6)
    rows = np.float32([[0, 0, 0, 0], [1, 1, 0, 0], [4, 0, 0, 0], [3, 0, 0, 0]])
    pred = np.zeros((4, 2), np.float64)
    per, valid, grad, out = run(pred, rows, up, down, (1, 3), t_end=7, weight=1.0, inv_sigma=1.0)
    # row 0: y_1 = log 1.1, y_3 = (log 1.1 + log .95 + log 1.02) / sqrt 3; row 1 (mirror): log .95 ... of -ret
    y0 = np.array([np.log(1.1), (np.log(1.1) + np.log(0.95) + np.log(1.02)) / np.sqrt(3)])
    y1 = np.array([np.log(1.05), (np.log(1.05) + np.log(0.98) + np.log(1.0)) / np.sqrt(3)])
    # row 2 at t = 4: horizon 1 reads the price at 4 + 2 = 6 < 7 (fits); horizon 3 needs bar 8 (masked)
    # row 3 at t = 3: horizon 3 reads the price at 3 + 3 + 1 = 7, the split end: masked
    np.testing.assert_allclose(grad[0], -2 * y0 / 8, rtol=1e-6)
    np.testing.assert_allclose(grad[1], -2 * y1 / 8, rtol=1e-6)
    np.testing.assert_allclose(grad[2], [-2 * np.log(1.03) / 8, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grad[3], [0.0, 0.0], atol=1e-12)  # ret[3] = 0: horizon 1 fits, target 0
    np.testing.assert_allclose(valid, [1, 1, 0.5, 0.5])
    np.testing.assert_allclose(out[0], (np.sum(y0**2) + np.sum(y1**2) + np.log(1.03) ** 2) / 8, rtol=1e-6)
    np.testing.assert_allclose(out[1], 3 / 4, rtol=1e-6)


def test_nothing_past_the_split_end_is_read(rng):
    """Bars at and after the split end are NaN: every output stays finite, so no masked horizon read them."""
    T, t_end = 300, 240
    _, up, down, rows = market(rng, T, 41, t_end)
    up[t_end - 2 :] = np.nan  # ret[t_end - 2] reads the price at t_end: outside the split
    down[t_end - 2 :] = np.nan
    per, valid, grad, out = run(rng.normal(size=(41, 4)).astype(np.float32), rows, up, down, (1, 4, 16, 64), t_end)
    assert np.all(np.isfinite(per)) and np.all(np.isfinite(grad)) and np.all(np.isfinite(out))
    assert 0 < out[1] < 1  # some horizons were masked, some were not


def test_gradient_matches_finite_differences(rng):
    _, up, down, rows = market(rng, 200, 9, 180)
    pred = rng.normal(size=(9, 3))
    _, _, grad, _ = run(pred, rows, up, down, (1, 5, 30), 180, weight=0.7)
    fd = finite_difference(lambda p: run(p, rows, up, down, (1, 5, 30), 180, weight=0.7)[3][0], pred)
    np.testing.assert_allclose(grad, fd, atol=1e-9, rtol=1e-6)
    assert np.any(grad != 0)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,horizons,T", [(1, (1,), 50), (37, (1, 4, 16, 64), 400), (512, (2, 3, 100), 3000), (1025, (1, 4), 3000)]
)
def test_gpu_horizons_loss_matches_reference(cp, rng, B, horizons, T):
    from cudarl.ops import horizons as ops

    t_end = T - 7
    _, up, down, rows = market(rng, T, B, t_end)
    up[t_end - 2 :] = np.nan  # outside the split: a read would poison the outputs
    down[t_end - 2 :] = np.nan
    pred = rng.normal(size=(B, len(horizons))).astype(np.float32)
    k = np.asarray(horizons, np.int32)
    hscale = (50.0 / np.sqrt(k.astype(np.float64))).astype(np.float32)
    want = run(pred, rows, up, down, horizons, t_end, weight=0.3)
    got = [cp.empty(B, np.float32), cp.empty(B, np.float32), cp.empty((B, len(horizons)), np.float32)]
    out = cp.empty(2, np.float32)
    for a in (*got, out):
        poison(a)
    d = cp.asarray
    done = cp.zeros(1, np.uint32)
    for _ in range(2):  # the ticket is left at 0: a second launch is the first
        ops.loss(d(pred), d(rows), d(up), d(down), d(k), d(hscale), t_end, 0.3, *got, out, done)
        for g, w, what in zip(got, want[:3], ("loss_per", "valid_per", "grad"), strict=True):
            assert_bitwise(g, w, what)  # the same float32 operations in the same order
        assert_parity(out, want[3], what="loss and valid share")
        assert int(done[0]) == 0
    # the totals in the launch's tail have the bits of the two one-block means they replace
    chain = cp.empty(2, np.float32)
    ops.total(got[0], chain[0:1], 1.0)
    ops.total(got[1], chain[1:2], 1.0 / B)
    assert_bitwise(out, chain, "the totals against regularizers.mean")
