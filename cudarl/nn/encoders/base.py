"""What the windowed encoders share: the embedding, the pre-norm residual stream, psi, the
ordered parameter-gradient reductions, and the buffers of the one-bar acting path.

A :class:`SequenceEncoder` maps a window ``x [B, W, F]`` (or its flattened ``[B, W F]``) to
``psi [B, d_model]``:

    h_0 = x W_embed + b_embed                      (a Linear over the B W bars)
    h_{l+1} = block_l(h_l)                         (the subclass: SSM or attention blocks)
    psi = RMSNorm(h_L[:, W - 1])                   (seq.last_rmsnorm_forward)

It keeps the conventions of :mod:`cudarl.nn.layers` (the MLP encoder's): ``declare(layout, ws_spec)``,
``bind(P, G, xp)``, ``forward(x, ws) -> psi`` (the view ``ws[<out_name>.out]``), and ``backward(x, ws, dx)``
with dL/dpsi expected in ``ws[<out_name>.dout]``; it overwrites its parameter gradients.

The residual stream's gradient lives in the ``dout`` buffers of the Linear layers whose outputs are added
to it (their identity backward leaves ``dout`` as it is): the gradient w.r.t. ``h + f(h)`` is the ``dout``
of f's last Linear, and a pre-norm's backward adds its own part to it while writing the ``dout`` of the
Linear below (``seq.rmsnorm_backward``'s ``dres``). That last Linear adds the residual itself (built with
``residual_rows``, ``forward(x, ws, residual=h, out=ws[<block>.h])``): where its forward is a cuBLASLt GEMM,
``h`` is the GEMM's C operand and the block's output is written once (no ``seq.residual_add``, no re-read of the
branch); either way its own ``.out`` buffer is not written (its identity backward needs no value of it).

Acting (:meth:`SequenceEncoder.new_state` and ``step``) runs one bar at a time over a state the
subclass keeps (SSM: the conv and scan states; attention: a key/value cache). The one-bar Linears are
second :class:`~cudarl.nn.layers.Linear` objects of the same names bound to the same parameters, with
one row per environment.
"""

from __future__ import annotations

import numpy as np

from ...backend import family
from ...reference.seq import n_parts
from ..layers import Linear, Module, SplitLinear, param_names
from ..params import ParamLayout, Workspace

#: RMSNorm's epsilon in every encoder norm (Mamba2's and most pre-norm transformers' value).
EPS = 1e-5


class Standalone:
    """An encoder with parameters of its own (tests, benchmarks and the PyTorch twin's check; inside an
    agent the network's one flat buffer holds them): ``layout``, flat ``params`` and ``grads`` with
    their views ``P`` and ``G``, and :meth:`workspace`.

    ``noise`` adds ``noise * N(0, 1)`` (NumPy, seeded) to the initial parameters, so norms and biases are
    away from 1 and 0 in gradient checks."""

    def __init__(self, enc, xp=np, dtype=np.float32, seed: int = 0, noise: float = 0.0, params=None):
        self.enc, self.xp, self.dtype = enc, xp, np.dtype(dtype)
        self.layout, self._spec = ParamLayout(), []
        enc.declare(self.layout, self._spec)
        if params is None:
            params = self.layout.init_host(seed, np.float64)
            params += noise * np.random.default_rng(seed).standard_normal(params.shape)
        self.params = xp.asarray(np.array(params, dtype=self.dtype))  # a copy of its own
        self.grads = xp.zeros_like(self.params)
        self.P, self.G = self.layout.views(self.params), self.layout.views(self.grads)
        enc.bind(self.P, self.G, xp)

    def workspace(self, max_batch: int, batch: int | None = None) -> Workspace:
        """A workspace for batches up to ``max_batch`` (its batch set to ``batch``, default ``max_batch``)."""
        ws = Workspace(self.xp, self.dtype, max_batch)
        for name, row, merge in self._spec:
            ws.add(name, row, merge=merge)
        for lin in self.enc.linears:
            lin.prepare(max_batch)
        ws.set_batch(max_batch if batch is None else batch)
        return ws


