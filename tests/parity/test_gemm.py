"""gemm family: the panel GEMMs against float64 NumPy and cuBLAS, repeatability, graphs, edges."""

import sys
from pathlib import Path

import numpy as np
import pytest

from cudarl.reference import gemm as ref
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, poison

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_gemm  # noqa: E402  (tools/bench_gemm.py's batched arm, smoke-tested on the CPU below)

# (M, N, K): the network's (512/1024/4096 x 256 x 256, the head's 204 columns) and ragged edges
SHAPES = [
    (1, 4, 4),
    (7, 36, 68),
    (33, 204, 256),
    (512, 256, 256),
    (1024, 204, 256),
    (1024, 256, 204),
    (4096, 256, 256),
    (100, 8, 800),
]


def test_reference_is_the_plain_product(rng):
    a, b = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    out = np.empty((5, 4), np.float32)
    ref.nn_bias_act(a, b, bias, out, 1)
    assert_bitwise(out, np.maximum(a @ b + bias, 0))
    ref.nn_bias_act(a, b, bias, out, 0)
    assert_bitwise(out, a @ b + bias)
    ref.nt(a, b.T.copy(), out)
    assert_bitwise(out, a @ b)
    with pytest.raises(ValueError, match="activation"):
        ref.nn_bias_act(a, b, bias, out, 2)


