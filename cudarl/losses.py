"""Distributional targets and losses as pure functions of arrays (rlax style).

Every function takes NumPy arrays (runs the family's twin in ``cudarl.reference``) or CuPy arrays
(launches ``cudarl.ops``), chosen by :func:`cudarl.backend.family`. A function with several outputs
takes ONE result object ``out`` (a small dataclass of buffers: :class:`C51TargetsLoss`,
:class:`QuantileLoss`, ...) and returns it:

* on the GPU the launch writes into ``out``'s buffers; pass one made before a graph capture
  (``C51TargetsLoss.empty(cupy, B, A, K)``, whose ``given`` buffers may be views of the caller's);
  without ``out`` one is allocated here, which only works outside a capture;
* on NumPy the twin's new arrays are copied into ``out``'s buffers, or returned as a new result
  object without ``out`` (the launch counters and scratch are then None).

So one program serves both backends. Equations and shapes are in each docstring; the reference
modules hold the same equations next to the code. Result objects unpack like tuples of their fields.

Shapes: ``B`` batch, ``A`` actions, ``K`` atoms, ``N``/``N'`` quantiles. float32 throughout,
actions int32.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .backend import family, get_array_module, is_numpy
from .reference.popart import STATE_SIZE

F32, I32, U32 = np.float32, np.int32, np.uint32


class _Result:
    """Base of the result objects: unpacks like a tuple of its fields."""

    def __iter__(self):
        return (getattr(self, f.name) for f in fields(self))

    @classmethod
    def _alloc(cls, xp, spec: dict, given: dict):
        """``cls`` with a buffer per ``spec`` entry ``name: (shape, dtype, zeros)``, or ``given[name]``."""
        unknown = sorted(set(given) - set(spec))
        if unknown:
            raise TypeError(f"{cls.__name__}: no buffer named {unknown} (buffers: {sorted(spec)})")
        kw = {}
        for name, (shape, dtype, zero) in spec.items():
            kw[name] = given[name] if name in given else (xp.zeros if zero else xp.empty)(shape, dtype)
        return cls(**kw)


def _numpy(cls, out, **values):
    """NumPy: the twin's ``values`` as a new ``cls``, or copied into ``out``'s buffers (a scalar
    into a ``[1]`` buffer). A buffer ``out`` leaves None is not written."""
    if out is None:
        return cls(**values)
    for name, v in values.items():
        dst = getattr(out, name)
        if dst is not None and v is not None and dst is not v:
            dst[...] = np.reshape(v, dst.shape)
    return out


def _counter(shape=(1,)):
    return (shape, U32, True)  # a launch's ticket or barrier counter: zeros, left zero by the launch


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
        out: float32 ``[B, K]``.
    Returns:
        float32 ``[B, K]``; each row sums to the row sum of ``probs_tp1``.
    """
    xp = get_array_module(probs_tp1)
    ops = family("c51_chain", xp)
    if is_numpy(xp):
        m = ops.project(probs_tp1, r_t, discount_t, support)
        if out is None:
            return m
        out[...] = m
        return out
    out = out if out is not None else xp.empty(probs_tp1.shape, F32)
    ops.project(probs_tp1, r_t, discount_t, support, out)
    return out


@dataclass
class NextProbs(_Result):
    """:func:`c51_next_probs`' ``probs`` float32 ``[B, K]`` and ``a_star`` int32 ``[B]``."""

    probs: object
    a_star: object

    @classmethod
    def empty(cls, xp, B: int, K: int, **given) -> NextProbs:
        return cls._alloc(xp, {"probs": ((B, K), F32, False), "a_star": ((B,), I32, False)}, given)


