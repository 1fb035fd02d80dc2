"""Selectivity: a learned gate over the input features (or the window's positions) with a sparsity
penalty; twin of ``cuda_src/selectivity.cu``.

The observation is ``x [B, W, C]`` (``W`` bars of ``C = F + 2`` columns: ``F`` features and the two
position columns, :mod:`cudarl.reference.window`). A gate ``s_j = sigmoid(l_j)`` multiplies the input
before the encoder (a feature-wise gate as in "Concrete"/L0 feature selection, Louizos, Welling &
Kingma 2018, here deterministic and relaxed; and the gating of the Temporal Fusion Transformer's
variable selection, Lim et al. 2021, without its per-sample network)::

    over = "features":   x'[b, w, c] = s_c x[b, w, c]     (c < F; one gate per feature, J = F)
    over = "positions":  x'[b, w, c] = s_w x[b, w, c]     (c < F; one gate per bar of the window, J = W)
    the position columns (c >= F) are never gated (the agent must see its own position)

    penalty = lambda (1/J) sum_j s_j                      (an L1 on the gates, which are >= 0)
    dL/dl_j = s_j (1 - s_j) (sum_{b, (w, c) in j} dL/dx'[b, w, c] x[b, w, c] + lambda / J)

Folded into the first layer (an encoder whose first Linear reads the whole input row: the MLP's ``W1
[W C, H]``, row ``r`` for input column ``r``): ``x' W1 = (x s_ext) W1 = x (diag(s_ext) W1)`` with ``s_ext[r]``
the gate of column ``r`` (1 on the position columns), so the forward reads ``W1g = diag(s_ext) W1``
(:func:`fold`, from the parameters alone) over the ungated input, and the backward turns the first layer's
weight gradient over that input, ``R = x^T dz = dL/dW1g``, into::

    dL/dW1[r, :] = s_ext[r] R[r, :]
    dL/dl_j = s_j (1 - s_j) (sum_{r in j} sum_k W1[r, k] R[r, k] + lambda / J)     (:func:`fold_backward`)

the same gradient as the gated input's (``sum_b dL/dx'[b, r] x[b, r] = sum_k W1[r, k] R[r, k]``) without the
input gradient ``dL/dx' = dz W1^T``. The bits differ from the unfolded path's: ``x (s W1)`` rounds where
``(x s) W1`` does not.

Our choices: the gate's logits start at ``INIT`` (``s = 0.95``: the agent starts seeing everything),
``lambda`` is ``agent.selectivity_l1``, and the penalty's gradient is added in the gate's backward
(its value is an observable, not part of the step's published loss).
"""

from __future__ import annotations

import numpy as np

#: The gate logits' initial value: sigmoid(INIT) = 0.95.
INIT = float(np.log(0.95 / 0.05))
#: Gate layouts.
OVER = ("features", "positions")


def n_gates(W: int, F: int, over: str) -> int:
    """``J``: gates of a window of ``W`` bars of ``F`` features."""
    return int(F) if over == "features" else int(W)


def gate_index(W: int, C: int, F: int, over: str) -> np.ndarray:
    """int ``[W * C]``: the gate of each column of one observation, -1 for an ungated column."""
    w, c = np.divmod(np.arange(W * C), C)
    j = c if over == "features" else w
    return np.where(c < F, j, -1)


def _sig(logit, dtype):
    return (1.0 / (1.0 + np.exp(-np.asarray(logit, np.float64)))).astype(dtype)


def forward(x, logit, W: int, C: int, F: int, over: str, compute_dtype=np.float32):
    """``x' [B, W * C]`` = the gated input (module docstring)."""
    idx = gate_index(W, C, F, over)
    s = np.concatenate([_sig(logit, compute_dtype), np.ones(1, compute_dtype)])  # index -1: ungated
    return (np.asarray(x, compute_dtype) * s[idx][None, :]).astype(compute_dtype)


def backward(x, dxg, logit, W: int, C: int, F: int, over: str, l1: float, compute_dtype=np.float32):
    """``dL/dl [J]`` from the input ``x [B, W * C]`` and ``dL/dx' [B, W * C]`` (module docstring)."""
    idx = gate_index(W, C, F, over)
    J = np.asarray(logit).shape[0]
    prod = (np.asarray(dxg, np.float64) * np.asarray(x, np.float64)).sum(0)  # [W * C]
    per = np.array([prod[idx == j].sum() for j in range(J)])
    s = _sig(logit, np.float64)
    return (s * (1.0 - s) * (per + float(l1) / J)).astype(compute_dtype)


def penalty(logit, l1: float) -> float:
    """``lambda (1/J) sum_j sigmoid(l_j)``."""
    return float(l1) * float(_sig(logit, np.float64).mean())


def fold(w, logit, out, W: int, C: int, F: int, over: str) -> None:
    """``out [W C, H] = diag(s_ext) w`` (module docstring), in ``out``'s dtype: the kernel's one product
    ``s_j w[r, k]`` per element (the position rows copied). Writes ``out``."""
    dtype = out.dtype.type
    s = np.concatenate([_sig(logit, dtype), np.ones(1, dtype)])[gate_index(W, C, F, over)]  # [W C]
    np.multiply(np.asarray(w, dtype), s[:, None], out=out)


def fold_backward(w, logit, dw, dlogit, W: int, C: int, F: int, over: str, l1: float) -> None:
    """From ``dw [W C, H]`` holding ``R = dL/dW1g``: ``dlogit [J]`` = dL/d(gate logits) (the L1 penalty's
    gradient included; the sums in float64) and, in place, ``dw[r, :] = s_ext[r] R[r, :]`` (the position rows
    left as they are), in ``dw``'s dtype (module docstring). Writes ``dw`` and ``dlogit``."""
    dtype = dw.dtype.type
    idx = gate_index(W, C, F, over)
    J = np.asarray(logit).shape[0]
    prod = (np.asarray(w, np.float64) * np.asarray(dw, np.float64)).sum(1)  # [W C], before the scaling
    per = np.array([prod[idx == j].sum() for j in range(J)])
    s64 = _sig(logit, np.float64)
    gated = idx >= 0
    dw[gated] = _sig(logit, dtype)[idx[gated]][:, None] * dw[gated]
    dlogit[...] = (s64 * (1.0 - s64) * (per + float(l1) / J)).astype(dlogit.dtype)
