"""The panel GEMMs in NumPy: the twin of ``cuda_src/gemm.cu``.

The kernels sum each output over k = 0, 1, ..., K - 1 in order with fmaf; NumPy's matmul sums in
another order, so the parity tests compare within float32 rounding (against float64).
"""

from __future__ import annotations

import numpy as np

from .nn import act_backward as _act_backward  # the epilogue: the nn twin's (one act_bwd in both kernels)
from .nn import members


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


@members(2, 2, 2, 2)
def nt_act(a: np.ndarray, bt: np.ndarray, y: np.ndarray, out: np.ndarray, act: int, accumulate: bool = False) -> None:
    """``out = act'(a @ bt.T; y)``: :func:`nt`, then the activation backward of the layer whose output is
    ``y [M, N]`` (:func:`cudarl.reference.nn.act_backward`, act 0 identity, 1 ReLU, 2 sigmoid). ``accumulate``:
    ``out = act'(a @ bt.T + out; y)``, the product added onto ``out`` first (one rounded add an element).
    With the member axis (a ``[P, M, K]``, bt ``[P, N, K]``, y and out ``[P, M, N]``): this on each member's
    entries in turn (:func:`cudarl.reference.nn.members`)."""
    if accumulate:
        out += a @ bt.T
    else:
        nt(a, bt, out)
    _act_backward(out, y, out, act)
