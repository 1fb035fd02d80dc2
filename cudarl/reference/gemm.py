"""The panel GEMMs in NumPy: the twin of ``cuda_src/gemm.cu``.

The kernels sum each output over k = 0, 1, ..., K - 1 in order with fmaf; NumPy's matmul sums in
another order, so the parity tests compare within float32 rounding (against float64).
"""

from __future__ import annotations

import numpy as np


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