def _operands(cp, rng, M, N, K):
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    return a, b, bias, cp.asarray(a), cp.asarray(b), cp.asarray(bias)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("act", [0, 1])
def test_gpu_nn_bias_act_matches_float64(cp, rng, M, N, K, act):
    from cudarl.ops import gemm as ops

    a, b, bias, ga, gb, gbias = _operands(cp, rng, M, N, K)
    out = cp.empty((M, N), np.float32)
    poison(out)
    ops.nn_bias_act(ga, gb, gbias, out, act)
    want = np.empty((M, N))
    ref.nn_bias_act(a.astype(np.float64), b.astype(np.float64), bias.astype(np.float64), want, act)
    assert_parity(out, want.astype(np.float32), what=f"nn_bias_act act={act}")
    first = out.copy()
    poison(out)
    ops.nn_bias_act(ga, gb, gbias, out, act)
    assert_bitwise(out, first, what="a second launch")


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gpu_nt_matches_float64_and_cublas(cp, rng, M, N, K):
    from cudarl import blas
    from cudarl.ops import gemm as ops

    a, b, _, ga, gb, _ = _operands(cp, rng, M, N, K)
    bt = cp.ascontiguousarray(gb.T)
    out = cp.empty((M, N), np.float32)
    poison(out)
    ops.nt(ga, bt, out)
    want = np.empty((M, N))
    ref.nt(a.astype(np.float64), b.T.astype(np.float64), want)
    assert_parity(out, want.astype(np.float32), what="nt")
    cub = cp.empty((M, N), np.float32)
    blas.gemm(ga, bt, cub, trans_b=True)
    np.testing.assert_allclose(out.get(), cub.get(), rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.gpu
def test_gpu_gemm_graphed_equals_eager(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import gemm as ops

    _, _, _, ga, gb, gbias = _operands(cp, rng, 1024, 256, 256)
    bt = cp.ascontiguousarray(gb.T)
    y, dx = cp.empty((1024, 256), np.float32), cp.empty((1024, 256), np.float32)

    def step():
        ops.nn_bias_act(ga, gb, gbias, y, 1)
        ops.nt(y, bt, dx)

    g = StepGraph("gemm_parity", [("gemm", step)], xp=cp)
    g.run_eager()
    g.synchronize()
    want = {"y": y.get(), "dx": dx.get()}
    g.capture()
    assert_reruns_bitwise(g, {"y": y, "dx": dx}, want, ("graphed", "graphed"))


@pytest.mark.gpu
def test_gpu_launchers_refuse_what_the_kernels_cannot_take(cp):
    from cudarl.ops import gemm as ops

    a, b, bias, out = (cp.zeros(s, np.float32) for s in ((8, 66), (66, 8), (8,), (8, 8)))
    assert not ops.eligible(a, b, out, K=66, N=8)
    with pytest.raises(ValueError, match="multiples of 4"):
        ops.nn_bias_act(a, b, bias, out, 0)
    with pytest.raises(ValueError, match="shapes"):
        ops.nt(a, b, out)
    x = cp.zeros(8 * 64 + 1, np.float32)[1:].reshape(8, 64)  # 4-byte aligned only
    assert not ops.eligible(x, K=64, N=8)


# --- chain: the MLP's layers in one launch (clusters of 8 blocks a 32-row slab) -------------------
# (M, widths): the reference MLP and head at the train and acting batches, ragged rows, narrow layers,
# one layer, four layers, a layer of exactly 256 columns after one of 4
CHAINS = [
    (512, (64, 256, 256, 204)),
    (4096, (64, 256, 256, 204)),
    (1, (64, 256, 256, 204)),
    (33, (8, 36, 4)),
    (100, (256, 256)),
    (7, (4, 256, 12, 8, 256)),
]


def _chain_operands(xp, rng, M, widths, acts=None):
    x = rng.standard_normal((M, widths[0])).astype(np.float32)
    layers = []
    for i, (K, N) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        b = (0.1 * rng.standard_normal(N)).astype(np.float32)
        act = (1 if i < len(widths) - 2 else 0) if acts is None else acts[i]
        layers.append((xp.asarray(w), xp.asarray(b), xp.empty((M, N), np.float32), act))
    return xp.asarray(x), layers


def test_reference_chain_is_nn_bias_act_layer_by_layer(rng):
    x, layers = _chain_operands(np, rng, 9, (8, 12, 4, 8))
    ref.chain(x, layers)
    h = x
    for w, b, y, act in layers:
        want = np.empty_like(y)
        ref.nn_bias_act(h, w, b, want, act)
        assert_bitwise(y, want)
        h = y


@pytest.mark.gpu
@pytest.mark.parametrize("M,widths", CHAINS, ids=[f"{m}x{'-'.join(map(str, w))}" for m, w in CHAINS])
def test_gpu_chain_is_nn_bias_act_layer_by_layer_bitwise(cp, rng, M, widths):
    """Every layer's output is bit for bit the panel nn_bias_act of the layer's input (the launch's
    tiles are nn_bias_act's), and within float32 rounding of the float64 twin."""
    from cudarl.ops import gemm as ops

    x, layers = _chain_operands(cp, rng, M, widths)
    assert ops.chain_eligible(x, layers)
    for *_, y, _ in layers:
        poison(y)
    ops.chain(x, layers)
    h = x
    want64 = [np.empty((M, w_.shape[1])) for w_, *_ in layers]
    ref.chain(
        x.get().astype(np.float64),
        [
            (w.get().astype(np.float64), b.get().astype(np.float64), o, a)
            for (w, b, _, a), o in zip(layers, want64, strict=True)
        ],
    )
    for i, ((w, b, y, act), w64) in enumerate(zip(layers, want64, strict=True)):
        one = cp.empty_like(y)
        poison(one)
        ops.nn_bias_act(h, w, b, one, act)
        assert_bitwise(y, one, what=f"layer {i} vs nn_bias_act")
        assert_parity(y, w64.astype(np.float32), what=f"layer {i} vs float64")
        h = y


@pytest.mark.gpu
def test_gpu_chain_takes_any_observation_width_as_zero_padded_columns(cp, rng):
    """An observation of 66 columns in rows of 70 floats (a float at a time): the same bits as the chain
    over those columns padded with zeros to 68 (and the first weight with zero rows), the vectorised path;
    and a row's outputs do not depend on the other rows (1 row = that row of 517)."""
    from cudarl.ops import gemm as ops

    M = 517
    wide = cp.asarray(rng.standard_normal((M, 70)).astype(np.float32))
    x = wide[:, 1:67]  # row pitch 70, 4-byte aligned
    _, layers = _chain_operands(cp, rng, M, (66, 256, 256, 204))
    assert ops.chain_eligible(x, layers) and not ops.eligible(x, K=66, N=256)
    ops.chain(x, layers)
    got = [y.copy() for *_, y, _ in layers]
    xp68 = cp.zeros((M, 68), np.float32)
    xp68[:, :66] = x
    w0, b0, _, a0 = layers[0]
    w68 = cp.zeros((68, 256), np.float32)
    w68[:66] = w0
    ops.chain(xp68, [(w68, b0, layers[0][2], a0), *layers[1:]])
    for i, (g, (*_, y, _)) in enumerate(zip(got, layers, strict=True)):
        assert_bitwise(g, y, what=f"layer {i}: 66 columns vs 68 zero-padded")
    h = x.get().astype(np.float64)
    for w, b, _, act in layers:
        out = np.empty((M, w.shape[1]))
        ref.nn_bias_act(h, w.get().astype(np.float64), b.get().astype(np.float64), out, act)
        h = out
    assert_parity(got[-1], h.astype(np.float32), what="66 columns vs float64")
    one = [(w, b, cp.empty((1, w.shape[1]), np.float32), a) for w, b, _, a in layers]
    ops.chain(x[200:201], one)
    assert_bitwise(one[-1][2], got[-1][200:201], what="row 200 alone vs in the batch")


@pytest.mark.gpu
def test_gpu_chain_graphed_equals_eager(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import gemm as ops

    x, layers = _chain_operands(cp, rng, 512, (64, 256, 256, 204))
    g = StepGraph("gemm_chain_parity", [("chain", lambda: ops.chain(x, layers))], xp=cp)
    g.run_eager()
    g.synchronize()
    outs = {f"y{i}": y for i, (*_, y, _) in enumerate(layers)}
    want = {k: v.get() for k, v in outs.items()}
    g.capture()
    assert_reruns_bitwise(g, outs, want, ("graphed", "graphed", "eager"))


@pytest.mark.gpu
def test_gpu_chain_refuses_what_it_cannot_take(cp, rng):
    from cudarl.ops import gemm as ops

    x, layers = _chain_operands(cp, rng, 8, (64, 256, 256, 204))
    assert not ops.chain_eligible(x, layers * 2)  # 6 layers, and they do not chain by shape
    assert not ops.chain_eligible(x, [])
    _, wide = _chain_operands(cp, rng, 8, (64, 260))  # wider than 8 tiles of 32
    assert not ops.chain_eligible(x, wide)
    _, odd = _chain_operands(cp, rng, 8, (64, 6))  # N not a multiple of 4
    assert not ops.chain_eligible(x, odd)
    assert not ops.chain_eligible(x, layers[1:])  # the first weight does not take x's 64 columns
    w0, b0, y0, a0 = layers[0]
    assert not ops.chain_eligible(y0[:, :64], [(w0, b0, y0, a0)])  # an output over the input it reads
    assert not ops.chain_eligible(x, [(w0, b0, y0, a0), (*layers[1][:2], y0, 1)])  # an output over another
    with pytest.raises(ValueError, match="gemm.chain: needs"):
        ops.chain(x, [])
    with pytest.raises(ValueError, match="gemm.chain: activation codes"):
        ops.chain(x, [(*layers[0][:3], 2)])
    with pytest.raises(ValueError, match="gemm.chain: needs"):
        ops.chain(x, wide)


# --- chain_backward: the backward's dx chain in one launch (the forward chain's clusters) -------------
# (M, widths, acts): widths (n_top, k_0, k_1, ...): the reference head's 204 columns down through the
# 256-wide encoder at the train and acting batches and one row, narrow ragged steps, and four steps with
# an unmasked one (act 0) and a 256-wide one after one of 4
CHAINS_BWD = [
    (512, (204, 256, 256), (1, 1)),
    (4096, (204, 256, 256), (1, 1)),
    (1, (204, 256, 256), (1, 1)),
    (33, (4, 36, 8), (1, 1)),
    (7, (12, 8, 4, 256, 16), (1, 0, 1, 1)),
]


def _chain_backward_operands(xp, rng, M, widths, acts):
    """d [M, n_top] and the steps ``(w [k_i, n_i], y [M, k_i], dx [M, k_i], act_i)``; y a ReLU output (about
    half exact zeros, which the mask y > 0 drops)."""
    d = rng.standard_normal((M, widths[0])).astype(np.float32)
    layers = []
    for n, k, act in zip(widths[:-1], widths[1:], acts, strict=True):
        w = (rng.standard_normal((k, n)) / np.sqrt(n)).astype(np.float32)
        y = np.maximum(rng.standard_normal((M, k)), 0).astype(np.float32)
        layers.append((xp.asarray(w), xp.asarray(y), xp.empty((M, k), np.float32), act))
    return xp.asarray(d), layers


def test_reference_chain_backward_is_nt_then_the_mask_step_by_step(rng):
    from cudarl.reference import nn as ref_nn

    d, layers = _chain_backward_operands(np, rng, 9, (8, 12, 4, 8), (1, 0, 1))
    ref.chain_backward(d, layers)
    h = d
    for w, y, dx, act in layers:
        want = np.empty_like(dx)
        ref.nt(h, w, want)
        assert_bitwise(dx, np.where(y > 0, want, 0) if act == 1 else want)
        ref_nn.act_backward(want, y, want, act)
        assert_bitwise(dx, want)
        h = dx
    with pytest.raises(ValueError, match="activation"):
        ref.chain_backward(d, [(*layers[0][:3], 2)])


@pytest.mark.gpu
@pytest.mark.parametrize("M,widths,acts", CHAINS_BWD, ids=[f"{m}x{'-'.join(map(str, w))}" for m, w, _ in CHAINS_BWD])
def test_gpu_chain_backward_is_nt_then_act_backward_step_by_step_bitwise(cp, rng, M, widths, acts):
    """Every step's dx is bit for bit the panel nt of the step's input then nn.act_backward (in place, as the
    layers run it), and within float32 rounding of the float64 twin."""
    from cudarl.ops import gemm as ops
    from cudarl.ops import nn as nn_ops

    d, layers = _chain_backward_operands(cp, rng, M, widths, acts)
    assert ops.chain_backward_eligible(d, layers)
    for _, _, dx, _ in layers:
        poison(dx)
    ops.chain_backward(d, layers)
    want64 = [np.empty(dx.shape) for _, _, dx, _ in layers]
    ref.chain_backward(
        d.get().astype(np.float64),
        [
            (w.get().astype(np.float64), y.get().astype(np.float64), o, a)
            for (w, y, _, a), o in zip(layers, want64, strict=True)
        ],
    )
    h = d
    for i, ((w, y, dx, act), w64) in enumerate(zip(layers, want64, strict=True)):
        one = cp.empty_like(dx)
        poison(one)
        ops.nt(h, w, one)
        nn_ops.act_backward(one, y, one, act)
        assert_bitwise(dx, one, what=f"step {i} vs nt then act_backward")
        assert_parity(dx, w64.astype(np.float32), what=f"step {i} vs float64")
        h = dx


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 33, 512])
def test_gpu_chain_backward_accumulate_adds_the_old_dx_before_the_mask(cp, rng, M):
    """accumulate: the first step is nt's product plus dx_0's old values (an elementwise float add), then the
    mask, bit for bit; the later steps as without it; and the twin agrees within float32 rounding."""
    from cudarl.ops import gemm as ops
    from cudarl.ops import nn as nn_ops

    d, layers = _chain_backward_operands(cp, rng, M, (204, 256, 256), (1, 1))
    old = cp.asarray(rng.standard_normal(layers[0][2].shape).astype(np.float32))
    layers[0][2][...] = old
    ops.chain_backward(d, layers, accumulate=True)
    w0, y0, dx0, a0 = layers[0]
    one = cp.empty_like(dx0)
    ops.nt(d, w0, one)
    one += old
    nn_ops.act_backward(one, y0, one, a0)
    assert_bitwise(dx0, one, what="step 0: nt + old, then the mask")
    two = cp.empty_like(layers[1][2])
    ops.nt(dx0, layers[1][0], two)
    nn_ops.act_backward(two, layers[1][1], two, layers[1][3])
    assert_bitwise(layers[1][2], two, what="step 1 as without accumulate")
    host = [
        (w.get(), y.get(), o, a)
        for (w, y, _, a), o in zip(layers, [old.get(), np.empty(two.shape, np.float32)], strict=True)
    ]
    ref.chain_backward(d.get(), host, accumulate=True)
    for i, ((*_, dx, _), (*_, o, _)) in enumerate(zip(layers, host, strict=True)):
        assert_parity(dx, o, what=f"step {i} vs the twin")


@pytest.mark.gpu
def test_gpu_chain_backward_graphed_equals_eager(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import gemm as ops

    d, layers = _chain_backward_operands(cp, rng, 512, (204, 256, 256), (1, 1))
    g = StepGraph("gemm_chain_backward_parity", [("chain_backward", lambda: ops.chain_backward(d, layers))], xp=cp)
    g.run_eager()
    g.synchronize()
    outs = {f"dx{i}": dx for i, (_, _, dx, _) in enumerate(layers)}
    want = {k: v.get() for k, v in outs.items()}
    g.capture()
    assert_reruns_bitwise(g, outs, want, ("graphed", "graphed", "eager"))


@pytest.mark.gpu
def test_gpu_chain_backward_refuses_what_it_cannot_take(cp, rng):
    from cudarl.ops import gemm as ops

    d, layers = _chain_backward_operands(cp, rng, 8, (204, 256, 256), (1, 1))
    assert ops.chain_backward_eligible(d, layers)
    assert not ops.chain_backward_eligible(d, layers * 3)  # 6 steps, and they do not chain by shape
    assert not ops.chain_backward_eligible(d, [])
    assert not ops.chain_backward_eligible(d, layers[1:])  # the first weight does not take d's 204 columns
    _, wide = _chain_backward_operands(cp, rng, 8, (204, 260), (1,))  # wider than 8 tiles of 32
    assert not ops.chain_backward_eligible(d, wide)
    d6, odd = _chain_backward_operands(cp, rng, 8, (6, 8), (1,))  # n_top not a multiple of 4
    assert not ops.chain_backward_eligible(d6, odd)
    _, odd = _chain_backward_operands(cp, rng, 8, (204, 6), (1,))  # k not a multiple of 4
    assert not ops.chain_backward_eligible(d, odd)
    w0, y0, dx0, a0 = layers[0]
    assert not ops.chain_backward_eligible(d, [(w0, y0, y0, a0)])  # dx over the mask it reads
    assert not ops.chain_backward_eligible(d, [(w0, y0, dx0, a0), (layers[1][0], dx0, dx0, 1)])  # dx over dx
    shifted = cp.zeros(8 * 256 + 1, np.float32)[1:].reshape(8, 256)  # 4-byte aligned only
    assert not ops.chain_backward_eligible(d, [(w0, y0, shifted, a0)])
    with pytest.raises(ValueError, match="gemm.chain_backward: activation codes"):
        ops.chain_backward(d, [(w0, y0, dx0, 2)])
    with pytest.raises(ValueError, match="gemm.chain_backward: needs"):
        ops.chain_backward(d, wide)


# --- the chain's member axis: P networks' chains in one launch (a population, cudarl/nn/stacked.py) -------
def _stacked(xp, P: int, shape: tuple, pad: int = 0, fill=None):
    """A ``[P, *shape]`` float32 view whose members are ``prod(shape) + pad`` floats apart (a stacked
    buffer's layout: :func:`cudarl.nn.params.stacked_zeros` pads each member to 64 floats)."""
    size = int(np.prod(shape))
    flat = xp.zeros((P, size + pad), np.float32)
    view = flat[:, :size].reshape((P, *shape))
    if fill is not None:
        view[...] = xp.asarray(fill)
    return view


def _chain_members(xp, rng, P, M, widths, x_pad=0):
    """x ``[P, M, K0]`` and the layers ``(w [P, K, N], b [P, N], y [P, M, N], act)``, every weight and bias in
    one ``[P, ...]`` parameter stack (one member stride) as StackedQNetwork's views are, outputs padded apart."""
    sizes = [K * N + N for K, N in zip(widths[:-1], widths[1:], strict=True)]
    params = xp.asarray((rng.standard_normal((P, sum(sizes) + 4)) / 8).astype(np.float32))
    x = _stacked(xp, P, (M, widths[0]), pad=x_pad, fill=rng.standard_normal((P, M, widths[0])))
    layers, off = [], 0
    for i, (K, N) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        w = params[:, off : off + K * N].reshape(P, K, N)
        b = params[:, off + K * N : off + K * N + N]
        off += K * N + N
        layers.append((w, b, _stacked(xp, P, (M, N), pad=64), 1 if i < len(widths) - 2 else 0))
    return x, layers


def _chain_backward_members(xp, rng, P, M, widths, acts):
    """d ``[P, M, n_top]`` and the steps ``(w [P, k, n], y [P, M, k], dx [P, M, k], act)``, the weights one stack."""
    d = _stacked(xp, P, (M, widths[0]), pad=12, fill=rng.standard_normal((P, M, widths[0])))
    sizes = [n * k for n, k in zip(widths[:-1], widths[1:], strict=True)]
    params = xp.asarray((rng.standard_normal((P, sum(sizes))) / 8).astype(np.float32))
    layers, off = [], 0
    for n, k, act in zip(widths[:-1], widths[1:], acts, strict=True):
        w = params[:, off : off + k * n].reshape(P, k, n)
        off += k * n
        y = _stacked(xp, P, (M, k), pad=4, fill=np.maximum(rng.standard_normal((P, M, k)), 0))
        layers.append((w, y, _stacked(xp, P, (M, k), pad=4), act))
    return d, layers


@pytest.mark.parametrize("P", [1, 3])
def test_reference_chain_members_are_the_single_chain(rng, P):
    """The twins with a member axis: member i of the outputs is the single twin over the operands' [i], bit
    for bit (forward, backward, backward with accumulate); an operand without the axis is refused."""
    x, layers = _chain_members(np, rng, P, 9, (6, 12, 4, 8))
    ref.chain(x, layers)
    for i in range(P):
        one = [(w[i], b[i], np.full_like(y[i], np.nan), a) for w, b, y, a in layers]
        ref.chain(x[i], one)
        for k, ((*_, y, _), (*_, o, _)) in enumerate(zip(layers, one, strict=True)):
            assert_bitwise(y[i], o, what=f"member {i}, layer {k}")
    for accumulate in (False, True):
        d, steps = _chain_backward_members(np, rng, P, 9, (8, 12, 4, 8), (1, 0, 1))
        old = [dx.copy() for *_, dx, _ in steps]
        steps[0][2][...] = rng.standard_normal(steps[0][2].shape)
        old[0] = steps[0][2].copy()
        ref.chain_backward(d, steps, accumulate)
        for i in range(P):
            one = [(w[i], y[i], o[i].copy(), a) for (w, y, _, a), o in zip(steps, old, strict=True)]
            ref.chain_backward(d[i], one, accumulate)
            for k, ((*_, dx, _), (*_, o, _)) in enumerate(zip(steps, one, strict=True)):
                assert_bitwise(dx[i], o, what=f"member {i}, step {k}, accumulate {accumulate}")
    w0, b0, y0, a0 = layers[0]
    with pytest.raises(ValueError, match="gemm.chain: layer 0's operands .* lack the member axis"):
        ref.chain(x, [(w0[0], b0, y0, a0)])
    with pytest.raises(ValueError, match="gemm.chain_backward: layer 0's operands"):
        ref.chain_backward(d, [(steps[0][0], steps[0][1][0], steps[0][2], 1)])


def _capture_launch(monkeypatch):
    """ops.gemm's launches recorded (name -> argument by the kernel's C parameter names), on a device of
    compute capability 9.0: the launchers' argument layout checked on the CPU with NumPy operands."""
    from cudarl import signatures
    from cudarl.ops import gemm as ops

    seen = []

    def launch(family, op, grid, block, args, shared_mem=0):
        names = [n for n, _, _ in signatures.of(family, op).params]
        assert len(args) == len(names), f"{op}: {len(args)} arguments for {names}"
        seen.append((op, grid, dict(zip(names, args, strict=True))))

    monkeypatch.setattr(ops, "launch", launch)
    monkeypatch.setattr(ops, "_compute_capability", lambda: 90)
    return ops, seen


@pytest.mark.parametrize("P", [1, 5])
def test_chain_launchers_pass_member_zero_and_the_member_strides(rng, monkeypatch, P):
    """The launch of P members: grid (8, ceil(M / 32), P); member 0's pointers; x's member stride, one stride
    for every weight and bias, each output's; the widths and activations per slot, the unused slots' stride,
    width and act 0. A single call (no member axis) passes the strides 0 and a grid z of 1."""
    ops, seen = _capture_launch(monkeypatch)
    M = 40
    x, layers = _chain_members(np, rng, P, M, (6, 12, 8), x_pad=3)
    ops.chain(x, layers)
    d, steps = _chain_backward_members(np, rng, P, M, (8, 12, 4), (1, 0))
    ops.chain_backward(d, steps, accumulate=True)
    ops.chain(x[0], [(w[0], b[0], y[0], a) for w, b, y, a in layers])
    (_, grid, a), (_, grid_b, b), (_, grid_1, one) = seen
    apart = (lambda t: t.strides[0] // 4) if P > 1 else (lambda t: 0)
    assert grid == grid_b == (8, 2, P) and grid_1 == (8, 2, 1)
    assert (a["sx"], a["sp"], a["M"], a["K0"], a["ldx"], a["layers"]) == (apart(x), apart(layers[0][0]), M, 6, 6, 2)
    assert a["x"].ctypes.data == x.ctypes.data and a["w1"].ctypes.data == layers[1][0].ctypes.data
    assert [(a[f"sy{i}"], a[f"n{i}"], a[f"act{i}"]) for i in range(4)] == [
        (apart(layers[0][2]), 12, 1), (apart(layers[1][2]), 8, 0), (0, 0, 0), (0, 0, 0)
    ]  # fmt: skip
    assert (b["sd"], b["sp"], b["n_top"], b["acc_top"], b["layers"]) == (apart(d), apart(steps[0][0]), 8, 1, 2)
    assert [(b[f"s{i}"], b[f"k{i}"], b[f"act{i}"]) for i in range(4)] == [
        (apart(steps[0][2]), 12, 1), (apart(steps[1][2]), 4, 0), (0, 0, 0), (0, 0, 0)
    ]  # fmt: skip
    assert (one["sx"], one["sp"], one["sy0"]) == (0, 0, 0)


def test_chain_launchers_say_what_they_refuse(rng, monkeypatch):
    """The member layouts the kernels cannot take, each named: operands with and without the member axis,
    weights and biases of several member strides (one stacked buffer has one), members of an output
    overlapping (stride 0), y and dx of a step apart by other strides, a member stride that breaks the
    16-byte alignment, a device without clusters."""
    ops, _ = _capture_launch(monkeypatch)
    P, M = 3, 8
    x, layers = _chain_members(np, rng, P, M, (6, 12, 8))
    d, steps = _chain_backward_members(np, rng, P, M, (8, 12, 4), (1, 0))
    assert ops._chain_refusal(x, layers, 90) is None and ops._chain_backward_refusal(d, steps, 90) is None
    w0, b0, y0, a0 = layers[0]
    bias_apart = _stacked(np, P, (12,), pad=4, fill=b0)
    shared = np.broadcast_to(np.zeros((M, 12), np.float32), (P, M, 12))  # every member the same rows
    odd = _stacked(np, P, (M, 12), pad=2)  # members 8 bytes out of 16-byte step
    refused = {
        "chain": [
            ((x[0], layers), "layer 0's operands of other dimensions"),
            ((x, [(w0, bias_apart, y0, a0), layers[1]]), "weights of several member strides"),
            ((x, [(w0, b0, shared, a0), layers[1]]), "overlapping another operand, or its own other members"),
            ((x, [(w0, b0, odd, a0), layers[1]]), "layer 0's operands not float32, dense and 16-byte aligned"),
            ((x, [(w0[:, :4], b0, y0, a0)]), r"layer 0's w \(3, 4, 12\)"),
        ],
        "chain_backward": [
            ((d, [(steps[0][0], steps[0][1], _stacked(np, P, (M, 12), pad=8), 1)]), "y and dx of member strides"),
            ((d, [(steps[0][0], steps[0][1], steps[0][1], 1)]), "overlapping another operand"),
        ],
    }
    for op, cases in refused.items():
        for args, why in cases:
            assert not getattr(ops, f"{op}_eligible")(*args), why
            with pytest.raises(ValueError, match=f"gemm.{op}: needs .*; got .*{why}"):
                getattr(ops, op)(*args)
    assert ops._chain_refusal(x, layers, 80) == "a device of compute capability 8.0"


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 8])
@pytest.mark.parametrize("M,widths", [(512, (66, 256, 256, 204)), (7, (8, 36, 4)), (33, (64, 256, 12, 8, 256))])
def test_gpu_chain_members_are_each_single_chain_bitwise(cp, rng, P, M, widths):
    """P members in one launch (grid z), their operands a stacked network's layouts (x member-strided with a
    padded row pitch at 66 columns, the parameters one stack, the outputs padded apart): member i of every
    output is bit for bit the single launch over its operands [i]; forward, then the backward's dx chain
    over those outputs (with accumulate too)."""
    from cudarl.ops import gemm as ops

    x, layers = _chain_members(cp, rng, P, M, widths, x_pad=2 if widths[0] % 4 else 0)
    assert ops.chain_eligible(x, layers)
    for *_, y, _ in layers:
        poison(y)
    ops.chain(x, layers)
    for i in range(P):
        one = [(w[i], b[i], cp.empty_like(y[i]), a) for w, b, y, a in layers]
        ops.chain(x[i], one)
        for k, ((*_, y, _), (*_, o, _)) in enumerate(zip(layers, one, strict=True)):
            assert_bitwise(y[i], o, what=f"P = {P}, member {i}, layer {k}")
    # the dx chain down the same layers: d the top layer's output's shape, y the layers' own outputs
    d = _stacked(cp, P, (M, widths[-1]), pad=8, fill=rng.standard_normal((P, M, widths[-1])))
    steps = [
        (layers[k][0], layers[k - 1][2], _stacked(cp, P, layers[k - 1][2].shape[1:], pad=64), 1)
        for k in range(len(layers) - 1, 0, -1)
    ]
    for accumulate in (False, True):
        steps[0][2][...] = cp.asarray(rng.standard_normal(steps[0][2].shape).astype(np.float32))
        old = steps[0][2].copy()
        for *_, dx, _ in steps[1:]:
            poison(dx)
        ops.chain_backward(d, steps, accumulate=accumulate)
        for i in range(P):
            one = [(w[i], y[i], (old[i] if k == 0 else cp.empty_like(dx[i])).copy(), a) for k, (w, y, dx, a) in
                   enumerate(steps)]  # fmt: skip
            ops.chain_backward(d[i], one, accumulate=accumulate)
            for k, ((*_, dx, _), (*_, o, _)) in enumerate(zip(steps, one, strict=True)):
                assert_bitwise(dx[i], o, what=f"P = {P}, member {i}, step {k}, accumulate {accumulate}")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 8])
