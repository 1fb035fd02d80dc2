"""Oracles written from the papers, in float64, for the auxiliary signals, the temporal encoders and
risk-sensitive acting: each test implements the published equation on its own (it never calls the twin
it checks, nor the twin's helpers) and compares the NumPy twin (the CPU backend and every kernel's
parity oracle) with it on random and edge inputs, at tolerances fitting the twin's float32.

Where a twin documents a choice of its own (its docstring states and justifies it), the oracle encodes
that documented variant and says so in the test's docstring.
"""

import numpy as np
import pytest

from cudarl.auxiliary import causal as causal_groups
from cudarl.nn.encoders import AttentionEncoder, SSMEncoder, Standalone
from cudarl.reference import agent as ref_agent
from cudarl.reference import attention as ref_attention
from cudarl.reference import causal as ref_causal
from cudarl.reference import denoise as ref_denoise
from cudarl.reference import env as ref_env
from cudarl.reference import homeostatic as ref_homeo
from cudarl.reference import horizons as ref_horizons
from cudarl.reference import nn as ref_nn
from cudarl.reference import quantile as ref_quantile
from cudarl.reference import risk as ref_risk
from cudarl.reference import selectivity as ref_sel
from cudarl.reference import seq as ref_seq
from cudarl.reference import vaccine as ref_vaccine
from cudarl.testing import finite_difference

F64 = np.float64
F32 = np.float32


# --- small float64 building blocks, from their definitions -------------------------------------------
def _softmax64(x):
    x = np.asarray(x, F64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, F64)))


def _silu64(x):
    x = np.asarray(x, F64)
    return x * _sigmoid64(x)


def _softplus64(x):
    return np.logaddexp(0.0, np.asarray(x, F64))


def _rmsnorm64(x, w, eps):
    """Zhang & Sennrich 2019, eq. 4: ``x / RMS(x) * g`` with ``RMS(x) = sqrt(1/n sum x_i^2)`` (eps inside
    the square root, as every implementation that cites it)."""
    x = np.asarray(x, F64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * np.asarray(w, F64)


# === 1. risk-sensitive acting ========================================================================
def _cvar_rockafellar_uryasev(z, p, alpha):
    """CVaR of the lower tail of a discrete return distribution (atoms z, masses p), float64, by the
    Rockafellar & Uryasev (2000) variational formula written for rewards (the lower tail):
    ``CVaR_alpha(Z) = max_t { t - E[(t - Z)^+] / alpha }``; the objective is concave and piecewise linear
    in t with its kinks at the atoms, so the maximum is at an atom (the alpha-quantile). For discrete
    distributions this is Acerbi & Tasche (2002)'s expected shortfall, the boundary atom counted with
    the part of its mass below alpha."""
    z, p = np.asarray(z, F64), np.asarray(p, F64)
    t = z[:, None]
    obj = z - (p[None, :] * np.maximum(t - z[None, :], 0.0)).sum(axis=1) / alpha
    return obj.max()


def _cvar_quantile_function(theta, alpha):
    """``(1/alpha) int_0^alpha F^-1(u) du`` for the step quantile function that is ``theta_n`` on
    ``[n/N, (n+1)/N)`` (QR-DQN's quantiles at their fixed fractions; Dabney et al. 2018 act on the
    quantile function as learned, unsorted), integrated exactly."""
    N = theta.shape[0]
    lo = np.arange(N) / N
    hi = (np.arange(N) + 1) / N
    length = np.clip(np.minimum(hi, alpha) - lo, 0.0, None)
    return float((length * theta).sum() / alpha)


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1, 0.25, 0.3, 0.37, 0.5, 0.9, 1.0])
def test_c51_cvar_and_mean_std_are_rockafellar_uryasevs_and_the_moments(alpha, rng):
    """C51 acting by CVaR_alpha (Rockafellar & Uryasev 2000; Acerbi & Tasche 2002, the fractional boundary
    atom) and by mean - lambda std, against the float64 definitions; at alpha = 1 CVaR is the mean."""
    n, A, K = 7, 3, 51
    z = np.linspace(-10, 10, K).astype(F32)
    logits = (rng.standard_normal((n, A, K)) * 2.0).astype(F32)
    logits[0, 0] = -40.0  # a point mass and a two-atom case: the tail ends inside an atom
    logits[0, 0, 20] = 0.0
    logits[0, 1] = -40.0
    logits[0, 1, [3, 40]] = [np.log(0.3), np.log(0.7)]
    p = _softmax64(logits)
    got = np.empty((n, A), F32)
    ref_agent.c51_risk(got, logits, z, ref_agent.CVAR, alpha, 0.0)
    want = np.array([[_cvar_rockafellar_uryasev(z, p[i, a], alpha) for a in range(A)] for i in range(n)])
    # float32 masses summed in order, divided by alpha: the error grows like 1/alpha
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * 10 / alpha)
    np.testing.assert_allclose(got[0, 0], z[20], rtol=1e-6)  # a point mass: every CVaR is the atom
    want_two = -10 + 20 * 3 / 50 if alpha <= 0.3 else (0.3 * z[3] + (alpha - 0.3) * z[40]) / alpha
    np.testing.assert_allclose(got[0, 1], want_two, rtol=1e-5, atol=1e-5)
    mean = (p * z).sum(-1)
    if alpha == 1.0:
        np.testing.assert_allclose(got, mean, rtol=1e-5, atol=2e-5)
    for lam in (0.0, 0.5, 2.0):
        ref_agent.c51_risk(got, logits, z, ref_agent.MEAN_STD, alpha, lam)
        std = np.sqrt((p * (z - mean[..., None]) ** 2).sum(-1))
        np.testing.assert_allclose(got, mean - lam * std, rtol=1e-5, atol=3e-5)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.33, 0.5, 1.0])
