"""NumPy twin of ``cuda_src/optim.cu``: gradient norm, schedules, Adam, target update, shrink-and-perturb.

Device scalars (step counters, lr, bias corrections, tau) are 1-element arrays, read and
written in place like the kernels do. Scalar math of the schedules is done in float64 and
rounded once to float32, on both faces.

The functions marked :func:`members` also take a leading axis of ``P`` members (a population's
agents): buffers ``[P, ...]``, device scalars ``[P]``. They run the single function on each member's
rows and scalars in turn, so member ``i`` is the single call's result by construction, as the
kernels' ``blockIdx.y`` makes it on the GPU.
"""

from __future__ import annotations

import math

import numpy as np

from . import philox
from ._members import over_members

#: Blocks of the first stage of the gradient norm; block k owns elements i with (i // 256) % GN_BLOCKS == k.
GN_BLOCKS, GN_THREADS = 512, 256
#: Virtual blocks a grad_norm block runs side by side (GN_FOLD in optim.cu): its launches take GN_BLOCKS / GN_FOLD
#: blocks; the partials and their bits are the GN_BLOCKS blocks' whatever the fold.
GN_FOLD = 8
#: Threads of a clip_adam_soft block (CAS_THREADS in optim.cu): CAS_THREADS / GN_THREADS virtual blocks of grad_norm.
CAS_THREADS = 1024
CONSTANT, COSINE, COSINE_RESTARTS = 0, 1, 2
SCHEDULES = {"constant": CONSTANT, "cosine": COSINE, "cosine_restarts": COSINE_RESTARTS}


def clip_adam_soft_blocks(n: int) -> int:
    """The blocks of :data:`CAS_THREADS` that cover a member's ``n`` parameters: ``clip_adam_soft``'s
    grid a member when the resident grid does not cap it (:func:`cudarl.kernels.barrier_grid_fits`;
    the launcher's, ``cudarl.ops.optim``, is this one)."""
    return max(1, -(-int(n) // CAS_THREADS))


def members(rows: tuple = (), scalars: tuple = ()):
    """Give a twin the member axis. ``rows``: the arguments that are one member's flat array (``[n]``,
    ``partial [GN_BLOCKS]``, a ring), ``[P, ...]`` with the axis; ``scalars``: its device scalars, ``[1]``
    for one member and ``[P]`` for P (None, an absent optional one, stays None). With the axis (the first
    row has two dimensions; a twin without rows: its first scalar has more than one element) the twin runs
    once per member ``i`` on row ``i`` of each row argument and a 1-element view of element ``i`` of each
    scalar, the other arguments as given; otherwise it is the single call."""

    def split(fn, a):
        lead = a[rows[0]].ndim == 2 if rows else a[scalars[0]].shape[0] != 1
        if not lead:
            return None
        P = a[rows[0]].shape[0] if rows else a[scalars[0]].shape[0]
        sc = [k for k in scalars if a.get(k) is not None]
        if any(a[k].ndim != 2 or a[k].shape[0] != P for k in rows) or any(a[k].shape != (P,) for k in sc):
            raise ValueError(f"{fn.__name__}: every buffer has the member axis of one length, or none does")
        return [dict(a, **{k: a[k][i] for k in rows}, **{k: a[k][i : i + 1] for k in sc}) for i in range(P)]

    return over_members(split)


@members(rows=("g", "partial"))
def grad_norm_partial(g: np.ndarray, partial: np.ndarray) -> None:
    """``partial[k] = sum_{i in block k} g[i]^2`` in float64. g ``[n]``; partial float64 ``[GN_BLOCKS]``."""
    n = g.size
    idx = np.arange(n)
    blk = (idx // GN_THREADS) % GN_BLOCKS
    sq = g.astype(np.float64) ** 2
    partial[...] = np.bincount(blk, weights=sq, minlength=GN_BLOCKS)[:GN_BLOCKS]


@members(rows=("partial",), scalars=("norm", "scale"))
def grad_norm_finalize(partial: np.ndarray, norm: np.ndarray, scale: np.ndarray, max_norm: float) -> None:
    """``norm = sqrt(sum_k partial[k])``; clip ``scale = max_norm / (norm + 1e-6)`` if that is < 1, else 1.

    ``max_norm <= 0`` disables clipping (scale 1). A NaN norm gives scale 1 and stays NaN for the guard.
    norm, scale ``[1]`` float32 (written).
    """
    nd = math.sqrt(float(np.sum(partial, dtype=np.float64)))
    norm[0] = nd
    denom = nd + 1e-6
    scale[0] = float(np.float32(max_norm)) / denom if (max_norm > 0 and denom > float(np.float32(max_norm))) else 1.0


@members(rows=("g", "partial"), scalars=("norm", "scale", "done"))
def grad_norm(g, partial, norm, scale, max_norm: float, done=None) -> None:
    """Both stages: global L2 norm of ``g`` and the clip scale (``done``: the GPU launch's ticket; unused here)."""
    grad_norm_partial(g, partial)
    grad_norm_finalize(partial, norm, scale, max_norm)


@members(rows=("g", "partial", "ring"), scalars=("norm", "scale", "done", "loss", "step"))
def grad_norm_publish(g, partial, norm, scale, max_norm: float, done, ring, loss, step, slots: int) -> None:
    """:func:`grad_norm`, then ``cudarl.reference.agent.publish`` of ``(loss[0], norm[0])`` into ``ring`` slot
    ``step[0] % slots`` (the GPU does both in one launch, its last block publishing: the first of
    :func:`clip_adam_soft`'s two launches without a grid barrier; ``done``: its ticket, unused here)."""
    from . import agent

    grad_norm(g, partial, norm, scale, max_norm, done)
    agent.publish(ring, loss, norm, step, slots)


def schedule_lr(
    s: int, kind: int, lr_max: float, lr_min: float, warmup: int, period: int, mult: int
) -> tuple[float, bool]:
    """Learning rate at 0-based step ``s`` and whether ``s`` starts a warm restart (float64).

    * warmup (``s < warmup``): ``lr_max (s + 1) / warmup``;
    * constant: ``lr_max``;
    * cosine over ``period`` steps after warmup: ``lr_min + (lr_max - lr_min)(1 + cos(pi min(s', T) / T)) / 2``;
    * cosine with warm restarts (Loshchilov & Hutter 2017): the same within cycle ``i`` of length
      ``T_i = period * mult^i``, ``s'`` counted from the cycle's start.
    """
    if s < warmup:
        return lr_max * (s + 1) / warmup, False
    s = s - warmup
    if kind == CONSTANT:
        return lr_max, False
    if kind == COSINE:
        t = min(s, period)
        return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * t / period)), False
    ti, tcur, i = period, s, 0
    while tcur >= ti:
        tcur -= ti
        ti *= mult
        i += 1
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * tcur / ti)), (tcur == 0 and i > 0)


