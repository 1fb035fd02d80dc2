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


def test_reference_nt_act_is_nt_then_the_activations_backward(rng):
    """The twin of the dx GEMM with the layer below's activation backward in its epilogue: the ReLU's mask
    (0 where y <= 0) and the sigmoid's y (1 - y) on nt's product."""
    a, bt = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    y = np.maximum(rng.standard_normal((6, 4)), 0).astype(np.float32)
    prod, out = np.empty((6, 4), np.float32), np.empty((6, 4), np.float32)
    ref.nt(a, bt, prod)
    ref.nt_act(a, bt, y, out, 1)
    np.testing.assert_array_equal(out, np.where(y > 0, prod, np.float32(0)))
    s = np.float32(1) / (np.float32(1) + np.exp(-rng.standard_normal((6, 4)).astype(np.float32)))
    ref.nt_act(a, bt, s, out, 2)
    np.testing.assert_array_equal(out, prod * (s * (np.float32(1) - s)))
    old = rng.standard_normal((6, 4)).astype(np.float32)  # accumulate: the product added onto out, then the mask
    out[...] = old
    ref.nt_act(a, bt, y, out, 1, accumulate=True)
    np.testing.assert_array_equal(out, np.where(y > 0, old + prod, np.float32(0)))


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(7, 36, 68), (512, 256, 256), (512, 256, 204), (1024, 256, 204)])
@pytest.mark.parametrize("act", [1, 2])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gpu_nt_act_is_nt_then_act_backward_bitwise(cp, rng, M, N, K, act, accumulate):
    """One launch of nt_act gives the bits of nt then nn's act_backward (the two launches it replaces; with
    ``accumulate``, nt, the add onto out's values, then act_backward: the Q head's dx onto the extra heads' sum)
    and the twin's to float32 rounding."""
    from cudarl.ops import gemm as ops
    from cudarl.ops import nn as nn_ops

    a, b, _, ga, gb, _ = _operands(cp, rng, M, N, K)
    bt = cp.ascontiguousarray(gb.T)
    z = rng.standard_normal((M, N)).astype(np.float32)
    y = np.maximum(z, 0) if act == 1 else 1 / (1 + np.exp(-z))
    gy = cp.asarray(y.astype(np.float32))
    old = rng.standard_normal((M, N)).astype(np.float32)
    out, two = cp.empty((M, N), np.float32), cp.empty((M, N), np.float32)
    if accumulate:
        out[...] = cp.asarray(old)
    else:
        poison(out)
    ops.nt_act(ga, bt, gy, out, act, accumulate=accumulate)
    ops.nt(ga, bt, two)
    if accumulate:
        two += cp.asarray(old)
    nn_ops.act_backward(two, gy, two, act)
    assert_bitwise(out, two, what="nt_act against nt then act_backward")
    want = old.copy() if accumulate else np.empty((M, N), np.float32)
    ref.nt_act(a, b.T.copy(), y.astype(np.float32), want, act, accumulate=accumulate)
    assert_parity(out, want, what="nt_act against the twin")


