"""What the built-in auxiliary signals share: :class:`AuxBase` (the protocol's defaults) and
:class:`ExtraBackward` (a backward of the online net of a signal's own, kept out of the step's gradient
until the signal recombines it)."""

from __future__ import annotations

import numpy as np

from ..backend import family, is_numpy, to_numpy
from ..config import ConfigError


class AuxBase:
    """Defaults of :class:`cudarl.auxiliary.AuxSignal`: no head, no phases, no state. A subclass sets
    :attr:`name` and overrides what it uses; :meth:`allocate` keeps the buffers as :attr:`buf`."""

    name = ""

    def __init__(self, cfg):
        self.cfg = cfg
        self.buf = None

    def make_head(self, d: int):
        return None

    def make_input_gate(self, n_in: int):
        return None

    def allocate(self, buffers) -> None:
        self.buf, self.xp = buffers, buffers.xp
        self.numpy = is_numpy(buffers.xp)

    def phases(self) -> list:
        return []

    def grad_phases(self) -> list:
        return []

    def update_phases(self) -> list:
        return []

    def observable(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"aux.{self.name} has no state to load, got {sorted(state)}")

    def need(self, ok: bool, msg: str) -> None:
        """A :class:`cudarl.config.ConfigError` naming the signal unless ``ok``."""
        if not ok:
            raise ConfigError(f"agent.aux: {self.name}: {msg}")


def read(state) -> np.ndarray:
    """A host copy of a small device state vector (an observable: outside any capture)."""
    return np.asarray(to_numpy(state), np.float64)


class ExtraBackward:
    """A second backward of ``online`` in the same step. :meth:`QNetwork.backward` overwrites the flat
    gradient, so :meth:`save` copies the step's gradient into :attr:`saved` first; :meth:`run` then
    runs the backward over a workspace and joins the layers' weight-gradient branches (the agent's
    :meth:`cudarl.agent.Agent.backward` does the same), leaving that backward's gradient in
    ``online.grads``; :meth:`add_saved` puts the step's gradient back on top of it."""

    def __init__(self, online, xp):
        self.online = online
        self.saved = xp.zeros_like(online.grads)
        self.copy_ops, self.util = family("auxgrad", xp), family("util", xp)

    def save(self) -> None:
        self.copy_ops.copy(self.saved, self.online.grads)

    def run(self, x, ws, rows: int) -> None:
        ws.set_batch(rows)
        self.online.backward(x, ws)
        sides = {id(lin.side): lin.side for lin in self.online.linears.values() if lin.side is not None}
        for side in sides.values():
            side.join()

    def add_saved(self) -> None:
        g = self.online.grads
        self.util.add_f32(g, g, self.saved)
