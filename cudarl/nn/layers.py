"""Layers with hand-written backward passes: Linear (+ fused bias/activation), LayerNorm, MLP.

A layer declares its parameters in a :class:`ParamLayout` and its buffers in a
:class:`Workspace`, is bound to the parameter and gradient views of one flat buffer pair,
then runs ``forward`` / ``backward`` over a workspace without allocating.

Conventions (every layer): ``forward(x, ws)`` writes ``ws[<name>.out]`` ``[B, n_out]``;
the gradient of the loss w.r.t. that output is expected in ``ws[<name>.dout]`` (written by
the layer above or the loss); ``backward(x, ws, dx)`` *overwrites* this layer's parameter
gradients, consumes ``dout`` (it may be overwritten), and writes ``dx`` if one is given
(``accumulate=True`` adds into it instead, for an input shared by two consumers; ``accumulate=<array>``
writes ``dx = <the layer's dx> + <array>``, the addend left as it was: :func:`take_addend`).
ReLU is fused into the epilogue of Linear and of LayerNorm (``act="relu"``).

Linear's forward is a cuBLAS GEMM followed by the bias/activation kernel (``gemm="cublas"``),
or, with ``gemm="cublaslt"`` on the GPU and ``act`` in {identity, relu}, one cuBLASLt GEMM whose
epilogue adds the bias and applies the ReLU (:func:`cudarl.blas.gemm_lt`). Both write the same
``out``, so the backward is the same. The NumPy backend ignores the option (the same math).

A Linear built with ``residual_rows`` adds a residual stream to its output: ``forward(x, ws, residual=h,
out=...)`` writes ``h + x W + b`` (an encoder block's ``h' = h + f(h)``), through cuBLASLt's C operand where the
forward is a cuBLASLt GEMM (:func:`cudarl.blas.gemm_lt`'s ``c``: no separate residual-add launch, no re-read of
the branch's output), else as the GEMM then ``seq.residual_add``: the same sums in the same order on the NumPy
backend, the same to rounding on the GPU.
"""

from __future__ import annotations

import numpy as np

from .. import blas
from ..backend import family
from ..config import NetConfig as _NET
from ..reference import philox
from ..reference.nn import ACTS, IDENTITY, RELU
from ..reference.optim import GN_BLOCKS
from .params import ALIGN, ParamLayout, Workspace, matmul

#: The alignment of every float32 parameter view in bytes (:data:`cudarl.nn.params.ALIGN` elements into a
#: buffer the allocator aligns further): a bias's, in the cuBLASLt plan keys of a forward.
PARAM_ALIGN_BYTES = ALIGN * np.dtype(np.float32).itemsize

#: Linear's GEMMs (``net.gemm``, docs/config.md): cuBLAS then the bias/activation kernel; cuBLASLt with
#: the bias and ReLU in its epilogue; the same limited to one-kernel algorithms for the forward and dx;
#: the panel GEMMs of cuda_src/gemm.cu where they take the shape; or ``cublaslt_nosplit`` with the MLP
#: encoder's layers (and the C51 head's) as one chain launch, and their dx chain as another
#: (:class:`cudarl.nn.QNetwork`).
GEMMS = ("cublas", "cublaslt", "cublaslt_nosplit", "cudarl", "chain")
#: The weight gradients' GEMM algorithm (``net.dw_gemm``, docs/config.md): cuBLAS with its split-K, or
#: one-kernel cuBLASLt (``blas.gemm_lt(split_k=False)``, what a batch of members reproduces).
DW_GEMMS = ("split_k", "one_kernel")
#: ``net.gemm_algo`` -> the one-kernel cuBLASLt GEMMs' algorithm choice (:data:`cudarl.blas.BATCHED_ALGOS`).
GEMM_ALGOS = {"heuristic": "single", "probe": "probe"}
_LT_ACTS = {IDENTITY: "identity", RELU: "relu"}  # the activations cuBLASLt's epilogue applies
#: A dx GEMM that adds into dx (C == D): the heuristic's one-kernel algorithm under any ``gemm_algo``
_IN_PLACE = {"algo": "single"}


def take_addend(dx, accumulate):
    """``(accumulate as a bool, the addend)`` of a backward's ``accumulate`` argument: ``False`` / ``True``
    (add into ``dx`` in place) give themselves and None; an array ``a`` (``dx``'s shape, not overlapping it)
    asks for ``dx = <dx of the layer> + a`` with ``a`` left as it was, so a branch can keep reading it (the extra
    heads' dL/dpsi in Gradient Vaccine's buffer, which the Q head's dx GEMM adds to: no copy node on the step's
    chain): ``(True, a)``. A GEMM that can read it as C (cuBLASLt's, C != D) takes it; the other paths copy
    it into ``dx`` first (:func:`copy_addend`) and add in place, the in-place sum's bits."""
    if isinstance(accumulate, (bool, np.bool_)):
        return bool(accumulate), None
    if accumulate.shape != dx.shape:
        raise ValueError(f"backward: the addend is {tuple(accumulate.shape)}, dx {tuple(dx.shape)}")
    return True, accumulate


def copy_addend(xp, dx, addend) -> None:
    """``dx = addend`` (float32, contiguous; one launch on the GPU): a backward that cannot read the addend
    as its GEMM's C adds into ``dx`` in place after this."""
    family("util", xp).copy_u32(dx.view(np.uint32), addend.view(np.uint32))


