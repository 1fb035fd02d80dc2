"""Fused Adam over a flat parameter buffer, device-side schedules, target updates, shrink-and-perturb.

Every counter and schedule value lives in device memory (:class:`cudarl.pinned.DeviceScalars`)
and is advanced by a kernel, so a captured step replays with the current learning rate, bias
correction and tau. Kernels: ``cuda_src/optim.cu``; twin: ``cudarl.reference.optim``.

:class:`StackedAdam` and :class:`StackedSoftUpdate` are the same objects over P members' stacked
``[P, n]`` buffers (a population's agents, e.g. :class:`cudarl.nn.StackedQNetwork`'s ``params`` and
``grads``), with ``[P]`` device scalars: one launch per operation for every member, member ``i`` the
bits of the single object on its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import family, get_array_module, to_numpy
from .config import AgentConfig as _AGENT
from .config import OptimConfig as _OPTIM
from .pinned import DeviceScalars, MemberScalars, member_index
from .reference.optim import GN_BLOCKS, SCHEDULES


def _zeros_like_rows(xp, a, dtype=None):
    """Zeros shaped as ``a``; for ``[P, n]`` members, rows as many elements apart as ``a``'s, so the
    optimiser's buffers share the parameters' member stride (the kernels take one)."""
    if a.ndim == 1:
        return xp.zeros_like(a, dtype=dtype)
    P, n = a.shape
    s = a.strides[0] // a.itemsize
    return xp.zeros((P, max(s, n)), dtype=dtype or a.dtype)[:, :n]


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule, computed on the device at every step.

    Attributes:
        kind: ``"constant"``, ``"cosine"`` or ``"cosine_restarts"`` (SGDR).
        lr: peak learning rate (``lr_max``).
        lr_min: floor of the cosine.
        warmup: linear warm-up steps, ``lr (s + 1) / warmup`` for ``s < warmup``.
        period: cosine length in steps (first cycle length for restarts).
        mult: cycle length multiplier between restarts (integer >= 1).
        restart_m_scale: factor applied to Adam's first moment at each warm restart (1 keeps it).
    """

    # One source of defaults: the fields default to OptimConfig's (cudarl/config.py).
    kind: str = _OPTIM.schedule
    lr: float = _OPTIM.lr
    lr_min: float = _OPTIM.lr_min
    warmup: int = _OPTIM.warmup
    period: int = _OPTIM.period
    mult: int = _OPTIM.mult
    restart_m_scale: float = _OPTIM.restart_m_scale

    @classmethod
    def from_config(cls, o) -> Schedule:
        """The schedule an :class:`cudarl.config.OptimConfig` describes."""
        return cls(o.schedule, o.lr, o.lr_min, o.warmup, o.period, o.mult, o.restart_m_scale)

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"Schedule.kind {self.kind!r} not in {sorted(SCHEDULES)}")
        if not (self.lr > 0 and 0 <= self.lr_min <= self.lr):
            raise ValueError(f"Schedule: need 0 <= lr_min <= lr and lr > 0, got lr={self.lr} lr_min={self.lr_min}")
        if self.warmup < 0 or self.period < 1 or self.mult < 1 or int(self.mult) != self.mult:
            raise ValueError(
                f"Schedule: warmup >= 0, period >= 1, integer mult >= 1 (got {self.warmup}, {self.period}, {self.mult})"
            )
        if not 0 <= self.restart_m_scale <= 1:
            raise ValueError(f"Schedule.restart_m_scale must be in [0, 1], got {self.restart_m_scale}")


