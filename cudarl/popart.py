"""``PopArt``: the target normaliser as a small object over a device state buffer.

The math lives in ``cudarl.reference.popart`` (equations there) and ``cuda_src/popart.cu``;
this object owns the buffers and dispatches. Where it sits in a train step's targets phase
(DESIGN.md rule 8: it is called every step, and the seed system's normaliser never was)::

    C51:  y  = td_targets(r_t, discount_t, v_hat)    return-space targets, statistics before the step
          update(y)                                  the statistics move with this step's y
          r~ = normalize_rewards(r_t, discount_t)    with the updated statistics; project on r~
          (in the train step: fused into cudarl.losses.c51_targets_loss, one launch with a grid
          barrier, or two with run.grid_barrier = false; cudarl.losses.c51_targets takes ``state`` too)
    IQN:  r~ = update_normalize_rewards(r_t, r_t, discount_t)   (one launch); quantile targets on r~

``rescale(W, b)`` keeps a value-producing last layer's denormalised output across an update: the
quantile heads rescale their ``head.out`` (online and target) with every statistics update.

The categorical (C51) head outputs logits over fixed atoms, not values, so there is no affine last
layer to rescale, and no change of logits moves a distribution's atoms by an affine map. For C51 the
statistics therefore move only during a warm-up (``agent.popart_warmup`` updates) and are then
frozen (:meth:`PopArt.freeze`: ``beta = 0``, which leaves every statistic's bits as they are): from
then on atom ``z_k`` always means the return ``s z_k + mu``, so the learned distribution's meaning
cannot drift (docs/guide.md).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from . import backend as _backend
from .backend import family, is_numpy
from .config import AgentConfig as _AGENT
from .pinned import DeviceScalars, MemberScalars, member_index
from .reference import popart as _ref


def _numpy_out(out, values):
    """NumPy: the twin's new array, or copied into ``out`` when one is given (as the GPU writes it)."""
    if out is None:
        return values
    out[...] = values
    return out


def targets_loss_kwargs(popart) -> dict:
    """The PopArt keyword arguments of :func:`cudarl.losses.c51_targets_loss` for ``popart`` (a
    :class:`PopArt` or a :class:`StackedPopArt`: its state, its ``beta`` slot, its sigma floor); ``{}`` for
    None (the loss without PopArt)."""
    if popart is None:
        return {}
    return dict(popart_state=popart.state, popart_beta=popart.scalars.view("beta"), sigma_min=popart.sigma_min)


