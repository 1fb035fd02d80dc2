"""``QNetwork``: MLP encoder + distributional head (+ optional plan head) over one flat buffer."""

from __future__ import annotations

import numpy as np

from ..backend import is_numpy, to_numpy
from .heads import C51Head, IQNHead, PlanHead
from .layers import MLP, Linear
from .params import ParamLayout, Workspace


def _walk(mods):
    for m in mods:
        yield m
        yield from _walk(getattr(m, "children", ()))


#: Head registry (STYLE.md: a dict, not an if/elif chain).
HEADS = {
    "c51": lambda d, kw: C51Head(
        "head", d, kw["n_actions"], kw.get("atoms", 51), tf32=kw.get("tf32", False), gemm=kw.get("gemm", "cublas")
    ),
    "iqn": lambda d, kw: IQNHead(
        "head",
        d,
        kw["n_actions"],
        kw.get("n_quantiles", 32),
        kw.get("n_cos", 64),
        tf32=kw.get("tf32", False),
        gemm=kw.get("gemm", "cublas"),
    ),
}


class QNetwork:
    """Encoder ``[B, n_in] -> psi [B, D]``, then the head, and optionally the plan head on ``psi``.

    Args:
        n_in: input features (the flattened window, ``window * features``).
        hidden: encoder widths; ``layernorm`` inserts LayerNorm before each ReLU.
        head: ``"c51"`` (logits ``[B, A, atoms]``) or ``"iqn"`` (quantiles ``[B, N, A]``).
        plan: add the plan head (conviction, readiness ``[B, 2]``).
        spectral: names of linear layers to spectrally normalise (e.g. ``("enc.1",)``).
        xp, dtype: backend and float type (float64 only on NumPy, for gradient checks).
        max_batch: rows of the default workspace :attr:`ws`.
        seed: Philox seed of the initialisation.
        tf32: let the GEMMs use TF32 tensor cores (GPU).
        gemm: one of :data:`cudarl.nn.layers.GEMMS` (``net.gemm``, docs/config.md): ``"cublas"``
            (GEMM, then the bias/activation kernel), ``"cublaslt"`` (one cuBLASLt GEMM with the
            bias and ReLU in its epilogue), ``"cublaslt_nosplit"`` (the same, one-kernel algorithms
            only) or ``"cudarl"`` (the panel GEMMs where they take the shape); GPU only. Each new
            workspace makes the cuBLASLt plans of its ``max_batch`` before any capture.

    Buffers: :attr:`params` and :attr:`grads`, flat ``[layout.padded_size]``; :attr:`P` and
    :attr:`G` their named views (see :mod:`cudarl.nn.params` for the layout).
    """

    def __init__(
        self,
        n_in: int,
        n_actions: int,
        *,
        hidden=(256, 256),
        head: str = "c51",
        layernorm: bool = False,
        plan: bool = False,
        spectral=(),
        atoms: int = 51,
        n_quantiles: int = 32,
        n_cos: int = 64,
        xp=np,
        dtype=np.float32,
        max_batch: int = 512,
        seed: int = 0,
        tf32: bool = False,
        gemm: str = "cublas",
    ):
        if head not in HEADS:
            raise ValueError(f"head {head!r} not in {sorted(HEADS)}")
        if np.dtype(dtype) != np.float32 and not is_numpy(xp):
            raise ValueError("the GPU backend is float32 only")
        self.xp, self.dtype = xp, np.dtype(dtype)
        self.config = dict(
            n_in=n_in,
            n_actions=n_actions,
            hidden=tuple(hidden),
            head=head,
            layernorm=layernorm,
            plan=plan,
            spectral=tuple(spectral),
            atoms=atoms,
            n_quantiles=n_quantiles,
            n_cos=n_cos,
            tf32=tf32,
            gemm=gemm,
        )
        self.encoder = MLP("enc", n_in, hidden, layernorm=layernorm, tf32=tf32, gemm=gemm)
        self.head = HEADS[head](self.encoder.n_out, self.config)
        self.plan = PlanHead("plan", self.encoder.n_out, tf32=tf32, gemm=gemm) if plan else None
        self.modules = [m for m in (self.encoder, self.head, self.plan) if m is not None]
        self.layout = ParamLayout()
        self._ws_spec: list = []
        for m in self.modules:
            m.declare(self.layout, self._ws_spec)
        self.params = xp.asarray(self.layout.init_host(seed, self.dtype))
        self.grads = xp.zeros(self.layout.padded_size, dtype=self.dtype)
        self.P, self.G = self.layout.views(self.params), self.layout.views(self.grads)
        for m in self.modules:
            m.bind(self.P, self.G, xp)
        self.linears = {lin.name: lin for lin in _walk(self.modules) if isinstance(lin, Linear)}
        unknown = set(spectral) - set(self.linears)
        if unknown:
            raise ValueError(f"spectral: no linear layer named {sorted(unknown)} (have {sorted(self.linears)})")
        for k, name in enumerate(sorted(spectral)):
            self.linears[name].spectral = True
            self.linears[name].alloc_state(xp, self.dtype, seed, 1000 + k)
        self.ws = self.new_workspace(max_batch)

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
        """Make the cuBLASLt plans of a backward over ``batch`` rows before any capture (only
        ``gemm="cublaslt_nosplit"`` and ``"cudarl"``, whose dx falls back to it, have any; GPU)."""
        for lin in self.linears.values():
            lin.prepare_backward(batch)

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

    def forward(self, x, ws: Workspace | None = None, tau=None, raw_head: bool = False) -> dict:
        """x ``[B, n_in]`` -> ``{"q": logits [B, A, atoms] | quantiles [B, N, A], "plan": [B, 2]}``.

        ``raw_head`` (C51 only): ``"q"`` is the head's output before the dueling combine,
        ``va [B, (1 + A) atoms]``; pair it with ``backward(raw_head=True)``."""
        ws = ws or self.ws
        ws.set_batch(x.shape[0])
        ws.x = x  # the input of this workspace's forward, for backward
        psi = self.encoder.forward(x, ws)
        if raw_head and not isinstance(self.head, C51Head):
            raise ValueError(f"raw_head: only the C51 head has a raw output, not {type(self.head).__name__}")
        out = {
            "q": self.head.forward(psi, ws, tau)
            if isinstance(self.head, IQNHead)
            else self.head.forward(psi, ws, raw_head)
        }
        if self.plan is not None:
            out["plan"] = self.plan.forward(psi, ws)
        return out

    def grad_outputs(self, ws: Workspace | None = None, raw_head: bool = False) -> dict:
        """The buffers the loss writes ``dL/d(output)`` into, shaped like :meth:`forward`'s outputs
        (with ``raw_head``: dL/dva ``[B, (1 + A) atoms]``)."""
        ws = ws or self.ws
        if raw_head:
            out = {"q": ws.rows(self.head.raw_grad_name())}
        else:
            out = {"q": ws.rows(self.head.grad_name).reshape(self.forward_shape(ws.batch))}
        if self.plan is not None:
            out["plan"] = ws.rows(self.plan.grad_name)
        return out

    def forward_shape(self, B: int) -> tuple:
        h = self.head
        return (B, h.n_actions, h.atoms) if isinstance(h, C51Head) else (B, h.n_quantiles, h.n_actions)

    def backward(self, x=None, ws: Workspace | None = None, dx=None, raw_head: bool = False) -> None:
        """Overwrite :attr:`grads` from the gradients in :meth:`grad_outputs` (last forward on ``ws``;
        ``raw_head`` as given to :meth:`grad_outputs`)."""
        ws = ws or self.ws
        x = ws.x if x is None else x
        psi = ws.rows(f"{self.encoder.out_name}.out")
        dpsi = ws.rows(f"{self.encoder.out_name}.dout")
        if raw_head:
            self.head.backward(psi, ws, dpsi, accumulate=False, raw=True)
        else:
            self.head.backward(psi, ws, dpsi, accumulate=False)
        if self.plan is not None:
            self.plan.backward(psi, ws, dpsi, accumulate=True)
        self.encoder.backward(x, ws, dx)

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
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
