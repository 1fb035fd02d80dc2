"""``QNetwork``: an encoder + a distributional head (+ extra heads on psi) over one flat buffer."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from ..backend import family, is_numpy, to_numpy
from ..config import NetConfig
from ..graph import SideStream
from ..reference.nn import IDENTITY, RELU
from .encoders import ENCODERS
from .heads import PlanHead
from .layers import GEMM_ALGOS, Linear, copy_addend
from .params import ParamLayout, Workspace


def _walk(mods):
    for m in mods:
        yield m
        yield from _walk(getattr(m, "children", ()))


def head_module(net: NetConfig, d: int, n_actions: int):
    """The head ``net.head`` builds: its rule's choice (:meth:`cudarl.rules.HeadRule.make_head`), so a
    head is registered once, with its rule, in :data:`cudarl.rules.HEAD_RULES`."""
    from ..rules import HEAD_RULES  # the rules sit above the networks; they name their head module

    return HEAD_RULES[net.head].make_head("head", d, n_actions, net)


def _modules(n_in: int, n_actions: int, net: NetConfig, extra_heads, input_gate) -> tuple:
    """(input gate or None, encoder, head, {name: extra head on psi}) of a :class:`QNetwork`, unbound."""
    gate = input_gate(n_in) if input_gate is not None else None
    encoder = ENCODERS[net.encoder]("enc", n_in, net)
    d = encoder.n_out
    head = head_module(net, d, n_actions)
    extras = {name: m for name, make in (extra_heads or {}).items() if (m := make(d)) is not None}
    if net.plan:
        extras["plan"] = PlanHead("plan", d, tf32=net.tf32, gemm=net.gemm)
    return gate, encoder, head, extras


def _in_order(gate, encoder, head, extras) -> list:
    """The modules of :func:`_modules` in forward (and layout) order."""
    return [*([gate] if gate is not None else []), encoder, head, *extras.values()]


def _declare(modules) -> tuple:
    """(the parameter layout, the workspace spec) the modules declare, in order."""
    layout, ws_spec = ParamLayout(), []
    for m in modules:
        m.declare(layout, ws_spec)
    return layout, ws_spec


def param_layout(n_in: int, n_actions: int, net: NetConfig, *, extra_heads=None, input_gate=None) -> ParamLayout:
    """The :class:`ParamLayout` of ``QNetwork(n_in, n_actions, net, extra_heads=..., input_gate=...)``
    without making the network: nothing is allocated and no backend is needed (a policy file's
    weights are checked against it before the device is up)."""
    return _declare(_in_order(*_modules(int(n_in), int(n_actions), net, extra_heads, input_gate)))[0]


def forward_plan_keys(
    n_in: int, n_actions: int, net: NetConfig, batch: int, *, extra_heads=None, input_gate=None
) -> list:
    """The :func:`cudarl.blas.plan_key` of every cuBLASLt plan ``QNetwork(n_in, n_actions, net, ...)
    .new_workspace(batch)`` makes, without making the network (for :func:`cudarl.blas.warm_plans` before
    the device is up)."""
    mods = _in_order(*_modules(int(n_in), int(n_actions), net, extra_heads, input_gate))
    return [
        key
        for lin in _walk(mods)
        if isinstance(lin, Linear)
        for key in configure_linear(lin, net).forward_plan_keys(batch)
    ]


def chain_of(encoder, head, net: NetConfig, xp, gated: bool = False) -> tuple:
    """The Linears ``net.gemm = "chain"`` runs as one launch on the GPU: the encoder's
    (:meth:`Encoder.chain_linears`), then the head's first (:attr:`Head.chain_linear`) where the encoder's
    chain reaches psi; () under any other ``gemm``, with an input gate (``gated``), on the NumPy backend, or
    where a layer is spectrally normalised, TF32, has rows per sample or an activation but identity and ReLU
    (the chain's epilogues). One function for :class:`QNetwork` and its population form
    (:class:`cudarl.nn.StackedQNetwork`), so both chain the same layers."""
    if net.gemm != "chain" or gated or is_numpy(xp):
        return ()
    lins = encoder.chain_linears()
    if lins and head.chain_linear is not None:
        lins = (*lins, head.chain_linear)
    acts = (IDENTITY, RELU)  # the chain's epilogues
    plain = all(
        not (lin.spectral or lin.tf32) and lin.rows == 1 and lin.residual_rows is None and lin.act in acts
        for lin in lins
    )
    return tuple(lins) if plain else ()


def chain_backward_operands(lins: tuple, head, ws, weight) -> tuple | None:
    """``(d, steps)`` of the dx chain (``gemm.chain_backward``) after a forward that ran the chain ``lins``
    (:func:`chain_of`) through the head's first layer: ``d`` that layer's dz (its ``dout`` rows, where it has
    no activation), ``steps`` from it down, each ``(weight(top), the layer below's out rows, its dout rows,
    its act)``; ``weight(lin)`` the layer's weight (one network's, or a population's stacked ones). None where
    the forward did not chain (``ws.chained``) or not through the head's layer, or that layer has an
    activation. One rule for :class:`QNetwork` and :class:`cudarl.nn.StackedQNetwork`."""
    if not ws.chained or lins[-1] is not head.chain_linear or lins[-1].act != IDENTITY:
        return None
    steps = [
        (weight(top), ws.rows(f"{below.name}.out"), ws.rows(f"{below.name}.dout"), below.act)
        for top, below in zip(lins[:0:-1], lins[-2::-1], strict=True)
    ]  # from the head's layer down: its weight, then the mask and dz of the layer below
    return ws.rows(f"{lins[-1].name}.dout"), steps


def configure_linear(lin: Linear, net: NetConfig) -> Linear:
    """``lin`` with the GEMM choices of ``net`` that every linear layer takes, whichever module built it (an
    auxiliary head's too): ``net.gemm`` (a twin's may differ from its network's: ``agent.aux_gemm``),
    ``net.dw_gemm`` and ``net.gemm_algo``."""
    lin.set_gemm(net.gemm)
    lin.dw_gemm = net.dw_gemm
    lin.lt_algo = GEMM_ALGOS[net.gemm_algo]
    return lin


class QNetwork:
    """Encoder ``[B, n_in] -> psi [B, D]``, then the head, and any extra heads on ``psi``.

    Args:
        n_in: input features (the flattened window, ``window * features``).
        n_actions: actions.
        net: the :class:`cudarl.config.NetConfig` (``encoder``, ``head`` and their sizes, ``plan``,
            ``tf32``, ``gemm``, ``dw_gemm``); keyword ``fields`` override it
            (``QNetwork(8, 3, hidden=(6,), head="iqn")``), so every default is the configuration's.
            ``net.plan`` adds the plan head (conviction, readiness ``[B, 2]``) as the extra head ``"plan"``.
        extra_heads: ``{name: make(d) -> module or None}``, more heads on ``psi [B, d]`` (an auxiliary
            signal's, :class:`cudarl.auxiliary.AuxSignal`): their outputs are ``forward()[name]``, their
            gradients ``grad_outputs()[name]``, and :meth:`backward` adds their dL/dpsi to the head's.
        input_gate: ``make(n_in) -> module or None``, a module on the input before the encoder (the
            selectivity signal's gate, :class:`cudarl.auxiliary.selectivity.InputGate`): ``forward(x, ws)``
            returns the encoder's input, ``backward(x, ws)`` reads the encoder's input gradient from
            ``ws[sel.dx]``. Available as :attr:`gate` (None without). Where the encoder declares a first layer
            over the whole input row (:attr:`Encoder.gate_linear <cudarl.nn.encoders.Encoder.gate_linear>`: the
            MLP's) without spectral norm, the gate is folded into that layer's weight instead
            (``gate.fold_into``; :attr:`folded`, :meth:`forward` says when the fold runs).
        ``net.spectral`` names linear layers to spectrally normalise (e.g. ``("enc.1",)``).
        xp, dtype: backend and float type (float64 only on NumPy, for gradient checks).
        max_batch: rows of the default workspace :attr:`ws` (``None``: no default workspace, ``ws`` is None).
        seed: Philox seed of the initialisation.
        params_of: None, or a network of the same layout whose :attr:`params` this one uses (the same
            buffer, not a copy) with a gradient buffer of its own: what :meth:`twin` makes.

    ``net.gemm`` is one of :data:`cudarl.nn.layers.GEMMS` (docs/config.md), GPU only; each new
    workspace makes the cuBLASLt plans of its ``max_batch`` before any capture. ``net.dw_gemm`` (one of
    :data:`cudarl.nn.layers.DW_GEMMS`) is every layer's weight-gradient GEMM; :meth:`prepare_backward`
    makes the plans a backward needs.

    Buffers: :attr:`params` and :attr:`grads`, flat ``[layout.padded_size]``; :attr:`P` and
    :attr:`G` their named views (see :mod:`cudarl.nn.params` for the layout).
    """

    def __init__(
        self,
        n_in: int,
        n_actions: int,
        net: NetConfig | None = None,
        *,
        extra_heads: dict | None = None,
        input_gate=None,
        xp=np,
        dtype=np.float32,
        max_batch: int | None = 512,
        seed: int = 0,
        params_of: QNetwork | None = None,
        **fields,
    ):
        net = replace(net or NetConfig(), **fields) if fields else (net or NetConfig())
        if np.dtype(dtype) != np.float32 and not is_numpy(xp):
            raise ValueError("the GPU backend is float32 only")
        self.xp, self.dtype, self.config = xp, np.dtype(dtype), net
        self.n_in, self.n_actions = int(n_in), int(n_actions)
        self._makers = (extra_heads, input_gate)  # for twin()
        parts = _modules(self.n_in, self.n_actions, net, extra_heads, input_gate)
        #: ``extras``: heads on psi besides the distributional one, by name (``forward()[name]``)
        self.gate, self.encoder, self.head, self.extras = parts
        self.plan = self.extras.get("plan")
        #: the extra heads whose outputs acting and evaluation read: the plan head's gate (``net.plan``),
        #: else none; their forwards pass ``heads=net.acting_heads``
        self.acting_heads = ("plan",) if self.plan is not None else ()
        self.modules = _in_order(*parts)
        self.layout, self._ws_spec = _declare(self.modules)
        if params_of is None:
            self.params = xp.asarray(self.layout.init_host(seed, self.dtype))
        elif params_of.layout.entries != self.layout.entries or params_of.params.dtype != self.dtype:
            raise ValueError("params_of: a network of another layout or dtype")
        else:
            self.params = params_of.params
        self.grads = xp.zeros(self.layout.padded_size, dtype=self.dtype)
        self.P, self.G = self.layout.views(self.params), self.layout.views(self.grads)
        for m in self.modules:
            m.bind(self.P, self.G, xp)
        self.linears = {lin.name: lin for lin in _walk(self.modules) if isinstance(lin, Linear)}
        for lin in self.linears.values():
            configure_linear(lin, net)
        self._branched: list[Workspace] = []  # the workspaces whose extra heads run on a branch
        unknown = set(net.spectral) - set(self.linears)
        if unknown:
            raise ValueError(
                f"net.spectral: no linear layer named {sorted(unknown)} (the layers: {sorted(self.linears)})"
            )
        for k, name in enumerate(sorted(net.spectral)):
            self.linears[name].spectral = True
            if params_of is None:
                self.linears[name].alloc_state(xp, self.dtype, seed, 1000 + k)
            else:
                self.linears[name].share_state(params_of.linears[name])
        #: the input gate folded into the encoder's first layer's weight (:meth:`fold_gate`), or None: no gate,
        #: or the gate in front of the encoder (a windowed encoder, or spectral norm on that layer)
        self.folded = self._fold_gate_into_encoder()
        #: whether forwards read the folded weight as :meth:`fold_gate` last wrote it (:meth:`prefolded_forwards`)
        #: rather than folding first
        self.prefolded = False
        self._chain = self._chain_of(net)
        self.ws = self.new_workspace(max_batch) if max_batch is not None else None

    def _fold_gate_into_encoder(self):
        """The input gate, folded into :attr:`Encoder.gate_linear <cudarl.nn.encoders.Encoder.gate_linear>`
        where the encoder declares one and it has no spectral norm (``W_sn`` is no row-scaled weight), else
        None (the gate then runs in front of the encoder)."""
        lin = None if self.gate is None else self.encoder.gate_linear
        if lin is None or lin.spectral:
            return None
        self.gate.fold_into(lin, self.xp)
        return self.gate

    def fold_gate(self) -> None:
        """The folded weight ``diag(s) W1`` of the current parameters (:attr:`folded`; none: a no-op). What a
        forward does first unless :attr:`prefolded`: the train step does it once, on an early branch (the
        agent's ``fold`` phase), for every forward of the step."""
        if self.folded is not None:
            self.folded.fold()

    @contextmanager
    def prefolded_forwards(self):
        """``with net.prefolded_forwards():`` the forwards enqueued in the body read the folded weight as
        :meth:`fold_gate` last wrote it, without folding first: the train step's phases, whose first folds
        (beside sample, joined before any forward) from the parameters every forward of the step reads (only
        the optimiser and the own SGD steps move them, after the last forward). Every other forward (acting,
        evaluation, after a checkpoint load, a weight swap or a shrink) folds first, so none reads a fold of
        parameters since moved."""
        old, self.prefolded = self.prefolded, True
        try:
            yield
        finally:
            self.prefolded = old

    def _chain_of(self, net: NetConfig) -> tuple:
        """The Linears ``net.gemm = "chain"`` runs as one launch on the GPU (:func:`chain_of`)."""
        return chain_of(self.encoder, self.head, net, self.xp, gated=self.gate is not None)

    def _run_chain(self, x, ws: Workspace) -> bool:
        """The chain's layers (:meth:`_chain_of`) over ``x`` in one launch (cuda_src/gemm.cu's chain), each
        layer's output in its workspace buffer as its own forward writes it. False where the launch cannot
        take these operands (``chain_eligible``; the layers then run one by one), else True."""
        ops = family("gemm", self.xp)
        B = x.shape[0]
        P = self.P
        layers = [(lin.weight(), P[f"{lin.name}.bias"], ws.rows(f"{lin.name}.out", B), lin.act) for lin in self._chain]
        if not ops.chain_eligible(x, layers):
            return False
        ops.chain(x, layers)
        return True

    def _backward_chained(self, x, ws: Workspace, extras_done: bool = False, extras_dpsi=None) -> bool:
        """The backward of a forward that ran the chain through the head's first layer (:meth:`_run_chain`,
        :attr:`Head.chain_linear`) with its dx chain as one launch (cuda_src/gemm.cu's chain_backward): the
        head's part above that layer (:meth:`Head.backward_to`: C51's dueling backward), the layer's parameter
        gradients (:meth:`Linear.backward_grads`), then one launch writing dL/dpsi and every encoder layer's dz
        below it, each step the panel dx GEMM's bits then the ReLU mask's (``gemm.nt``, ``nn.act_backward``);
        then the extra heads' backward (none of which writes dL/dpsi), then the encoder layers' parameter
        gradients, top to bottom. With ``extras_done`` (:meth:`backward_extras` wrote dL/dpsi first), the launch's
        first step adds the Q head's part to it before the mask (the order of :meth:`backward`'s accumulating dx
        GEMM: the product, then plus dL/dpsi) and the extra heads' backward is not run again (``extras_dpsi``, where
        that sum was written instead: copied into dL/dpsi first, :func:`cudarl.nn.layers.copy_addend`). False, with
        nothing run, where the forward did not chain through the head, an extra head it ran writes dL/dpsi
        without ``extras_done`` (it would add after the mask), or the launch cannot take the operands
        (``chain_backward_eligible``): :meth:`backward` then runs layer by layer."""
        lins = self._chain
        operands = chain_backward_operands(lins, self.head, ws, lambda lin: lin.weight())
        if operands is None:
            return False
        early = any(self.extras[name].writes_dpsi for name in ws.heads)
        if early and not extras_done:
            return False
        ops = family("gemm", self.xp)
        d, steps = operands
        if not ops.chain_backward_eligible(d, steps):
            return False
        psi = ws.rows(f"{self.encoder.out_name}.out")
        self.head.backward_to(ws, ws.batch, raw=ws.raw_head)
        lins[-1].backward_grads(psi, ws)
        dpsi = ws.rows(f"{self.encoder.out_name}.dout")
        if early and extras_dpsi is not None:
            copy_addend(self.xp, dpsi, extras_dpsi)
        ops.chain_backward(d, steps, accumulate=early)
        for name in () if early else ws.heads:  # probes of psi (writes_dpsi False): their parameters' gradients
            self.extras[name].backward(psi, ws, dpsi, accumulate=True)
        for i in range(len(lins) - 2, -1, -1):  # the first layer's bias beside its dW, as Linear.backward's
            lins[i].backward_grads(x if i == 0 else ws.rows(f"{lins[i - 1].name}.out"), ws, bias_beside=i == 0)
        return True

    def twin(self, config=None) -> QNetwork:
        """A network over these parameters (the same buffer, which it only reads) with a gradient buffer
        of its own and modules of its own bound to both: its :meth:`backward` over a workspace of this
        network's forward writes the twin's :attr:`grads`, bit for bit what this network's backward would
        write into its own, and nothing this network's backward writes, so the two can run beside each
        other (a second backward of the step on a branch: :class:`cudarl.auxiliary.base.OwnBackward`).
        ``config``: a :class:`cudarl.config.NetConfig` that differs from this network's in its GEMM choices
        only (``gemm``, ``dw_gemm``, ``gemm_algo``: ``agent.aux_gemm``); the twin's sums are then its GEMMs'
        (the same math to float32 rounding, not those bits). None: this network's.
        Spectrally normalised layers read this network's u, v, sigma and ``W_sn`` (moved only by this
        network's :meth:`spectral_step`) and have their own scratch. No default workspace; its weight
        gradients run on the current stream until :meth:`set_side_stream`."""
        extra_heads, input_gate = self._makers
        if config is None:
            config = self.config
        gemms = ("gemm", "dw_gemm", "gemm_algo")
        if replace(config, **{k: getattr(self.config, k) for k in gemms}) != self.config:
            raise ValueError("QNetwork.twin: the config may differ from the network's in its GEMM choices only")
        return QNetwork(
            self.n_in, self.n_actions, config, extra_heads=extra_heads, input_gate=input_gate, xp=self.xp,
            dtype=self.dtype, max_batch=None, params_of=self,
        )  # fmt: skip

    def backward_writes(self, last_layer: bool = False) -> frozenset:
        """The names of the workspace buffers a :meth:`backward` (with ``last_layer``) writes, found by
        running one on a NumPy network of this structure over 2 random rows (raw and not, where the head
        has a raw output) and comparing every buffer before and after: the buffers a second backward over
        the same forward needs of its own to run beside this network's
        (:meth:`cudarl.nn.params.Workspace.shadow`). A buffer written with the values it held is not
        found (running beside, both sides then read and write the same bits)."""
        extra_heads, input_gate = self._makers
        net = QNetwork(
            self.n_in, self.n_actions, self.config, extra_heads=extra_heads, input_gate=input_gate, xp=np,
            max_batch=2, seed=1,
        )  # fmt: skip
        rng = np.random.default_rng(0)
        written = set()
        for raw in (False, True):
            try:
                self.head._no_raw(raw)
            except ValueError:
                continue
            ws = net.new_workspace(2)
            for buf in ws.bufs.values():
                buf[...] = rng.normal(size=buf.shape).astype(buf.dtype) if buf.dtype.kind == "f" else buf
            x = rng.normal(size=(2, self.n_in)).astype(self.dtype)
            net.forward(x, ws, raw_head=raw, heads="all")
            for g in net.grad_outputs(ws, raw_head=raw).values():
                g[...] = rng.normal(size=g.shape).astype(g.dtype)
            before = {k: v.copy() for k, v in ws.bufs.items()}
            net.backward(x, ws, last_layer=last_layer)
            written |= {k for k, v in ws.bufs.items() if not np.array_equal(v, before[k], equal_nan=True)}
        return frozenset(written)

    def new_workspace(self, max_batch: int) -> Workspace:
        """A workspace for batches up to ``max_batch`` (one per concurrent forward, e.g. s and s').

        With a cuBLASLt ``gemm`` on the GPU it also makes the cuBLASLt plans of a forward over
        ``max_batch`` rows, so that forward can be captured without an eager run first."""
        ws = Workspace(self.xp, self.dtype, max_batch)
        for name, row, merge in self._ws_spec:
            ws.add(name, row, merge=merge)
        for lin in self.linears.values():
            lin.prepare(max_batch)
        return ws

    def prepare_backward(self, batch: int) -> None:
        """Make the cuBLASLt plans of a backward over ``batch`` rows before any capture (GPU; only
        ``gemm="cublaslt_nosplit"`` and ``"cudarl"``, whose dx falls back to it, have any for dx, and
        ``dw_gemm="one_kernel"`` for dW: :meth:`cudarl.nn.Linear.prepare_backward`)."""
        for lin in self.linears.values():
            lin.prepare_backward(batch)

    def branch_extras(self, ws: Workspace) -> None:
        """Run the extra heads of every later :meth:`forward` over ``ws`` on a branch of their own (a
        :class:`cudarl.graph.SideStream` made here, before any capture: ``ws.extras_side``), forked once
        psi is written, so the head's forward and whatever follows it go on beside them. A network
        without extra heads has nothing to branch; a workspace is branched once.

        Their outputs are read after :meth:`join_extras` (the current stream then waits for them);
        :meth:`backward` over ``ws`` joins first. Hazards: nothing may write the extra heads' rows of
        ``ws`` or their parameters before the join, and the branch writes only those rows."""
        if self.extras and ws.extras_side is None:
            ws.extras_side = SideStream(self.xp)
            self._branched.append(ws)

    def join_extras(self, ws: Workspace | None = None) -> None:
        """The current stream waits for the extra heads of the last forward over ``ws`` (None: over every
        workspace :meth:`branch_extras` branched); a no-op where nothing is pending."""
        for w in self._branched if ws is None else [ws]:
            if w.extras_side is not None:
                w.extras_side.join()

    def spectral_in_steps(self) -> None:
        """Spectral norm by :meth:`spectral_step` only (the trainer's networks: forwards that run side by
        side must not each move u, v and W_sn); the forwards read ``W_sn`` as the last step left it."""
        for lin in self.linears.values():
            lin.sn_in_forward = False

    def spectral_step(self, iterate: bool = True) -> None:
        """One power iteration (``iterate``) and ``W_sn`` of every spectrally normalised layer (none: a no-op)."""
        for lin in self.linears.values():
            if lin.spectral:
                lin.spectral_step(iterate)

    def set_side_stream(self, side) -> None:
        """Run the weight gradients of :meth:`backward` on side branches: ``side`` is one
        :class:`cudarl.graph.SideStream` for every layer, a list of one per layer (in
        :attr:`linears` order; the layers' dW then run beside each other too), or None for one
        stream. The caller joins every one before reading :attr:`grads`."""
        sides = list(side) if isinstance(side, (list, tuple)) else [side] * len(self.linears)
        if len(sides) != len(self.linears):
            raise ValueError(f"set_side_stream: {len(sides)} side streams for {len(self.linears)} layers")
        for lin, s in zip(self.linears.values(), sides, strict=True):
            lin.side = s

    def head_names(self, heads="all") -> tuple:
        """The names of the extra heads a forward with ``heads`` runs, in :attr:`extras` order: ``"all"``
        (every one), ``"none"`` or a sequence of names in :attr:`extras` (``()``: none)."""
        if heads == "all":
            return tuple(self.extras)
        if heads == "none":
            return ()
        if isinstance(heads, str):
            raise ValueError(f'heads: "all", "none" or a sequence of extra heads\' names, got {heads!r}')
        unknown = set(heads) - set(self.extras)
        if unknown:
            raise ValueError(f"heads: no extra head named {sorted(unknown)} (the extra heads: {list(self.extras)})")
        return tuple(name for name in self.extras if name in heads)

    def forward(self, x, ws: Workspace | None = None, raw_head: bool = False, *, heads="all", **head_kw) -> dict:
        """x ``[B, n_in]`` -> ``{"q": the head's output, name: each extra head's output that ran}``; ``"q"``
        is ``head.output_shape(B)`` (C51 logits ``[B, A, atoms]``, quantiles ``[B, N, A]``).

        ``heads``: which extra heads this forward runs (:meth:`head_names`: ``"all"``, ``"none"`` or a
        sequence of names); the others are not run and their rows of ``ws`` are left as they were. Each
        call site names what it reads: the train step's forward at s runs all (the losses and the backward
        read them), its forwards at s' none, acting and evaluation :attr:`acting_heads`. The workspace
        remembers the choice, so :meth:`backward` runs the backward of those heads only.

        ``raw_head`` (C51 only): ``"q"`` is the head's output before the dueling combine,
        ``va [B, (1 + A) atoms]``; the workspace remembers it, so :meth:`backward` starts from dL/dva.
        ``head_kw`` go to the head's forward (IQN: ``tau [B, N]``, else the workspace's).

        On a workspace :meth:`branch_extras` branched, the extra heads are enqueued first, on its
        branch, forked after psi; the head's forward follows on the current stream at once (the same
        kernels and inputs: the same bits). Read their outputs after :meth:`join_extras`. A forward that
        runs none forks nothing.

        With the input gate folded into the encoder's first layer (:attr:`folded`), the encoder reads ``x``
        ungated and that layer the folded weight ``diag(s) W1``, written first (one launch) unless
        :attr:`prefolded` (:meth:`prefolded_forwards`: the train step's fold wrote it); ``(x s) W1`` and
        ``x (s W1)`` round differently, so the bits differ from the gate in front of the encoder."""
        ws = ws or self.ws
        names = self.head_names(heads)
        ws.set_batch(x.shape[0])
        ws.x = x  # the input of this workspace's forward, for backward
        ws.raw_head = bool(raw_head)
        ws.heads = names
        ws.chained = chained = bool(self._chain) and self._run_chain(x, ws)
        if chained:  # the chain wrote every encoder layer's output (and the head's first layer's, if it holds it)
            psi = ws.rows(f"{self.encoder.out_name}.out", x.shape[0])
        elif self.folded is not None:
            if not self.prefolded:
                self.folded.fold()
            psi = self.encoder.forward(x, ws)
        else:
            psi = self.encoder.forward(x if self.gate is None else self.gate.forward(x, ws), ws)
        extras, side = {}, ws.extras_side if names else None
        if side is not None:
            with side.fork():  # each extra head reads psi and writes its own rows only
                for name in names:
                    extras[name] = self.extras[name].forward(psi, ws)
        head_lin = self.head.chain_linear
        if chained and self._chain[-1] is head_lin:
            q = self.head.forward_from(ws.rows(f"{head_lin.name}.out", x.shape[0]), ws, raw=raw_head)
        else:
            q = self.head.forward(psi, ws, raw=raw_head, **head_kw)
        if side is None:
            for name in names:
                extras[name] = self.extras[name].forward(psi, ws)
        return {"q": q, **extras}

    def grad_outputs(self, ws: Workspace | None = None, raw_head: bool = False) -> dict:
        """The buffers the losses write ``dL/d(output)`` into, shaped like :meth:`forward`'s outputs
        (with ``raw_head``: dL/dva ``[B, (1 + A) atoms]``)."""
        ws = ws or self.ws
        if raw_head:
            out = {"q": ws.rows(self.head.raw_grad_name())}
        else:
            out = {"q": ws.rows(self.head.grad_name).reshape(self.forward_shape(ws.batch))}
        for name, h in self.extras.items():
            out[name] = ws.rows(h.grad_name)
        return out

    def forward_shape(self, B: int) -> tuple:
        """The shape of ``forward()["q"]`` for ``B`` samples (the head's)."""
        return self.head.output_shape(B)

    @property
    def extras_first(self) -> bool:
        """Whether :meth:`backward_extras` can run before :meth:`backward`: an extra head writes dL/dpsi
        (``Module.writes_dpsi``) and the Q head's backward adds its own onto it (``Head.accumulates_dpsi``:
        not IQN's, whose mixing kernel overwrites dL/dpsi)."""
        return self.head.accumulates_dpsi and any(h.writes_dpsi for h in self.extras.values())

    def backward_extras(self, ws: Workspace | None = None, rows: int | None = None, dpsi=None) -> bool:
        """The first part of :meth:`backward` over ``ws``, alone: the extra heads' backward (those the last
        forward on ``ws`` ran, in that order) over its first ``rows`` (default ``ws.batch``), writing their
        parameter gradients and overwriting dL/dpsi with the sum of those that write it
        (``Module.writes_dpsi``: not the plan head, a probe); :meth:`backward` with ``extras_done`` then adds
        the Q head's. So it can run earlier, on another stream, once the extra heads' output
        gradients are written (the agent's ``extras_backward`` phase: on the auxiliary signals' branch,
        beside the rule's loss, so that their GEMMs leave the step's chain). dL/dpsi is then
        ``Q + (E_1 + E_2 + ...)`` where :meth:`backward` alone sums ``((Q + E_1) + E_2) + ...``: the same to
        float32 rounding. Whether an extra head wrote dL/dpsi (False: none did, and the Q head's
        backward overwrites it as without this call). Refused where the Q head's backward cannot add
        (:attr:`extras_first`). ``dpsi``: their sum written there instead (``[rows, d]``, not ``ws``'s), which
        :meth:`backward` then reads as its ``extras_dpsi``."""
        if not self.head.accumulates_dpsi:
            raise ValueError(
                f"QNetwork.backward_extras: the {type(self.head).__name__}'s backward overwrites dL/dpsi, so the "
                "extra heads' part cannot run first (extras_first is False)"
            )
        ws = ws or self.ws
        if not ws.heads:
            return False
        self.join_extras(ws)
        batch = ws.batch
        B = ws.set_batch(batch if rows is None else rows)  # the rows the backward runs over (IQN's: s of s, s')
        psi = ws.rows(f"{self.encoder.out_name}.out", B)
        dpsi = ws.rows(f"{self.encoder.out_name}.dout", B) if dpsi is None else dpsi
        wrote = False
        for name in ws.heads:
            head = self.extras[name]
            head.backward(psi, ws, dpsi, accumulate=wrote)
            wrote = wrote or head.writes_dpsi
        ws.set_batch(batch)
        return wrote

    def backward(
        self,
        x=None,
        ws: Workspace | None = None,
        dx=None,
        last_layer: bool = False,
        extras_done: bool = False,
        heads: str = "all",
        extras_dpsi=None,
    ) -> None:
        """Overwrite :attr:`grads` from the gradients in :meth:`grad_outputs` (last forward on ``ws``,
        raw or not as that forward was; the extra heads that forward ran, :meth:`forward`'s ``heads``).
        ``extras_done``: :meth:`backward_extras` has run the extra heads' part over these rows (their
        parameter gradients and their sum of dL/dpsi): the Q head's dL/dpsi is added to it; ``extras_dpsi``:
        where :meth:`backward_extras` wrote that sum instead (its ``dpsi``), read as the Q head's dx GEMM's
        addend (``ws``'s dL/dpsi = the Q head's part + it; it is left as it was, for a branch that reads it:
        Gradient Vaccine's backward; :func:`cudarl.nn.layers.take_addend`).

        ``heads``: ``"all"``; ``"extras"``, the extra heads' part alone reaches psi (Gradient Vaccine's backward
        of the auxiliary heads): the Q head's backward is not run (its parameter gradients are left as they
        were) and dL/dpsi is the sum of the extra heads' that write it, the first overwriting it (at least one
        must), where running the Q head's backward from zero gradient rows gave that sum plus zeros (the same
        values; a zero's sign may differ) for a dueling backward and a dx GEMM more; ``"none"``, no head's
        backward runs and dL/dpsi is what ``ws`` holds (Gradient Vaccine's copy of :meth:`backward_extras`'s).

        ``last_layer``: the heads' backward, then the encoder's stops after its last layer's parameter
        gradients (:meth:`Encoder.backward_last`, ``encoder.last_layer``); the other encoder parameters'
        and the input gate's gradients are left as they were (no ``dx``). The extra heads' branch of
        that forward (:meth:`branch_extras`) is joined first. (With the gate folded into the first layer
        (:attr:`folded`), a last layer that is the first, an MLP of one hidden layer, writes the gate's
        gradient too: it comes with that layer's weight gradient, :meth:`Linear._weight_grad
        <cudarl.nn.layers.Linear._weight_grad>`.)

        With the gate folded, the first layer's dW GEMM over the ungated ``x`` gives dL/d(the folded weight),
        which the gate's ``fold_backward`` turns into dL/dW1 and dL/d(gate logits) on that layer's branch: no
        input gradient of the first layer and no ``sel.dx``.

        After a forward that ran the chain (``net.gemm = "chain"``) through the C51 head's first layer, with no
        ``dx``, not ``last_layer`` and no extra head that writes dL/dpsi unless ``extras_done``, the dx chain
        from dL/dva down to the first layer's dz is one launch where it takes the operands
        (:meth:`_backward_chained`): the same bits as the panel GEMM and the ReLU kernel a layer (``net.gemm =
        "cudarl"``)."""
        ws = ws or self.ws
        self.join_extras(ws)
        x = ws.x if x is None else x
        if heads not in ("all", "extras", "none"):
            raise ValueError(f'QNetwork.backward: heads "all", "extras" or "none", got {heads!r}')
        if extras_dpsi is not None and not extras_done:
            raise ValueError("QNetwork.backward: extras_dpsi is backward_extras' sum, so it needs extras_done")
        if heads == "all" and dx is None and not last_layer and self._backward_chained(x, ws, extras_done, extras_dpsi):
            return
        psi = ws.rows(f"{self.encoder.out_name}.out")
        dpsi = ws.rows(f"{self.encoder.out_name}.dout")
        if heads == "none":
            pass
        elif heads == "extras":
            if extras_done or not any(self.extras[name].writes_dpsi for name in ws.heads):
                raise ValueError('QNetwork.backward(heads="extras"): needs an extra head that writes dL/dpsi, not done')
            wrote = False
            for name in ws.heads:
                self.extras[name].backward(psi, ws, dpsi, accumulate=wrote)
                wrote = wrote or self.extras[name].writes_dpsi
        else:
            early = extras_done and any(self.extras[name].writes_dpsi for name in ws.heads)
            add = extras_dpsi if early and extras_dpsi is not None else early  # the sum as the dx GEMM's C
            self.head.backward(psi, ws, dpsi, accumulate=add, raw=ws.raw_head)
            for name in () if early else ws.heads:
                self.extras[name].backward(psi, ws, dpsi, accumulate=True)
        if last_layer:
            if dx is not None:
                raise ValueError("QNetwork.backward: no input gradient with last_layer")
            gated = self.gate is not None and self.folded is None
            self.encoder.backward_last(ws.rows("sel.x", ws.batch) if gated else x, ws)
            return
        if dx is not None and self.gate is not None:
            raise ValueError("QNetwork.backward: no input gradient through the input gate")
        if self.gate is None or self.folded is not None:
            self.encoder.backward(x, ws, dx)
            return
        self.encoder.backward(ws.rows("sel.x", ws.batch), ws, ws.rows("sel.dx", ws.batch))
        self.gate.backward(x, ws)

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host copies of the flat parameters, the layout they follow and the spectral-norm vectors."""
        sn = {n: {k: to_numpy(lin.sn[k]).copy() for k in ("u", "v")} for n, lin in self.linears.items() if lin.spectral}
        return {
            "params": to_numpy(self.params).copy(),
            "layout": [(e.name, e.offset, e.shape) for e in self.layout.entries],
            "spectral": sn,
        }

    def load_state_dict(self, state: dict) -> None:
        """Copy into the existing buffer (same address, so captured graphs stay valid)."""
        mine = [(e.name, e.offset, e.shape) for e in self.layout.entries]
        theirs = [(n, int(o), tuple(s)) for n, o, s in state["layout"]]
        if mine != theirs:
            raise ValueError("state_dict layout does not match this network's layout")
        p = np.asarray(state["params"], dtype=self.dtype)
        if p.shape != self.params.shape:
            raise ValueError(f"params shape {p.shape} != {self.params.shape}")
        self.params[...] = self.xp.asarray(p)
        mine_sn = {n for n, lin in self.linears.items() if lin.spectral}
        if set(state.get("spectral", {})) != mine_sn:
            raise ValueError(f"state_dict spectral layers {sorted(state.get('spectral', {}))} != {sorted(mine_sn)}")
        for n, vecs in state.get("spectral", {}).items():
            for k in ("u", "v"):
                self.linears[n].sn[k][...] = self.xp.asarray(np.asarray(vecs[k], dtype=self.dtype))
        self.spectral_step(iterate=False)  # sigma and W_sn of the loaded weights and vectors
