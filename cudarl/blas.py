"""Capture-safe row-major SGEMM: ``out = alpha * op(a) @ op(b) + beta * out``.

``cupy.matmul`` raises NotImplementedError inside stream capture (CuPy refuses cuBLAS
there). This module calls the cuBLAS C API of the library CuPy already loaded, through its
own handle per stream (never CuPy's), bound to that stream with a workspace set by
``cublasSetWorkspace`` before any capture, so a captured GEMM replays with new input data.
TF32 tensor-op math is a per-call option. On the NumPy backend the same call runs ``np.matmul``.

Row-major to cuBLAS's column-major: a row-major ``X [r, c]`` is the column-major ``X^T``, so
``C = op(A) op(B)`` is computed as the column-major ``C^T = op(B)^T op(A)^T``: cuBLAS gets
``(B, A)`` swapped with ``m = N, n = M`` and leading dimensions equal to each row-major row length.
"""
from __future__ import annotations

import ctypes
import re
import threading

import numpy as np

WORKSPACE_BYTES = 32 * 1024 * 1024  # cuBLAS's recommendation for Hopper
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_DEFAULT_MATH, _TF32_MATH = 0, 3  # CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH


class BlasError(RuntimeError):
    """A cuBLAS call failed or a GEMM was asked with inconsistent arguments."""


def _shapes(a, b, out, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    for name, x in (("a", a), ("b", b), ("out", out)):
        if x.ndim != 2:
            raise BlasError(f"gemm: {name} must be 2-D, got shape {x.shape}")
        if x.dtype != np.float32:
            raise BlasError(f"gemm: {name} must be float32, got {x.dtype}")
        if not x.flags.c_contiguous:
            raise BlasError(f"gemm: {name} must be C-contiguous")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb or out.shape != (m, n):
        raise BlasError(f"gemm: op(a) is {m}x{k}, op(b) is {kb}x{n}, out is {out.shape}; expected out {m}x{n} and matching k")
    return m, n, k


def gemm(a, b, out, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0,
         tf32: bool = False, stream=None) -> None:
    """``out = alpha * op(a) @ op(b) + beta * out`` in float32, row-major.

    Args:
        a: float32 ``[M, K]`` (``[K, M]`` if ``trans_a``).
        b: float32 ``[K, N]`` (``[N, K]`` if ``trans_b``).
        out: float32 ``[M, N]``, written in place (read too when ``beta != 0``).
        tf32: allow TF32 tensor-op math (GPU only; ~1e-3 relative error).
        stream: CuPy stream (default: the current stream).
    """
    m, n, k = _shapes(a, b, out, trans_a, trans_b)
    if isinstance(out, np.ndarray):
        opa = a.T if trans_a else a
        opb = b.T if trans_b else b
        res = np.matmul(opa, opb)
        if alpha != 1.0:
            res *= np.float32(alpha)
        if beta != 0.0:
            res += np.float32(beta) * out
        out[...] = res
        return
    import cupy

    s = stream if stream is not None else cupy.cuda.get_current_stream()
    h = _handle_for(s)
    if m == 0 or n == 0:
        return
    lib = _lib()
    _check(lib.cublasSetMathMode(h.ptr, _TF32_MATH if tf32 else _DEFAULT_MATH), "cublasSetMathMode")
    al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
    _check(lib.cublasSgemm_v2(
        h.ptr, _CUBLAS_OP_T if trans_b else _CUBLAS_OP_N, _CUBLAS_OP_T if trans_a else _CUBLAS_OP_N,
        n, m, k, ctypes.byref(al),
        ctypes.c_void_p(b.data.ptr), b.shape[1],
        ctypes.c_void_p(a.data.ptr), a.shape[1],
        ctypes.byref(be), ctypes.c_void_p(out.data.ptr), n), "cublasSgemm_v2")


# --- the cuBLAS library and per-stream handles ------------------------------------------------
_state = threading.local()
_lib_cache = []
_handles: dict[int, "_Handle"] = {}


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"{what} returned cuBLAS status {status}")


def _find_loaded_cublas() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if re.search(r"/libcublas\.so", path):
                    return path
    except OSError:
        pass
    return None


def _lib():
    if _lib_cache:
        return _lib_cache[0]
    from cupy_backends.cuda.libs import cublas as _cupy_cublas  # noqa: F401  (loads libcublas)

    path = _find_loaded_cublas()
    if path is None:
        try:
            from cuda import pathfinder

            path = pathfinder.load_nvidia_dynamic_lib("cublas").abs_path
        except Exception as exc:
            raise BlasError(f"cannot locate the cuBLAS library CuPy uses ({exc})") from None
    lib = ctypes.CDLL(path)
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasSetMathMode.argtypes = [vp, ci]
    fp = ctypes.POINTER(ctypes.c_float)
    lib.cublasSgemm_v2.argtypes = [vp, ci, ci, ci, ci, ci, fp, vp, ci, vp, ci, fp, vp, ci]
    for fn in (lib.cublasCreate_v2, lib.cublasDestroy_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
               lib.cublasSetMathMode, lib.cublasSgemm_v2):
        fn.restype = ci
    _lib_cache.append(lib)
    return lib


class _Handle:
    """A cuBLAS handle bound to one stream, with its own workspace (kept alive with it)."""

    def __init__(self, stream):
        import cupy

        lib = _lib()
        h = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate_v2")
        self.ptr = h
        self.stream = stream
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        _check(lib.cublasSetStream_v2(h, ctypes.c_void_p(stream.ptr)), "cublasSetStream_v2")
        _check(lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(self.workspace.data.ptr), WORKSPACE_BYTES), "cublasSetWorkspace_v2")
        # cuBLAS initialises lazily at its first GEMM on a handle, which fails inside a capture
        # (seen on an H200: CUBLAS_STATUS_EXECUTION_FAILED); so run one of each math mode now.
        x, y = cupy.ones((8, 8), dtype=np.float32), cupy.empty((8, 8), dtype=np.float32)
        with stream:
            for tf32 in (False, True):
                _check(lib.cublasSetMathMode(h, _TF32_MATH if tf32 else _DEFAULT_MATH), "cublasSetMathMode")
                one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
                px, py = ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(y.data.ptr)
                _check(lib.cublasSgemm_v2(h, _CUBLAS_OP_N, _CUBLAS_OP_N, 8, 8, 8, ctypes.byref(one), px, 8, px, 8,
                                          ctypes.byref(zero), py, 8), "cublasSgemm_v2 (warm-up)")
        stream.synchronize()


def prepare(stream) -> None:
    """Create the handle and workspace for ``stream``; call before capturing on it."""
    if stream.ptr not in _handles:
        if stream.is_capturing():
            raise BlasError("blas.prepare inside a capture: the handle and its workspace must exist before capture")
        _handles[stream.ptr] = _Handle(stream)


def _handle_for(stream) -> _Handle:
    h = _handles.get(stream.ptr)
    if h is None:
        if stream.is_capturing():
            raise BlasError("gemm inside a capture on a stream with no prepared cuBLAS handle: call blas.prepare(stream) before capture")
        prepare(stream)
        h = _handles[stream.ptr]
    return h
