"""Launchers for ``cuda_src/gemm.cu`` (twin: ``cudarl/reference/gemm.py``).

The panel GEMMs of the network's small shapes. Each launcher checks shapes, dtypes and the
kernels' alignment needs; :func:`eligible` says whether a call can take them (the layers fall
back to cuBLASLt otherwise). Nothing here allocates, synchronises or reads device memory.
"""

from __future__ import annotations

import numpy as np

from ..backend import address
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
#: The most members one chain launch takes (the grid's z dimension).
CHAIN_MAX_MEMBERS = 65535

# Members. Every operand of a chain call has a leading member axis ([P, M, K] inputs and outputs, [P, K, N]
# weights, [P, N] biases: a population's stacked buffers, cudarl/nn/stacked.py) or none (one network: the
# P = 1 case, each operand read as t[None]). Member z of an operand starts its member stride (elements)
# past member 0: one stride for x (any view), one for every weight and bias (one stacked parameter buffer),
# one for each layer's output (forward) or each step's y and dx (backward: a layer's out and dout rows),
# so the kernels take a few strides, not one an operand. Each member is what the single launch checks.


def chain_smem_bytes(widths) -> int:
    """Shared memory of a chain launch over layer inputs of ``widths`` (K of each layer): the largest
    layer's :func:`smem_bytes` at K rounded up to 4 (the first layer's panel over any observation width)."""
    return max(smem_bytes(-(-int(K) // 4) * 4, False) for K in widths)


def _lift(t, stacked: bool):
    """``t`` with its member axis: itself in a stacked call, else ``t[None]`` (one member)."""
    return t if stacked else t[None]


def _entry(t):
    """Member 0 of a ``[P, ...]`` operand as the kernel's pointer argument (``kernels.launch`` takes C-contiguous
    arrays): ``t[0]``, or where that has a row pitch (x), the 1-D view of the floats it spans (no copy)."""
    first = t[0]
    if first.flags.c_contiguous:
        return first
    import cupy

    lo, hi = _span(first)
    return cupy.ndarray(((hi - lo) // first.itemsize,), first.dtype, memptr=first.data)


def _member_stride(t) -> int:
    """The member stride of a ``[P, ...]`` operand in elements; 0 for one member (the kernel's offsets zero)."""
    return t.strides[0] // t.itemsize if t.shape[0] > 1 else 0


def _rows_dense(t) -> bool:
    """Each member of ``[P, ...]`` float32 ``t`` C-contiguous (sizes of 1 aside) and 16-byte aligned: member 0
    at a 16-byte address, members a multiple of 4 floats apart, none before another."""
    want, dense = t.itemsize, True
    for n, st in zip(reversed(t.shape[1:]), reversed(t.strides[1:]), strict=True):
        dense &= n == 1 or st == want
        want *= n
    apart = t.shape[0] == 1 or t.strides[0] >= 0 and t.strides[0] % 16 == 0
    return t.dtype == np.float32 and dense and address(t) % 16 == 0 and apart


def _members_apart(outs) -> bool:
    """No member of an output overlapping another member of it (its member stride at least its size)."""
    return all(t.shape[0] == 1 or t.strides[0] >= t[0].size * t.itemsize for t in outs)


def _count_refusal(layers, lead, what: str) -> str | None:
    """The refusals every chain call shares: the number of layers, the lead operand's dimensions."""
    if not 1 <= len(layers) <= CHAIN_LAYERS:
        return f"{len(layers)} {what}"
    if lead.ndim not in (2, 3):
        return f"a first operand of {lead.ndim} dimensions (not [M, K] or [P, M, K])"
    if not 1 <= (lead.shape[0] if lead.ndim == 3 else 1) <= CHAIN_MAX_MEMBERS:
        return f"{lead.shape[0]} members"
    return None


def _layout_refusal(params, outs, ins, what: str) -> str | None:
    """The refusals of the members' layout (``[P, ...]`` operands): ``params`` (every weight and bias) one
    member stride, ``outs`` overlapping nothing (their own other members included), ``ins`` read."""
    if params[0].shape[0] > 1 and len({_member_stride(t) for t in params}) > 1:
        return f"{what} of several member strides (one stacked parameter buffer has one)"
    if not (_members_apart(outs) and _disjoint(outs, [*params, *ins])):
        return "an output overlapping another operand, or its own other members"
    return None


def _chain_refusal(x, layers, cc: int) -> str | None:
    """What :func:`chain` cannot take in ``x`` and ``layers`` (see :func:`chain_eligible`), in words, or None;
    ``cc`` the device's compute capability (90: 9.0)."""
    why = _count_refusal(layers, x, "layers")
    if why is not None:
        return why
    stacked = x.ndim == 3
    x = _lift(x, stacked)
    P, M, K = x.shape
    if x.dtype != np.float32 or x.strides[2] != 4 or x.strides[1] % 4 or x.strides[0] % 4 or x.strides[0] < 0:
        return f"x {x.dtype} of strides {x.strides} (float32, unit column stride, whole-float row and member strides)"
    lifted, widths = _lift_layers(layers, stacked), []
    for i, (w, b, y, _act) in enumerate(lifted):
        if (w.ndim, b.ndim, y.ndim) != (3, 2, 3):
            return f"layer {i}'s operands of other dimensions than x's (every one with a member axis, or none)"
        N = w.shape[2]
        if w.shape != (P, K, N) or b.shape != (P, N) or y.shape != (P, M, N):
            return f"layer {i}'s w {w.shape}, b {b.shape}, y {y.shape} on an input {(P, M, K)}"
        if N % 4 or not 0 < N <= CHAIN_MAX_N:
            return f"layer {i} of {N} columns"
        if not all(_rows_dense(t) for t in (w, b, y)):
            return f"layer {i}'s operands not float32, dense and 16-byte aligned in every member"
        widths.append(K)
        K = N
    why = _layout_refusal([t for w, b, *_ in lifted for t in (w, b)], [y for _, _, y, _ in lifted], [x], "weights")
    if why is not None:
        return why
    if chain_smem_bytes(widths) > MAX_SMEM:
        return f"panels past {MAX_SMEM} bytes"
    return None if cc >= 90 else f"a device of compute capability {cc / 10:.1f}"


def chain_eligible(x, layers) -> bool:
    """Can :func:`chain` run ``layers`` (``[(w [K, N], b [N], y [M, N], act), ...]``, or each with a leading
    member axis) from ``x [M, K0]`` (or ``[P, M, K0]``)? CuPy float32 operands, all with a member axis or
    none, a device with thread block clusters (compute capability 9.0 or later), 1 to :data:`CHAIN_LAYERS`
    layers whose widths are multiples of 4 and at most :data:`CHAIN_MAX_N`, weights, biases and outputs
    C-contiguous and 16-byte aligned in every member, every weight and bias one member stride apart, no
    output overlapping another operand or its own other members, x with unit column stride (any row pitch,
    member stride and width), and the panels within :data:`MAX_SMEM`."""
    return _chain_refusal(x, layers, _compute_capability()) is None


def _compute_capability() -> int:
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def _chain_grid(M: int, P: int) -> tuple:
    """A chain launch's grid: a cluster of :data:`CHAIN_CLUSTER` blocks a 32-row slab, for each of P members."""
    return (CHAIN_CLUSTER, max(1, (M + TILE - 1) // TILE), P)


def _chain_slots(layers, axis: int) -> list:
    """A chain kernel's :data:`CHAIN_LAYERS` layer slots, each ``(three pointers, member stride, width, act)``:
    ``layers``' ``(p0, p1, p2, act)`` (each with its member axis) with p2's member stride (the step's output)
    and the width ``p0.shape[axis]`` (the step's output columns: p0 is its weight), then the unused slots as
    the last layer's pointers with stride, width and act 0 (never read: the kernel's ``layers`` stops its
    loop)."""
    slots = []
    for i in range(CHAIN_LAYERS):
        *ptrs, act = layers[min(i, len(layers) - 1)]
        used = i < len(layers)
        slots += [*map(_entry, ptrs), _member_stride(ptrs[2]) if used else 0, ptrs[0].shape[axis] if used else 0]
        slots.append(int(act) if used else 0)
    return slots


def _lift_layers(layers, stacked: bool) -> list:
    """``layers``' ``(p0, p1, p2, act)`` with their member axes (:func:`_lift`)."""
    return [(*(_lift(t, stacked) for t in ptrs), act) for *ptrs, act in layers]


def _refuse(op: str, layers, why: str | None, needs: str) -> None:
    """The chain launchers' checks: the activation codes, then what the launch cannot take (``why``, from
    the op's refusal; ``needs`` says what it asks)."""
    w = f"gemm.{op}"
    _check(w, all(int(a) in (0, 1) for *_, a in layers), "activation codes must be 0 or 1")
    _check(
        w,
        why is None,
        f"needs 1 to {CHAIN_LAYERS} {needs}, every operand with a member axis or none, and a device with clusters "
        f"(compute capability 9.0 or later; see {op}_eligible); got {why}",
    )


def chain(x, layers) -> None:
    """``y_0 = act_0(x @ w_0 + b_0)``, then ``y_l = act_l(y_{l-1} @ w_l + b_l)``, in one launch (thread block
    clusters of :data:`CHAIN_CLUSTER` blocks a 32-row slab, cuda_src/gemm.cu): x ``[M, K0]``; ``layers``
    ``[(w [K_l, N_l], b [N_l], y [M, N_l], act_l), ...]``, act 0 identity or 1 ReLU. Every ``y_l`` is
    written: bit for bit :func:`nn_bias_act` of the layer's input (from x too where K0 is a multiple of 4
    and x 16-byte aligned). With a leading member axis on every operand (x ``[P, M, K0]``, w ``[P, K_l, N_l]``,
    b ``[P, N_l]``, y ``[P, M, N_l]``: a population's), the P members' chains in the same launch, member
    ``i`` bit for bit the chain of its operands ``[i]`` alone. See :func:`chain_eligible`."""
    _refuse(
        "chain",
        layers,
        _chain_refusal(x, layers, _compute_capability()),
        f"float32 layers chained by shape, widths multiples of 4 up to {CHAIN_MAX_N}, aligned contiguous "
        "weights, biases and outputs overlapping nothing",
    )
    stacked = x.ndim == 3
    x, layers = _lift(x, stacked), _lift_layers(layers, stacked)
    P, M, K0 = x.shape
    launch(
        "gemm",
        "chain",
        _chain_grid(M, P),
        THREADS,
        (_entry(x), _member_stride(x), M, K0, x.strides[1] // 4, len(layers), _member_stride(layers[0][0]),
         *_chain_slots(layers, axis=2)),
        shared_mem=chain_smem_bytes([K0] + [w_.shape[2] for w_, *_ in layers[:-1]]),
    )  # fmt: skip


def _span(t) -> tuple:
    """The byte range ``[first, past last)`` an array with non-negative strides touches."""
    if t.size == 0:
        return address(t), address(t)
    last = sum((n - 1) * st for n, st in zip(t.shape, t.strides, strict=True))
    return address(t), address(t) + last + t.itemsize


def _disjoint(outs, ins) -> bool:
    """No array of ``outs`` overlaps another of ``outs`` or one of ``ins`` (their byte ranges, :func:`_span`)."""
    span = [_span(t) for t in (*outs, *ins)]
    return not any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(span[: len(outs)]) for b0, b1 in span[i + 1 :])


def _chain_backward_refusal(d, layers, cc: int) -> str | None:
    """What :func:`chain_backward` cannot take in ``d`` and ``layers`` (see :func:`chain_backward_eligible`),
    in words, or None; ``cc`` the device's compute capability (90: 9.0)."""
    why = _count_refusal(layers, d, "steps")
    if why is not None:
        return why
    stacked = d.ndim == 3
    d = _lift(d, stacked)
    P, M, N = d.shape
    if not _rows_dense(d):
        return "d not float32, dense and 16-byte aligned in every member"
    if N % 4 or N == 0:
        return f"d of {N} columns"
    lifted, widths = _lift_layers(layers, stacked), []
    for i, (w, y, dx, _act) in enumerate(lifted):
        if (w.ndim, y.ndim, dx.ndim) != (3, 3, 3):
            return f"step {i}'s operands of other dimensions than d's (every one with a member axis, or none)"
        k = w.shape[1]
        if w.shape != (P, k, N) or y.shape != (P, M, k) or dx.shape != (P, M, k):
            return f"step {i}'s w {w.shape}, y {y.shape}, dx {dx.shape} on an input {(P, M, N)}"
        if k % 4 or not 0 < k <= CHAIN_MAX_N:
            return f"step {i} of {k} columns"
        if not all(_rows_dense(t) for t in (w, y, dx)):
            return f"step {i}'s operands not float32, dense and 16-byte aligned in every member"
        if _member_stride(y) != _member_stride(dx):
            return f"step {i}'s y and dx of member strides {_member_stride(y)} and {_member_stride(dx)} (one for both)"
        widths.append(N)
        N = k
    dxs, reads = [dx for _, _, dx, _ in lifted], [d, *(y for _, y, *_ in lifted)]
    why = _layout_refusal([w for w, *_ in lifted], dxs, reads, "weights")
    if why is not None:
        return why
    if chain_backward_smem_bytes(widths) > MAX_SMEM:
        return f"panels past {MAX_SMEM} bytes"
    return None if cc >= 90 else f"a device of compute capability {cc / 10:.1f}"


def chain_backward_eligible(d, layers) -> bool:
    """Can :func:`chain_backward` run ``layers`` (``[(w [k_i, n_i], y [M, k_i], dx [M, k_i], act), ...]``, or
    each with a leading member axis) from ``d [M, n_top]`` (or ``[P, M, n_top]``)? CuPy float32 operands, all
    with a member axis or none, C-contiguous and 16-byte aligned in every member, a device with thread block
    clusters (compute capability 9.0 or later), 1 to :data:`CHAIN_LAYERS` steps chained by shape (``n_0 =
    n_top``, ``n_i = k_{i-1}``), n_top a multiple of 4, each k_i a multiple of 4 and at most
    :data:`CHAIN_MAX_N`, every weight one member stride apart, each step's y and dx one member stride apart
    (a layer's out and dout rows), no dx overlapping another operand or its own other members, and the
    panels within :data:`MAX_SMEM`."""
    return _chain_backward_refusal(d, layers, _compute_capability()) is None


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
    its product before the mask (``mask_0(d @ w_0^T + dx_0)``). With a leading member axis on every operand
    (d ``[P, M, n_top]``, w ``[P, k_i, n_i]``, y and dx ``[P, M, k_i]``), the P members' dx chains in the same
    launch, member ``i`` bit for bit the chain of its operands ``[i]`` alone. See
    :func:`chain_backward_eligible`."""
    _refuse(
        "chain_backward",
        layers,
        _chain_backward_refusal(d, layers, _compute_capability()),
        f"float32 steps chained by shape, widths multiples of 4 (k_i up to {CHAIN_MAX_N}), aligned contiguous "
        "operands, outputs overlapping nothing",
    )
    stacked = d.ndim == 3
    d, layers = _lift(d, stacked), _lift_layers(layers, stacked)
    P, M, n_top = d.shape
    launch(
        "gemm",
        "chain_backward",
        _chain_grid(M, P),
        THREADS,
        (M, len(layers), _entry(d), _member_stride(d), n_top, int(bool(accumulate)), _member_stride(layers[0][0]),
         *_chain_slots(layers, axis=1)),
        shared_mem=chain_backward_smem_bytes([n_top] + [w_.shape[1] for w_, *_ in layers[:-1]]),
    )  # fmt: skip
