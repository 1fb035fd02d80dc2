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
