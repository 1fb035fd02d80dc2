"""Launchers for ``cuda_src/optim.cu`` (twin: ``cudarl/reference/optim.py``, same names and arguments).

Shapes are checked here (and the dtypes of the counters and pointer tables the launch signature
cannot say), other dtypes and contiguity by ``kernels.launch``. Nothing here allocates,
synchronises or reads a device value, so every launcher but :func:`shrink_perturb` (which
refuses to run inside a capture) can be captured.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..kernels import blocks_for, launch
from ..reference.optim import GN_BLOCKS, GN_THREADS

_T = 256
_MAX_GRID = 8192


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


def grad_norm_partial(g, partial) -> None:
    """Stage 1: float64 ``partial [GN_BLOCKS]`` of sums of squares of flat float32 ``g``."""
    _flat("optim.grad_norm_partial", GN_BLOCKS, partial=partial)
    launch("optim", "grad_norm_partial", GN_BLOCKS, GN_THREADS, (g, partial, g.size))


def grad_norm_finalize(partial, norm, scale, max_norm: float) -> None:
    """Stage 2: ``norm [1]`` and clip ``scale [1]`` (float32) from the partials."""
    _flat("optim.grad_norm_finalize", GN_BLOCKS, partial=partial)
    _scalar("optim.grad_norm_finalize", norm=norm, scale=scale)
    launch(
        "optim",
        "grad_norm_finalize",
        1,
        GN_BLOCKS,
        (partial, norm, scale, float(max_norm)),
    )


def grad_norm(g, partial, norm, scale, max_norm: float, done=None) -> None:
    """Both stages (deterministic global L2 norm and clip scale).

    With ``done`` (uint32 ``[1]``, 0, the launch's ticket; left 0) one launch whose last block does
    stage 2, with the same bits as the two launches made without it.
    """
    if g.ndim != 1:
        raise ValueError(f"optim.grad_norm: g must be flat, got {g.shape}")
    if done is None:
        grad_norm_partial(g, partial)
        grad_norm_finalize(partial, norm, scale, max_norm)
        return
    w = "optim.grad_norm"
    _flat(w, GN_BLOCKS, partial=partial)
    _scalar(w, norm=norm, scale=scale)
    if done.dtype != np.uint32 or done.shape != (1,):
        raise ValueError(f"{w}: done must be a uint32 [1] ticket, got {done.dtype} {done.shape}")
    launch(
        "optim",
        "grad_norm",
        GN_BLOCKS,
        GN_THREADS,
        (g, partial, norm, scale, float(max_norm), done, g.size),
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
    """Advance ``step`` (int64 ``[1]``) and write lr, m_scale, bc1, bc2 (float32 ``[1]``) on the device."""
    _scalar("optim.lr_schedule", step=step, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2)
    if period < 1 or mult < 1 or warmup < 0 or kind not in (0, 1, 2):
        raise ValueError(f"optim.lr_schedule: bad schedule kind={kind} period={period} mult={mult} warmup={warmup}")
    launch(
        "optim",
        "lr_schedule",
        1,
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


def _adam_checks(w: str, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip) -> int:
    n = p.size
    _flat(w, n, p=p, g=g, m=m, v=v, mask=mask)
    _scalar(w, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2, clip=clip)
    return n


def adam_update(
    p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """Fused Adam(W) over flat float32 ``p, g, m, v [n]`` with uint8 ``mask [n]`` and device scalars."""
    n = _adam_checks("optim.adam_update", p, g, m, v, mask, lr, m_scale, bc1, bc2, clip)
    launch(
        "optim",
        "adam_update",
        _grid(n),
        _T,
        (p, g, m, v, mask, n, lr, m_scale, bc1, bc2, clip, float(beta1), float(beta2), float(eps), float(wd)),
    )


def adam_update_soft(
    p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """:func:`adam_update`, then :func:`soft_update` of ``target [n]`` toward the new ``p`` with ``tau [1]``,
    in one launch (the same bits as the two)."""
    w = "optim.adam_update_soft"
    n = _adam_checks(w, p, g, m, v, mask, lr, m_scale, bc1, bc2, clip)
    _flat(w, n, target=target)
    _scalar(w, tau=tau)
    if target.data.ptr == p.data.ptr:
        raise ValueError(f"{w}: target must be a buffer of its own, not the parameters")
    launch(
        "optim",
        "adam_update_soft",
        _grid(n),
        _T,
        (
            p,
            g,
            m,
            v,
            mask,
            target,
            n,
            lr,
            m_scale,
            bc1,
            bc2,
            clip,
            tau,
            float(beta1),
            float(beta2),
            float(eps),
            float(wd),
        ),
    )


#: Threads of a clip_adam_soft block (CAS_THREADS in optim.cu): CAS_THREADS / GN_THREADS virtual blocks of grad_norm.
CAS_THREADS = 1024


def _base_ptr(a) -> int:
    return a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]


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
) -> None:
    """:func:`grad_norm` (``done``), :func:`adam_update_soft` with ``clip = scale`` and agent's ``publish``
    of ``(loss[0], norm[0])`` into ring slot ``step[0] % slots``, in one launch, with the same bits.

    ``done`` and ``barrier``: two distinct uint32 ``[1]`` counters, 0 at launch and left 0 (the
    grid barrier's counter and the last block's ticket). ``ring``: float32 ``[2 * slots]``;
    ``loss``, ``norm``, ``scale``, ``tau`` float32 ``[1]``; ``step`` int64 ``[1]``.
    ``grid``: at most :func:`cudarl.kernels.resident_grid_limit` blocks (default: that limit, or
    fewer when ``n`` needs fewer blocks of ``CAS_THREADS``); any grid gives the same bits.
    """
    w = "optim.clip_adam_soft"
    n = _adam_checks(w, p, g, m, v, mask, lr, m_scale, bc1, bc2, scale)
    _flat(w, n, target=target)
    _flat(w, GN_BLOCKS, partial=partial)
    _scalar(w, norm=norm, tau=tau, loss=loss, step=step)
    if int(slots) < 1 or ring.ndim != 1 or ring.shape[0] != 2 * int(slots):
        raise ValueError(f"{w}: ring must be flat [2 * slots] with slots >= 1, got {ring.shape} for slots={slots}")
    for name, c in (("done", done), ("barrier", barrier)):
        if c.dtype != np.uint32 or c.shape != (1,):
            raise ValueError(f"{w}: {name} must be a uint32 [1] counter, got {c.dtype} {c.shape}")
    if _base_ptr(done) == _base_ptr(barrier):
        raise ValueError(f"{w}: done and barrier must be two counters, not one buffer")
    if _base_ptr(target) == _base_ptr(p):
        raise ValueError(f"{w}: target must be a buffer of its own, not the parameters")
    limit = kernels.resident_grid_limit()
    if grid is None:
        grid = min(limit, blocks_for(n, CAS_THREADS))
    elif not 1 <= int(grid) <= limit:
        raise ValueError(f"{w}: grid must be in [1, {limit}] (one block per multiprocessor at most), got {grid}")
    launch(
        "optim",
        "clip_adam_soft",
        int(grid),
        CAS_THREADS,
        (
            p,
            g,
            m,
            v,
            mask,
            target,
            n,
            partial,
            norm,
            scale,
            float(max_norm),
            lr,
            m_scale,
            bc1,
            bc2,
            tau,
            ring,
            loss,
            step,
            int(slots),
            done,
            barrier,
            float(beta1),
            float(beta2),
            float(eps),
            float(wd),
        ),
    )


def tau_schedule(count, tau, tau_start: float, tau_end: float, period: int) -> None:
    """Advance ``count`` (int64 ``[1]``) and write the cosine-annealed ``tau`` (float32 ``[1]``)."""
    _scalar("optim.tau_schedule", count=count, tau=tau)
    if period < 1:
        raise ValueError(f"optim.tau_schedule: period must be >= 1, got {period}")
    launch(
        "optim",
        "tau_schedule",
        1,
        1,
        (count, tau, float(tau_start), float(tau_end), int(period)),
    )


def soft_update(target, online, tau) -> None:
    """``target = tau * online + (1 - tau) * target`` over flat float32 buffers; tau ``[1]`` on the device."""
    n = target.size
    _flat("optim.soft_update", n, target=target, online=online)
    _scalar("optim.soft_update", tau=tau)
    launch(
        "optim",
        "soft_update",
        _grid(n),
        _T,
        (target, online, n, tau),
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
