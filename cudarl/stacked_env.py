"""``StackedTradingEnv``: P members' trading environments in stacked buffers (a population's agents).

Every per-env buffer of :class:`cudarl.env.TradingEnv` gains a leading axis of ``P`` members: the state's
fields, ``reward``, ``done``, ``actions`` and ``scale`` ``[P, N]``, the state rows ``[P, N, STATE_DIM]``,
the windows ``obs [P, N, width]``, and the Philox key ``seed [P]`` (member ``i``'s ``seeds[i]``). Each
method is one launch per operation for every member (the kernels' ``blockIdx.y`` is the member;
docs/perf-notes.md "The agent axis, in stages", stage 5b), and member ``i`` gets the bits of a
:class:`TradingEnv` built with ``seed=seeds[i]`` given member ``i``'s actions, Q values and scales: its
draws are keyed by its own seed and counted by its own envs' counters, so they do not depend on ``P`` or
on its index. The market (bars, features, returns, levels, return signs) is one copy for every member.

One configuration for every member but the seed and the costs (episode length, actions and levels, hold
cap, stagger, counterfactual and mirror rows: the kernels take them by value). Each member's cost rate
(``cost_bps`` and ``slippage_bps``: ``costs``) is a float32 ``[P]`` device array, :attr:`rates`, that
``env.step_members`` and ``env.record_step_members`` read at the member. ``config.seed`` is not read:
``seeds`` are.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import backend as _backend
from .env import EnvConfig, TradingEnv
from .pinned import member_index
from .reference.env import EnvState, Transitions
from .reference.window import STATE_DIM


class StackedTradingEnv(TradingEnv):
    """:class:`TradingEnv` over ``members`` members' ``config.n_envs`` envs each, in stacked buffers.

    Args:
        members: P (>= 1).
        seeds: P Philox keys (integers in ``[0, 2**64)``), member ``i``'s the ``seed`` of the env it equals.
        costs: optional P pairs ``(cost_bps, slippage_bps)``, member ``i``'s (default: ``config``'s for every
            member).
        The other arguments are :class:`TradingEnv`'s (one value for every member; ``config`` by default
        ``EnvConfig()``).

    The methods are :class:`TradingEnv`'s with a leading member axis on every per-env array: :meth:`act`
    takes ``q [P, N, A]`` and ``epsilon [P]``; :meth:`record_step` writes ``Transitions`` of ``[P, M, ...]``
    arrays (:meth:`make_transitions`) and ``discount [P, M]`` with ``gamma [P]``; :meth:`record` (the
    unfused oracle) is one launch per member.
    """

    def __init__(
        self,
        members: int,
        open,
        close,
        features,
        return_sign,
        config: EnvConfig | None = None,
        *,
        seeds,
        costs=None,
        **kw,
    ):
        if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or int(members) < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        seeds = np.asarray(seeds)
        if (
            seeds.shape != (int(members),)
            or seeds.dtype.kind not in "iu"
            or np.any(seeds < 0)
            or any(int(s) >= 2**64 for s in seeds)
        ):
            raise ValueError(f"seeds: expected {int(members)} integers in [0, 2**64), got {seeds!r}")
        self.members = P = int(members)
        self._member_seeds = seeds.astype(np.uint64)
        config = EnvConfig() if config is None else config
        costs = [(config.cost_bps, config.slippage_bps)] * P if costs is None else [tuple(c) for c in costs]
        if len(costs) != P or any(len(c) != 2 for c in costs):
            raise ValueError(f"costs: {P} pairs (cost_bps, slippage_bps), one per member, got {costs!r}")
        #: member ``i``'s :class:`EnvConfig` but its seed (its costs); each validated as an env's
        self._member_configs = [replace(config, cost_bps=c, slippage_bps=sl) for c, sl in costs]
        super().__init__(open, close, features, return_sign, config, **kw)
        #: each member's :class:`cudarl.reference.env.EnvParams` (its costs; the seed is :attr:`seed`'s)
        self.member_params = [
            self.params._replace(cost_bps=float(c.cost_bps), slippage_bps=float(c.slippage_bps))
            for c in self._member_configs
        ]
        #: each member's cost rate, float32 ``[P]`` (:attr:`EnvParams.rate`, what the kernels read)
        self.rates = self.xp.asarray(np.array([p.rate for p in self.member_params], np.float32))

    @property
    def _lead(self) -> tuple:
        return (self.members,)

    def _seeds(self, config: EnvConfig) -> np.ndarray:
        return self._member_seeds.copy()

    @property
    def seeds(self) -> np.ndarray:
        """uint64 ``[P]``: the members' Philox keys (host copies)."""
        return self._member_seeds.copy()

    def member_config(self, i: int) -> EnvConfig:
        """The :class:`EnvConfig` of the :class:`TradingEnv` member ``i`` equals (its own seed and costs)."""
        i = self._member(i)
        return replace(self._member_configs[i], seed=int(self._member_seeds[i]))

    def record(self, out: Transitions, actions=None, scale=None) -> Transitions:
        """:meth:`TradingEnv.record` for every member: ``out`` of ``[P, M, ...]`` arrays (one launch a member,
        with its costs: ``record`` is the unfused oracle of :meth:`record_step`, which is one launch for all)."""
        actions, scale = self._actions(actions), self._scale(scale)
        for i in range(self.members):
            self._ops.record(
                Transitions(*(f[i] for f in out)),
                EnvState(*(f[i] for f in self.state)),
                actions[i],
                scale[i],
                self.data,
                self.member_params[i],
            )
        return out

    def step(self, actions=None, scale=None) -> None:
        """:meth:`TradingEnv.step` for every member, each with its cost rate (one launch: ``env.step_members``)."""
        self._ops.step_members(
            self.state, self.rows, self.reward, self.done, self._actions(actions), self._scale(scale), self.data,
            self.params, self.seed, self.rates,
        )  # fmt: skip
        self._gather()

    def record_step(self, out: Transitions, discount, gamma) -> Transitions:
        """:meth:`TradingEnv.record_step` for every member, each with its cost rate (one launch:
        ``env.record_step_members``)."""
        self._ops.record_step_members(
            out, discount, gamma, self.state, self.rows, self.reward, self.done, self.obs, self.actions, self.scale,
            self.data, self.params, self.seed, self.window, self.rates,
        )  # fmt: skip
        return out

    def make_transitions(self) -> Transitions:
        """A :class:`Transitions` of ``[P, rows_per_step * N, ...]`` arrays for :meth:`record_step` (allocate
        before any capture)."""
        xp, lead = self.xp, (self.members, self.rows_per_step * self.n_envs)
        return Transitions(
            xp.zeros((*lead, STATE_DIM), np.float32),
            xp.zeros(lead, np.int32),
            xp.zeros(lead, np.float32),
            xp.zeros((*lead, STATE_DIM), np.float32),
            xp.zeros(lead, np.float32),
        )

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """:meth:`TradingEnv.state_dict` with a leading member axis on every entry (``[P, N]``, rows
        ``[P, N, 4]``), and ``seeds`` uint64 ``[P]`` for the compatibility check."""
        return {**super().state_dict(), "seeds": self.seeds}

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` (its ``seeds`` must be this env's) into the existing buffers."""
        seeds = np.asarray(sd.get("seeds", []))
        if seeds.shape != (self.members,) or not np.array_equal(seeds.astype(np.uint64), self._member_seeds):
            raise ValueError(f"env state seeds {seeds.tolist()} are not this env's {self._member_seeds.tolist()}")
        super().load_state_dict({k: v for k, v in sd.items() if k != "seeds"})

    def _member(self, i) -> int:
        return member_index(i, self.members)

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s state as the :meth:`TradingEnv.state_dict` of the env it equals (host copies)."""
        i = self._member(i)
        return {k: _backend.to_numpy(v[i]).copy() for k, v in self._state_buffers().items()}

    def load_member_state_dict(self, i: int, sd: dict) -> None:
        """Restore a :meth:`TradingEnv.state_dict` (e.g. a single env's) into member ``i``; the others keep
        theirs (their windows are gathered again from their rows, the same bits). Member ``i`` keeps its own
        Philox key ``seeds[i]``."""
        i = self._member(i)
        self._load_state({k: v[i] for k, v in self._state_buffers().items()}, sd)
