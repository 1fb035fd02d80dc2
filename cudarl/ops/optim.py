"""Launchers for ``cuda_src/optim.cu`` (twin: ``cudarl/reference/optim.py``, same names and arguments).

Shapes are checked here (and the dtypes of the counters and pointer tables the launch signature
cannot say), other dtypes and contiguity by ``kernels.launch``. Nothing here allocates,
synchronises or reads a device value, so every launcher but :func:`shrink_perturb` (which
refuses to run inside a capture) can be captured.

The member axis (a population's agents, :class:`cudarl.optim.StackedAdam`): ``grad_norm_partial``,
``grad_norm_finalize``, ``grad_norm``, ``grad_norm_publish``, ``lr_schedule``, ``adam_update``,
``adam_update_soft``, ``clip_adam_soft``, ``tau_schedule`` and ``soft_update`` also take their arrays with a
leading axis of ``P`` members: the element buffers ``[P, n]`` (each member's row C-contiguous, every buffer the same
member stride in elements), the partials ``[P, GN_BLOCKS]`` and a ring ``[P, 2 * slots]`` C-contiguous,
and each device scalar ``[P]``. One launch whose ``blockIdx.y`` is the member gets each member the bits
of a single launch on its rows; arrays without the member axis are the single launch (``gridDim.y`` 1,
stride 0). The by-value constants are one value for every member; the ``_members`` launchers
(``lr_schedule``, ``tau_schedule``, ``grad_norm``, ``grad_norm_publish``, ``adam_update``, ``adam_update_soft``,
``clip_adam_soft``) take each member's as ``[P]`` arrays instead.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..kernels import blocks_for, launch
from ..reference.optim import CAS_THREADS, GN_BLOCKS, GN_FOLD, GN_THREADS, clip_adam_soft_blocks
from ._arrays import address

_T = 256
_MAX_GRID = 8192
_MAX_MEMBERS = 65535  # gridDim.y's limit


def _grid(n: int) -> int:
    return min(blocks_for(n, _T), _MAX_GRID)


def _scalar(where: str, **arrs) -> None:
    for name, a in arrs.items():
        if a.shape != (1,):
            raise ValueError(f"{where}: {name} must be a 1-element device scalar, got shape {a.shape}")


def _flat(where: str, n: int, **arrs) -> None:
    for name, a in arrs.items():
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{where}: {name} must be flat [{n}], got {a.shape}")


def _rows(where: str, **arrs) -> tuple[int, dict, int, int]:
    """``(P, entries, n, s)`` of element buffers: all flat ``[n]`` (one member: ``P`` 1, the arrays
    themselves, stride 0) or all ``[P, n]`` with one member stride ``s`` in elements (entries: each
    buffer's row 0), rows that do not overlap."""
    first = next(iter(arrs.values()))
    if all(a.ndim == 1 for a in arrs.values()):
        _flat(where, first.shape[0], **arrs)
        return 1, arrs, first.shape[0], 0
    if not all(a.ndim == 2 for a in arrs.values()):
        raise ValueError(
            f"{where}: every buffer has the member axis or none does, got {[tuple(a.shape) for a in arrs.values()]}"
        )
    P, n = first.shape
    if not 1 <= P <= _MAX_MEMBERS or any(a.shape != first.shape for a in arrs.values()):
        raise ValueError(
            f"{where}: 1 to {_MAX_MEMBERS} members of one length, got {[tuple(a.shape) for a in arrs.values()]}"
        )
    strides = {a.strides[0] / a.itemsize for a in arrs.values()}
    s = strides.pop()
    if strides or s != int(s) or (P > 1 and s < n):
        raise ValueError(
            f"{where}: every buffer's members one stride of whole elements, at least the row ({n}), got "
            f"{[a.strides for a in arrs.values()]}"
        )
    return P, {k: a[0] for k, a in arrs.items()}, n, int(s)


def _member_scalars(where: str, P: int, **arrs) -> None:
    """Device scalars: ``[1]`` for one member, ``[P]`` (one per member) for ``P``."""
    if P == 1:
        _scalar(where, **arrs)
        return
    for name, a in arrs.items():
        if a.shape != (P,):
            raise ValueError(f"{where}: {name} must be [{P}], a device scalar per member, got shape {a.shape}")


def _member_table(where: str, P: int, name: str, a, width: int):
    """A per-member table (``partial [GN_BLOCKS]``, a ring): ``[width]`` for one member, ``[P, width]``
    C-contiguous for ``P``; returns its row 0 (the array itself for one member)."""
    if a.ndim == 1:
        if P != 1 or a.shape[0] != width:
            raise ValueError(f"{where}: {name} must be flat [{width}] (or [{P}, {width}]), got {a.shape}")
        return a
    if a.shape != (P, width) or a.strides != (width * a.itemsize, a.itemsize):
        raise ValueError(f"{where}: {name} must be C-contiguous [{P}, {width}], got {a.shape} strides {a.strides}")
    return a[0]


def grad_norm_partial(g, partial) -> None:
    """Stage 1: float64 ``partial [GN_BLOCKS]`` of sums of squares of flat float32 ``g`` (members: g
    ``[P, n]``, partial ``[P, GN_BLOCKS]``)."""
    w = "optim.grad_norm_partial"
    P, e, n, s = _rows(w, g=g)
    partial = _member_table(w, P, "partial", partial, GN_BLOCKS)
    launch("optim", "grad_norm_partial", (GN_BLOCKS // GN_FOLD, P), GN_THREADS, (e["g"], partial, n, s))


def grad_norm_finalize(partial, norm, scale, max_norm: float) -> None:
    """Stage 2: ``norm [1]`` and clip ``scale [1]`` (float32) from the partials (members: partial
    ``[P, GN_BLOCKS]``, norm and scale ``[P]``)."""
    w = "optim.grad_norm_finalize"
    P = partial.shape[0] if partial.ndim == 2 else 1
    partial = _member_table(w, P, "partial", partial, GN_BLOCKS)
    _member_scalars(w, P, norm=norm, scale=scale)
    launch(
        "optim",
        "grad_norm_finalize",
        (1, P),
        GN_BLOCKS,
        (partial, norm, scale, float(max_norm)),
    )


def grad_norm(g, partial, norm, scale, max_norm: float, done=None) -> None:
    """Both stages (deterministic global L2 norm and clip scale).

    With ``done`` (uint32 ``[1]``, 0, the launch's ticket; left 0) one launch whose last block does
    stage 2, with the same bits as the two launches made without it. Members: g ``[P, n]``, partial
    ``[P, GN_BLOCKS]``, norm, scale and done ``[P]`` (a ticket per member).
    """
    if g.ndim not in (1, 2):
        raise ValueError(f"optim.grad_norm: g must be flat (or [P, n]), got {g.shape}")
    if done is None:
        grad_norm_partial(g, partial)
        grad_norm_finalize(partial, norm, scale, max_norm)
        return
    w = "optim.grad_norm"
    P, e, n, s = _rows(w, g=g)
    partial = _member_table(w, P, "partial", partial, GN_BLOCKS)
    _member_scalars(w, P, norm=norm, scale=scale)
    if done.dtype != np.uint32 or done.shape != (P,):
        raise ValueError(f"{w}: done must be a uint32 [{P}] ticket, got {done.dtype} {done.shape}")
    launch(
        "optim",
        "grad_norm",
        (GN_BLOCKS // GN_FOLD, P),
        GN_THREADS,
        (e["g"], partial, norm, scale, float(max_norm), done, n, s),
    )


def grad_norm_members(g, partial, norm, scale, max_norms, done) -> None:
    """:func:`grad_norm` (one launch, ``done``) over P members each clipping at its own norm: ``max_norms``
    float32 ``[P]`` (member ``i``'s ``max_norm``), the rest as its member axis."""
    w = "optim.grad_norm_members"
    if g.ndim != 2:
        raise ValueError(f"{w}: g must be [P, n], got {g.shape}")
    P, e, n, s = _rows(w, g=g)
    partial = _member_table(w, P, "partial", partial, GN_BLOCKS)
    _member_scalars(w, P, norm=norm, scale=scale)
    _member_consts(w, P, max_norms=max_norms)
    if done.dtype != np.uint32 or done.shape != (P,):
        raise ValueError(f"{w}: done must be a uint32 [{P}] ticket, got {done.dtype} {done.shape}")
    launch(
        "optim",
        "grad_norm_members",
        (GN_BLOCKS // GN_FOLD, P),
        GN_THREADS,
        (e["g"], partial, norm, scale, max_norms, done, n, s),
    )


def grad_norm_publish(g, partial, norm, scale, max_norm: float, done, ring, loss, step, slots: int) -> None:
    """:func:`grad_norm` (one launch, ``done``) whose last block also publishes ``(loss[0], norm[0])`` into
    ``ring`` slot ``step[0] % slots`` (agent's ``publish``), with the bits of the two: the first of
    :func:`clip_adam_soft`'s two launches without a grid barrier. ``ring`` float32 ``[2 * slots]``, ``loss``
    float32 and ``step`` int64 ``[1]``; members: ring ``[P, 2 * slots]``, loss and step ``[P]``, the rest as
    :func:`grad_norm`'s."""
    _grad_norm_publish("grad_norm_publish", _by_value, g, partial, norm, scale, max_norm, done, ring, loss, step,
                       slots)  # fmt: skip


def grad_norm_publish_members(g, partial, norm, scale, max_norms, done, ring, loss, step, slots: int) -> None:
    """:func:`grad_norm_publish` over P members each clipping at its own norm: ``max_norms`` float32 ``[P]``
    (as :func:`grad_norm_members`'), the rest as its member axis."""
    _grad_norm_publish("grad_norm_publish_members", _per_member, g, partial, norm, scale, max_norms, done, ring, loss,
                       step, slots)  # fmt: skip


def _grad_norm_publish(op, consts, g, partial, norm, scale, max_norm, done, ring, loss, step, slots) -> None:
    w = f"optim.{op}"
    if g.ndim not in (1, 2):
        raise ValueError(f"{w}: g must be flat (or [P, n]), got {g.shape}")
    P, e, n, s = _rows(w, g=g)
    partial = _member_table(w, P, "partial", partial, GN_BLOCKS)
    _member_scalars(w, P, norm=norm, scale=scale, loss=loss, step=step)
    if done.dtype != np.uint32 or done.shape != (P,):
        raise ValueError(f"{w}: done must be a uint32 [{P}] ticket, got {done.dtype} {done.shape}")
    ring = _ring_row(w, P, ring, slots)
    _launch_grad_norm_publish(w, op, consts, P, e, n, s, partial, norm, scale, max_norm, done, ring, loss, step, slots)


def _ring_row(w: str, P: int, ring, slots: int):
    """Row 0 of a ring ``[2 * slots]`` (members: ``[P, 2 * slots]``), checked."""
    if int(slots) < 1 or ring.ndim not in (1, 2) or ring.shape[-1] != 2 * int(slots):
        raise ValueError(f"{w}: ring must be flat [2 * slots] with slots >= 1, got {ring.shape} for slots={slots}")
    return _member_table(w, P, "ring", ring, 2 * int(slots))


def _launch_grad_norm_publish(w, op, consts, P, e, n, s, partial, norm, scale, max_norm, done, ring, loss, step,
                              slots) -> None:  # fmt: skip
    """The launch of ``grad_norm_publish[_members]`` on checked arguments (``partial``, ``ring``: row 0)."""
    launch(
        "optim",
        op,
        (GN_BLOCKS // GN_FOLD, P),
        GN_THREADS,
        (e["g"], partial, norm, scale, *consts(w, P, max_norm=max_norm), done, n, s, ring, loss, step, int(slots)),
    )


def lr_schedule(
    step,
    lr,
    m_scale,
    bc1,
    bc2,
    kind: int,
    lr_max: float,
    lr_min: float,
    warmup: int,
    period: int,
    mult: int,
    restart_m_scale: float,
    beta1: float,
    beta2: float,
) -> None:
    """Advance ``step`` (int64 ``[1]``) and write lr, m_scale, bc1, bc2 (float32 ``[1]``) on the device
    (members: every scalar ``[P]``, one schedule for all)."""
    P = step.shape[0] if step.ndim == 1 else 1
    _member_scalars("optim.lr_schedule", P, step=step, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2)
    if period < 1 or mult < 1 or warmup < 0 or kind not in (0, 1, 2):
        raise ValueError(f"optim.lr_schedule: bad schedule kind={kind} period={period} mult={mult} warmup={warmup}")
    launch(
        "optim",
        "lr_schedule",
        (1, P),
        1,
        (
            step,
            lr,
            m_scale,
            bc1,
            bc2,
            int(kind),
            float(lr_max),
            float(lr_min),
            int(warmup),
            int(period),
            int(mult),
            float(restart_m_scale),
            float(beta1),
            float(beta2),
        ),
    )


def _member_consts(where: str, P: int, **arrs) -> None:
    """Per-member constants (``lr_schedule_members``, ``tau_schedule_members``): each a C-contiguous
    ``[P]`` array of the dtype its single kernel takes by value (the kernels' signature checks it)."""
    for name, a in arrs.items():
        if a.shape != (P,) or not a.flags.c_contiguous:
            raise ValueError(f"{where}: {name} must be [{P}], a constant per member, got shape {a.shape}")


def lr_schedule_members(
    step,
    lr,
    m_scale,
    bc1,
    bc2,
    kind,
    lr_max,
    lr_min,
    warmup,
    period,
    mult,
    restart_m_scale,
    beta1,
    beta2,
) -> None:
    """:func:`lr_schedule` with each member's own schedule: the scalars ``[P]``; ``kind`` int32, ``lr_max``,
    ``lr_min``, ``restart_m_scale``, ``beta1``, ``beta2`` float32, ``warmup``, ``period``, ``mult`` int64,
    each ``[P]`` (member ``i``'s constants at ``i``). Member ``i`` gets the bits of :func:`lr_schedule` with
    its constants."""
    P = step.shape[0] if step.ndim == 1 else 1
    w = "optim.lr_schedule_members"
    _member_scalars(w, P, step=step, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2)
    if step.shape != (P,):
        raise ValueError(f"{w}: step must be [P], got shape {step.shape}")
    _member_consts(w, P, kind=kind, lr_max=lr_max, lr_min=lr_min, warmup=warmup, period=period, mult=mult,
                   restart_m_scale=restart_m_scale, beta1=beta1, beta2=beta2)  # fmt: skip
    launch(
        "optim",
        "lr_schedule_members",
        (1, P),
        1,
        (step, lr, m_scale, bc1, bc2, kind, lr_max, lr_min, warmup, period, mult, restart_m_scale, beta1, beta2),
    )


def _adam_checks(w: str, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, **more) -> tuple[int, dict, int, int]:
    """:func:`_rows` of p, g, m, v, mask and ``more`` (e.g. the target); the scalars checked against ``P``."""
    P, e, n, s = _rows(w, p=p, g=g, m=m, v=v, mask=mask, **more)
    _member_scalars(w, P, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2, clip=clip)
    return P, e, n, s


def _by_value(w: str, P: int, **consts) -> tuple:
    """The single launch's constants: Python floats, as its by-value parameters."""
    return tuple(float(v) for v in consts.values())


def _per_member(w: str, P: int, **consts) -> tuple:
    """A ``_members`` launch's constants: float32 ``[P]`` arrays (member ``i``'s at ``i``)."""
    _member_consts(w, P, **consts)
    return tuple(consts.values())


def adam_update(
    p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """Fused Adam(W) over flat float32 ``p, g, m, v [n]`` with uint8 ``mask [n]`` and device scalars
    (members: ``[P, n]`` buffers, ``[P]`` scalars)."""
    _adam_update("adam_update", _by_value, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2, eps, wd)


def adam_update_members(p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2, eps, wd) -> None:
    """:func:`adam_update` over P members each with its own ``beta1``, ``beta2``, ``eps``, ``wd`` (float32
    ``[P]``): member ``i`` the bits of :func:`adam_update` with its constants."""
    _adam_update("adam_update_members", _per_member, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2,
                 eps, wd)  # fmt: skip


def _adam_update(op, consts, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2, eps, wd) -> None:
    P, e, n, s = _adam_checks(f"optim.{op}", p, g, m, v, mask, lr, m_scale, bc1, bc2, clip)
    c = consts(f"optim.{op}", P, beta1=beta1, beta2=beta2, eps=eps, wd=wd)
    launch(
        "optim",
        op,
        (_grid(n), P),
        _T,
        (*(e[k] for k in ("p", "g", "m", "v", "mask")), n, s, lr, m_scale, bc1, bc2, clip, *c),
    )


def adam_update_soft(
    p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """:func:`adam_update`, then :func:`soft_update` of ``target [n]`` toward the new ``p`` with ``tau [1]``,
    in one launch (the same bits as the two). Members: ``[P, n]`` buffers, ``[P]`` scalars."""
    _adam_update_soft("adam_update_soft", _by_value, p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau,
                      beta1, beta2, eps, wd)  # fmt: skip


def adam_update_soft_members(p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1, beta2, eps, wd) -> None:
    """:func:`adam_update_soft` over P members each with its own ``beta1``, ``beta2``, ``eps``, ``wd``
    (float32 ``[P]``): member ``i`` the bits of :func:`adam_update_soft` with its constants."""
    _adam_update_soft("adam_update_soft_members", _per_member, p, g, m, v, mask, target, lr, m_scale, bc1, bc2,
                      clip, tau, beta1, beta2, eps, wd)  # fmt: skip


def _adam_update_soft(op, consts, p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1, beta2, eps,
                      wd) -> None:  # fmt: skip
    w = f"optim.{op}"
    P, e, n, s = _adam_checks(w, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, target=target)
    _member_scalars(w, P, tau=tau)
    if address(target) == address(p):
        raise ValueError(f"{w}: target must be a buffer of its own, not the parameters")
    c = consts(w, P, beta1=beta1, beta2=beta2, eps=eps, wd=wd)
    launch(
        "optim",
        op,
        (_grid(n), P),
        _T,
        (*(e[k] for k in ("p", "g", "m", "v", "mask", "target")), n, s, lr, m_scale, bc1, bc2, clip, tau, *c),
    )


def clip_adam_soft_one_launch(P: int, n: int, grid_barrier: bool | str = True, limit: int | None = None) -> bool:
    """The form :func:`clip_adam_soft` takes for ``P`` members of ``n`` parameters: True its one launch
    with a grid barrier, False its two launches without (:func:`grad_norm_publish`, then
    :func:`adam_update_soft` with ``clip = scale``; the same bits). The one launch where ``grid_barrier``
    permits it and every member gets the blocks the single launch gets alone
    (:func:`cudarl.kernels.barrier_grid_fits` of :func:`~cudarl.reference.optim.clip_adam_soft_blocks` ``(n)``
    over ``limit`` resident blocks, default
    :func:`cudarl.kernels.resident_grid_limit`): one member always; past that the barrier would squeeze each
    member onto fewer blocks, while the two launches give each its full grid with no residency limit.
    ``grid_barrier="always"`` (tests and benchmarks of the squeezed form): the one launch at any ``P`` up to
    the resident grid."""
    if grid_barrier == "always" or not grid_barrier:
        return bool(grid_barrier)
    limit = kernels.resident_grid_limit() if limit is None else int(limit)
    return kernels.barrier_grid_fits(P, clip_adam_soft_blocks(n), limit)


def clip_adam_soft(
    p,
    g,
    m,
    v,
    mask,
    target,
    partial,
    norm,
    scale,
    max_norm: float,
    done,
    barrier,
    lr,
    m_scale,
    bc1,
    bc2,
    tau,
    ring,
    loss,
    step,
    slots: int,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
    grid: int | None = None,
    grid_barrier: bool | str = True,
) -> None:
    """:func:`grad_norm` (``done``), :func:`adam_update_soft` with ``clip = scale`` and agent's ``publish``
    of ``(loss[0], norm[0])`` into ring slot ``step[0] % slots``, with the same bits, in the form
    :func:`clip_adam_soft_one_launch` picks: one launch whose blocks wait for one another (a grid barrier),
    or two without (:func:`grad_norm_publish`, then :func:`adam_update_soft` with ``clip = scale``), either at
    any ``P``.

    ``done`` and ``barrier``: two distinct uint32 ``[1]`` counters, 0 at launch and left 0 (the
    grid barrier's counter and the last block's ticket; the two launches take ``done`` as grad_norm_publish's
    ticket, left 0, and leave ``barrier`` untouched).
    ``ring``: float32 ``[2 * slots]``; ``loss``, ``norm``, ``scale``, ``tau`` float32 ``[1]``; ``step``
    int64 ``[1]``. ``grid_barrier=False``: the two launches (a GPU shared with other processes,
    ``run.grid_barrier``); ``"always"``: the one launch even where it squeezes the members (tests and
    benchmarks), at most :func:`cudarl.kernels.resident_grid_limit` members. ``grid``: forces the one
    launch on that many blocks a member (any grid gives the same bits), at most ``resident_grid_limit() // P``;
    refused with ``grid_barrier=False``.

    Members: p, g, m, v, mask, target ``[P, n]``, partial ``[P, GN_BLOCKS]``, ring ``[P, 2 * slots]``,
    the scalars and both counters ``[P]``.
    """
    _clip_adam_soft("clip_adam_soft", _by_value, p, g, m, v, mask, target, partial, norm, scale, max_norm,
                    done, barrier, lr, m_scale, bc1, bc2, tau, ring, loss, step, slots, beta1, beta2, eps, wd,
                    grid, grid_barrier)  # fmt: skip


def clip_adam_soft_members(
    p, g, m, v, mask, target, partial, norm, scale, max_norm, done, barrier, lr, m_scale, bc1, bc2, tau, ring, loss,
    step, slots: int, beta1, beta2, eps, wd, grid: int | None = None, grid_barrier: bool | str = True,
) -> None:  # fmt: skip
    """:func:`clip_adam_soft` over P members each with its own clip norm and Adam constants: ``max_norm``,
    ``beta1``, ``beta2``, ``eps``, ``wd`` float32 ``[P]`` (member ``i``'s at ``i``), the rest as its member
    axis: member ``i`` the bits of :func:`clip_adam_soft` with its constants (either form)."""
    _clip_adam_soft("clip_adam_soft_members", _per_member, p, g, m, v, mask, target, partial, norm, scale, max_norm,
                    done, barrier, lr, m_scale, bc1, bc2, tau, ring, loss, step, slots, beta1, beta2, eps, wd,
                    grid, grid_barrier)  # fmt: skip


def clip_adam_soft_vaccine(
    p, g, m, v, mask, target, partial, norm, scale, max_norm: float, done, barrier, lr, m_scale, bc1, bc2, tau, ring,
    loss, step, slots: int, beta1: float, beta2: float, eps: float, wd: float, plus, aux, vstate, lo: int, hi: int,
    stop: int, grid: int | None = None,
) -> None:  # fmt: skip
    """:func:`clip_adam_soft` (its one launch, one member) of Gradient Vaccine's corrected gradient: every element of
    ``g`` read as what vaccine's ``apply_plus`` (``stop > 0``) or ``apply`` (``stop = 0``; ``plus`` then not read)
    stores, ``f = g + plus`` on ``[0, stop)`` (``g`` elsewhere), then ``f + c (f - aux)`` on ``[lo, hi)`` with
    ``c = vstate[2]`` (vaccine's ``dots_control`` wrote it), and stored into ``g`` by the update's pass: the bits
    of that apply followed by :func:`clip_adam_soft`, one launch fewer. ``plus``, ``aux``: float32 ``[n]`` (the
    flat layout); ``vstate``: float32 ``[5]``, vaccine's state. Refused where the one launch does not fit (the
    caller then runs the apply and :func:`clip_adam_soft`)."""
    from ..reference.vaccine import STATE

    w = "optim.clip_adam_soft_vaccine"
    if g.ndim != 1:
        raise ValueError(f"{w}: one member (flat [n] buffers), got g {tuple(g.shape)}")
    n = g.shape[0]
    _flat(w, n, plus=plus, aux=aux)
    if vstate.shape != (STATE,) or vstate.dtype != np.float32:
        raise ValueError(f"{w}: vstate must be vaccine's float32 [{STATE}] state, got {vstate.dtype} {vstate.shape}")
    if not (0 <= lo <= hi <= n and 0 <= stop <= n):
        raise ValueError(f"{w}: need 0 <= lo <= hi <= n and 0 <= stop <= n, got lo={lo} hi={hi} stop={stop} n={n}")
    if grid is None and not clip_adam_soft_one_launch(1, n):
        raise ValueError(f"{w}: the one launch does not fit; run vaccine's apply, then clip_adam_soft")
    _clip_adam_soft("clip_adam_soft_vaccine", _by_value, p, g, m, v, mask, target, partial, norm, scale, max_norm,
                    done, barrier, lr, m_scale, bc1, bc2, tau, ring, loss, step, slots, beta1, beta2, eps, wd,
                    grid, True, extra=(plus, aux, vstate, int(lo), int(hi), int(stop)))  # fmt: skip


def _clip_adam_soft(op, consts, p, g, m, v, mask, target, partial, norm, scale, max_norm, done, barrier, lr, m_scale,
                    bc1, bc2, tau, ring, loss, step, slots, beta1, beta2, eps, wd, grid,
                    grid_barrier, extra=()) -> None:  # fmt: skip
    w = f"optim.{op}"
    P, e, n, s = _adam_checks(w, p, g, m, v, mask, lr, m_scale, bc1, bc2, scale, target=target)
    partial_row = _member_table(w, P, "partial", partial, GN_BLOCKS)
    _member_scalars(w, P, norm=norm, tau=tau, loss=loss, step=step)
    ring_row = _ring_row(w, P, ring, slots)
    if address(target) == address(p):
        raise ValueError(f"{w}: target must be a buffer of its own, not the parameters")
    for name, c in (("done", done), ("barrier", barrier)):
        if c.dtype != np.uint32 or c.shape != (P,):
            raise ValueError(f"{w}: {name} must be a uint32 [{P}] counter, got {c.dtype} {c.shape}")
    if address(done) == address(barrier):
        raise ValueError(f"{w}: done and barrier must be two counters, not one buffer")
    if grid is None and not clip_adam_soft_one_launch(P, n, grid_barrier):
        # the two launches: the norm (its last block finishing it and publishing), then the update and soft target
        members = op.endswith("_members")
        gn_op = "grad_norm_publish_members" if members else "grad_norm_publish"
        _launch_grad_norm_publish(w, gn_op, consts, P, e, n, s, partial_row, norm, scale, max_norm, done, ring_row,
                                  loss, step, slots)  # fmt: skip
        _adam_update_soft("adam_update_soft_members" if members else "adam_update_soft", consts, p, g, m, v, mask,
                          target, lr, m_scale, bc1, bc2, scale, tau, beta1, beta2, eps, wd)  # fmt: skip
        return
    limit = kernels.resident_grid_limit()
    if P > limit:
        raise ValueError(
            f"{w}: {P} members need {P} resident blocks at least for the one launch, more than {limit} (one per "
            "multiprocessor); leave grid unset and grid_barrier True or False (two launches, the same bits)"
        )
    if grid is None:
        grid = min(limit // P, clip_adam_soft_blocks(n))
    elif not grid_barrier or not 1 <= int(grid) <= limit // P:
        raise ValueError(
            f"{w}: grid (the one launch forced) must be in [1, {limit // P}] (one block per multiprocessor at "
            f"most, for {P} member(s)) with grid_barrier on, got {grid} (grid_barrier={grid_barrier})"
        )
    launch(
        "optim",
        op,
        (int(grid), P),
        CAS_THREADS,
        (
            *(e[k] for k in ("p", "g", "m", "v", "mask", "target")),
            n,
            s,
            partial_row,
            norm,
            scale,
            *consts(w, P, max_norm=max_norm),
            lr,
            m_scale,
            bc1,
            bc2,
            tau,
            ring_row,
            loss,
            step,
            int(slots),
            done,
            barrier,
            *consts(w, P, beta1=beta1, beta2=beta2, eps=eps, wd=wd),
            *extra,
        ),
    )


def tau_schedule(count, tau, tau_start: float, tau_end: float, period: int) -> None:
    """Advance ``count`` (int64 ``[1]``) and write the cosine-annealed ``tau`` (float32 ``[1]``) (members:
    both ``[P]``, one schedule for all)."""
    P = count.shape[0] if count.ndim == 1 else 1
    _member_scalars("optim.tau_schedule", P, count=count, tau=tau)
    if period < 1:
        raise ValueError(f"optim.tau_schedule: period must be >= 1, got {period}")
    launch(
        "optim",
        "tau_schedule",
        (1, P),
        1,
        (count, tau, float(tau_start), float(tau_end), int(period)),
    )


def tau_schedule_members(count, tau, tau_start, tau_end, period) -> None:
    """:func:`tau_schedule` with each member's own schedule: ``count``, ``tau`` ``[P]``; ``tau_start``,
    ``tau_end`` float32 and ``period`` int64 ``[P]`` (member ``i``'s at ``i``): member ``i`` gets the bits
    of :func:`tau_schedule` with its constants."""
    w = "optim.tau_schedule_members"
    P = count.shape[0]
    _member_scalars(w, P, count=count, tau=tau)
    _member_consts(w, P, tau_start=tau_start, tau_end=tau_end, period=period)
    launch("optim", "tau_schedule_members", (1, P), 1, (count, tau, tau_start, tau_end, period))


def soft_update(target, online, tau) -> None:
    """``target = tau * online + (1 - tau) * target`` over flat float32 buffers; tau ``[1]`` on the device
    (members: ``[P, n]`` buffers, tau ``[P]``)."""
    w = "optim.soft_update"
    P, e, n, s = _rows(w, target=target, online=online)
    _member_scalars(w, P, tau=tau)
    launch(
        "optim",
        "soft_update",
        (_grid(n), P),
        _T,
        (e["target"], e["online"], n, tau, s),
    )


def shrink_perturb(theta, lam: float, sigma: float, seed: int, counter: int, stream_id: int) -> None:
    """``theta = lam * theta + sigma * N(0, 1)`` from Philox; ungraphed only (epoch boundaries)."""
    if kernels.current_context() != kernels.UNGRAPHED:
        raise kernels.KernelError(
            "optim.shrink_perturb runs at epoch boundaries, outside any graph; "
            f"it was called while capturing {kernels.current_context()!r}"
        )
    if theta.ndim != 1:
        raise ValueError(f"optim.shrink_perturb: theta must be flat, got {theta.shape}")
    n = theta.size
    launch(
        "optim",
        "shrink_perturb",
        _grid((n + 1) // 2),
        _T,
        (
            theta,
            n,
            float(lam),
            float(sigma),
            int(seed) & (2**64 - 1),
            int(counter) & (2**64 - 1),
            int(stream_id) & 0xFFFFFFFF,
        ),
    )


# --- spectral normalisation -----------------------------------------------------------------------
def spectral_power_iter(W, u, v, wv, sigma, iterate: int) -> None:
    """One power iteration on W ``[rows, cols]`` (u, wv ``[rows]``, v ``[cols]``) and sigma ``[1]``; one block."""
    rows, cols = W.shape
    for name, a, s in (("u", u, (rows,)), ("v", v, (cols,)), ("wv", wv, (rows,)), ("sigma", sigma, (1,))):
        if a.shape != s:
            raise ValueError(f"optim.spectral_power_iter: {name} must be {s}, got {a.shape}")
    launch(
        "optim",
        "spectral_power_iter",
        1,
        1024,
        (W, u, v, wv, sigma, rows, cols, 1 if iterate else 0),
    )


def spectral_scale(W, sigma, w_sn) -> None:
    """``w_sn = W / sigma``."""
    if w_sn.shape != W.shape:
        raise ValueError(f"optim.spectral_scale: w_sn must be {W.shape}, got {w_sn.shape}")
    _scalar("optim.spectral_scale", sigma=sigma)
    launch(
        "optim",
        "spectral_scale",
        _grid(W.size),
        _T,
        (W, sigma, w_sn, W.size),
    )


def spectral_dot_partial(a, b, partial) -> None:
    """Stage 1 of ``<a, b>`` into float64 ``partial [GN_BLOCKS]``."""
    if a.shape != b.shape:
        raise ValueError(f"optim.spectral_dot_partial: shapes {a.shape} and {b.shape} differ")
    _flat("optim.spectral_dot_partial", GN_BLOCKS, partial=partial)
    launch(
        "optim",
        "spectral_dot_partial",
        GN_BLOCKS,
        GN_THREADS,
        (a, b, partial, a.size),
    )


def spectral_backward(dw_sn, u, v, sigma, partial, dW) -> None:
    """``dW = (dW_sn - <dW_sn, W_sn> u v^T) / sigma``."""
    rows, cols = dw_sn.shape
    if dW.shape != (rows, cols) or u.shape != (rows,) or v.shape != (cols,):
        raise ValueError("optim.spectral_backward: dW must match dw_sn, u be [rows], v be [cols]")
    _flat("optim.spectral_backward", GN_BLOCKS, partial=partial)
    _scalar("optim.spectral_backward", sigma=sigma)
    launch(
        "optim",
        "spectral_backward",
        _grid(rows * cols),
        GN_THREADS,
        (dw_sn, u, v, sigma, partial, dW, rows, cols),
    )