@members(scalars=("step", "lr", "m_scale", "bc1", "bc2"))
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
    """Advance the optimiser step on the device: ``step += 1`` (t = step, s = t - 1), then write
    ``lr = schedule(s)``, ``m_scale = restart_m_scale`` on a warm restart else 1, and the bias
    corrections ``bc1 = 1 - beta1^t``, ``bc2 = 1 - beta2^t``. step int64 ``[1]``; the rest float32 ``[1]``.
    """
    step[0] += 1
    t = int(step[0])
    f = lambda x: float(np.float32(x))  # noqa: E731  the kernel receives float32 arguments
    value, restart = schedule_lr(t - 1, kind, f(lr_max), f(lr_min), warmup, period, mult)
    lr[0] = value
    m_scale[0] = f(restart_m_scale) if restart else 1.0
    bc1[0] = 1.0 - f(beta1) ** t
    bc2[0] = 1.0 - f(beta2) ** t


def lr_schedule_members(
    step, lr, m_scale, bc1, bc2, kind, lr_max, lr_min, warmup, period, mult, restart_m_scale, beta1, beta2
) -> None:
    """:func:`lr_schedule` with each member's own schedule: the scalars ``[P]``; kind, lr_max, lr_min,
    warmup, period, mult, restart_m_scale, beta1 and beta2 ``[P]`` (member ``i``'s at ``i``); member ``i``
    is :func:`lr_schedule` on its scalars with its constants."""
    for i in range(step.shape[0]):
        s = slice(i, i + 1)
        lr_schedule(
            step[s], lr[s], m_scale[s], bc1[s], bc2[s], int(kind[i]), float(lr_max[i]), float(lr_min[i]),
            int(warmup[i]), int(period[i]), int(mult[i]), float(restart_m_scale[i]), float(beta1[i]),
            float(beta2[i]),
        )  # fmt: skip


