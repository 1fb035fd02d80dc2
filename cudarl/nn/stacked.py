"""``StackedQNetwork``: P members of the reference network with a leading member axis on every buffer.

The reference network is an MLP encoder (``net.hidden``, no LayerNorm) and the dueling C51 head, with
``net.gemm`` one of :data:`STACKED_GEMMS` (``"cublaslt_nosplit"``, ``"chain"``). Its population form (issue
23, docs/perf-notes.md, "The agent axis, in stages", stage 2) stacks P members' flat parameter and gradient
buffers as one ``[P, padded_size]`` array: row ``i`` is exactly the flat buffer of a
:class:`cudarl.nn.QNetwork` of the same configuration (the same :class:`cudarl.nn.params.ParamLayout`), so a
member is copied to or from a single network bit for bit (:meth:`StackedQNetwork.load_member`,
:meth:`StackedQNetwork.store_member`). The member stride, ``padded_size`` elements, is a multiple of
:data:`cudarl.nn.params.ALIGN` floats (256 bytes), which :func:`cudarl.blas.gemm_lt_batched` asks of a batch
so every entry keeps entry 0's plan.

A forward or backward runs every member at once: each Linear's forward is one strided-batched cuBLASLt
GEMM with its bias and activation in the epilogue, each dx one batched GEMM, each dW one batched GEMM
under ``net.dw_gemm = "one_kernel"`` (a GEMM per member under ``"split_k"``), and the bias/activation
backward and dueling kernels one launch with the member as ``blockIdx.y`` (``cuda_src/nn.cu``). Under
``net.gemm = "chain"``, where the single network chains (:func:`cudarl.nn.network.chain_of`, the launch's
eligibility), every Linear's forward is one ``gemm.chain`` launch for all members and the backward's dx
chain one ``gemm.chain_backward`` (the member as ``blockIdx.z``); the weight gradients as above. Member
``i`` of a forward or backward equals the single network of the same configuration with member ``i``'s
parameters, bit for bit: each batched operation is P copies of the single operation (the NumPy twins
loop over members).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import blas
from ..backend import family, to_numpy
from ..config import NetConfig
from ..pinned import member_index
from ..reference.nn import IDENTITY
from .layers import Linear
from .network import QNetwork, _declare, _modules, _walk, chain_backward_operands, chain_of, configure_linear
from .params import Workspace, matmul, member_view, stacked_zeros

#: The ``net.gemm`` choices whose GEMMs P members in one launch reproduce bit for bit, member ``i`` the single
#: network alone: ``cublaslt_nosplit`` (the forward and dx as one-kernel cuBLASLt GEMMs, which a
#: strided-batched GEMM repeats per member) and ``chain`` (the Linears as one ``gemm.chain`` launch and the dx
#: chain as one ``gemm.chain_backward``, whose member axis is ``blockIdx.z`` over the same tile code; where the
#: single network falls back to ``cublaslt_nosplit`` layer by layer, so does the population). Not ``cublas`` or
#: ``cublaslt``, whose split-K heuristics a batched GEMM does not repeat, nor ``cudarl`` (no batched panel GEMM).
STACKED_GEMMS = ("cublaslt_nosplit", "chain")


def _elems(a) -> int:
    """The member stride of a ``[P, ...]`` array, in elements."""
    return a.strides[0] // a.itemsize


class StackedWorkspace(Workspace):
    """A :class:`cudarl.nn.params.Workspace` of ``members`` members: ``add(name, row)`` allocates
    ``[P, max_batch, *row]`` (:func:`cudarl.nn.params.stacked_zeros`: members a multiple of 256 bytes
    apart) and ``rows(name, B)`` is ``[P, B, *row]``, each member's entry C-contiguous. Member ``i``'s
    entries are a single network's workspace rows."""

    def __init__(self, xp, dtype, members: int, max_batch: int):
        if int(members) < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        self.members = int(members)
        super().__init__(xp, dtype, max_batch)

    def _zeros(self, shape: tuple, dtype):
        return stacked_zeros(self.xp, self.members, shape, dtype)

    def add(self, name: str, row_shape, dtype=None, merge: bool = False):
        if merge:
            raise ValueError(f"{name}: a stacked workspace has no merged rows (the reference network has none)")
        return super().add(name, row_shape, dtype=dtype)

    def rows(self, name: str, B: int | None = None):
        return self.bufs[name][:, : self.batch if B is None else B]


