"""``StackedTradingEnv``: P members' trading environments in stacked buffers (a population's agents).

Every per-env buffer of :class:`cudarl.env.TradingEnv` gains a leading axis of ``P`` members: the state's
fields, ``reward``, ``done``, ``actions`` and ``scale`` ``[P, N]``, the state rows ``[P, N, STATE_DIM]``,
the windows ``obs [P, N, width]``, and the Philox key ``seed [P]`` (member ``i``'s ``seeds[i]``). Each
method is one launch per operation for every member (the kernels' ``blockIdx.y`` is the member;
docs/perf-notes.md "The agent axis, in stages", stage 5b), and member ``i`` gets the bits of a
:class:`TradingEnv` built with ``seed=seeds[i]`` given member ``i``'s actions, Q values and scales: its
draws are keyed by its own seed and counted by its own envs' counters, so they do not depend on ``P`` or
on its index. The market (bars, features, returns, levels, return signs) is one copy for every member.

One configuration for every member but the seed, the costs and the reward options (episode length, actions,
stagger, counterfactual and mirror rows: the kernels take them by value). Each member's cost rate
(``cost_bps`` and ``slippage_bps``) and hold cap are ``[P]`` device arrays (:attr:`rates`, :attr:`hold_caps`),
its returns (``fill``) and position levels ``[P, T]`` and ``[P, A]`` rows where members differ
(:attr:`member_data`), that ``env.step_members`` and ``env.record_step_members`` read at the member
(:data:`MEMBER_FIELDS`, ``configs``). ``config.seed`` is not read: ``seeds`` are.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from . import backend as _backend
from .env import EnvConfig, TradingEnv, _as_f32, _check_prices
from .pinned import member_index
from .reference import env as ref
from .reference.env import EnvData, EnvState, Transitions
from .reference.window import STATE_DIM

#: The :class:`EnvConfig` fields a member may set to its own value: its costs and reward options (the kernels'
#: ``[P]`` rates and hold caps, ``[P, T]`` returns and ``[P, A]`` levels).
MEMBER_FIELDS = ("cost_bps", "slippage_bps", "hold_cap", "fill", "levels")


class StackedTradingEnv(TradingEnv):
    """:class:`TradingEnv` over ``members`` members' ``config.n_envs`` envs each, in stacked buffers.

    Args:
        members: P (>= 1).
        seeds: P Philox keys (integers in ``[0, 2**64)``), member ``i``'s the ``seed`` of the env it equals.
        configs: optional P :class:`EnvConfig` s, member ``i``'s costs and reward options (the fields of
            :data:`MEMBER_FIELDS`) from ``configs[i]``; the rest must be ``config``'s (``seed`` is not read).
            Default: ``config`` for every member.
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
        configs=None,
        **kw,
    ):
        if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or int(members) < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        if not isinstance(seeds, np.ndarray) and all(type(s) is int and 0 <= s < 2**64 for s in seeds):
            seeds = np.array(seeds, np.uint64)  # exactly: np.asarray makes float64 of ints on both sides of 2**63
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
        configs = [config] * P if configs is None else list(configs)
        if len(configs) != P or not all(isinstance(c, EnvConfig) for c in configs):
            raise ValueError(f"configs: {P} EnvConfigs, one per member, got {len(configs)}")
        for i, c in enumerate(configs):
            shared = [f.name for f in fields(EnvConfig) if f.name not in (*MEMBER_FIELDS, "seed")]
            bad = [k for k in shared if getattr(c, k) != getattr(config, k)]
            if bad:
                raise ValueError(f"configs[{i}]: members differ in env.{', env.'.join(bad)} (only {MEMBER_FIELDS})")
        #: member ``i``'s :class:`EnvConfig` but its seed (its costs and reward options)
        self._member_configs = configs
        super().__init__(open, close, features, return_sign, config, **kw)
        xp = self.xp
        #: each member's :class:`cudarl.reference.env.EnvParams` (its costs and hold cap; the seed is :attr:`seed`'s)
        self.member_params = [
            self.params._replace(cost_bps=float(c.cost_bps), slippage_bps=float(c.slippage_bps), hold_cap=c.hold_cap)
            for c in configs
        ]
        #: each member's cost rate (float32) and hold cap (int32), ``[P]`` (what the ``_members`` kernels read)
        self.rates = xp.asarray(np.array([p.rate for p in self.member_params], np.float32))
        self.hold_caps = xp.asarray(np.array([p.hold_cap for p in self.member_params], np.int32))
        # each member's returns (its fill) and position levels: [P, ...] rows where members differ, else the env's
        self._ret = self.data.ret
        if any(c.fill != config.fill for c in configs):
            open_, close = _as_f32("open", open, 1), _as_f32("close", close, 1)
            for c in configs:
                px = open_ if c.fill == "open" else close
                _check_prices(c.fill, px, self.t_begin, self.t_end)
            self._ret = xp.asarray(np.stack([ref.bar_returns(open_, close, c.fill) for c in configs]))
        levels = np.stack([c.position_levels() for c in configs])
        self._levels = self.data.levels if np.all(levels == levels[:1]) else xp.asarray(levels)

    @property
    def _lead(self) -> tuple:
        return (self.members,)

    def _seeds(self, config: EnvConfig) -> np.ndarray:
        return self._member_seeds.copy()

    @property
    def seeds(self) -> np.ndarray:
        """uint64 ``[P]``: the members' Philox keys (host copies)."""
        return self._member_seeds.copy()

    @property
    def member_data(self) -> EnvData:
        """:attr:`data` with each member's returns ``ret`` (``[T]``, or ``[P, T]`` where members' fills differ)
        and ``levels`` (``[A]``, or ``[P, A]``), as the ``_members`` kernels read them."""
        return self.data._replace(ret=self._ret, levels=self._levels)

    def _data_of(self, i: int) -> EnvData:
        """Member ``i``'s :class:`EnvData` (its rows of :attr:`member_data`)."""
        d = self.member_data
        return d._replace(**{k: getattr(d, k)[i] for k in ("ret", "levels") if getattr(d, k).ndim == 2})

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
                self._data_of(i),
                self.member_params[i],
            )
        return out

    def step(self, actions=None, scale=None) -> None:
        """:meth:`TradingEnv.step` for every member, each with its cost rate (one launch: ``env.step_members``)."""
        self._ops.step_members(
            self.state, self.rows, self.reward, self.done, self._actions(actions), self._scale(scale),
            self.member_data, self.params, self.seed, self.rates, self.hold_caps,
        )  # fmt: skip
        self._gather()

    def record_step(self, out: Transitions, discount, gamma) -> Transitions:
        """:meth:`TradingEnv.record_step` for every member, each with its cost rate (one launch:
        ``env.record_step_members``)."""
        self._ops.record_step_members(
            out, discount, gamma, self.state, self.rows, self.reward, self.done, self.obs, self.actions, self.scale,
            self.member_data, self.params, self.seed, self.window, self.rates, self.hold_caps,
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
