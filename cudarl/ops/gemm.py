"""Launchers for ``cuda_src/gemm.cu`` (twin: ``cudarl/reference/gemm.py``).

The panel GEMMs of the network's small shapes. Each launcher checks shapes, dtypes and the
kernels' alignment needs; :func:`eligible` says whether a call can take them (the layers fall
back to cuBLASLt otherwise). Nothing here allocates, synchronises or reads device memory.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch

TILE, GROUP, KG = 32, 64, 4  # GEMM_T, GEMM_GROUP, GEMM_KG in cuda_src/gemm.cu
THREADS = GROUP * KG
#: Dynamic shared memory a launch may ask for (the opt-in limit of every sm_90 part).
MAX_SMEM = 227 * 1024


def lda(K: int) -> int:
    """A panel row's length in floats: K padded to 4 mod 32 (lda in cuda_src/gemm.cu)."""
    return K + (36 - K % 32) % 32


def smem_bytes(K: int, trans_b: bool) -> int:
    """Shared memory of a launch: the A panel [32, lda(K)] and the B panel ([32, lda(K)] or [K, 36]),
    at least the k groups' sums (3 x 16 x 64 floats), which overlay them once they are read."""
    panels = TILE * lda(K) + (TILE * lda(K) if trans_b else K * (TILE + 4))
    return 4 * max(panels, (KG - 1) * 16 * GROUP)


#: The panel kernels only for GEMMs of at most this many rows: tools/bench_gemm.py on an H200
#: (b3adc3f) gave 1.2x over cuBLASLt at 512 rows, the same at 1024 and 0.6x at 4096.
MAX_ROWS = 1024


def eligible(*arrays, K: int, N: int, trans_b: bool = False) -> bool:
    """Can a GEMM with these operands (CuPy, float32, C-contiguous) take the panel kernels? K and N
    multiples of 4, every pointer 16-byte aligned, the panels within :data:`MAX_SMEM`."""
    return (
        K % 4 == 0
        and N % 4 == 0
        and K > 0
        and smem_bytes(K, trans_b) <= MAX_SMEM
        and all(a.dtype == np.float32 and a.flags.c_contiguous and a.data.ptr % 16 == 0 for a in arrays)
    )


def _grid(M: int, N: int) -> tuple:
    return ((N + TILE - 1) // TILE, max(1, (M + TILE - 1) // TILE))


def _check(where: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {what}")


def nn_bias_act(a, b, bias, out, act: int) -> None:
    """``out [M, N] = act(a [M, K] @ b [K, N] + bias [N])``, act 0 identity or 1 ReLU."""
    w = "gemm.nn_bias_act"
    M, K = a.shape
    N = b.shape[1]
    _check(
        w,
        b.shape == (K, N) and bias.shape == (N,) and out.shape == (M, N),
        f"shapes a {a.shape}, b {b.shape}, bias {bias.shape}, out {out.shape} disagree",
    )
    _check(w, int(act) in (0, 1), f"activation code must be 0 or 1, got {act}")
    _check(
        w,
        eligible(a, b, bias, out, K=K, N=N),
        "needs float32 operands, K and N multiples of 4, 16-byte "
        f"alignment and panels within {MAX_SMEM} bytes (see eligible)",
    )
    launch(
        "gemm",
        "nn_bias_act",
        _grid(M, N),
        THREADS,
        (a, b, bias, out, M, N, K, int(act)),
        shared_mem=smem_bytes(K, False),
    )


def nt(a, bt, out) -> None:
    """``out [M, N] = a [M, K] @ bt [N, K]^T`` (a Linear's dx = dz W^T)."""
    w = "gemm.nt"
    M, K = a.shape
    N = bt.shape[0]
    _check(
        w, bt.shape == (N, K) and out.shape == (M, N), f"shapes a {a.shape}, bt {bt.shape}, out {out.shape} disagree"
    )
    _check(
        w,
        eligible(a, bt, out, K=K, N=N, trans_b=True),
        "needs float32 operands, K and N multiples of 4, "
        f"16-byte alignment and panels within {MAX_SMEM} bytes (see eligible)",
    )
    launch(
        "gemm",
        "nt",
        _grid(M, N),
        THREADS,
        (a, bt, out, M, N, K),
        shared_mem=smem_bytes(K, True),
    )
