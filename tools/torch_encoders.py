"""PyTorch twins of cudarl's windowed encoders (``cudarl.nn.encoders``) for the benchmarks' PyTorch arms.

The same math and parameter layout as :class:`~cudarl.nn.encoders.SSMEncoder` and
:class:`~cudarl.nn.encoders.AttentionEncoder`, written the way a PyTorch user would: the SSM's scan is the
chunked SSD of Dao & Gu 2024 in einsums (within-chunk decays from a segment sum, chunk states, a recurrence
over chunks), the attention is ``F.scaled_dot_product_attention`` with a causal mask after interleaved RoPE.
:func:`load_cudarl_params` copies cudarl's parameters in (weights stored ``[in, out]`` there), and
:func:`cudarl_grads_like` lays cudarl's gradients out as ``model.parameters()``; tests/unit/test_torch_encoders.py
checks psi and every gradient against the NumPy encoders in float64.

:func:`q_network` is the twin of a whole ``cudarl.nn.QNetwork`` over a windowed encoder: the encoder's twin
(:func:`encoder_twin`, at that encoder's shapes) and the dueling C51 head (``torch_c51.dueling``); the same two
helpers load and lay out its parameters (the head's are cudarl's ``head.va``). tools/bench_step.py's
``step_check`` runs it against cudarl's whole learner pass (loss, KL priorities, gradients).

torch is optional: it is imported inside the functions, so importing this module never needs it.
"""

from __future__ import annotations

import numpy as np


