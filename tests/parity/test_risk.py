"""The risk loss (agent.aux "risk"): realised volatility and drawdown by hand, the gradient by finite
differences, the mask at the split end; the kernel against the twin on the GPU."""

import numpy as np
import pytest
from test_horizons import market

from cudarl.reference import horizons as href
from cudarl.reference import risk as ref
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison


def run(pred, rows, up, down, k, t_end, weight=1.0, inv_sigma=50.0):
    B = pred.shape[0]
    per, valid, grad, out = (
        np.zeros(B, pred.dtype),
        np.zeros(B, np.float32),
        np.zeros_like(pred),
        np.zeros(2, pred.dtype),
    )
    ref.loss(pred, rows, up, down, k, t_end, inv_sigma, weight, per, valid, grad, out)
    return per, valid, grad, out


def test_hand_case_volatility_and_drawdown():
    # log returns 0.1, -0.3, 0.1, -0.05: running sums .1 -.2 -.1 -.15, peak .1: drawdown .3
    x = np.float64([[0.1, -0.3, 0.1, -0.05]])
    ss, dd = ref.targets(x)
    np.testing.assert_allclose(ss, [0.01 + 0.09 + 0.01 + 0.0025])
    np.testing.assert_allclose(dd, [0.3])
    ss, dd = ref.targets(np.float64([[-0.1, -0.1]]))  # falls from the start (peak 0): drawdown .2
    np.testing.assert_allclose(dd, [0.2])
    ret = np.expm1(np.float64([0.1, -0.3, 0.1, -0.05, 0, 0, 0])).astype(np.float32)
    up, down = href.future_log_returns(ret)
    rows = np.float32([[0, 0, 0, 0], [0, 1, 0, 0], [2, 0, 0, 0]])
    per, valid, grad, out = run(np.zeros((3, 2)), rows, up, down, 4, t_end=7, inv_sigma=1.0)
    vol = np.sqrt((0.01 + 0.09 + 0.01 + 0.0025) / 4)
    np.testing.assert_allclose(grad[0], [-2 * vol / 3, -2 * 0.3 / 2 / 3], rtol=1e-5)
    # the mirror row's path is log(1 - ret): its drawdown is the fall after the first bar's loss
    y = np.log(1 - ret[:4].astype(np.float64))
    c = np.cumsum(y)
    np.testing.assert_allclose(-grad[1, 1] * 3 / 2, np.max(np.maximum.accumulate(np.maximum(c, 0)) - c) / 2, rtol=1e-5)
    np.testing.assert_allclose(valid, [1, 1, 0])  # t = 2: bar 2 + 4 + 1 = 7 is the split end
    np.testing.assert_array_equal(grad[2], [0, 0])


def test_nothing_past_the_split_end_is_read(rng):
    T, t_end = 300, 240
    _, up, down, rows = market(rng, T, 41, t_end)
    up[t_end - 2 :] = np.nan
    down[t_end - 2 :] = np.nan
    per, valid, grad, out = run(rng.normal(size=(41, 2)).astype(np.float32), rows, up, down, 16, t_end)
    assert np.all(np.isfinite(per)) and np.all(np.isfinite(grad)) and np.all(np.isfinite(out))
    assert 0 < out[1] < 1


def test_gradient_matches_finite_differences(rng):
    _, up, down, rows = market(rng, 200, 9, 180)
    pred = rng.normal(size=(9, 2))
    _, _, grad, _ = run(pred, rows, up, down, 12, 180, weight=1.3)
    fd = finite_difference(lambda p: run(p, rows, up, down, 12, 180, weight=1.3)[3][0], pred)
    np.testing.assert_allclose(grad, fd, atol=1e-9, rtol=1e-6)
    assert np.any(grad != 0)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B,k,T", [(1, 1, 50), (37, 16, 400), (512, 64, 3000), (1025, 8, 3000)])
def test_gpu_risk_loss_matches_reference(cp, rng, B, k, T):
    from cudarl.ops import horizons
    from cudarl.ops import risk as ops

    t_end = T - 5
    _, up, down, rows = market(rng, T, B, t_end)
    up[t_end - 2 :] = np.nan  # outside the split: a read would poison the outputs
    down[t_end - 2 :] = np.nan
    pred = rng.normal(size=(B, 2)).astype(np.float32)
    want = run(pred, rows, up, down, k, t_end, weight=0.4)
    got = [cp.empty(B, np.float32), cp.empty(B, np.float32), cp.empty((B, 2), np.float32)]
    out = cp.empty(2, np.float32)
    for a in (*got, out):
        poison(a)
    d = cp.asarray
    done = cp.zeros(1, np.uint32)
    for _ in range(2):  # the ticket is left at 0: a second launch is the first
        ops.loss(d(pred), d(rows), d(up), d(down), k, t_end, 50.0, 0.4, *got, out, done)
        for g, w, what in zip(got, want[:3], ("loss_per", "valid_per", "grad"), strict=True):
            assert_bitwise(g, w, what)
        assert_parity(out, want[3], what="loss and valid share")
        assert int(done[0]) == 0
    # the totals in the launch's tail have the bits of the two one-block means they replace
    chain = cp.empty(2, np.float32)
    horizons.total(got[0], chain[0:1], 1.0)
    horizons.total(got[1], chain[1:2], 1.0 / B)
    assert_bitwise(out, chain, "the totals against regularizers.mean")
