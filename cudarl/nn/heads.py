"""Heads over the state embedding ``psi [B, D]``: dueling C51, IQN, QR-DQN, and the plan head.

Each head follows the layer conventions of :mod:`cudarl.nn.layers`: the loss writes the
gradient of the head's output into the buffer named by :meth:`grad_name`, and
``backward(psi, ws, dpsi, accumulate)`` overwrites the head's parameter gradients and writes
(or adds into) ``dpsi``. A distributional head (:class:`Head`) also says its output's shape, so
:class:`cudarl.nn.QNetwork` needs no branch per head; which head a run builds is its rule's choice
(``make_head`` of the :class:`cudarl.rules.HeadRule` registered under ``net.head``).
"""

from __future__ import annotations

from ..config import NetConfig as _NET
from .layers import Linear, Module
from .params import ParamLayout, Workspace


class Head(Module):
    """A distributional head: ``forward(psi, ws, raw=False)`` gives the output :meth:`output_shape`
    describes, whose gradient the loss writes into ``ws[grad_name]``. Only a head with a raw output
    (C51's ``va``, before the dueling combine) accepts ``raw=True``; the others raise."""

    n_actions: int
    #: Whether ``backward(..., accumulate=True)`` adds its dL/dpsi into ``dpsi`` (IQN's mixing kernel
    #: overwrites it: False there and in the two-head C51 + IQN head, whose backward runs it first).
    accumulates_dpsi: bool = True
    #: The head's first layer where it is one Linear on psi that :meth:`forward_from` finishes from (the
    #: encoder's chain then runs it too, ``net.gemm = "chain"``), else None.
    chain_linear: Linear | None = None

    def forward_from(self, out, ws: Workspace, raw: bool = False):
        """``forward``'s result from :attr:`chain_linear`'s output ``out`` (written by the chain)."""
        raise NotImplementedError(f"{type(self).__name__} has no chain_linear")

    def backward_to(self, ws: Workspace, B: int, raw: bool = False) -> None:
        """``backward``'s part above :attr:`chain_linear` over ``B`` samples: dL/d(its output) into its
        ``dout``, from the head's output gradient (the network's dx chain then runs the rest)."""
        raise NotImplementedError(f"{type(self).__name__} has no chain_linear")

    def output_shape(self, B: int) -> tuple:
        """The shape of ``forward``'s output for ``B`` samples."""
        raise NotImplementedError

    def raw_grad_name(self) -> str:
        raise ValueError(f"{self.name}: {type(self).__name__} has no raw output (only the C51 head has one)")

    def _no_raw(self, raw: bool) -> None:
        if raw:
            self.raw_grad_name()


class C51Head(Head):
    """Dueling C51 (Bellemare et al. 2017; Wang et al. 2016): logits ``[B, A, atoms]``.

    One GEMM gives the value stream ``V [B, atoms]`` and the advantage stream
    ``Adv [B, A, atoms]`` (``va [B, (1 + A) atoms]``), combined per atom as
    ``logits = V + Adv - mean_a Adv``. Softmax over atoms is the loss's business.
    """

    def __init__(
        self, name: str, d: int, n_actions: int, atoms: int = _NET.atoms, tf32: bool = _NET.tf32, gemm: str = _NET.gemm
    ):
        self.name, self.d, self.n_actions, self.atoms = name, int(d), int(n_actions), int(atoms)
        self.va = Linear(f"{name}.va", d, (1 + n_actions) * atoms, act="identity", init="xavier", tf32=tf32, gemm=gemm)
        self.children = [self.va]
        self.chain_linear = self.va

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.va.declare(layout, ws_spec)
        shape = (self.n_actions, self.atoms)
        ws_spec += [(f"{self.name}.logits", shape, False), (f"{self.name}.dlogits", shape, False)]

    def output_shape(self, B: int) -> tuple:
        return (B, self.n_actions, self.atoms)

    @property
    def grad_name(self) -> str:
        return f"{self.name}.dlogits"

    def forward(self, psi, ws: Workspace, raw: bool = False):
        """Logits ``[B, A, atoms]``; with ``raw`` the head's output before the dueling combine,
        ``va [B, (1 + A) atoms]`` (for a loss that combines it itself: losses.c51_targets_loss)."""
        return self.forward_from(self.va.forward(psi, ws), ws, raw)

    def forward_from(self, va, ws: Workspace, raw: bool = False):
        """:meth:`forward` from the head's raw output ``va`` ``[B, (1 + A) atoms]``, already written."""
        return va if raw else self.logits_of(va, ws)

    def logits_of(self, va, ws: Workspace):
        """The dueling combine of a raw output ``va [B, (1 + A) atoms]`` into the workspace's logits
        ``[B, A, atoms]`` (returned)."""
        logits = ws.rows(f"{self.name}.logits", va.shape[0])
        self.ops.dueling_forward(va, logits)
        return logits

    def raw_grad_name(self) -> str:
        """The buffer of dL/dva ``[B, (1 + A) atoms]`` a ``raw`` backward starts from."""
        return f"{self.va.name}.dout"

    def backward(self, psi, ws: Workspace, dpsi=None, accumulate: bool = False, raw: bool = False) -> None:
        """From dL/dlogits in :attr:`grad_name`, or with ``raw`` from dL/dva in :meth:`raw_grad_name`."""
        self.backward_to(ws, psi.shape[0], raw)
        self.va.backward(psi, ws, dpsi, accumulate)

    def backward_to(self, ws: Workspace, B: int, raw: bool = False) -> None:
        """dL/dva into :meth:`raw_grad_name`: the dueling backward of dL/dlogits, or with ``raw`` nothing (the
        loss wrote dL/dva there)."""
        if not raw:
            self.ops.dueling_backward(ws.rows(self.grad_name, B), ws.rows(self.raw_grad_name(), B))


