"""The panel GEMMs in NumPy: the twin of ``cuda_src/gemm.cu``.

The kernels sum each output over k = 0, 1, ..., K - 1 in order with fmaf; NumPy's matmul sums in
another order, so the parity tests compare within float32 rounding (against float64).
"""

from __future__ import annotations

import numpy as np

from .nn import act_backward as _act_backward


def nn_bias_act(a: np.ndarray, b: np.ndarray, bias: np.ndarray, out: np.ndarray, act: int) -> None:
    """``out = act(a @ b + bias)``: a ``[M, K]``, b ``[K, N]``, bias ``[N]``, out ``[M, N]``;
    act 0 identity, 1 ReLU (after the bias, as cuBLASLt's RELU_BIAS epilogue)."""
    if act not in (0, 1):
        raise ValueError(f"gemm.nn_bias_act: activation code must be 0 or 1, got {act}")
    v = a @ b + bias
    out[...] = np.maximum(v, v.dtype.type(0)) if act == 1 else v


def nt(a: np.ndarray, bt: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ bt.T``: a ``[M, K]``, bt ``[N, K]``, out ``[M, N]``."""
    out[...] = a @ bt.T


def _members(lead: np.ndarray, layers, ranks: tuple, where: str) -> list:
    """The calls of one network a chain call holds, ``[(lead_i, layers_i), ...]``: member ``i``'s entries where
    its first operand ``lead`` (x or d) has a member axis (3 dimensions), which every layer's operands must
    then have too (``ranks``: their dimensions with it); else the call itself."""
    if lead.ndim != 3:
        return [(lead, layers)]
    P = lead.shape[0]
    for i, (*ts, _act) in enumerate(layers):
        if tuple(t.ndim for t in ts) != ranks or any(t.shape[0] != P for t in ts):
            raise ValueError(f"{where}: layer {i}'s operands {[t.shape for t in ts]} lack the member axis of {P}")
    return [(lead[i], [(*(t[i] for t in ts), act) for *ts, act in layers]) for i in range(P)]


def chain(x: np.ndarray, layers) -> None:
    """``y_0 = act_0(x @ w_0 + b_0)``, then ``y_l = act_l(y_{l-1} @ w_l + b_l)``: the composition of
    :func:`nn_bias_act` over ``layers`` ``[(w [K_l, N_l], b [N_l], y [M, N_l], act_l), ...]``, every ``y_l``
    written (x ``[M, K0]``). With a leading member axis on every operand (x ``[P, M, K0]``, w
    ``[P, K_l, N_l]``, b ``[P, N_l]``, y ``[P, M, N_l]``), member ``i`` is this over its entries ``[i]``."""
    for x_i, layers_i in _members(x, layers, (3, 2, 3), "gemm.chain"):
        _chain(x_i, layers_i)


def _chain(x: np.ndarray, layers) -> None:
    """:func:`chain` of one network."""
    h = x
    for w, b, y, act in layers:
        nn_bias_act(h, w, b, y, act)
        h = y


def chain_backward(d: np.ndarray, layers, accumulate: bool = False) -> None:
    """The backward's dx chain: ``dx_0 = mask_0(d @ w_0^T)``, then ``dx_i = mask_i(dx_{i-1} @ w_i^T)``, the
    composition of :func:`nt` and the activation's backward (``cudarl.reference.nn.act_backward``: act 1 the
    ReLU mask ``where(y > 0, v, 0)``, 0 none) over ``layers`` ``[(w [k_i, n_i], y [M, k_i], dx [M, k_i], act_i),
    ...]``, every ``dx_i`` written (d ``[M, n_top]``, ``n_0 = n_top``, ``n_i = k_{i-1}``). ``accumulate``: the
    first step's product plus ``dx_0``'s old values, then its mask. With a leading member axis on every operand
    (d ``[P, M, n_top]``, w ``[P, k_i, n_i]``, y and dx ``[P, M, k_i]``), member ``i`` is this over its entries
    ``[i]``."""
    for d_i, layers_i in _members(d, layers, (3, 3, 3), "gemm.chain_backward"):
        _chain_backward(d_i, layers_i, accumulate)


def _chain_backward(d: np.ndarray, layers, accumulate: bool) -> None:
    """:func:`chain_backward` of one network."""
    h = d
    for i, (w, y, dx, act) in enumerate(layers):
        if act not in (0, 1):
            raise ValueError(f"gemm.chain_backward: activation code must be 0 or 1, got {act}")
        if accumulate and i == 0:
            dx[...] = (h @ w.T) + dx
        else:
            nt(h, w, dx)
        _act_backward(dx, y, dx, act)
        h = dx