def test_gpu_chain_members_graphed_equal_eager(cp, rng, P):
    from cudarl.graph import StepGraph
    from cudarl.ops import gemm as ops

    x, layers = _chain_members(cp, rng, P, 512, (66, 256, 256, 204), x_pad=2)
    d = _stacked(cp, P, (512, 204), pad=8, fill=rng.standard_normal((P, 512, 204)))
    steps = [(layers[2][0], layers[1][2], _stacked(cp, P, (512, 256), pad=64), 1),
             (layers[1][0], layers[0][2], _stacked(cp, P, (512, 256), pad=64), 1)]  # fmt: skip

    def step():
        ops.chain(x, layers)
        ops.chain_backward(d, steps)

    g = StepGraph(f"gemm_chain_members_{P}", [("chain", step)], xp=cp)
    g.run_eager()
    g.synchronize()
    outs = {**{f"y{i}": y for i, (*_, y, _) in enumerate(layers)}, **{f"dx{i}": s[2] for i, s in enumerate(steps)}}
    want = {k: v.get() for k, v in outs.items()}
    g.capture()
    assert_reruns_bitwise(g, outs, want, ("graphed", "graphed", "eager"))


# --- tools/bench_gemm.py's batched arm (issue 23): smoke on the CPU ---------------------------------
def test_bench_gemm_batched_arm_operands_on_numpy(rng):
    """The batched arm's cases on the NumPy backend (P = 2): every step GEMM's stacked operands fit
    gemm_lt_batched and gemm_lt, and the batch equals its singles bit for bit, as the GPU arm reports."""
    from cudarl import blas

    for name, M, N, K, ta, tb, act, has_bias in bench_gemm.STEP_GEMMS:
        a, b, bias, out_b, out_s = bench_gemm.batched_operands(np, rng, 2, M, N, K, ta, tb, has_bias)
        if has_bias:
            assert bias.strides[0] % 256 == 0, f"{name}: members' biases must keep 256-byte alignment"
        blas.gemm_lt_batched(a, b, out_b, bias=bias, act=act, trans_a=ta, trans_b=tb)
        for i in range(2):
            b_i = None if bias is None else bias[i]
            blas.gemm_lt(a[i], b[i], out_s[i], bias=b_i, act=act, trans_a=ta, trans_b=tb, split_k=False)
        assert_bitwise(out_b, out_s, what=name)


def test_bench_gemm_skips_cleanly_without_a_gpu(tmp_path):
    """Without a GPU the bench says why and writes the skip only to an explicit --out."""
    import json
    import subprocess
    import sys

    from cudarl.testing import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is here: the bench would run (tools/gpu_check.sh runs it)")
    out = tmp_path / "bench_gemm.json"
    done = subprocess.run(
        [sys.executable, bench_gemm.__file__, "--arms", "batched", "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "skipping:" in done.stdout
    assert json.loads(out.read_text())["rows"][0]["metric"] == "skipped"