def _member_operands(xp, rng, P, M, N, K, act, tight):
    """``nt_act``'s operands with the member axis, float32: a ``[P, M, K]``, bt ``[P, N, K]``, y (the layer below's
    output: ReLU or sigmoid values) and out ``[P, M, N]`` (random: what ``accumulate`` adds onto), each member's
    entry C-contiguous. ``tight``: members one entry apart (``xp.zeros``), else a population's layout
    (:func:`cudarl.nn.params.stacked_zeros`: each entry padded to 256 bytes)."""
    from cudarl.nn.params import stacked_zeros

    z = rng.standard_normal((P, M, N)).astype(np.float32)
    host = {
        "a": rng.standard_normal((P, M, K)).astype(np.float32),
        "bt": (rng.standard_normal((P, N, K)) / np.sqrt(K)).astype(np.float32),
        "y": (np.maximum(z, 0) if act == 1 else 1 / (1 + np.exp(-z))).astype(np.float32),
        "out": rng.standard_normal((P, M, N)).astype(np.float32),
    }
    ops = {}
    for k, v in host.items():
        ops[k] = xp.zeros(v.shape, np.float32) if tight else stacked_zeros(xp, P, v.shape[1:])
        ops[k][...] = xp.asarray(v)
    return host, ops


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_reference_nt_act_with_members_is_each_members_call(rng, tight, accumulate):
    """The twin's member axis (a population's dx GEMMs, :class:`cudarl.nn.StackedQNetwork`): member i of one call
    is the single call on member i's entries, bit for bit, over padded and tight member strides; arrays with and
    without the axis are refused together."""
    P, M, N, K = 3, 7, 12, 8
    host, op = _member_operands(np, rng, P, M, N, K, 1, tight)
    want = host["out"].copy()
    for i in range(P):
        ref.nt_act(host["a"][i], host["bt"][i], host["y"][i], want[i], 1, accumulate=accumulate)
    ref.nt_act(op["a"], op["bt"], op["y"], op["out"], 1, accumulate=accumulate)
    assert_bitwise(op["out"], want, what="the members' call against each member's")
    with pytest.raises(ValueError, match="member axis"):
        ref.nt_act(op["a"], op["bt"][0], op["y"], op["out"], 1)


@pytest.mark.gpu
@pytest.mark.parametrize("P,M,N,K", [(1, 512, 256, 256), (3, 7, 36, 68), (3, 512, 256, 204), (64, 512, 256, 256)])
@pytest.mark.parametrize("act", [1, 2])
@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gpu_nt_act_with_members_is_p_single_launches_bitwise(cp, rng, P, M, N, K, act, tight, accumulate):
    """One launch over P members (``blockIdx.z``; the single launch's block code on each member's entries)
    against P single launches on those entries, bit for bit (so member i of a stacked network's dx gets its
    single network's bits); and against the twin's member axis to float32 rounding."""
    from cudarl.ops import gemm as ops

    host, op = _member_operands(cp, rng, P, M, N, K, act, tight)
    singles = [op["out"][i].copy() for i in range(P)]  # out's values: what accumulate adds onto
    for i in range(P):
        if not accumulate:
            poison(singles[i])
        ops.nt_act(op["a"][i], op["bt"][i], op["y"][i], singles[i], act, accumulate=accumulate)
    if not accumulate:
        poison(op["out"])
    ops.nt_act(op["a"], op["bt"], op["y"], op["out"], act, accumulate=accumulate)
    for i in range(P):
        assert_bitwise(op["out"][i], singles[i], what=f"member {i} of {P} against its single launch")
    want = host["out"].copy()
    ref.nt_act(host["a"], host["bt"], host["y"], want, act, accumulate=accumulate)
    assert_parity(op["out"], want, what="nt_act over members against the twin")


@pytest.mark.gpu
def test_gpu_nt_act_refuses_members_the_kernel_cannot_take(cp):
    """The member axis on every array or none; member strides a multiple of 16 bytes (each member as aligned as
    member 0: :func:`cudarl.ops.gemm.eligible` with ``members``); members of out that do not overlap."""
    from cudarl.nn.params import member_view
    from cudarl.ops import gemm as ops

    P, M, N, K = 3, 8, 8, 8
    a, bt, y, out = (cp.zeros(s, np.float32) for s in ((P, M, K), (P, N, K), (P, M, N), (P, M, N)))
    assert ops.eligible(a, bt, y, out, K=K, N=N, trans_b=True, members=True)
    with pytest.raises(ValueError, match="member axis"):
        ops.nt_act(a, bt[0], y, out, 1)
    odd = member_view(cp, cp.zeros((P, M * K + 1), np.float32), 0, (M, K))  # members 4 bytes past 16
    assert not ops.eligible(odd, bt, y, out, K=K, N=N, trans_b=True, members=True)
    with pytest.raises(ValueError, match="16-byte"):
        ops.nt_act(odd, bt, y, out, 1)
    with pytest.raises(ValueError, match="overlap"):
        ops.nt_act(a, bt, y, cp.broadcast_to(out[0], (P, M, N)), 1)


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