def _reference_network(net: NetConfig) -> None:
    """Refuse a configuration the stacked network does not build (only the reference network's)."""
    unsupported = {
        "encoder": net.encoder != "mlp",
        "head": net.head != "c51",
        "layernorm": net.layernorm,
        "spectral": bool(net.spectral),
        "plan": net.plan,
        "gemm": net.gemm not in STACKED_GEMMS,
    }
    bad = sorted(k for k, v in unsupported.items() if v)
    if bad:
        raise ValueError(
            f"StackedQNetwork builds the reference network only (encoder 'mlp' without layernorm, head 'c51', "
            f"no spectral norm, no plan head, gemm one of {STACKED_GEMMS}: the GEMMs a batch reproduces); not {bad}"
        )


class StackedQNetwork:
    """P members of the reference network (MLP encoder, dueling C51 head) in stacked buffers.

    Args:
        n_in: input features (the flattened window).
        n_actions: actions.
        net: the :class:`cudarl.config.NetConfig` (keyword ``fields`` override it, as for
            :class:`cudarl.nn.QNetwork`); the reference network only (``encoder="mlp"``, no
            ``layernorm``, ``head="c51"``, no ``spectral``, no ``plan``, ``gemm`` one of :data:`STACKED_GEMMS`).
        members: P.
        xp: backend (float32 only).
        max_batch: rows per member of the default workspace :attr:`ws` (None: none).
        seeds: P Philox seeds, member ``i`` initialised as ``QNetwork(..., seed=seeds[i])`` (default
            ``0 .. P-1``).

    Buffers: :attr:`params` and :attr:`grads`, float32 ``[P, layout.padded_size]`` (row ``i``: member
    ``i``'s flat buffer in the single network's :attr:`layout`); :attr:`P` and :attr:`G` their named
    views ``[P, *shape]`` (``P["enc.0.weight"]`` is ``[P, n_in, hidden[0]]``).

    Plans: :meth:`new_workspace` makes the cuBLASLt plans of a forward and backward over its
    ``max_batch`` rows for an input in its ``"x"`` rows (:meth:`input`), so both can be captured
    without an eager run; an input with other member strides makes its plan at its first eager call, or
    before it with :meth:`prepare_input`.

    The weight gradients follow ``net.dw_gemm``, as the single network's do
    (:meth:`cudarl.nn.Linear.prepare_backward`'s plans, ``Linear._dw``): under ``"one_kernel"`` the single
    network's dW is a one-kernel cuBLASLt GEMM, so :meth:`backward` runs each layer's as one
    :func:`cudarl.blas.gemm_lt_batched` over every member (entry ``i`` is that single GEMM bit for bit);
    under ``"split_k"`` (the default) it is cuBLAS with split-K (K is the batch), which a batched
    one-kernel GEMM cannot reproduce, so :meth:`backward` calls the single network's dW GEMM for each
    member in turn. Either way member ``i`` keeps the bits of the single network with the same
    ``dw_gemm``. What each costs: ``tools/bench_stacked.py`` (dW per member and batched, alone) and
    ``tools/bench_step.py`` (the single step under each; docs/perf-notes.md, "The agent axis, in stages").

    Every batched GEMM and batched plan takes ``net.batched_algo`` (:data:`cudarl.blas.BATCHED_ALGOS`):
    ``"single"`` runs the single network's algorithm; ``"probe"`` the fastest of it and the batched
    candidates of cuBLASLt's that a probe found bitwise equal to it when the plan was made (each timed
    there; :func:`cudarl.blas.batched_plan_info`).
    """

    def __init__(
        self,
        n_in: int,
        n_actions: int,
        net: NetConfig | None = None,
        *,
        members: int,
        xp=np,
        max_batch: int | None = 512,
        seeds=None,
        **fields,
    ):
        net = replace(net or NetConfig(), **fields) if fields else (net or NetConfig())
        _reference_network(net)
        self.xp, self.config, self.members = xp, net, int(members)
        self.n_in, self.n_actions = int(n_in), int(n_actions)
        seeds = list(range(self.members)) if seeds is None else [int(s) for s in seeds]
        if self.members < 1 or len(seeds) != self.members:
            raise ValueError(f"StackedQNetwork: {members} members and {len(seeds)} seeds")
        _, self.encoder, self.head, _ = _modules(self.n_in, self.n_actions, net, None, None)
        self.layout, self._ws_spec = _declare([self.encoder, self.head])
        #: the Linear layers in forward order (the encoder's, then the head's ``va``); unbound, they
        #: describe the shapes and GEMM options
        self.linears = [m for m in _walk([self.encoder, self.head]) if isinstance(m, Linear)]
        for lin in self.linears:  # as QNetwork sets its layers'
            configure_linear(lin, net)
        #: the Linears the forward runs as one ``gemm.chain`` launch (the single network's choice,
        #: :func:`cudarl.nn.network.chain_of`: under ``net.gemm = "chain"`` on the GPU all of them), else ()
        self._chain = chain_of(self.encoder, self.head, net, xp)
        host = np.stack([self.layout.init_host(s, np.float32) for s in seeds])
        self.params = xp.asarray(host)
        self.grads = xp.zeros_like(self.params)
        self.P, self.G = self.views(self.params), self.views(self.grads)
        self.ops = family("nn", xp)
        self._sides = None  # a side stream per layer for the weight gradients (set_side_stream)
        #: the weight gradients as one batched GEMM a layer (``net.dw_gemm = "one_kernel"``), else per member
        self.dw_batched = net.dw_gemm == "one_kernel"
        #: the batched GEMMs' algorithm choice (``net.batched_algo``, :data:`cudarl.blas.BATCHED_ALGOS`)
        self.batched_algo = net.batched_algo
        self.ws = self.new_workspace(max_batch) if max_batch is not None else None

    def views(self, buf) -> dict:
        """``{name: [P, *shape] view}`` of a ``[P, layout.padded_size]`` buffer (no copies)."""
        if tuple(buf.shape) != (self.members, self.layout.padded_size):
            raise ValueError(f"stacked buffer must be [{self.members}, {self.layout.padded_size}], got {buf.shape}")
        return {e.name: member_view(self.xp, buf, e.offset, e.shape) for e in self.layout.entries}

    def _same_layout(self, net: QNetwork) -> None:
        if net.layout.entries != self.layout.entries or net.params.dtype != self.params.dtype:
            raise ValueError("a single network of another layout or dtype than the members'")

    def load_member(self, i: int, net: QNetwork) -> None:
        """Member ``i``'s parameters := ``net``'s (a :class:`cudarl.nn.QNetwork` of the same layout and
        backend), bit for bit."""
        self._same_layout(net)
        self.params[i] = net.params

    def store_member(self, i: int, net: QNetwork) -> None:
        """``net``'s parameters := member ``i``'s, bit for bit (into ``net``'s buffer, same address)."""
        self._same_layout(net)
        net.params[...] = self.params[i]

    def new_workspace(self, max_batch: int) -> StackedWorkspace:
        """A :class:`StackedWorkspace` for batches up to ``max_batch`` rows per member, with the input rows
        ``"x"`` (:meth:`input`) beside the layers'; on the GPU it also makes the cuBLASLt plans of a forward
        and a backward over ``max_batch`` rows on it (before any capture)."""
        ws = StackedWorkspace(self.xp, np.float32, self.members, max_batch)
        ws.add("x", (self.n_in,))
        for name, row, merge in self._ws_spec:
            ws.add(name, row, merge=merge)
        if not isinstance(self.params, np.ndarray):
            self._prepare(ws, max_batch)
        return ws

    def input(self, ws: StackedWorkspace | None = None, B: int | None = None):
        """The workspace's input rows ``[P, B, n_in]`` (B: its ``max_batch``), the input the plans of
        :meth:`new_workspace` were made for: write the members' observations here."""
        ws = ws or self.ws
        return ws.bufs["x"][:, : ws.max_batch if B is None else B]

    def layer_rows(self, ws: StackedWorkspace, x, dx=None) -> list:
        """``(layer, its input [P, B, n_in], the rows its dx goes to)`` of each :class:`cudarl.nn.Linear` in
        forward order, for the input ``x`` ``[P, B, n_in]`` and its gradient ``dx`` (None: none) over the
        ``B`` rows of ``ws`` (the layer's own rows are ``ws.rows(f"{layer.name}.out")`` and ``.dout``)."""
        B = x.shape[1]
        below = [(x, dx)] + [(ws.rows(f"{a.name}.out", B), ws.rows(f"{a.name}.dout", B)) for a in self.linears[:-1]]
        return [(lin, a, d) for lin, (a, d) in zip(self.linears, below, strict=True)]

    def _prepare(self, ws: StackedWorkspace, B: int) -> None:
        """The batched cuBLASLt plans of a forward and backward over ``B`` rows of ``ws`` (GPU), the input's
        gradient included for a ``dx`` laid out as ``stacked_zeros(xp, P, (B, n_in))`` (a capture without an
        eager run first found no plan for it, on an H200, 2026-12-03), and the weight gradients' under
        ``net.dw_gemm = "one_kernel"``."""
        dx_in = stacked_zeros(self.xp, self.members, (B, self.n_in))  # only its strides are read
        for lin, x, dx in self.layer_rows(ws, self.input(ws, B), dx_in):
            self._prepare_forward(lin, x, ws.rows(f"{lin.name}.out", B))
            self._prepare_dw(lin, x, ws)
            if dx is not None:
                W, dy = self.P[f"{lin.name}.weight"], ws.rows(f"{lin.name}.dout", B)
                strides = (_elems(dy), _elems(W), _elems(dx))
                opts = {"batch": self.members, "tf32": lin.tf32, "split_k": False, "algo": self.batched_algo}
                blas.gemm_lt_prepare(B, lin.n_in, lin.n_out, trans_b=True, strides=strides, **opts)

    def _prepare_forward(self, lin: Linear, x, y) -> None:
        """The batched cuBLASLt plan of ``lin``'s forward from ``x`` into ``y`` (``[P, B, ...]``; GPU)."""
        W, bias = self.P[f"{lin.name}.weight"], self.P[f"{lin.name}.bias"]
        blas.gemm_lt_prepare(
            x.shape[1], lin.n_out, lin.n_in, bias=bias, act=lin.lt_act, strides=(_elems(x), _elems(W), _elems(y)),
            batch=self.members, tf32=lin.tf32, split_k=False, algo=self.batched_algo,
        )  # fmt: skip

    def _prepare_dw(self, lin: Linear, x, ws: StackedWorkspace) -> None:
        """The batched cuBLASLt plan of ``lin``'s weight gradients from its input ``x`` ``[P, B, n_in]`` and
        the ``dout`` rows of ``ws`` (GPU; only under ``net.dw_gemm = "one_kernel"``)."""
        if not self.dw_batched:
            return
        B, gw = x.shape[1], self.G[f"{lin.name}.weight"]
        strides = (_elems(x), _elems(ws.rows(f"{lin.name}.dout", B)), _elems(gw))
        blas.gemm_lt_prepare(
            lin.n_in, lin.n_out, B, trans_a=True, strides=strides, batch=self.members, tf32=lin.tf32, split_k=False,
            algo=self.batched_algo,
        )  # fmt: skip

    def prepare_input(self, x, ws: StackedWorkspace | None = None, backward: bool = False) -> None:
        """Make the plan of a forward over ``ws`` from the input ``x`` float32 ``[P, B, n_in]`` whose member
        stride is not that of ``ws``'s ``"x"`` rows (e.g. a half of the train step's ``[P, 2B, width]``
        window pair), before any capture (GPU; nothing on NumPy): only the first layer reads ``x``, and
        :meth:`new_workspace` made the other layers' plans. A forward from ``x`` can then be captured
        without an eager run; with ``backward``, a backward over ``ws`` too (the first layer's weight
        gradients read ``x``: their plan under ``net.dw_gemm = "one_kernel"``)."""
        ws = ws or self.ws
        if isinstance(self.params, np.ndarray):
            return
        lin = self.linears[0]
        self._prepare_forward(lin, x, ws.rows(f"{lin.name}.out", x.shape[1]))
        if backward:
            self._prepare_dw(lin, x, ws)

    def forward(self, x, ws: StackedWorkspace | None = None, raw_head: bool = False):
        """x float32 ``[P, B, n_in]`` (each member's rows C-contiguous; on the GPU members a multiple of 16
        bytes apart, e.g. :meth:`input`) -> logits ``[P, B, A, atoms]`` in ``ws`` (``raw_head``: the head's
        ``va [P, B, (1 + A) atoms]`` before the dueling combine; :meth:`backward` then starts from dL/dva).
        Writes every layer's ``out`` rows of ``ws``: each a batched cuBLASLt GEMM, or under ``net.gemm =
        "chain"`` the chain's layers one ``gemm.chain`` launch where it takes them (:meth:`_run_chain`)."""
        ws = ws or self.ws
        ws.set_batch(x.shape[1])
        ws.x, ws.raw_head = x, bool(raw_head)
        ws.chained = bool(self._chain) and self._run_chain(x, ws)
        h = ws.rows(f"{self._chain[-1].name}.out") if ws.chained else x
        for lin in self.linears[len(self._chain) if ws.chained else 0 :]:
            y = ws.rows(f"{lin.name}.out")
            W, bias = self.P[f"{lin.name}.weight"], self.P[f"{lin.name}.bias"]
            blas.gemm_lt_batched(h, W, y, bias=bias, act=lin.lt_act, tf32=lin.tf32, algo=self.batched_algo)
            h = y
        if raw_head:
            return h
        logits = ws.rows(f"{self.head.name}.logits")
        self.ops.dueling_forward(h, logits)
        return logits

    def _run_chain(self, x, ws: StackedWorkspace) -> bool:
        """The chain's layers over ``x`` ``[P, B, n_in]`` in one ``gemm.chain`` launch for every member, each
        layer's output in its ``out`` rows, as :meth:`cudarl.nn.QNetwork._run_chain` for one network. False
        where the launch cannot take these operands (``chain_eligible``; the layers then run one by one)."""
        ops = family("gemm", self.xp)
        layers = [
            (self.P[f"{lin.name}.weight"], self.P[f"{lin.name}.bias"], ws.rows(f"{lin.name}.out"), lin.act)
            for lin in self._chain
        ]
        if not ops.chain_eligible(x, layers):
            return False
        ops.chain(x, layers)
        return True

    def grad_output(self, ws: StackedWorkspace | None = None, raw_head: bool = False):
        """The buffer the loss writes dL/dlogits into, ``[P, B, A, atoms]`` (``raw_head``: dL/dva
        ``[P, B, (1 + A) atoms]``)."""
        ws = ws or self.ws
        return ws.rows(self.head.raw_grad_name() if raw_head else self.head.grad_name)

    def backward(self, ws: StackedWorkspace | None = None, dx=None) -> None:
        """Overwrite :attr:`grads` from :meth:`grad_output` of the last forward over ``ws`` (raw or not as
        that forward was); ``dx`` float32 ``[P, B, n_in]`` (optional) gets dL/dx (laid out as
        :func:`cudarl.nn.params.stacked_zeros` makes it, its plan is made by :meth:`new_workspace`; another
        layout's is made at its first eager call, outside any capture). Consumes the ``dout``
        rows of ``ws``. Per layer, from the head down: the bias/activation backward (one launch for every
        member), the weight gradients (one batched GEMM, or one per member: ``net.dw_gemm``, see the class
        docstring), dx as one batched GEMM; after a chained forward, without ``dx``, the dx chain is one
        ``gemm.chain_backward`` launch where it takes the operands (:meth:`_backward_chained`)."""
        ws = ws or self.ws
        if not ws.raw_head:
            self.ops.dueling_backward(ws.rows(self.head.grad_name), ws.rows(self.head.raw_grad_name()))
        sides = self._sides or [None] * len(self.linears)
        rows = list(zip(self.layer_rows(ws, ws.x, dx), sides, strict=True))
        if dx is None and self._backward_chained(ws, rows):
            return
        for (lin, x, below), side in reversed(rows):
            if side is None:
                y, dy = ws.rows(f"{lin.name}.out"), ws.rows(f"{lin.name}.dout")
                self.ops.bias_act_backward(dy, y, dy, self.G[f"{lin.name}.bias"], lin.act)
                self._dw(lin, x, dy, self.G[f"{lin.name}.weight"])
            else:
                # as Linear.backward on its side branch: the activation's backward on the chain, then the
                # parameter gradients beside it (_param_grads)
                if lin.act != IDENTITY:
                    dy = ws.rows(f"{lin.name}.dout")
                    self.ops.act_backward(dy, ws.rows(f"{lin.name}.out"), dy, lin.act)
                self._param_grads(lin, x, ws, side, bias_beside=below is None)
            if below is not None:
                W, dy = self.P[f"{lin.name}.weight"], ws.rows(f"{lin.name}.dout")
                blas.gemm_lt_batched(dy, W, below, trans_b=True, tf32=lin.tf32, algo=self.batched_algo)

    def _backward_chained(self, ws: StackedWorkspace, rows: list) -> bool:
        """The backward of a forward that ran the chain through the C51 head's ``va`` (:meth:`_run_chain`) with
        its dx chain as one ``gemm.chain_backward`` launch for every member, as
        :meth:`cudarl.nn.QNetwork._backward_chained` for one network (dL/dva already in ``va``'s ``dout``):
        ``va``'s parameter gradients, then one launch writing every encoder layer's dz (each member the panel
        dx GEMM's bits then the ReLU mask's), then the encoder layers' parameter gradients, top to bottom.
        ``rows``: :meth:`backward`'s ``((layer, its input, its dx rows), side stream)`` in forward order. False,
        with nothing run, where the forward did not chain through ``va`` or the launch cannot take the
        operands (``chain_backward_eligible``): :meth:`backward` then runs layer by layer, as the single
        network does."""
        lins = self._chain
        operands = chain_backward_operands(lins, self.head, ws, lambda lin: self.P[f"{lin.name}.weight"])
        if operands is None:
            return False
        ops = family("gemm", self.xp)
        d, steps = operands
        if not ops.chain_backward_eligible(d, steps):
            return False
        (top, psi, _), top_side = rows[len(lins) - 1]
        self._param_grads(top, psi, ws, top_side)
        ops.chain_backward(d, steps)
        for i in range(len(lins) - 2, -1, -1):  # the first layer's bias beside its dW, as Linear.backward's
            (lin, x, _), side = rows[i]
            self._param_grads(lin, x, ws, side, bias_beside=i == 0)
        return True

    def _param_grads(self, lin: Linear, x, ws: StackedWorkspace, side, bias_beside: bool = False) -> None:
        """``lin``'s parameter gradients from dz already in its ``dout`` rows (the activation's derivative
        applied), as :meth:`cudarl.nn.Linear.backward_grads`: dW (:meth:`_dw`) and the bias sums (the identity's
        ``bias_act_backward``, which only reads dz); on ``side`` (forked here) where given, the bias after dW
        there, or with ``bias_beside`` on the current stream beside it; else both here, the bias first."""
        y, dy = ws.rows(f"{lin.name}.out"), ws.rows(f"{lin.name}.dout")
        gb, gw = self.G[f"{lin.name}.bias"], self.G[f"{lin.name}.weight"]
        if side is None:
            self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)
            self._dw(lin, x, dy, gw)
            return
        with side.fork():
            self._dw(lin, x, dy, gw)
            if not bias_beside:
                self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)
        if bias_beside:
            self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)

    def _dw(self, lin: Linear, x, dy, gw) -> None:
        """The weight gradients ``gw[i] = x[i]^T dy[i]``: the single network's GEMM (``net.dw_gemm``), as one
        batched one-kernel GEMM for every member, or for each member in turn (cuBLAS's split-K)."""
        if self.dw_batched:
            blas.gemm_lt_batched(x, dy, gw, trans_a=True, tf32=lin.tf32, algo=self.batched_algo)
            return
        for i in range(self.members):
            matmul(x[i], dy[i], gw[i], trans_a=True, tf32=lin.tf32)

    def set_side_stream(self, sides) -> None:
        """Run each layer's weight and bias gradients in :meth:`backward` on a branch of its own, as
        :meth:`cudarl.nn.QNetwork.set_side_stream` does for one network: ``sides`` one
        :class:`cudarl.graph.SideStream` per layer (in :attr:`linears` order), or None for one stream. The
        caller joins every one before reading :attr:`grads`."""
        if sides is not None and len(sides) != len(self.linears):
            raise ValueError(f"set_side_stream: {len(sides)} side streams for {len(self.linears)} layers")
        self._sides = None if sides is None else list(sides)

    # --- checkpoints ------------------------------------------------------------------------
    def _layout_state(self) -> list:
        return [(e.name, e.offset, e.shape) for e in self.layout.entries]

    def _check_state(self, state: dict, shape: tuple) -> np.ndarray:
        """``state``'s parameters as float32 of ``shape`` after checking its layout (a stacked network has
        no spectral norm, so ``spectral`` must be empty)."""
        theirs = [(n, int(o), tuple(s)) for n, o, s in state["layout"]]
        if self._layout_state() != theirs:
            raise ValueError("state_dict layout does not match this network's layout")
        if state.get("spectral", {}):
            raise ValueError(f"state_dict spectral layers {sorted(state['spectral'])}: a stacked network has none")
        p = np.asarray(state["params"], dtype=np.float32)
        if p.shape != shape:
            raise ValueError(f"params shape {p.shape} != {shape}")
        return p

    def state_dict(self) -> dict:
        """Host copies of every member's flat parameters ``params [P, padded_size]``, the layout they follow
        and ``spectral`` (empty: none here), as :meth:`cudarl.nn.QNetwork.state_dict` with a member axis."""
        return {"params": to_numpy(self.params).copy(), "layout": self._layout_state(), "spectral": {}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into the existing buffer (same address: captured graphs stay valid)."""
        self.params[...] = self.xp.asarray(self._check_state(state, tuple(self.params.shape)))

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s as the :meth:`cudarl.nn.QNetwork.state_dict` of the network alone (host copies)."""
        return {"params": to_numpy(self.params[self._member(i)]).copy(), "layout": self._layout_state(), "spectral": {}}

    def load_member_state_dict(self, i: int, state: dict) -> None:
        """Restore a :meth:`cudarl.nn.QNetwork.state_dict` of this layout (e.g. a single agent's) into member
        ``i``; the other members keep theirs."""
        i = self._member(i)
        self.params[i] = self.xp.asarray(self._check_state(state, (self.layout.padded_size,)))

    def _member(self, i) -> int:
        return member_index(i, self.members)
