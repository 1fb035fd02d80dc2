"""Homeostatic regulariser on atom utilisation (C51): twin of ``cuda_src/homeostatic.cu``.

The Q statistics (issue 18, :mod:`cudarl.reference.qstats`) count the atoms a batch uses: an atom is
used when its batch-mean mass exceeds ``1 / (10 K)``. A count has no gradient, so the regulariser holds
a smooth twin of it near a set point: the *effective* share of atoms, the perplexity of the batch-mean
atom distribution over ``K`` (Hill's number of order 1, as in the "perplexity" of a codebook)::

    p[r] = softmax(logits[r])          r = (b, a), R = B A rows, K atoms
    m_k  = (1/R) sum_r p[r, k]
    H    = -sum_k m_k log m_k,         u = exp(H) / K        (1/K: one atom; 1: all atoms equally)
    loss = w (u - u*)^2
    g_k  = d loss / d m_k = 2 w (u - u*) u (-log m_k - 1)
    d loss / d logits[r, j] = (1/R) p[r, j] (g_j - sum_k p[r, k] g_k)

Homeostasis (Turrigiano 2008's synaptic scaling, in the seed a "homeostatic regulariser") is a set
point, not a direction: below ``u*`` the gradient spreads mass over more atoms, above it concentrates
it. ``agent.homeostatic_target`` is ``u*``, ``agent.homeostatic_weight`` is ``w``. ``log m_k`` is
taken at ``max(m_k, 1e-30)`` (an atom with no mass contributes nothing to ``H``).

Stages (the kernel launches): :func:`probs` (a softmax a row), :func:`mass` (a column mean over rows,
one fixed order), :func:`control` (``H``, ``u``, the loss and ``g``; ``state = [loss, u, H]``), and
:func:`grad` (the logits' gradient, written or added).
"""

from __future__ import annotations

import numpy as np

from .c51_chain import softmax

#: The floor under ``m_k`` inside the logarithm.
TINY = 1e-30


def probs(logits, compute_dtype=np.float32):
    """``p [R, K]`` = softmax of each row of ``logits [R, K]``."""
    return softmax(np.asarray(logits, compute_dtype)).astype(compute_dtype)


def mass(p, compute_dtype=np.float32):
    """``m [K]`` = the mean of ``p [R, K]`` over rows (summed in float64)."""
    return np.asarray(p, np.float64).mean(0).astype(compute_dtype)


def control(m, target, weight, compute_dtype=np.float32):
    """``(g [K], state [3] = [loss, u, H])`` from the batch-mean masses ``m [K]`` (see the module docstring)."""
    m = np.asarray(m, np.float64)
    K = m.shape[0]
    logm = np.log(np.maximum(m, TINY))
    H = float(-(m * logm).sum())
    u = np.exp(H) / K
    err = u - float(target)
    loss = float(weight) * err * err
    g = 2.0 * float(weight) * err * u * (-logm - 1.0)
    return g.astype(compute_dtype), np.array([loss, u, H], dtype=compute_dtype)


def grad(p, g, compute_dtype=np.float32):
    """``d loss / d logits [R, K]`` = ``(1/R) p (g - sum_k p_k g_k)`` from ``p [R, K]`` and ``g [K]``."""
    p = np.asarray(p, compute_dtype)
    g = np.asarray(g, compute_dtype)
    R = p.shape[0]
    s = (p * g).sum(-1, keepdims=True)
    return (p * (g - s) / compute_dtype(R)).astype(compute_dtype)


def loss(logits, target, weight, compute_dtype=np.float64):
    """The whole loss of ``logits [R, K]`` (the finite-difference tests' function)."""
    return control(mass(probs(logits, compute_dtype), compute_dtype), target, weight, compute_dtype)[1][0]