class IQNHead(Head):
    """Implicit quantile network head (Dabney et al. 2018): quantile values ``[B, N, A]``.

    ``cos[b, n, i] = cos(pi i tau[b, n])`` (i = 0..n_cos-1), ``phi = relu(cos W_phi + b_phi)``
    ``[B*N, D]``, ``h = psi[b] * phi[b, n]``, ``q = h W_out + b_out`` ``[B*N, A]``. ``tau`` is
    input (not differentiated): write it into ``ws[<name>.tau]`` ``[B, N]`` (e.g. with
    :meth:`sample_tau`) or pass it to :meth:`forward`.
    """

    def __init__(
        self,
        name: str,
        d: int,
        n_actions: int,
        n_quantiles: int = _NET.n_quantiles,
        n_cos: int = _NET.n_cos,
        tf32: bool = _NET.tf32,
        gemm: str = _NET.gemm,
    ):
        self.name, self.d, self.n_actions = name, int(d), int(n_actions)
        self.n_quantiles, self.n_cos = int(n_quantiles), int(n_cos)
        N = self.n_quantiles
        self.phi = Linear(f"{name}.phi", n_cos, d, act="relu", init="he", rows=N, tf32=tf32, gemm=gemm)
        self.out = Linear(f"{name}.out", d, n_actions, act="identity", init="xavier", rows=N, tf32=tf32, gemm=gemm)
        self.children = [self.phi, self.out]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.phi.declare(layout, ws_spec)
        self.out.declare(layout, ws_spec)
        N = self.n_quantiles
        ws_spec += [
            (f"{self.name}.tau", (N,), False),
            (f"{self.name}.cos", (N, self.n_cos), True),
            (f"{self.name}.h", (N, self.d), True),
            (f"{self.name}.dh", (N, self.d), True),
        ]

    @property
    def grad_name(self) -> str:
        return f"{self.out.name}.dout"

    def output_shape(self, B: int) -> tuple:
        return (B, self.n_quantiles, self.n_actions)

    def sample_tau(self, ws: Workspace, B: int, counter, seed: int, stream_id: int = 0x1A):
        """Draw ``tau [B, N]`` from Philox ``(seed, counter[0], stream_id)`` into the workspace."""
        tau = ws.rows(f"{self.name}.tau", B)
        self.ops.iqn_sample_tau(tau, counter, seed, stream_id)
        return tau

    def forward(self, psi, ws: Workspace, tau=None, raw: bool = False):
        self._no_raw(raw)
        B, N = psi.shape[0], self.n_quantiles
        if tau is None:
            tau = ws.rows(f"{self.name}.tau", B)
        elif tau.shape != (B, N):
            raise ValueError(f"{self.name}: tau must be [{B}, {N}], got {tau.shape}")
        cos = ws.rows(f"{self.name}.cos", B)
        self.ops.iqn_cos_embed(tau, cos)
        phi = self.phi.forward(cos, ws)
        h = ws.rows(f"{self.name}.h", B)
        self.ops.iqn_mix_forward(psi, phi, h)
        q = self.out.forward(h, ws)
        return q.reshape(B, N, self.n_actions)

    accumulates_dpsi = False

    def backward(self, psi, ws: Workspace, dpsi=None, accumulate: bool = False, raw: bool = False) -> None:
        self._no_raw(raw)
        if dpsi is None or accumulate:
            raise ValueError(f"{self.name}: IQN backward overwrites dpsi; give it a buffer and run it first")
        B = psi.shape[0]
        h, dh = ws.rows(f"{self.name}.h", B), ws.rows(f"{self.name}.dh", B)
        self.out.backward(h, ws, dh)
        phi = ws.rows(f"{self.phi.name}.out", B)
        self.ops.iqn_mix_backward(dh, psi, phi, dpsi, ws.rows(f"{self.phi.name}.dout", B))
        self.phi.backward(ws.rows(f"{self.name}.cos", B), ws, None)