def test_quantile_cvar_iqn_distortion_and_greedy_ties(alpha, rng):
    """Quantile heads (Dabney et al. 2018, "Implicit Quantile Networks", section 3.1, the distortion
    beta(tau) = alpha tau for CVaR): QR-DQN's fixed quantiles give (1/alpha) int_0^alpha of their step
    quantile function; IQN's fractions tau ~ U[0, 1) mapped to alpha tau, the mean of F^-1 there estimates
    CVaR_alpha (checked on a known F^-1 with a z-test at 5 sigma). Greedy ties: the first maximum."""
    B, N, A = 4, 20, 3
    theta = rng.standard_normal((B, N, A)).astype(F32)
    got = np.empty((B, A), F32)
    ref_agent.quantile_risk(got, theta, ref_agent.CVAR, alpha, 0.0)
    want = np.array([[_cvar_quantile_function(theta[b, :, a].astype(F64), alpha) for a in range(A)] for b in range(B)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 / alpha)
    ref_agent.quantile_risk(got, theta, ref_agent.MEAN_STD, alpha, 1.5)
    th = theta.astype(F64)
    np.testing.assert_allclose(got, th.mean(1) - 1.5 * th.std(1), rtol=1e-5, atol=1e-5)
    # IQN: F^-1(u) = u^2 (a known quantile function): CVaR_alpha = (1/alpha) int_0^alpha u^2 du = alpha^2 / 3
    n = 20000
    tau = ref_quantile.sample_taus(7, 3, 0x1A3, (1, n))
    ref_agent.cvar_taus(tau, alpha)
    assert tau.min() >= 0 and tau.max() < alpha
    q = np.empty((1, 1), F32)
    ref_agent.quantile_mean(q, (tau.astype(F64) ** 2).astype(F32)[:, :, None])
    sd = np.sqrt(alpha**4 / 5 - alpha**4 / 9) / np.sqrt(n)  # std of U^2 alpha^2, U ~ U[0, 1)
    assert abs(float(q[0, 0]) - alpha**2 / 3) < 5 * sd
    # the greedy action: the first of tied maxima (env.act, epsilon 0)
    qv = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]], F32)
    actions = np.full(3, -1, np.int32)
    ref_env.act(actions, qv, np.zeros(1, F32), np.zeros(3, np.uint64), np.ones(1, np.uint64))
    np.testing.assert_array_equal(actions, [1, 0, 1])


# === 2. Gradient Vaccine ==============================================================================
def _gradvac_step(g_main, g_aux, phi_hat, beta):
    """Wang, Tsvetkov, Firat & Cao (ICLR 2021), Algorithm 1 for the pair (i = aux, j = main), float64:
    phi = cos(g_i, g_j); if phi < phi_hat: g_i += |g_i| (phi_hat sqrt(1 - phi^2) - phi sqrt(1 - phi_hat^2))
    / (|g_j| sqrt(1 - phi_hat^2)) g_j; then phi_hat <- (1 - beta) phi_hat + beta phi (eq. 5). The sum of
    the (altered) task gradients is the update."""
    gi, gj = np.asarray(g_aux, F64), np.asarray(g_main, F64)
    ni, nj = np.linalg.norm(gi), np.linalg.norm(gj)
    phi = gi @ gj / (ni * nj)
    new = gi
    if phi < phi_hat:
        coef = ni * (phi_hat * np.sqrt(1 - phi**2) - phi * np.sqrt(1 - phi_hat**2)) / (nj * np.sqrt(1 - phi_hat**2))
        new = gi + coef * gj
    return gj + new, (1 - beta) * phi_hat + beta * phi, phi


