"""Capture-safe GEMM: the NumPy path against float64 on the CPU; cuBLAS eager and captured on the GPU."""
import numpy as np
import pytest

from cudarl import blas
from cudarl.testing import assert_parity

SHAPES = [(1, 1, 1), (7, 13, 5), (512, 256, 256), (4096, 64, 256)]
TRANS = [(False, False), (True, False), (False, True), (True, True)]


def _operands(rng, m, n, k, ta, tb, xp=np):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    ref = 0.75 * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64) - 0.5 * c
    return a, b, c, ref


@pytest.mark.parametrize("m,n,k", SHAPES[:3])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_numpy_gemm_against_float64(rng, m, n, k, ta, tb):
    a, b, c, ref = _operands(rng, m, n, k, ta, tb)
    blas.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5)
    assert_parity(c, ref.astype(np.float32))


def test_shape_and_dtype_errors():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(blas.BlasError, match="expected out 3x5"):
        blas.gemm(a, np.zeros((4, 5), np.float32), np.zeros((3, 4), np.float32))
    with pytest.raises(blas.BlasError, match="float32"):
        blas.gemm(a, np.zeros((4, 5), np.float64), np.zeros((3, 5), np.float32))
    with pytest.raises(blas.BlasError, match="2-D"):
        blas.gemm(a, np.zeros(4, np.float32), np.zeros((3, 5), np.float32))
    with pytest.raises(blas.BlasError, match="C-contiguous"):
        blas.gemm(a, np.zeros((5, 4), np.float32).T, np.zeros((3, 5), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_eager_and_captured(cp, rng, m, n, k, ta, tb, tf32):
    from cudarl.graph import StepGraph

    a, b, c, ref = _operands(rng, m, n, k, ta, tb)
    kind = "tf32" if tf32 else "float32"
    da, db = cp.asarray(a), cp.asarray(b)
    out = cp.asarray(c)
    blas.gemm(da, db, out, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5, tf32=tf32)
    assert_parity(out, ref.astype(np.float32), kind=kind, what="eager")

    cap = cp.asarray(c)
    g = StepGraph("gemm", [("gemm", lambda: blas.gemm(da, db, cap, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5, tf32=tf32))])
    g.capture()
    g.replay()
    g.synchronize()
    assert_parity(cap, ref.astype(np.float32), kind=kind, what="captured")
    # the replay must read the inputs' current contents
    a2 = rng.standard_normal(a.shape).astype(np.float32)
    da[...] = cp.asarray(a2)
    cap[...] = cp.asarray(c)
    g.replay()
    g.synchronize()
    ref2 = 0.75 * (a2.T if ta else a2).astype(np.float64) @ (b.T if tb else b).astype(np.float64) - 0.5 * c
    assert_parity(cap, ref2.astype(np.float32), kind=kind, what="captured, new inputs")


@pytest.mark.gpu
def test_gpu_gemm_without_prepared_handle_inside_capture(cp):
    a = cp.ones((4, 4), np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(blas.BlasError, match="no prepared cuBLAS handle"):
                blas.gemm(a, a, cp.ones((4, 4), np.float32), stream=s)
        finally:
            s.end_capture()
