"""Launchers for ``cuda_src/homeostatic.cu`` (twin: ``cudarl/reference/homeostatic.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch
from ..reference.homeostatic import THREADS, partials
from ._arrays import check, check_counter

F32 = np.float32
MAX_ACTIONS = 32  # HS_MAXA: a sample's s_a in a warp's shared slots


def probs_control(logits, p, part, m, g, state, done, target: float, weight: float) -> None:
    """``p [R, K]`` = the softmax of each row of float32 ``logits [R, K]``; ``part [NB, K]`` its blocks'
    column sums, ``m [K]`` the batch-mean masses (the twin's order), ``g [K]`` and ``state [3] = [loss, u,
    H]``, in 1 launch. ``NB`` = :func:`cudarl.reference.homeostatic.partials` (R); ``done`` is a uint32
    ``[1]`` ticket counter, 0 before the launch and left 0."""
    w = "homeostatic.probs_control"
    R, K = logits.shape
    nb = partials(R)
    check(w, "logits", logits, F32, (R, K))
    check(w, "p", p, F32, (R, K))
    check(w, "part", part, F32, (nb, K))
    check(w, "m", m, F32, (K,))
    check(w, "g", g, F32, (K,))
    check(w, "state", state, F32, (3,))
    check_counter(w, "done", done)
    args = (logits, p, part, m, g, state, done, R, K, float(target), float(weight))
    launch("homeostatic", "probs_control", nb, THREADS, args)


def grad_dueling(p, g, dva) -> None:
    """``dva [B, (1 + A) K]`` += the homeostatic loss's gradient on C51's raw output, from ``p [B, A, K]``
    and ``g [K]`` (the logits' gradient through the dueling combine), in 1 launch; ``A <= 32``."""
    w = "homeostatic.grad_dueling"
    B, A, K = p.shape
    if not 1 <= A <= MAX_ACTIONS:
        raise ValueError(f"{w}: 1 to {MAX_ACTIONS} actions, got {A}")
    check(w, "p", p, F32, (B, A, K))
    check(w, "g", g, F32, (K,))
    check(w, "dva", dva, F32, (B, (1 + A) * K))
    warps = THREADS // 32  # a warp a sample
    launch("homeostatic", "grad_dueling", max(1, -(-B // warps)), THREADS, (p, g, dva, B, A, K))
