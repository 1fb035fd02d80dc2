"""Launchers for ``cuda_src/c51.cu`` (twin: ``cudarl/reference/c51.py``).

Each launcher checks shapes and dtypes, then launches into the buffers it is given. None
allocates, synchronises or reads device memory, so all are safe inside a graph capture.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.c51_chain import PRIORITY_KINDS
from ..reference.popart import STATE_SIZE
from ._arrays import check, check_counter

F32, I32 = np.float32, np.int32


def _check_targets_loss(
    w,
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    out_probs,
    out_a_star,
    out_target,
    out_loss_per,
    out_loss,
    out_priority,
    out_dva,
    done,
    priority,
):
    """Checks shared by :func:`targets_loss` and :func:`targets_loss_popart`: ``(B, A, K, kind, grid, smem,
    variant)``, ``variant`` the kernel's (:func:`tl_variant`)."""
    if priority not in PRIORITY_KINDS:
        raise ValueError(f"{w}: priority {priority!r} is not one of {PRIORITY_KINDS}")
    K = support.shape[0]
    B, row = va_tm1.shape
    if K < 2 or row % K or row // K < 2:
        raise ValueError(f"{w}: va rows of {row} floats are not (1 + A) x {K} atoms with A >= 1")
    A = row // K - 1
    for name, a in (
        ("va_tm1", va_tm1),
        ("va_online_tp1", va_online_tp1),
        ("va_target_tp1", va_target_tp1),
        ("out_dva", out_dva),
    ):
        check(w, name, a, F32, (B, row))
    check(w, "support", support, F32, (K,))
    check(w, "a_tm1", a_tm1, I32, (B,))
    for name, a in (
        ("weights", weights),
        ("r_t", r_t),
        ("discount_t", discount_t),
        ("out_loss_per", out_loss_per),
        ("out_priority", out_priority),
    ):
        check(w, name, a, F32, (B,))
    check(w, "out_probs", out_probs, F32, (B, K))
    check(w, "out_target", out_target, F32, (B, K))
    check(w, "out_a_star", out_a_star, I32, (B,))
    check(w, "out_loss", out_loss, F32, (1,))
    check_counter(w, "done", done)
    smem = TL_WARPS * (((max(A, 4) + 1) * K + 3) // 4) * 16  # (max(A, 4) + 1) K floats a warp, in float4s
    if smem > TL_MAX_SMEM:
        raise ValueError(
            f"{w}: {A} actions x {K} atoms need {smem} bytes of shared memory per block (at most "
            f"{TL_MAX_SMEM}); use losses.c51_targets and losses.c51_loss"
        )
    return B, A, K, PRIORITY_KINDS.index(priority), blocks_for(B, TL_WARPS), smem, tl_variant(A, K)


#: Warps (samples at a time) of a targets_loss block (C51_TL_WARPS in cuda_src/c51.cu).
TL_WARPS = 4
#: Dynamic shared memory of a targets_loss block: (max(A, 4) + 1) K floats a warp; past 48 KiB the
#: launch opts in (kernels.launch), up to what every sm_90 part has (227 KiB): 1024 atoms take 80 KiB.
TL_MAX_SMEM = 227 * 1024
#: The most atoms the register path holds (C51_TLR_MAXK in cuda_src/c51.cu: two atoms a lane).
TLR_MAXK = 64
#: The kernels of each op by action count (cuda_src/c51.cu): ``cudarl_c51_<op>_<variant>``, the
#: register path compiled for at most 3, 4 or 8 actions, or the generic path; one compile unit each,
#: so a start-up compiles only the variant it launches. A variant is one kernel of the op, not an op
#: of its own: one launcher and one twin serve them all (``tools/check_faces.py`` reads this literal).
KERNEL_VARIANTS = {
    "targets_loss": ("regs3", "regs4", "regs8", "generic"),
    "targets_loss_popart": ("regs3", "regs4", "regs8", "generic"),
}


def tl_variant(A: int, K: int) -> str:
    """The ``targets_loss[_popart]`` kernel variant for ``A`` actions and ``K`` atoms: with K <= 64,
    the register path compiled for the fewest actions (3, 4 or 8) that holds ``A``; else, or with
    more than 8 actions, the generic path. Every variant gives the bits of the unfused chain
    (tests/parity/test_c51.py runs each against it)."""
    if K <= TLR_MAXK:
        for v in KERNEL_VARIANTS["targets_loss"]:  # regs<n> in increasing n, then generic
            if v.startswith("regs") and A <= int(v[4:]):
                return v
    return "generic"


def targets_loss(
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    out_probs,
    out_a_star,
    out_target,
    out_loss_per,
    out_loss,
    out_priority,
    out_dva,
    done,
    priority="kl",
    stream=None,
) -> None:
    """The C51 target without PopArt and the loss in one launch, from the dueling head's raw outputs
    ``va [B, (1 + A) K]`` (online at s and s', target at s'): the bits of dueling_forward,
    :func:`targets`, :func:`loss` and dueling_backward in a row. Writes ``out_probs``, ``out_a_star``,
    ``out_target``, ``out_loss_per``, ``out_loss [1]``, ``out_priority`` and ``out_dva [B, (1 + A) K]``
    (dL/dva of the s rows); ``done`` is a uint32 ``[1]`` ticket, 0 before and left 0."""
    w = "c51.targets_loss"
    B, A, K, kind, grid, smem, variant = _check_targets_loss(
        w,
        va_tm1,
        va_online_tp1,
        va_target_tp1,
        a_tm1,
        weights,
        support,
        r_t,
        discount_t,
        out_probs,
        out_a_star,
        out_target,
        out_loss_per,
        out_loss,
        out_priority,
        out_dva,
        done,
        priority,
    )
    launch(
        "c51",
        f"targets_loss_{variant}",
        grid,
        32 * TL_WARPS,
        (
            va_tm1,
            va_online_tp1,
            va_target_tp1,
            a_tm1,
            weights,
            support,
            r_t,
            discount_t,
            out_probs,
            out_a_star,
            out_target,
            out_loss_per,
            out_priority,
            out_dva,
            out_loss,
            done,
            B,
            A,
            K,
            kind,
            1.0 / B,
        ),
        stream=stream,
        shared_mem=smem,
    )


def targets_loss_popart(
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    state,
    beta,
    out_y,
    out_r_norm,
    out_probs,
    out_a_star,
    out_target,
    out_loss_per,
    out_loss,
    out_priority,
    out_dva,
    done,
    barrier,
    scratch,
    sigma_min=1e-4,
    priority="kl",
    grid_barrier=True,
    stream=None,
) -> None:
    """:func:`targets_loss` with PopArt (the bits of :func:`next_probs_td` and :func:`project_popart`
    in between): also updates ``state [8]`` in place and writes ``out_y``, ``out_r_norm [B]``.
    ``beta`` is a float32 ``[1]`` device slot; ``barrier`` a second uint32 ``[1]`` counter, 0 before
    and left 0 (the grid-wide wait for every y; the grid is then at most one block per SM);
    ``scratch`` float32 ``[8]``. ``grid_barrier=False``: the same bits in two launches with no
    grid-wide wait (the first copies the statistics to ``scratch``), for a GPU shared with other
    processes, where a launch's blocks cannot count on being resident together."""
    from ..kernels import resident_grid_limit

    w = "c51.targets_loss_popart"
    B, A, K, kind, grid, smem, variant = _check_targets_loss(
        w,
        va_tm1,
        va_online_tp1,
        va_target_tp1,
        a_tm1,
        weights,
        support,
        r_t,
        discount_t,
        out_probs,
        out_a_star,
        out_target,
        out_loss_per,
        out_loss,
        out_priority,
        out_dva,
        done,
        priority,
    )
    check(w, "state", state, F32, (STATE_SIZE,))
    check(w, "scratch", scratch, F32, (STATE_SIZE,))
    check(w, "beta", beta, F32, (1,))
    check(w, "out_y", out_y, F32, (B,))
    check(w, "out_r_norm", out_r_norm, F32, (B,))
    check_counter(w, "barrier", barrier)
    if barrier.data.ptr == done.data.ptr or scratch.data.ptr == state.data.ptr:
        raise ValueError(f"{w}: barrier and done must be two counters, scratch and state two buffers")
    args = (
        va_tm1,
        va_online_tp1,
        va_target_tp1,
        a_tm1,
        weights,
        support,
        r_t,
        discount_t,
        state,
        beta,
        out_y,
        out_r_norm,
        out_probs,
        out_a_star,
        out_target,
        out_loss_per,
        out_priority,
        out_dva,
        out_loss,
        done,
        barrier,
        scratch,
        B,
        A,
        K,
        kind,
        1.0 / B,
        float(sigma_min),
    )
    if grid_barrier:
        launch(
            "c51",
            f"targets_loss_popart_{variant}",
            min(grid, resident_grid_limit()),
            32 * TL_WARPS,
            args + (0,),
            stream=stream,
            shared_mem=smem,
        )
        return
    for phase in (1, 2):
        launch(
            "c51",
            f"targets_loss_popart_{variant}",
            grid,
            32 * TL_WARPS,
            args + (phase,),
            stream=stream,
            shared_mem=smem,
        )


def n_step(rewards, terminal, gamma, out_r_t, out_discount_t, stream=None) -> None:
    """n-step reward and discount: ``gamma`` is a 1-element device array (a schedule's slot)."""
    w = "c51.n_step"
    B, n = rewards.shape
    check(w, "rewards", rewards, F32, (B, n))
    check(w, "terminal", terminal, F32, (B, n))
    check(w, "gamma", gamma, F32, (1,))
    check(w, "out_r_t", out_r_t, F32, (B,))
    check(w, "out_discount_t", out_discount_t, F32, (B,))
    launch(
        "c51",
        "n_step",
        blocks_for(B),
        256,
        (rewards, terminal, gamma, out_r_t, out_discount_t, B, n),
        stream=stream,
    )
