"""Distributional targets and losses as pure functions of arrays (rlax style).

Every function takes NumPy arrays (runs ``cudarl.reference``, returns new arrays) or CuPy
arrays (launches ``cudarl.ops``, writes into ``out_*`` buffers and returns them). On the GPU,
pass preallocated ``out_*`` buffers inside a graph capture; a missing one is allocated here,
which is only allowed outside a capture. Equations and shapes are in each docstring; the
reference modules hold the same equations next to the code.

Shapes: ``B`` batch, ``A`` actions, ``K`` atoms, ``N``/``N'`` quantiles. float32 throughout,
actions int32.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .backend import get_array_module
from .reference import c51 as _c51

C51Loss = namedtuple("C51Loss", "loss_per loss grad priority")
C51Loss.__doc__ = (
    """``loss_per [B]``, ``loss`` (scalar on NumPy, ``[1]`` on CuPy), ``grad [B, A, K]``, ``priority [B]``."""
)


def _is_gpu(*arrays) -> bool:
    return get_array_module(*arrays).__name__ == "cupy"


def _out(xp, buf, shape, dtype=np.float32):
    return buf if buf is not None else xp.empty(shape, dtype=dtype)


def _done(xp, buf):
    """The uint32 ``[1]`` ticket counter of a one-launch loss: 0 before the launch, left 0."""
    return buf if buf is not None else xp.zeros((1,), dtype=np.uint32)


# ---- C51 --------------------------------------------------------------------------------------
def c51_project(probs_tp1, r_t, discount_t, support, out=None):
    """Categorical projection of ``r_t + discount_t * z`` onto the fixed support (Bellemare 2017).

    ``Tz_j = clip(r_t + discount_t z_j, v_min, v_max)``, ``g_j = (Tz_j - v_min) / dz``; mass
    ``p_j`` splits between atoms ``floor(g_j)`` and ``floor(g_j) + 1`` with weights
    ``1 - frac(g_j)`` and ``frac(g_j)``; an atom landing exactly on the grid keeps all of its
    mass. ``discount_t`` is ``gamma^n`` and 0 at terminals (see :func:`n_step`).

    Args:
        probs_tp1: float32 ``[B, K]`` next-state distribution (e.g. :func:`c51_next_probs`).
        r_t, discount_t: float32 ``[B]``. support: float32 ``[K]``, uniform, ``K >= 2``.
        out: float32 ``[B, K]`` (CuPy only).
    Returns:
        float32 ``[B, K]``; each row sums to the row sum of ``probs_tp1``.
    """
    if not _is_gpu(probs_tp1):
        return _c51.project(probs_tp1, r_t, discount_t, support)
    import cupy as cp

    from .ops import c51 as ops

    out = _out(cp, out, probs_tp1.shape)
    ops.project(probs_tp1, r_t, discount_t, support, out)
    return out


def c51_next_probs(logits_online_tp1, logits_target_tp1, support, out_probs=None, out_a_star=None):
    """Double-DQN next distribution: ``a* = argmax_a E_{softmax(online[b, a])}[z]`` (first on
    ties), ``p = softmax(target[b, a*])``.

    Args:
        logits_online_tp1, logits_target_tp1: float32 ``[B, A, K]``. support: float32 ``[K]``.
    Returns:
        ``(probs float32 [B, K], a_star int32 [B])``. Pass the target logits as both arguments
        for the plain (non-double) DQN target.
    """
    if not _is_gpu(logits_online_tp1):
        return _c51.next_probs(logits_online_tp1, logits_target_tp1, support)
    import cupy as cp

    from .ops import c51 as ops

    B, _, K = logits_online_tp1.shape
    out_probs, out_a_star = _out(cp, out_probs, (B, K)), _out(cp, out_a_star, (B,), np.int32)
    ops.next_probs(logits_online_tp1, logits_target_tp1, support, out_probs, out_a_star)
    return out_probs, out_a_star


C51Targets = namedtuple("C51Targets", "target probs a_star y r_norm state")
C51Targets.__doc__ = """``target [B, K]``, ``probs [B, K]``, ``a_star int32 [B]``; with PopArt also ``y [B]``,
``r_norm [B]`` and ``state [8]`` (the updated statistics), else None."""


def c51_targets(
    logits_online_tp1,
    logits_target_tp1,
    support,
    r_t,
    discount_t,
    popart_state=None,
    popart_beta=None,
    sigma_min=1e-4,
    *,
    out_target=None,
    out_probs=None,
    out_a_star=None,
    out_y=None,
    out_r_norm=None,
    scratch=None,
) -> C51Targets:
    """The whole C51 target of a train step: double-DQN next distribution, PopArt, projection.

    With ``z`` the support and ``s = sigma / scale`` (:class:`cudarl.popart.PopArt`)::

        a*_b = argmax_a sum_k softmax(online[b, a])_k z_k  (first on ties),  p_b = softmax(target[b, a*_b])
        without PopArt:  m_b = Proj(r_b + d_b z; p_b)                            (c51_project)
        with PopArt:     v_b = sum_k p_bk z_k,   y_b = r_b + d_b (s v_b + mu)    (statistics before the step)
                         (mu', sigma') = PopArt update with y                   (moment EMAs over the batch)
                         r~_b = (r_b - (1 - d_b) mu') / s',   m_b = Proj(r~_b + d_b z; p_b)

    The update uses this step's ``y`` and the rewards are normalised with the UPDATED statistics,
    as ``c51_next_probs``, ``PopArt.td_targets``, ``PopArt.update``, ``PopArt.normalize_rewards`` and
    :func:`c51_project` in that order (on NumPy the same calls: the same numbers). On CuPy it is
    one launch without PopArt and two with it (the second reduces ``y`` and projects).

    Args:
        logits_online_tp1, logits_target_tp1: float32 ``[B, A, K]``. support: float32 ``[K]``, uniform.
        r_t, discount_t: float32 ``[B]`` (n-step reward, ``gamma^n`` and 0 at terminals).
        popart_state: PopArt's float32 ``[8]`` state (``PopArt.state``), or None for no PopArt. On
            CuPy it is updated in place; on NumPy it is not modified (the new one is returned).
        popart_beta: the step size (CuPy: float32 ``[1]`` device slot; NumPy: a float or ``[1]``).
        sigma_min: floor on sigma.
        out_*: CuPy output buffers (``out_y``, ``out_r_norm`` only with PopArt); ``scratch``: float32
            ``[8]`` (CuPy with PopArt: the statistics before the update, for the second launch).
    Returns:
        :class:`C51Targets`.
    """
    if not _is_gpu(logits_online_tp1):
        return C51Targets(
            *_c51.targets(
                logits_online_tp1, logits_target_tp1, support, r_t, discount_t, popart_state, popart_beta, sigma_min
            )
        )
    import cupy as cp

    from .ops import c51 as ops

    B, _, K = logits_online_tp1.shape
    target, probs = _out(cp, out_target, (B, K)), _out(cp, out_probs, (B, K))
    a_star = _out(cp, out_a_star, (B,), np.int32)
    if popart_state is None:
        ops.targets(logits_online_tp1, logits_target_tp1, support, r_t, discount_t, target, probs, a_star)
        return C51Targets(target, probs, a_star, None, None, None)
    y, r_norm, scratch = _out(cp, out_y, (B,)), _out(cp, out_r_norm, (B,)), _out(cp, scratch, (8,))
    ops.next_probs_td(
        logits_online_tp1, logits_target_tp1, support, r_t, discount_t, popart_state, probs, a_star, y, scratch
    )
    ops.project_popart(
        probs, r_t, discount_t, support, y, scratch, popart_beta, popart_state, r_norm, target, sigma_min=sigma_min
    )
    return C51Targets(target, probs, a_star, y, r_norm, popart_state)


def c51_loss(
    logits_tm1,
    a_tm1,
    target,
    weights,
    priority="kl",
    *,
    out_loss_per=None,
    out_loss=None,
    out_grad=None,
    out_priority=None,
    done=None,
) -> C51Loss:
    """Importance-weighted categorical cross-entropy, its gradient and a priority signal.

    With ``p = softmax(logits_tm1[b, a_tm1[b]])`` and ``m = target[b]``::

        L_b  = -sum_k m_k log p_k
        loss = (1 / B) sum_b w_b L_b
        d loss / d logits[b, a, k] = (w_b / B) (p_k sum_j m_j - m_k)   for a = a_tm1[b], else 0
        priority_b = L_b                                    ("ce")
                   = KL(m || p) = max(0, L_b + sum_k m_k log m_k)   ("kl", default)

    KL is the default because it is 0 when the prediction matches the target, so a learned
    transition stops being replayed; cross-entropy keeps the target's entropy as a floor.

    Args:
        logits_tm1: float32 ``[B, A, K]`` (dueling C51 output). a_tm1: int32 ``[B]``.
        target: float32 ``[B, K]`` (:func:`c51_project`). weights: float32 ``[B]`` (PER IS weights).
        done: CuPy only, a uint32 ``[1]`` buffer of zeros the launch uses as its ticket counter and
            leaves 0 (one launch computes the rows and the mean); allocated here if missing.
    Returns:
        :class:`C51Loss`. On CuPy ``loss`` is ``out_loss [1]`` (may be a pinned device view).
    """
    if not _is_gpu(logits_tm1):
        return C51Loss(*_c51.loss(logits_tm1, a_tm1, target, weights, priority=priority))
    import cupy as cp

    from .ops import c51 as ops

    B = logits_tm1.shape[0]
    res = C51Loss(
        _out(cp, out_loss_per, (B,)),
        _out(cp, out_loss, (1,)),
        _out(cp, out_grad, logits_tm1.shape),
        _out(cp, out_priority, (B,)),
    )
    ops.loss(
        logits_tm1,
        a_tm1,
        target,
        weights,
        res.loss_per,
        res.loss,
        res.grad,
        res.priority,
        _done(cp, done),
        priority=priority,
    )
    return res


C51TargetsLoss = namedtuple("C51TargetsLoss", "target probs a_star y r_norm state loss_per loss priority dva")
C51TargetsLoss.__doc__ = """:class:`C51Targets`' fields, :class:`C51Loss`' ``loss_per``, ``loss``, ``priority``, and
``dva [B, (1 + A) K]``: dL/d(the dueling head's raw output) at s_t (no ``grad`` wrt the logits)."""


def c51_targets_loss(
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    priority="kl",
    popart_state=None,
    popart_beta=None,
    sigma_min=1e-4,
    *,
    out_target=None,
    out_probs=None,
    out_a_star=None,
    out_y=None,
    out_r_norm=None,
    out_loss_per=None,
    out_loss=None,
    out_priority=None,
    out_dva=None,
    done=None,
    barrier=None,
    scratch=None,
    grid_barrier=True,
) -> C51TargetsLoss:
    """:func:`c51_targets` then :func:`c51_loss`, from the dueling C51 head's raw outputs.

    With ``logits = V + Adv - mean_a Adv`` per atom of ``va = (V [K], Adv [A, K])``
    (:class:`cudarl.nn.C51Head`)::

        (m, probs, a*[, y, r~, state']) = c51_targets(logits(va_online_tp1), logits(va_target_tp1), z, r, d[, PopArt])
        (L_b, loss, dL/dlogits, priority) = c51_loss(logits(va_tm1), a, m, w)
        dva = dL/dva:   dV = sum_a dL/dlogits_a,   dAdv_a = dL/dlogits_a - dV / A

    On CuPy it is one launch (``cudarl_c51_targets_loss[_popart]``) with the bits of the chain of
    launches it replaces: the head's dueling kernels, the targets, the loss. The logits and their
    gradient are never stored; the network's backward starts from ``dva``
    (``QNetwork.backward(raw_head=True)``).

    Args:
        va_tm1, va_online_tp1, va_target_tp1: float32 ``[B, (1 + A) K]``.
        a_tm1: int32 ``[B]``; weights: float32 ``[B]``; the rest as :func:`c51_targets` and :func:`c51_loss`.
        done, barrier: CuPy, uint32 ``[1]`` counters of zeros (``barrier`` with PopArt only), left 0.
        scratch: CuPy with PopArt, float32 ``[8]``. grid_barrier: CuPy with PopArt, one launch that
            waits for all its blocks (False: two launches, the same bits; see ``run.grid_barrier``).
    Returns:
        :class:`C51TargetsLoss` (on NumPy new arrays; ``popart_state`` is not modified there).
    """
    if not _is_gpu(va_tm1):
        if popart_state is None:
            m, probs, a_star, loss_per, loss, prio, dva = _c51.targets_loss(
                va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t, priority
            )
            return C51TargetsLoss(m, probs, a_star, None, None, None, loss_per, loss, prio, dva)
        return C51TargetsLoss(
            *_c51.targets_loss_popart(
                va_tm1,
                va_online_tp1,
                va_target_tp1,
                a_tm1,
                weights,
                support,
                r_t,
                discount_t,
                popart_state,
                popart_beta,
                sigma_min,
                priority,
            )
        )
    import cupy as cp

    from .ops import c51 as ops

    B, K = va_tm1.shape[0], support.shape[0]
    res = dict(
        out_probs=_out(cp, out_probs, (B, K)),
        out_a_star=_out(cp, out_a_star, (B,), np.int32),
        out_target=_out(cp, out_target, (B, K)),
        out_loss_per=_out(cp, out_loss_per, (B,)),
        out_loss=_out(cp, out_loss, (1,)),
        out_priority=_out(cp, out_priority, (B,)),
        out_dva=_out(cp, out_dva, va_tm1.shape),
    )
    args = (va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t)
    if popart_state is None:
        ops.targets_loss(*args, **res, done=_done(cp, done), priority=priority)
        y = r_norm = None
    else:
        y, r_norm = _out(cp, out_y, (B,)), _out(cp, out_r_norm, (B,))
        ops.targets_loss_popart(
            *args,
            popart_state,
            popart_beta,
            y,
            r_norm,
            **res,
            done=_done(cp, done),
            barrier=_done(cp, barrier),
            scratch=_out(cp, scratch, (8,)),
            sigma_min=sigma_min,
            priority=priority,
            grid_barrier=grid_barrier,
        )
    return C51TargetsLoss(
        res["out_target"],
        res["out_probs"],
        res["out_a_star"],
        y,
        r_norm,
        popart_state,
        res["out_loss_per"],
        res["out_loss"],
        res["out_priority"],
        res["out_dva"],
    )


def n_step(rewards, terminal, gamma, out_r_t=None, out_discount_t=None):
    """n-step reward and bootstrap discount.

    ``r_t = sum_{i<n} gamma^i r_i prod_{j<i} (1 - term_j)``, ``discount_t = gamma^n prod_j (1 - term_j)``.

    Args:
        rewards, terminal: float32 ``[B, n]`` (terminal 1.0 where the episode ended).
        gamma: a float (NumPy) or a float32 ``[1]`` device array (CuPy; a schedule's slot).
    Returns:
        ``(r_t [B], discount_t [B])``.
    """
    if not _is_gpu(rewards):
        return _c51.n_step(rewards, terminal, float(np.asarray(gamma).reshape(-1)[0]))
    import cupy as cp

    from .ops import c51 as ops

    B = rewards.shape[0]
    out_r_t, out_discount_t = _out(cp, out_r_t, (B,)), _out(cp, out_discount_t, (B,))
    ops.n_step(rewards, terminal, gamma, out_r_t, out_discount_t)
    return out_r_t, out_discount_t


# ---- quantile (IQN, QR-DQN) -------------------------------------------------------------------
QuantileLoss = namedtuple("QuantileLoss", "loss_per loss grad")
QuantileLoss.__doc__ = (
    """``loss_per [B]`` (also the priority signal), ``loss`` (scalar / ``[1]``), ``grad [B, N, A]``."""
)


def quantile_huber_loss(
    theta_tm1, a_tm1, target, taus, weights, kappa=1.0, *, out_loss_per=None, out_loss=None, out_grad=None, done=None
) -> QuantileLoss:
    """Quantile Huber loss (IQN, Dabney et al. 2018) and its gradient wrt the quantile values.

    With ``theta_i = theta_tm1[b, i, a_tm1[b]]``, ``delta_ij = target[b, j] - theta_i``::

        rho_tau(delta) = |tau - 1{delta < 0}| H_kappa(delta) / kappa
        H_kappa(delta) = delta^2 / 2 if |delta| <= kappa else kappa (|delta| - kappa / 2)
        L_b  = sum_i (1 / N') sum_j rho_{tau_i}(delta_ij),   loss = (1 / B) sum_b w_b L_b
        d loss / d theta_i = -(w_b / (B N')) sum_j |tau_i - 1{delta_ij < 0}| clip(delta_ij, -kappa, kappa) / kappa

    ``kappa = 0`` is plain quantile regression. A target above a quantile pulls it up with
    weight ``tau``, one below pulls it down with weight ``1 - tau``.

    Args:
        theta_tm1: float32 ``[B, N, A]``, the IQN head's output layout (``QNetwork.forward()["q"]``);
            ``grad`` has the same layout, so it can be written straight into ``QNetwork.grad_outputs()["q"]``.
            a_tm1: int32 ``[B]``. target: float32 ``[B, N']``
        (:func:`quantile_targets`). taus: float32 ``[B, N]`` (IQN, :func:`sample_taus`) or ``[N]``
        (QR-DQN, :func:`qr_taus`). weights: float32 ``[B]``. kappa: float >= 0 (default 1).
        done: CuPy only, a uint32 ``[1]`` ticket counter of zeros, left 0 (as in :func:`c51_loss`).
    """
    from .reference import quantile as _q

    if not _is_gpu(theta_tm1):
        return QuantileLoss(*_q.huber_loss(theta_tm1, a_tm1, target, taus, weights, kappa=kappa))
    import cupy as cp

    from .ops import quantile as ops

    B = theta_tm1.shape[0]
    res = QuantileLoss(_out(cp, out_loss_per, (B,)), _out(cp, out_loss, (1,)), _out(cp, out_grad, theta_tm1.shape))
    ops.huber_loss(
        theta_tm1, a_tm1, target, taus, weights, res.loss_per, res.loss, res.grad, _done(cp, done), kappa=kappa
    )
    return res


def quantile_targets(theta_online_tp1, theta_target_tp1, r_t, discount_t, out=None, out_a_star=None):
    """Double-DQN quantile targets ``T_bj = r_b + d_b theta_target[b, j, a*_b]`` with
    ``a*_b = argmax_a mean_j theta_online[b, j, a]``.

    Args: theta_online_tp1, theta_target_tp1 float32 ``[B, N', A]``; r_t, discount_t float32 ``[B]``.
    Returns ``(T float32 [B, N'], a_star int32 [B])``."""
    from .reference import quantile as _q

    if not _is_gpu(theta_online_tp1):
        return _q.targets(theta_online_tp1, theta_target_tp1, r_t, discount_t)
    import cupy as cp

    from .ops import quantile as ops

    B, M, _ = theta_online_tp1.shape
    out, out_a_star = _out(cp, out, (B, M)), _out(cp, out_a_star, (B,), np.int32)
    ops.targets(theta_online_tp1, theta_target_tp1, r_t, discount_t, out, out_a_star)
    return out, out_a_star


def qr_taus(n: int):
    """QR-DQN's fixed midpoints ``tau_i = (2 i + 1) / (2 n)``: float32 ``[n]`` (NumPy)."""
    from .reference import quantile as _q

    return _q.qr_taus(n)


def sample_taus(seed: int, counter, stream_id: int, shape=None, out=None):
    """IQN taus from Philox stream ``(seed, counter, stream_id)``: float32 ``[B, N]`` in ``[0, 1)``.

    NumPy: ``counter`` is an int and ``shape`` is required. CuPy: ``counter`` is a uint64 ``[1]``
    device slot (advanced on the device between replays) and ``out`` is written.
    """
    from .reference import quantile as _q

    if out is None or not _is_gpu(out):
        return _q.sample_taus(
            seed, int(np.asarray(counter).reshape(-1)[0]) if not np.isscalar(counter) else counter, stream_id, shape
        )
    from .ops import quantile as ops

    ops.sample_taus(seed, counter, stream_id, out)
    return out


# ---- Q statistics -------------------------------------------------------------------------------
def q_stats(logits, support, out=None, scratch=None):
    """Statistics of a C51 head for the host: float32 ``[2A + 2]`` =
    ``mean_b Q[b, a] (A)``, mean atom entropy, atom utilisation, ``var_b Q[b, a] (A)``.

    ``Q[b, a] = sum_k softmax(logits[b, a])_k z_k``; utilisation is the fraction of atoms whose
    batch-mean probability (over samples and actions) exceeds ``1 / (10 K)``. Deterministic
    two-stage reductions. On CuPy, ``out`` may be ``PinnedReadback.device`` and ``scratch`` is
    ``(q [B, A], ent [B], mass [B, K])`` float32 buffers allocated before any capture.
    """
    from .reference import qstats as _qs

    if not _is_gpu(logits):
        return _qs.q_stats(logits, support)
    import cupy as cp

    from .ops import qstats as ops

    B, A, K = logits.shape
    out = _out(cp, out, (2 * A + 2,))
    if scratch is None:
        scratch = (cp.empty((B, A), np.float32), cp.empty((B,), np.float32), cp.empty((B, K), np.float32))
    ops.q_stats(logits, support, *scratch, out)
    return out


# ---- CQL / IQL ------------------------------------------------------------------------------------
def cql_c51(logits, a_data, support, alpha, *, out_cql_per=None, out_loss=None, out_grad=None, accumulate=False):
    """Discrete CQL on expected C51 Q: ``alpha (1/B) sum_b (logsumexp_a Q(s_b, a) - Q(s_b, a_b))``.

    ``Q = sum_k softmax(logits)_k z_k``; returns ``(cql_per [B], loss, grad [B, A, K])``; on CuPy
    ``accumulate=True`` adds the gradient into ``out_grad`` (e.g. the C51 loss gradient).
    """
    from .reference import regularizers as _rg

    if not _is_gpu(logits):
        return _rg.cql_c51(logits, a_data, support, alpha)
    import cupy as cp

    from .ops import regularizers as ops

    B = logits.shape[0]
    res = (_out(cp, out_cql_per, (B,)), _out(cp, out_loss, (1,)), _out(cp, out_grad, logits.shape))
    ops.cql_c51(logits, a_data, support, alpha, *res, accumulate=accumulate)
    return res


def cql_quantile(theta, a_data, alpha, *, out_cql_per=None, out_loss=None, out_grad=None, accumulate=False):
    """Discrete CQL on mean-quantile Q (IQN/QR): as :func:`cql_c51` with ``Q(s_b, a) = mean_i theta[b, i, a]``.

    theta: float32 ``[B, N, A]``; returns ``(cql_per [B], loss, grad [B, N, A])`` with
    ``grad[b, i, a] = (alpha / (B N)) (softmax_a Q(s_b, .)_a - 1{a = a_b})``."""
    from .reference import regularizers as _rg

    if not _is_gpu(theta):
        return _rg.cql_quantile(theta, a_data, alpha)
    import cupy as cp

    from .ops import regularizers as ops

    B = theta.shape[0]
    res = (_out(cp, out_cql_per, (B,)), _out(cp, out_loss, (1,)), _out(cp, out_grad, theta.shape))
    ops.cql_quantile(theta, a_data, alpha, *res, accumulate=accumulate)
    return res


def iql_expectile(q, v, priority, tau=0.7, *, out_loss_per=None, out_loss=None, out_grad_v=None, out_priority=None):
    """IQL expectile regression of ``v`` towards ``q`` and priority modulation.

    ``u = q - v``, ``w = |tau - 1{u < 0}|``, ``loss = (1/B) sum_b w u^2``, ``dloss/dv = -2 w u / B``,
    ``priority_out = priority * 2 w`` (identity at ``tau = 0.5``). Returns
    ``(loss_per, loss, grad_v, priority_out)``, all ``[B]`` except ``loss``.
    """
    from .reference import regularizers as _rg

    if not _is_gpu(q):
        return _rg.expectile(q, v, priority, tau)
    import cupy as cp

    from .ops import regularizers as ops

    B = q.shape[0]
    res = (
        _out(cp, out_loss_per, (B,)),
        _out(cp, out_loss, (1,)),
        _out(cp, out_grad_v, (B,)),
        _out(cp, out_priority, (B,)),
    )
    ops.expectile(q, v, priority, tau, *res)
    return res
