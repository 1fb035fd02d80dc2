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
taken at ``max(m_k, 1e-30)`` (an atom with no mass contributes nothing to ``H``). C51's logits are the
dueling combine of the head's raw output ``va`` (:func:`cudarl.reference.nn.dueling_backward`), so the
gradient the step adds is ``d loss / d va``, the one above taken through that combine.

The order of the mass's sum (the kernel's, which this twin defines; :func:`mass`). The rows are cut
into blocks of :data:`ROWS` (the kernel's blocks, a warp a row); each block's column sums
``part[i, k] = sum_j p[ROWS i + j, k]`` add its rows in order from 0; the ``NB = ceil(R / ROWS)``
partials are then dealt into ``S = max(1, THREADS // K)`` slices (partial ``i`` to slice ``i mod S``),
each slice summed in ascending ``i`` from 0, and the slices added in order from 0; ``m_k`` is that sum
divided by ``R``. In float32 this gives the kernel's bits for the same ``p`` (additions only, each
rounded once). The order differs from a plain mean's by rounding only: parity tests compare with the
float64 mean within float32 tolerance.

Stages and launches: :func:`probs_control` (the softmax rows, the mass in that order, then ``H``, ``u``,
the loss and ``g``; ``state = [loss, u, H]``) and :func:`grad_dueling` (the logits' gradient through the
dueling combine, added onto ``dva``): the kernel's two launches, with the launchers' signatures. The
stages they are made of (:func:`probs`, :func:`mass`, :func:`control`, :func:`grad`) are the equations
one at a time (the finite-difference tests take them in float64).
"""

from __future__ import annotations

import numpy as np

from .c51_chain import softmax
from .nn import dueling_backward

#: The floor under ``m_k`` inside the logarithm.
TINY = 1e-30
#: Rows a block of the kernel sums (HS_ROWS: one warp a row of a 256-thread block).
ROWS = 8
#: Threads of the kernel's blocks (HS_THREADS): the last block's slices of the partials.
THREADS = 256


def partials(R: int) -> int:
    """``NB``, the number of blocks of :data:`ROWS` rows over ``R`` rows (the rows of ``part``)."""
    return max(1, -(-int(R) // ROWS))


def probs(logits, compute_dtype=np.float32):
    """``p [R, K]`` = softmax of each row of ``logits [R, K]``."""
    return softmax(np.asarray(logits, compute_dtype)).astype(compute_dtype)


def partial_sums(p, compute_dtype=np.float32):
    """``part [NB, K]``: block ``i``'s column sums of ``p [R, K]``, rows ``ROWS i ..`` added in order from 0."""
    p = np.asarray(p, compute_dtype)
    R, K = p.shape
    part = np.zeros((partials(R), K), compute_dtype)
    for j in range(ROWS):  # row j of every block at once: each block's sum in row order
        rows = p[j::ROWS]
        part[: rows.shape[0]] += rows
    return part


def mass(p, compute_dtype=np.float32):
    """``m [K]`` = the mean of ``p [R, K]`` over rows, summed in the kernel's order (the module docstring)."""
    p = np.asarray(p, compute_dtype)
    return mass_of(partial_sums(p, compute_dtype), p.shape[0], compute_dtype)


def mass_of(part, R: int, compute_dtype=np.float32):
    """``m [K]`` from the partials ``part [NB, K]`` of ``R`` rows: ``S`` slices, then the slices in order, / R."""
    part = np.asarray(part, compute_dtype)
    NB, K = part.shape
    S = max(1, THREADS // K)
    sl = np.zeros((S, K), compute_dtype)
    for i0 in range(0, NB, S):  # partial i0 + q into slice q: each slice in ascending i
        chunk = part[i0 : i0 + S]
        sl[: chunk.shape[0]] += chunk
    m = np.zeros(K, compute_dtype)
    for q in range(S):
        m += sl[q]
    return (m / compute_dtype(R)).astype(compute_dtype)


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


def probs_control(logits, p, part, m, g, state, done, target: float, weight: float) -> None:
    """The first launch, into the buffers given: ``p [R, K]`` (softmax of float32 ``logits [R, K]``),
    ``part [NB, K]`` (:func:`partial_sums`), ``m [K]`` (:func:`mass`), ``g [K]`` and ``state [3] =
    [loss, u, H]`` (:func:`control`). ``done``: the kernel's uint32 ``[1]`` ticket (0, left as it is)."""
    dtype = p.dtype.type
    p[...] = probs(logits, dtype)
    part[...] = partial_sums(p, dtype)
    m[...] = mass_of(part, p.shape[0], dtype)
    g[...], state[...] = control(m, target, weight, dtype)


def grad_dueling(p, g, dva) -> None:
    """The second launch: ``dva [B, (1 + A) K]`` += the loss's gradient on the head's raw output, the
    logits' :func:`grad` (``R = B A`` rows of ``p [B, A, K]``, ``g [K]``) through the dueling combine."""
    B, A, K = p.shape
    d = grad(p.reshape(B * A, K), g, p.dtype.type).reshape(B, A, K)
    dueling_backward(d, dva, accumulate=True)


def loss(logits, target, weight, compute_dtype=np.float64):
    """The whole loss of ``logits [R, K]`` (the finite-difference tests' function)."""
    return control(mass(probs(logits, compute_dtype), compute_dtype), target, weight, compute_dtype)[1][0]
