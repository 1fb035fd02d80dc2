"""Launchers for ``cuda_src/nn.cu`` (twin: ``cudarl/reference/nn.py``, same names and arguments).

Each checks shapes here (dtype and contiguity are checked by ``kernels.launch``), writes only
into the buffers it is given, and never allocates or synchronises: safe inside a capture.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch

_T = 256
_MAX_GRID = 8192  # grid-stride loops cover the rest
_COL_BLOCK = (32, 32)
_BAB_BLOCK = (8, 128)  # nn.cu BAB_TX, BAB_TY


def _grid(n: int) -> int:
    return min(blocks_for(n, _T), _MAX_GRID)


def _shape(where: str, name: str, a, shape: tuple) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def _act(where: str, act: int) -> int:
    if int(act) not in (0, 1, 2):
        raise ValueError(f"{where}: activation code must be 0, 1 or 2, got {act}")
    return int(act)


def bias_act_forward(y, bias, out, act: int) -> None:
    """``out = act(y + bias)``. y, out float32 ``[B, N]`` (may alias); bias ``[N]``."""
    w = "nn.bias_act_forward"
    B, N = y.shape
    _shape(w, "bias", bias, (N,))
    _shape(w, "out", out, (B, N))
    launch(
        "nn",
        "bias_act_forward",
        _grid(B * N),
        _T,
        (y, bias, out, B, N, _act(w, act)),
    )


def bias_act_backward(dout, out, dz, dbias, act: int) -> None:
    """``dz = dout * act'(out)`` ``[B, N]`` (may alias dout); ``dbias = sum_b dz`` ``[N]``."""
    w = "nn.bias_act_backward"
    B, N = dout.shape
    _shape(w, "out", out, (B, N))
    _shape(w, "dz", dz, (B, N))
    _shape(w, "dbias", dbias, (N,))
    launch(
        "nn",
        "bias_act_backward",
        blocks_for(N, _BAB_BLOCK[0]),
        _BAB_BLOCK,
        (dout, out, dz, dbias, B, N, _act(w, act)),
    )


def act_backward(dout, out, dz, act: int) -> None:
    """``dz = dout * act'(out)`` ``[B, N]`` (may alias dout): bias_act_backward without the bias sums."""
    w = "nn.act_backward"
    _shape(w, "out", out, dout.shape)
    _shape(w, "dz", dz, dout.shape)
    launch(
        "nn",
        "act_backward",
        _grid(dout.size),
        _T,
        (dout, out, dz, dout.size, _act(w, act)),
    )


def layernorm_forward(x, gamma, beta, out, mean, rstd, eps: float, act: int) -> None:
    """Row LayerNorm + activation. x, out ``[B, N]``; gamma, beta ``[N]``; mean, rstd ``[B]`` (written)."""
    w = "nn.layernorm_forward"
    B, N = x.shape
    for name, a, s in (
        ("gamma", gamma, (N,)),
        ("beta", beta, (N,)),
        ("out", out, (B, N)),
        ("mean", mean, (B,)),
        ("rstd", rstd, (B,)),
    ):
        _shape(w, name, a, s)
    launch(
        "nn",
        "layernorm_forward",
        blocks_for(32 * B, _T),
        _T,
        (x, gamma, beta, out, mean, rstd, B, N, float(eps), _act(w, act)),
    )


def layernorm_backward_input(dout, out, x, gamma, mean, rstd, dx, act: int) -> None:
    """dx ``[B, N]`` of LayerNorm (see the twin for the equation)."""
    w = "nn.layernorm_backward_input"
    B, N = x.shape
    for name, a, s in (
        ("dout", dout, (B, N)),
        ("out", out, (B, N)),
        ("gamma", gamma, (N,)),
        ("mean", mean, (B,)),
        ("rstd", rstd, (B,)),
        ("dx", dx, (B, N)),
    ):
        _shape(w, name, a, s)
    launch(
        "nn",
        "layernorm_backward_input",
        blocks_for(32 * B, _T),
        _T,
        (dout, out, x, gamma, mean, rstd, dx, B, N, _act(w, act)),
    )


def layernorm_backward_params(dout, out, x, mean, rstd, dgamma, dbeta, act: int) -> None:
    """dgamma, dbeta ``[N]`` of LayerNorm (fixed-order column sums)."""
    w = "nn.layernorm_backward_params"
    B, N = x.shape
    for name, a, s in (
        ("dout", dout, (B, N)),
        ("out", out, (B, N)),
        ("mean", mean, (B,)),
        ("rstd", rstd, (B,)),
        ("dgamma", dgamma, (N,)),
        ("dbeta", dbeta, (N,)),
    ):
        _shape(w, name, a, s)
    launch(
        "nn",
        "layernorm_backward_params",
        blocks_for(N, 32),
        _COL_BLOCK,
        (dout, out, x, mean, rstd, dgamma, dbeta, B, N, _act(w, act)),
    )