def c51_next_probs(logits_online_tp1, logits_target_tp1, support, out: NextProbs | None = None) -> NextProbs:
    """Double-DQN next distribution: ``a* = argmax_a E_{softmax(online[b, a])}[z]`` (first on
    ties), ``p = softmax(target[b, a*])``.

    Args:
        logits_online_tp1, logits_target_tp1: float32 ``[B, A, K]``. support: float32 ``[K]``.
    Returns:
        :class:`NextProbs`. Pass the target logits as both arguments for the plain (non-double)
        DQN target.
    """
    xp = get_array_module(logits_online_tp1)
    ops = family("c51_chain", xp)
    if is_numpy(xp):
        probs, a_star = ops.next_probs(logits_online_tp1, logits_target_tp1, support)
        return _numpy(NextProbs, out, probs=probs, a_star=a_star)
    B, _, K = logits_online_tp1.shape
    out = out if out is not None else NextProbs.empty(xp, B, K)
    ops.next_probs(logits_online_tp1, logits_target_tp1, support, out.probs, out.a_star)
    return out


@dataclass
class C51Targets(_Result):
    """:func:`c51_targets`' buffers: ``target [B, K]``, ``probs [B, K]``, ``a_star int32 [B]``; with
    PopArt also ``y [B]``, ``r_norm [B]`` and (GPU) ``scratch [8]``, the statistics before the update."""

    target: object
    probs: object
    a_star: object
    y: object = None
    r_norm: object = None
    scratch: object = None

    @classmethod
    def empty(cls, xp, B: int, K: int, popart: bool = False, **given) -> C51Targets:
        spec = {"target": ((B, K), F32, False), "probs": ((B, K), F32, False), "a_star": ((B,), I32, False)}
        if popart:
            spec.update(y=((B,), F32, False), r_norm=((B,), F32, False), scratch=((STATE_SIZE,), F32, False))
        return cls._alloc(xp, spec, given)


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
    out: C51Targets | None = None,
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
    one launch without PopArt and two with it (the second reduces ``y`` and projects); the unfused
    chain of ``cuda_src/c51_chain.cu``.

    Args:
        logits_online_tp1, logits_target_tp1: float32 ``[B, A, K]``. support: float32 ``[K]``, uniform.
        r_t, discount_t: float32 ``[B]`` (n-step reward, ``gamma^n`` and 0 at terminals).
        popart_state: PopArt's float32 ``[8]`` state (``PopArt.state``), or None for no PopArt;
            updated in place on both backends.
        popart_beta: the step size (CuPy: float32 ``[1]`` device slot; NumPy: a float or ``[1]``).
        sigma_min: floor on sigma.
        out: :class:`C51Targets` (with PopArt: made with ``popart=True``).
    Returns:
        :class:`C51Targets` (``y``, ``r_norm`` None without PopArt).
    """
    xp = get_array_module(logits_online_tp1)
    ops = family("c51_chain", xp)
    popart = popart_state is not None
    if is_numpy(xp):
        m, probs, a_star, y, r_norm, state = ops.targets(
            logits_online_tp1, logits_target_tp1, support, r_t, discount_t, popart_state, popart_beta, sigma_min
        )
        if popart:
            popart_state[...] = state
        return _numpy(C51Targets, out, target=m, probs=probs, a_star=a_star, y=y, r_norm=r_norm)
    B, _, K = logits_online_tp1.shape
    out = out if out is not None else C51Targets.empty(xp, B, K, popart)
    args = (logits_online_tp1, logits_target_tp1, support, r_t, discount_t)
    if not popart:
        ops.targets(*args, out.target, out.probs, out.a_star)
        return out
    ops.next_probs_td(*args, popart_state, out.probs, out.a_star, out.y, out.scratch)
    ops.project_popart(
        out.probs,
        r_t,
        discount_t,
        support,
        out.y,
        out.scratch,
        popart_beta,
        popart_state,
        out.r_norm,
        out.target,
        sigma_min=sigma_min,
    )
    return out


@dataclass
class C51Loss(_Result):
    """:func:`c51_loss`' buffers: ``loss_per [B]``, ``loss`` (``[1]``; a scalar from NumPy without
    ``out``), ``grad [B, A, K]``, ``priority [B]``, and (GPU) ``done``, the launch's uint32 ``[1]``
    ticket counter (zeros, left zero)."""

    loss_per: object
    loss: object
    grad: object
    priority: object
    done: object = None

    @classmethod
    def empty(cls, xp, B: int, A: int, K: int, **given) -> C51Loss:
        spec = {
            "loss_per": ((B,), F32, False),
            "loss": ((1,), F32, False),
            "grad": ((B, A, K), F32, False),
            "priority": ((B,), F32, False),
            "done": _counter(),
        }
        return cls._alloc(xp, spec, given)


def c51_loss(logits_tm1, a_tm1, target, weights, priority="kl", *, out: C51Loss | None = None) -> C51Loss:
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
        out: :class:`C51Loss` (one launch computes the rows and the mean; ``loss`` may be a pinned view).
    """
    xp = get_array_module(logits_tm1)
    ops = family("c51_chain", xp)
    if is_numpy(xp):
        per, mean, grad, prio = ops.loss(logits_tm1, a_tm1, target, weights, priority=priority)
        return _numpy(C51Loss, out, loss_per=per, loss=mean, grad=grad, priority=prio)
    out = out if out is not None else C51Loss.empty(xp, *logits_tm1.shape)
    ops.loss(
        logits_tm1,
        a_tm1,
        target,
        weights,
        out.loss_per,
        out.loss,
        out.grad,
        out.priority,
        out.done,
        priority=priority,
    )
    return out


