"""The attention encoder: causal pre-norm transformer blocks with rotary positions over a window of bars.

One block (d = H heads of Dh channels, an MLP of width ``mlp_ratio * d``):

    qkv = RMSNorm(h) W_qkv + b_qkv                       seq.rmsnorm_forward, Linear   [B W, 3 d]
    h1  = h + attention(qkv) W_o + b_o                   attention.forward (fused, RoPE), Linear with the
                                                         residual (cuBLASLt's C operand: Linear.forward)
    h'  = h1 + relu(RMSNorm(h1) W_1 + b_1) W_2 + b_2     Linear (ReLU in its epilogue), Linear with the residual

The fused attention kernel holds one (sample, head)'s whole window in shared memory (W <= 128,
Dh <= 64). The top block computes the last bar only (psi reads nothing else of it): its QKV projection runs
over the window (every bar's key and value), the last query attends to them (attention.last_forward), and
the output projection, the MLP and both residual adds run on one row a sample (the seq ops take the window's
last rows). Acting keeps a key/value cache of the last W bars per environment and layer
(attention.step): O(W) per bar instead of re-encoding the window's W bars.

Parameters per block ``<name>.<l>``: ``norm1.weight``, ``qkv.{weight,bias}``, ``attn_out.{weight,bias}``,
``norm2.weight``, ``fc1.{weight,bias}``, ``fc2.{weight,bias}``.
"""

from __future__ import annotations

import numpy as np

from ...backend import family
from ...config import NetConfig as _NET
from ..params import ParamLayout, Workspace
from .base import SequenceEncoder

#: RoPE's base (Su et al. 2021).
ROPE_BASE = 10000.0
#: The fused kernel's limits: the window and a head's channels fit in shared memory.
MAX_WINDOW, MAX_HEAD_DIM = 128, 64