def test_gradient_vaccine_is_algorithm_1_over_steps(rng):
    """Gradient Vaccine (Wang et al. 2021, Algorithm 1, eq. 4 and the EMA of eq. 5) over a sequence of
    steps, phi_hat_0 = 0: the twin's dots - control - apply on the flat gradient (documented choice: only
    the auxiliary gradient is altered, toward the main one, over one slice of the parameters) gives the
    oracle's update and target cosine at every step, including a step already above the target."""
    n, lo, hi, beta = 9000, 100, 8900, 0.3
    state = np.zeros(ref_vaccine.STATE, F32)
    phi_hat = 0.0
    for step in range(6):
        gm = rng.standard_normal(n)
        ga = (-0.6 if step % 2 == 0 else 0.9) * gm + rng.standard_normal(n)  # conflicting, then aligned
        full, aux = (gm + ga).astype(F32), ga.astype(F32)
        part = ref_vaccine.dots(full, aux, lo, hi)
        state[...] = ref_vaccine.control(part, state, beta)
        out = ref_vaccine.apply(full, aux, state, lo, hi)
        gm32, ga32 = full.astype(F64) - aux.astype(F64), aux.astype(F64)
        want, new_hat, phi = _gradvac_step(gm32[lo:hi], ga32[lo:hi], phi_hat, beta)
        np.testing.assert_allclose(state[1], phi, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[0], new_hat, rtol=1e-5, atol=1e-6)
        scale = np.abs(want).max()
        np.testing.assert_allclose(out[lo:hi], want, rtol=1e-4, atol=1e-5 * scale)
        np.testing.assert_array_equal(out[:lo], full[:lo])
        np.testing.assert_array_equal(out[hi:], full[hi:])
        if phi >= phi_hat:
            assert state[2] == 0
        phi_hat = new_hat
    # a zero gradient: no correction, and the target moves by the EMA toward phi = 0
    part = ref_vaccine.dots(np.ones(8, F32), np.zeros(8, F32), 0, 8)
    st = ref_vaccine.control(part, np.float32([0.5, 0, 0, 0, 0]), 0.5)
    assert st[2] == 0 and np.isclose(st[0], 0.25)


# === 5. RMSNorm and LayerNorm =========================================================================
def test_rmsnorm_and_layernorm_put_eps_inside_the_root_and_use_the_biased_variance(rng):
    """RMSNorm (Zhang & Sennrich 2019, eq. 4) and LayerNorm (Ba, Kiros & Hinton 2016, eq. 4: mean and
    variance over the n units, 1/n), with eps inside the square root: a large eps tells that apart from
    ``/(sigma + eps)``, and a row of 3 units tells 1/n from 1/(n - 1). Also Mamba2's gated RMSNorm
    (Dao & Gu 2024), ``RMSNorm(y silu(z))``."""
    R, n = 5, 3
    x = (rng.standard_normal((R, n)) * 2 + 0.7).astype(F32)
    w, b = rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)
    for eps in (1e-5, 0.5):
        out, rstd = np.empty_like(x), np.empty(R, F32)
        ref_seq.rmsnorm_forward(x, w, out, rstd, eps)
        np.testing.assert_allclose(out, _rmsnorm64(x, w, eps), rtol=2e-6, atol=1e-6)
        out, mean, rstd = np.empty_like(x), np.empty(R, F32), np.empty(R, F32)
        ref_nn.layernorm_forward(x, w, b, out, mean, rstd, eps, 0)
        x64 = x.astype(F64)
        mu = x64.sum(1, keepdims=True) / n
        var = ((x64 - mu) ** 2).sum(1, keepdims=True) / n
        np.testing.assert_allclose(out, (x64 - mu) / np.sqrt(var + eps) * w + b, rtol=2e-6, atol=2e-6)
    E = 6
    y = rng.standard_normal((R, E)).astype(F32)
    zx = rng.standard_normal((R, E + 4)).astype(F32)
    g = rng.standard_normal(E).astype(F32)
    out, rstd = np.empty_like(y), np.empty(R, F32)
    ref_seq.gated_rmsnorm_forward(y, zx, g, out, rstd, 1e-5)
    np.testing.assert_allclose(out, _rmsnorm64(y * _silu64(zx[:, :E]), g, 1e-5), rtol=2e-6, atol=1e-6)


# === 3. Mamba2 (SSD) and 4. causal attention with RoPE: whole encoders ===============================
EPS_NORM = 1e-5


def _P64(standalone):
    return {k: np.asarray(v, F64) for k, v in standalone.P.items()}


def _causal_conv_silu(inp, conv):
    """A causal depthwise Conv1d with K taps and a bias (PyTorch's cross-correlation, left padding K - 1,
    as Mamba's causal_conv1d), then SiLU. inp ``[W, C]``; conv ``[K + 1, C]`` (K taps, then the bias)."""
    K = conv.shape[0] - 1
    W, C = inp.shape
    pad = np.concatenate([np.zeros((K - 1, C)), inp], axis=0)
    out = np.empty((W, C))
    for t in range(W):
        out[t] = conv[K] + sum(conv[k] * pad[t + k] for k in range(K))
    return _silu64(out)