@dataclass
class C51TargetsLoss(_Result):
    """:func:`c51_targets_loss`' buffers: :class:`C51Targets`' ``target``, ``probs``, ``a_star``,
    :class:`C51Loss`' ``loss_per``, ``loss``, ``priority``, and ``dva [B, (1 + A) K]``, dL/d(the dueling
    head's raw output) at s_t (no gradient wrt the logits); with PopArt ``y``, ``r_norm [B]``. GPU
    launch state: ``done`` and (PopArt) ``barrier``, uint32 ``[1]`` counters of zeros left zero, and
    ``scratch`` float32 ``[8]``. With ``members=P`` (:meth:`empty`) every buffer has a leading axis of P
    members, C-contiguous (``loss``, ``done``, ``barrier`` ``[P]``, ``scratch`` ``[P, 8]``)."""

    target: object
    probs: object
    a_star: object
    loss_per: object
    loss: object
    priority: object
    dva: object
    y: object = None
    r_norm: object = None
    done: object = None
    barrier: object = None
    scratch: object = None

    @classmethod
    def empty(
        cls, xp, B: int, A: int, K: int, popart: bool = False, members: int | None = None, **given
    ) -> C51TargetsLoss:
        spec = {
            "target": ((B, K), F32, False),
            "probs": ((B, K), F32, False),
            "a_star": ((B,), I32, False),
            "loss_per": ((B,), F32, False),
            "loss": ((1,), F32, False),
            "priority": ((B,), F32, False),
            "dva": ((B, (1 + A) * K), F32, False),
            "done": _counter(),
        }
        if popart:
            spec.update(
                y=((B,), F32, False),
                r_norm=((B,), F32, False),
                barrier=_counter(),
                scratch=((STATE_SIZE,), F32, False),
            )
        if members is not None:  # the member axis: [P, ...], the loss and counters [1] -> [P]
            P = int(members)
            spec = {k: ((P,) if shape == (1,) else (P, *shape), dt, z) for k, (shape, dt, z) in spec.items()}
        return cls._alloc(xp, spec, given)


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
    out: C51TargetsLoss | None = None,
    grid_barrier=True,
) -> C51TargetsLoss:
    """:func:`c51_targets` then :func:`c51_loss`, from the dueling C51 head's raw outputs.

    With ``logits = V + Adv - mean_a Adv`` per atom of ``va = (V [K], Adv [A, K])``
    (:class:`cudarl.nn.C51Head`)::

        (m, probs, a*[, y, r~, state']) = c51_targets(logits(va_online_tp1), logits(va_target_tp1), z, r, d[, PopArt])
        (L_b, loss, dL/dlogits, priority) = c51_loss(logits(va_tm1), a, m, w)
        dva = dL/dva:   dV = sum_a dL/dlogits_a,   dAdv_a = dL/dlogits_a - dV / A

    On CuPy it is one launch (``cudarl_c51_targets_loss[_popart]_<variant>``, the kernel variant for A
    and K) with the bits of the chain of launches it replaces (cuda_src/c51_chain.cu, its oracle): the
    head's dueling kernels, the targets, the loss. The logits and their gradient are never stored; the
    network's backward starts from ``dva`` (``QNetwork.backward(raw_head=True)``).

    Args:
        va_tm1, va_online_tp1, va_target_tp1: float32 ``[B, (1 + A) K]``.
        a_tm1: int32 ``[B]``; weights: float32 ``[B]``; the rest as :func:`c51_targets` and :func:`c51_loss`
            (``popart_state`` is updated in place on both backends).
        out: :class:`C51TargetsLoss` (made with ``popart=True`` for PopArt).

    Members (a population's agents): every array with a leading axis of P (``va [P, B, (1 + A) K]``, the
    support ``[P, K]`` or ``[K]``, ``popart_state [P, 8]``, ``popart_beta [P]``), ``out`` made with
    ``members=P``: member ``i`` gets the bits of the call on its arrays alone (one launch on CuPy;
    ``cudarl/ops/c51.py``).
        grid_barrier: CuPy with PopArt, one launch that waits for all its blocks (False: two launches,
            the same bits; see ``run.grid_barrier``).
    """
    xp = get_array_module(va_tm1)
    ops = family("c51", xp)
    args = (va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t)
    if is_numpy(xp):
        if popart_state is None:
            m, probs, a_star, per, mean, prio, dva = ops.targets_loss(*args, priority)
            y = r_norm = None
        else:
            m, probs, a_star, y, r_norm, state, per, mean, prio, dva = ops.targets_loss_popart(
                *args, popart_state, popart_beta, sigma_min, priority
            )
            popart_state[...] = state
        values = dict(target=m, probs=probs, a_star=a_star, y=y, r_norm=r_norm)
        return _numpy(C51TargetsLoss, out, **values, loss_per=per, loss=mean, priority=prio, dva=dva)
    P = va_tm1.shape[0] if va_tm1.ndim == 3 else None
    B, row, K = va_tm1.shape[-2], va_tm1.shape[-1], support.shape[-1]
    out = out if out is not None else C51TargetsLoss.empty(xp, B, row // K - 1, K, popart_state is not None, members=P)
    res = (out.probs, out.a_star, out.target, out.loss_per, out.loss, out.priority, out.dva, out.done)
    if popart_state is None:
        ops.targets_loss(*args, *res, priority=priority)
        return out
    ops.targets_loss_popart(
        *args,
        popart_state,
        popart_beta,
        out.y,
        out.r_norm,
        *res,
        barrier=out.barrier,
        scratch=out.scratch,
        sigma_min=sigma_min,
        priority=priority,
        grid_barrier=grid_barrier,
    )
    return out


@dataclass
class NStep(_Result):
    """:func:`n_step`'s ``r_t`` and ``discount_t``, float32 ``[B]``."""

    r_t: object
    discount_t: object

    @classmethod
    def empty(cls, xp, B: int, **given) -> NStep:
        return cls._alloc(xp, {"r_t": ((B,), F32, False), "discount_t": ((B,), F32, False)}, given)


def n_step(rewards, terminal, gamma, out: NStep | None = None) -> NStep:
    """n-step reward and bootstrap discount.

    ``r_t = sum_{i<n} gamma^i r_i prod_{j<i} (1 - term_j)``, ``discount_t = gamma^n prod_j (1 - term_j)``.

    Args:
        rewards, terminal: float32 ``[B, n]`` (terminal 1.0 where the episode ended).
        gamma: a float (NumPy) or a float32 ``[1]`` device array (CuPy; a schedule's slot).
    Returns:
        :class:`NStep`.
    """
    xp = get_array_module(rewards)
    ops = family("c51", xp)
    if is_numpy(xp):
        r, d = ops.n_step(rewards, terminal, float(np.asarray(gamma).reshape(-1)[0]))
        return _numpy(NStep, out, r_t=r, discount_t=d)
    out = out if out is not None else NStep.empty(xp, rewards.shape[0])
    ops.n_step(rewards, terminal, gamma, out.r_t, out.discount_t)
    return out


# ---- quantile (IQN, QR-DQN) -------------------------------------------------------------------
@dataclass
class QuantileLoss(_Result):
    """:func:`quantile_huber_loss`' buffers: ``loss_per [B]`` (also the priority signal), ``loss``
    (``[1]``; a scalar from NumPy without ``out``), ``grad [B, N, A]``, and (GPU) ``done``."""

    loss_per: object
    loss: object
    grad: object
    done: object = None

    @classmethod
    def empty(cls, xp, B: int, N: int, A: int, **given) -> QuantileLoss:
        spec = {
            "loss_per": ((B,), F32, False),
            "loss": ((1,), F32, False),
            "grad": ((B, N, A), F32, False),
            "done": _counter(),
        }
        return cls._alloc(xp, spec, given)


def quantile_huber_loss(
    theta_tm1, a_tm1, target, taus, weights, kappa=1.0, *, out: QuantileLoss | None = None
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
        theta_tm1: float32 ``[B, N, A]``, the quantile heads' output layout (``QNetwork.forward()["q"]``);
            ``grad`` has the same layout, so it can be written straight into ``QNetwork.grad_outputs()["q"]``.
        a_tm1: int32 ``[B]``. target: float32 ``[B, N']`` (:func:`quantile_targets`). taus: float32
            ``[B, N]`` (IQN, :func:`sample_taus`) or ``[N]`` (QR-DQN, :func:`qr_taus`).
        weights: float32 ``[B]``. kappa: float >= 0 (default 1). out: :class:`QuantileLoss`.
    """
    xp = get_array_module(theta_tm1)
    ops = family("quantile", xp)
    if is_numpy(xp):
        per, mean, grad = ops.huber_loss(theta_tm1, a_tm1, target, taus, weights, kappa=kappa)
        return _numpy(QuantileLoss, out, loss_per=per, loss=mean, grad=grad)
    out = out if out is not None else QuantileLoss.empty(xp, *theta_tm1.shape)
    ops.huber_loss(theta_tm1, a_tm1, target, taus, weights, out.loss_per, out.loss, out.grad, out.done, kappa=kappa)
    return out


@dataclass
class QuantileTargets(_Result):
    """:func:`quantile_targets`' ``target`` float32 ``[B, N']`` and ``a_star`` int32 ``[B]``."""

    target: object
    a_star: object

    @classmethod
    def empty(cls, xp, B: int, M: int, **given) -> QuantileTargets:
        return cls._alloc(xp, {"target": ((B, M), F32, False), "a_star": ((B,), I32, False)}, given)


def quantile_targets(
    theta_online_tp1, theta_target_tp1, r_t, discount_t, out: QuantileTargets | None = None
) -> QuantileTargets:
    """Double-DQN quantile targets ``T_bj = r_b + d_b theta_target[b, j, a*_b]`` with
    ``a*_b = argmax_a mean_j theta_online[b, j, a]``.

    Args: theta_online_tp1, theta_target_tp1 float32 ``[B, N', A]``; r_t, discount_t float32 ``[B]``.
    Returns :class:`QuantileTargets`."""
    xp = get_array_module(theta_online_tp1)
    ops = family("quantile", xp)
    if is_numpy(xp):
        t, a = ops.targets(theta_online_tp1, theta_target_tp1, r_t, discount_t)
        return _numpy(QuantileTargets, out, target=t, a_star=a)
    B, M, _ = theta_online_tp1.shape
    out = out if out is not None else QuantileTargets.empty(xp, B, M)
    ops.targets(theta_online_tp1, theta_target_tp1, r_t, discount_t, out.target, out.a_star)
    return out


def qr_taus(n: int):
    """QR-DQN's fixed midpoints ``tau_i = (2 i + 1) / (2 n)``: float32 ``[n]`` (NumPy)."""
    return family("quantile", np).qr_taus(n)


def sample_taus(seed: int, counter, stream_id: int, shape=None, out=None):
    """IQN taus from Philox stream ``(seed, counter, stream_id)``: float32 ``[B, N]`` in ``[0, 1)``.

    NumPy: ``counter`` is an int (or a ``[1]`` array) and ``shape`` is required. CuPy: ``counter`` is
    a uint64 ``[1]`` device slot (advanced on the device between replays) and ``out`` is written.
    """
    if out is None or is_numpy(get_array_module(out)):
        n = int(np.asarray(counter).reshape(-1)[0])
        return family("quantile", np).sample_taus(seed, n, stream_id, shape)
    family("quantile", get_array_module(out)).sample_taus(seed, counter, stream_id, out)
    return out


# ---- Q statistics -------------------------------------------------------------------------------
@dataclass
class QStats(_Result):
    """:func:`q_stats`' ``stats`` float32 ``[2A + 2]`` and the per-sample rows it reduces: ``q [B, A]``
    (expected Q), ``ent [B]``, ``mass [B, K]`` (entropy and atom mass, averaged over actions)."""

    stats: object
    q: object = None
    ent: object = None
    mass: object = None

    @classmethod
    def empty(cls, xp, B: int, A: int, K: int, **given) -> QStats:
        spec = {
            "stats": ((2 * A + 2,), F32, False),
            "q": ((B, A), F32, False),
            "ent": ((B,), F32, False),
            "mass": ((B, K), F32, False),
        }
        return cls._alloc(xp, spec, given)


def q_stats(logits, support, out: QStats | None = None) -> QStats:
    """Statistics of a C51 head for the host: ``stats`` float32 ``[2A + 2]`` =
    ``mean_b Q[b, a] (A)``, mean atom entropy, atom utilisation, ``var_b Q[b, a] (A)``.

    ``Q[b, a] = sum_k softmax(logits[b, a])_k z_k``; utilisation is the fraction of atoms whose
    batch-mean probability (over samples and actions) exceeds ``1 / (10 K)``. Deterministic
    two-stage reductions: :func:`q_stats_rows`, then :func:`q_stats_reduce`."""
    out = out if out is not None else QStats.empty(get_array_module(logits), *logits.shape)
    q_stats_rows(logits, support, out)
    q_stats_reduce(out)
    return out


def q_stats_rows(logits, support, out: QStats) -> QStats:
    """Stage 1 of :func:`q_stats`: ``out.q [B, A]``, ``out.ent [B]``, ``out.mass [B, K]`` of ``logits [B, A, K]``."""
    xp = get_array_module(logits)
    ops = family("qstats", xp)
    if is_numpy(xp):
        return _numpy(QStats, out, **dict(zip(("q", "ent", "mass"), ops.per_sample(logits, support), strict=True)))
    ops.per_sample(logits, support, out.q, out.ent, out.mass)
    return out


def q_stats_reduce(out: QStats) -> QStats:
    """Stage 2 of :func:`q_stats`: ``out.stats`` from ``out``'s per-sample rows (A + 2 blocks on the GPU)."""
    xp = get_array_module(out.q)
    ops = family("qstats", xp)
    if is_numpy(xp):
        out.stats[...] = ops.reduce(out.q, out.ent, out.mass)
        return out
    ops.reduce(out.q, out.ent, out.mass, out.stats)
    return out


def q_moments(q, stats):
    """A head without atoms: ``stats [2A + 2]`` = mean and batch variance of each action's ``q [B, A]``
    (:func:`q_stats`' layout), entropy and utilisation NaN."""
    xp = get_array_module(q)
    ops = family("qstats", xp)
    if is_numpy(xp):
        stats[...] = ops.moments(q)
    else:
        ops.moments(q, stats)
    return stats


def expected_q(logits, support, out):
    """``out [B, A] = sum_k softmax(logits[b, a])_k z_k`` (the act kernel's bits; nothing else written)."""
    xp = get_array_module(logits)
    ops = family("qstats", xp)
    if is_numpy(xp):
        out[...] = ops.expected_q(logits, support)
    else:
        ops.expected_q(logits, support, out)
    return out


# ---- CQL ------------------------------------------------------------------------------------------
@dataclass
class CQL(_Result):
    """:func:`cql_c51` / :func:`cql_quantile` buffers: ``cql_per [B]``, ``loss`` (``[1]``), ``grad``
    (the logits' or quantiles' shape)."""

    cql_per: object
    loss: object
    grad: object

    @classmethod
    def empty(cls, xp, shape: tuple, **given) -> CQL:
        spec = {"cql_per": ((shape[0],), F32, False), "loss": ((1,), F32, False), "grad": (shape, F32, False)}
        return cls._alloc(xp, spec, given)


def _cql_numpy(out, accumulate: bool, values) -> CQL:
    """The twin's ``(cql_per, loss, grad)`` into ``out`` (``accumulate``: the gradient added, as the kernel does)."""
    cql_per, loss, grad = values
    if accumulate:
        if out is None:
            raise ValueError("accumulate needs out: the gradient to add into")
        out.grad += grad
        return _numpy(CQL, out, cql_per=cql_per, loss=loss)
    return _numpy(CQL, out, cql_per=cql_per, loss=loss, grad=grad)


def cql_c51(logits, a_data, support, alpha, *, out: CQL | None = None, accumulate=False) -> CQL:
    """Discrete CQL on expected C51 Q: ``alpha (1/B) sum_b (logsumexp_a Q(s_b, a) - Q(s_b, a_b))``.

    ``Q = sum_k softmax(logits)_k z_k``; ``grad [B, A, K]``; ``accumulate=True`` adds the gradient
    into ``out.grad`` (e.g. the C51 loss gradient).
    """
    xp = get_array_module(logits)
    ops = family("regularizers", xp)
    if is_numpy(xp):
        return _cql_numpy(out, accumulate, ops.cql_c51(logits, a_data, support, alpha))
    out = out if out is not None else CQL.empty(xp, logits.shape)
    ops.cql_c51(logits, a_data, support, alpha, out.cql_per, out.loss, out.grad, accumulate=accumulate)
    return out


def cql_quantile(theta, a_data, alpha, *, out: CQL | None = None, accumulate=False) -> CQL:
    """Discrete CQL on mean-quantile Q (IQN/QR): as :func:`cql_c51` with ``Q(s_b, a) = mean_i theta[b, i, a]``.

    theta: float32 ``[B, N, A]``; ``grad[b, i, a] = (alpha / (B N)) (softmax_a Q(s_b, .)_a - 1{a = a_b})``."""
    xp = get_array_module(theta)
    ops = family("regularizers", xp)
    if is_numpy(xp):
        return _cql_numpy(out, accumulate, ops.cql_quantile(theta, a_data, alpha))
    out = out if out is not None else CQL.empty(xp, theta.shape)
    ops.cql_quantile(theta, a_data, alpha, out.cql_per, out.loss, out.grad, accumulate=accumulate)
    return out
