"""Launchers for ``cuda_src/qstats.cu`` (twin: ``cudarl/reference/qstats.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
:func:`per_sample`, :func:`reduce` and :func:`q_stats` also take their arrays with a leading axis of
``P`` members: logits ``[P, B, A, K]``, q ``[P, B, A]``, ent ``[P, B]``, mass ``[P, B, K]`` (each
member's entry C-contiguous, members any whole number of elements apart, one stride argument per
array), the support ``[P, K]`` or ``[K]`` (one for every member), out ``[P, 2A + 2]`` C-contiguous. One
launch whose ``blockIdx.y`` is the member gives member ``i`` the bits of a single launch on its entries;
arrays without the axis are the single launch.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch
from ._arrays import check, family_stride, members, warp_grid

F32 = np.float32
THREADS = 256  # must equal QS_THREADS in qstats.cu


def _strides(w: str, P: int, e: dict, st: dict, names: tuple) -> tuple:
    """Each array's member stride (an array is a row family of its own; members do not overlap)."""
    return tuple(family_stride(w, P, e, st, (k,)) for k in names)


def per_sample(logits, support, out_q, out_ent, out_mass, stream=None) -> None:
    """Stage 1: writes ``out_q [B, A]``, ``out_ent [B]``, ``out_mass [B, K]`` (members: the module's
    docstring)."""
    w = "qstats.per_sample"
    P, e, st = members(
        w,
        {"logits": (logits, 3), "support": (support, 1), "q": (out_q, 2), "ent": (out_ent, 1), "mass": (out_mass, 2)},
        shared=("support",),
    )
    logits, support, out_q, out_ent, out_mass = (e[k] for k in ("logits", "support", "q", "ent", "mass"))
    B, A, K = logits.shape
    check(w, "logits", logits, F32, (B, A, K))
    check(w, "support", support, F32, (K,))
    check(w, "out_q", out_q, F32, (B, A))
    check(w, "out_ent", out_ent, F32, (B,))
    check(w, "out_mass", out_mass, F32, (B, K))
    grid, block = warp_grid(B)
    launch(
        "qstats",
        "per_sample",
        (grid, P),
        block,
        (
            logits,
            support,
            out_q,
            out_ent,
            out_mass,
            B,
            A,
            K,
            *_strides(w, P, e, st, ("logits",)),
            st["support"],  # 0: one support for every member
            *_strides(w, P, e, st, ("q", "ent", "mass")),
        ),
        stream=stream,
    )


def reduce(q, ent, mass, out, stream=None) -> None:
    """Stage 2: writes ``out [2A + 2]`` (may be a ``PinnedReadback.device`` view; members: ``[P, 2A + 2]``,
    the rest as the module's docstring)."""
    w = "qstats.reduce"
    P, e, st = members(w, {"q": (q, 2), "ent": (ent, 1), "mass": (mass, 2)})
    axis = len(q.shape) == 3
    q, ent, mass = e["q"], e["ent"], e["mass"]
    B, A = q.shape
    K = mass.shape[1]
    check(w, "q", q, F32, (B, A))
    check(w, "ent", ent, F32, (B,))
    check(w, "mass", mass, F32, (B, K))
    check(w, "out", out, F32, (P, 2 * A + 2) if axis else (2 * A + 2,))
    launch(
        "qstats",
        "reduce",
        (A + 2, P),  # a block per action's moments, one for the entropy, one for the utilisation
        THREADS,
        (q, ent, mass, out, B, A, K, *_strides(w, P, e, st, ("q", "ent", "mass"))),
        stream=stream,
    )


def q_stats(logits, support, scratch_q, scratch_ent, scratch_mass, out, stream=None) -> None:
    """Both stages; the scratch buffers are the caller's (allocated before any capture)."""
    per_sample(logits, support, scratch_q, scratch_ent, scratch_mass, stream=stream)
    reduce(scratch_q, scratch_ent, scratch_mass, out, stream=stream)


def moments(q, out, stream=None) -> None:
    """A head without atoms: ``out [2A + 2]`` = mean and variance of ``q [B, A]`` over B (reduce's
    layout), entropy and utilisation NaN. A block per action."""
    w = "qstats.moments"
    B, A = q.shape
    check(w, "q", q, F32, (B, A))
    check(w, "out", out, F32, (2 * A + 2,))
    launch("qstats", "moments", A, THREADS, (q, out, B, A), stream=stream)


def expected_q(logits, support, out_q, stream=None) -> None:
    """``out_q [B, A]``: the expected Q of ``logits [B, A, K]`` over ``support [K]`` (per_sample's, alone)."""
    w = "qstats.expected_q"
    B, A, K = logits.shape
    check(w, "logits", logits, F32, (B, A, K))
    check(w, "support", support, F32, (K,))
    check(w, "out_q", out_q, F32, (B, A))
    grid, block = warp_grid(B)
    launch("qstats", "expected_q", grid, block, (logits, support, out_q, B, A, K), stream=stream)