def _mamba2_psi(P, x, name, L, E, H, N, G, K, norm_groups=1):
    """Mamba2 (Dao & Gu 2024, section 7 and its listing) on one window, float64, sequentially:
    h_0 = x W_e + b_e; per block, u = RMSNorm(h); [z | x | B | C | dt] = u W_in + b_in; [x | B | C] =
    silu(causal_conv([x | B | C])); dt = softplus(dt + dt_bias); A = -exp(A_log) (a scalar per head);
    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t (head h reads group h // (H / G));
    y = RMSNorm(y silu(z)) (over ``norm_groups`` groups of channels); h += y W_out + b_out.
    psi = RMSNorm(h_{W-1}). x ``[W, F]``."""
    W = x.shape[0]
    Pd, GN, Cc = E // H, G * N, E + 2 * G * N
    h = x @ P[f"{name}.embed.weight"] + P[f"{name}.embed.bias"]
    for i in range(L):
        p = f"{name}.{i}"
        u = _rmsnorm64(h, P[f"{p}.norm.weight"], EPS_NORM)
        zx = u @ P[f"{p}.in_proj.weight"] + P[f"{p}.in_proj.bias"]
        z, dt_raw = zx[:, :E], zx[:, E + Cc :]
        xbc = _causal_conv_silu(zx[:, E : E + Cc], P[f"{p}.conv"])
        xs = xbc[:, :E].reshape(W, H, Pd)
        Bg, Cg = xbc[:, E : E + GN].reshape(W, G, N), xbc[:, E + GN :].reshape(W, G, N)
        A_log, D, dt_bias = P[f"{p}.head"]
        dt = _softplus64(dt_raw + dt_bias)
        A = -np.exp(A_log)
        y = np.empty((W, H, Pd))
        for hd in range(H):
            g = hd // (H // G)
            S = np.zeros((Pd, N))
            for t in range(W):
                S = np.exp(dt[t, hd] * A[hd]) * S + dt[t, hd] * np.outer(xs[t, hd], Bg[t, g])
                y[t, hd] = S @ Cg[t, g] + D[hd] * xs[t, hd]
        gated = (y.reshape(W, E) * _silu64(z)).reshape(W, norm_groups, E // norm_groups)
        w = P[f"{p}.gnorm.weight"].reshape(norm_groups, E // norm_groups)
        yn = _rmsnorm64(gated, w, EPS_NORM).reshape(W, E)
        h = h + yn @ P[f"{p}.out_proj.weight"] + P[f"{p}.out_proj.bias"]
    return _rmsnorm64(h[-1], P[f"{name}.norm_f.weight"], EPS_NORM)


def _rope_matrix(m, Dh, base=10000.0):
    """RoFormer (Su et al. 2021), eq. 15: the block-diagonal rotation R^d_{Theta, m}, blocks
    [[cos m theta_i, -sin m theta_i], [sin m theta_i, cos m theta_i]] on the pairs (x_{2i}, x_{2i+1}),
    theta_i = base^(-2 i / d), i = 0 .. d/2 - 1 (the interleaved pairs of the paper)."""
    R = np.zeros((Dh, Dh))
    for i in range(Dh // 2):
        a = m * base ** (-2.0 * i / Dh)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]
    return R


def _transformer_psi(P, x, name, L, H):
    """A pre-norm causal transformer with RoPE, float64: h_0 = x W_e + b_e; per block
    qkv = RMSNorm(h) W_qkv + b; per head q'_t = R_t q_t, k'_s = R_s k_s (RoFormer eq. 15-16),
    a_t = sum_{s <= t} softmax_s(q'_t . k'_s / sqrt(Dh)) v_s (Vaswani et al. 2017, causal);
    h1 = h + a W_o + b_o; h' = h1 + relu(RMSNorm(h1) W_1 + b_1) W_2 + b_2. psi = RMSNorm(h_{W-1})."""
    W = x.shape[0]
    h = x @ P[f"{name}.embed.weight"] + P[f"{name}.embed.bias"]
    d = h.shape[1]
    Dh = d // H
    R = [_rope_matrix(m, Dh) for m in range(W)]
    for i in range(L):
        p = f"{name}.{i}"
        qkv = _rmsnorm64(h, P[f"{p}.norm1.weight"], EPS_NORM) @ P[f"{p}.qkv.weight"] + P[f"{p}.qkv.bias"]
        q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(W, H, Dh) for j in range(3))
        o = np.empty((W, H, Dh))
        for hd in range(H):
            qr = np.stack([R[t] @ q[t, hd] for t in range(W)])
            kr = np.stack([R[s] @ k[s, hd] for s in range(W)])
            for t in range(W):
                s = qr[t] @ kr[: t + 1].T / np.sqrt(Dh)
                e = np.exp(s - s.max())
                o[t, hd] = (e / e.sum()) @ v[: t + 1, hd]
        h1 = h + o.reshape(W, d) @ P[f"{p}.attn_out.weight"] + P[f"{p}.attn_out.bias"]
        m = np.maximum(_rmsnorm64(h1, P[f"{p}.norm2.weight"], EPS_NORM) @ P[f"{p}.fc1.weight"] + P[f"{p}.fc1.bias"], 0)
        h = h1 + m @ P[f"{p}.fc2.weight"] + P[f"{p}.fc2.bias"]
    return _rmsnorm64(h[-1], P[f"{name}.norm_f.weight"], EPS_NORM)


def _ssm(window, chunk, groups):
    return SSMEncoder(
        "enc", 3, window=window, d_model=8, layers=2, expand=2, d_state=3, headdim=4, groups=groups,
        conv_kernel=4, chunk=chunk,
    )  # fmt: skip


def _encoder_case(make, oracle, rng, B=3, W=7):
    """The twin's windowed forward (float64 and float32) and its one-bar acting path at every bar t
    (from a reset state, after bars 0..t), each against the oracle over the same bars."""
    x = rng.standard_normal((B, W, 3))
    s64 = Standalone(make(W), np, F64, seed=5, noise=0.3)
    for dtype, tol in ((F64, 1e-10), (F32, 3e-5)):
        s = Standalone(make(W), np, dtype, params=s64.params)
        P = _P64(s)
        psi = s.enc.forward(x.astype(dtype), s.workspace(B))
        want = np.stack([oracle(P, x[b].astype(dtype).astype(F64), W) for b in range(B)])
        err = np.linalg.norm(psi - want) / np.linalg.norm(want)
        assert err <= tol, f"{dtype.__name__} windowed forward vs oracle: {err:.1e}"
        state = s.enc.new_state(B)
        for t in range(W):
            got = s.enc.step(state, np.ascontiguousarray(x[:, t].astype(dtype))).copy()
            want = np.stack([oracle(P, x[b, : t + 1].astype(dtype).astype(F64), t + 1) for b in range(B)])
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err <= tol, f"{dtype.__name__} acting step at bar {t} vs oracle: {err:.1e}"


@pytest.mark.parametrize("chunk,groups", [(3, 1), (7, 1), (1, 1), (3, 2)])
def test_mamba2_ssd_chunked_and_recurrent_forms_are_the_sequential_recurrence(chunk, groups, rng):
    """Mamba2 SSD (Dao & Gu 2024, "Transformers are SSMs", the selective SSM recurrence of section 3 with
    a scalar A per head, section 7's block: conv, softplus dt with bias, D skip, y silu(z) then RMSNorm,
    residual): the plain sequential recurrence in float64 against the twin's chunked training forward
    (chunks that do and do not divide the window) and its one-bar acting form. With groups > 1 the gated
    RMSNorm normalises over all E channels (the paper allows any norm there; mamba_ssm's reference code
    normalises per group of E / G channels): the oracle follows the twin, as its docstring now states."""
    _encoder_case(
        lambda W: _ssm(W, min(chunk, W), groups),
        lambda P, x, W: _mamba2_psi(P, x, "enc", L=2, E=16, H=4, N=3, G=groups, K=4),
        rng,
    )


def test_causal_attention_with_rope_is_roformers(rng):
    """Causal self-attention with rotary positions (Su et al. 2021, RoFormer, eq. 15-16: interleaved
    pairs (2i, 2i + 1), theta_i = 10000^(-2i/d)), 1/sqrt(d_head) scale, softmax over past positions only,
    pre-norm blocks with a ReLU MLP: windowed forward and the key/value-cache acting step (bars < W)."""
    _encoder_case(
        lambda W: AttentionEncoder("enc", 3, window=W, d_model=8, layers=2, heads=2, mlp_ratio=2),
        lambda P, x, W: _transformer_psi(P, x, "enc", L=2, H=2),
        rng,
    )
    # RoPE's defining property (RoFormer eq. 16): the score depends on positions through m - n only
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    cos, sin = ref_attention.rope_angles(np.arange(12), 8, 10000.0)
    qr, kr = ref_attention.rope(np.stack([q] * 12), cos, sin), ref_attention.rope(np.stack([k] * 12), cos, sin)
    np.testing.assert_allclose(qr[9] @ kr[4], qr[5] @ kr[0], rtol=1e-12)
    np.testing.assert_allclose(qr[9], _rope_matrix(9, 8) @ q, rtol=1e-12, atol=1e-14)


# === 6. the remaining auxiliaries =====================================================================
def _prices(rng, T):
    """Open and close prices of T bars (a positive random walk with large moves, so mirrored returns
    are far from the float32 noise)."""
    o = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, T)))
    c = o * np.exp(rng.normal(0, 0.01, T))
    return o.astype(F32), c.astype(F32)