class Module:
    """Base: holds the parameter/gradient views and the op tables of the backend once bound."""

    name: str
    #: For a head on psi: whether ``backward(psi, ws, dpsi, accumulate)`` writes dL/dpsi (overwrites it, or with
    #: ``accumulate`` adds to it). False for a probe that leaves the encoder alone (the plan head).
    writes_dpsi: bool = True

    def bind(self, P: dict, G: dict, xp) -> None:
        """Take the parameter and gradient views of the network's flat buffers, and the ``nn``
        family's ops for ``xp`` (:func:`cudarl.backend.family`)."""
        self.P, self.G, self.xp, self.ops = P, G, xp, family("nn", xp)
        for child in getattr(self, "children", ()):
            child.bind(P, G, xp)


class Linear(Module):
    """``out = act(x @ W + b)``. x ``[B, n_in]``, W ``[n_in, n_out]``, b ``[n_out]``, out ``[B, n_out]``.

    Backward: ``dz = dout * act'(out)``, ``dW = x^T dz``, ``db = sum_b dz``, ``dx = dz W^T``.

    With ``spectral=True`` the layer uses ``W_sn = W / sigma``, ``sigma = u^T W v`` estimated by
    one power iteration per forward (Miyato et al. 2018; ``sn_update=False`` freezes u and v,
    e.g. for a gradient check), or, with ``sn_in_forward=False`` (the trainer's networks, whose
    forwards run side by side), only in :meth:`spectral_step`, which the train step runs once per
    update after the optimiser; the forward then reads ``W_sn`` as that step left it. The backward
    holds u and v constant: ``dW = (dW_sn - <dW_sn, W_sn> u v^T) / sigma``. Its state (u, v, sigma
    and scratch) is allocated by :meth:`alloc_state`; ``u`` and ``v`` are part of the network's state dict.

    ``gemm="cublaslt"`` makes the forward one cuBLASLt GEMM with the bias (and ReLU) in its epilogue
    when ``act`` is identity or relu, on the GPU, for an input aligned to 16 bytes; otherwise the
    forward is the cuBLAS GEMM and the bias/activation kernel. :meth:`prepare` makes the cuBLASLt
    plan for a batch size before any capture. ``gemm="cublaslt_nosplit"`` runs the forward and dx
    through cuBLASLt with one-kernel algorithms only; ``gemm="cudarl"`` through the panel GEMMs of
    ``cuda_src/gemm.cu`` where they take the shapes, else as ``cublaslt_nosplit`` (docs/perf-notes.md).

    ``dw_gemm`` picks dW's algorithm under any ``gemm``: ``"split_k"`` (cuBLAS; its heuristic splits K)
    or ``"one_kernel"`` (cuBLASLt without split-K on the GPU for 16-byte aligned float32 operands, else
    cuBLAS); :meth:`prepare_backward` makes its plan. :class:`cudarl.nn.QNetwork` sets the attribute of
    every layer it holds from ``net.dw_gemm``, whichever module built the layer.

    ``residual_rows = k`` makes :meth:`forward` add a residual ``[k R, n_out]`` (its last row of each group of
    k: the top encoder block's last bar of each window; k = 1, every row) to its ``R`` output rows: one cuBLASLt
    GEMM reading it as C where the forward is cuBLASLt's (identity activation, float32, 16-byte aligned
    operands: :meth:`fuses_residual`; the plans :meth:`prepare` makes are the residual ones), else the GEMM
    (cuBLAS, cuBLASLt with a ReLU, or the panel kernel) then ``seq.residual_add``. The backward is the
    Linear's: the residual's gradient is the identity, ``dout`` itself, which the caller reads from there.

    :attr:`fold`: an input gate folded into the weight's rows (the selectivity gate over the MLP's first layer,
    :meth:`cudarl.auxiliary.selectivity.InputGate.fold_into`), or None. Then the GEMMs read the folded weight
    ``fold.weight = diag(s) W`` (:meth:`weight`; the gate writes it, :meth:`QNetwork.forward
    <cudarl.nn.QNetwork.forward>` says when), and right after the dW GEMM, which writes ``dL/d(fold.weight)``,
    ``fold.fold_backward()`` turns it into dL/dW in place and writes the gate's gradient, on the same branch.
    Never with spectral norm.
    """

    def __init__(
        self,
        name: str,
        n_in: int,
        n_out: int,
        act: str = "relu",
        init: str | None = None,
        gain: float = 1.0,
        bias_init=0.0,
        tf32: bool = _NET.tf32,
        rows: int = 1,
        spectral: bool = False,
        gemm: str = _NET.gemm,
        dw_gemm: str = _NET.dw_gemm,
        residual_rows: int | None = None,
    ):
        if act not in ACTS:
            raise ValueError(f"{name}: activation {act!r} not in {sorted(ACTS)}")
        self.name, self.n_in, self.n_out, self.act = name, int(n_in), int(n_out), ACTS[act]
        self.init = init or ("he" if act == "relu" else "xavier")
        self.gain, self.bias_init, self.tf32 = gain, bias_init, tf32
        self.rows = int(rows)  # input rows per sample: IQN's layers see [B * N, n_in]
        self.spectral, self.sn, self.sn_update, self.sn_in_forward = bool(spectral), None, True, True
        self.side = None  # a cudarl.graph.SideStream for the weight gradients (QNetwork.set_side_stream)
        self.fold = None  # an input gate folded into the weight's rows (class docstring)
        if dw_gemm not in DW_GEMMS:
            raise ValueError(f"{name}: dw_gemm {dw_gemm!r} not in {DW_GEMMS}")
        self.dw_gemm = dw_gemm
        #: The one-kernel cuBLASLt GEMMs' algorithm choice (:data:`cudarl.blas.BATCHED_ALGOS`; QNetwork sets it
        #: from ``net.gemm_algo``): ``single``, the heuristic's first; ``probe``, a bitwise-equal faster one.
        self.lt_algo = "single"
        self.set_gemm(gemm)
        if residual_rows is not None and int(residual_rows) < 1:
            raise ValueError(f"{name}: residual_rows must be at least 1, got {residual_rows}")
        #: Rows of the residual per output row that :meth:`forward` adds (None: it takes no residual).
        self.residual_rows = None if residual_rows is None else int(residual_rows)

    def set_gemm(self, gemm: str) -> None:
        """The forward's and dx's GEMMs (``net.gemm``, :data:`GEMMS`) and what follows from them; before any
        plan is made (:meth:`prepare`). :func:`cudarl.nn.network.configure_linear` sets it on every layer a
        network holds, whichever module built it."""
        if gemm not in GEMMS:
            raise ValueError(f"{self.name}: gemm {gemm!r} not in {GEMMS}")
        self.gemm = gemm
        #: The cuBLASLt activation name when the forward can be one fused GEMM, else None.
        self.lt_act = _LT_ACTS.get(self.act) if gemm != "cublas" else None
        #: ``cublaslt_nosplit``: the forward and dx GEMMs through cuBLASLt with one-kernel algorithms
        #: only (no split-K reduction kernels: graph nodes on the chain); dW is ``dw_gemm``'s.
        #: ``cudarl``: the forward and dx through the panel GEMMs of cuda_src/gemm.cu where they can
        #: take the shapes (K, N multiples of 4, aligned, at most panel.MAX_ROWS rows), else as
        #: ``cublaslt_nosplit``.
        #: ``chain``: as ``cublaslt_nosplit`` layer by layer; the network runs its chain of layers in one
        #: launch where it takes them (:meth:`cudarl.nn.QNetwork.forward`), and their dx chain in another
        #: (:meth:`cudarl.nn.QNetwork.backward`).
        self.lt_all = gemm in ("cublaslt_nosplit", "cudarl", "chain")
        self.panel = gemm == "cudarl" and self.act in _LT_ACTS and not self.tf32  # the panel kernels are fp32

    def alloc_state(self, xp, dtype, seed: int, stream_id: int) -> None:
        """Spectral-norm state (call after :meth:`bind`): u ``[n_in]`` (a random unit vector from Philox,
        then one power iteration), v ``[n_out]``, sigma ``[1]``, and scratch for W_sn and its gradient."""
        if not self.spectral:
            return
        u = 2.0 * philox.uniform(seed, 1, stream_id, self.n_in).astype(np.float64) - 1.0
        u /= np.linalg.norm(u)
        z = lambda *s: xp.zeros(s, dtype=dtype)  # noqa: E731
        self.sn = {
            "u": xp.asarray(u.astype(dtype)),
            "v": z(self.n_out),
            "wv": z(self.n_in),
            "sigma": z(1),
            "w": z(self.n_in, self.n_out),
            "dw": z(self.n_in, self.n_out),
            "partial": xp.zeros(GN_BLOCKS, dtype=np.float64),
        }
        self.optim_ops = family("optim", xp)  # the spectral-norm ops live in the optim family
        self.spectral_step(iterate=True)  # v meaningful even if the first forward is frozen; W_sn made

    def share_state(self, other: Linear) -> None:
        """The spectral-norm state of ``other`` (the same layer of the network whose parameters this one's
        shares, :meth:`cudarl.nn.QNetwork.twin`): its u, v, sigma and ``W_sn``, read (only ``other`` moves
        them), and scratch of this layer's own for the backward (dW_sn and the partial sums), so the two
        layers' backwards can run beside each other. The forward reads ``W_sn`` as ``other`` left it."""
        xp, sn = self.xp, other.sn  # after bind
        self.sn = {**sn, "dw": xp.zeros_like(sn["dw"]), "partial": xp.zeros_like(sn["partial"])}
        self.optim_ops = other.optim_ops
        self.sn_in_forward = False

    def spectral_step(self, iterate: bool = True) -> None:
        """One power iteration (``iterate``; else u and v kept) and ``W_sn = W / sigma`` into the layer's
        state: what a forward with ``sn_in_forward`` does first."""
        W, sn = self.P[f"{self.name}.weight"], self.sn
        self.optim_ops.spectral_power_iter(W, sn["u"], sn["v"], sn["wv"], sn["sigma"], 1 if iterate else 0)
        self.optim_ops.spectral_scale(W, sn["sigma"], sn["w"])

    @property
    def grad_name(self) -> str:
        """The workspace buffer of dL/d(out) (so a Linear can serve as an extra head on psi)."""
        return f"{self.name}.dout"

    def weight(self):
        """The weight the GEMMs use: ``W``, ``W_sn`` (after this forward's power iteration), or the folded
        weight ``diag(s) W`` of an input gate folded into it (:attr:`fold`, as its last fold left it)."""
        if self.fold is not None:
            return self.fold.weight
        return self.sn["w"] if self.spectral else self.P[f"{self.name}.weight"]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        layout.add(f"{self.name}.weight", (self.n_in, self.n_out), (self.init, self.gain), decay=True)
        binit = (
            ("values", tuple(self.bias_init))
            if isinstance(self.bias_init, (tuple, list))
            else ("const", self.bias_init)
        )
        layout.add(f"{self.name}.bias", (self.n_out,), binit)
        row = (self.n_out,) if self.rows == 1 else (self.rows, self.n_out)
        ws_spec += [(f"{self.name}.out", row, self.rows > 1), (f"{self.name}.dout", row, self.rows > 1)]

    def fuses_residual(self) -> bool:
        """Whether the residual is cuBLASLt's C in the forward's GEMM (float32 on the GPU with 16-byte aligned
        operands, else the twin's same sums; the panel kernel, where ``gemm="cudarl"`` takes the shape, adds it
        after): a layer with ``residual_rows`` whose forward is a cuBLASLt GEMM with the identity (cuBLASLt would
        apply a ReLU after adding C)."""
        return self.residual_rows is not None and self.lt_act == "identity"

    def _forward_gemm(self, batch: int):
        """``(m, n, k, options)`` of the forward's cuBLASLt GEMM over ``batch`` samples (with the bias in
        its epilogue, and the residual's row pitch ``c_ld`` where :meth:`fuses_residual`), or None where the
        forward has none (``gemm="cublas"``, a sigmoid layer)."""
        if self.lt_act is None:
            return None
        options = {
            "act": self.lt_act,
            "tf32": self.tf32,
            "split_k": not self.lt_all,
            "algo": self._algo(not self.lt_all),
        }
        if self.fuses_residual():  # a packed [k R, n_out] residual's every k-th row: k n_out floats apart
            options["c_ld"] = self.residual_rows * self.n_out
        return batch * self.rows, self.n_out, self.n_in, options

    def _algo(self, split_k: bool) -> str:
        """The algorithm choice of a cuBLASLt GEMM of this layer: :attr:`lt_algo` for a one-kernel one."""
        return "single" if split_k else self.lt_algo

    def forward_plan_keys(self, batch: int) -> list:
        """The :func:`cudarl.blas.plan_key` of each plan :meth:`prepare` makes for ``batch`` samples (none
        without a cuBLASLt forward); needs no binding and no device."""
        g = self._forward_gemm(batch)
        return [] if g is None else [blas.plan_key(g[0], g[1], g[2], bias_align=PARAM_ALIGN_BYTES, **g[3])]

    def prepare(self, batch: int) -> None:
        """Make the cuBLASLt plan of a forward over ``batch`` samples (GPU, ``gemm="cublaslt"``; with its residual
        where :meth:`fuses_residual`); a forward inside a capture needs the plan of its batch size already made
        (:func:`cudarl.blas.gemm_lt`)."""
        bias = self.P[f"{self.name}.bias"]
        g = self._forward_gemm(batch)
        if g is not None and not isinstance(bias, np.ndarray):
            m, n, k, options = g
            blas.gemm_lt_prepare(m, n, k, bias=bias, **options)

    def prepare_backward(self, batch: int) -> None:
        """Make the cuBLASLt plans of a backward over ``batch`` samples (GPU): dx = dz W^T under
        ``gemm="cublaslt_nosplit"`` or ``"cudarl"``, dW = x^T dz under ``dw_gemm="one_kernel"``; a
        backward inside a capture needs them made."""
        if isinstance(self.P[f"{self.name}.bias"], np.ndarray):
            return
        m, one_kernel = batch * self.rows, {"tf32": self.tf32, "split_k": False, "algo": self.lt_algo}
        if self.lt_all:
            blas.gemm_lt_prepare(m, self.n_in, self.n_out, trans_b=True, **one_kernel)
            # dx added in place (C == D): the heuristic's algorithm, not a probed one (a plan a layer)
            blas.gemm_lt_prepare(m, self.n_in, self.n_out, trans_b=True, c_ld=self.n_in, **one_kernel | _IN_PLACE)
        if self.dw_gemm == "one_kernel":
            blas.gemm_lt_prepare(self.n_in, self.n_out, m, trans_a=True, **one_kernel)

    def forward(self, x, ws: Workspace, residual=None, out=None):
        """``out = act(x W + b)``, or with ``residual`` (a layer built with ``residual_rows = k``)
        ``out = residual[k - 1 :: k] + x W + b`` (class docstring: one GEMM reading it as C where
        :meth:`fuses_residual`, else the GEMM then ``seq.residual_add``).

        x ``[R, n_in]`` (``R = B rows``); residual ``[k R, n_out]``, read only, not overlapping ``out``; out
        ``[R, n_out]``, written (default ``ws[<name>.out]``). Returns ``out``."""
        if out is not None and out.shape != (x.shape[0], self.n_out):
            raise ValueError(f"{self.name}: out must be [{x.shape[0]}, {self.n_out}], got {tuple(out.shape)}")
        y = ws.rows(f"{self.name}.out", x.shape[0] // self.rows) if out is None else out
        c = self._residual(residual, y)
        if self.spectral and self.sn_in_forward:
            self.spectral_step(self.sn_update)
        bias = self.P[f"{self.name}.bias"]
        gpu = not isinstance(y, np.ndarray)
        if self.panel and gpu:
            panel = family("gemm", self.xp)
            W = self.weight()
            if x.shape[0] <= panel.MAX_ROWS and panel.eligible(x, W, bias, y, K=self.n_in, N=self.n_out):
                panel.nn_bias_act(x, W, bias, y, self.act)
                return self._add_residual(residual, y)
        split = not self.lt_all
        opts = {"tf32": self.tf32, "split_k": split, "algo": self._algo(split)}
        if c is not None and self.fuses_residual() and y.dtype == np.float32:
            if not gpu or all(t.data.ptr % blas.LT_ALIGN == 0 for t in (x, c, y)):  # the plan prepare made
                blas.gemm_lt(x, self.weight(), y, bias=bias, c=c, **opts)
                return y
        elif self.lt_act is not None and gpu and x.data.ptr % blas.LT_ALIGN == 0:
            blas.gemm_lt(x, self.weight(), y, bias=bias, act=self.lt_act, **opts)
            return self._add_residual(residual, y)
        matmul(x, self.weight(), y, tf32=self.tf32)
        self.ops.bias_act_forward(y, bias, y, self.act)
        return self._add_residual(residual, y)

    def _residual(self, residual, y):
        """The residual's rows that :meth:`forward` adds to ``y`` (its last row of each group of
        ``residual_rows``), or None without one; checks that it is given exactly when the layer was built with
        ``residual_rows`` (its plans are the residual ones)."""
        if (residual is None) != (self.residual_rows is None):
            raise ValueError(
                f"{self.name}: built with residual_rows={self.residual_rows}, so its forward takes "
                f"{'no residual' if self.residual_rows is None else 'a residual'}"
            )
        if residual is None:
            return None
        k = self.residual_rows
        if residual.shape != (k * y.shape[0], self.n_out):
            raise ValueError(
                f"{self.name}: the residual must be [{k * y.shape[0]}, {self.n_out}] ({k} rows for each of the "
                f"{y.shape[0]} outputs), got {tuple(residual.shape)}"
            )
        return residual if k == 1 else residual[k - 1 :: k]

    def _add_residual(self, residual, y):
        """``y += residual`` (its last row of each group) where the GEMM did not add it: seq.residual_add."""
        if residual is not None:
            family("seq", self.xp).residual_add(residual, y, y)
        return y

    def _dx(self, dz, dx, accumulate) -> None:
        """dx (+)= dz W^T (``accumulate`` an array: dx = dz W^T + it, :func:`take_addend`): the panel kernel
        under ``cudarl`` where it can take the call (GPU, no accumulate), else cuBLASLt without split-K under
        ``cublaslt_nosplit`` (GPU, operands aligned as the plans :meth:`prepare_backward` made; ``accumulate``:
        dx as C in place, or the addend as C, one kernel, where cuBLAS's ``beta = 1`` split K into a second,
        docs/perf-notes.md, thirty-second session), else :func:`matmul` (an addend copied into dx first).
        (dW is :meth:`_dw`'s, by ``dw_gemm``.)"""
        W = self.weight()
        gpu = not isinstance(dx, np.ndarray)
        accumulate, addend = take_addend(dx, accumulate)
        if self.panel and gpu and not accumulate:
            panel = family("gemm", self.xp)
            if dz.shape[0] <= panel.MAX_ROWS and panel.eligible(dz, W, dx, K=self.n_out, N=self.n_in, trans_b=True):
                panel.nt(dz, W, dx)
                return
        if self.lt_all and gpu and all(t.data.ptr % blas.LT_ALIGN == 0 for t in (dz, W, dx)):
            if accumulate:  # C == D in place, or the addend as C (the same kernel's sum)
                c = dx if addend is None else addend
                blas.gemm_lt(dz, W, dx, c=c, trans_b=True, tf32=self.tf32, split_k=False, **_IN_PLACE)
            else:
                blas.gemm_lt(dz, W, dx, trans_b=True, tf32=self.tf32, split_k=False, algo=self.lt_algo)
            return
        if addend is not None:
            copy_addend(self.xp, dx, addend)
        matmul(dz, W, dx, trans_b=True, beta=1.0 if accumulate else 0.0, tf32=self.tf32)

    def _dw(self, x, dz, out) -> None:
        """out = x^T dz. ``dw_gemm="one_kernel"``: cuBLASLt without split-K for float32 operands (on the GPU
        aligned to 16 bytes: the plan :meth:`prepare_backward` made; NumPy: the same product as
        :func:`matmul`'s). Else, and for float64 (gradient checks), :func:`matmul`: cuBLAS, whose
        heuristic splits K (the batch) for the step's shapes; one-kernel algorithms took 13-14 us against
        5.5 + 2.5 for the split pair (ncu on an H200 at 3707fef), so it stays the default."""
        if self.dw_gemm == "one_kernel" and out.dtype == np.float32:
            if isinstance(out, np.ndarray) or all(t.data.ptr % blas.LT_ALIGN == 0 for t in (x, dz, out)):
                blas.gemm_lt(x, dz, out, trans_a=True, tf32=self.tf32, split_k=False, algo=self.lt_algo)
                return
        matmul(x, dz, out, trans_a=True, tf32=self.tf32)

    def _weight_grad(self, x, dz, gw) -> None:
        """``gw`` = dL/dW: the dW GEMM (:meth:`_dw`), then, with a folded gate (:attr:`fold`), its backward
        in place (the GEMM gave dL/d(the folded weight)) and the gate's gradient, on the same stream."""
        self._dw(x, dz, gw)
        if self.fold is not None:
            self.fold.fold_backward()

    def backward_grads(self, x, ws: Workspace, bias_beside: bool = False) -> None:
        """The parameter gradients from dz already in ``ws[<name>.dout]`` (the activation's derivative
        applied: by :meth:`backward`, or by the network's dx chain, ``gemm.chain_backward``): dW = x^T dz
        (x ``[B rows, n_in]``), and the bias gradient, a column sum of dz, as the identity's
        ``bias_act_backward``, which only reads dz (it skips its stores when dz is dout). On the layer's
        side branch (:attr:`side`, forked here) where it has one, the bias gradient after dW there, or with
        ``bias_beside`` on the current stream beside it (the first layer, whose bias is all that is left on
        the chain); else both on the current stream, the bias first. Not for a spectrally normalised layer
        (its dW goes through W_sn's backward: :meth:`backward` only)."""
        if self.spectral:
            raise ValueError(f"{self.name}: a spectrally normalised layer's gradients are backward()'s only")
        B = x.shape[0] // self.rows
        y, dy = ws.rows(f"{self.name}.out", B), ws.rows(f"{self.name}.dout", B)
        gb, gw = self.G[f"{self.name}.bias"], self.G[f"{self.name}.weight"]
        if self.side is None:
            self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)
            self._weight_grad(x, dy, gw)
            return
        # The branch reads x and dz, which the main stream only reads from here on (the caller joins
        # before Adam); a folded gate's backward follows dW there (it reads only dW and parameters).
        with self.side.fork():
            self._weight_grad(x, dy, gw)
            if not bias_beside:
                self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)
        if bias_beside:
            self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)

    def backward(self, x, ws: Workspace, dx=None, accumulate=False) -> None:
        B = x.shape[0] // self.rows
        y, dy = ws.rows(f"{self.name}.out", B), ws.rows(f"{self.name}.dout", B)
        gw = self.G[f"{self.name}.weight"]
        if self.side is None or self.spectral:
            self.ops.bias_act_backward(dy, y, dy, self.G[f"{self.name}.bias"], self.act)
            if self.spectral:
                self._dw(x, dy, self.sn["dw"])
            else:
                self._weight_grad(x, dy, gw)
        else:
            # The dx chain only waits for dz: the activation's backward in place (act_backward;
            # nothing with the identity). dW = x^T dz feeds nothing until the optimiser, so it runs
            # on the layer's side branch (backward_grads), and the bias gradient, the identity's
            # bias_act_backward of dz: the same bits as one bias_act_backward. It follows dW on the
            # branch when a dx GEMM holds the chain, else (the first layer) it runs on the chain
            # beside dW.
            if self.act != IDENTITY:
                self.ops.act_backward(dy, y, dy, self.act)
            self.backward_grads(x, ws, bias_beside=dx is None)
        if dx is not None:
            self._dx(dy, dx, accumulate)
        if self.spectral:
            sn = self.sn
            self.optim_ops.spectral_dot_partial(sn["dw"], sn["w"], sn["partial"])
            self.optim_ops.spectral_backward(sn["dw"], sn["u"], sn["v"], sn["sigma"], sn["partial"], gw)