class Adam:
    """Adam(W) with global-norm clipping over one flat buffer: three launches per step.

    ``step()`` runs ``lr_schedule`` (step += 1, lr, restart factor, bias corrections), the
    two-stage ``grad_norm`` (norm and clip scale; one launch, its last block doing stage 2) and the
    fused ``adam_update`` (optionally with a :class:`SoftUpdate`'s target update, ``update_step(soft)``).
    ``clip_update_publish(soft, ring, loss, slots)`` does the norm, the update with the target's and
    the publish of (loss, norm) to a host ring in one launch (a grid barrier between the norm's
    partials and the update).

    Args:
        params, grads: flat float32 ``[n]`` buffers (e.g. ``QNetwork.params`` / ``.grads``).
        schedule: the learning-rate :class:`Schedule`.
        betas, eps: Adam's constants.
        weight_decay: decoupled decay (AdamW), applied where ``decay_mask`` is 1.
        decay_mask: uint8 ``[n]`` (``ParamLayout.decay_mask()``); default: decay everywhere.
        max_grad_norm: clip the global norm to this (``0`` disables clipping; the norm is
            always computed and left in :attr:`scalars` ``grad_norm`` for the guard).
        grad_norm_out: optional float32 ``[1]`` device buffer (e.g. a ``PinnedReadback.device``
            slice) that receives the norm instead of the scalar slot.
    """

    _RANK, _FORM = 1, "flat"  # the parameters' rank and its name in errors (StackedAdam: [P, n])

    @classmethod
    def from_config(cls, net, o, grad_norm_out=None, xp=None):
        """The optimiser an :class:`cudarl.config.OptimConfig` ``o`` describes over ``net``'s ``params`` and
        ``grads`` (decay where ``net.layout.decay_mask()`` is 1); ``grad_norm_out`` and ``xp`` as above."""
        return cls(
            net.params,
            net.grads,
            schedule=Schedule.from_config(o),
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            decay_mask=net.layout.decay_mask(),
            max_grad_norm=o.max_grad_norm,
            grad_norm_out=grad_norm_out,
            xp=xp,
        )

    def __init__(
        self,
        params,
        grads,
        *,
        schedule: Schedule = Schedule(),
        betas=(_OPTIM.beta1, _OPTIM.beta2),
        eps: float = _OPTIM.eps,
        weight_decay: float = _OPTIM.weight_decay,
        decay_mask=None,
        max_grad_norm: float = _OPTIM.max_grad_norm,
        grad_norm_out=None,
        xp=None,
    ):
        self.xp = xp if xp is not None else get_array_module(params)
        if params.shape != grads.shape or params.ndim != self._RANK:
            raise ValueError(f"params and grads must be {self._FORM} and alike, got {params.shape} and {grads.shape}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1 and eps > 0 and weight_decay >= 0 and max_grad_norm >= 0):
            raise ValueError("Adam: need betas in [0, 1), eps > 0, weight_decay >= 0, max_grad_norm >= 0")
        self.params, self.grads, self.schedule = params, grads, schedule
        self.beta1, self.beta2, self.eps = float(betas[0]), float(betas[1]), float(eps)
        self.weight_decay, self.max_grad_norm = float(weight_decay), float(max_grad_norm)
        xp = self.xp
        self.m = _zeros_like_rows(xp, params)
        self.v = _zeros_like_rows(xp, params)
        n, lead = params.shape[-1], params.shape[:-1]  # lead: () for one agent, (P,) for members
        mask = np.ones(n, np.uint8) if decay_mask is None else np.asarray(to_numpy(decay_mask), np.uint8)
        if mask.shape == (n,):
            mask = np.ascontiguousarray(np.broadcast_to(mask, params.shape))
        if mask.shape != params.shape:
            raise ValueError(f"decay_mask must be [{n}] or {list(params.shape)}, got {mask.shape}")
        self.mask = _zeros_like_rows(xp, params, np.uint8)
        self.mask[...] = xp.asarray(mask)
        self.partial = xp.zeros((*lead, GN_BLOCKS), dtype=np.float64)
        members = lead[0] if lead else 1
        self.gn_done = xp.zeros(members, dtype=np.uint32)  # the one-launch gradient norm's ticket (0 between launches)
        self.gn_barrier = xp.zeros(
            members, dtype=np.uint32
        )  # clip_update_publish's grid-barrier counter (0 between launches)
        self.scalars = self._new_scalars(
            {
                "step": np.int64,
                "lr": np.float32,
                "m_scale": np.float32,
                "bc1": np.float32,
                "bc2": np.float32,
                "grad_norm": np.float32,
                "clip_scale": np.float32,
            },
            xp,
            initial={"m_scale": 1.0, "clip_scale": 1.0},
        )
        self.grad_norm_out = grad_norm_out if grad_norm_out is not None else self.scalars.view("grad_norm")
        self.ops = family("optim", xp)
        if getattr(xp, "__name__", "") == "cupy":
            from .kernels import resident_grid_limit

            # clip_update_publish's launcher asks it: the device query is made here, before any capture
            resident_grid_limit()

    def _new_scalars(self, spec: dict, xp, initial: dict):
        """The device scalars (one agent: a :class:`cudarl.pinned.DeviceScalars`)."""
        return DeviceScalars(spec, xp, initial=initial)

    def schedule_step(self) -> None:
        """Advance the step counter, the learning rate, the restart factor and the bias corrections (one thread)."""
        s, sc = self.schedule, self.scalars
        self.ops.lr_schedule(
            sc.view("step"),
            sc.view("lr"),
            sc.view("m_scale"),
            sc.view("bc1"),
            sc.view("bc2"),
            SCHEDULES[s.kind],
            s.lr,
            s.lr_min,
            s.warmup,
            s.period,
            int(s.mult),
            s.restart_m_scale,
            self.beta1,
            self.beta2,
        )

    def clip_step(self) -> None:
        """The global gradient norm and the clip scale (one launch; the norm goes to ``grad_norm_out``)."""
        self.ops.grad_norm(
            self.grads,
            self.partial,
            self.grad_norm_out,
            self.scalars.view("clip_scale"),
            self.max_grad_norm,
            done=self.gn_done,
        )

    def update_step(self, soft: SoftUpdate | None = None) -> None:
        """The parameter update; with ``soft`` (whose online buffer is :attr:`params`) also its target
        update toward the new parameters, in the same launch (its tau as last scheduled)."""
        sc = self.scalars
        consts = (self.beta1, self.beta2, self.eps, self.weight_decay)
        if soft is None:
            self.ops.adam_update(
                self.params,
                self.grads,
                self.m,
                self.v,
                self.mask,
                sc.view("lr"),
                sc.view("m_scale"),
                sc.view("bc1"),
                sc.view("bc2"),
                sc.view("clip_scale"),
                *consts,
            )
            return
        if soft.online is not self.params:
            raise ValueError("Adam.update_step: soft must average toward these parameters (soft.online is params)")
        self.ops.adam_update_soft(
            self.params,
            self.grads,
            self.m,
            self.v,
            self.mask,
            soft.target,
            sc.view("lr"),
            sc.view("m_scale"),
            sc.view("bc1"),
            sc.view("bc2"),
            sc.view("clip_scale"),
            soft.scalars.view("tau"),
            *consts,
        )

    def clip_update_publish(
        self, soft: SoftUpdate, ring, loss, slots: int, grid_barrier: bool = True, apply=None
    ) -> None:
        """:meth:`clip_step`, :meth:`update_step` ``(soft)`` and the publish of ``(loss[0], grad norm)``
        into slot ``step % slots`` of ``ring`` (float32 ``[2 * slots]``, e.g. a ``PinnedReadback.device``;
        step: this optimiser's counter, advanced by :meth:`schedule_step`), as
        ``cudarl.reference.agent.publish`` does. On the GPU ``optim.clip_adam_soft`` with the bits of the
        three: one launch with a grid barrier, or two without where ``grid_barrier`` is off (or, for
        members, where the barrier would squeeze them: ``optim.clip_adam_soft_one_launch``); on NumPy the
        three twins. ``apply``: Gradient Vaccine's correction of the gradient
        (:class:`cudarl.auxiliary.base.AdamApply`, :meth:`cudarl.auxiliary.AuxSignal.adam_apply`), applied on the fly
        in that one launch
        (``optim.clip_adam_soft_vaccine``: the bits of vaccine's apply first; one member, grid barrier on)."""
        if soft.online is not self.params:
            raise ValueError(
                "Adam.clip_update_publish: soft must average toward these parameters (soft.online is params)"
            )
        sc = self.scalars
        if apply is not None and not grid_barrier:
            raise ValueError("Adam.clip_update_publish: a folded apply needs the one launch (grid_barrier on)")
        op = self.ops.clip_adam_soft if apply is None else self.ops.clip_adam_soft_vaccine
        op(
            self.params,
            self.grads,
            self.m,
            self.v,
            self.mask,
            soft.target,
            self.partial,
            self.grad_norm_out,
            sc.view("clip_scale"),
            self.max_grad_norm,
            self.gn_done,
            self.gn_barrier,
            sc.view("lr"),
            sc.view("m_scale"),
            sc.view("bc1"),
            sc.view("bc2"),
            soft.scalars.view("tau"),
            ring,
            loss,
            sc.view("step"),
            slots,
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
            *(() if apply is None else apply),
            **({"grid_barrier": grid_barrier} if apply is None else {}),
        )

    def step(self) -> None:
        """One optimiser step (capture-safe): schedule, gradient norm and clip, update."""
        self.schedule_step()
        self.clip_step()
        self.update_step()

    def state_dict(self) -> dict:
        """Host copies of the moments and the device scalars."""
        return {"m": to_numpy(self.m).copy(), "v": to_numpy(self.v).copy(), "scalars": self.scalars.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Copy into the existing buffers (same addresses: captured graphs stay valid)."""
        for k in ("m", "v"):
            a = np.asarray(state[k], dtype=np.float32)
            if a.shape != self.params.shape:
                raise ValueError(f"Adam state {k!r} has shape {a.shape}, expected {self.params.shape}")
            getattr(self, k)[...] = self.xp.asarray(a)
        self.scalars.load_state_dict(state["scalars"])


class SoftUpdate:
    """Polyak target update ``theta' = tau theta + (1 - tau) theta'`` with tau cosine-annealed on the device.

    ``tau`` goes from ``tau_start`` (first update) to ``tau_end`` after ``period`` updates:
    ``tau_c = tau_end + (tau_start - tau_end)(1 + cos(pi min(c, period) / period)) / 2``.
    """

    _RANK = 1  # the buffers' rank (StackedSoftUpdate: [P, n])

    def __init__(
        self,
        target,
        online,
        tau_start: float = _AGENT.tau_start,
        tau_end: float = _AGENT.tau_end,
        period: int = _AGENT.tau_period,
        xp=None,
    ):
        if target.shape != online.shape or target.ndim != self._RANK:
            form = "flat" if self._RANK == 1 else "[P, n]"
            raise ValueError(f"target and online must be {form} and alike, got {target.shape}, {online.shape}")
        if not (0 < tau_start <= 1 and 0 < tau_end <= 1 and period >= 1):
            raise ValueError("SoftUpdate: need tau_start, tau_end in (0, 1] and period >= 1")
        self.xp = xp if xp is not None else get_array_module(target)
        self.target, self.online = target, online
        self.tau_start, self.tau_end, self.period = float(tau_start), float(tau_end), int(period)
        spec = {"count": np.int64, "tau": np.float32}
        self.scalars = DeviceScalars(spec, self.xp) if self._RANK == 1 else MemberScalars(spec, len(target), self.xp)
        self.ops = family("optim", self.xp)

    def schedule_step(self) -> None:
        """Advance the tau schedule (one thread; reads nothing of the networks)."""
        self.ops.tau_schedule(
            self.scalars.view("count"), self.scalars.view("tau"), self.tau_start, self.tau_end, self.period
        )

    def update_step(self) -> None:
        """Move the target toward the online parameters with the current tau."""
        self.ops.soft_update(self.target, self.online, self.scalars.view("tau"))

    def step(self) -> None:
        """Advance the tau schedule and update the target (two launches, capture-safe)."""
        self.schedule_step()
        self.update_step()

    def state_dict(self) -> dict:
        """The tau schedule's counter and value."""
        return {"scalars": self.scalars.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.scalars.load_state_dict(state["scalars"])


def _schedule_columns(schedules, xp) -> dict:
    """The constants of ``schedules`` (:class:`Schedule` s) as arrays of ``optim.lr_schedule``'s by-value
    types, one element a schedule (:attr:`StackedAdam.schedule_table`)."""

    def col(field, dtype, f=lambda v: v):
        return xp.asarray(np.array([f(getattr(s, field)) for s in schedules], dtype))

    return {
        "kind": col("kind", np.int32, SCHEDULES.get),
        "lr_max": col("lr", np.float32),
        "lr_min": col("lr_min", np.float32),
        "warmup": col("warmup", np.int64),
        "period": col("period", np.int64),
        "mult": col("mult", np.int64, int),
        "restart_m_scale": col("restart_m_scale", np.float32),
    }


class StackedAdam(Adam):
    """:class:`Adam` over P members: ``params`` and ``grads`` float32 ``[P, n]`` (each member's row
    C-contiguous, the rows one stride apart: :class:`cudarl.nn.StackedQNetwork`'s ``params`` and
    ``grads``), Adam's ``m`` and ``v`` ``[P, n]``, the partials ``[P, GN_BLOCKS]``, and every device scalar
    of :attr:`scalars` ``[P]`` (a :class:`cudarl.pinned.MemberScalars`: step, lr, bias corrections, grad
    norm, clip scale per member). Each method is one launch for every member, as :class:`Adam`'s is for
    one (the kernels' ``blockIdx.y`` is the member), and member ``i`` gets the bits of an :class:`Adam` on
    its row (:meth:`member_state_dict` is that Adam's :meth:`Adam.state_dict`).

    The arguments are :class:`Adam`'s, each of ``schedule``, ``betas``, ``eps``, ``weight_decay`` and
    ``max_grad_norm`` one value for every member or a sequence of P (member ``i``'s; :attr:`schedules`,
    :attr:`constants`): on the device ``[P]`` arrays (:attr:`schedule_table`, :attr:`constant_table`) read by
    the ``_members`` kernels (``optim.lr_schedule_members``, ``grad_norm_members``, ``adam_update_members``,
    ``adam_update_soft_members``, ``clip_adam_soft_members``), each member's bits those of an :class:`Adam`
    with its values; ``decay_mask`` ``[n]`` (every member's) or ``[P, n]``; ``grad_norm_out`` float32 ``[P]``.

    :meth:`clip_update_publish` takes a :class:`StackedSoftUpdate`, a ring ``[P, 2 * slots]`` and the
    losses ``[P]``, at any P: its launcher (``optim.clip_adam_soft``) takes the one launch with a grid barrier
    where every member still gets the blocks one agent gets alone, and otherwise two launches without it
    (the norm, its last block publishing: ``optim.grad_norm_publish``; then ``optim.adam_update_soft``), the
    same bits;
    :meth:`one_launch` says which. :meth:`clip_step`, ``agent.publish`` and :meth:`update_step` are the same
    bits again in three launches.
    """

    _RANK, _FORM = 2, "[P, n]"

    @classmethod
    def from_config(cls, net, o, grad_norm_out=None, xp=None):
        """:meth:`Adam.from_config` over a :class:`cudarl.nn.StackedQNetwork`'s buffers; ``o`` one
        :class:`cudarl.config.OptimConfig` for every member or a sequence of P (member ``i``'s schedule,
        betas, eps, weight decay and clip norm from ``o[i]``)."""
        if isinstance(o, _OPTIM):
            return super().from_config(net, o, grad_norm_out, xp)
        optims = list(o)
        if len(optims) != net.params.shape[0]:
            raise ValueError(f"StackedAdam.from_config: {len(optims)} configs for {net.params.shape[0]} members")
        return cls(
            net.params,
            net.grads,
            schedule=[Schedule.from_config(c) for c in optims],
            betas=[(c.beta1, c.beta2) for c in optims],
            eps=[c.eps for c in optims],
            weight_decay=[c.weight_decay for c in optims],
            max_grad_norm=[c.max_grad_norm for c in optims],
            decay_mask=net.layout.decay_mask(),
            grad_norm_out=grad_norm_out,
            xp=xp,
        )

    def __init__(
        self,
        params,
        grads,
        *,
        schedule=Schedule(),
        betas=(_OPTIM.beta1, _OPTIM.beta2),
        eps=_OPTIM.eps,
        weight_decay=_OPTIM.weight_decay,
        max_grad_norm=_OPTIM.max_grad_norm,
        **kw,
    ):
        P = params.shape[0] if params.ndim == 2 else 1

        def each(v, scalar: bool) -> list:
            return [v] * P if scalar else list(v)

        schedules = each(schedule, isinstance(schedule, Schedule))
        pairs = each(betas, np.ndim(betas) == 1)
        cols = {
            "eps": each(eps, np.ndim(eps) == 0),
            "wd": each(weight_decay, np.ndim(weight_decay) == 0),
            "max_norm": each(max_grad_norm, np.ndim(max_grad_norm) == 0),
        }
        if any(len(c) != P for c in (pairs, *cols.values())):
            raise ValueError(f"StackedAdam: betas, eps, weight_decay and max_grad_norm: one value or {P}")
        super().__init__(
            params, grads, schedule=schedules[0], betas=pairs[0], eps=cols["eps"][0], weight_decay=cols["wd"][0],
            max_grad_norm=cols["max_norm"][0], **kw,
        )  # fmt: skip
        for b, e, w, c in zip(pairs, cols["eps"], cols["wd"], cols["max_norm"], strict=True):
            if not (0 <= b[0] < 1 and 0 <= b[1] < 1 and e > 0 and w >= 0 and c >= 0):
                raise ValueError("Adam: need betas in [0, 1), eps > 0, weight_decay >= 0, max_grad_norm >= 0")
        #: member ``i``'s ``(beta1, beta2, eps, weight_decay, max_grad_norm)``
        self.constants = tuple(
            (float(b[0]), float(b[1]), float(e), float(w), float(c))
            for b, e, w, c in zip(pairs, cols["eps"], cols["wd"], cols["max_norm"], strict=True)
        )
        #: the constants as float32 ``[P]`` device arrays (the update kernels' by-value type)
        self.constant_table = {
            k: self.xp.asarray(np.array([c[j] for c in self.constants], np.float32))
            for j, k in enumerate(("beta1", "beta2", "eps", "wd", "max_norm"))
        }
        self._set_schedules(schedules)

    def _set_schedules(self, schedules: list) -> None:
        """Member ``i``'s learning-rate schedule ``schedules[i]``: :attr:`schedules` and the device table."""
        P, xp = self.members, self.xp
        if len(schedules) != P or not all(isinstance(s, Schedule) for s in schedules):
            raise ValueError(f"StackedAdam: schedule must be one Schedule or {P}, got {len(schedules)}")
        self.schedules = tuple(schedules)
        #: the schedules' constants as ``[P]`` device arrays of ``optim.lr_schedule``'s by-value types
        self.schedule_table = _schedule_columns(schedules, xp)

    def _consts(self, *names: str) -> tuple:
        return tuple(self.constant_table[k] for k in names)

    def schedule_step(self) -> None:
        """:meth:`Adam.schedule_step` of every member with its own schedule and betas (one thread a member)."""
        sc, t = self.scalars, self.schedule_table
        self.ops.lr_schedule_members(
            *(sc.view(k) for k in ("step", "lr", "m_scale", "bc1", "bc2")),
            *(t[k] for k in ("kind", "lr_max", "lr_min", "warmup", "period", "mult", "restart_m_scale")),
            *self._consts("beta1", "beta2"),
        )

    def clip_step(self) -> None:
        """:meth:`Adam.clip_step` of every member at its own clip norm (one launch)."""
        self.ops.grad_norm_members(
            self.grads, self.partial, self.grad_norm_out, self.scalars.view("clip_scale"), *self._consts("max_norm"),
            self.gn_done,
        )  # fmt: skip

    def update_step(self, soft: SoftUpdate | None = None) -> None:
        """:meth:`Adam.update_step` of every member with its own constants (one launch)."""
        sc = self.scalars
        scalars = tuple(sc.view(k) for k in ("lr", "m_scale", "bc1", "bc2", "clip_scale"))
        consts = self._consts("beta1", "beta2", "eps", "wd")
        if soft is None:
            self.ops.adam_update_members(self.params, self.grads, self.m, self.v, self.mask, *scalars, *consts)
            return
        if soft.online is not self.params:
            raise ValueError("Adam.update_step: soft must average toward these parameters (soft.online is params)")
        self.ops.adam_update_soft_members(
            self.params, self.grads, self.m, self.v, self.mask, soft.target, *scalars, soft.scalars.view("tau"),
            *consts,
        )  # fmt: skip

    def clip_update_publish(
        self, soft: SoftUpdate, ring, loss, slots: int, grid_barrier: bool = True, apply=None
    ) -> None:
        """:meth:`Adam.clip_update_publish` of every member with its own constants, in the form
        ``optim.clip_adam_soft_one_launch`` picks (:meth:`one_launch`): one launch or two, the same bits. No
        ``apply`` (``optim.clip_adam_soft_vaccine`` is one member's launch): refused."""
        if apply is not None:
            raise ValueError("StackedAdam.clip_update_publish: no folded apply for a population (one member's launch)")
        if soft.online is not self.params:
            raise ValueError(
                "Adam.clip_update_publish: soft must average toward these parameters (soft.online is params)"
            )
        sc = self.scalars
        self.ops.clip_adam_soft_members(
            self.params, self.grads, self.m, self.v, self.mask, soft.target, self.partial, self.grad_norm_out,
            sc.view("clip_scale"), *self._consts("max_norm"), self.gn_done, self.gn_barrier, sc.view("lr"),
            sc.view("m_scale"), sc.view("bc1"), sc.view("bc2"), soft.scalars.view("tau"), ring, loss,
            sc.view("step"), slots, *self._consts("beta1", "beta2", "eps", "wd"), grid_barrier=grid_barrier,
        )  # fmt: skip

    def one_launch(self, grid_barrier: bool = True, limit: int | None = None) -> bool:
        """Whether :meth:`clip_update_publish` ``(grid_barrier=grid_barrier)`` is one launch with a grid barrier
        (True) or two without (False): the launcher's choice, ``optim.clip_adam_soft_one_launch`` of P and a
        member's parameters (``limit``: the resident grid it assumes; default the device's, NumPy none)."""
        return self.ops.clip_adam_soft_one_launch(self.members, self.params.shape[-1], grid_barrier, limit)

    def _new_scalars(self, spec: dict, xp, initial: dict):
        return MemberScalars(spec, self.params.shape[0], xp, initial=initial)

    @property
    def members(self) -> int:
        """P."""
        return self.params.shape[0]

    def member_schedule(self, i: int) -> Schedule:
        """Member ``i``'s learning-rate :class:`Schedule`."""
        return self.schedules[member_index(i, self.members)]

    def set_member_schedule(self, i: int, schedule: Schedule) -> None:
        """Member ``i``'s learning-rate schedule := ``schedule`` (a guard rollback lowers one member's rate),
        the others keep theirs: member ``i``'s entries of :attr:`schedule_table`, written in place (the
        captured graphs read them there)."""
        i = member_index(i, self.members)
        schedules = list(self.schedules)
        schedules[i] = schedule
        row = _schedule_columns([schedule], np)
        for k, col in self.schedule_table.items():
            col[i] = row[k][0]
        self.schedules = tuple(schedules)

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s state as the :meth:`Adam.state_dict` of an :class:`Adam` on its row (host copies)."""
        i = member_index(i, self.members)
        return {
            "m": to_numpy(self.m[i]).copy(),
            "v": to_numpy(self.v[i]).copy(),
            "scalars": self.scalars.member_state_dict(i),
        }

    def load_member_state_dict(self, i: int, state: dict) -> None:
        """Restore an :meth:`Adam.state_dict` (e.g. a single agent's) into member ``i``; the other members
        keep theirs (same addresses: captured graphs stay valid)."""
        i = member_index(i, self.members)
        rows = {}
        for k in ("m", "v"):
            a = np.asarray(state[k], dtype=np.float32)
            if a.shape != self.params.shape[1:]:
                raise ValueError(f"Adam state {k!r} has shape {a.shape}, expected {self.params.shape[1:]}")
            rows[k] = a
        self.scalars.load_member_state_dict(i, state["scalars"])
        for k, a in rows.items():
            getattr(self, k)[i] = self.xp.asarray(a)


class StackedSoftUpdate(SoftUpdate):
    """:class:`SoftUpdate` over P members: ``target`` and ``online`` float32 ``[P, n]`` (rows one stride
    apart), ``count`` and ``tau`` ``[P]`` (:class:`cudarl.pinned.MemberScalars`); ``tau_start``,
    ``tau_end`` and ``period`` one value for every member or a sequence of P (member ``i``'s schedule; on
    the device ``[P]`` arrays, :attr:`schedule_table`, read by ``optim.tau_schedule_members``). Each
    method is one launch for every member; member ``i`` gets the bits of a :class:`SoftUpdate` with its
    schedule on its rows (:meth:`member_state_dict` is that SoftUpdate's :meth:`SoftUpdate.state_dict`)."""

    _RANK = 2

    def __init__(
        self,
        target,
        online,
        tau_start=_AGENT.tau_start,
        tau_end=_AGENT.tau_end,
        period=_AGENT.tau_period,
        xp=None,
    ):
        P = target.shape[0] if target.ndim == 2 else 0
        cols = [list(v) if np.ndim(v) else [v] * P for v in (tau_start, tau_end, period)]
        if any(len(c) != P for c in cols):
            raise ValueError(f"StackedSoftUpdate: tau_start, tau_end and period: one value or {P}")
        super().__init__(target, online, cols[0][0], cols[1][0], cols[2][0], xp)
        for a, b, t in zip(*cols, strict=True):
            if not (0 < a <= 1 and 0 < b <= 1 and t >= 1):
                raise ValueError("SoftUpdate: need tau_start, tau_end in (0, 1] and period >= 1")
        xp = self.xp
        #: each member's schedule as ``[P]`` device arrays of ``optim.tau_schedule``'s by-value types
        self.schedule_table = {
            "tau_start": xp.asarray(np.array(cols[0], np.float32)),
            "tau_end": xp.asarray(np.array(cols[1], np.float32)),
            "period": xp.asarray(np.array(cols[2], np.int64)),
        }

    def schedule_step(self) -> None:
        """Advance every member's tau schedule, each with its own constants (one thread a member)."""
        t = self.schedule_table
        self.ops.tau_schedule_members(
            self.scalars.view("count"), self.scalars.view("tau"), t["tau_start"], t["tau_end"], t["period"]
        )

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s tau schedule as the :meth:`SoftUpdate.state_dict` of a :class:`SoftUpdate` alone."""
        return {"scalars": self.scalars.member_state_dict(i)}

    def load_member_state_dict(self, i: int, state: dict) -> None:
        """Restore a :meth:`SoftUpdate.state_dict` into member ``i`` (the others keep theirs)."""
        self.scalars.load_member_state_dict(i, state["scalars"])


def soft_update(target, online, tau) -> None:
    """``target = tau * online + (1 - tau) * target``; tau a 1-element device array."""
    family("optim", get_array_module(target)).soft_update(target, online, tau)


def shrink_perturb(theta, lam: float, sigma: float, seed: int, epoch: int, stream_id: int = 0x5B) -> None:
    """``theta = lam * theta + sigma * z``, ``z ~ N(0, 1)`` from Philox ``(seed, epoch, stream_id)``
    (Ash & Adams 2020). The trainer calls it every ``optim.shrink_every`` updates on the online network
    (:meth:`cudarl.agent.Agent.between_updates`, ``epoch`` the count of calls so far).

    Call it between replays (it is launched from the ungraphed module and refuses to run inside a
    capture), on the graphs' stream. theta: flat float32 ``[n]``, updated in place.
    """
    if not (0 <= lam <= 1 and sigma >= 0):
        raise ValueError(f"shrink_perturb: need lam in [0, 1] and sigma >= 0, got {lam}, {sigma}")
    family("optim", get_array_module(theta)).shrink_perturb(theta, lam, sigma, seed, epoch, stream_id)
