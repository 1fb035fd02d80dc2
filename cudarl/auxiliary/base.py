"""What the built-in auxiliary signals share: :class:`AuxBase` (the protocol's defaults),
:class:`OwnBackward` (a backward of the online net of a signal's own, into a gradient buffer of its own,
which runs beside the step's backward: causal intervention's and Gradient Vaccine's), :class:`SubBatch`
(the rows ``agent.aux_batch`` gives the denoise and causal passes), and :class:`SgdSpan` /
:class:`AuxSgd` (the signals' own plain-SGD steps, every span in one launch: risk's head, denoise's
encoder and decoder)."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any, NamedTuple

import numpy as np

from ..backend import family, is_numpy, to_numpy
from ..config import ConfigError
from ..graph import SideStream
from ..reference.auxsgd import MAX_SPANS


class AuxBase:
    """Defaults of :class:`cudarl.auxiliary.AuxSignal`: no head, no phases, no state. A subclass sets
    :attr:`name` and overrides what it uses; :meth:`allocate` keeps the buffers as :attr:`buf`."""

    name = ""
    reads_q_stats = False

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

    def early_phases(self) -> list:
        return []

    def phases(self) -> list:
        return []

    def grad_phases(self) -> list:
        return []

    def sgd_spans(self) -> list:
        return []

    def beside_extras_backward(self) -> None:
        return None

    def extras_dpsi(self):
        return None

    def grad_span(self):
        return None

    def grad_branches(self) -> list:
        return []

    def first_after_backward(self, first: bool) -> None:
        return None

    def adam_apply(self):
        return None

    def grad_addend(self):
        return None

    def takes_addend(self, addend) -> bool:
        return False

    def beside_backward(self) -> None:
        return None

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


def sub_batch_net(cfg):
    """The :class:`cudarl.config.NetConfig` of a pass over the sub-batch (``agent.aux_rows`` rows: denoise's,
    causal's): ``cfg.net`` with ``net.gemm = agent.aux_gemm`` unless that is ``"net"`` (the GEMM choice is the
    only difference, so the layers and their parameters are the network's)."""
    gemm = cfg.agent.aux_gemm
    return cfg.net if gemm == "net" else dataclasses.replace(cfg.net, gemm=gemm)


def read(state) -> np.ndarray:
    """A host copy of a small device state vector (an observable: outside any capture)."""
    return np.asarray(to_numpy(state), np.float64)


class OwnBackward:
    """A second backward of ``online`` in the same step that writes a gradient buffer of its own,
    :attr:`grads` (through :attr:`net`, ``online.twin()``: the same parameters, its own gradient views),
    never the flat gradient the step's backward writes: it can run on a branch beside that backward.
    :meth:`run` runs it over a workspace of one of ``online``'s forwards, its layers' weight gradients on
    branches of their own (:attr:`sides`, joined before it returns), and :meth:`add_into` adds it to the
    step's gradient: ``grads[i] = grads[i] + own[i]`` (one launch; IEEE addition is commutative, so this is
    bit for bit the backward on the flat gradient plus the saved step's gradient, as causal's grad phase
    once computed it).

    ``rows``: the largest batch :meth:`run` is given (its cuBLASLt plans are made here, before any
    capture). ``branches``: ``"layer"``, a side stream per layer for the weight gradients (beside each other
    and the dx chain), or ``"one"``, one side stream for all of them (a backward of a few small layers:
    one cuBLAS workspace instead of one a layer). ``net``: the twin's :class:`cudarl.config.NetConfig` where
    its GEMM choices differ from ``online``'s (:func:`sub_batch_net`; None: ``online``'s). Hazards: :meth:`run`
    reads ``online``'s parameters (and spectral state) and the workspace's forward, and writes only :attr:`grads`
    and the workspace's gradient rows; nothing may write those parameters (an optimiser step) before it is
    joined."""

    def __init__(self, online, xp, rows: int, branches: str = "layer", net=None):
        self.net = online.twin(net)
        self.grads = self.net.grads
        self.net.prepare_backward(rows)
        if branches not in ("layer", "one"):
            raise ValueError(f'OwnBackward: branches "layer" or "one", got {branches!r}')
        n = len(self.net.linears) if branches == "layer" else 1
        self.sides = [SideStream(xp) for _ in range(n)]
        self.net.set_side_stream(self.sides if branches == "layer" else self.sides[0])
        self.util = family("util", xp)

    def run(self, x, ws, rows: int, last_layer: bool = False, heads: str = "all") -> None:
        """The backward over ``rows`` of ``ws`` (a workspace of the online net's forward of ``x``) into
        :attr:`grads`, on the current stream and :attr:`sides`, joined back into it (``last_layer``: the
        encoder's stops after its last layer; ``heads``: which heads' part reaches psi;
        :meth:`cudarl.nn.QNetwork.backward`; the other entries of :attr:`grads` are left as they were)."""
        ws.set_batch(rows)
        self.net.backward(x, ws, last_layer=last_layer, heads=heads)
        for side in self.sides:
            side.join()

    def add_into(self, grads) -> None:
        """``grads += grads of this backward`` (the step's flat gradient, ``online.grads``)."""
        self.util.add_f32(grads, grads, self.grads)


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


class AdamApply(NamedTuple):
    """A signal's elementwise correction of the flat gradient that the optimiser's one launch applies as it reads
    the gradient (:meth:`cudarl.auxiliary.AuxSignal.adam_apply`; ``optim.clip_adam_soft_vaccine``'s arguments after
    Adam's own, in this order): Gradient Vaccine's ``f = g + plus`` on ``[0, stop)`` (``stop`` 0: ``plus`` not
    read), then ``f + c (f - aux)`` on ``[lo, hi)`` with ``c = state[2]``. ``plus``, ``aux``: float32 ``[n]`` in
    the flat layout; ``state``: vaccine's float32 state."""

    plus: Any
    aux: Any
    state: Any
    lo: int
    hi: int
    stop: int


class GradAddend(NamedTuple):
    """A signal's own gradient that its one grad phase would add onto the flat gradient
    (:meth:`cudarl.auxiliary.AuxSignal.grad_addend`): ``grads`` (float32 ``[n]``, the flat layout), ``side``
    (the :class:`cudarl.graph.SideStream` that writes it: join it first) and ``stop``, where its nonzero
    entries end (every entry at and after it is zero, never written: the extra heads', which the pass never
    runs), so that adding it over ``[0, stop)`` is adding it everywhere (a zero's sign aside)."""

    grads: Any
    side: SideStream
    stop: int


class SgdSpan(NamedTuple):
    """A span of parameters a signal steps by plain SGD of its own (:meth:`cudarl.auxiliary.AuxSignal.sgd_spans`):
    ``params`` and ``grads`` (float32 ``[n]`` contiguous views, apart from every other span's), the rate
    ``lr``, whether the step then clears ``grads`` (``clear``), and ``after``, the branch (a
    :class:`cudarl.graph.SideStream`) that writes ``grads`` and must be joined first, or None (the main
    stream's backward wrote them)."""

    params: Any
    grads: Any
    lr: float
    clear: bool = True
    after: SideStream | None = None


class AuxSgd:
    """The agent's ``aux_sgd`` phase: every signal's :class:`SgdSpan` stepped by ``p -= lr g`` (then
    ``g = 0`` where ``clear``) in one ``auxsgd.steps`` launch (up to
    :data:`cudarl.reference.auxsgd.MAX_SPANS` spans a launch, more take more), after joining each span's
    branch. Where a launch a signal ran back to back on the main stream before Adam (risk's head,
    denoise's encoder and decoder: three graph nodes on the MLP step's chain, issue 19), one: the same
    arithmetic on every element, so the same bits. Built before any capture; :meth:`step` allocates and
    reads nothing on the host (the span table goes to the kernel by value)."""

    def __init__(self, spans, xp, side=None, after=()):
        self.spans = list(spans)
        self.sides = list({id(s.after): s.after for s in self.spans if s.after is not None}.values())
        self.after = list(after)  # waited for, not joined: their owners still join them (SideStream.wait)
        self._table = [(s.params, s.grads, s.lr, s.clear) for s in self.spans]
        self.ops = family("auxsgd", xp)
        #: A :class:`cudarl.graph.SideStream` the steps run on (forked where :meth:`step` is called, joined by
        #: :meth:`join`, the agent's Adam phase), beside the last grad phases, which touch only a span of the
        #: flat gradient no SGD span lies in (AuxSignal.grad_span); None: on the current stream. ``after``: more
        #: branches the steps wait for (those grad phases' own, which may read the parameters the steps move)
        self.side = side

    def step(self) -> None:
        with self.side.fork() if self.side is not None else nullcontext():
            for side in self.sides:  # the branches that wrote the spans' gradients
                side.join()
            for side in self.after:
                side.wait()
            for i in range(0, len(self._table), MAX_SPANS):
                self.ops.steps(self._table[i : i + MAX_SPANS])

    def join(self) -> None:
        """The current stream waits for the steps (a no-op without :attr:`side`)."""
        if self.side is not None:
            self.side.join()