@members(rows=("p", "g", "m", "v", "mask"), scalars=("lr", "m_scale", "bc1", "bc2", "clip"))
def adam_update(
    p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """Fused Adam(W) over flat buffers (Kingma & Ba 2015; decoupled decay, Loshchilov & Hutter 2019).

    ``g' = clip g``; ``m = beta1 (m_scale m) + (1 - beta1) g'``; ``v = beta2 v + (1 - beta2) g'^2``;
    ``p = p - lr wd mask p``; ``p = p - lr (m / bc1) / (sqrt(v / bc2) + eps)``.
    p, g, m, v ``[n]`` (p, m, v updated); mask uint8 ``[n]``; lr, m_scale, bc1, bc2, clip ``[1]``.
    """
    T = p.dtype.type
    b1, b2, e, w = T(beta1), T(beta2), T(eps), T(wd)
    gc = g * T(clip[0])
    m[...] = b1 * (T(m_scale[0]) * m) + (T(1) - b1) * gc
    v[...] = b2 * v + (T(1) - b2) * (gc * gc)
    mhat = m / T(bc1[0])
    vhat = v / T(bc2[0])
    lr_ = T(lr[0])
    if w != 0:
        p[...] = np.where(mask != 0, p - lr_ * w * p, p)
    p[...] = p - lr_ * (mhat / (np.sqrt(vhat) + e))


@members(rows=("p", "g", "m", "v", "mask", "target"), scalars=("lr", "m_scale", "bc1", "bc2", "clip", "tau"))
def adam_update_soft(
    p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1: float, beta2: float, eps: float, wd: float
) -> None:
    """:func:`adam_update`, then :func:`soft_update` ``(target, p, tau)`` (the GPU does both in one launch)."""
    adam_update(p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2, eps, wd)
    soft_update(target, p, tau)


@members(
    rows=("p", "g", "m", "v", "mask", "target", "partial", "ring"),
    scalars=("norm", "scale", "done", "barrier", "lr", "m_scale", "bc1", "bc2", "tau", "loss", "step"),
)
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
    grid=None,
    grid_barrier: bool = True,
) -> None:
    """:func:`grad_norm`, :func:`adam_update_soft` with ``clip = scale``, then ``cudarl.reference.agent.publish``
    of ``(loss[0], norm[0])`` into ``ring`` slot ``step[0] % slots`` (the GPU does the three in one launch, or
    in two: :func:`grad_norm_publish`, then :func:`adam_update_soft`; :func:`clip_adam_soft_one_launch`).

    ``done``, ``barrier`` (the launch's counters), ``grid`` (its block count) and ``grid_barrier`` (its form)
    are unused here.
    """
    from . import agent

    grad_norm(g, partial, norm, scale, max_norm, done)
    adam_update_soft(p, g, m, v, mask, target, lr, m_scale, bc1, bc2, scale, tau, beta1, beta2, eps, wd)
    agent.publish(ring, loss, norm, step, slots)


def clip_adam_soft_vaccine(
    p, g, m, v, mask, target, partial, norm, scale, max_norm: float, done, barrier, lr, m_scale, bc1, bc2, tau, ring,
    loss, step, slots: int, beta1: float, beta2: float, eps: float, wd: float, plus, aux, vstate, lo: int, hi: int,
    stop: int, grid=None,
) -> None:  # fmt: skip
    """Gradient Vaccine's apply into ``g`` (:func:`cudarl.reference.vaccine.apply_plus` over ``[0, stop)`` where
    ``stop > 0``, else :func:`~cudarl.reference.vaccine.apply`; ``c = vstate[2]``), then :func:`clip_adam_soft`:
    the GPU folds the apply into that one launch (one member). ``grid`` is unused here."""
    from . import vaccine

    if stop > 0:
        g[:stop] = vaccine.apply_plus(g[:stop], plus[:stop], aux[:stop], vstate, lo, hi)
    else:
        g[...] = vaccine.apply(g, aux, vstate, lo, hi)
    clip_adam_soft(p, g, m, v, mask, target, partial, norm, scale, max_norm, done, barrier, lr, m_scale, bc1, bc2,
                   tau, ring, loss, step, slots, beta1, beta2, eps, wd)  # fmt: skip