class ActState:
    """The acting path's buffers for ``n_envs`` environments: ``bufs`` (persistent per-environment
    state, e.g. scan states or a key/value cache, zero after :meth:`SequenceEncoder.reset_state`) and
    ``ws`` (one bar's activations)."""

    def __init__(self, n_envs: int, bufs: dict, ws: Workspace):
        self.n_envs, self.bufs, self.ws = int(n_envs), bufs, ws


class SequenceEncoder(Module):
    """Base of the windowed encoders (module docstring). Subclasses define ``_declare_blocks``,
    ``_blocks_forward``, ``_blocks_backward``, ``_state_spec`` and ``_blocks_step``.

    Args:
        name: prefix of every parameter and buffer.
        n_features: F, features per bar.
        window: W, bars per observation.
        d_model: width of the residual stream and of psi.
        layers: number of blocks.
        tf32, gemm: passed to every Linear (:class:`cudarl.nn.layers.Linear`).
    """

    def __init__(self, name: str, n_features: int, *, window: int, d_model: int, layers: int, tf32: bool, gemm: str):
        if min(n_features, window, d_model, layers) < 1:
            raise ValueError(f"{name}: n_features, window, d_model and layers must be >= 1")
        self.name, self.F, self.W, self.d, self.L = name, int(n_features), int(window), int(d_model), int(layers)
        self.tf32, self.gemm = tf32, gemm
        self.n_in, self.n_out = self.W * self.F, self.d
        self.embed = self.linear(f"{name}.embed", self.F, self.d)
        self.children: list[Module] = [self.embed]
        self.steps: dict[str, Linear] = {}  # the one-bar twins of the Linears, made by bind
        self.seq = self.xp = None  # the seq kernel family and the array module, set by bind

    # --- construction --------------------------------------------------------------------------------
    def linear(
        self,
        name: str,
        n_in: int,
        n_out: int,
        act: str = "identity",
        rows: int | None = None,
        head: int | None = None,
        residual_rows: int | None = None,
    ) -> Linear:
        """A Linear over the window's bars (``rows`` = W per sample unless given); with ``head``, a
        :class:`SplitLinear` whose first ``head`` columns are computed at each sample's last bar only; with
        ``residual_rows``, one whose forward adds the residual stream (``residual_rows`` rows of it for each
        output row: :class:`cudarl.nn.layers.Linear`), in its cuBLASLt GEMM where the forward is one."""
        kw = {"tf32": self.tf32, "rows": self.W if rows is None else rows, "gemm": self.gemm}
        if head is not None:
            return SplitLinear(name, n_in, n_out, head=head, **kw)  # a projection: no activation
        return Linear(name, n_in, n_out, act=act, residual_rows=residual_rows, **kw)

    def chain_linears(self) -> tuple:
        """None of its layers chain (:meth:`cudarl.nn.layers.MLP.chain_linears`): () ."""
        return ()

    #: No layer reads the whole input row (the embedding reads a bar at a time): an input gate is not folded
    #: into a weight (:attr:`cudarl.nn.encoders.Encoder.gate_linear`).
    gate_linear = None

    @property
    def out_name(self) -> str:
        return f"{self.name}.norm_f"

    @property
    def linears(self) -> list[Linear]:
        return [c for c in self.children if isinstance(c, Linear)]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.embed.declare(layout, ws_spec)
        self._declare_blocks(layout, ws_spec)
        layout.add(f"{self.out_name}.weight", (self.d,), ("const", 1.0))
        ws_spec += [
            (f"{self.out_name}.out", (self.d,), False),
            (f"{self.out_name}.dout", (self.d,), False),
            (f"{self.out_name}.rstd", (), False),
            # partial rows of the ordered parameter-gradient sums, reused by every reduction in turn
            (f"{self.name}.part", (self._part_row(),), False),
        ]

    def _part_row(self) -> int:
        """Per-sample length of the partials scratch: the largest ``parts x width`` any reduction asks,
        divided by the batch (``n_parts(B W) <= B W``)."""
        return self.W * max(self._widths())

    def _widths(self) -> list[int]:
        return [self.d]

    def bind(self, P: dict, G: dict, xp) -> None:
        super().bind(P, G, xp)
        self.seq = family("seq", xp)
        self._bind_families(xp)
        for lin in self.linears:
            res = None if lin.residual_rows is None else 1  # one bar: the stream has one row an environment
            one = self.linear(lin.name, lin.n_in, lin.n_out, act=_act_name(lin), rows=1, residual_rows=res)
            one.bind(P, G, xp)
            self.steps[lin.name] = one

    def _bind_families(self, xp) -> None:
        """Subclasses fetch their own kernel families here (:func:`cudarl.backend.family`)."""

    # --- helpers -------------------------------------------------------------------------------------
    def part(self, ws: Workspace, parts: int, width: int):
        """The partials scratch as ``[parts, width]`` (contiguous)."""
        return ws.bufs[f"{self.name}.part"].reshape(-1)[: parts * width].reshape(parts, width)

    def norm_forward(self, x, wname: str, out, rstd) -> None:
        self.seq.rmsnorm_forward(x, self.P[wname], out, rstd, EPS)

    def norm_backward(self, dout, x, wname: str, rstd, dres, dx, ws: Workspace) -> None:
        """``dx = dres + RMSNorm'(x)^T dout`` and the weight's gradient (two ordered stages)."""
        part = self.part(ws, n_parts(x.shape[0]), x.shape[1])
        self.seq.rmsnorm_backward(dout, x, self.P[wname], rstd, dres, dx, part)
        self.seq.colsum(part, self.G[wname])

    def flat(self, x, B: int):
        """The input as ``[B W, F]`` (a view)."""
        if x.shape not in ((B, self.W, self.F), (B, self.n_in)) or not x.flags.c_contiguous:
            raise ValueError(
                f"{self.name}: input must be C-contiguous [B, {self.W}, {self.F}] or [B, {self.n_in}], got {x.shape}"
            )
        return x.reshape(B * self.W, self.F)

    # --- forward and backward ------------------------------------------------------------------------
    def forward(self, x, ws: Workspace):
        """x ``[B, W, F]`` or ``[B, W F]`` -> psi ``[B, d_model]`` (``ws[<out_name>.out]``)."""
        B = ws.batch
        h = self.embed.forward(self.flat(x, B), ws)
        h = self._blocks_forward(h, ws, B)
        psi = ws.rows(f"{self.out_name}.out", B)
        w = self.P[f"{self.out_name}.weight"]
        # h_L [B, W', d]: W' = W, or 1 where the top block computes the last bar only
        self.seq.last_rmsnorm_forward(h.reshape(B, -1, self.d), w, psi, ws.rows(f"{self.out_name}.rstd", B), EPS)
        return psi

    def backward(self, x, ws: Workspace, dx=None) -> None:
        """Overwrite this encoder's parameter gradients from dL/dpsi in ``ws[<out_name>.dout]`` (the last
        forward on ``ws``); ``dx`` optional ``[B, W, F]`` or ``[B, W F]``."""
        B = ws.batch
        self._final_norm_backward(ws, B)
        self._blocks_backward(ws, B)
        self.embed.backward(self.flat(x, B), ws, None if dx is None else dx.reshape(B * self.W, self.F))

    @property
    def last_layer(self) -> tuple:
        """The parameters of the last layer, the one psi comes out of: the last block's output projection
        (:meth:`last_linear`) and the final RMSNorm's weight (contiguous in the layout: declared last)."""
        lin, _ = self.last_linear(None, 0)
        return (*param_names([lin]), f"{self.out_name}.weight")

    #: None: the final norm's weight gradient is written on the calling stream (:meth:`_final_norm_backward`),
    #: so no branch holds every :attr:`last_layer` gradient (:attr:`cudarl.nn.encoders.Encoder.last_layer_branch`)
    last_layer_branch = None

    def backward_last(self, x, ws: Workspace) -> None:
        """:meth:`backward` of :attr:`last_layer` only: the final norm's backward, then the last block's
        output projection's weight and bias gradients, and stop (no dx of that projection, nothing of
        the blocks below; their gradients are left as they are)."""
        B = ws.batch
        self._final_norm_backward(ws, B)
        lin, inp = self.last_linear(ws, B)
        lin.backward(inp, ws, None)

    def _final_norm_backward(self, ws: Workspace, B: int) -> None:
        """psi = RMSNorm(h_L[:, W - 1]): the norm weight's gradient, and dL/dh_L into :meth:`top_dout`."""
        wname = f"{self.out_name}.weight"
        top = ws.rows(self.top_dout(), B)  # dL/dh_L: the residual gradient at the top
        part = self.part(ws, n_parts(B), self.d)
        self.seq.last_rmsnorm_backward(
            ws.rows(f"{self.out_name}.dout", B),
            self.top_h(ws, B).reshape(B, -1, self.d),
            self.P[wname],
            ws.rows(f"{self.out_name}.rstd", B),
            top.reshape(B, -1, self.d),
            part,
        )
        self.seq.colsum(part, self.G[wname])

    # --- acting --------------------------------------------------------------------------------------
    def new_state(self, n_envs: int) -> ActState:
        """The acting buffers for ``n_envs`` environments, zeroed (call after :meth:`bind`)."""
        spec: list = []
        for lin in self.steps.values():
            lin.declare(ParamLayout(), spec)  # the buffers only: the parameters are the window Linears'
            lin.prepare(n_envs)
        spec += [(f"{self.out_name}.out", (self.d,), False), (f"{self.out_name}.rstd", (), False)]
        bufs_spec = self._state_spec(spec)
        ws = Workspace(self.xp, self.P[f"{self.out_name}.weight"].dtype, n_envs)
        for name, row, merge in spec:
            ws.add(name, row, merge=merge)
        ws.set_batch(n_envs)
        bufs = {k: self.xp.zeros((n_envs,) + tuple(shape), dtype=dt) for k, (shape, dt) in bufs_spec.items()}
        return ActState(n_envs, bufs, ws)

    def reset_state(self, state: ActState) -> None:
        """Zero every environment's state (a new episode for all): whole-word fills, capture-safe."""
        util = family("util", self.xp)
        for buf in state.bufs.values():
            util.fill_u32(buf.reshape(-1).view(np.uint32), 0)

    def step(self, state: ActState, x_t):
        """One bar for every environment: x_t ``[n_envs, F]`` -> psi ``[n_envs, d_model]``, advancing ``state``."""
        ws = state.ws
        h = self.steps[self.embed.name].forward(x_t, ws)
        h = self._blocks_step(state, h, ws)
        psi = ws.rows(f"{self.out_name}.out")
        w = self.P[f"{self.out_name}.weight"]
        self.seq.last_rmsnorm_forward(h.reshape(state.n_envs, 1, self.d), w, psi, ws.rows(f"{self.out_name}.rstd"), EPS)
        return psi

    # --- for subclasses ------------------------------------------------------------------------------
    def top_dout(self) -> str:
        """Name of the buffer holding dL/dh_L (the dout of the last block's last Linear)."""
        raise NotImplementedError

    def top_h(self, ws: Workspace, B: int):
        """h_L ``[B W', d]`` (W' = 1 where the top block computes the last bar only)."""
        raise NotImplementedError

    def last_linear(self, ws: Workspace | None, B: int):
        """``(the last block's output projection, its input [B W, n_in] in ws)``: the Linear whose output
        the residual stream's top adds (its dout is :meth:`top_dout`); the input is None without ``ws``."""
        raise NotImplementedError


def _act_name(lin: Linear) -> str:
    from ...reference.nn import ACTS

    return {v: k for k, v in ACTS.items()}[lin.act]
