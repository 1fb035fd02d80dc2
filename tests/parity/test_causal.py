"""Causal intervention on feature groups (cuda_src/causal.cu, cudarl/reference/causal.py)."""

import numpy as np
import pytest

from cudarl.auxiliary.causal import group_masks
from cudarl.reference import causal as ref
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison

NAMES = ("ret_1", "dow_sin", "dow_cos", "level_32", "volume")


def _x(rng, B, W, C):
    return rng.normal(size=(B, W * C)).astype(np.float32)


def test_group_masks_pick_the_named_columns_and_skip_empty_groups():
    kept, mask, mode = group_masks(NAMES[:3] + NAMES[4:], ("calendar", "level", "offset"))
    assert kept == ["calendar", "offset"]  # no level_* column
    assert mask.tolist() == [[0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]  # never the two position columns
    assert mode.tolist() == [ref.SWAP, ref.OFFSET]


def test_intervene_swaps_the_groups_columns_with_the_next_row_and_leaves_the_rest(rng):
    B, W = 4, 3
    _, mask, mode = group_masks(NAMES, ("calendar", "level", "offset"))
    C = mask.shape[1]
    x = _x(rng, B, W, C)
    for step, cols in ((0, [1, 2]), (1, [3])):
        out = ref.intervene(x, mask, mode, np.int64([step]), 0.5, W).reshape(B, W, C)
        v = x.reshape(B, W, C)
        other = [c for c in range(C) if c not in cols]
        assert np.array_equal(out[:, :, other], v[:, :, other])
        assert np.array_equal(out[:, :, cols], np.roll(v, -1, axis=0)[:, :, cols])
    out = ref.intervene(x, mask, mode, np.int64([5]), 0.5, W).reshape(B, W, C)  # 5 % 3 = 2: offset
    assert np.array_equal(out[:, :, :5], v[:, :, :5] + np.float32(0.5))
    assert np.array_equal(out[:, :, 5:], v[:, :, 5:])


def test_intervene_reads_the_sub_batchs_rows_and_swaps_within_them(rng):
    """``rows`` R of B: row r is batch row floor(r B / R) (auxgrad.spread), intervened on as if the sub-batch
    were gathered first; a swap takes the next row of the sub-batch, not of the batch."""
    from cudarl.reference.auxgrad import spread

    B, R, W = 10, 4, 3
    _, mask, mode = group_masks(NAMES, ("calendar", "level", "offset"))
    x = _x(rng, B, W, mask.shape[1])
    rows = spread(R, B)
    assert rows.tolist() == [0, 2, 5, 7]
    for step in (0, 2):  # swap, offset
        got = ref.intervene(x, mask, mode, np.int64([step]), 0.5, W, rows=R)
        assert got.shape == (R, x.shape[1])
        assert np.array_equal(got, ref.intervene(x[rows], mask, mode, np.int64([step]), 0.5, W))
    swapped = ref.intervene(x, mask, mode, np.int64([0]), 0.5, W, rows=R).reshape(R, W, -1)
    assert np.array_equal(swapped[0, :, 1], x.reshape(B, W, -1)[2, :, 1])  # row 0 takes row 1 of the sub-batch


def test_c51_penalty_gradient_matches_finite_differences(rng):
    B, A, K = 3, 2, 7
    x = rng.normal(size=(B, A, K))
    z = np.linspace(-2, 2, K)
    q = rng.normal(size=(B, A))
    _, grad = ref.penalty_c51(x, q, z, 0.7, np.float64)
    np.testing.assert_allclose(grad, finite_difference(lambda t: ref.loss_c51(t, q, z, 0.7), x), atol=1e-9, rtol=1e-6)


def test_quantile_penalty_gradient_matches_finite_differences(rng):
    th = rng.normal(size=(3, 5, 2))
    q = rng.normal(size=(3, 2))
    _, grad = ref.penalty_quantile(th, q, 1.3, np.float64)
    np.testing.assert_allclose(
        grad, finite_difference(lambda t: ref.loss_quantile(t, q, 1.3), th), atol=1e-9, rtol=1e-6
    )


def test_an_unchanged_q_costs_nothing_and_reduce_rotates_the_group():
    th = np.ones((2, 4, 3), np.float32)
    d, grad = ref.penalty_quantile(th, np.ones((2, 3), np.float32), 1.0)
    assert not d.any() and not grad.any()
    state, counter = np.zeros(5, np.float32), np.int64([4])
    ref.reduce(np.float32([[1, -3], [0, 0]]), state, counter, 2.0)  # group 4 % 3 = 1
    np.testing.assert_allclose(state, [2.0 * 10 / 4, 1, 0, 1.0, 0])
    assert counter[0] == 5


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B,W,step", [(1, 1, 0), (7, 16, 1), (512, 64, 2), (33, 5, 3)])
def test_gpu_intervene_is_exact(cp, rng, B, W, step):
    from cudarl.ops import causal as ops

    _, mask, mode = group_masks(NAMES, ("calendar", "level", "offset"))
    x = _x(rng, B, W, mask.shape[1])
    out = cp.empty(x.shape, np.float32)
    poison(out)
    counter = cp.asarray(np.int64([step]))
    ops.intervene(cp.asarray(x), out, cp.asarray(mask), cp.asarray(mode), counter, 0.25, W)
    assert_bitwise(out, ref.intervene(x, mask, mode, np.int64([step]), 0.25, W))


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (7, 2, 51), (512, 3, 51), (65, 5, 101)])
def test_gpu_penalty_c51_and_reduce_match_reference(cp, rng, B, A, K):
    from cudarl.ops import causal as ops

    x = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    z = np.linspace(-10, 10, K, dtype=np.float32)
    q = rng.normal(size=(B, A)).astype(np.float32)
    d, grad, state = cp.empty((B, A), np.float32), cp.empty((B, A, K), np.float32), cp.zeros(5, np.float32)
    poison(d)
    poison(grad)
    counter = cp.asarray(np.int64([7]))
    ops.penalty_c51(cp.asarray(x), cp.asarray(q), cp.asarray(z), 0.3, d, grad)
    ops.reduce(d, state, counter, 0.3)
    r_d, r_grad = ref.penalty_c51(x, q, z, 0.3)
    r_state, r_counter = np.zeros(5, np.float32), np.int64([7])
    ref.reduce(r_d, r_state, r_counter, 0.3)
    assert_parity(d, r_d, what="d")
    assert_parity(grad, r_grad, what="grad")
    assert_parity(state, r_state, what="state")
    assert int(counter.get()[0]) == 8


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,A", [(1, 8, 3), (33, 32, 3), (512, 64, 4), (5, 40, 7)])
def test_gpu_penalty_quantile_matches_reference(cp, rng, B, N, A):
    from cudarl.ops import causal as ops

    th = rng.normal(size=(B, N, A)).astype(np.float32)
    q = rng.normal(size=(B, A)).astype(np.float32)
    d, grad = cp.empty((B, A), np.float32), cp.empty((B, N, A), np.float32)
    poison(d)
    poison(grad)
    ops.penalty_quantile(cp.asarray(th), cp.asarray(q), 0.3, d, grad)
    r_d, r_grad = ref.penalty_quantile(th, q, 0.3)
    assert_parity(d, r_d, what="d")
    assert_parity(grad, r_grad, what="grad")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "Bx,R,W,step", [(512, 64, 64, 0), (512, 64, 1, 2), (7, 3, 16, 1), (33, 33, 5, 0), (5, 1, 2, 0)]
)
def test_gpu_intervene_over_a_sub_batch_is_exact(cp, rng, Bx, R, W, step):
    from cudarl.ops import causal as ops

    _, mask, mode = group_masks(NAMES, ("calendar", "level", "offset"))
    x = _x(rng, Bx, W, mask.shape[1])
    out = cp.empty((R, x.shape[1]), np.float32)
    poison(out)
    counter = cp.asarray(np.int64([step]))
    ops.intervene(cp.asarray(x), out, cp.asarray(mask), cp.asarray(mode), counter, 0.25, W)
    assert_bitwise(out, ref.intervene(x, mask, mode, np.int64([step]), 0.25, W, rows=R))


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise_and_replays_rotate_the_group(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import causal as ops

    B, W, A, K = 64, 8, 3, 51
    _, mask, mode = group_masks(NAMES, ("calendar", "level", "offset"))
    x = cp.asarray(_x(rng, B, W, mask.shape[1]))
    logits = cp.asarray(rng.normal(size=(B, A, K)).astype(np.float32))
    z, q = cp.asarray(np.linspace(-5, 5, K, dtype=np.float32)), cp.asarray(rng.normal(size=(B, A)).astype(np.float32))
    mask, mode = cp.asarray(mask), cp.asarray(mode)
    out, d, grad = cp.zeros(x.shape, np.float32), cp.zeros((B, A), np.float32), cp.zeros((B, A, K), np.float32)
    state, counter = cp.zeros(5, np.float32), cp.zeros(1, np.int64)

    def phase():
        ops.intervene(x, out, mask, mode, counter, 0.5, W)
        ops.penalty_c51(logits, q, z, 0.2, d, grad)
        ops.reduce(d, state, counter, 0.2)

    g = StepGraph("causal_parity", [("c", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    want = [a.get() for a in (out, d, grad, state)]
    g.capture()
    counter[...] = 0
    state[...] = 0
    for a in (out, d, grad):
        poison(a)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    for a, w in zip((out, d, grad, state), want, strict=True):
        assert_bitwise(a, w)
    g.replay()
    g.synchronize()
    assert int(counter.get()[0]) == 2 and state.get()[1] == 1.0  # the second replay's group