def clip_adam_soft_one_launch(P: int, n: int, grid_barrier: bool | str = True, limit: int | None = None) -> bool:
    """The form ``cudarl.ops.optim.clip_adam_soft`` takes (True: one launch with a grid barrier; False: two,
    the same bits): ``grid_barrier`` and :func:`cudarl.kernels.barrier_grid_fits` of
    :func:`clip_adam_soft_blocks` ``(n)`` over ``limit`` resident blocks; ``limit`` not given, the twin has
    no residency: ``grid_barrier``; ``"always"``: True."""
    from ..kernels import barrier_grid_fits

    if grid_barrier == "always" or not grid_barrier:
        return bool(grid_barrier)
    return limit is None or barrier_grid_fits(P, clip_adam_soft_blocks(n), limit)


@members(scalars=("count", "tau"))
def tau_schedule(count, tau, tau_start: float, tau_end: float, period: int) -> None:
    """``count += 1``; ``tau = tau_end + (tau_start - tau_end)(1 + cos(pi min(c, T) / T)) / 2`` with c = count - 1.

    count int64 ``[1]``, tau float32 ``[1]``.
    """
    count[0] += 1
    c = min(int(count[0]) - 1, period)
    a, b = float(np.float32(tau_start)), float(np.float32(tau_end))
    tau[0] = b + 0.5 * (a - b) * (1.0 + math.cos(math.pi * c / period))


def _each_member(fn, P: int, rows: dict, scalars: dict, consts: dict, **shared) -> None:
    """``fn`` once per member ``i``: row ``i`` of each of ``rows``, a 1-element view of element ``i`` of each of
    ``scalars``, ``float(c[i])`` of each of ``consts`` (member ``i``'s by-value constants), ``shared`` as given."""
    for i in range(P):
        fn(
            **{k: a[i] for k, a in rows.items()},
            **{k: a[i : i + 1] for k, a in scalars.items()},
            **{k: float(c[i]) for k, c in consts.items()},
            **shared,
        )


def grad_norm_members(g, partial, norm, scale, max_norms, done) -> None:
    """:func:`grad_norm` over P members each clipping at its own ``max_norms[i]`` (``[P]``)."""
    _each_member(grad_norm, g.shape[0], dict(g=g, partial=partial), dict(norm=norm, scale=scale, done=done),
                 dict(max_norm=max_norms))  # fmt: skip


def grad_norm_publish_members(g, partial, norm, scale, max_norms, done, ring, loss, step, slots) -> None:
    """:func:`grad_norm_publish` over P members each clipping at its own ``max_norms[i]`` (``[P]``)."""
    _each_member(grad_norm_publish, g.shape[0], dict(g=g, partial=partial, ring=ring),
                 dict(norm=norm, scale=scale, done=done, loss=loss, step=step), dict(max_norm=max_norms),
                 slots=slots)  # fmt: skip


def adam_update_members(p, g, m, v, mask, lr, m_scale, bc1, bc2, clip, beta1, beta2, eps, wd) -> None:
    """:func:`adam_update` over P members each with its own beta1, beta2, eps and wd (``[P]``)."""
    _each_member(
        adam_update, p.shape[0], dict(p=p, g=g, m=m, v=v, mask=mask),
        dict(lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2, clip=clip), dict(beta1=beta1, beta2=beta2, eps=eps, wd=wd),
    )  # fmt: skip


def adam_update_soft_members(p, g, m, v, mask, target, lr, m_scale, bc1, bc2, clip, tau, beta1, beta2, eps, wd):
    """:func:`adam_update_soft` over P members each with its own beta1, beta2, eps and wd (``[P]``)."""
    _each_member(
        adam_update_soft, p.shape[0], dict(p=p, g=g, m=m, v=v, mask=mask, target=target),
        dict(lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2, clip=clip, tau=tau),
        dict(beta1=beta1, beta2=beta2, eps=eps, wd=wd),
    )  # fmt: skip


def clip_adam_soft_members(
    p, g, m, v, mask, target, partial, norm, scale, max_norm, done, barrier, lr, m_scale, bc1, bc2, tau, ring, loss,
    step, slots, beta1, beta2, eps, wd, grid=None, grid_barrier=True,
) -> None:  # fmt: skip
    """:func:`clip_adam_soft` over P members each with its own max_norm, beta1, beta2, eps and wd (``[P]``)."""
    _each_member(
        clip_adam_soft, p.shape[0], dict(p=p, g=g, m=m, v=v, mask=mask, target=target, partial=partial, ring=ring),
        dict(norm=norm, scale=scale, done=done, barrier=barrier, lr=lr, m_scale=m_scale, bc1=bc1, bc2=bc2, tau=tau,
             loss=loss, step=step),
        dict(max_norm=max_norm, beta1=beta1, beta2=beta2, eps=eps, wd=wd), slots=slots,
    )  # fmt: skip