def _rows(ts, mirror):
    rows = np.zeros((len(ts), 4), F32)  # (bar, mirror, position, hold): cudarl.reference.window
    rows[:, 0], rows[:, 1] = ts, mirror
    return rows


def _future_log_path(o, t, k, mirror):
    """The log equity of a unit position entered at the first fill after decision bar t (open[t + 1]),
    over the next k bars: ``E_j = sum_{i < j} log(1 + s r_i)``, r_i = open[t+2+i] / open[t+1+i] - 1,
    s = -1 in the mirrored market; E_0 = 0. Only prices after the decision are read."""
    o = np.asarray(o, F64)
    r = o[t + 2 : t + 2 + k] / o[t + 1 : t + 1 + k] - 1.0
    return np.concatenate([[0.0], np.cumsum(np.log(1.0 + (-r if mirror else r)))])


def test_multi_horizon_targets_are_future_log_returns_after_the_decision(rng):
    """Multi-horizon returns (UNREAL-style auxiliary prediction, Jaderberg et al. 2017; several horizons,
    Fedus et al. 2019): the target for horizon k is the log return from the first fill after the decision
    bar to k bars later, scaled by 1 / (sigma sqrt(k)) (documented), in the mirrored market for a mirror
    row; a horizon whose last price is past the split's end is masked; loss = w / (B H) sum e^2 and its
    gradient. The oracle reads prices directly (not the env's bar returns)."""
    T, t_end, sigma, w = 60, 50, 0.02, 0.7
    o, c = _prices(rng, T)
    up, down = ref_horizons.future_log_returns(ref_env.bar_returns(o, c, "open"))
    horizons = np.array([1, 3, 8], np.int32)
    hscale = (1.0 / (sigma * np.sqrt(horizons))).astype(F32)
    ts = np.array([0, 5, 17, 40, 41, 44, 46, 47, 48, 30, 12], F32)
    mirror = np.array([0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0], F32)
    B, H = len(ts), len(horizons)
    pred = rng.standard_normal((B, H)).astype(F32)
    loss_per, valid_per, grad, out = np.empty(B, F32), np.empty(B, F32), np.empty((B, H), F32), np.empty(2, F32)
    ref_horizons.loss(pred, _rows(ts, mirror), up, down, horizons, hscale, t_end, w, loss_per, valid_per, grad, out)
    e = np.zeros((B, H))
    for b in range(B):
        t = int(ts[b])
        for h, k in enumerate(horizons):
            if t + 1 + k <= t_end - 1:  # open[t + 1 + k] inside the split
                y = _future_log_path(o, t, int(k), mirror[b])[k] / (sigma * np.sqrt(k))
                e[b, h] = pred[b, h] - y
    np.testing.assert_allclose(grad, 2 * w / (B * H) * e, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(loss_per, w / (B * H) * (e**2).sum(1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(valid_per, (e != 0).mean(1), rtol=1e-6)
    np.testing.assert_allclose(out, [w / (B * H) * (e**2).sum(), (e != 0).mean()], rtol=1e-4)


def test_risk_targets_are_realised_volatility_and_max_drawdown_of_the_next_k_bars(rng):
    """The risk head's targets over the next k bars after the decision (documented variant): realised
    volatility as the root mean square of the k log returns (not demeaned) / sigma, and the maximum
    drawdown of the log-equity path that starts at 0 at the fill (peak-to-trough of log equity, i.e.
    -log(1 - the fractional drawdown)) / (sigma sqrt(k)); masked when the k bars run past the split;
    loss = w / B sum |e|^2. Includes a path that only rises (drawdown 0) and one that falls from the start."""
    T, t_end, k, sigma, w = 60, 55, 6, 0.02, 1.3
    o, c = _prices(rng, T)
    o[11:19] = 100 * 1.01 ** np.arange(8)  # bar 10: prices after the fill only rise
    o[31:39] = 100 * 0.99 ** np.arange(8)  # bar 30: they only fall
    up, down = ref_horizons.future_log_returns(ref_env.bar_returns(o, c, "open"))
    ts = np.array([10, 10, 30, 30, 3, 22, 47, 48, 49, 53], F32)
    mirror = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 0], F32)
    B = len(ts)
    pred = rng.standard_normal((B, 2)).astype(F32)
    loss_per, valid_per, grad, out = np.empty(B, F32), np.empty(B, F32), np.empty((B, 2), F32), np.empty(2, F32)
    ref_risk.loss(pred, _rows(ts, mirror), up, down, k, t_end, 1 / sigma, w, loss_per, valid_per, grad, out)
    e = np.zeros((B, 2))
    for b in range(B):
        t = int(ts[b])
        if t + 1 + k > t_end - 1:
            continue
        E = _future_log_path(o, t, k, mirror[b])
        vol = np.sqrt(np.mean(np.diff(E) ** 2)) / sigma
        dd = max(max(E[: j + 1]) - E[j] for j in range(k + 1)) / (sigma * np.sqrt(k))
        e[b] = pred[b] - [vol, dd]
        if t == 10:
            assert (dd == 0) == (mirror[b] == 0)
    np.testing.assert_allclose(grad, 2 * w / B * e, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss_per, w / B * (e**2).sum(1), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(valid_per, (e != 0).any(1))


def test_denoise_is_masking_noise_and_squared_reconstruction_error(rng):
    """Denoising autoencoder (Vincent, Larochelle, Bengio & Manzagol 2008), documented variant of the
    masking noise: each element zeroed independently with probability p (the paper zeroes a fixed number
    p d of the d components per example; the same expected fraction). Masked elements are 0, the others
    untouched; the masked share is binomial (5-sigma bound) and every update draws a new mask; the loss
    is the mean squared reconstruction error 1 / (B m) sum (x^ - x)^2 with gradient 2 / (B m) (x^ - x)."""
    B, m, p = 64, 150, 0.3
    x = (rng.standard_normal((B, m)) + 3.0).astype(F32)  # no zeros in the clean input
    counter = np.array([5], np.int64)
    out1, out2 = np.empty_like(x), np.empty_like(x)
    ref_denoise.corrupt(x, out1, counter, p, 123, 0xDE)
    kept = out1 != 0
    np.testing.assert_array_equal(out1[kept], x[kept])
    n = x.size
    assert abs((~kept).mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
    recon = rng.standard_normal((B, m)).astype(F32)
    grad, loss_per = np.empty_like(x), np.empty(B, F32)
    ref_denoise.loss(recon, x, grad, loss_per, counter, 1.0 / (B * m))
    assert counter[0] == 6
    ref_denoise.corrupt(x, out2, counter, p, 123, 0xDE)
    assert (out2 != out1).any()
    r64 = recon.astype(F64) - x.astype(F64)
    np.testing.assert_allclose(loss_per.sum(), (r64**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * r64 / (B * m), rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("over", ["features", "positions"])
def test_selectivity_gates_and_their_l1_penalty(over, rng):
    """Selectivity: x'[b, w, c] = sigmoid(l_j) x[b, w, c] with j the feature c (or the bar w), the two
    position columns never gated; penalty lambda (1/J) sum_j sigmoid(l_j), an L1 on the non-negative gates
    (Louizos et al. 2018's relaxed gates, deterministic; documented). The logits' gradient of
    L = sum(R x') + penalty against float64 central differences."""
    B, W, F, l1 = 4, 5, 3, 0.8
    C = F + 2
    J = F if over == "features" else W
    x = rng.standard_normal((B, W * C))
    logit = rng.standard_normal(J)
    R = rng.standard_normal((B, W * C))

    def gated(lg):
        s = _sigmoid64(lg)
        v = x.reshape(B, W, C).copy()
        for w_ in range(W):
            for c_ in range(F):
                v[:, w_, c_] *= s[c_] if over == "features" else s[w_]
        return v.reshape(B, W * C)

    np.testing.assert_allclose(ref_sel.forward(x, logit, W, C, F, over, F64), gated(logit), rtol=1e-13)
    np.testing.assert_allclose(ref_sel.forward(x, logit, W, C, F, over), gated(logit), rtol=1e-6, atol=1e-6)
    assert np.isclose(ref_sel.penalty(logit, l1), l1 * _sigmoid64(logit).sum() / J)
    fd = finite_difference(lambda v: float((R * gated(v)).sum() + l1 * _sigmoid64(v).sum() / J), logit.copy())
    np.testing.assert_allclose(ref_sel.backward(x, R, logit, W, C, F, over, l1, F64), fd, rtol=1e-7, atol=1e-9)


def test_homeostatic_utilisation_is_the_perplexity_share_of_the_batch_mean_atoms(rng):
    """Homeostatic regulariser (documented statistic): u = exp(H(m)) / K, the perplexity (Hill number of
    order 1) of the batch-mean atom distribution m = mean_r softmax(logits_r) over K atoms; 1 for uniform
    use, 1/K for one atom; loss = w (u - u*)^2. The twin's float32 chain (probs - mass - control - grad)
    against the float64 loss and its central-difference gradient."""
    R, K, target, w = 6, 11, 0.8, 2.0
    logits = rng.standard_normal((R, K)) * 1.5

    def loss64(lg):
        m = _softmax64(lg).mean(0)
        u = np.exp(-(m * np.log(m)).sum()) / K
        return w * (u - target) ** 2, u

    p = ref_homeo.probs(logits.astype(F32))
    g, state = ref_homeo.control(ref_homeo.mass(p), target, w)
    grad = ref_homeo.grad(p, g)
    want_loss, want_u = loss64(logits.astype(F32).astype(F64))
    np.testing.assert_allclose(state[:2], [want_loss, want_u], rtol=1e-5)
    lg = logits.astype(F32).astype(F64)
    fd = finite_difference(lambda v: loss64(v)[0], lg)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6 * np.abs(fd).max())
    _, s_uniform = ref_homeo.control(ref_homeo.mass(ref_homeo.probs(np.zeros((3, K), F32))), target, w)
    one = np.full((3, K), -200.0, F32)
    one[:, 4] = 0.0
    _, s_one = ref_homeo.control(ref_homeo.mass(ref_homeo.probs(one)), target, w)
    np.testing.assert_allclose([s_uniform[1], s_one[1]], [1.0, 1.0 / K], rtol=1e-6)


def test_causal_intervention_groups_and_the_penalty_on_the_change_in_q(rng):
    """Causal intervention (documented: Peters et al. 2016 / Arjovsky et al. 2019's invariance, applied as
    a consistency penalty, Mitrovic et al. 2021): do(X_G) swaps the group's columns of every bar with the
    next sample's (mode swap) or adds an offset to them (mode offset), other columns untouched, one group
    a step by a rotating counter; the penalty w mean_{b, a} (Q(x') - Q(x))^2 with Q the C51 expectation
    and the clean Q held fixed: its logits' gradient against float64 central differences; the group's
    sensitivity mean |d|."""
    # the groups' columns by feature name; the two position columns are never intervened on
    names = ["ret_1", "dow_0", "dow_1", "level_0", "hod_2"]
    kept, masks, modes = causal_groups.group_masks(names, ["calendar", "level", "offset"])
    assert kept == ["calendar", "level", "offset"]
    np.testing.assert_array_equal(masks, [[0, 1, 1, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(modes, [ref_causal.SWAP, ref_causal.SWAP, ref_causal.OFFSET])
    assert causal_groups.group_masks(["ret_1"], ["calendar", "level"])[0] == []
    B, W, C = 5, 4, 6
    x = rng.standard_normal((B, W * C)).astype(F32)
    mask = np.array([[0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]], np.int32)
    mode = np.array([ref_causal.SWAP, ref_causal.OFFSET], np.int32)
    v = x.reshape(B, W, C).astype(F64)
    for step, off in ((0, 0.0), (1, 0.25), (2, 0.0)):
        counter = np.array([step], np.int64)
        got = ref_causal.intervene(x, mask, mode, counter, off, W).reshape(B, W, C)
        g = step % 2
        want = v.copy()
        for b in range(B):
            for c_ in np.flatnonzero(mask[g]):
                want[b, :, c_] = v[(b + 1) % B, :, c_] if mode[g] == ref_causal.SWAP else v[b, :, c_] + off
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    A, K, w = 3, 9, 0.6
    z = np.linspace(-2, 2, K)
    logits = rng.standard_normal((B, A, K))
    q_clean = rng.standard_normal((B, A))

    def loss64(lg):
        return w * np.mean(((_softmax64(lg) * z).sum(-1) - q_clean) ** 2)

    d, grad = ref_causal.penalty_c51(logits.astype(F32), q_clean.astype(F32), z.astype(F32), w)
    lg = logits.astype(F32).astype(F64)
    np.testing.assert_allclose(d, (_softmax64(lg) * z).sum(-1) - q_clean.astype(F32), rtol=1e-5, atol=1e-6)
    fd = finite_difference(loss64, lg)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6 * np.abs(fd).max())
    state, counter = np.zeros(2 + 2, F32), np.array([3], np.int64)
    ref_causal.reduce(d, state, counter, w)
    np.testing.assert_allclose(state, [w * np.mean(d.astype(F64) ** 2), 1, 0, np.abs(d.astype(F64)).mean()], rtol=1e-6)
    assert counter[0] == 4
    # quantile heads: Q = mean_n theta (the IQN / QR-DQN expectation), the same penalty
    N = 7
    theta = rng.standard_normal((B, N, A))
    d, grad = ref_causal.penalty_quantile(theta.astype(F32), q_clean.astype(F32), w)
    th = theta.astype(F32).astype(F64)
    fd = finite_difference(lambda v: w * np.mean((v.mean(1) - q_clean.astype(F32)) ** 2), th)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6 * np.abs(fd).max())
