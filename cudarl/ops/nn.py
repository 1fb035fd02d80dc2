"""Launchers for ``cuda_src/nn.cu`` (twin: ``cudarl/reference/nn.py``, same names and arguments).

Each checks shapes here (dtype and contiguity are checked by ``kernels.launch``), writes only
into the buffers it is given, and never allocates or synchronises: safe inside a capture.

The member axis: ``bias_act_backward``, ``act_backward``, ``dueling_forward`` and ``dueling_backward``
also take every array with a leading axis of ``P`` members (a population's agents,
:class:`cudarl.nn.stacked.StackedQNetwork`), each member's entry C-contiguous and the entries any
non-negative number of elements apart: one launch whose ``blockIdx.y`` is the member, entry 0 and the
strides as arguments, so member ``i`` gets the bits of a single launch on its entries.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch

_T = 256
_MAX_GRID = 8192  # grid-stride loops cover the rest
_COL_BLOCK = (32, 32)
_BAB_BLOCK = (8, 128)  # nn.cu BAB_TX, BAB_TY
_MAX_MEMBERS = 65535  # gridDim.y's limit


def _grid(n: int) -> int:
    return min(blocks_for(n, _T), _MAX_GRID)


def _shape(where: str, name: str, a, shape: tuple) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def _members(where: str, *arrays) -> tuple:
    """``(P, entries, strides)`` of ``(array, ndim)`` pairs, ``ndim`` an array's rank without the member
    axis: all of them carry a leading member axis of one length ``P`` (entries: each array's entry 0,
    strides: its member stride in elements), or none does (``P`` 1, the arrays themselves, strides 0)."""
    stacked = [a.ndim == nd + 1 for a, nd in arrays]
    if not any(stacked):
        return 1, tuple(a for a, _ in arrays), (0,) * len(arrays)
    if not all(stacked):
        raise ValueError(
            f"{where}: every array has the member axis or none does, got shapes {[a.shape for a, _ in arrays]}"
        )
    P = arrays[0][0].shape[0]
    if any(a.shape[0] != P for a, _ in arrays) or not 1 <= P <= _MAX_MEMBERS:
        raise ValueError(
            f"{where}: 1 to {_MAX_MEMBERS} members, the same in every array, got {[a.shape for a, _ in arrays]}"
        )
    if any(a.strides[0] < 0 or a.strides[0] % a.itemsize for a, _ in arrays):
        raise ValueError(
            f"{where}: member strides must be non-negative whole elements, got {[a.strides for a, _ in arrays]}"
        )
    return P, tuple(a[0] for a, _ in arrays), tuple(a.strides[0] // a.itemsize for a, _ in arrays)


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
    """``dz = dout * act'(out)`` ``[B, N]`` (may alias dout); ``dbias = sum_b dz`` ``[N]``. With the member
    axis: dout, out, dz ``[P, B, N]``, dbias ``[P, N]``."""
    w = "nn.bias_act_backward"
    P, (dout, out, dz, dbias), strides = _members(w, (dout, 2), (out, 2), (dz, 2), (dbias, 1))
    B, N = dout.shape
    _shape(w, "out", out, (B, N))
    _shape(w, "dz", dz, (B, N))
    _shape(w, "dbias", dbias, (N,))
    s_dout, s_out, s_dz, s_dbias = strides
    launch(
        "nn",
        "bias_act_backward",
        (blocks_for(N, _BAB_BLOCK[0]), P),
        _BAB_BLOCK,
        (dout, out, dz, dbias, B, N, _act(w, act), s_dout, s_out, s_dz, s_dbias),
    )


def act_backward(dout, out, dz, act: int) -> None:
    """``dz = dout * act'(out)`` ``[B, N]`` (may alias dout): bias_act_backward without the bias sums.
    With the member axis: dout, out, dz ``[P, B, N]``."""
    w = "nn.act_backward"
    P, (dout, out, dz), (s_dout, s_out, s_dz) = _members(w, (dout, 2), (out, 2), (dz, 2))
    _shape(w, "out", out, dout.shape)
    _shape(w, "dz", dz, dout.shape)
    launch(
        "nn",
        "act_backward",
        (_grid(dout.size), P),
        _T,
        (dout, out, dz, dout.size, _act(w, act), s_dout, s_out, s_dz),
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
    """va ``[B, (1+A) Z]`` -> logits ``[B, A, Z]`` (with the member axis ``[P, B, (1+A) Z]`` -> ``[P, B, A, Z]``)."""
    P, (va, logits), (s_va, s_logits) = _members("nn.dueling_forward", (va, 2), (logits, 3))
    B, A, Z = logits.shape
    _shape("nn.dueling_forward", "va", va, (B, (1 + A) * Z))
    launch(
        "nn",
        "dueling_forward",
        (_grid(B * Z), P),
        _T,
        (va, logits, B, A, Z, s_va, s_logits),
    )


def dueling_backward(dlogits, dva, accumulate: bool = False) -> None:
    """dlogits ``[B, A, Z]`` -> dva ``[B, (1+A) Z]`` (``accumulate``: added into dva); with the member axis
    ``[P, B, A, Z]`` -> ``[P, B, (1+A) Z]``."""
    P, (dlogits, dva), (s_dlogits, s_dva) = _members("nn.dueling_backward", (dlogits, 3), (dva, 2))
    B, A, Z = dlogits.shape
    _shape("nn.dueling_backward", "dva", dva, (B, (1 + A) * Z))
    launch(
        "nn",
        "dueling_backward",
        (_grid(B * Z), P),
        _T,
        (dlogits, dva, B, A, Z, int(bool(accumulate)), s_dlogits, s_dva),
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
