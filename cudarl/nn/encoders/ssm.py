"""The selective state-space encoder: Mamba2 blocks (SSD, Dao & Gu 2024) over a window of bars.

One block, pre-norm and residual (``zx = [z | x | B | C | dt_raw]``, see :mod:`cudarl.reference.ssm`):

    u   = RMSNorm(h)                                     seq.rmsnorm_forward
    zx  = u W_in + b_in                                  Linear (cuBLAS)      [B W, 2E + 2GN + H]
    xbc = silu(causal_conv_K([x | B | C]))               ssm.conv_forward     [B W, E + 2GN]
    y   = SSD(x, dt = softplus(dt_raw + dt_bias), A = -exp(A_log), B, C) + D x
                                                         ssm.ssd_forward      [B W, E], chunked
    yn  = RMSNorm(y silu(z))                             seq.gated_rmsnorm_forward (over all E channels,
                                                         also with G > 1; mamba_ssm's is per group)
    h'  = h + yn W_out + b_out                           Linear with the residual (cuBLASLt's C operand,
                                                         or the GEMM then seq.residual_add: Linear.forward)

The top block computes the last bar only: psi reads nothing else of it. Its in-projection and conv still run
over the window (the scan's B, C, dt and x of every bar feed the last bar's state; the in-projection's z columns,
read by the gated norm only, at the last bar: cudarl.nn.SplitLinear), but the scan gives y at the
last bar only (ssm.ssd_last_forward: one row of the chunked scan's triangle, no states), and the gated norm, the
out-projection and the residual add run on one row a sample (their seq ops take the window's last rows). The
blocks below run every bar: the block above reads them all. The numbers are the full stack's last bar up to
rounding (tests/unit/test_encoders.py); the work the top block skips is most of its scan and a W-th of the rest.

With ``tf32`` (``net.tf32``) the chunked scan and its backward run their matrix products on TF32 tensor
cores (ssm.ssd_forward / ssd_backward ``tf32=True``: the ``_tc`` kernels), in the train step and in acting (the
act phase runs the same windowed forward), as the Linears' GEMMs do; the last-bar scans (matrix-vector
products), the one-bar steps and the NumPy twin stay float32 (the twin computes in its dtype).

Acting advances, per environment and layer, the conv state (the last K - 1 inputs) and the scan
state ``[H, P, N]`` one bar at a time (ssm.conv_step, ssm.ssd_step): O(1) per bar, and from zero
state over W bars the same psi as the windowed forward, to rounding (tests/unit/test_encoders.py).

Parameters per block ``<name>.<l>``: ``norm.weight [d]``, ``in_proj.{weight,bias}``, ``conv [K + 1, E + 2GN]``
(K taps then the bias), ``head [3, H]`` (A_log, D, dt_bias), ``gnorm.weight [E]``, ``out_proj.{weight,bias}``.
Initialisation as Mamba2: A in [1, 16] (evenly spaced over heads), D = 1, dt in [1e-3, 1e-1]
(log-spaced) through the inverse softplus, conv taps and bias U(-1/sqrt(K), 1/sqrt(K)).
"""

from __future__ import annotations

import math

import numpy as np

from ...backend import family
from ...config import NetConfig as _NET
from ...reference.seq import n_parts
from ...reference.ssm import n_states
from ..params import ParamLayout, Workspace
from .base import EPS, SequenceEncoder

DT_MIN, DT_MAX, A_MIN, A_MAX = 1e-3, 1e-1, 1.0, 16.0


def head_init(H: int) -> tuple:
    """The initial ``head [3, H]`` rows, flattened: A_log, D, dt_bias (module docstring)."""
    span = np.linspace(0.0, 1.0, H) if H > 1 else np.zeros(1)
    a_log = np.log(A_MIN + (A_MAX - A_MIN) * span)
    dt = np.exp(math.log(DT_MIN) + (math.log(DT_MAX) - math.log(DT_MIN)) * span)
    dt_bias = dt + np.log(-np.expm1(-dt))  # softplus(dt_bias) = dt
    return tuple(np.concatenate([a_log, np.ones(H), dt_bias]).tolist())