class QRHead(Head):
    """QR-DQN's head (Dabney, Rowland, Bellemare & Munos 2018): ``N`` quantile values of each action at
    fixed midpoints ``tau_i = (2 i + 1) / (2 N)``, one linear layer ``q = psi W + b`` ``[B, N * A]``
    read as ``[B, N, A]`` (the IQN head's layout, so the quantile losses and act kernels serve both)."""

    def __init__(
        self,
        name: str,
        d: int,
        n_actions: int,
        n_quantiles: int = _NET.n_quantiles,
        tf32: bool = _NET.tf32,
        gemm: str = _NET.gemm,
    ):
        self.name, self.d, self.n_actions, self.n_quantiles = name, int(d), int(n_actions), int(n_quantiles)
        self.out = Linear(f"{name}.out", d, self.n_quantiles * self.n_actions, act="identity", tf32=tf32, gemm=gemm)
        self.children = [self.out]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.out.declare(layout, ws_spec)

    @property
    def grad_name(self) -> str:
        return f"{self.out.name}.dout"

    def output_shape(self, B: int) -> tuple:
        return (B, self.n_quantiles, self.n_actions)

    def forward(self, psi, ws: Workspace, raw: bool = False):
        self._no_raw(raw)
        return self.out.forward(psi, ws).reshape(self.output_shape(psi.shape[0]))

    def backward(self, psi, ws: Workspace, dpsi=None, accumulate: bool = False, raw: bool = False) -> None:
        self._no_raw(raw)
        self.out.backward(psi, ws, dpsi, accumulate)


class PlanHead(Module):
    """Conviction and readiness, both sigmoid outputs in [0, 1]: ``plan [B, 2]`` (``net.plan``; its
    loss is :func:`cudarl.reference.nn.plan_loss`, wired by :mod:`cudarl.plan`).

    ``scale(ws)`` is the readiness gate: conviction where readiness >= 0.5, else exactly 1.
    At initialisation the weights are Xavier times ``gain=0.01`` and the readiness bias is
    ``-4`` (readiness ~ 0.018), so the gate starts closed and conviction cannot shrink rewards
    before the head has learned (the seed's bug: every reward times ~0.1 at init).

    The head reads ``psi`` but does not train the encoder (its backward leaves ``dpsi`` alone): with
    its gradient in the encoder the network learned which training states happened to have positive
    returns, and on a random walk the gate opened for 30-45% of the batch (CPU, 600 updates); as a
    probe of the Q-network's representation it stayed shut there and opened on the leakage canary.
    """

    THRESHOLD = 0.5
    writes_dpsi = False  # a probe of psi: its backward leaves dpsi alone

    def __init__(
        self,
        name: str,
        d: int,
        gain: float = 0.01,
        readiness_bias: float = -4.0,
        tf32: bool = _NET.tf32,
        gemm: str = _NET.gemm,
    ):
        self.name, self.d = name, int(d)
        self.lin = Linear(
            f"{name}.lin",
            d,
            2,
            act="sigmoid",
            init="xavier",
            gain=gain,
            bias_init=(0.0, readiness_bias),
            tf32=tf32,
            gemm=gemm,
        )  # sigmoid: never the fused GEMM
        self.children = [self.lin]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.lin.declare(layout, ws_spec)
        ws_spec += [(f"{self.name}.scale", (), False)]

    @property
    def grad_name(self) -> str:
        return f"{self.lin.name}.dout"

    def forward(self, psi, ws: Workspace):
        return self.lin.forward(psi, ws)

    def scale(self, ws: Workspace, B: int | None = None, out=None):
        """The gate of the last forward over ``ws``: float32 ``[B]`` into ``out`` (default
        ``ws[<name>.scale]``, e.g. a :class:`cudarl.TradingEnv`'s ``scale``); returns it."""
        B = ws.batch if B is None else B
        out = ws.rows(f"{self.name}.scale", B) if out is None else out
        self.ops.plan_gate(ws.rows(f"{self.lin.name}.out", B), out, self.THRESHOLD)
        return out

    def backward(self, psi, ws: Workspace, dpsi=None, accumulate: bool = True) -> None:
        """Its own parameters' gradients; ``dpsi`` is not touched (see the class docstring)."""
        self.lin.backward(psi, ws, None)
