"""Launchers for ``cuda_src/selectivity.cu`` (twin: ``cudarl/reference/selectivity.py``, the equations).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.selectivity import OVER, n_gates
from ._arrays import check

F32 = np.float32
THREADS = 256  # must equal SL_THREADS


def _shape(where, x, logit, W, C, F, over):
    B = x.shape[0]
    if over not in OVER or W * C != x.shape[1] or not 0 < F <= C:
        raise ValueError(f"{where}: over={over!r}, W={W}, C={C}, F={F} do not fit x of shape {tuple(x.shape)}")
    check(where, "x", x, F32, (B, W * C))
    check(where, "logit", logit, F32, (n_gates(W, F, over),))
    return B


def forward(x, logit, out, W: int, C: int, F: int, over: str, stream=None) -> None:
    """``out [B, W * C]`` = the gated ``x``."""
    B = _shape("selectivity.forward", x, logit, W, C, F, over)
    check("selectivity.forward", "out", out, F32, tuple(x.shape))
    args = (x, logit, out, B, int(W), int(C), int(F), OVER.index(over))
    launch("selectivity", "forward", min(blocks_for(x.size), 4096), 256, args, stream=stream)


def backward(x, dxg, logit, dlogit, W: int, C: int, F: int, over: str, l1: float, stream=None) -> None:
    """``dlogit [J]`` = dL/d(gate logits), the L1 penalty's gradient included (written)."""
    B = _shape("selectivity.backward", x, logit, W, C, F, over)
    check("selectivity.backward", "dxg", dxg, F32, tuple(x.shape))
    check("selectivity.backward", "dlogit", dlogit, F32, tuple(logit.shape))
    args = (x, dxg, logit, dlogit, B, int(W), int(C), int(F), OVER.index(over), float(l1))
    launch("selectivity", "backward", logit.shape[0], THREADS, args, stream=stream)


def _fold_shape(where, w, logit, W, C, F, over) -> int:
    if over not in OVER or w.ndim != 2 or w.shape[0] != W * C or not 0 < F <= C:
        raise ValueError(f"{where}: over={over!r}, W={W}, C={C}, F={F} do not fit a weight of shape {tuple(w.shape)}")
    check(where, "w", w, F32, tuple(w.shape))
    check(where, "logit", logit, F32, (n_gates(W, F, over),))
    return int(w.shape[1])


def fold(w, logit, out, W: int, C: int, F: int, over: str, stream=None) -> None:
    """``out [W C, H] = diag(s_ext) w``: the gate folded into the first layer's weight (written)."""
    H = _fold_shape("selectivity.fold", w, logit, W, C, F, over)
    check("selectivity.fold", "out", out, F32, tuple(w.shape))
    args = (w, logit, out, int(W), int(C), int(F), OVER.index(over), H)
    launch("selectivity", "fold", min(blocks_for(w.size), 4096), 256, args, stream=stream)


def fold_backward(w, logit, dw, dlogit, W: int, C: int, F: int, over: str, l1: float, stream=None) -> None:
    """From ``dw [W C, H]`` = dL/d(the folded weight): ``dlogit [J]`` (the L1 penalty's gradient included) and,
    in place, ``dw`` = dL/dw (written)."""
    H = _fold_shape("selectivity.fold_backward", w, logit, W, C, F, over)
    check("selectivity.fold_backward", "dw", dw, F32, tuple(w.shape))
    check("selectivity.fold_backward", "dlogit", dlogit, F32, tuple(logit.shape))
    args = (w, logit, dw, dlogit, int(W), int(C), int(F), OVER.index(over), H, float(l1))
    launch("selectivity", "fold_backward", logit.shape[0], THREADS, args, stream=stream)
