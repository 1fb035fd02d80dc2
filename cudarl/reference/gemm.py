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


def chain(x: np.ndarray, layers) -> None:
    """``y_0 = act_0(x @ w_0 + b_0)``, then ``y_l = act_l(y_{l-1} @ w_l + b_l)``: the composition of
    :func:`nn_bias_act` over ``layers`` ``[(w [K_l, N_l], b [N_l], y [M, N_l], act_l), ...]``, every ``y_l``
    written (x ``[M, K0]``)."""
    h = x
    for w, b, y, act in layers:
        nn_bias_act(h, w, b, y, act)
        h = y


def chain_backward(d: np.ndarray, layers, accumulate: bool = False) -> None:
    """The backward's dx chain: ``dx_0 = mask_0(d @ w_0^T)``, then ``dx_i = mask_i(dx_{i-1} @ w_i^T)``, the
    composition of :func:`nt` and the activation's backward (``cudarl.reference.nn.act_backward``: act 1 the
    ReLU mask ``where(y > 0, v, 0)``, 0 none) over ``layers`` ``[(w [k_i, n_i], y [M, k_i], dx [M, k_i], act_i),
    ...]``, every ``dx_i`` written (d ``[M, n_top]``, ``n_0 = n_top``, ``n_i = k_{i-1}``). ``accumulate``: the
    first step's product plus ``dx_0``'s old values, then its mask."""
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
