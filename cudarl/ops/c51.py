"""Launchers for ``cuda_src/c51.cu`` (twin: ``cudarl/reference/c51.py``).

Each launcher checks shapes and dtypes, then launches into the buffers it is given. None
allocates, synchronises or reads device memory, so all are safe inside a graph capture.

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
:func:`targets_loss`, :func:`targets_loss_popart` and :func:`n_step` also take their arrays with a
leading axis of ``P`` members: va rows and dva ``[P, B, (1 + A) K]``, probs and target ``[P, B, K]``,
the per-sample arrays ``[P, B]``, n_step's rewards and terminal ``[P, B, n]``, each member's entry
C-contiguous and each row family one member stride apart (:func:`._arrays.family_stride`); the support
``[P, K]`` or ``[K]`` (one for every member); each device scalar (loss, gamma, beta, done, barrier)
``[P]`` and a PopArt state and its scratch ``[P, 8]``. One launch whose ``blockIdx.y`` is the member
gives member ``i`` the bits of a single launch on its entries; arrays without the axis are the single
launch (``gridDim.y`` 1, strides 0). The by-value constants (``sigma_min``, ``priority``) are one value
for every member.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.c51 import TL_WARPS, targets_loss_blocks
from ..reference.c51_chain import PRIORITY_KINDS
from ..reference.popart import STATE_SIZE
from ._arrays import check, check_counter, family_stride, member_scalars, member_state, members

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
    variant, P, e, strides)``, ``variant`` the kernel's (:func:`tl_variant`), ``P`` the members (1 without
    the axis), ``e`` each array's member 0 by name, ``strides`` the kernel's ``(s_va, s_bk, s_b, s_z)``."""
    if priority not in PRIORITY_KINDS:
        raise ValueError(f"{w}: priority {priority!r} is not one of {PRIORITY_KINDS}")
    rows = dict(va_tm1=2, va_online_tp1=2, va_target_tp1=2, out_dva=2, out_probs=2, out_target=2, support=1)
    given = dict(
        va_tm1=va_tm1,
        va_online_tp1=va_online_tp1,
        va_target_tp1=va_target_tp1,
        out_dva=out_dva,
        out_probs=out_probs,
        out_target=out_target,
        support=support,
        a_tm1=a_tm1,
        weights=weights,
        r_t=r_t,
        discount_t=discount_t,
        out_loss_per=out_loss_per,
        out_priority=out_priority,
        out_a_star=out_a_star,
    )
    P, e, st = members(w, {k: (a, rows.get(k, 1)) for k, a in given.items()}, shared=("support",))
    axis = len(va_tm1.shape) == 3
    va_tm1, va_online_tp1, va_target_tp1, out_dva = (
        e[k] for k in ("va_tm1", "va_online_tp1", "va_target_tp1", "out_dva")
    )
    out_probs, out_target, support, a_tm1, weights = (
        e[k] for k in ("out_probs", "out_target", "support", "a_tm1", "weights")
    )
    r_t, discount_t, out_loss_per, out_priority, out_a_star = (
        e[k] for k in ("r_t", "discount_t", "out_loss_per", "out_priority", "out_a_star")
    )
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
    member_scalars(w, P, F32, axis, out_loss=out_loss)
    check_counter(w, "done", done, P)
    smem = TL_WARPS * (((max(A, 4) + 1) * K + 3) // 4) * 16  # (max(A, 4) + 1) K floats a warp, in float4s
    if smem > TL_MAX_SMEM:
        raise ValueError(
            f"{w}: {A} actions x {K} atoms need {smem} bytes of shared memory per block (at most "
            f"{TL_MAX_SMEM}); use losses.c51_targets and losses.c51_loss"
        )
    strides = (
        family_stride(w, P, e, st, ("va_tm1", "va_online_tp1", "va_target_tp1", "out_dva")),
        family_stride(w, P, e, st, ("out_probs", "out_target")),
        family_stride(w, P, e, st, tuple(TL_PER_SAMPLE)),
        st["support"],
    )
    return B, A, K, PRIORITY_KINDS.index(priority), targets_loss_blocks(B), smem, tl_variant(A, K), P, e, strides


#: The per-sample ``[B]`` arrays of targets_loss[_popart]: one row family (the kernel's ``s_b``).
TL_PER_SAMPLE = (
    "a_tm1",
    "weights",
    "r_t",
    "discount_t",
    "out_loss_per",
    "out_priority",
    "out_a_star",
    "out_y",
    "out_r_norm",
)


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
    (dL/dva of the s rows); ``done`` is a uint32 ``[1]`` ticket, 0 before and left 0. Members: the
    module's docstring (``out_loss`` and ``done`` ``[P]``)."""
    w = "c51.targets_loss"
    B, A, K, kind, grid, smem, variant, P, e, strides = _check_targets_loss(
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
        (grid, P),
        32 * TL_WARPS,
        (
            *(e[k] for k in ("va_tm1", "va_online_tp1", "va_target_tp1", "a_tm1", "weights", "support", "r_t")),
            *(e[k] for k in ("discount_t", "out_probs", "out_a_star", "out_target", "out_loss_per", "out_priority")),
            e["out_dva"],
            out_loss,
            done,
            B,
            A,
            K,
            kind,
            1.0 / B,
            *strides,
        ),
        stream=stream,
        shared_mem=smem,
    )


def targets_loss_popart_one_launch(P: int, B: int, grid_barrier: bool | str = True, limit: int | None = None) -> bool:
    """The form :func:`targets_loss_popart` takes for ``P`` members of batch ``B``: True its one launch with a
    grid barrier (phase 0), False its two launches without (phases 1 and 2; the same bits). The one launch
    where ``grid_barrier`` permits it and every member gets the blocks the single launch gets alone
    (:func:`cudarl.kernels.barrier_grid_fits` of :func:`~cudarl.reference.c51.targets_loss_blocks` ``(B)``
    over ``limit`` resident blocks, default :func:`cudarl.kernels.resident_grid_limit`).
    ``grid_barrier="always"`` (tests and benchmarks of the squeezed form): the one launch at any ``P`` up to
    the resident grid."""
    from ..kernels import barrier_grid_fits, resident_grid_limit

    if grid_barrier == "always" or not grid_barrier:
        return bool(grid_barrier)
    return barrier_grid_fits(P, targets_loss_blocks(B), resident_grid_limit() if limit is None else int(limit))


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
    processes, where a launch's blocks cannot count on being resident together.

    Members: the module's docstring (``state``, ``scratch`` ``[P, 8]``; ``beta``, ``out_loss``, ``done``,
    ``barrier`` ``[P]``; ``out_y``, ``out_r_norm`` ``[P, B]`` in the per-sample family). With the grid
    barrier every member's blocks must be resident at once, so the launcher takes the one launch only where
    each member still gets the blocks the single launch gets alone (:func:`targets_loss_popart_one_launch`)
    and the two launches otherwise, at any ``P`` (the same bits); ``grid_barrier=False``: the two always;
    ``"always"``: the one launch, at most :func:`cudarl.kernels.resident_grid_limit` members."""
    from ..kernels import resident_grid_limit

    w = "c51.targets_loss_popart"
    B, A, K, kind, grid, smem, variant, P, e, strides = _check_targets_loss(
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
    axis = len(va_tm1.shape) == 3
    member_state(w, "state", state, STATE_SIZE, P, axis)
    member_state(w, "scratch", scratch, STATE_SIZE, P, axis)
    member_scalars(w, P, F32, axis, beta=beta)
    check_counter(w, "barrier", barrier, P)
    # y and r_norm: the per-sample family, with its stride
    Py, ey, sty = members(w, {"out_y": (out_y, 1), "out_r_norm": (out_r_norm, 1)})
    if Py != P or len(out_y.shape) != (2 if axis else 1):
        raise ValueError(
            f"{w}: out_y and out_r_norm must be [{B}] (or [P, {B}] with the member axis), got {out_y.shape}"
        )
    check(w, "out_y", ey["out_y"], F32, (B,))
    check(w, "out_r_norm", ey["out_r_norm"], F32, (B,))
    if axis:
        e.update(ey)
        st = dict.fromkeys(TL_PER_SAMPLE[:-2], strides[2]) | sty
        family_stride(w, P, e, st, TL_PER_SAMPLE)
    one = targets_loss_popart_one_launch(P, B, grid_barrier)
    if one and P > resident_grid_limit():
        raise ValueError(
            f"{w}: {P} members need {P} resident blocks at least for the one launch, more than "
            f"{resident_grid_limit()} (one per multiprocessor); use grid_barrier True or False (the same bits)"
        )
    if barrier.data.ptr == done.data.ptr or scratch.data.ptr == state.data.ptr:
        raise ValueError(f"{w}: barrier and done must be two counters, scratch and state two buffers")
    args = (
        *(e[k] for k in ("va_tm1", "va_online_tp1", "va_target_tp1", "a_tm1", "weights", "support", "r_t")),
        e["discount_t"],
        state,
        beta,
        ey["out_y"],
        ey["out_r_norm"],
        *(e[k] for k in ("out_probs", "out_a_star", "out_target", "out_loss_per", "out_priority", "out_dva")),
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
    for phase in (0,) if one else (1, 2):
        launch(
            "c51",
            f"targets_loss_popart_{variant}",
            (min(grid, resident_grid_limit() // P) if one else grid, P),
            32 * TL_WARPS,
            (*args, phase, *strides),
            stream=stream,
            shared_mem=smem,
        )


def n_step(rewards, terminal, gamma, out_r_t, out_discount_t, stream=None) -> None:
    """n-step reward and discount: ``gamma`` is a 1-element device array (a schedule's slot). Members:
    rewards, terminal ``[P, B, n]``, gamma ``[P]``, out_r_t, out_discount_t ``[P, B]``."""
    w = "c51.n_step"
    P, e, st = members(
        w,
        {
            "rewards": (rewards, 2),
            "terminal": (terminal, 2),
            "out_r_t": (out_r_t, 1),
            "out_discount_t": (out_discount_t, 1),
        },
    )
    B, n = e["rewards"].shape
    check(w, "rewards", e["rewards"], F32, (B, n))
    check(w, "terminal", e["terminal"], F32, (B, n))
    member_scalars(w, P, F32, len(rewards.shape) == 3, gamma=gamma)
    check(w, "out_r_t", e["out_r_t"], F32, (B,))
    check(w, "out_discount_t", e["out_discount_t"], F32, (B,))
    s_n = family_stride(w, P, e, st, ("rewards", "terminal"))
    s_b = family_stride(w, P, e, st, ("out_r_t", "out_discount_t"))
    launch(
        "c51",
        "n_step",
        (blocks_for(B), P),
        256,
        (e["rewards"], e["terminal"], gamma, e["out_r_t"], e["out_discount_t"], B, n, s_n, s_b),
        stream=stream,
    )
