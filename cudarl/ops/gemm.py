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


def _aligned(*arrays) -> bool:
    """CuPy float32, C-contiguous and 16-byte aligned, every one."""
    return all(t.dtype == np.float32 and t.flags.c_contiguous and t.data.ptr % 16 == 0 for t in arrays)


def eligible(*arrays, K: int, N: int, trans_b: bool = False) -> bool:
    """Can a GEMM with these operands (CuPy, float32, C-contiguous) take the panel kernels? K and N
    multiples of 4, every pointer 16-byte aligned, the panels within :data:`MAX_SMEM`."""
    return K % 4 == 0 and N % 4 == 0 and K > 0 and smem_bytes(K, trans_b) <= MAX_SMEM and _aligned(*arrays)


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


#: cuda_src/gemm.cu's GEMM_CHAIN_LAYERS and GEMM_CHAIN_CLUSTER: the most layers a chain launch takes, and
#: the blocks of a cluster (so the widest layer, CHAIN_CLUSTER tiles of 32 columns).
CHAIN_LAYERS, CHAIN_CLUSTER = 4, 8
CHAIN_MAX_N = CHAIN_CLUSTER * TILE


def chain_smem_bytes(widths) -> int:
    """Shared memory of a chain launch over layer inputs of ``widths`` (K of each layer): the largest
    layer's :func:`smem_bytes` at K rounded up to 4 (the first layer's panel over any observation width)."""
    return max(smem_bytes(-(-int(K) // 4) * 4, False) for K in widths)


def chain_eligible(x, layers) -> bool:
    """Can :func:`chain` run ``layers`` (``[(w [K, N], b [N], y [M, N], act), ...]``) from ``x [M, K0]``?
    CuPy float32 operands, a device with thread block clusters (compute capability 9.0 or later), 1 to
    :data:`CHAIN_LAYERS` layers whose widths are multiples of 4 and at most :data:`CHAIN_MAX_N`, weights,
    biases and outputs C-contiguous and 16-byte aligned, no output overlapping another operand, x with unit
    column stride (any row pitch and width), and the panels within :data:`MAX_SMEM`."""
    if not 1 <= len(layers) <= CHAIN_LAYERS or x.ndim != 2 or x.dtype != np.float32 or x.strides[1] != 4:
        return False
    if x.strides[0] % 4 or _compute_capability() < 90:
        return False
    K = x.shape[1]
    widths = []
    for w, b, y, _act in layers:
        N = w.shape[1] if w.ndim == 2 else -1
        if w.shape != (K, N) or b.shape != (N,) or y.shape != (x.shape[0], N) or N % 4 or not 0 < N <= CHAIN_MAX_N:
            return False
        if not _aligned(w, b, y):
            return False
        widths.append(K)
        K = N
    ys = [y for _, _, y, _ in layers]
    reads = [x, *(t for w, b, *_ in layers for t in (w, b))]
    return chain_smem_bytes(widths) <= MAX_SMEM and _disjoint(ys, reads)


def _compute_capability() -> int:
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def _chain_grid(M: int) -> tuple:
    """A chain launch's grid: a cluster of :data:`CHAIN_CLUSTER` blocks a 32-row slab."""
    return (CHAIN_CLUSTER, max(1, (M + TILE - 1) // TILE))


def _chain_slots(layers, axis: int) -> list:
    """A chain kernel's :data:`CHAIN_LAYERS` layer slots, each ``(three pointers, width, act)``: ``layers``'
    ``(p0, p1, p2, act)`` with the width ``p0.shape[axis]`` (the step's output columns: p0 is its weight), then
    the unused slots as the last layer's pointers with width and act 0 (never read: the kernel's ``layers``
    stops its loop)."""
    slots = []
    for i in range(CHAIN_LAYERS if layers else 0):  # (no layers: the launcher refuses them after this)
        *ptrs, act = layers[min(i, len(layers) - 1)]
        used = i < len(layers)
        slots += [*ptrs, ptrs[0].shape[axis] if used else 0, int(act) if used else 0]
    return slots


def chain(x, layers) -> None:
    """``y_0 = act_0(x @ w_0 + b_0)``, then ``y_l = act_l(y_{l-1} @ w_l + b_l)``, in one launch (thread block
    clusters of :data:`CHAIN_CLUSTER` blocks a 32-row slab, cuda_src/gemm.cu): x ``[M, K0]``; ``layers``
    ``[(w [K_l, N_l], b [N_l], y [M, N_l], act_l), ...]``, act 0 identity or 1 ReLU. Every ``y_l`` is
    written: bit for bit :func:`nn_bias_act` of the layer's input (from x too where K0 is a multiple of 4
    and x 16-byte aligned). See :func:`chain_eligible`."""
    M, K0 = x.shape
    _launch_chain(
        "chain",
        layers,
        chain_eligible(x, layers),
        f"float32 layers chained by shape, widths multiples of 4 up to {CHAIN_MAX_N}, aligned contiguous "
        "weights, biases and outputs overlapping nothing",
        M,
        (x, M, K0, x.strides[0] // 4, len(layers), *_chain_slots(layers, axis=1)),
        chain_smem_bytes([K0] + [w_.shape[1] for w_, *_ in layers[:-1]]),
    )


def _launch_chain(op: str, layers, eligible: bool, needs: str, M: int, args: tuple, smem: int) -> None:
    """The chain launchers' shared tail: the activation codes checked, the launcher's eligibility (``needs``
    says what it asks), then ``gemm.<op>`` over ``M`` rows (:func:`_chain_grid`) with ``args``."""
    w = f"gemm.{op}"
    _check(w, all(int(a) in (0, 1) for *_, a in layers), "activation codes must be 0 or 1")
    _check(
        w,
        eligible,
        f"needs 1 to {CHAIN_LAYERS} {needs}, and a device with clusters (compute capability 9.0 or later; see "
        f"{op}_eligible)",
    )
    launch("gemm", op, _chain_grid(M), THREADS, args, shared_mem=smem)


def _span(t) -> tuple:
    """The byte range ``[first, past last)`` a 2-D (or contiguous) array with non-negative strides touches."""
    if t.size == 0:
        return t.data.ptr, t.data.ptr
    last = sum((n - 1) * st for n, st in zip(t.shape, t.strides, strict=True))
    return t.data.ptr, t.data.ptr + last + t.itemsize


def _disjoint(outs, ins) -> bool:
    """No array of ``outs`` overlaps another of ``outs`` or one of ``ins`` (their byte ranges, :func:`_span`)."""
    span = [_span(t) for t in (*outs, *ins)]
    return not any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(span[: len(outs)]) for b0, b1 in span[i + 1 :])


def chain_backward_eligible(d, layers) -> bool:
    """Can :func:`chain_backward` run ``layers`` (``[(w [k_i, n_i], y [M, k_i], dx [M, k_i], act), ...]``) from
    ``d [M, n_top]``? CuPy float32 operands, C-contiguous and 16-byte aligned, a device with thread block
    clusters (compute capability 9.0 or later), 1 to :data:`CHAIN_LAYERS` steps chained by shape (``n_0 =
    n_top``, ``n_i = k_{i-1}``), n_top a multiple of 4, each k_i a multiple of 4 and at most
    :data:`CHAIN_MAX_N`, no dx overlapping another operand, and the panels within :data:`MAX_SMEM`."""
    if not 1 <= len(layers) <= CHAIN_LAYERS or d.ndim != 2 or not _aligned(d) or _compute_capability() < 90:
        return False
    M, N = d.shape
    if N % 4 or N == 0:
        return False
    widths = []
    for w, y, dx, _act in layers:
        k = w.shape[0] if w.ndim == 2 else -1
        if w.shape != (k, N) or y.shape != (M, k) or dx.shape != (M, k) or k % 4 or not 0 < k <= CHAIN_MAX_N:
            return False
        if not _aligned(w, y, dx):
            return False
        widths.append(N)
        N = k
    dxs = [dx for _, _, dx, _ in layers]
    reads = [d, *(t for w, y, *_ in layers for t in (w, y))]
    return chain_backward_smem_bytes(widths) <= MAX_SMEM and _disjoint(dxs, reads)


def chain_backward_smem_bytes(widths) -> int:
    """Shared memory of a :func:`chain_backward` launch over steps that sum over ``widths`` (n_i of each):
    the largest step's nt panels (:func:`smem_bytes` with ``trans_b``)."""
    return max(smem_bytes(int(n), True) for n in widths)


def chain_backward(d, layers, accumulate: bool = False) -> None:
    """The backward's dx chain in one launch (thread block clusters of :data:`CHAIN_CLUSTER` blocks a 32-row
    slab, cuda_src/gemm.cu): ``dx_0 = mask_0(d @ w_0^T)``, then ``dx_i = mask_i(dx_{i-1} @ w_i^T)``. d
    ``[M, n_top]`` is dz of the top layer; ``layers`` ``[(w [k_i, n_i], y [M, k_i], dx [M, k_i], act_i), ...]``:
    the weight of the step's layer (``n_0 = n_top``, ``n_i = k_{i-1}``), the output of the layer below it, its
    dz (written), act 1 the ReLU mask ``y > 0 ? v : 0`` or 0 none. Every ``dx_i`` is bit for bit :func:`nt`
    of the step's input, then ``nn.act_backward``. ``accumulate``: the first step adds ``dx_0``'s old values to
    its product before the mask (``mask_0(d @ w_0^T + dx_0)``). See :func:`chain_backward_eligible`."""
    M, n_top = d.shape
    _launch_chain(
        "chain_backward",
        layers,
        chain_backward_eligible(d, layers),
        f"float32 steps chained by shape, widths multiples of 4 (k_i up to {CHAIN_MAX_N}), aligned contiguous "
        "operands, outputs overlapping nothing",
        M,
        (M, len(layers), d, n_top, int(bool(accumulate)), *_chain_slots(layers, axis=0)),
        chain_backward_smem_bytes([n_top] + [w_.shape[0] for w_, *_ in layers[:-1]]),
    )
