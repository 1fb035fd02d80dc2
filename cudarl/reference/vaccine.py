"""Gradient Vaccine (Wang, Tsvetkov, Firat & Cao, ICLR 2021): twin of ``cuda_src/vaccine.cu``.

Between the main loss's gradient ``g_m`` and the auxiliary heads' gradient ``g_a`` on the shared
encoder (the parameters every loss reaches), Gradient Vaccine moves ``g_a`` toward an *adaptive* target
cosine similarity ``phi_hat`` instead of PCGrad's "never negative"::

    phi   = g_m . g_a / (|g_m| |g_a|)
    if phi < phi_hat:   g_a <- g_a + c g_m,
        c = |g_a| (phi_hat sqrt(1 - phi^2) - phi sqrt(1 - phi_hat^2)) / (|g_m| sqrt(1 - phi_hat^2))
    phi_hat <- (1 - beta) phi_hat + beta phi            (the EMA of the paper's eq. 5, phi_hat_0 = 0)

so that the new cosine equals ``phi_hat`` exactly (the paper's eq. 4, with ``g_i = g_a`` and
``g_j = g_m``). Our choices: the auxiliary gradient is the one corrected (the main Q loss keeps its own
direction, as the paper corrects the lower-resource task toward the other), one pair per step over the
whole encoder (the paper also works per layer), ``c = 0`` when either gradient is zero, and
``phi_hat`` kept below ``1 - 1e-6`` so ``sqrt(1 - phi_hat^2)`` never divides by zero.

In the train step the flat gradient after the backward is ``full = g_m + g_a`` (saved), a second backward
with only the auxiliary heads' output gradients gives ``aux`` (``g_a`` on the encoder), and then over
the encoder's slice ``[lo, hi)`` of the flat parameters::

    g_m = full - aux,   grads = full + c g_m   (elsewhere grads = full)

Stages: :func:`dots` (per-block partial sums of ``g_m . g_a``, ``|g_m|^2``, ``|g_a|^2``), :func:`control`
(the cosine, ``c``, the EMA: ``state = [phi_hat, phi, c, |g_m|, |g_a|]``; ``phi_hat`` is read before it is
moved) and :func:`apply`. The kernel's launches: :func:`dots_control` (the first two: its last block takes
the control step) and :func:`apply`; or all three in one, :func:`dots_control_apply` (its blocks wait for
one another at a grid barrier, ``run.grid_barrier``), with the bits of the two.

:func:`dots_control_plus`, :func:`apply_plus` and :func:`dots_control_apply_plus` are the same over
``full + plus`` (``plus`` float32 ``[n]``, another signal's own gradient: causal intervention's, when its
grad phase comes right before this one), that sum made element by element in float32 as causal's grad
phase made it over the whole buffer: one pass over the flat gradient where there were two
(``docs/perf-notes.md``, thirty-third session).
"""

from __future__ import annotations

import numpy as np

#: Elements per block of :func:`dots` (the CUDA launch covers [lo, hi) in chunks of this size).
CHUNK = 4096
#: Slots of the state vector.
STATE = 5
#: The largest target cosine (sqrt(1 - phi_hat^2) stays > 0).
PHI_MAX = 1.0 - 1e-6