class PopArt:
    """Running mean/std of return-space TD targets, fitted to a value support.

    Args:
        beta: EMA step size of the statistics (a device scalar; :meth:`set_beta` moves it).
        scale: support units per standard deviation of return (see :meth:`for_support`).
        sigma_min: floor on sigma.
        xp: ``numpy`` or ``cupy`` (default: the process backend).

    Attributes:
        state: float32 ``[8]`` (``mu, sigma, mu_prev, sigma_prev, m1, m2, decay, scale``) on the device.
    """

    def __init__(self, beta: float = _AGENT.popart_beta, scale: float = 1.0, sigma_min: float = 1e-4, xp=None):
        if not 0 < beta <= 1:
            raise ValueError(f"beta must be in (0, 1], got {beta}")
        if not sigma_min > 0:
            raise ValueError(f"sigma_min must be > 0, got {sigma_min}")
        self.xp = xp if xp is not None else _backend.get().xp
        self.sigma_min = float(sigma_min)
        self.state = self.xp.asarray(_ref.init_state(scale))
        self.scalars = DeviceScalars({"beta": np.float32}, self.xp, initial={"beta": beta})
        self.gpu = not is_numpy(self.xp)
        self.ops = family("popart", self.xp)  # the twins return new arrays, the launchers write ``out``

    @classmethod
    def for_support(cls, support, n_sigma: float = 3.0, **kw) -> PopArt:
        """A PopArt whose ``n_sigma`` standard deviations of return span half the support."""
        z = np.asarray(_backend.to_numpy(support), np.float64)
        return cls(scale=float(z[-1] - z[0]) / 2 / n_sigma, **kw)

    def set_beta(self, beta: float, stream=None) -> None:
        """Move the step size between replays (not inside a capture), ordered on ``stream``."""
        self.scalars.set("beta", beta, stream=stream)

    def freeze(self, stream=None) -> None:
        """Stop the statistics: ``beta = 0`` from the next update on (an update with ``beta = 0`` keeps
        every statistic's bits, and the rescale is then the identity)."""
        self.set_beta(0.0, stream)

    @property
    def frozen(self) -> bool:
        """Whether :meth:`freeze` holds (a device read: between replays, not inside a capture)."""
        return float(self.scalars.get("beta")) == 0.0

    def _twin_beta(self):
        """The step size as the NumPy twin takes it (one value)."""
        return self.scalars.view("beta")[0]

    # -- ops ----------------------------------------------------------------------------------
    def update(self, y) -> None:
        """Move the statistics with return-space targets ``y`` float32 ``[B]``."""
        if self.gpu:
            self.ops.update(y, self.state, self.scalars.view("beta"), self.sigma_min)
        else:
            self.state[:] = self.ops.update(y, self.state, self._twin_beta(), self.sigma_min)

    def update_normalize_rewards(self, y, r_t, discount_t, out=None):
        """:meth:`update` with ``y [B]``, then :meth:`normalize_rewards` with the updated statistics,
        in one launch on the GPU (``y`` may be ``r_t``; ``out`` is a buffer of its own)."""
        if not self.gpu:
            state, r_norm = self.ops.update_normalize_rewards(
                y, r_t, discount_t, self.state, self._twin_beta(), self.sigma_min
            )
            self.state[:] = state
            return _numpy_out(out, r_norm)
        out = out if out is not None else self.xp.empty_like(r_t)
        self.ops.update_normalize_rewards(
            y, r_t, discount_t, self.state, self.scalars.view("beta"), out, self.sigma_min
        )
        return out

    def rescale(self, W, b) -> None:
        """Rescale a last layer ``W [n_in, n_out]``, ``b [n_out]`` (:class:`cudarl.nn.Linear`'s layout) in
        place so its denormalised output is what it was before the last update."""
        if self.gpu:
            self.ops.rescale(W, b, self.state)
        else:
            W[:], b[:] = self.ops.rescale(W, b, self.state)

    def normalize(self, x, out=None, inverse: bool = False):
        """``(x - mu) / s`` (or ``s x + mu``); writes ``out`` on the GPU."""
        if not self.gpu:
            return _numpy_out(out, self.ops.normalize(x, self.state, inverse))
        out = out if out is not None else self.xp.empty_like(x)
        self.ops.normalize(x, self.state, out, inverse)
        return out

    def denormalize(self, x, out=None):
        """``s x + mu``: values back in return units (:meth:`normalize` inverted)."""
        return self.normalize(x, out, inverse=True)

    def normalize_rewards(self, r_t, discount_t, out=None):
        """``(r - (1 - d) mu) / s``: rewards for targets in the normalised coordinate."""
        if not self.gpu:
            return _numpy_out(out, self.ops.normalize_rewards(r_t, discount_t, self.state))
        out = out if out is not None else self.xp.empty_like(r_t)
        self.ops.normalize_rewards(r_t, discount_t, self.state, out)
        return out

    def td_targets(self, r_t, discount_t, v_hat, out=None):
        """``r + d (s v_hat + mu)``: return-space targets from normalised next values."""
        if not self.gpu:
            return _numpy_out(out, self.ops.td_targets(r_t, discount_t, v_hat, self.state))
        out = out if out is not None else self.xp.empty_like(r_t)
        self.ops.td_targets(r_t, discount_t, v_hat, self.state, out)
        return out

    # -- host side ----------------------------------------------------------------------------
    def statistics(self) -> tuple[float, float]:
        """``(mu, sigma)`` (a synchronising read: for logs and tests, never inside a capture)."""
        st = _backend.to_numpy(self.state)
        return float(st[_ref.MU]), float(st[_ref.SIGMA])

    def state_dict(self) -> dict:
        """The statistics, the step size and the sigma floor."""
        return {
            "state": np.array(_backend.to_numpy(self.state)),
            "beta": float(self.scalars.get("beta")),
            "sigma_min": self.sigma_min,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` into the existing device state."""
        st = np.asarray(sd["state"], np.float32)
        if st.shape != (_ref.STATE_SIZE,):
            raise ValueError(f"PopArt state must have shape ({_ref.STATE_SIZE},), got {st.shape}")
        self.state[...] = self.xp.asarray(st)
        self.set_beta(sd["beta"])
        self.sigma_min = float(sd["sigma_min"])


class StackedPopArt(PopArt):
    """:class:`PopArt` for P members (a population's agents), each with its own statistics: ``state``
    float32 ``[P, 8]`` (row ``i`` member ``i``'s, C-contiguous) and ``beta`` a :class:`cudarl.pinned.MemberScalars`
    ``[P]``. Each method is one launch for every member, as :class:`PopArt`'s is for one (the kernels'
    ``blockIdx.y`` is the member), over the member-axis forms of its arrays (``[P, B]`` targets and
    rewards, a stacked last layer ``W [P, n_in, n_out]``, ``b [P, n_out]``; ``cudarl/ops/popart.py``), and
    member ``i`` gets the bits of a :class:`PopArt` with member ``i``'s settings on its rows.

    Args:
        members: P.
        beta: the step size, one for every member or ``[P]``.
        scale: support units per standard deviation, one or ``[P]``.
        sigma_min: one floor for every member (the kernels take it by value).
        xp: ``numpy`` or ``cupy`` (default: the process backend).
    """

    def __init__(self, members: int, beta=_AGENT.popart_beta, scale=1.0, sigma_min: float = 1e-4, xp=None):
        P = int(members)
        betas = np.broadcast_to(np.asarray(beta, np.float64), (P,))
        scales = np.broadcast_to(np.asarray(scale, np.float64), (P,))
        if P < 1 or not np.all((betas > 0) & (betas <= 1)):
            raise ValueError(f"StackedPopArt: at least one member and every beta in (0, 1], got {P} and {beta}")
        if not sigma_min > 0:
            raise ValueError(f"sigma_min must be > 0, got {sigma_min}")
        self.xp = xp if xp is not None else _backend.get().xp
        self.sigma_min = float(sigma_min)
        self.state = self.xp.asarray(np.stack([_ref.init_state(float(s)) for s in scales]))
        self.scalars = MemberScalars({"beta": np.float32}, P, self.xp, initial={"beta": betas})
        self.gpu = not is_numpy(self.xp)
        self.ops = family("popart", self.xp)

    @property
    def members(self) -> int:
        """P."""
        return self.state.shape[0]

    def _twin_beta(self):
        return self.scalars.view("beta")  # [P]: the twins take it per member

    def set_beta(self, beta, stream=None) -> None:
        """Move the step sizes (one for every member, or ``[P]``) between replays, on ``stream``."""
        if stream is not None and self.gpu:
            with stream:
                self.scalars.set("beta", beta)
            return
        self.scalars.set("beta", beta)

    def freeze_members(self, members, stream=None) -> None:
        """:meth:`PopArt.freeze` of the members ``members`` only (``beta = 0`` for each; the others keep
        theirs), between replays, on ``stream``."""
        with stream if stream is not None and self.gpu else nullcontext():
            for i in members:
                self.scalars.set_member("beta", i, 0.0)

    def frozen_members(self) -> list[bool]:
        """Whether each member's statistics are frozen (a device read: between replays)."""
        return [bool(b == 0.0) for b in self.scalars.get("beta")]

    @property
    def frozen(self) -> bool:
        """Whether every member's statistics are frozen (a device read: between replays)."""
        return bool(np.all(self.scalars.get("beta") == 0.0))

    def statistics(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mu [P], sigma [P])`` (a synchronising read: for logs and tests, never inside a capture)."""
        st = _backend.to_numpy(self.state)
        return st[:, _ref.MU].astype(np.float64), st[:, _ref.SIGMA].astype(np.float64)

    def state_dict(self) -> dict:
        """The statistics ``[P, 8]``, the step sizes ``[P]`` and the sigma floor."""
        return {
            "state": np.array(_backend.to_numpy(self.state)),
            "beta": self.scalars.get("beta").astype(np.float64),
            "sigma_min": self.sigma_min,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` into the existing device state."""
        st = np.asarray(sd["state"], np.float32)
        if st.shape != self.state.shape:
            raise ValueError(f"StackedPopArt state must have shape {tuple(self.state.shape)}, got {st.shape}")
        self.state[...] = self.xp.asarray(st)
        self.scalars.set("beta", sd["beta"])
        self.sigma_min = float(sd["sigma_min"])

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s as the :meth:`PopArt.state_dict` of a :class:`PopArt` with its settings."""
        sd = self.state_dict()
        return {"state": sd["state"][i].copy(), "beta": float(sd["beta"][i]), "sigma_min": self.sigma_min}

    def load_member_state_dict(self, i: int, sd: dict) -> None:
        """Restore a :meth:`PopArt.state_dict` (e.g. a single agent's) into member ``i``; the others keep
        theirs. Its ``sigma_min`` must be the members' (one floor for every member: the kernels take it by
        value)."""
        i = member_index(i, self.members)
        st = np.asarray(sd["state"], np.float32)
        if st.shape != (_ref.STATE_SIZE,):
            raise ValueError(f"PopArt state must have shape ({_ref.STATE_SIZE},), got {st.shape}")
        if float(sd["sigma_min"]) != self.sigma_min:
            raise ValueError(f"PopArt sigma_min {float(sd['sigma_min'])} is not the members' {self.sigma_min}")
        self.scalars.set_member("beta", i, sd["beta"])
        self.state[i] = self.xp.asarray(st)
