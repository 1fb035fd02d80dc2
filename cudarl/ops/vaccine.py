"""Launchers for ``cuda_src/vaccine.cu`` (twin: ``cudarl/reference/vaccine.py``, the equations).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read. Two forms of
the same bits: :func:`dots_control` then :func:`apply` (two launches), or :func:`dots_control_apply` (one
launch whose blocks wait for one another at a grid barrier, its grid at most
:func:`cudarl.kernels.resident_grid_limit`); each with a ``_plus`` twin over ``full + plus``.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..kernels import blocks_for, launch
from ..reference.vaccine import STATE, blocks
from ._arrays import address, check, check_counter

F32 = np.float32
THREADS = 256  # must equal VC_THREADS (and reference.vaccine.CHUNK VC_CHUNK)


def _range(where: str, n: int, lo: int, hi: int) -> None:
    if not 0 <= lo < hi <= n:
        raise ValueError(f"{where}: the encoder's slice [{lo}, {hi}) is not inside [0, {n})")


def dots_control(full, aux, partial, state, done, lo: int, hi: int, beta: float, stream=None) -> None:
    """One launch: ``partial [blocks(hi - lo), 3]``, per chunk of ``[lo, hi)``, ``(g_m . g_a, |g_m|^2, |g_a|^2)``;
    then the last block to finish (the integer ticket ``done [1]`` uint32, 0 before and left 0) the cosine,
    the coefficient and the target's EMA into ``state [5]`` (read, then written)."""
    _dots_control("dots_control", (full,), aux, partial, state, done, lo, hi, beta, stream)


def dots_control_plus(full, plus, aux, partial, state, done, lo: int, hi: int, beta: float, stream=None) -> None:
    """:func:`dots_control` over ``full + plus`` (float32 ``[n]`` each; the sum made on the fly)."""
    _dots_control("dots_control_plus", (full, plus), aux, partial, state, done, lo, hi, beta, stream)


def _elements(where, fulls, aux, lo, hi, grads=None) -> int:
    """``n``, once ``[lo, hi)`` lies in ``[0, n)`` and full (plus), aux (and grads) are float32 ``[n]``."""
    (n,) = fulls[0].shape
    _range(where, n, lo, hi)
    named = [*zip(("full", "plus"), fulls, strict=False), ("aux", aux)] + ([] if grads is None else [("grads", grads)])
    for name, a in named:
        check(where, name, a, F32, (n,))
    return n


def _control(where, partial, state, lo, hi, **counters) -> int:
    """``P`` (the chunks of ``[lo, hi)``), once partial is float32 ``[P, 3]``, state ``[STATE]`` and each
    counter a uint32 ``[1]`` of its own."""
    P = blocks(hi - lo)
    check(where, "partial", partial, F32, (P, 3))
    check(where, "state", state, F32, (STATE,))
    for name, c in counters.items():
        check_counter(where, name, c)
    if len({address(c) for c in counters.values()}) != len(counters):
        raise ValueError(f"{where}: {' and '.join(counters)} must be counters of their own, not one buffer")
    return P


def _apply_blocks(n: int) -> int:
    """apply's grid over ``n`` elements (grid-stride past 4096 blocks); the one launch's grid covers it too."""
    return min(blocks_for(n), 4096)


def _dots_control(op, fulls, aux, partial, state, done, lo, hi, beta, stream) -> None:
    where = f"vaccine.{op}"
    _elements(where, fulls, aux, lo, hi)
    P = _control(where, partial, state, lo, hi, done=done)
    args = (*fulls, aux, partial, state, done, int(lo), int(hi), float(beta))
    launch("vaccine", op, P, THREADS, args, stream=stream)


def apply(full, aux, grads, state, lo: int, hi: int, stream=None) -> None:
    """``grads = full + c (full - aux)`` on ``[lo, hi)``, ``full`` elsewhere (``grads`` may be ``full`` or ``aux``)."""
    _apply("apply", (full,), aux, grads, state, lo, hi, stream)


def apply_plus(full, plus, aux, grads, state, lo: int, hi: int, stream=None) -> None:
    """:func:`apply` over ``f = full + plus``: ``grads = f + c (f - aux)`` on ``[lo, hi)``, ``f`` elsewhere
    (``grads`` may be ``full``)."""
    _apply("apply_plus", (full, plus), aux, grads, state, lo, hi, stream)


def _apply(op, fulls, aux, grads, state, lo, hi, stream) -> None:
    where = f"vaccine.{op}"
    n = _elements(where, fulls, aux, lo, hi, grads)
    check(where, "state", state, F32, (STATE,))
    args = (*fulls, aux, grads, state, n, int(lo), int(hi))
    launch("vaccine", op, _apply_blocks(n), THREADS, args, stream=stream)


def dots_control_apply(
    full, aux, grads, partial, state, barrier, done, lo: int, hi: int, beta: float, stream=None
) -> None:
    """:func:`dots_control` then :func:`apply` (into ``grads``, which may be ``full`` or ``aux``) in one launch
    with their bits: every block its chunks' partials, a grid barrier, every block the control step's sums
    (the same ``c``; block 0 writes ``state``), then the apply grid-stride. ``barrier`` and ``done``: two
    distinct uint32 ``[1]`` counters, 0 at launch and left 0 (the grid barrier's and the last block's
    ticket, which resets the barrier's). The grid: at most :func:`cudarl.kernels.resident_grid_limit`
    blocks (every block resident at once), ``min(limit, max(P, apply's blocks))``."""
    _dots_control_apply("dots_control_apply", (full,), aux, grads, partial, state, barrier, done, lo, hi, beta,
                        stream)  # fmt: skip


def dots_control_apply_plus(
    full, plus, aux, grads, partial, state, barrier, done, lo: int, hi: int, beta: float, stream=None
) -> None:
    """:func:`dots_control_apply` over ``f = full + plus``: :func:`dots_control_plus` then :func:`apply_plus`
    in one launch, with their bits (``grads`` may be ``full``)."""
    _dots_control_apply("dots_control_apply_plus", (full, plus), aux, grads, partial, state, barrier, done, lo,
                        hi, beta, stream)  # fmt: skip


def _dots_control_apply(op, fulls, aux, grads, partial, state, barrier, done, lo, hi, beta, stream) -> None:
    where = f"vaccine.{op}"
    n = _elements(where, fulls, aux, lo, hi, grads)
    P = _control(where, partial, state, lo, hi, barrier=barrier, done=done)
    grid = min(kernels.resident_grid_limit(), max(P, _apply_blocks(n)))
    args = (*fulls, aux, grads, partial, state, barrier, done, n, int(lo), int(hi), float(beta))
    launch("vaccine", op, grid, THREADS, args, stream=stream)