class SplitLinear(Linear):
    """A :class:`Linear` over ``rows`` rows a sample whose first ``head`` output columns are read at each
    sample's last row only: the top SSM block's in-projection, whose z columns (the first E) only its gated
    norm reads, at the last bar (docs/perf-notes.md, session 23). Those columns are computed at the last rows
    only, the others at every row: two GEMMs on views of the weight, the bias and ``.out`` (row pitches:
    :func:`cudarl.blas.gemm_lt`), instead of one over every column; ``.out``'s head columns at the other rows
    are left as they were. The backward reads ``.dout``'s head columns at the last rows only for dW and dx;
    its bias gradient sums every row of ``.dout``, whose head columns at the other rows must hold 0 (the gated
    norm's backward writes them so). Same parameters and buffers as a Linear.

    The split runs for float32 on the CPU and, on the GPU, where the forward is a cuBLASLt GEMM (not
    ``gemm="cublas"``), without spectral norm and with ``rows > 1``; elsewhere the layer is a Linear (the same
    function: a float64 gradient check takes every column)."""

    def __init__(self, name: str, n_in: int, n_out: int, *, head: int, **kw):
        if kw.get("residual_rows") is not None:
            raise ValueError(f"{name}: a SplitLinear takes no residual (its head columns are read at the last rows)")
        super().__init__(name, n_in, n_out, act="identity", **kw)  # (a projection: no activation to split)
        if not 0 < int(head) < self.n_out:
            raise ValueError(f"{name}: head must be 1 to {self.n_out - 1} of the {self.n_out} columns, got {head}")
        self.head = int(head)

    def _splittable(self) -> bool:
        """The shapes and options allow the split: head, n_in and n_out multiples of 4 put every view's rows
        and the tail's bias on 16 bytes (the plans prepare makes assume it; cuBLASLt's bias epilogue needs it)."""
        return not self.spectral and self.rows > 1 and not (self.head % 4 or self.n_in % 4 or self.n_out % 4)

    def _split(self, y) -> bool:
        """Whether a pass over ``y`` (an array of the layer's backend and dtype) splits: float32, on the CPU
        or through cuBLASLt."""
        return self._splittable() and y.dtype == np.float32 and (isinstance(y, np.ndarray) or self.lt_act is not None)

    def _parts(self, x, y, W, bias):
        """``(a, w, b, out)`` of the two GEMMs: every row x the tail columns, the last rows x the head columns."""
        h, last = self.head, slice(self.rows - 1, None, self.rows)
        return (x, W[:, h:], bias[h:], y[:, h:]), (x[last], W[:, :h], bias[:h], y[last, :h])

    def _forward_gemms(self, batch: int) -> list:
        """``(m, n, k, lds)`` of the forward's two GEMMs over ``batch`` samples (row pitches of x, W, out)."""
        h, r, n = self.head, self.rows, self.n_out
        return [(batch * r, n - h, self.n_in, (self.n_in, n, n)), (batch, h, self.n_in, (r * self.n_in, n, r * n))]

    def forward_plan_keys(self, batch: int) -> list:
        g = self._forward_gemm(batch)
        if g is None or not self._splittable():
            return super().forward_plan_keys(batch)
        tail_align = min(PARAM_ALIGN_BYTES, (4 * self.head) & -(4 * self.head))  # bias[head:]'s
        return [
            blas.plan_key(m, n, k, bias_align=al, lds=lds, **g[3])
            for (m, n, k, lds), al in zip(self._forward_gemms(batch), (tail_align, PARAM_ALIGN_BYTES), strict=True)
        ]

    def prepare(self, batch: int) -> None:
        bias = self.P[f"{self.name}.bias"]
        g = self._forward_gemm(batch)
        if g is None or not self._split(bias) or isinstance(bias, np.ndarray):
            return super().prepare(batch)
        for (m, n, k, lds), part in zip(
            self._forward_gemms(batch), (bias[self.head :], bias[: self.head]), strict=True
        ):
            blas.gemm_lt_prepare(m, n, k, bias=part, lds=lds, **g[3])

    def prepare_backward(self, batch: int) -> None:
        bias = self.P[f"{self.name}.bias"]
        if not self._split(bias) or isinstance(bias, np.ndarray):
            return super().prepare_backward(batch)
        h, r, n, k = self.head, self.rows, self.n_out, self.n_in
        one_kernel = {"tf32": self.tf32, "split_k": False, "algo": self.lt_algo}
        if self.lt_all:  # dx = dz[:, h:] W[:, h:]^T (the head part accumulates through cuBLAS)
            blas.gemm_lt_prepare(batch * r, k, n - h, trans_b=True, lds=(n, n, k), **one_kernel)
        if self.dw_gemm == "one_kernel":
            blas.gemm_lt_prepare(k, n - h, batch * r, trans_a=True, lds=(k, n, n), **one_kernel)
            blas.gemm_lt_prepare(k, h, batch, trans_a=True, lds=(r * k, r * n, n), **one_kernel)

    def forward(self, x, ws: Workspace):
        y = ws.rows(f"{self.name}.out", x.shape[0] // self.rows)
        if not self._split(y) or (not isinstance(y, np.ndarray) and x.data.ptr % blas.LT_ALIGN):
            return super().forward(x, ws)
        split = not self.lt_all
        for a, w, b, out in self._parts(x, y, self.weight(), self.P[f"{self.name}.bias"]):
            blas.gemm_lt(a, w, out, bias=b, act="identity", tf32=self.tf32, split_k=split, algo=self._algo(split))
        return y

    def backward(self, x, ws: Workspace, dx=None, accumulate=False) -> None:
        B = x.shape[0] // self.rows
        y, dy = ws.rows(f"{self.name}.out", B), ws.rows(f"{self.name}.dout", B)
        if not self._split(y):
            return super().backward(x, ws, dx, accumulate)
        h, last = self.head, slice(self.rows - 1, None, self.rows)
        gb, gw, W = self.G[f"{self.name}.bias"], self.G[f"{self.name}.weight"], self.weight()

        def grads() -> None:  # the bias sums every row (the head columns' other rows hold 0), then dW by parts
            self.ops.bias_act_backward(dy, y, dy, gb, IDENTITY)
            self._dw(x, dy[:, h:], gw[:, h:])
            self._dw(x[last], dy[last, :h], gw[:, :h])

        if self.side is not None:
            with self.side.fork():
                grads()
        else:
            grads()
        if dx is None:
            return
        accumulate, addend = take_addend(dx, accumulate)
        if addend is not None:
            copy_addend(self.xp, dx, addend)
        tail, w_tail = dy[:, h:], W[:, h:]
        if not isinstance(dx, np.ndarray) and self.lt_all and not accumulate:
            blas.gemm_lt(tail, w_tail, dx, trans_b=True, tf32=self.tf32, split_k=False, algo=self.lt_algo)
        else:
            matmul(tail, w_tail, dx, trans_b=True, beta=1.0 if accumulate else 0.0, tf32=self.tf32)
        matmul(dy[last, :h], W[:, :h], dx[last], trans_b=True, beta=1.0, tf32=self.tf32)  # the head's, at last rows


class LayerNorm(Module):
    """``out = act(gamma * (x - mu) / sqrt(var + eps) + beta)`` over the last axis. x, out ``[B, n]``."""

    def __init__(self, name: str, n: int, act: str = "identity", eps: float = 1e-5):
        self.name, self.n, self.act, self.eps = name, int(n), ACTS[act], float(eps)

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        layout.add(f"{self.name}.gamma", (self.n,), ("const", 1.0))
        layout.add(f"{self.name}.beta", (self.n,), ("const", 0.0))
        ws_spec += [
            (f"{self.name}.out", (self.n,), False),
            (f"{self.name}.dout", (self.n,), False),
            (f"{self.name}.mean", (), False),
            (f"{self.name}.rstd", (), False),
        ]

    def forward(self, x, ws: Workspace):
        B = x.shape[0]
        out = ws.rows(f"{self.name}.out", B)
        self.ops.layernorm_forward(
            x,
            self.P[f"{self.name}.gamma"],
            self.P[f"{self.name}.beta"],
            out,
            ws.rows(f"{self.name}.mean", B),
            ws.rows(f"{self.name}.rstd", B),
            self.eps,
            self.act,
        )
        return out

    def backward(self, x, ws: Workspace, dx=None, accumulate=False) -> None:
        if dx is None or accumulate is not False:
            raise ValueError(f"{self.name}: LayerNorm backward writes dx (no accumulate); give it a buffer")
        B = x.shape[0]
        self.ops.layernorm_backward(
            ws.rows(f"{self.name}.dout", B),
            ws.rows(f"{self.name}.out", B),
            x,
            self.P[f"{self.name}.gamma"],
            ws.rows(f"{self.name}.mean", B),
            ws.rows(f"{self.name}.rstd", B),
            dx,
            self.G[f"{self.name}.gamma"],
            self.G[f"{self.name}.beta"],
            self.act,
        )


class MLP(Module):
    """Encoder over the flattened feature window: ``[B, n_in] -> [B, hidden[-1]]``.

    Each hidden layer is ``Linear -> ReLU`` or, with ``layernorm=True``,
    ``Linear -> LayerNorm -> ReLU`` (the ReLU fused into the LayerNorm kernel).
    """

    def __init__(
        self,
        name: str,
        n_in: int,
        hidden=_NET.hidden,
        layernorm: bool = _NET.layernorm,
        tf32: bool = _NET.tf32,
        gemm: str = _NET.gemm,
    ):
        if not hidden:
            raise ValueError(f"{name}: at least one hidden layer")
        self.name, self.n_in, self.hidden = name, int(n_in), tuple(int(h) for h in hidden)
        self.children: list[Module] = []
        d = self.n_in
        for i, h in enumerate(self.hidden):
            if layernorm:
                self.children.append(Linear(f"{name}.{i}", d, h, act="identity", init="he", tf32=tf32, gemm=gemm))
                self.children.append(LayerNorm(f"{name}.{i}.ln", h, act="relu"))
            else:
                self.children.append(Linear(f"{name}.{i}", d, h, act="relu", tf32=tf32, gemm=gemm))
            d = h
        self.n_out = d

    @property
    def out_name(self) -> str:
        return self.children[-1].name

    def chain_linears(self) -> tuple:
        """The layers from x to psi as one chain of Linears (each reading the one before), or () where a
        LayerNorm sits between them (the encoders' interface: :meth:`cudarl.nn.QNetwork.forward`)."""
        return tuple(self.children) if all(isinstance(c, Linear) for c in self.children) else ()

    @property
    def gate_linear(self) -> Linear:
        """The first Linear: it reads the whole input row ``x [B, n_in]`` (weight row ``r`` for column ``r``), so
        an input gate that scales x's columns folds into its weight's rows (the encoders' interface)."""
        return self.children[0]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        for c in self.children:
            c.declare(layout, ws_spec)

    def forward(self, x, ws: Workspace):
        h = x
        for c in self.children:
            h = c.forward(h, ws)
        return h

    def backward(self, x, ws: Workspace, dx=None) -> None:
        """Gradient of the output expected in ``ws[<out_name>.dout]``; ``dx`` optional ``[B, n_in]``."""
        self._backward(x, ws, 0, dx)

    def _last(self) -> int:
        """The index of the last Linear among :attr:`children` (the last layer begins there)."""
        return max(i for i, c in enumerate(self.children) if isinstance(c, Linear))

    @property
    def last_layer(self) -> tuple:
        """The parameters of the last layer: the last Linear's weight and bias (and its LayerNorm's)."""
        return param_names(self.children[self._last() :])

    @property
    def last_layer_branch(self):
        """The branch on which :meth:`backward` writes every :attr:`last_layer` gradient and nothing after them:
        the last Linear's weight-gradient side stream (its dW GEMM, then its bias's column sums), where that
        Linear is the last child (no LayerNorm after it), has a side stream, is not spectrally normalised and
        is not the first layer (whose bias gradient runs on the calling stream, beside its dW); else None. A
        fork from it (:meth:`cudarl.graph.SideStream.resume`) follows those gradients and not the rest of the
        backward (Gradient Vaccine's sums over ``vaccine_scope = "last"``)."""
        i = self._last()
        lin = self.children[i]
        if i != len(self.children) - 1 or i == 0 or lin.side is None or lin.spectral:
            return None
        return lin.side

    def backward_last(self, x, ws: Workspace) -> None:
        """:meth:`backward` of the last layer only: overwrite its parameters' gradients (:attr:`last_layer`)
        and stop (the other layers' gradients are left as they are; no dx)."""
        self._backward(x, ws, self._last(), None)

    def _backward(self, x, ws: Workspace, stop: int, dx) -> None:
        """The children's backward from the last down to ``stop``; the one at ``stop`` writes ``dx`` if
        ``stop`` is 0, else nothing below it."""
        B = x.shape[0]
        for i in range(len(self.children) - 1, stop - 1, -1):
            c = self.children[i]
            inp = x if i == 0 else ws.rows(f"{self.children[i - 1].name}.out", B)
            below = (
                None if i == stop and stop > 0 else dx if i == 0 else ws.rows(f"{self.children[i - 1].name}.dout", B)
            )
            c.backward(inp, ws, below)


def param_names(modules) -> tuple:
    """The names of the parameters ``modules`` declare, in layout order."""
    layout = ParamLayout()
    for m in modules:
        m.declare(layout, [])
    return tuple(e.name for e in layout.entries)
