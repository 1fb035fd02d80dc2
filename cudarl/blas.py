"""Capture-safe row-major SGEMM: ``out = alpha * op(a) @ op(b) + beta * out``, and the same GEMM
through cuBLASLt with the bias and ReLU fused into its epilogue: ``out = act(op(a) @ op(b) + bias)``, or
with a residual operand read in the same kernel: ``out = op(a) @ op(b) + bias + c``.

``cupy.matmul`` raises NotImplementedError inside stream capture (CuPy refuses cuBLAS
there). This module calls the cuBLAS C API of the library CuPy already loaded, through its
own handle per stream (never CuPy's), bound to that stream with a workspace set by
``cublasSetWorkspace`` before any capture, so a captured GEMM replays with new input data.
TF32 tensor-op math is a per-call option. On the NumPy backend the same call runs ``np.matmul``.

Row-major to cuBLAS's column-major: a row-major ``X [r, c]`` is the column-major ``X^T``, so
``C = op(A) op(B)`` is computed as the column-major ``C^T = op(B)^T op(A)^T``: cuBLAS gets
``(B, A)`` swapped with ``m = N, n = M`` and leading dimensions equal to each row-major row length.

cuBLASLt (:func:`gemm_lt`) takes the same swap. In that column-major view the output ``C^T`` is
``[N, M]`` and its bias epilogue adds a vector of length ``N`` (the rows of ``C^T``) to every
column: ``bias[j]`` lands on column ``j`` of the row-major ``out``, which is ``x @ W + b``.
The matmul descriptor, matrix layouts and the algorithm the heuristic picks are a *plan*, made
once per key (shape, transposes, epilogue, TF32, operand alignment) outside any capture and
cached; a call passes its own pointers (the bias pointer is a descriptor attribute set per call,
a host-side write that a capture sees as the launch's argument). cuBLASLt's heuristic query can
fail inside a capture, so a key first met inside one raises :class:`BlasError`.

The residual (:func:`gemm_lt`'s ``c``, issue 22: an encoder block's ``h' = h + x W + b``) is cuBLASLt's C
matrix with ``beta = 1`` (``D = alpha op(A) op(B) + beta C``, then the epilogue's bias): a matrix layout of
its own, whose leading dimension may differ from D's (the cuBLAS documentation of ``cublasLtMatmul``:
out of place, C and D of the same type, shape and order, any ldc), so the top block reads the last bar of
each sample's window in place (``h[W - 1 :: W]``). A plan with C is another plan (beta 1, its own C layout,
its alignment and row pitch in the key). The documentation gives the bias as "added before applying the
final postprocessing" and does not say in which order the kernel adds C and the bias; the NumPy twin adds
the bias, then C (``(a @ b + bias) + c``, each sum rounded to float32), the order of the unfused path (the
GEMM with its bias epilogue, then ``seq.residual_add``), so the CPU backend keeps its bits and the GPU
matches it to rounding, as every GEMM does.

:func:`gemm_lt_batched` runs P such GEMMs (a population's members, issue 23) as one strided-batched
cuBLASLt call: the layouts carry the batch count and strides, the descriptor the bias's batch stride,
and the algorithm is the one the single GEMM's plan chose, so entry ``i`` keeps the bits of the single
GEMM of entry ``i``. Its key is the single key plus the batch and the batched algorithm choice
(:data:`BATCHED_ALGOS`); a batch of 1 is the single key. Under ``algo="probe"`` the plan also asks the
heuristic for the batched problem's own candidates and adopts the fastest of the single algorithm and
those whose output on random inputs is bitwise the single algorithm's (a probe run once, when the plan is
made, timing each equal one and the single one); :func:`batched_plan_info` says
what each batched plan chose.
"""

from __future__ import annotations

import ctypes
import re
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

from . import kernels, probe_cache
from .backend import address

WORKSPACE_BYTES = 32 * 1024 * 1024  # cuBLAS's recommendation for Hopper
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_DEFAULT_MATH, _TF32_MATH = 0, 3  # CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH

# cuBLASLt constants, read from cublasLt.h, cublas_api.h and library_types.h (cuBLAS 13.1, CUDA 13.0;
# the same values since CUDA 11).
_CUDA_R_32F = 0
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77  # cublasComputeType_t
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8  # cublasLtMatmulDescAttributes_t
_DESC_BIAS_BATCH_STRIDE = 10  # cublasLtMatmulDescAttributes_t, int64_t elements (cublasLt.h, CUDA 12.6)
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6  # cublasLtMatrixLayoutAttribute_t: int32_t, int64_t
_PREF_MAX_WORKSPACE_BYTES, _PREF_REDUCTION_SCHEME_MASK = (
    1,
    3,
)  # cublasLtMatmulPreferenceAttributes_t, then MIN_ALIGNMENT_{A,B,C,D}_BYTES:
_PREF_MIN_ALIGNMENT_A, _PREF_MIN_ALIGNMENT_B, _PREF_MIN_ALIGNMENT_C, _PREF_MIN_ALIGNMENT_D = 5, 6, 7, 8
#: cublasLtEpilogue_t by (has bias, activation): DEFAULT 1, RELU 2, BIAS 4, RELU_BIAS 6.
_EPILOGUES = {(False, "identity"): 1, (False, "relu"): 2, (True, "identity"): 4, (True, "relu"): 6}
_EPILOGUE_HAS_BIAS = {e: has_bias for (has_bias, _), e in _EPILOGUES.items()}
#: The activations :func:`gemm_lt` fuses.
LT_ACTS = ("identity", "relu")
#: The operand alignment (bytes) plans assume at most: a CuPy allocation, or a view starting at a
#: multiple of 4 floats. Less-aligned operands get plans of their own (a key of their own).
LT_ALIGN = 16
#: How a batched plan gets its algorithm (``net.batched_algo``): ``single``, the single GEMM's plan's;
#: ``probe``, the fastest (timed on the probe's buffers) of the single algorithm and those of the batched
#: problem's heuristic candidates whose output on random inputs is bitwise the single algorithm's. A
#: single one-kernel GEMM takes the same choice (``gemm_lt(algo=...)``, ``net.gemm_algo``): ``single`` is the
#: heuristic's first algorithm, ``probe`` a batch of 1 probed against it.
BATCHED_ALGOS = ("single", "probe")
#: Candidates the heuristic is asked for under ``probe``.
PROBE_CANDIDATES = 8
#: A probe's timing of each algorithm it may adopt (:class:`_EventTimer`): a CUDA graph of PROBE_REPEATS
#: launches, replayed PROBE_WARMUP times, then the median of PROBE_WARMUP + 2 timed replays.
PROBE_WARMUP, PROBE_REPEATS = 3, 15
_PROBE_SEED = 20261204
_CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode: a probe's timing capture, on its own stream
_CUDA_ERROR_OUT_OF_MEMORY = 2  # CUresult
# cublasLtMatmulAlgoConfigAttributes_t: (name, value, ctypes type), cublasLt.h (cuBLAS 12/13)
_ALGO_CONFIG = (
    ("algo_id", 0, ctypes.c_int32),
    ("tile", 1, ctypes.c_uint32),
    ("splitk", 2, ctypes.c_uint32),
    ("reduction", 3, ctypes.c_uint32),
    ("swizzle", 4, ctypes.c_uint32),
    ("custom", 5, ctypes.c_uint32),
    ("stages", 6, ctypes.c_uint32),
    ("inner_shape", 7, ctypes.c_uint16),
    ("cluster_shape", 8, ctypes.c_uint16),
)
#: cublasLtMatmulTile_t 0..35 (cublasLt.h); a later id prints as ``tile#<id>``
_TILES = (
    "undefined 8x8 8x16 16x8 8x32 16x16 32x8 8x64 16x32 32x16 64x8 32x32 32x64 64x32 32x128 64x64 128x32 "
    "64x128 128x64 64x256 128x128 256x64 64x512 128x256 256x128 512x64 64x96 96x64 96x128 128x160 160x128 "
    "192x128 128x192 128x96 32x256 256x32"
).split()


class BlasError(RuntimeError):
    """A cuBLAS call failed or a GEMM was asked with inconsistent arguments."""


def _row_pitch(x) -> int:
    """The elements from one row of a 2-D float32 matrix to the next, its leading dimension: a C-contiguous
    matrix's width, or the parent's row length for a column block ``w[:, j0:j1]`` or every k-th row
    ``x[k - 1 :: k]``; 0 where its rows are not each contiguous and evenly spaced, ascending."""
    item = x.itemsize
    if x.shape[0] <= 1 or x.shape[1] == 0:  # one row, or nothing to read: any pitch from the row length
        return max(1, x.shape[1])
    if x.shape[1] > 1 and x.strides[1] != item:
        return 0
    pitch = x.strides[0]
    return pitch // item if pitch % item == 0 and pitch >= x.shape[1] * item else 0


def _shapes(a, b, out, trans_a: bool, trans_b: bool, what: str = "gemm", pitched: bool = True):
    """``(m, n, k)`` of ``out = op(a) @ op(b)``, checked. Operands are row-major float32 matrices whose rows are
    each contiguous and evenly spaced (:func:`_row_pitch`: C-contiguous, or a view such as a column block);
    ``pitched=False`` asks for C-contiguous ones."""
    for name, x in (("a", a), ("b", b), ("out", out)):
        if x.ndim != 2:
            raise BlasError(f"{what}: {name} must be 2-D, got shape {x.shape}")
        if x.dtype != np.float32:
            raise BlasError(f"{what}: {name} must be float32, got {x.dtype}")
        if pitched and not _row_pitch(x):
            raise BlasError(
                f"{what}: {name} must be C-contiguous or a view of rows each contiguous and evenly spaced "
                f"(strides {x.strides})"
            )
        if not pitched and not x.flags.c_contiguous:
            raise BlasError(f"{what}: {name} must be C-contiguous")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb or out.shape != (m, n):
        raise BlasError(
            f"{what}: op(a) is {m}x{k}, op(b) is {kb}x{n}, out is {out.shape}; expected out {m}x{n} and matching k"
        )
    return m, n, k