def tau_schedule_members(count, tau, tau_start, tau_end, period) -> None:
    """:func:`tau_schedule` with each member's own schedule: count, tau ``[P]``; tau_start, tau_end,
    period ``[P]`` (member ``i``'s at ``i``)."""
    for i in range(count.shape[0]):
        s = slice(i, i + 1)
        tau_schedule(count[s], tau[s], float(tau_start[i]), float(tau_end[i]), int(period[i]))


@members(rows=("target", "online"), scalars=("tau",))
def soft_update(target, online, tau) -> None:
    """Polyak averaging ``target = tau * online + (1 - tau) * target``. target, online ``[n]``; tau ``[1]``."""
    T = target.dtype.type
    t = T(tau[0])
    target[...] = t * online + (T(1) - t) * target


def shrink_perturb(theta, lam: float, sigma: float, seed: int, counter: int, stream_id: int) -> None:
    """Shrink-and-perturb (Ash & Adams 2020): ``theta = lam * theta + sigma * z``, z ~ N(0, 1).

    ``z`` by Box-Muller from Philox stream ``(seed, counter, stream_id)``: element ``2k + j``
    (j = 0, 1) uses block k, lanes ``(2j, 2j + 1)`` as ``(u1, u2)``:
    ``z = sqrt(-2 ln(1 - u1)) cos(2 pi u2)``, computed in float64. theta ``[n]`` float32, in place.
    """
    n = theta.size
    nb = (n + 1) // 2
    blk = philox.blocks(seed, counter, stream_id, np.arange(nb, dtype=np.uint32))
    u = philox.to_uniform(blk).astype(np.float64)  # [nb, 4]
    z = np.empty((nb, 2))
    for j in range(2):
        z[:, j] = np.sqrt(-2.0 * np.log(1.0 - u[:, 2 * j])) * np.cos(2.0 * np.pi * u[:, 2 * j + 1])
    T = theta.dtype.type
    theta[...] = T(lam) * theta + T(sigma) * z.reshape(-1)[:n].astype(theta.dtype)


# --- spectral normalisation (Miyato et al. 2018) ----------------------------------------------------
def spectral_power_iter(W, u, v, wv, sigma, iterate: int) -> None:
    """One power iteration and the spectral-norm estimate of ``W [rows, cols]``.

    With ``iterate``: ``v = W^T u / ||W^T u||``, ``wv = W v``, ``u = wv / ||wv||``; without it
    ``u`` and ``v`` are kept and only ``wv = W v`` is formed. Always ``sigma = u . wv`` (= u^T W v).
    u, wv ``[rows]``; v ``[cols]``; sigma ``[1]``; norms and the dot product in float64.
    """
    if iterate:
        vv = W.T @ u
        v[...] = (vv.astype(np.float64) / math.sqrt(float(np.sum(vv.astype(np.float64) ** 2)))).astype(v.dtype)
    wv[...] = W @ v
    w64 = wv.astype(np.float64)
    if iterate:
        u[...] = (w64 / math.sqrt(float(np.sum(w64**2)))).astype(u.dtype)
    sigma[0] = float(np.dot(u.astype(np.float64), w64))


def spectral_scale(W, sigma, w_sn) -> None:
    """``w_sn = W / sigma`` (same shape as W)."""
    w_sn[...] = W / W.dtype.type(sigma[0])


def spectral_dot_partial(a, b, partial) -> None:
    """Stage 1 of ``<a, b>`` in float64 with the grad-norm block mapping. a, b flat-able; partial ``[GN_BLOCKS]``."""
    a, b = a.reshape(-1), b.reshape(-1)
    blk = (np.arange(a.size) // GN_THREADS) % GN_BLOCKS
    partial[...] = np.bincount(blk, weights=a.astype(np.float64) * b.astype(np.float64), minlength=GN_BLOCKS)[
        :GN_BLOCKS
    ]


def spectral_backward(dw_sn, u, v, sigma, partial, dW) -> None:
    """``dW = (dW_sn - c u v^T) / sigma`` with ``c = sum(partial) = <dW_sn, W_sn>`` (u, v held constant)."""
    T = dW.dtype.type
    c = T(float(np.sum(partial, dtype=np.float64)))
    dW[...] = (dw_sn - (c * u)[:, None] * v[None, :]) / T(sigma[0])