def rms(x, w, eps: float = 1e-5):
    import torch

    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _stack(n_features: int, d: int, layers: int, block):
    """embed, ``layers`` blocks made by ``block(top)``, and psi = RMSNorm of the last bar (cudarl's
    SequenceEncoder). The top block (``top=True``) computes the last bar only, as cudarl's does: the same
    numbers at the last bar, and the same work, so the timings compare like with like."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(n_features, d)
            self.blocks = torch.nn.ModuleList(block(i == layers - 1) for i in range(layers))
            self.norm_f = torch.nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = self.embed(x)
            for blk in self.blocks:
                h = blk(h)
            return rms(h[:, -1], self.norm_f)

    return Encoder()


def ssm_encoder(n_features: int, *, window: int, d_model: int, layers: int, expand: int, d_state: int,
                headdim: int, groups: int, conv_kernel: int, chunk: int):  # fmt: skip
    """The Mamba2 encoder ``x [B, W, F] -> psi [B, d_model]`` (cudarl/nn/encoders/ssm.py)."""
    import torch
    import torch.nn.functional as Fn

    d, E, N, P, G, K, Q = d_model, expand * d_model, d_state, headdim, groups, conv_kernel, chunk
    H = E // P
    Cc = E + 2 * G * N

    class Block(torch.nn.Module):
        def __init__(self, top: bool):
            super().__init__()
            self.top = top
            self.norm = torch.nn.Parameter(torch.ones(d))
            self.in_proj = torch.nn.Linear(d, E + Cc + H)
            self.conv = torch.nn.Parameter(torch.zeros(K + 1, Cc))  # K taps, then the bias (cudarl's layout)
            self.head = torch.nn.Parameter(torch.zeros(3, H))  # A_log, D, dt_bias
            self.gnorm = torch.nn.Parameter(torch.ones(E))
            self.out_proj = torch.nn.Linear(E, d)

        def scan(self, x, dt, Bm, Cm):
            """Chunked SSD. x [B, W, H, P], dt [B, W, H], Bm, Cm [B, W, H, N] -> y [B, W, H, P] (without D x)."""
            Bn, W = x.shape[:2]
            nc = -(-W // Q)
            pad = nc * Q - W  # zero bars after the window: dt = 0 there, so they change nothing before
            if pad:
                x, dt, Bm, Cm = (Fn.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, Bm, Cm))
            A = -torch.exp(self.head[0])
            c = lambda t: t.reshape(Bn, nc, Q, *t.shape[2:])  # noqa: E731
            x, dt, Bm, Cm = c(x), c(dt), c(Bm), c(Cm)
            a = (dt * A).permute(0, 3, 1, 2)  # [B, H, nc, Q]
            cum = torch.cumsum(a, -1)
            seg = cum[..., :, None] - cum[..., None, :]  # cum_t - cum_s
            mask = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
            L = torch.exp(seg.masked_fill(~mask, float("-inf")))
            u = x * dt[..., None]
            y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cm, Bm, L, u)
            states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bm, torch.exp(cum[..., -1:] - cum), u)
            S, ins = torch.zeros_like(states[:, 0]), []
            for k in range(nc):  # the state entering each chunk
                ins.append(S)
                S = torch.exp(cum[:, :, k, -1])[..., None, None] * S + states[:, k]
            y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cm, torch.stack(ins, 1), torch.exp(cum))
            return y.reshape(Bn, nc * Q, H, P)[:, :W]

        def forward(self, h):
            Bn, W, _ = h.shape
            z, xbc, dt_raw = self.in_proj(rms(h, self.norm)).split([E, Cc, H], dim=-1)
            w = self.conv[:K].t().unsqueeze(1)  # [Cc, 1, K]: out[t] = sum_k w[k] in[t - (K - 1) + k]
            xbc = Fn.silu(Fn.conv1d(Fn.pad(xbc.transpose(1, 2), (K - 1, 0)), w, self.conv[K], groups=Cc)).transpose(
                1, 2
            )
            x, Bg, Cg = xbc.split([E, G * N, G * N], dim=-1)
            rep = lambda t: t.reshape(Bn, W, G, N).repeat_interleave(H // G, dim=2)  # noqa: E731
            dt = Fn.softplus(dt_raw + self.head[2])
            x = x.reshape(Bn, W, H, P)
            if self.top:  # the last bar only: y_T = sum_s (C_T . B_s) exp(sum_{s<r<=T} a_r) dt_s x_s + D x_T
                a = dt * -torch.exp(self.head[0])  # [B, W, H]
                suf = torch.flip(torch.cumsum(torch.flip(a, [1]), 1), [1]) - a  # sum_{r > s} a_r
                m = torch.einsum("bhn,bshn->bsh", rep(Cg)[:, -1], rep(Bg)) * torch.exp(suf) * dt
                y = (torch.einsum("bsh,bshp->bhp", m, x) + self.head[1][:, None] * x[:, -1]).reshape(Bn, 1, E)
                return h[:, -1:] + self.out_proj(rms(y * Fn.silu(z[:, -1:]), self.gnorm))
            y = self.scan(x, dt, rep(Bg), rep(Cg)) + self.head[1][:, None] * x
            y = y.reshape(Bn, W, E)
            return h + self.out_proj(rms(y * Fn.silu(z), self.gnorm))

    return _stack(n_features, d, layers, Block)


def attention_encoder(n_features: int, *, window: int, d_model: int, layers: int, heads: int, mlp_ratio: int,
                      rope_base: float = 10000.0):  # fmt: skip
    """The causal transformer encoder ``x [B, W, F] -> psi [B, d_model]`` (cudarl/nn/encoders/attention.py)."""
    import torch
    import torch.nn.functional as Fn

    from cudarl.reference.attention import rope_angles

    d, H = d_model, heads
    Dh = d // H
    cos, sin = rope_angles(np.arange(window), Dh, rope_base)

    class Block(torch.nn.Module):
        def __init__(self, top: bool):
            super().__init__()
            self.top = top
            self.norm1 = torch.nn.Parameter(torch.ones(d))
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.attn_out = torch.nn.Linear(d, d)
            self.norm2 = torch.nn.Parameter(torch.ones(d))
            self.fc1 = torch.nn.Linear(d, mlp_ratio * d)
            self.fc2 = torch.nn.Linear(mlp_ratio * d, d)
            self.register_buffer("cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

        def rope(self, t):
            """Rotate the channel pairs (2i, 2i + 1) of t [B, H, W, Dh] by position."""
            c, s = self.cos.to(t.dtype), self.sin.to(t.dtype)
            t0, t1 = t[..., 0::2], t[..., 1::2]
            return torch.stack((t0 * c - t1 * s, t0 * s + t1 * c), dim=-1).flatten(-2)

        def forward(self, h):
            Bn, W, _ = h.shape
            q, k, v = self.qkv(rms(h, self.norm1)).reshape(Bn, W, 3, H, Dh).permute(2, 0, 3, 1, 4)
            if self.top:  # the last query over every key, and one row a sample after it
                q = self.rope(q)[:, :, -1:]
                o = Fn.scaled_dot_product_attention(q, self.rope(k), v)
                h = h[:, -1:] + self.attn_out(o.transpose(1, 2).reshape(Bn, 1, d))
                return h + self.fc2(torch.relu(self.fc1(rms(h, self.norm2))))
            o = Fn.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
            h = h + self.attn_out(o.transpose(1, 2).reshape(Bn, W, d))
            return h + self.fc2(torch.relu(self.fc1(rms(h, self.norm2))))

    return _stack(n_features, d, layers, Block)


def encoder_twin(enc):
    """The twin (:func:`ssm_encoder` or :func:`attention_encoder`) of the cudarl windowed encoder ``enc``
    (an :class:`~cudarl.nn.encoders.SSMEncoder` or :class:`~cudarl.nn.encoders.AttentionEncoder`), at its shapes."""
    from cudarl.nn.encoders import AttentionEncoder, SSMEncoder
    from cudarl.nn.encoders.attention import ROPE_BASE

    shared = dict(window=enc.W, d_model=enc.d, layers=enc.L)
    if isinstance(enc, SSMEncoder):
        groups = (enc.Cc - enc.E) // (2 * enc.N)  # Cc = E + 2 G N (enc.G is the gradient views once bound)
        return ssm_encoder(enc.F, **shared, expand=enc.E // enc.d, d_state=enc.N, headdim=enc.Ph, groups=groups,
                           conv_kernel=enc.K, chunk=enc.Q)  # fmt: skip
    if isinstance(enc, AttentionEncoder):
        return attention_encoder(enc.F, **shared, heads=enc.H, mlp_ratio=enc.ff // enc.d, rope_base=ROPE_BASE)
    raise TypeError(f"encoder_twin: no twin of {type(enc).__name__} (the windowed encoders only)")


def q_network(net):
    """The twin of the cudarl ``QNetwork`` ``net`` over a windowed encoder with the dueling C51 head: the flat
    observation ``x [B, W F]`` (oldest bar first, each bar its features and the position columns, as the
    encoder reads it) -> ``psi = enc(x [B, W, F])`` -> ``va = psi W_va + b_va`` -> logits ``[B, A, atoms]``.
    Nothing sits between psi and the head in cudarl's network (``QNetwork.forward``); an input gate, extra heads
    on psi and spectral norm would, and are refused. Parameters ``enc.*`` and ``va.*`` (cudarl's ``enc.*`` and
    ``head.va.*``); float32, on the CPU: :func:`load_cudarl_params` copies ``net.P`` in."""
    import torch
    from torch_c51 import dueling

    from cudarl.nn.heads import C51Head

    if not isinstance(net.head, C51Head):
        raise ValueError(f"q_network: the C51 head only, not {type(net.head).__name__}")
    if net.gate is not None or net.extras or any(lin.spectral for lin in net.linears.values()):
        raise ValueError("q_network: no input gate, extra heads or spectral norm (the twin has none)")
    enc, A, K = net.encoder, net.head.n_actions, net.head.atoms

    class QNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = encoder_twin(enc)
            self.va = torch.nn.Linear(enc.d, (1 + A) * K)

        def forward(self, x):
            return dueling(self.va(self.enc(x.reshape(x.shape[0], enc.W, enc.F))), A, K)

    return QNet()


def param_pairs(model, prefix: str = "enc"):
    """(torch parameter, cudarl name, is a Linear weight) in ``model.parameters()`` order, of an encoder twin
    (its names under ``prefix``) or of a :func:`q_network` (``enc.*`` under ``prefix``, ``va.*`` as ``head.va.*``)."""
    out = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "va":  # the Q-network twin's head
            out.append((p, f"head.{name}", parts[-1] == "weight"))
            continue
        if parts[0] == "enc":  # the Q-network twin's encoder
            parts = parts[1:]
        if parts[0] == "blocks":
            parts = parts[1:]  # blocks.<l>.<...> -> <l>.<...>
        cname = ".".join([prefix] + parts)
        linear = parts[-1] == "weight" and p.dim() == 2
        if p.dim() == 1 and parts[-1] not in ("bias",):
            cname += ".weight"  # the RMSNorm weights: cudarl's <norm>.weight
        out.append((p, cname, linear))
    return out


def load_cudarl_params(model, P: dict, prefix: str = "enc") -> None:
    """Copy cudarl's parameter views ``P`` (NumPy or CuPy) into a twin of this module; a shape that differs
    raises (``copy_`` would broadcast it)."""
    import torch

    from cudarl.backend import to_numpy

    with torch.no_grad():
        for p, name, linear in param_pairs(model, prefix):
            v = to_numpy(P[name])
            v = v.T if linear else v
            if tuple(v.shape) != tuple(p.shape):
                raise ValueError(f"load_cudarl_params: {name} is {v.shape} in cudarl, {tuple(p.shape)} in the twin")
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)).to(p.dtype))


def cudarl_grads_like(model, G: dict, prefix: str = "enc") -> list:
    """cudarl's gradient views ``G`` as NumPy arrays in the order and layout of ``model.parameters()``."""
    from cudarl.backend import to_numpy

    return [to_numpy(G[name]).T if linear else to_numpy(G[name]) for _, name, linear in param_pairs(model, prefix)]
