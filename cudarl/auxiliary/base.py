"""What the built-in auxiliary signals share: :class:`AuxBase` (the protocol's defaults),
:class:`ExtraBackward` (a backward of the online net of a signal's own, kept out of the step's gradient
until the signal recombines it) and :class:`SubBatch` (the rows ``agent.aux_batch`` gives the denoise and
causal passes)."""

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

    def run(self, x, ws, rows: int, last_layer: bool = False) -> None:
        """The backward over ``rows`` of ``ws`` (``last_layer``: the encoder's stops after its last layer,
        :meth:`cudarl.nn.QNetwork.backward`)."""
        ws.set_batch(rows)
        self.online.backward(x, ws, last_layer=last_layer)
        sides = {id(lin.side): lin.side for lin in self.online.linears.values() if lin.side is not None}
        for side in sides.values():
            side.join()

    def add_saved(self) -> None:
        g = self.online.grads
        self.util.add_f32(g, g, self.saved)


class SubBatch:
    """The sub-batch a signal's own pass runs over: :attr:`rows` (``agent.aux_rows``, R) of the batch's B
    rows, spread evenly over it (row ``r`` is batch row ``floor(r B / R)``,
    :func:`cudarl.reference.auxgrad.spread`; ``agent.aux_batch`` says why spread and not the first rows).

    :meth:`of` takes a fixed ``[B, ...]`` float32 buffer of the step (the batch's observations, ``q_s``,
    IQN's taus) before any capture and gives its sub-batch: the buffer itself when R == B (no copy, so
    ``aux_batch = 1`` runs the pass exactly as over the whole batch), else a ``[R, ...]`` buffer of its
    own that :meth:`gather` fills, one ``auxgrad.spread_rows`` launch per buffer, inside the pass."""

    def __init__(self, cfg, xp):
        self.B, self.rows, self.xp = int(cfg.agent.batch_size), int(cfg.agent.aux_rows), xp
        self.whole = self.rows == self.B
        self._pairs: list = []
        self.ops = family("auxgrad", xp)

    def of(self, src):
        """The sub-batch of ``src [B, ...]``: ``src`` when R == B, else a new ``[R, ...]`` buffer."""
        if src.shape[0] != self.B or src.dtype != np.float32 or not src.flags.c_contiguous:
            raise ValueError(
                f"SubBatch.of: a C-contiguous float32 [{self.B}, ...] buffer, got {src.dtype} {tuple(src.shape)}"
            )
        if self.whole:
            return src
        dst = self.xp.zeros((self.rows, *src.shape[1:]), np.float32)
        self._pairs.append((src.reshape(self.B, -1), dst.reshape(self.rows, -1)))
        return dst

    def gather(self) -> None:
        """Copy the sub-batch rows of every buffer :meth:`of` was given (none when R == B)."""
        for src, dst in self._pairs:
            self.ops.spread_rows(dst, src)