class SSMEncoder(SequenceEncoder):
    """Mamba2 encoder ``[B, W, F] -> psi [B, d_model]`` (module docstring).

    Args (besides :class:`SequenceEncoder`'s):
        expand: E = expand * d_model inner channels.
        d_state: N, the state size per group.
        headdim: P, channels per head (H = E / P heads).
        groups: G, groups of heads sharing B and C.
        conv_kernel: K >= 2, taps of the causal conv.
        chunk: Q, chunk length of the training scan.
    """

    def __init__(
        self,
        name: str,
        n_features: int,
        *,
        window: int,
        d_model: int,
        layers: int,
        expand: int,
        d_state: int,
        headdim: int,
        groups: int,
        conv_kernel: int,
        chunk: int,
        tf32: bool = False,
        gemm: str = _NET.gemm,
    ):
        super().__init__(name, n_features, window=window, d_model=d_model, layers=layers, tf32=tf32, gemm=gemm)
        self.E, self.N, self.Ph, self.G = int(expand) * self.d, int(d_state), int(headdim), int(groups)
        self.K, self.Q = int(conv_kernel), int(chunk)
        if min(self.E, self.N, self.Ph, self.G, self.Q) < 1 or self.K < 2:
            raise ValueError(f"{name}: expand, d_state, headdim, groups, chunk must be >= 1 and conv_kernel >= 2")
        if self.E % self.Ph or (self.E // self.Ph) % self.G:
            raise ValueError(f"{name}: {self.E} channels must split into heads of {self.Ph}, in {self.G} groups")
        self.H = self.E // self.Ph  # (self.P is the parameter views, as in every Module)
        self.Cc = self.E + 2 * self.G * self.N
        self.n_proj = self.Cc + self.E + self.H
        self.ns = n_states(self.W, self.Q)
        self.blocks = [f"{name}.{i}" for i in range(self.L)]
        self.top = self.blocks[-1]  # computes the last bar only (module docstring)
        for p in self.blocks:
            top = p == self.top
            self.children += [
                # the top block reads z at the last bar only (its gated norm): SplitLinear computes z there only
                self.linear(f"{p}.in_proj", self.d, self.n_proj, head=self.E if top else None),
                # h' = h + yn W_out + b_out, the residual in the out-projection's GEMM (at the top: the last bar
                # of each sample's W rows of h)
                self.linear(
                    f"{p}.out_proj", self.E, self.d, rows=1 if top else None, residual_rows=self.W if top else 1
                ),
            ]
        self.ssm = None

    def _bind_families(self, xp) -> None:
        self.ssm = family("ssm", xp)

    def _part_row(self) -> int:
        return max(self.W * self.E, (self.K + 1) * self.Cc, 3 * self.H)

    def _declare_blocks(self, layout: ParamLayout, ws_spec: list) -> None:
        W, d, E, H = self.W, self.d, self.E, self.H
        conv_gain = (1.0 / math.sqrt(self.K)) / math.sqrt(6.0 / (self.K + 1))  # he limit = 1/sqrt(K)
        for p in self.blocks:
            lin_in, lin_out = self._block_linears(p)
            layout.add(f"{p}.norm.weight", (d,), ("const", 1.0))
            lin_in.declare(layout, ws_spec)
            layout.add(f"{p}.conv", (self.K + 1, self.Cc), ("he", conv_gain), decay=True)
            layout.add(f"{p}.head", (3, H), ("values", head_init(H)))
            layout.add(f"{p}.gnorm.weight", (E,), ("const", 1.0))
            lin_out.declare(layout, ws_spec)
            Wy = 1 if p == self.top else W  # bars of the scan's output and what follows it
            for buf, row in (
                ("u", (W, d)),
                ("rstd", (W,)),
                ("xbc", (W, self.Cc)),
                ("dt", (W, H)),
                ("y", (Wy, E)),
                ("yn", (Wy, E)),
                ("yrstd", (Wy,)),
                ("h", (Wy, d)),
                ("du", (W, d)),
                ("dyn", (Wy, E)),
                ("dy", (Wy, E)),
                ("dxbc", (W, self.Cc)),
            ):
                ws_spec.append((f"{p}.{buf}", row, True))
            if p != self.top:
                ws_spec.append((f"{p}.states", (H, self.ns, self.Ph, self.N), False))
        ws_spec.append((f"{self.name}.dbc_part", (W, H, 2 * self.N), True))  # one layer's at a time

    def top_dout(self) -> str:
        return f"{self.blocks[-1]}.out_proj.dout"

    def top_h(self, ws: Workspace, B: int):
        return ws.rows(f"{self.blocks[-1]}.h", B)

    def last_linear(self, ws: Workspace | None, B: int):
        p = self.blocks[-1]
        return self._block_linears(p)[1], None if ws is None else ws.rows(f"{p}.yn", B)

    def _block(self, p: str, h, ws: Workspace, lins: dict | None, mix):
        """One block over ``ws``'s batch (a window's bars, or one bar of every environment): ``mix(zx, xbc, y)``
        is the conv and the scan, windowed or one bar."""
        r = lambda n: ws.rows(f"{p}.{n}")  # noqa: E731
        lin_in, lin_out = self._block_linears(p, lins)
        self.norm_forward(h, f"{p}.norm.weight", r("u"), r("rstd"))
        zx = lin_in.forward(r("u"), ws)
        mix(zx, r("xbc"), r("y"))
        self.seq.gated_rmsnorm_forward(r("y"), zx, self.P[f"{p}.gnorm.weight"], r("yn"), r("yrstd"), EPS)
        return lin_out.forward(r("yn"), ws, residual=h, out=r("h"))

    def _blocks_forward(self, h, ws: Workspace, B: int):
        for p in self.blocks:

            def mix(zx, xbc, y, p=p):
                dt, head = ws.rows(f"{p}.dt", B), self.P[f"{p}.head"]
                self.ssm.conv_forward(zx, self.P[f"{p}.conv"], xbc, self.W, self.E)
                if p == self.top:
                    self.ssm.ssd_last_forward(xbc, zx, head, y, dt, self.W, self.N)
                else:
                    states = ws.rows(f"{p}.states", B)
                    self.ssm.ssd_forward(xbc, zx, head, y, dt, states, self.W, self.Q, tf32=self.tf32)

            h = self._block(p, h, ws, None, mix)
        return h

    def _block_linears(self, p: str, table: dict | None = None):
        lins = {lin.name: lin for lin in self.linears} if table is None else table
        return lins[f"{p}.in_proj"], lins[f"{p}.out_proj"]

    def _blocks_backward(self, ws: Workspace, B: int) -> None:
        seq, ssm = self.seq, self.ssm
        for i in range(self.L - 1, -1, -1):
            p = self.blocks[i]
            r = lambda n, p=p: ws.rows(f"{p}.{n}", B)  # noqa: E731
            lin_in, lin_out = self._block_linears(p)
            zx, dzx = ws.rows(f"{p}.in_proj.out", B), ws.rows(f"{p}.in_proj.dout", B)
            lin_out.backward(r("yn"), ws, r("dyn"))  # dL/dh' is out_proj's dout
            part = self.part(ws, n_parts(r("y").shape[0]), self.E)
            seq.gated_rmsnorm_backward(
                r("dyn"), r("y"), zx, self.P[f"{p}.gnorm.weight"], r("yrstd"), r("dy"), dzx, part
            )
            seq.colsum(part, self.G[f"{p}.gnorm.weight"])
            dbc = ws.rows(f"{self.name}.dbc_part", B)
            dhead = self.part(ws, B, 3 * self.H).reshape(B, 3, self.H)
            head = self.P[f"{p}.head"]
            if p == self.top:  # (the gated norm's backward wrote the other bars' z columns of dzx 0)
                ssm.ssd_last_backward(r("dy"), r("xbc"), zx, r("dt"), head, r("dxbc"), dzx, dbc, dhead, self.W)
            else:
                args = (r("dy"), r("xbc"), zx, r("dt"), head, r("states"), r("dxbc"), dzx, dbc, dhead, self.W, self.Q)
                ssm.ssd_backward(*args, tf32=self.tf32)
            ssm.bc_reduce(dbc, r("dxbc"), self.E)
            seq.colsum(dhead.reshape(B, 3 * self.H), self.G[f"{p}.head"])
            part = self.part(ws, n_parts(B), (self.K + 1) * self.Cc)
            ssm.conv_backward(r("dxbc"), zx, self.P[f"{p}.conv"], dzx, part, self.W, self.E)
            seq.colsum(part, self.G[f"{p}.conv"])
            lin_in.backward(r("u"), ws, r("du"))
            h_in = ws.rows(f"{self.blocks[i - 1]}.h" if i else f"{self.embed.name}.out", B)
            below = ws.rows(f"{self.blocks[i - 1]}.out_proj.dout" if i else f"{self.embed.name}.dout", B)
            self.norm_backward(
                r("du"), h_in, f"{p}.norm.weight", r("rstd"), ws.rows(f"{p}.out_proj.dout", B), below, ws
            )

    # --- acting ----------------------------------------------------------------------------------------
    def _state_spec(self, spec: list) -> dict:
        d, E = self.d, self.E
        for p in self.blocks:
            spec += [
                (f"{p}.u", (d,), False),
                (f"{p}.rstd", (), False),
                (f"{p}.xbc", (self.Cc,), False),
                (f"{p}.y", (E,), False),
                (f"{p}.yn", (E,), False),
                (f"{p}.yrstd", (), False),
                (f"{p}.h", (d,), False),
            ]
        dt = self.P[f"{self.out_name}.weight"].dtype
        out = {}
        for p in self.blocks:
            out[f"{p}.conv_state"] = ((self.K - 1, self.Cc), dt)
            out[f"{p}.ssm_state"] = ((self.H, self.Ph, self.N), dt)
        return out

    def _blocks_step(self, state, h, ws: Workspace):
        for p in self.blocks:

            def mix(zx, xbc, y, p=p):
                self.ssm.conv_step(zx, self.P[f"{p}.conv"], state.bufs[f"{p}.conv_state"], xbc, self.E)
                self.ssm.ssd_step(xbc, zx, self.P[f"{p}.head"], state.bufs[f"{p}.ssm_state"], y)

            h = self._block(p, h, ws, self.steps, mix)
        return h