class AttentionEncoder(SequenceEncoder):
    """Causal transformer encoder ``[B, W, F] -> psi [B, d_model]`` (module docstring).

    Args (besides :class:`SequenceEncoder`'s):
        heads: H; d_model / H must be even and at most 64.
        mlp_ratio: the MLP's hidden width over d_model.
    """

    def __init__(
        self,
        name: str,
        n_features: int,
        *,
        window: int,
        d_model: int,
        layers: int,
        heads: int,
        mlp_ratio: int,
        tf32: bool = False,
        gemm: str = _NET.gemm,
    ):
        super().__init__(name, n_features, window=window, d_model=d_model, layers=layers, tf32=tf32, gemm=gemm)
        self.H = int(heads)
        if self.H < 1 or self.d % self.H:
            raise ValueError(f"{name}: d_model {self.d} does not split into {heads} heads")
        self.Dh, self.ff = self.d // self.H, int(mlp_ratio) * self.d
        if self.Dh % 2 or self.Dh > MAX_HEAD_DIM or self.W > MAX_WINDOW or self.ff < 1:
            raise ValueError(
                f"{name}: head dim {self.Dh} must be even and <= {MAX_HEAD_DIM}, window {self.W} <= {MAX_WINDOW}, "
                f"mlp_ratio >= 1"
            )
        self.blocks = [f"{name}.{i}" for i in range(self.L)]
        self.top = self.blocks[-1]  # computes the last bar only (module docstring)
        d = self.d
        for p in self.blocks:
            rows = 1 if p == self.top else None  # the Linears after the attention: one row a sample at the top
            # attn_out and fc2 add the residual stream in their GEMMs; at the top, attn_out adds the last bar of
            # h's window of W rows a sample
            self.children += [
                self.linear(f"{p}.qkv", d, 3 * d),
                self.linear(f"{p}.attn_out", d, d, rows=rows, residual_rows=self.W if p == self.top else 1),
                self.linear(f"{p}.fc1", d, self.ff, act="relu", rows=rows),
                self.linear(f"{p}.fc2", self.ff, d, rows=rows, residual_rows=1),
            ]
        self.attn = None

    def _bind_families(self, xp) -> None:
        self.attn = family("attention", xp)

    def _lins(self, p: str, table: dict | None = None):
        lins = {lin.name: lin for lin in self.linears} if table is None else table
        return [lins[f"{p}.{n}"] for n in ("qkv", "attn_out", "fc1", "fc2")]

    def _declare_blocks(self, layout: ParamLayout, ws_spec: list) -> None:
        W, d = self.W, self.d
        for p in self.blocks:
            qkv, ao, fc1, fc2 = self._lins(p)
            layout.add(f"{p}.norm1.weight", (d,), ("const", 1.0))
            qkv.declare(layout, ws_spec)
            ao.declare(layout, ws_spec)
            layout.add(f"{p}.norm2.weight", (d,), ("const", 1.0))
            fc1.declare(layout, ws_spec)
            fc2.declare(layout, ws_spec)
            Wo = 1 if p == self.top else W  # bars of the attention's output and what follows it
            for buf, row in (
                ("u1", (W, d)),
                ("rstd1", (W,)),
                ("o", (Wo, d)),
                ("h1", (Wo, d)),
                ("u2", (Wo, d)),
                ("rstd2", (Wo,)),
                ("h", (Wo, d)),
                ("du", (W, d)),
                ("do", (Wo, d)),
            ):
                ws_spec.append((f"{p}.{buf}", row, True))
            if p == self.top:  # the MLP's input gradient: du's rows are the window's, the top's MLP has one
                ws_spec.append((f"{p}.du2", (1, d), True))
            ws_spec.append((f"{p}.lse", (self.H, W) if p != self.top else (self.H,), False))

    def top_dout(self) -> str:
        return f"{self.blocks[-1]}.fc2.dout"

    def top_h(self, ws: Workspace, B: int):
        return ws.rows(f"{self.blocks[-1]}.h", B)

    def last_linear(self, ws: Workspace | None, B: int):
        _, _, fc1, fc2 = self._lins(self.blocks[-1])
        return fc2, None if ws is None else ws.rows(f"{fc1.name}.out", B)

    def _block(self, p: str, h, ws: Workspace, lins: dict | None, attend):
        """One block over ``ws``'s batch (a window's bars, or one bar of every environment): ``attend(qkv, o)``
        is the windowed attention or the cache step."""
        r = lambda n: ws.rows(f"{p}.{n}")  # noqa: E731
        qkv, ao, fc1, fc2 = self._lins(p, lins)
        self.norm_forward(h, f"{p}.norm1.weight", r("u1"), r("rstd1"))
        attend(qkv.forward(r("u1"), ws), r("o"))
        h1 = ao.forward(r("o"), ws, residual=h, out=r("h1"))
        self.norm_forward(h1, f"{p}.norm2.weight", r("u2"), r("rstd2"))
        return fc2.forward(fc1.forward(r("u2"), ws), ws, residual=h1, out=r("h"))

    def _blocks_forward(self, h, ws: Workspace, B: int):
        for p in self.blocks:
            run = self.attn.last_forward if p == self.top else self.attn.forward
            h = self._block(p, h, ws, None, lambda qkv, o, p=p, run=run: run(qkv, o, ws.rows(f"{p}.lse", B), ROPE_BASE))
        return h

    def _blocks_backward(self, ws: Workspace, B: int) -> None:
        for i in range(self.L - 1, -1, -1):
            p = self.blocks[i]
            r = lambda n, p=p: ws.rows(f"{p}.{n}", B)  # noqa: E731
            o = lambda lin: ws.rows(f"{lin.name}.out", B)  # noqa: E731
            dout = lambda lin: ws.rows(f"{lin.name}.dout", B)  # noqa: E731
            qkv, ao, fc1, fc2 = self._lins(p)
            fc2.backward(o(fc1), ws, dout(fc1))  # dL/dh' is fc2's dout
            du2 = r("du2") if p == self.top else r("du")
            fc1.backward(r("u2"), ws, du2)
            self.norm_backward(du2, r("h1"), f"{p}.norm2.weight", r("rstd2"), dout(fc2), dout(ao), ws)
            ao.backward(r("o"), ws, r("do"))  # dL/dh1 is attn_out's dout
            run = self.attn.last_backward if p == self.top else self.attn.backward
            run(r("do"), o(qkv), r("o"), r("lse"), dout(qkv), ROPE_BASE)
            qkv.backward(r("u1"), ws, r("du"))
            h_in = ws.rows(f"{self.blocks[i - 1]}.h" if i else f"{self.embed.name}.out", B)
            below = ws.rows(f"{self.blocks[i - 1]}.fc2.dout" if i else f"{self.embed.name}.dout", B)
            self.norm_backward(r("du"), h_in, f"{p}.norm1.weight", r("rstd1"), dout(ao), below, ws)

    # --- acting ----------------------------------------------------------------------------------------
    def _state_spec(self, spec: list) -> dict:
        d = self.d
        for p in self.blocks:
            spec += [(f"{p}.{n}", (d,), False) for n in ("u1", "o", "h1", "u2", "h")]
            spec += [(f"{p}.rstd1", (), False), (f"{p}.rstd2", (), False)]
        dt = self.P[f"{self.out_name}.weight"].dtype
        out = {"pos": ((), np.int64)}
        for p in self.blocks:
            out[f"{p}.k"] = ((self.H, self.W, self.Dh), dt)
            out[f"{p}.v"] = ((self.H, self.W, self.Dh), dt)
        return out

    def _blocks_step(self, state, h, ws: Workspace):
        b = state.bufs
        for p in self.blocks:
            h = self._block(
                p,
                h,
                ws,
                self.steps,
                lambda qkv, o, p=p: self.attn.step(qkv, b[f"{p}.k"], b[f"{p}.v"], b["pos"], o, ROPE_BASE),
            )
        self.attn.advance(b["pos"])
        return h