def blocks(n: int) -> int:
    """Blocks of :func:`dots` over ``n`` elements (at least one)."""
    return max(1, (int(n) + CHUNK - 1) // CHUNK)


def dots(full, aux, lo: int, hi: int, compute_dtype=np.float32):
    """``partial [blocks(hi - lo), 3]``: per chunk of ``[lo, hi)``, the sums of ``g_m g_a``, ``g_m^2``,
    ``g_a^2`` with ``g_m = full - aux``, ``g_a = aux`` (float32 ``[n]`` flat gradients)."""
    gm = np.asarray(full, np.float64)[lo:hi] - np.asarray(aux, np.float64)[lo:hi]
    ga = np.asarray(aux, np.float64)[lo:hi]
    P = blocks(hi - lo)
    out = np.zeros((P, 3), np.float64)
    for p in range(P):
        s = slice(p * CHUNK, (p + 1) * CHUNK)
        out[p] = ((gm[s] * ga[s]).sum(), (gm[s] * gm[s]).sum(), (ga[s] * ga[s]).sum())
    return out.astype(compute_dtype)


def control(partial, state, beta, compute_dtype=np.float32):
    """The new ``state [5]`` from the partial sums and the old state (module docstring)."""
    mg, mm, aa = np.asarray(partial, np.float64).sum(0)
    target = min(float(state[0]), PHI_MAX)
    nm, na = np.sqrt(mm), np.sqrt(aa)
    phi = mg / (nm * na) if nm > 0 and na > 0 else 0.0
    c = 0.0
    if nm > 0 and na > 0 and phi < target:
        st = np.sqrt(1.0 - target * target)
        c = na * (target * np.sqrt(max(1.0 - phi * phi, 0.0)) - phi * st) / (nm * st)
    new = (1.0 - float(beta)) * target + float(beta) * phi
    return np.array([new, phi, c, nm, na], dtype=compute_dtype)


def dots_control(full, aux, state, lo: int, hi: int, beta, compute_dtype=np.float32):
    """The kernel's first launch: ``(partial, state')`` = :func:`dots` then :func:`control`."""
    partial = dots(full, aux, lo, hi, compute_dtype)
    return partial, control(partial, state, beta, compute_dtype)


def _plus(full, plus):
    """``full + plus`` as float32 (the kernel's on-the-fly sum)."""
    return (np.asarray(full, np.float32) + np.asarray(plus, np.float32)).astype(np.float32)


def dots_control_plus(full, plus, aux, state, lo: int, hi: int, beta, compute_dtype=np.float32):
    """:func:`dots_control` over ``full + plus``."""
    return dots_control(_plus(full, plus), aux, state, lo, hi, beta, compute_dtype)


def dots_control_apply(full, aux, state, lo: int, hi: int, beta, compute_dtype=np.float32):
    """The kernel's one launch: ``(partial, state', grads)`` = :func:`dots_control`, then :func:`apply` with
    ``state'``."""
    partial, new = dots_control(full, aux, state, lo, hi, beta, compute_dtype)
    return partial, new, apply(full, aux, new, lo, hi, compute_dtype)


def dots_control_apply_plus(full, plus, aux, state, lo: int, hi: int, beta, compute_dtype=np.float32):
    """:func:`dots_control_apply` over ``full + plus``: :func:`dots_control_plus`, then :func:`apply_plus`."""
    return dots_control_apply(_plus(full, plus), aux, state, lo, hi, beta, compute_dtype)


def apply_plus(full, plus, aux, state, lo: int, hi: int, compute_dtype=np.float32):
    """:func:`apply` over ``full + plus``: ``f + c (f - aux)`` on ``[lo, hi)``, ``f`` elsewhere, ``f = full + plus``."""
    return apply(_plus(full, plus), aux, state, lo, hi, compute_dtype)


def apply(full, aux, state, lo: int, hi: int, compute_dtype=np.float32):
    """``grads [n]`` = ``full + c (full - aux)`` on ``[lo, hi)``, ``full`` elsewhere (``c = state[2]``)."""
    f = np.asarray(full, compute_dtype)
    out = f.copy()
    c = compute_dtype(state[2])
    out[lo:hi] = f[lo:hi] + c * (f[lo:hi] - np.asarray(aux, compute_dtype)[lo:hi])
    return out


def surgery(g_main, g_aux, target):
    """The paper's update of ``g_aux`` alone, float64 (a test's oracle): ``(g_aux', phi)``."""
    gm, ga = np.asarray(g_main, np.float64), np.asarray(g_aux, np.float64)
    old = np.array([target, 0, 0, 0, 0], np.float64)
    st = control(dots(gm + ga, ga, 0, gm.size, np.float64), old, 0.0, np.float64)
    return ga + st[2] * gm, st[1]