def layernorm_backward(dout, out, x, gamma, mean, rstd, dx, dgamma, dbeta, act: int) -> None:
    """Both parts of the LayerNorm backward (two launches)."""
    layernorm_backward_params(dout, out, x, mean, rstd, dgamma, dbeta, act)
    layernorm_backward_input(dout, out, x, gamma, mean, rstd, dx, act)


def dueling_forward(va, logits) -> None:
    """va ``[B, (1+A) Z]`` -> logits ``[B, A, Z]``."""
    B, A, Z = logits.shape
    _shape("nn.dueling_forward", "va", va, (B, (1 + A) * Z))
    launch(
        "nn",
        "dueling_forward",
        _grid(B * Z),
        _T,
        (va, logits, B, A, Z),
    )


def dueling_backward(dlogits, dva, accumulate: bool = False) -> None:
    """dlogits ``[B, A, Z]`` -> dva ``[B, (1+A) Z]`` (``accumulate``: added into dva)."""
    B, A, Z = dlogits.shape
    _shape("nn.dueling_backward", "dva", dva, (B, (1 + A) * Z))
    launch(
        "nn",
        "dueling_backward",
        _grid(B * Z),
        _T,
        (dlogits, dva, B, A, Z, int(bool(accumulate))),
    )


def iqn_sample_tau(tau, counter, seed: int, stream_id: int) -> None:
    """tau float32 ``[B, N]`` from Philox ``(seed, counter[0], stream_id)``; counter uint64 ``[1]`` on the device."""
    _shape("nn.iqn_sample_tau", "counter", counter, (1,))
    n = tau.size
    launch(
        "nn",
        "iqn_sample_tau",
        _grid((n + 3) // 4),
        _T,
        (tau, counter, n, int(seed) & 0xFFFFFFFFFFFFFFFF, int(stream_id) & 0xFFFFFFFF),
    )


def iqn_cos_embed(tau, cos) -> None:
    """tau ``[B, N]`` -> cos ``[B*N, C]``."""
    rows, C = cos.shape
    if tau.size != rows:
        raise ValueError(f"nn.iqn_cos_embed: tau has {tau.size} entries, cos has {rows} rows")
    launch("nn", "iqn_cos_embed", _grid(rows * C), _T, (tau, cos, rows, C))


def iqn_mix_forward(psi, phi, h) -> None:
    """psi ``[B, D]``, phi ``[B*N, D]`` -> h ``[B*N, D]``."""
    B, D = psi.shape
    N = phi.shape[0] // B
    _shape("nn.iqn_mix_forward", "phi", phi, (B * N, D))
    _shape("nn.iqn_mix_forward", "h", h, (B * N, D))
    launch(
        "nn",
        "iqn_mix_forward",
        _grid(B * N * D),
        _T,
        (psi, phi, h, B, N, D),
    )


def iqn_mix_backward(dh, psi, phi, dpsi, dphi) -> None:
    """dh ``[B*N, D]`` -> dpsi ``[B, D]``, dphi ``[B*N, D]``."""
    w = "nn.iqn_mix_backward"
    B, D = psi.shape
    N = phi.shape[0] // B
    for name, a, s in (
        ("dh", dh, (B * N, D)),
        ("phi", phi, (B * N, D)),
        ("dpsi", dpsi, (B, D)),
        ("dphi", dphi, (B * N, D)),
    ):
        _shape(w, name, a, s)
    launch(
        "nn",
        "iqn_mix_backward",
        _grid(B * D),
        _T,
        (dh, psi, phi, dpsi, dphi, B, N, D),
    )


def plan_gate(plan, scale, threshold: float = 0.5) -> None:
    """plan ``[B, 2]`` -> scale ``[B]`` (conviction if readiness >= threshold, else exactly 1)."""
    B = plan.shape[0]
    _shape("nn.plan_gate", "plan", plan, (B, 2))
    _shape("nn.plan_gate", "scale", scale, (B,))
    launch(
        "nn",
        "plan_gate",
        _grid(B),
        _T,
        (plan, scale, B, float(threshold)),
    )


def plan_loss(plan, q, actions, ret, levels, dplan, stats, hurdle: float, threshold: float = 0.5) -> None:
    """The plan head's loss gradient ``dplan [B, 2]`` and ``stats [2]`` (gate open share, mean scale) from
    plan ``[B, 2]``, expected Q ``q [B, A]``, data actions int32 ``[B]``, n-step returns ``ret [B]`` and the
    env's position ``levels [A]``: one block (the twin's docstring has the equations)."""
    B, A = q.shape
    w = "nn.plan_loss"
    for name, a, shp in (
        ("plan", plan, (B, 2)),
        ("actions", actions, (B,)),
        ("ret", ret, (B,)),
        ("levels", levels, (A,)),
        ("dplan", dplan, (B, 2)),
        ("stats", stats, (2,)),
    ):
        _shape(w, name, a, shp)
    launch(
        "nn", "plan_loss", 1, 256, (plan, q, actions, ret, levels, dplan, stats, B, A, float(hurdle), float(threshold))
    )