def gemm(
    a,
    b,
    out,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    tf32: bool = False,
    stream=None,
) -> None:
    """``out = alpha * op(a) @ op(b) + beta * out`` in float32, row-major.

    Args:
        a: float32 ``[M, K]`` (``[K, M]`` if ``trans_a``).
        b: float32 ``[K, N]`` (``[N, K]`` if ``trans_b``).
        out: float32 ``[M, N]``, written in place (read too when ``beta != 0``).
        tf32: allow TF32 tensor-op math (GPU only; ~1e-3 relative error).
        stream: CuPy stream (default: the current stream).

    An operand may be a view whose rows are contiguous and evenly spaced (a column block ``w[:, j0:j1]``,
    every k-th row ``x[k - 1 :: k]``): its row pitch is the GEMM's leading dimension.
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
    h = _handle_for(s).cublas()
    if m == 0 or n == 0:
        return
    kernels.trace({"kind": "library", "name": "cublas_sgemm", "stream": s.ptr, "m": m, "n": n, "k": k, "beta": beta})
    lib = _lib()
    _check(lib.cublasSetMathMode(h, _TF32_MATH if tf32 else _DEFAULT_MATH), "cublasSetMathMode")
    al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
    _check(
        lib.cublasSgemm_v2(
            h,
            _CUBLAS_OP_T if trans_b else _CUBLAS_OP_N,
            _CUBLAS_OP_T if trans_a else _CUBLAS_OP_N,
            n,
            m,
            k,
            ctypes.byref(al),
            ctypes.c_void_p(b.data.ptr),
            _row_pitch(b),
            ctypes.c_void_p(a.data.ptr),
            _row_pitch(a),
            ctypes.byref(be),
            ctypes.c_void_p(out.data.ptr),
            _row_pitch(out),
        ),
        "cublasSgemm_v2",
    )


def gemm_lt(
    a,
    b,
    out,
    *,
    bias=None,
    c=None,
    act: str = "identity",
    trans_a: bool = False,
    trans_b: bool = False,
    tf32: bool = False,
    split_k: bool = True,
    algo: str = "single",
    stream=None,
) -> None:
    """``out = act(op(a) @ op(b) + bias)`` in float32, row-major, through cuBLASLt's epilogue; with ``c``,
    ``out = op(a) @ op(b) + bias + c`` (cuBLASLt's C with ``beta = 1``).

    Args:
        a: float32 ``[M, K]`` (``[K, M]`` if ``trans_a``).
        b: float32 ``[K, N]`` (``[N, K]`` if ``trans_b``).
        out: float32 ``[M, N]``, overwritten.
        bias: float32 ``[N]``, added to every row of ``out`` (``None``: no bias); on the GPU its
            address must be a multiple of 16 bytes (cuBLASLt's bias epilogue).
        c: float32 ``[M, N]``, the residual added to the product and the bias (``None``: none): read only, in
            the same kernel; a view whose rows are contiguous and evenly spaced, as the other operands (its row
            pitch is C's leading dimension: ``h[W - 1 :: W]``, the last of each group of W rows). It may not
            overlap ``out`` unless it is ``out`` exactly (the same bytes and row pitch): cuBLASLt documents
            C == D in place with D's very layout, ``out += op(a) @ op(b)`` (a layer's dx added to a gradient
            already there, :meth:`cudarl.nn.Linear.backward`); a partial overlap would read C where the
            kernel already wrote D. Only with
            ``act="identity"``: cuBLASLt would apply a ReLU after adding C, which is not ``c + relu(...)``.
            The NumPy twin adds the bias first, then ``c`` (module docstring: the order cuBLASLt leaves
            open, chosen to keep the unfused path's bits).
        act: ``"identity"`` or ``"relu"``, applied after the bias.
        tf32: allow TF32 tensor-core math (GPU only; ~1e-3 relative error).
        split_k: let the heuristic pick an algorithm that splits K (partial sums, then a reduction
            kernel of its own); ``False`` asks for one-kernel algorithms only (no reduction scheme).
        algo: :data:`BATCHED_ALGOS`: ``"single"``, the heuristic's first algorithm; ``"probe"`` (with
            ``split_k=False``), the fastest of it and the heuristic's other one-kernel candidates whose
            output a probe on random inputs of the key's shapes found bitwise equal to it (the plan of a
            batch of 1 under :func:`gemm_lt_batched`'s ``probe``; :func:`batched_plan_info`).
        stream: CuPy stream (default: the current stream).

    An operand may be a view whose rows are contiguous and evenly spaced, as :func:`gemm`'s: its row pitch is
    the layout's leading dimension, part of the plan's key.

    On the GPU the first call of a key (shape, transposes, epilogue, TF32, operand alignment, leading
    dimensions, and ``c``'s alignment and row pitch) makes its plan and must run outside any capture (or call
    :func:`gemm_lt_prepare` first); later calls of that key allocate nothing and never synchronise, so they can
    be captured. NumPy arrays take the same math with ``np.matmul``.
    """
    m, n, k = _shapes(a, b, out, trans_a, trans_b, "gemm_lt")
    _check_lt_args(a, b, out, bias, act, n, k)
    _check_c(c, out, act)
    _check_algo(algo, "gemm_lt", split_k)
    if isinstance(out, np.ndarray):
        _lt_numpy(a, b, out, bias, act, trans_a, trans_b, c)
        return
    _lt_device("gemm_lt", (m, n, k), a, b, out, bias, act, trans_a, trans_b, tf32, split_k, stream, algo=algo, c=c)


def gemm_lt_batched(
    a,
    b,
    out,
    *,
    bias=None,
    act: str = "identity",
    trans_a: bool = False,
    trans_b: bool = False,
    tf32: bool = False,
    algo: str = "single",
    stream=None,
) -> None:
    """``out[i] = act(op(a[i]) @ op(b[i]) + bias[i])`` for every entry ``i`` of a batch, in float32,
    row-major: one strided-batched cuBLASLt GEMM (a population's members in one launch).

    Args:
        a: float32 ``[P, M, K]`` (``[P, K, M]`` if ``trans_a``).
        b: float32 ``[P, K, N]`` (``[P, N, K]`` if ``trans_b``).
        out: float32 ``[P, M, N]``, overwritten.
        bias: float32 ``[P, N]`` (``None``: no bias), entry ``i`` added to every row of ``out[i]``; on
            the GPU every entry's address must be a multiple of 16 bytes.
        act: ``"identity"`` or ``"relu"``, applied after the bias.
        tf32: allow TF32 tensor-core math (GPU only; ~1e-3 relative error).
        algo: the batch's algorithm (:data:`BATCHED_ALGOS`): ``"single"``, the single GEMM's plan's;
            ``"probe"``, a batched candidate of the heuristic's whose output a probe found bitwise equal
            to the single algorithm's, else the single one (:class:`_LtPlan`; :func:`batched_plan_info`).
        stream: CuPy stream (default: the current stream).

    Each entry is a C-contiguous matrix; the leading axis may have any stride of at least 0 elements
    (0: one operand shared by every entry, e.g. a ``broadcast_to`` view), but ``out``'s entries must
    not overlap. The batch count and the four leading strides are the GEMM's batch layout.

    Entry ``i`` equals ``gemm_lt(a[i], b[i], out[i], bias=bias[i], act=act, trans_a=trans_a,
    trans_b=trans_b, tf32=tf32, split_k=False)`` bit for bit by design under ``algo="single"``: the batch
    runs the algorithm that call's plan chose (a one-kernel algorithm, no split-K reduction), checked for
    the batch layout by ``cublasLtMatmulAlgoCheck`` (under ``"probe"``, another one-kernel algorithm only
    where the plan's probe found the same bits). So every entry must have the alignment class of entry 0
    (with 16-byte aligned operands and 256-byte aligned biases: strides in bytes that are multiples of
    16 and 256), else entry ``i`` alone could get another plan; a stride that breaks it is refused.
    A batch of 1 is exactly that single call (same plan key, same plan). Plans are made outside any
    capture as for :func:`gemm_lt` (:func:`gemm_lt_prepare` with ``batch``). NumPy arrays run the
    NumPy math of :func:`gemm_lt` entry by entry.
    """
    P, m, n, k, strides = _batched_shapes(a, b, out, bias, act, trans_a, trans_b)
    _check_algo(algo, "gemm_lt_batched")
    if isinstance(out, np.ndarray):
        for i in range(P):
            _lt_numpy(a[i], b[i], out[i], None if bias is None else bias[i], act, trans_a, trans_b)
        return
    _lt_device(
        "gemm_lt_batched", (m, n, k), a, b, out, bias, act, trans_a, trans_b, tf32, False, stream, P, strides, algo
    )


def _check_algo(algo: str, what: str, split_k: bool = False) -> None:
    if algo not in BATCHED_ALGOS:
        raise BlasError(f"{what}: algo must be one of {BATCHED_ALGOS}, got {algo!r}")
    if algo == "probe" and split_k:
        raise BlasError(f"{what}: algo='probe' compares one-kernel algorithms: pass split_k=False")


def _lds(a, b, out) -> tuple[int, int, int] | None:
    """The row pitches of a single GEMM's 2-D operands (:func:`_row_pitch`), or ``None`` (packed) for a batch's
    ``[P, rows, cols]`` entries, whatever ``P``: a batch of one's 3-D arrays have no 2-D row pitch, and its key
    must be the single GEMM's packed key (its entry runs the single plan's algorithm)."""
    if a.ndim == b.ndim == out.ndim == 2:
        return tuple(_row_pitch(x) for x in (a, b, out))
    return None


def _lt_device(
    what,
    mnk,
    a,
    b,
    out,
    bias,
    act,
    trans_a,
    trans_b,
    tf32,
    split_k,
    stream,
    batch=1,
    strides=None,
    algo="single",
    c=None,
):
    """The GPU side of :func:`gemm_lt` (``batch`` 1; ``c``, its residual) and :func:`gemm_lt_batched`: the
    stream's workspace, the trace, the plan of the key (made now outside a capture), one ``cublasLtMatmul``."""
    import cupy

    m, n, k = mnk
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    h = _handle_for(s)  # the stream's workspace
    if m == 0 or n == 0:
        return
    beta = 0.0 if c is None else 1.0
    event = {"kind": "library", "name": "cublaslt_matmul", "stream": s.ptr, "m": m, "n": n, "k": k, "beta": beta}
    kernels.trace(event if batch == 1 else {**event, "batch": batch})
    bias_ptr = _bias_ptr(bias, what)
    ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
    lds = _lds(a, b, out)
    c_ptr, c_ld = (None, None) if c is None else (c.data.ptr, _row_pitch(c))
    key = _lt_key(m, n, k, trans_a, trans_b, bias_ptr, act, tf32, *ptrs, split_k, lds, c_ptr=c_ptr, c_ld=c_ld)
    if batch != 1:
        _check_entry_alignment(key, ptrs + (bias_ptr,), strides, batch)
    key = _batch_key(key, batch, strides, algo)
    _lt_run(_lt_plan(key, bias_ptr, s), *ptrs, bias_ptr, h.workspace.data.ptr, s.ptr, c=c_ptr or 0)


def gemm_lt_prepare(
    m: int,
    n: int,
    k: int,
    *,
    bias=None,
    act: str = "identity",
    trans_a: bool = False,
    trans_b: bool = False,
    tf32: bool = False,
    split_k: bool = True,
    batch: int = 1,
    strides: tuple[int, int, int] | None = None,
    algo: str = "single",
    lds: tuple[int, int, int] | None = None,
    c_ld: int | None = None,
    stream=None,
) -> None:
    """Make the :func:`gemm_lt` plan of a ``[M, K] x [K, N]`` key before any capture (GPU), or with
    ``batch`` (or ``strides``, or a 2-D ``bias``) the :func:`gemm_lt_batched` plan of ``batch`` of them.

    For operands aligned to :data:`LT_ALIGN` bytes and a bias aligned like ``bias`` (a CuPy float32
    ``[N]``, ``[batch, N]`` for a batch, or ``None``): if the key has no plan yet, runs the GEMM once on
    scratch operands (so the chosen kernel has also run once outside a capture) and synchronises
    ``stream``. A batch takes ``strides = (a, b, out)``, each entry's offset in elements (default: packed,
    ``M*K, K*N, M*N``), the bias's from ``bias`` itself, ``split_k=False`` (its only algorithms) and
    ``algo`` (:data:`BATCHED_ALGOS`; ``"probe"`` runs its probe now, for one GEMM too). ``lds``: the row pitches
    (leading dimensions) of a, b and out for a single GEMM on views (default: packed). ``c_ld``: the row pitch
    of a residual ``c`` (:func:`gemm_lt`'s; ``N`` for a packed one), for a single GEMM (default: no ``c``).
    """
    _check_algo(algo, "gemm_lt_prepare", split_k)
    import cupy

    if act not in LT_ACTS:
        raise BlasError(f"gemm_lt_prepare: act must be one of {LT_ACTS}, got {act!r}")
    batched = batch != 1 or strides is not None or (bias is not None and bias.ndim == 2)
    if batched and split_k:
        raise BlasError("gemm_lt_prepare: a batched GEMM runs one-kernel algorithms only: pass split_k=False")
    if batch < 1:
        raise BlasError(f"gemm_lt_prepare: batch must be at least 1, got {batch}")
    if batched and (lds is not None or c_ld is not None):
        raise BlasError(
            "gemm_lt_prepare: a batch's entries are packed and have no c: lds and c_ld are for a single GEMM"
        )
    _check_c_act(c_ld is not None, act, "gemm_lt_prepare")
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    if m == 0 or n == 0:
        return
    bias_ptr = 0 if bias is None else bias.data.ptr
    key = _aligned_key(m, n, k, trans_a, trans_b, bias_ptr, act, tf32, split_k, lds, c_ld)
    lds = key[_LDS]
    strides = tuple(strides) if strides is not None else (m * k, k * n, m * n)
    bias_stride = 0 if bias is None or bias.ndim != 2 else bias.strides[0] // bias.itemsize
    key = _batch_key(key, batch, strides + (bias_stride,), algo)
    if key in _plans:
        return
    if s.is_capturing():
        raise BlasError("gemm_lt_prepare inside a capture: plans must be made before capture")
    # scratch operands: CuPy allocations are 256-byte aligned; a single GEMM's rows ``ld`` elements apart
    shapes = ((k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n), (m, n))
    kw = dict(bias=bias, act=act, trans_a=trans_a, trans_b=trans_b, tf32=tf32, stream=s)
    operands = [
        _strided(cupy, sh, batch, st) if batched else cupy.zeros((sh[0], ld), dtype=np.float32)[:, : sh[1]]
        for sh, st, ld in zip(shapes, strides, lds, strict=True)
    ]
    c = None if c_ld is None else cupy.zeros((m, key[_C][1]), dtype=np.float32)[:, :n]
    _after_caller(s)  # the operands' blocks and fills are the caller's stream's
    if batched:
        gemm_lt_batched(*operands, algo=algo, **kw)
    else:
        gemm_lt(*operands, c=c, split_k=split_k, algo=algo, **kw)
    s.synchronize()  # the scratch operands outlive the GEMM


def plan_key(
    m: int,
    n: int,
    k: int,
    *,
    bias_align: int,
    act: str = "identity",
    trans_a: bool = False,
    trans_b: bool = False,
    tf32: bool = False,
    split_k: bool = True,
    batch: int = 1,
    strides: tuple[int, int, int, int] | None = None,
    algo: str = "single",
    lds: tuple[int, int, int] | None = None,
    c_ld: int | None = None,
) -> tuple:
    """The key of the :func:`gemm_lt` plan of a ``[M, K] x [K, N]`` GEMM on operands aligned to
    :data:`LT_ALIGN` bytes, with a bias whose address is a multiple of ``bias_align`` bytes (0: no
    bias): what :func:`gemm_lt_prepare` makes for a layer's forward, named without a device. With
    ``batch`` > 1, the :func:`gemm_lt_batched` plan of that many entries ``strides = (a, b, out, bias)``
    elements apart (``split_k=False``, the batch's only algorithms) and its ``algo`` (:data:`BATCHED_ALGOS`).
    ``lds``: a single GEMM's row pitches of a, b and out (default: packed); ``c_ld``: the row pitch of its
    residual ``c``, aligned to :data:`LT_ALIGN` bytes (default: no ``c``)."""
    _check_algo(algo, "plan_key", split_k)
    if act not in LT_ACTS:
        raise BlasError(f"plan_key: act must be one of {LT_ACTS}, got {act!r}")
    if batch != 1 and (strides is None or split_k or c_ld is not None):
        raise BlasError("plan_key: a batch needs its strides (a, b, out, bias) and split_k=False, and has no c")
    _check_c_act(c_ld is not None, act, "plan_key")
    bias_ptr = bias_align  # an address with exactly that alignment (up to the 256 the key counts)
    key = _aligned_key(m, n, k, trans_a, trans_b, bias_ptr, act, tf32, split_k, lds, c_ld)
    return _batch_key(key, batch, strides, algo)


def warm_plans(keys) -> None:
    """Make the :func:`gemm_lt` plans of ``keys`` (:func:`plan_key`) and run each GEMM once on scratch
    memory, through the driver library and cuBLASLt alone (no CuPy), in the calling thread with its
    current context. :func:`cudarl.backend.warm_up` runs it in its driver thread (``on_context``):
    the library's handle, its heuristics and its kernels' first load (about 0.1 s of a GPU evaluation's
    start on an H200 at 95f3251) then happen where ctypes calls let go of the GIL, and a later
    :func:`gemm_lt_prepare` of a key finds its plan made. Keys with a plan already are skipped; a
    batched key's batch-1 plan (whose algorithm it runs) is made first."""
    keys = [key for key in dict.fromkeys(k for key in keys for k in (key[:_BASE_KEY], key)) if key not in _plans]
    if not keys:
        return
    cu = _cu()
    with _DeviceScratch("warm_plans") as scratch:
        extents = [_extents(key) for key in keys]  # elements of a, b, out, bias and c
        # cuMemAlloc's addresses are 256-byte aligned at least
        a, b, out, bias, c = (scratch.zeros(4 * max(e[i] for e in extents)) for i in range(5))
        work = scratch.zeros(WORKSPACE_BYTES)
        for key in keys:
            bias_ptr = bias if _EPILOGUE_HAS_BIAS[key[5]] else 0
            plan = _plans[key] = _LtPlan(key, bias_ptr)
            _lt_run(plan, a, b, out, bias_ptr, work, 0, c=c if key[_C][1] else 0)
        _cu_check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def _cu():
    """The CUDA driver library, its few functions that warm_plans and the probes call declared."""
    if _cu_cache:
        return _cu_cache[0]
    cu = ctypes.CDLL("libcuda.so.1")
    u64, sz, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
    for name, argtypes in {
        "cuMemAlloc_v2": [ctypes.POINTER(u64), sz],
        "cuMemsetD8_v2": [u64, ctypes.c_ubyte, sz],
        "cuMemsetD32Async": [u64, ctypes.c_uint, sz, vp],
        "cuMemFree_v2": [u64],
        "cuMemcpyHtoDAsync_v2": [u64, vp, sz, vp],
        "cuMemcpyDtoHAsync_v2": [vp, u64, sz, vp],
        "cuStreamSynchronize": [vp],
        "cuStreamIsCapturing": [vp, ctypes.POINTER(ctypes.c_int)],
        "cuCtxSynchronize": [],
        "cuEventCreate": [ctypes.POINTER(vp), ctypes.c_uint],
        "cuEventRecord": [vp, vp],
        "cuEventSynchronize": [vp],
        "cuEventDestroy_v2": [vp],
        "cuStreamCreate": [ctypes.POINTER(vp), ctypes.c_uint],
        "cuStreamDestroy_v2": [vp],
        "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
        "cuStreamEndCapture": [vp, ctypes.POINTER(vp)],
        "cuGraphInstantiateWithFlags": [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
        "cuGraphLaunch": [vp, vp],
        "cuGraphExecDestroy": [vp],
        "cuGraphDestroy": [vp],
    }.items():
        fn = getattr(cu, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    # CUDA 12.8+ drivers export cuEventElapsedTime_v2 (cuda.h's name for it since CUDA 13), the same
    # signature; older ones only the first version
    elapsed = getattr(cu, "cuEventElapsedTime_v2", None) or cu.cuEventElapsedTime
    elapsed.argtypes, elapsed.restype = [ctypes.POINTER(ctypes.c_float), vp, vp], ctypes.c_int
    cu.event_elapsed_time = elapsed
    _cu_cache.append(cu)
    return cu


def _cu_check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"{what} returned CUDA driver error {status}")


class _DeviceScratch:
    """Device buffers allocated through the driver (no CuPy) and freed together at the ``with``'s end."""

    def __init__(self, what: str):
        self.what, self.ptrs = what, []

    def alloc(self, nbytes: int) -> int:
        p = ctypes.c_uint64()
        status = _cu().cuMemAlloc_v2(ctypes.byref(p), max(int(nbytes), 4))
        cupy = sys.modules.get("cupy")
        if status == _CUDA_ERROR_OUT_OF_MEMORY and cupy is not None:  # CuPy's pool may hold the memory, unused
            cupy.get_default_memory_pool().free_all_blocks()
            status = _cu().cuMemAlloc_v2(ctypes.byref(p), max(int(nbytes), 4))
        _cu_check(status, f"{self.what}: cuMemAlloc({nbytes})")
        self.ptrs.append(p.value)
        return p.value

    def zeros(self, nbytes: int) -> int:
        p = self.alloc(nbytes)
        _cu_check(_cu().cuMemsetD8_v2(p, 0, max(int(nbytes), 4)), f"{self.what}: cuMemsetD8")
        return p

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        cu = _cu()
        while self.ptrs:
            cu.cuMemFree_v2(self.ptrs.pop())


def _check_lt_args(a, b, out, bias, act: str, n: int, k: int, what: str = "gemm_lt") -> None:
    if act not in LT_ACTS:
        raise BlasError(f"{what}: act must be one of {LT_ACTS}, got {act!r}")
    if k == 0:
        raise BlasError(f"{what}: the inner dimension k must be at least 1")
    on_host = isinstance(out, np.ndarray)
    if any(isinstance(x, np.ndarray) != on_host for x in (a, b, bias) if x is not None):
        raise BlasError(f"{what}: a, b, out and bias must all be NumPy arrays or all CuPy arrays")
    if bias is not None:
        if bias.shape != (n,) or bias.dtype != np.float32 or not bias.flags.c_contiguous:
            raise BlasError(f"{what}: bias must be a contiguous float32 [{n}], got {bias.dtype} {bias.shape}")


def _check_c_act(has_c: bool, act: str, what: str) -> None:
    if has_c and act != "identity":
        raise BlasError(
            f"{what}: a residual c takes act='identity' only (cuBLASLt would apply {act!r} after adding C, "
            "which is not c + act(a @ b + bias))"
        )


def _span(x) -> tuple[int, int]:
    """The bytes ``[first, end)`` a 2-D float32 view with a row pitch (:func:`_row_pitch`) reaches, by address."""
    ptr = address(x)
    if x.size == 0:
        return ptr, ptr
    return ptr, ptr + ((x.shape[0] - 1) * _row_pitch(x) + x.shape[1]) * x.itemsize


def _check_c(c, out, act: str) -> None:
    """:func:`gemm_lt`'s residual: out's shape and backend, float32, rows each contiguous and evenly spaced, an
    identity epilogue, and no byte of out's span in its span (module docstring: why no overlap)."""
    if c is None:
        return
    what = "gemm_lt"
    if isinstance(c, np.ndarray) != isinstance(out, np.ndarray):
        raise BlasError(f"{what}: c and out must both be NumPy arrays or both CuPy arrays")
    if c.ndim != 2 or c.shape != out.shape or c.dtype != np.float32:
        raise BlasError(f"{what}: c must be a float32 {tuple(out.shape)} like out, got {c.dtype} {c.shape}")
    if not _row_pitch(c):
        raise BlasError(f"{what}: c must be C-contiguous or a view of rows each contiguous and evenly spaced")
    _check_c_act(True, act, what)
    (c0, c1), (o0, o1) = _span(c), _span(out)
    if (c0, c1) == (o0, o1) and _row_pitch(c) == _row_pitch(out):
        return  # C == D in place, D's very layout: out += op(a) @ op(b) (+ bias), which cuBLASLt documents
    if c0 < o1 and o0 < c1:
        raise BlasError(
            f"{what}: c overlaps out (bytes {c0:#x}-{c1:#x} and {o0:#x}-{o1:#x}): the kernel reads C while it "
            "writes D tile by tile, and cuBLASLt documents C == D only in place with D's very layout (pass c=out "
            "for that)"
        )


def _lt_numpy(a, b, out, bias, act: str, trans_a: bool, trans_b: bool, c=None) -> None:
    """:func:`gemm_lt`'s math on NumPy arrays (one entry of :func:`gemm_lt_batched`'s too): the bias, then ``c``,
    each added in float32 (the unfused path's order: the GEMM's bias epilogue, then seq.residual_add)."""
    res = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
    if bias is not None:
        res += bias
    if c is not None:
        res += c
    if act == "relu":
        np.maximum(res, np.float32(0), out=res)
    out[...] = res


def _bias_ptr(bias, what: str) -> int:
    """The bias's device address (0: none), refused unless cuBLASLt's bias epilogue can take it."""
    ptr = 0 if bias is None else bias.data.ptr
    if ptr % LT_ALIGN:
        raise BlasError(f"{what}: the bias must start at a multiple of {LT_ALIGN} bytes on the GPU (address {ptr:#x})")
    return ptr


def _batched_shapes(a, b, out, bias, act: str, trans_a: bool, trans_b: bool):
    """Check :func:`gemm_lt_batched`'s arguments; return ``(P, M, N, K, strides)``, the leading strides
    of a, b, out and the bias in elements (the bias's 0 without one)."""
    what = "gemm_lt_batched"
    for name, x in (("out", out), ("a", a), ("b", b), ("bias", bias)):
        if x is None:
            continue
        ndim = 2 if name == "bias" else 3
        if x.ndim != ndim:
            raise BlasError(f"{what}: {name} must be {ndim}-D (a leading batch axis), got shape {x.shape}")
        if x.dtype != np.float32:
            raise BlasError(f"{what}: {name} must be float32, got {x.dtype}")
        if x.shape[0] != out.shape[0]:
            raise BlasError(f"{what}: {name} has {x.shape[0]} entries, out has {out.shape[0]}")
        if x.strides[0] < 0 or x.strides[0] % x.itemsize:
            raise BlasError(
                f"{what}: {name}'s batch stride must be a non-negative number of elements, got {x.strides[0]} bytes"
            )
    P = out.shape[0]
    if P < 1:
        raise BlasError(f"{what}: the batch must have at least 1 entry, out has shape {out.shape}")
    m, n, k = _shapes(a[0], b[0], out[0], trans_a, trans_b, what, pitched=False)
    _check_lt_args(a[0], b[0], out[0], None if bias is None else bias[0], act, n, k, what)
    if P > 1 and out.strides[0] < m * n * out.itemsize:
        raise BlasError(
            f"{what}: out's entries overlap (batch stride {out.strides[0]} bytes, an entry is {m}x{n} floats)"
        )
    strides = tuple(0 if x is None else x.strides[0] // x.itemsize for x in (a, b, out, bias))
    return P, m, n, k, strides


def _check_entry_alignment(key: tuple, ptrs: tuple, strides: tuple, batch: int) -> None:
    """Refuse strides that give entry ``i`` another alignment class than entry 0 (the key counts a/b/out
    up to :data:`LT_ALIGN` bytes, the bias up to 256): alone, entry ``i`` would get another plan, maybe
    another algorithm, and the batch could not keep its single GEMM's bits."""
    if batch == 1:
        return
    for name, ptr, stride, cap in zip(("a", "b", "out", "bias"), ptrs, strides, (LT_ALIGN,) * 3 + (256,), strict=True):
        # entry i is ptr + i * stride bytes: it keeps entry 0's capped alignment a exactly when the stride is
        # a multiple of 2a (of the cap itself when a is the cap): 4 bytes apart, a 4-aligned entry 0 puts
        # entry 1 at 8
        need = min(2 * _alignment(ptr, cap), cap)
        if ptr and stride and _alignment(4 * stride, cap) < need:
            raise BlasError(
                f"gemm_lt_batched: {name}'s batch stride ({4 * stride} bytes) gives its entries other alignments "
                f"than entry 0's {_alignment(ptr, cap)} bytes (the plan of {_describe(key)}); make it a multiple of "
                f"{need} bytes so each entry keeps the plan, and the bits, of its single GEMM"
            )


#: the length of a batch-1 plan key (_lt_key: the row pitches of a, b and out at _LDS, then the residual c's
#: alignment and row pitch at _C, (0, 0) without one); a batched key appends (batch, strides of a, b, out, bias,
#: its algorithm choice of BATCHED_ALGOS)
_BASE_KEY = 17
_LDS, _C = slice(12, 15), slice(15, 17)


def _batch_key(key: tuple, batch: int, strides: tuple | None, algo: str = "single") -> tuple:
    """The plan key of ``batch`` GEMMs of ``key`` with leading ``strides`` (a, b, out, bias; elements)
    and the algorithm choice ``algo``. A batch of 1 under ``single`` is the single GEMM's own key: the same
    plan, the same call; under ``probe`` a key of its own (no strides), whose plan probes the heuristic's
    other candidates against the single one's."""
    if batch == 1:
        return key if algo == "single" else key + (1, 0, 0, 0, 0, str(algo))
    return key + (int(batch),) + tuple(int(x) for x in strides) + (str(algo),)


def _extents(key: tuple) -> tuple[int, int, int, int, int]:
    """Elements that a plan's a, b, out, bias and c span (a batch: the last entry's offset plus an entry; a
    single GEMM on views: the last row's offset plus a row; c: 0 without one, never batched)."""
    m, n, k, trans_a, trans_b = key[:5]
    lda, ldb, ldc = key[_LDS]
    (ra, ca), (rb, cb) = ((k, m) if trans_a else (m, k)), ((n, k) if trans_b else (k, n))
    sizes = ((ra - 1) * lda + ca, (rb - 1) * ldb + cb, (m - 1) * ldc + n, n)
    batch, *strides = key[_BASE_KEY : _BASE_KEY + 5] or (1, 0, 0, 0, 0)
    c_ld = key[_C][1]
    c_size = (m - 1) * c_ld + n if c_ld else 0
    return tuple(size + stride * (batch - 1) for size, stride in zip(sizes, strides, strict=True)) + (c_size,)


def _strided(xp, shape: tuple[int, int], batch: int, stride: int):
    """A zero float32 ``[batch, *shape]`` view of one fresh buffer, its entries ``stride`` elements apart."""
    rows, cols = shape
    buf = xp.zeros(rows * cols + stride * (batch - 1), dtype=np.float32)
    return xp.lib.stride_tricks.as_strided(buf, shape=(batch, rows, cols), strides=(4 * stride, 4 * cols, 4))


def _lt_plan(key: tuple, bias_ptr: int, stream) -> _LtPlan:
    """The plan of ``key``, made now (outside any capture) if it has none; a batched key's batch-1 plan
    first, whose algorithm the batch runs."""
    plan = _plans.get(key)
    if plan is None:
        if stream.is_capturing():
            raise BlasError(
                f"gemm_lt: no cuBLASLt plan for {_describe(key)} inside a capture; plans are made at a key's "
                "first call outside any capture: run the step once eagerly first (StepGraph.run_eager), "
                "or call blas.gemm_lt_prepare for this shape before capturing"
            )
        if len(key) > _BASE_KEY:
            _lt_plan(key[:_BASE_KEY], bias_ptr, stream)
        plan = _plans[key] = _LtPlan(key, bias_ptr, stream.ptr)
    return plan


def _lt_run(
    plan: _LtPlan, a: int, b: int, out: int, bias: int, workspace: int, stream: int, algo=None, c: int = 0
) -> None:
    """One ``cublasLtMatmul`` of ``plan`` on device addresses (``bias`` 0: none; ``stream`` 0: the legacy
    default stream; ``c``: the residual of a plan with one, else 0: C is D, read with beta 0), with the plan's
    algorithm or ``algo`` (a probe's candidate). The bias pointer is a descriptor attribute, written here for
    this call."""
    lib = _lt_lib()
    if bias:
        _set_attr(
            lib.cublasLtMatmulDescSetAttribute,
            plan.desc,
            _DESC_BIAS_POINTER,
            ctypes.c_void_p(bias),
            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)",
        )
    d = ctypes.c_void_p(out)
    _, _, layout_c, _ = plan._layouts()
    # cuBLASLt's A is the row-major b (read as b^T), its B the row-major a: D = op(b)^T op(a)^T (+ beta C).
    _check(
        lib.cublasLtMatmul(
            _lt_handle(),
            plan.desc,
            ctypes.byref(plan.alpha),
            ctypes.c_void_p(b),
            plan.layout_a,
            ctypes.c_void_p(a),
            plan.layout_b,
            ctypes.byref(plan.beta),
            ctypes.c_void_p(c) if c else d,
            layout_c,
            d,
            plan.layout_d,
            ctypes.byref(plan.algo if algo is None else algo),
            ctypes.c_void_p(workspace),
            WORKSPACE_BYTES,
            ctypes.c_void_p(stream),
        ),
        "cublasLtMatmul",
    )


def _alignment(ptr: int, cap: int) -> int:
    """The largest power of two (at most ``cap``) that divides ``ptr``."""
    return min(cap, ptr & -ptr) if ptr else cap


def _aligns(key: tuple) -> tuple[int, int, int, int]:
    """The alignments in bytes of a key's a, b, out and C (the residual's, else out's: C is D)."""
    al_a, al_b, al_out = key[7:10]
    return al_a, al_b, al_out, key[_C][0] or al_out


def _packed_lds(m: int, n: int, k: int, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    """The row pitches of packed (C-contiguous) a, b and out: their row lengths."""
    return (m if trans_a else k, k if trans_b else n, n)


def _lt_key(
    m,
    n,
    k,
    trans_a,
    trans_b,
    bias_ptr,
    act,
    tf32,
    a_ptr,
    b_ptr,
    out_ptr,
    split_k: bool = True,
    lds=None,
    *,
    c_ptr: int | None = None,
    c_ld: int | None = None,
) -> tuple:
    """A plan's key. Operands count by alignment up to LT_ALIGN (a plan assumes that much); the bias
    (at least LT_ALIGN-aligned on the GPU) by its alignment up to 256, because the heuristic reads
    the bias pointer to learn it. ``lds``: the row pitches (leading dimensions) of a, b and out, packed by
    default (the layouts carry them; cuBLASLt reads a row's alignment from them). ``c_ptr`` and ``c_ld``: the
    residual c's address (its alignment) and row pitch, the key's last two fields; ``(0, 0)`` without one. A
    single row's pitch is its length (what :func:`_row_pitch` reads from a one-row view, whatever its parent),
    so a plan made for ``M = 1`` with any ``c_ld`` is the one its call finds."""
    packed = _packed_lds(m, n, k, trans_a, trans_b)
    lds = tuple(int(x) for x in (packed if lds is None else lds))
    # an operand of one row has no pitch to read (_row_pitch gives its row length): the key a call on such a
    # view computes, so a key named from shapes (prepare, plan_key) says the same (the top SSM block's z GEMM
    # over one sample: x[W - 1 :: W] and out's head columns at the last rows, one row each)
    rows = (k if trans_a else m, n if trans_b else k, m)
    lds = tuple(w if r <= 1 else ld for ld, w, r in zip(lds, packed, rows, strict=True))
    if any(ld < w for ld, w in zip(lds, packed, strict=True)):
        raise BlasError(f"gemm_lt: row pitches {lds} shorter than the rows {packed} of a, b and out")
    c = (0, 0)
    if c_ptr is not None:
        c_ld = int(n if c_ld is None or m == 1 else c_ld)
        if c_ld < n:
            raise BlasError(f"gemm_lt: c's row pitch {c_ld} is shorter than its rows of {n}")
        c = (_alignment(c_ptr, LT_ALIGN), c_ld)
    al = tuple(_alignment(p, LT_ALIGN) for p in (a_ptr, b_ptr, out_ptr))
    bias_al = _alignment(bias_ptr, 256) if bias_ptr else 0
    return (
        (int(m), int(n), int(k), bool(trans_a), bool(trans_b), _EPILOGUES[(bool(bias_ptr), act)], bool(tf32))
        + al
        + (bias_al, bool(split_k))
        + lds
        + c
    )


def _aligned_key(m, n, k, trans_a, trans_b, bias_ptr, act, tf32, split_k, lds, c_ld) -> tuple:
    """:func:`_lt_key` for a, b, out (and c, if ``c_ld`` is not None) aligned to :data:`LT_ALIGN` bytes: the key
    of a plan made before its operands exist (:func:`gemm_lt_prepare`, :func:`plan_key`)."""
    c_ptr = None if c_ld is None else LT_ALIGN
    al = (LT_ALIGN,) * 3
    return _lt_key(m, n, k, trans_a, trans_b, bias_ptr, act, tf32, *al, split_k, lds, c_ptr=c_ptr, c_ld=c_ld)


def _describe(key: tuple) -> str:
    m, n, k, ta, tb, epi, tf32, al_a, al_b, al_out, al_bias, split_k = key[:12]
    lds, (al_c, c_ld) = key[_LDS], key[_C]
    packed = tuple(lds) == _packed_lds(m, n, k, ta, tb)
    pitch = "" if packed else f", row pitches a/b/out {'/'.join(map(str, lds))} elements"
    if c_ld:
        pitch += f", residual c aligned to {al_c} bytes with row pitch {c_ld}"
    batch = ""
    if len(key) > _BASE_KEY:
        count, *strides, algo = key[_BASE_KEY:]
        batch = f", batch {count} with strides a/b/out/bias {'/'.join(map(str, strides))} elements, algo {algo}"
    return (
        f"[{m}x{k}] x [{k}x{n}] (trans_a={ta}, trans_b={tb}, epilogue {epi}, tf32={tf32}, "
        f"alignment a/b/out/bias {al_a}/{al_b}/{al_out}/{al_bias} bytes, split_k={split_k}{pitch}{batch})"
    )


# --- the cuBLAS and cuBLASLt libraries, per-stream handles, plans -----------------------------
_state = threading.local()
_lib_cache = []
_lib_paths: dict[str, str] = {}
_handles: dict[int, _Handle] = {}
_lt_cache = []
_lt_handles: list = []
_plans: dict[tuple, _LtPlan] = {}
_cu_cache: list = []


def _check(status: int, what: str) -> None:
    if status != 0:
        raise BlasError(f"{what} returned cuBLAS status {status}")


def _set_attr(setter, obj, attr: int, value, what: str) -> None:
    """One ``cublasLt*SetAttribute(obj, attr, &value, sizeof(value))`` call, checked."""
    _check(setter(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), what)


def _declare(lib, signatures: dict) -> None:
    """Give each named C function its argument types; every one returns a ``cublasStatus_t``."""
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int


def _find_loaded(pattern: str) -> str | None:
    """The path of a shared library of this process whose path matches ``pattern``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if re.search(pattern, path):
                    return path
    except OSError:
        pass
    return None


def _open(name: str, pattern: str, beside: str | None = None) -> ctypes.CDLL:
    """Open ``lib<name>.so``: the copy already loaded, else one next to ``beside``, else the one
    ``cuda.pathfinder`` finds (the CUDA libraries CuPy uses)."""
    path = _find_loaded(pattern)
    if path is None and beside:
        found = sorted(Path(beside).parent.glob(f"lib{name}.so*"))
        path = str(found[0]) if found else None
    if path is None:
        try:
            from cuda import pathfinder

            path = pathfinder.load_nvidia_dynamic_lib(name).abs_path
        except Exception as exc:
            raise BlasError(f"cannot locate the {name} library CuPy uses ({exc})") from None
    _lib_paths[name] = path
    return ctypes.CDLL(path)


def _lib():
    if _lib_cache:
        return _lib_cache[0]
    from cupy_backends.cuda.libs import cublas as _cupy_cublas  # noqa: F401  (loads libcublas)

    lib = _open("cublas", r"/libcublas\.so")
    vp, ci = ctypes.c_void_p, ctypes.c_int
    fp = ctypes.POINTER(ctypes.c_float)
    _declare(
        lib,
        {
            "cublasCreate_v2": [ctypes.POINTER(vp)],
            "cublasDestroy_v2": [vp],
            "cublasSetStream_v2": [vp, vp],
            "cublasSetWorkspace_v2": [vp, vp, ctypes.c_size_t],
            "cublasSetMathMode": [vp, ci],
            "cublasSgemm_v2": [vp, ci, ci, ci, ci, ci, fp, vp, ci, vp, ci, fp, vp, ci],
        },
    )
    _lib_cache.append(lib)
    return lib


_NO_HANDLE = (
    "gemm inside a capture on a stream with no prepared cuBLAS handle: call blas.prepare(stream) before capture"
)


class _Handle:
    """A stream's workspace and its cuBLAS handle (made at the first need of one: :func:`gemm` on the stream,
    or :func:`prepare`; a stream with only cuBLASLt GEMMs needs the workspace alone, and cublasCreate with
    its warm-up GEMMs cost about 90 ms of a GPU evaluation's start on an H200 at 95f3251)."""

    def __init__(self, stream):
        import cupy

        self.stream = stream
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        _after_caller(stream)  # the workspace's block came from the caller's stream
        self.ptr = None  # the cuBLAS handle, once made

    def cublas(self) -> ctypes.c_void_p:
        """The stream's cuBLAS handle, made now if it has none (outside any capture)."""
        if self.ptr is not None:
            return self.ptr
        if self.stream.is_capturing():
            raise BlasError(_NO_HANDLE)
        import cupy

        lib = _lib()
        h = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate_v2")
        _check(lib.cublasSetStream_v2(h, ctypes.c_void_p(self.stream.ptr)), "cublasSetStream_v2")
        _check(
            lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(self.workspace.data.ptr), WORKSPACE_BYTES),
            "cublasSetWorkspace_v2",
        )
        # cuBLAS initialises lazily at its first GEMM on a handle, which fails inside a capture
        # (seen on an H200: CUBLAS_STATUS_EXECUTION_FAILED); so run one of each math mode now.
        x, y = cupy.ones((8, 8), dtype=np.float32), cupy.empty((8, 8), dtype=np.float32)
        _after_caller(self.stream)  # x's fill, and whatever last used y's block, before the GEMMs write y
        with self.stream:
            for tf32 in (False, True):
                _check(lib.cublasSetMathMode(h, _TF32_MATH if tf32 else _DEFAULT_MATH), "cublasSetMathMode")
                one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
                px, py = ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(y.data.ptr)
                _check(
                    lib.cublasSgemm_v2(
                        h,
                        _CUBLAS_OP_N,
                        _CUBLAS_OP_N,
                        8,
                        8,
                        8,
                        ctypes.byref(one),
                        px,
                        8,
                        px,
                        8,
                        ctypes.byref(zero),
                        py,
                        8,
                    ),
                    "cublasSgemm_v2 (warm-up)",
                )
        self.stream.synchronize()
        self.ptr = h
        return h


def prepare(stream) -> None:
    """Create the handle and workspace for ``stream``; call before capturing on it."""
    release_queued()
    h = _handles.get(stream.ptr)
    if h is None or h.ptr is None:
        if stream.is_capturing():
            raise BlasError("blas.prepare inside a capture: the handle and its workspace must exist before capture")
        if h is None:
            h = _handles[stream.ptr] = _Handle(stream)
        h.cublas()


def _after_caller(stream) -> None:
    """Order ``stream`` after the work issued so far on the caller's current stream, before a GEMM on
    ``stream`` writes memory just allocated on the caller's stream. CuPy's pool hands a block freed on a
    stream back out on that stream at once (stream order makes it safe there), so the block may be one
    that the caller's pending work still reads: a temporary whose copy kernel has not run yet. Seen on
    an H100 and an H200 under load as 64 to 256 zero bytes in an agent's weight-decay mask
    (``Adam.mask[...] = xp.asarray(mask)``'s source, overwritten by the next SideStream's warm-up GEMM
    output): weight decay skipped on one row of the first layer (docs/bench/gpu1_s22.sh D)."""
    from .graph import follow_caller

    follow_caller(stream)


def prepared() -> set[int]:
    """The stream pointers that have a workspace now (and a cuBLAS handle, once one was needed)."""
    return set(_handles)


def release(stream_ptr: int) -> None:
    """Destroy the handle of the stream ``stream_ptr`` and free its workspace. Only after every graph that
    captured a GEMM on that stream is gone; a later GEMM on the stream prepares a new one (outside capture)."""
    h = _handles.pop(int(stream_ptr), None)
    if h is not None and h.ptr is not None:
        _check(_lib().cublasDestroy_v2(h.ptr), "cublasDestroy_v2")


def release_with(owner, stream) -> None:
    """Release ``stream``'s handle and workspace once ``owner`` is garbage-collected (the object that made
    the stream and whose graphs captured GEMMs on it: once it is gone, nothing can replay them). Without
    it every trainer a process builds keeps a handle and a 32 MiB workspace for each of its streams until
    exit: the GPU suite's thousand trainers ran cublasCreate out of memory. The finalizer only queues the
    stream (it may run inside a capture, where a synchronisation or a cublasDestroy would invalidate
    it); :func:`prepare`, which runs outside any capture, releases the queue, and so does
    :meth:`cudarl.population.Population.close` (a process that prepares no stream again would otherwise
    keep them until exit)."""
    weakref.finalize(owner, _released.append, stream)


#: streams whose owners are gone, waiting for :func:`prepare` to release their handles
_released: list = []


def release_queued() -> None:
    """Release the handles of streams whose owners are gone (:func:`release_with`). Inside a capture it
    does nothing (the queue waits for the next call): the synchronisation and ``cublasDestroy`` it makes
    would invalidate the capture. :func:`prepare` calls it; so do an owner's ``close`` (after a
    ``gc.collect()``, so that owners in reference cycles are gone) and a caller measuring allocations,
    first, so that the releases of earlier owners do not land inside its measurement."""
    if not _released or _capturing():
        return
    while _released:
        stream = _released.pop()
        stream.synchronize()  # no replay still running reads the workspace about to go back to the pool
        release(stream.ptr)


def _capturing() -> bool:
    """Whether this thread is inside a capture: a :class:`cudarl.graph.StepGraph` capturing (its
    kernel context is not ``ungraphed``) or CuPy's current stream capturing (no CuPy loaded: no
    capture can be under way)."""
    if kernels.current_context() != kernels.UNGRAPHED:
        return True
    cupy = sys.modules.get("cupy")
    return cupy is not None and bool(cupy.cuda.get_current_stream().is_capturing())


def _handle_for(stream) -> _Handle:
    """The stream's :class:`_Handle`, its workspace made now if it has none (outside any capture); its
    cuBLAS handle is made by :meth:`_Handle.cublas` at the first :func:`gemm` on it."""
    h = _handles.get(stream.ptr)
    if h is None:
        if stream.is_capturing():
            raise BlasError(_NO_HANDLE)
        release_queued()
        h = _handles[stream.ptr] = _Handle(stream)
    return h


class _LtAlgo(ctypes.Structure):
    """``cublasLtMatmulAlgo_t``."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _LtHeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``."""

    _fields_ = [
        ("algo", _LtAlgo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def _heuristic(lib, desc, layouts: tuple, aligns: tuple, split_k: bool, count: int) -> list:
    """``cublasLtMatmulAlgoGetHeuristic``'s first ``count`` algorithms (:class:`_LtHeuristicResult`, in its
    order, those with a success state) for the problem of ``desc`` and ``layouts`` (A, B, C, D), operands
    aligned to ``aligns`` = (a, b, out, c) bytes of the row-major call (:func:`_aligns`), within
    :data:`WORKSPACE_BYTES` and, without ``split_k``, one-kernel algorithms only (no reduction scheme). The single
    plans' choice
    (``count`` 1) and a batched plan's candidates (:meth:`_LtPlan._probe`) both ask here."""
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    results, returned = (_LtHeuristicResult * count)(), ctypes.c_int(0)
    try:
        al_a, al_b, al_out, al_c = aligns
        settings = [
            (_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES), "MAX_WORKSPACE_BYTES"),
            (_PREF_MIN_ALIGNMENT_A, ctypes.c_uint32(al_b), "MIN_ALIGNMENT_A_BYTES"),  # cuBLASLt's A is b
            (_PREF_MIN_ALIGNMENT_B, ctypes.c_uint32(al_a), "MIN_ALIGNMENT_B_BYTES"),
            (_PREF_MIN_ALIGNMENT_C, ctypes.c_uint32(al_c), "MIN_ALIGNMENT_C_BYTES"),
            (_PREF_MIN_ALIGNMENT_D, ctypes.c_uint32(al_out), "MIN_ALIGNMENT_D_BYTES"),
        ]
        if not split_k:  # only algorithms with no reduction scheme: one kernel, K not split
            settings.append((_PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(0), "REDUCTION_SCHEME_MASK"))
        for a, v, name in settings:
            _set_attr(
                lib.cublasLtMatmulPreferenceSetAttribute, pref, a, v, f"cublasLtMatmulPreferenceSetAttribute({name})"
            )
        _check(
            lib.cublasLtMatmulAlgoGetHeuristic(
                _lt_handle(),
                desc,
                *layouts,
                pref,
                count,
                ctypes.cast(results, ctypes.POINTER(_LtHeuristicResult)),
                ctypes.byref(returned),
            ),
            "cublasLtMatmulAlgoGetHeuristic",
        )
    finally:
        lib.cublasLtMatmulPreferenceDestroy(pref)
    return [r for r in results[: max(0, min(returned.value, count))] if r.state == 0]


def _algo_config(algo: _LtAlgo) -> dict:
    """A readable ``cublasLtMatmulAlgo_t``: its id, tile (by name), stages and the other configuration
    attributes (``cublasLtMatmulAlgoConfigGetAttribute``, each checked)."""
    lib, out = _lt_lib(), {}
    for name, attr, ctype in _ALGO_CONFIG:
        value, written = ctype(0), ctypes.c_size_t(0)
        _check(
            lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(algo), attr, ctypes.byref(value), ctypes.sizeof(value), ctypes.byref(written)
            ),
            f"cublasLtMatmulAlgoConfigGetAttribute({name})",
        )
        out[name] = int(value.value)
    out["tile_name"] = _TILES[out["tile"]] if out["tile"] < len(_TILES) else f"tile#{out['tile']}"
    return out


def batched_plan_info() -> dict:
    """Per batched plan made in this process, and per probed single GEMM (``gemm_lt(algo="probe")``: a batch
    of 1), keyed by :func:`plan_key`'s form: a record of what it
    chose: ``shape`` (``"[MxK] x [KxN]"``), ``m n k trans_a trans_b epilogue tf32``, ``batch``, ``mode``
    (:data:`BATCHED_ALGOS`), ``single`` and ``chosen`` (the single plan's algorithm and the batch's:
    ``algo_id``, ``tile``, ``tile_name``, ``stages``, ``splitk``, ``reduction``, ``swizzle``, ``custom``,
    ``inner_shape``, ``cluster_shape``), ``candidates`` (algorithms the heuristic returned for the batch,
    ``probe`` only), ``probed`` (those run against the single one), ``equal`` (each probe's verdict, in
    order), ``probes`` (per probed candidate, in order: its ``algo_id``, ``tile_name``, ``stages``, ``equal``
    and ``us``, the median time of one batched GEMM on the probe's buffers, None where not equal, so not
    timed), ``single_us`` (the single algorithm's time there; None where no candidate was equal or under
    ``single``), ``chosen_index`` (the index in ``probes`` of the adopted candidate, None: the single one),
    ``changed`` (the batch runs another algorithm than the single one: a bitwise equal candidate faster
    than it), ``cached`` (``probe``: the verdict, and these fields, were an earlier process's, read from
    :mod:`cudarl.probe_cache` instead of probing again) and ``recall`` (``probe``: ``entry``, the kept
    verdict's file stem, and ``outcome``: ``taken``, ``no entry`` or why the entry was not taken; None under
    ``single``). Copies: changing them changes no plan. The
    algorithms are read here, not when the plans are made (a plan under ``single`` makes no call it did
    not make before)."""
    return {
        key: {
            **p.info,
            "equal": list(p.info["equal"]),
            "probes": [dict(c) for c in p.info["probes"]],
            "single": _algo_config(p.single_algo),
            "chosen": _algo_config(p.algo),
            "recall": dict(p.recall) if p.recall is not None else None,
        }
        for key, p in _plans.items()
        if p.info is not None
    }


def _lt_lib():
    if _lt_cache:
        return _lt_cache[0]
    if _find_loaded(r"/libcublasLt\.so") is None:
        _lib()  # libcublas, as CuPy loads it, loads libcublasLt, its dependency
    lib = _open("cublasLt", r"/libcublasLt\.so", beside=_lib_paths.get("cublas"))
    vp, ci, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    pvp = ctypes.POINTER(vp)
    _declare(
        lib,
        {
            "cublasLtCreate": [pvp],
            "cublasLtMatmulDescCreate": [pvp, ci, ci],
            "cublasLtMatmulDescDestroy": [vp],
            "cublasLtMatmulDescSetAttribute": [vp, ci, vp, sz],
            "cublasLtMatrixLayoutCreate": [pvp, ci, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
            "cublasLtMatrixLayoutDestroy": [vp],
            "cublasLtMatrixLayoutSetAttribute": [vp, ci, vp, sz],
            "cublasLtMatmulPreferenceCreate": [pvp],
            "cublasLtMatmulPreferenceDestroy": [vp],
            "cublasLtMatmulPreferenceSetAttribute": [vp, ci, vp, sz],
            "cublasLtMatmulAlgoGetHeuristic": [
                vp,
                vp,
                vp,
                vp,
                vp,
                vp,
                vp,
                ci,
                ctypes.POINTER(_LtHeuristicResult),
                ctypes.POINTER(ci),
            ],
            # handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result
            "cublasLtMatmulAlgoCheck": [vp] * 6 + [ctypes.POINTER(_LtAlgo), ctypes.POINTER(_LtHeuristicResult)],
            # algo, attribute, buffer, its size, bytes written
            "cublasLtMatmulAlgoConfigGetAttribute": [ctypes.POINTER(_LtAlgo), ci, vp, sz, ctypes.POINTER(sz)],
            # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, its size, stream
            "cublasLtMatmul": [vp] * 14 + [sz, vp],
        },
    )
    lib.cublasLtGetVersion.argtypes, lib.cublasLtGetVersion.restype = [], sz  # a version, not a status
    _lt_cache.append(lib)
    return lib


def _lt_handle():
    """The process's one cuBLASLt handle (not bound to a stream: each call names its stream)."""
    if not _lt_handles:
        h = ctypes.c_void_p()
        _check(_lt_lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        _lt_handles.append(h)
    return _lt_handles[0]


def _probe_context() -> tuple[str, int, int]:
    """What besides the key decides a probe's verdict: the GPU model and compute capability, cuBLASLt's
    version and the driver's (:mod:`cudarl.probe_cache`'s entry name)."""
    import cupy

    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return (
        f"{name} sm_{dev.compute_capability}",
        int(_lt_lib().cublasLtGetVersion()),
        int(cupy.cuda.runtime.driverGetVersion()),
    )


class _EventTimer:
    """A probe's timer: a stream of its own (non-blocking) and two CUDA events on it. :meth:`median_us`
    captures :data:`PROBE_REPEATS` back-to-back launches into a CUDA graph (so the host's launch cost is
    not timed, as in the joined step's graph), replays it :data:`PROBE_WARMUP` times, then times
    :data:`PROBE_WARMUP` + 2 replays: the median replay's time over the launches in it."""

    def __init__(self):
        cu, self.events = _cu(), []
        self.stream = ctypes.c_void_p()
        _cu_check(cu.cuStreamCreate(ctypes.byref(self.stream), 1), "probe: cuStreamCreate")  # NON_BLOCKING
        for _ in range(2):
            e = ctypes.c_void_p()
            _cu_check(cu.cuEventCreate(ctypes.byref(e), 0), "probe: cuEventCreate")
            self.events.append(e)

    def median_us(self, launch) -> float:
        """The time (us) of one ``launch(stream)`` (on the timer's stream), as above."""
        cu, (start, end), s = _cu(), self.events, self.stream
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        _cu_check(cu.cuStreamBeginCapture_v2(s, _CAPTURE_MODE_RELAXED), "probe: cuStreamBeginCapture")
        try:
            for _ in range(PROBE_REPEATS):
                launch(s.value or 0)
        finally:
            _cu_check(cu.cuStreamEndCapture(s, ctypes.byref(graph)), "probe: cuStreamEndCapture")
        try:
            _cu_check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0), "probe: cuGraphInstantiate")
            times, ms = [], ctypes.c_float(0.0)
            for i in range(2 * PROBE_WARMUP + 2):
                _cu_check(cu.cuEventRecord(start, s), "probe: cuEventRecord")
                _cu_check(cu.cuGraphLaunch(exe, s), "probe: cuGraphLaunch")
                _cu_check(cu.cuEventRecord(end, s), "probe: cuEventRecord")
                _cu_check(cu.cuEventSynchronize(end), "probe: cuEventSynchronize")
                _cu_check(cu.event_elapsed_time(ctypes.byref(ms), start, end), "probe: cuEventElapsedTime")
                if i >= PROBE_WARMUP:
                    times.append(ms.value * 1e3 / PROBE_REPEATS)
            return float(np.median(times))
        finally:
            if exe.value:
                cu.cuGraphExecDestroy(exe)
            if graph.value:
                cu.cuGraphDestroy(graph)

    def destroy(self) -> None:
        cu = _cu()
        for e in self.events:
            cu.cuEventDestroy_v2(e)
        if self.stream.value:
            cu.cuStreamSynchronize(self.stream)
            cu.cuStreamDestroy_v2(self.stream)
        self.events, self.stream = [], ctypes.c_void_p()


class _LtPlan:
    """The matmul descriptor, the three matrix layouts and the algorithm of one :func:`gemm_lt` key, or
    of a :func:`gemm_lt_batched` key: its layouts carry the batch, and its algorithm is the one its
    batch-1 key's plan chose (made first: :func:`_lt_plan`), so entry ``i`` runs the single GEMM's kernel
    configuration. Under ``algo="single"`` the heuristic is not asked again for the batch: for another
    problem it may pick another algorithm, and the entries would lose the single GEMM's bits. Under
    ``algo="probe"`` it is asked, and a candidate is adopted only where a probe found its output bitwise
    the single algorithm's and its time shorter (:meth:`_probe`). ``stream``: where a probe runs (0: the
    legacy default stream). A batched plan's :attr:`info` is its :func:`batched_plan_info` record.

    A key with a residual c (its ``_C`` fields) has a C layout of its own (c's row pitch) and ``beta = 1``;
    without one, C is D and ``beta = 0``."""

    def __init__(self, key: tuple, bias_ptr: int, stream: int = 0):
        m, n, k, trans_a, trans_b, epilogue, tf32, _, _, _, _, split_k = key[:12]
        lib = _lt_lib()
        self.desc = ctypes.c_void_p()
        self.layout_a, self.layout_b, self.layout_d = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self.layout_c = ctypes.c_void_p()  # a residual's (NULL without one: C is D)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if key[_C][1] else 0.0)
        self.algo = _LtAlgo()
        self.info: dict | None = None
        self.recall: dict | None = None  # probe only: the kept verdict asked for, and what came of it
        try:
            self._describe_problem(lib, m, n, k, trans_a, trans_b, epilogue, tf32, bias_ptr, key[_LDS], key[_C][1])
            if len(key) > _BASE_KEY:
                self._batch(lib, key, stream)
            else:
                self._choose(lib, m, n, k, epilogue, tf32, _aligns(key), split_k)
        except BaseException:
            self.destroy()
            raise

    def _layouts(self) -> tuple:
        """cuBLASLt's A, B, C and D layouts (C is D where the plan has no residual: beta is 0)."""
        return self.layout_a, self.layout_b, self.layout_c if self.layout_c.value else self.layout_d, self.layout_d

    def _batch(self, lib, key: tuple, stream: int) -> None:
        """Give the layouts the batch count and strides (cuBLASLt's A is the row-major b, its B the
        row-major a), the descriptor the bias's batch stride, and take the batch-1 plan's algorithm once
        ``cublasLtMatmulAlgoCheck`` accepts it for the batch (and its workspace fits); under ``probe``, a
        batched candidate instead where :meth:`_probe` finds one with the same bits that runs faster."""
        count, stride_a, stride_b, stride_out, stride_bias, algo = key[_BASE_KEY:]
        batch_layouts = ((self.layout_a, stride_b), (self.layout_b, stride_a), (self.layout_d, stride_out))
        for lay, stride in batch_layouts if count > 1 else ():  # a probed single GEMM keeps its layouts
            for attr, value, name in (
                (_LAYOUT_BATCH_COUNT, ctypes.c_int32(count), "BATCH_COUNT"),
                (_LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride), "STRIDED_BATCH_OFFSET"),
            ):
                _set_attr(
                    lib.cublasLtMatrixLayoutSetAttribute, lay, attr, value, f"cublasLtMatrixLayoutSetAttribute({name})"
                )
        if stride_bias:
            _set_attr(
                lib.cublasLtMatmulDescSetAttribute,
                self.desc,
                _DESC_BIAS_BATCH_STRIDE,
                ctypes.c_int64(stride_bias),
                "cublasLtMatmulDescSetAttribute(BIAS_BATCH_STRIDE)",
            )
        single = _plans[key[:_BASE_KEY]]
        result = _LtHeuristicResult()
        status = lib.cublasLtMatmulAlgoCheck(
            _lt_handle(), self.desc, *self._layouts(), ctypes.byref(single.algo), ctypes.byref(result)
        )
        if status != 0 or result.workspaceSize > WORKSPACE_BYTES:
            raise BlasError(
                f"gemm_lt_batched: the algorithm of the single GEMM's plan does not take {_describe(key)} "
                f"(cublasLtMatmulAlgoCheck status {status}, workspace {result.workspaceSize} bytes of "
                f"{WORKSPACE_BYTES}); another algorithm would not keep each entry's bits"
            )
        self.algo = _LtAlgo.from_buffer_copy(single.algo)
        self.single_algo = _LtAlgo.from_buffer_copy(single.algo)  # what batched_plan_info compares with
        m, n, k, trans_a, trans_b, epilogue, tf32 = key[:7]
        self.info = {
            "shape": f"[{m}x{k}] x [{k}x{n}]",
            "m": m, "n": n, "k": k, "trans_a": trans_a, "trans_b": trans_b, "epilogue": epilogue, "tf32": tf32,
            "batch": count, "mode": algo,
            "candidates": 0, "probed": 0, "equal": [], "probes": [], "single_us": None, "chosen_index": None,
            "changed": False, "cached": False,
        }  # fmt: skip
        if algo == "probe":
            self._probe_or_recall(lib, key, stream)

    def _probe_or_recall(self, lib, key: tuple, stream: int) -> None:
        """:meth:`_probe`, or its verdict for the same key, single algorithm, GPU model, cuBLASLt build and
        probe settings from an earlier process (:mod:`cudarl.probe_cache`), taken where
        ``cublasLtMatmulAlgoCheck`` still accepts its algorithm; a probe run here is kept for the next.
        :attr:`recall` says which entry was asked for and what came of it (``batched_plan_info``)."""
        verdicts = probe_cache.ProbeVerdicts()
        name = verdicts.name(*_probe_context(), repr(key), bytes(self.single_algo).hex(), PROBE_CANDIDATES,
                             PROBE_WARMUP, PROBE_REPEATS, _PROBE_SEED)  # fmt: skip
        record = verdicts.load(name, repr(key))
        why = "no entry" if record is None else self._recall(lib, record)
        self.recall = {"entry": name, "outcome": why or "taken"}
        if why is None:
            return
        self._probe(lib, key, stream)
        chosen = bytes(self.algo).hex() if self.info["changed"] else None
        verdicts.store(name, repr(key), {"algo": chosen, "info": self.info})

    def _recall(self, lib, record: dict) -> str | None:
        """Adopt a kept verdict (``record``: ``algo``, the adopted algorithm's bytes in hex or None for the
        single one, and the probe's ``info``): None, or why it does not fit this plan."""
        info, chosen = record.get("info"), record.get("algo")
        if not isinstance(info, dict) or set(info) != set(self.info):
            return "fields differ"
        if chosen is not None:
            try:
                raw = bytes.fromhex(chosen)
            except (TypeError, ValueError):
                return "algorithm not hex"
            if len(raw) != ctypes.sizeof(_LtAlgo):
                return f"algorithm of {len(raw)} bytes, not {ctypes.sizeof(_LtAlgo)}"
            algo, result = _LtAlgo.from_buffer_copy(raw), _LtHeuristicResult()
            status = lib.cublasLtMatmulAlgoCheck(
                _lt_handle(), self.desc, *self._layouts(), ctypes.byref(algo), ctypes.byref(result)
            )
            if status != 0 or result.workspaceSize > WORKSPACE_BYTES:
                return f"refused by cublasLtMatmulAlgoCheck: status {status}, workspace {result.workspaceSize} bytes"
            self.algo = algo
        self.info = {**info, "cached": True}
        return None

    def _probe(self, lib, key: tuple, stream: int) -> None:
        """Ask the heuristic for up to :data:`PROBE_CANDIDATES` one-kernel algorithms of the batched problem;
        in its order, run each that is not the single plan's algorithm on the same random inputs of the
        key's shapes, strides, alignments and epilogue as the single algorithm, and keep those whose whole
        output is bitwise the single algorithm's. Time the single algorithm and each kept one on the same
        buffers (:class:`_EventTimer`: a CUDA graph of :data:`PROBE_REPEATS` launches on a stream of the
        timer's own, CUDA events) and adopt the fastest; the single one where it is fastest (ties included) or none is
        equal. Outside any capture only (plans are made before capture); the buffers are allocated once
        here and freed at the end. The added build time: a run per candidate, and per equal candidate and
        the single one a graph capture and instantiation and ``2 * PROBE_WARMUP + 2`` replays of
        :data:`PROBE_REPEATS` GEMMs of a few to a few hundred microseconds each."""
        cu = _cu()
        capturing = ctypes.c_int(0)
        status = cu.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(capturing))
        if kernels.current_context() != kernels.UNGRAPHED or status != 0 or capturing.value != 0:
            raise BlasError(
                f"gemm_lt_batched: the probe of {_describe(key)} cannot run inside a stream capture "
                f"(cuStreamIsCapturing status {status}, capture status {capturing.value}): make batched plans "
                "before capture (gemm_lt_prepare, or an eager step first)"
            )
        found = _heuristic(lib, self.desc, self._layouts(), _aligns(key), False, PROBE_CANDIDATES)
        # a candidate of the single algorithm's configuration (id, tile, stages, ...) is the single one
        mine = _algo_config(self.algo)
        others = [r.algo for r in found if bytes(r.algo) != bytes(self.algo) and _algo_config(r.algo) != mine]
        self.info["candidates"] = len(found)
        if not others:
            return
        al_a, al_b, al_out, al_bias = key[7:11]
        al_c = key[_C][0]
        ext_a, ext_b, ext_out, ext_bias, ext_c = _extents(key)
        rng = np.random.default_rng(_PROBE_SEED)
        k = key[2]
        host = {
            "a": rng.standard_normal(ext_a, dtype=np.float32),
            "b": (rng.standard_normal(ext_b) / np.sqrt(k)).astype(np.float32),
            "bias": rng.standard_normal(ext_bias, dtype=np.float32) if al_bias else None,
            "c": rng.standard_normal(ext_c, dtype=np.float32) if ext_c else None,
        }
        s = ctypes.c_void_p(stream)
        with _DeviceScratch("gemm_lt_batched probe") as scratch:

            def upload(x: np.ndarray, align: int) -> int:
                # the key's alignment exactly: a 256-byte aligned allocation plus ``align`` bytes (below 256)
                p = scratch.alloc(x.nbytes + 256) + (align % 256)
                _cu_check(cu.cuMemcpyHtoDAsync_v2(p, x.ctypes.data, x.nbytes, s), "probe: cuMemcpyHtoDAsync")
                return p

            a, b = upload(host["a"], al_a), upload(host["b"], al_b)
            bias = upload(host["bias"], al_bias) if al_bias else 0
            c = upload(host["c"], al_c) if ext_c else 0
            outs = [scratch.alloc(4 * ext_out + 256) + (al_out % 256) for _ in range(2)]
            work = scratch.alloc(WORKSPACE_BYTES)

            def run(out: int, algo) -> np.ndarray:
                _cu_check(cu.cuMemsetD32Async(out, 0x7FC00001, ext_out, s), "probe: cuMemsetD32Async")  # a NaN
                _lt_run(self, a, b, out, bias, work, stream, algo, c=c)
                got = np.empty(ext_out, np.uint32)
                _cu_check(cu.cuMemcpyDtoHAsync_v2(got.ctypes.data, out, got.nbytes, s), "probe: cuMemcpyDtoHAsync")
                _cu_check(cu.cuStreamSynchronize(s), "probe: cuStreamSynchronize")
                return got

            want = run(outs[0], self.algo)
            equal_ones = []
            for cand in others:
                equal = bool(np.array_equal(run(outs[1], cand), want))
                cfg = _algo_config(cand)
                self.info["probed"] += 1
                self.info["equal"].append(equal)
                self.info["probes"].append(
                    {"algo_id": cfg["algo_id"], "tile_name": cfg["tile_name"], "stages": cfg["stages"],
                     "equal": equal, "us": None}
                )  # fmt: skip
                if equal:
                    equal_ones.append((len(self.info["probes"]) - 1, cand))
            if not equal_ones:
                return
            timer = _EventTimer()
            try:
                self.info["single_us"] = best = timer.median_us(
                    lambda t: _lt_run(self, a, b, outs[0], bias, work, t, c=c)
                )
                for i, cand in equal_ones:
                    us = timer.median_us(lambda t, al=cand: _lt_run(self, a, b, outs[1], bias, work, t, al, c=c))
                    self.info["probes"][i]["us"] = us
                    if us < best:
                        best, self.info["chosen_index"] = us, i
            finally:
                timer.destroy()
            if self.info["chosen_index"] is not None:
                self.algo = _LtAlgo.from_buffer_copy(dict(equal_ones)[self.info["chosen_index"]])
                self.info["changed"] = True

    def _describe_problem(self, lib, m, n, k, trans_a, trans_b, epilogue, tf32, bias_ptr, lds, c_ld: int) -> None:
        """The matmul descriptor and the column-major layouts of one GEMM (``lds``: the row pitches of the
        row-major a, b and out; ``c_ld``: the residual c's, 0 without one)."""
        compute = _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute, _CUDA_R_32F), "cublasLtMatmulDescCreate")

        def attr(a: int, v, name: str) -> None:
            _set_attr(lib.cublasLtMatmulDescSetAttribute, self.desc, a, v, f"cublasLtMatmulDescSetAttribute({name})")

        attr(_DESC_TRANSA, ctypes.c_int32(_CUBLAS_OP_T if trans_b else _CUBLAS_OP_N), "TRANSA")
        attr(_DESC_TRANSB, ctypes.c_int32(_CUBLAS_OP_T if trans_a else _CUBLAS_OP_N), "TRANSB")
        attr(_DESC_EPILOGUE, ctypes.c_uint32(epilogue), "EPILOGUE")
        if bias_ptr:  # the heuristic reads its alignment; each call sets its own pointer
            attr(_DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr), "BIAS_POINTER")
        # Column-major layouts (rows, cols, ld) of the row-major buffers: b [K, N] (or [N, K]) is the
        # column-major [N, K] (or [K, N]) with ld = its row pitch; likewise a; out [M, N] is D = [N, M].
        b_rows, b_cols = (n, k) if trans_b else (k, n)
        a_rows, a_cols = (k, m) if trans_a else (m, k)
        lda, ldb, ldc = lds
        # c [M, N] with its own row pitch is a column-major [N, M] C beside D (out of place, any ldc)
        for lay, rows, cols, ld in (
            (self.layout_a, b_cols, b_rows, ldb),
            (self.layout_b, a_cols, a_rows, lda),
            (self.layout_d, n, m, ldc),
            *(((self.layout_c, n, m, c_ld),) if c_ld else ()),
        ):
            _check(
                lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), _CUDA_R_32F, rows, cols, ld),
                "cublasLtMatrixLayoutCreate",
            )

    def _choose(self, lib, m, n, k, epilogue, tf32, aligns, split_k) -> None:
        """The heuristic's first algorithm for the operands' alignments (:func:`_aligns`; one-kernel only without
        split_k)."""
        found = _heuristic(lib, self.desc, self._layouts(), aligns, split_k, 1)
        if not found:
            raise BlasError(
                f"cublasLtMatmulAlgoGetHeuristic found no algorithm for [{m}x{k}] x [{k}x{n}], "
                f"epilogue {epilogue}, tf32={tf32}"
            )
        self.algo = _LtAlgo.from_buffer_copy(found[0].algo)

    def destroy(self) -> None:
        lib = _lt_lib()
        for lay in (self.layout_a, self.layout_b, self.layout_c, self.layout_d):
            if lay.value:
                lib.cublasLtMatrixLayoutDestroy(lay)
        if self.desc.value:
            lib.cublasLtMatmulDescDestroy(self.desc)
