"""The RL core and the evaluation statistics against oracles written from the papers.

Each oracle below is written in float64 from the paper's equations, with loops where the paper
has them, and never calls or copies the twin it checks (``cudarl.reference`` and
``cudarl.evaluate``). Where a twin implements a variant the paper does not (and its docstring says
so), the oracle encodes that documented variant and the test's docstring names the difference.
Mechanisms with an independent oracle test elsewhere are not repeated here (the stationary
bootstrap's law, the PSR by hand and the expected maximum Sharpe: tests/unit/test_statistics.py;
empyrical's metrics: tests/unit/test_evaluate.py).
"""

import math
from statistics import NormalDist

import numpy as np
import pytest

from cudarl.evaluate import metrics, return_statistics
from cudarl.reference import c51 as c51_ref
from cudarl.reference import nn as nn_ref
from cudarl.reference import optim as optim_ref
from cudarl.reference import popart as popart_ref
from cudarl.reference import quantile as quantile_ref
from cudarl.replay import PrioritizedReplay


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- 1. C51 ----------------------------------------------------------------------------------------------------
def _n_step_oracle(rewards, terminal, gamma):
    """``R = sum_{k<n} gamma^k r_{t+k}`` up to and including the first terminal, and the bootstrap discount
    ``gamma^n`` (0 after a terminal): Sutton & Barto's n-step return as Rainbow (Hessel et al. 2018, eq. 2)
    uses it."""
    B, n = rewards.shape
    R, d = np.zeros(B), np.zeros(B)
    for b in range(B):
        done = False
        for k in range(n):
            R[b] += gamma**k * float(rewards[b, k])
            if terminal[b, k]:
                done = True
                break
        d[b] = 0.0 if done else gamma**n
    return R, d


def _project_oracle(p, r, d, z):
    """Algorithm 1 of Bellemare, Dabney & Munos (2017), one sample at a time, in float64.

    The paper's loop loses ``p_j`` when ``b_j`` is an integer (``l = u``: both shares are 0); the twin's
    docstring (``c51_chain.project``) states that it gives all of ``p_j`` to that atom, the usual fix, so
    the oracle does too."""
    K = len(z)
    v_min, v_max = float(z[0]), float(z[-1])
    dz = (v_max - v_min) / (K - 1)
    m = np.zeros(K)
    for j in range(K):
        tz = min(max(float(r) + float(d) * float(z[j]), v_min), v_max)
        b = (tz - v_min) / dz
        lo, up = math.floor(b), math.ceil(b)
        if lo == up:
            m[lo] += p[j]
        else:
            m[lo] += p[j] * (up - b)
            m[up] += p[j] * (b - lo)
    return m


def _dueling_oracle(va, A, K):
    """Wang et al. (2016) eq. 9, per atom (Rainbow's dueling C51): ``V + A - mean_a A``: ``[B, A, K]``."""
    va = np.asarray(va, np.float64)
    B = va.shape[0]
    V = va[:, :K]
    adv = va[:, K:].reshape(B, A, K)
    return V[:, None, :] + adv - adv.mean(axis=1, keepdims=True)


def _c51_oracle(va_tm1, va_on, va_tg, a, w, z, R, d):
    """Per-sample cross-entropy, weighted mean loss, KL priority, target m and a* in float64."""
    B = va_tm1.shape[0]
    K = len(z)
    A = va_tm1.shape[1] // K - 1
    z64 = np.asarray(z, np.float64)
    q_on = (_softmax64(_dueling_oracle(va_on, A, K)) * z64).sum(-1)  # online Q at s_{t+1}
    a_star = q_on.argmax(axis=1)  # van Hasselt et al. (2016): select with the online net
    p_tg = _softmax64(_dueling_oracle(va_tg, A, K))  # ... evaluate with the target net
    logits = _dueling_oracle(va_tm1, A, K)
    ce, kl, ms = np.zeros(B), np.zeros(B), np.zeros((B, K))
    for b in range(B):
        m = _project_oracle(p_tg[b, a_star[b]], R[b], d[b], z64)
        x = logits[b, a[b]]
        logp = x - x.max() - math.log(np.exp(x - x.max()).sum())
        ce[b] = -(m * logp).sum()
        kl[b] = sum(mk * (math.log(mk) - lp) for mk, lp in zip(m, logp, strict=True) if mk > 0)
        ms[b] = m
    return ce, float((np.asarray(w, np.float64) * ce).sum() / B), kl, ms, a_star, q_on


def _c51_inputs(rng, B, A, K, n, gamma):
    z = np.linspace(-10, 10, K).astype(np.float32)
    dz = 20.0 / (K - 1)
    width = (1 + A) * K
    va = [(rng.normal(size=(B, width)) * 1.5).astype(np.float32) for _ in range(3)]
    rewards = rng.uniform(-3, 3, (B, n)).astype(np.float32)
    terminal = np.zeros((B, n), np.float32)
    terminal[1, 0] = 1  # a terminal at the first step: the rest of the window is ignored, no bootstrap
    terminal[2, n - 1] = 1  # a terminal at the last step: every reward counts, no bootstrap
    rewards[3] = [60.0] + [0.0] * (n - 1)  # every atom clipped to v_max
    rewards[4] = [-60.0] + [0.0] * (n - 1)  # every atom clipped to v_min
    rewards[5] = [2 * dz] + [0.0] * (n - 1)  # terminal at a grid point: a point mass on one atom
    terminal[5, 0] = 1
    rewards[6] = [10.0] + [0.0] * (n - 1)  # terminal exactly at v_max
    terminal[6, 0] = 1
    rewards[7] = [-10.0] + [0.0] * (n - 1)  # terminal exactly at v_min
    terminal[7, 0] = 1
    a = rng.integers(0, A, B).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, B).astype(np.float32)
    return z, va, rewards, terminal, a, wts


def test_c51_targets_and_loss_follow_bellemare_algorithm_1_with_double_dqn_and_dueling():
    """Bellemare, Dabney & Munos (2017), Algorithm 1 (categorical projection, cross-entropy loss), with the
    n-step return and discount gamma^n (Hessel et al. 2018, eq. 2), terminal transitions, atoms clipped at
    and landing on both ends of the support, double-DQN action selection (van Hasselt et al. 2016, eq. 4:
    argmax with the online net, distribution of the target net) and the dueling combine (Wang et al. 2016,
    eq. 9, V + A - mean A, per atom as in Rainbow). Priority "kl" is KL(m || p) (Hessel et al. 2018, sec. 3,
    "Prioritized replay"). Documented deviation encoded: Algorithm 1's l = u case gives the atom all of p_j.
    Twin: ``cudarl.reference.c51.targets_loss`` (what the agent runs) and ``n_step``; float32 against float64.
    """
    rng = np.random.default_rng(20170721)
    B, A, K, n, gamma = 24, 3, 51, 3, 0.99
    z, (va_tm1, va_on, va_tg), rewards, terminal, a, wts = _c51_inputs(rng, B, A, K, n, gamma)

    R, d = _n_step_oracle(rewards, terminal, gamma)
    r_tw, d_tw = c51_ref.n_step(rewards, terminal, np.float32(gamma))
    np.testing.assert_allclose(r_tw, R, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(d_tw, d, rtol=1e-6, atol=0)
    assert d[1] == d[2] == 0 and R[1] == pytest.approx(rewards[1, 0])

    R32, d32 = R.astype(np.float32), d.astype(np.float32)
    ce, loss, kl, m, a_star, q_on = _c51_oracle(va_tm1, va_on, va_tg, a, wts, z, R32, d32)
    q_sorted = np.sort(q_on, axis=1)
    assert (q_sorted[:, -1] - q_sorted[:, -2]).min() > 1e-4  # no near ties: float32 picks the same a*

    m_tw, _, a_tw, loss_per, loss_tw, prio_tw, _ = c51_ref.targets_loss(
        va_tm1, va_on, va_tg, a, wts, z, R32, d32, priority="kl"
    )
    np.testing.assert_array_equal(a_tw, a_star)
    # float32 rounds the grid position (r + d z - v_min) / dz, below K, to about K * 2^-24: a share moves by that
    tol = 4 * K * 2.0**-24
    np.testing.assert_allclose(m_tw, m, rtol=0, atol=tol)
    np.testing.assert_allclose(m_tw.sum(1), 1.0, atol=1e-5)
    log_range = 20.0  # |log p| of these logits stays below it: a share's error moves a loss by at most tol times it
    np.testing.assert_allclose(loss_per, ce, rtol=1e-5, atol=log_range * tol)
    assert float(loss_tw) == pytest.approx(loss, rel=1e-5, abs=log_range * tol)
    np.testing.assert_allclose(prio_tw, kl, rtol=1e-5, atol=log_range * tol)
    # the edge rows, by hand
    assert m[3, -1] == pytest.approx(1.0) and m[4, 0] == pytest.approx(1.0)
    assert m[5, K // 2 + 2] == pytest.approx(1.0) and m[6, -1] == 1.0 and m[7, 0] == 1.0

    _, _, _, _, _, ce_tw, _ = c51_ref.targets_loss(va_tm1, va_on, va_tg, a, wts, z, R32, d32, priority="ce")
    np.testing.assert_allclose(ce_tw, ce, rtol=1e-5, atol=log_range * tol)


def test_c51_gradient_is_the_derivative_of_the_papers_loss():
    """Bellemare et al. (2017), Algorithm 1's loss ``-sum_i m_i log p_i(x_t, a_t)`` (target held constant),
    importance-weighted and averaged over the batch (Schaul et al. 2016, Algorithm 1 line 12), through the
    dueling combine (Wang et al. 2016, eq. 9): the twin's ``dva`` against central differences of the float64
    oracle's loss."""
    rng = np.random.default_rng(9)
    B, A, K, n, gamma = 8, 3, 7, 1, 0.9
    z, (va_tm1, va_on, va_tg), rewards, terminal, a, wts = _c51_inputs(rng, B, A, K, n, gamma)
    R, d = _n_step_oracle(rewards, terminal, gamma)
    R32, d32 = R.astype(np.float32), d.astype(np.float32)
    dva = c51_ref.targets_loss(va_tm1, va_on, va_tg, a, wts, z, R32, d32)[6]
    base = va_tm1.astype(np.float64)
    h = 1e-6
    num = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        hi, lo = base.copy(), base.copy()
        hi[i] += h
        lo[i] -= h
        num[i] = _c51_oracle(hi, va_on, va_tg, a, wts, z, R, d)[1] - _c51_oracle(lo, va_on, va_tg, a, wts, z, R, d)[1]
        num[i] /= 2 * h
    np.testing.assert_allclose(dva, num, rtol=0, atol=2e-6)


# --- 2. Prioritized replay ------------------------------------------------------------------------------------
def test_prioritized_replay_samples_p_alpha_and_weights_by_the_batch_max_with_annealed_beta():
    """Schaul, Quan, Antonoglou & Silver (2016), eq. 1 ``P(i) = p_i^alpha / sum_k p_k^alpha`` with the
    proportional priority ``p_i = |delta_i| + eps`` (sec. 3.3), importance weights ``w_j = (N P(j))^-beta``
    normalised by ``1 / max_i w_i`` (sec. 3.4, Algorithm 1 line 10) and beta annealed linearly from beta_0
    to 1. New transitions enter with the largest priority seen (Algorithm 1 line 6). Documented choices the
    oracle encodes (``cudarl/reference/replay/__init__.py``): the max is over the sampled batch (Algorithm
    1 weights a minibatch; Dopamine and baselines use the whole buffer's minimum probability instead), and
    "largest seen" is the running maximum ever written (baselines' ``max_priority``). Sampling frequencies
    by a chi-square test (threshold: mean + 5 sd of chi^2 with C - 2 degrees of freedom; the stratified
    sampler is less variable than the multinomial the threshold assumes)."""
    C, alpha, eps, beta0, beta_steps = 64, 0.6, 1e-3, 0.4, 50
    rb = PrioritizedReplay(
        C, 1, n_step=1, alpha=alpha, eps=eps, beta0=beta0, beta_final=1.0, beta_steps=beta_steps, backend="numpy"
    )
    rng = np.random.default_rng(2016)
    rb.add(rng.normal(size=(C, 1)).astype(np.float32), np.zeros(C, np.int32), np.zeros(C, np.float32),
           np.full(C, 0.9, np.float32))  # fmt: skip
    ready = C - 1  # n = 1: the newest row waits for its next state
    td = (rng.standard_normal(ready) * np.exp(rng.uniform(-3, 2, ready))).astype(np.float32)
    td[5] = 0.0  # only eps is left
    rb.update_priorities(np.arange(ready, dtype=np.int32), td)
    p_alpha = (np.abs(td.astype(np.float64)) + eps) ** alpha
    np.testing.assert_allclose(rb.priorities()[:ready], p_alpha, rtol=1e-6)

    # a row that becomes ready enters with the largest priority written so far (here the initial 1.0 or a td)
    rb.add(np.zeros((1, 1), np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, np.float32))
    newest = max(1.0, p_alpha.max())
    assert rb.priorities()[ready] == pytest.approx(newest, rel=1e-6)
    p_alpha = np.concatenate([p_alpha, [newest]])  # slots 0 .. C - 1
    P = np.zeros(C)  # slot 0 now holds the row just added, not ready: slots 1 .. C - 1 can be drawn
    P[1:] = p_alpha[1:] / p_alpha[1:].sum()
    N = C - 1  # rows that can be sampled

    B, draws = 32, 300
    counts = np.zeros(C)
    for t in range(draws):
        idx, w = rb.sample(B)
        idx, w = np.array(idx), np.array(w)
        counts += np.bincount(idx, minlength=C)
        beta = beta0 + (1.0 - beta0) * min(1.0, t / beta_steps)
        raw = (N * P[idx]) ** -beta
        np.testing.assert_allclose(w, raw / raw.max(), rtol=2e-6)
    assert counts[0] == 0
    expected = B * draws * P[1:]
    chi2 = ((counts[1:] - expected) ** 2 / expected).sum()
    dof = C - 2
    assert chi2 < dof + 5 * math.sqrt(2 * dof), chi2


def test_replay_gathers_the_n_step_return_and_gamma_n_per_environment():
    """The n-step target's inputs as the learner gets them from the replay (Hessel et al. 2018, eq. 2:
    ``R = sum_{k<n} gamma^k r_{t+k}``, bootstrap ``gamma^n`` from ``s_{t+n}``; Sutton 1988), for
    environments interleaved time-major, an episode end inside the window cutting the return and the
    bootstrap, and the state ``s_{t+n}`` of the same environment. Twin: ``PrioritizedReplay.gather`` on
    NumPy (``cudarl/reference/replay/nstep.py``)."""
    C, E, n, gamma, T = 64, 3, 3, 0.97, 12
    rng = np.random.default_rng(1988)
    rb = PrioritizedReplay(C, 2, n_step=n, n_envs=E, backend="numpy")
    r = rng.normal(size=(T, E)).astype(np.float32)
    end = rng.uniform(size=(T, E)) < 0.2  # the episode ended after this step
    obs = rng.normal(size=(T, E, 2)).astype(np.float32)
    act = rng.integers(0, 3, (T, E)).astype(np.int32)
    rb.add(obs.reshape(-1, 2), act.reshape(-1), r.reshape(-1), np.where(end, 0.0, gamma).astype(np.float32).reshape(-1))
    rows = np.arange((T - n) * E, dtype=np.int32)  # the ready ones
    batch = rb.gather(rows)
    for a in rows:
        t, e = divmod(int(a), E)
        R, disc = 0.0, gamma**n
        for k in range(n):
            R += gamma**k * float(r[t + k, e])
            if end[t + k, e]:
                disc = 0.0
                break
        assert float(batch.ret[a]) == pytest.approx(R, rel=1e-6, abs=1e-6)
        assert float(batch.discount[a]) == pytest.approx(disc, rel=1e-6)
        np.testing.assert_array_equal(batch.obs[a], obs[t, e])
        np.testing.assert_array_equal(batch.next_obs[a], obs[t + n, e])
        assert int(batch.action[a]) == act[t, e]


# --- 3. IQN -----------------------------------------------------------------------------------------------------
def test_iqn_quantile_huber_loss_is_dabney_eq_3_and_10():
    """Dabney, Ostrovski, Silver & Munos (2018), eq. 3 ``rho^kappa_tau(u) = |tau - 1{u < 0}| L_kappa(u) / kappa``
    with the Huber loss ``L_kappa`` (``u^2 / 2`` inside kappa, ``kappa (|u| - kappa / 2)`` outside), and the
    loss ``(1 / N') sum_{i<N} sum_{j<N'} rho^kappa_{tau_i}(delta_ij)`` with ``delta_ij = T_j - Z_{tau_i}`` (the
    display under eq. 3; a sum over the N online quantiles, a mean over the N' targets), the target
    ``T_j = r + gamma^n Z'_{tau'_j}(x', a*)`` with ``a*`` the online net's mean (double DQN). kappa = 0 is the
    quantile regression loss (Dabney et al. 2018, QR-DQN eq. 8). The cosine embedding is
    ``cos(pi i tau), i = 0 .. n - 1`` (eq. 4). Twin: ``cudarl.reference.quantile`` and ``nn.iqn_cos_embed``."""
    rng = np.random.default_rng(1806)
    B, N, M, A = 6, 8, 5, 3
    theta = rng.normal(size=(B, N, A)).astype(np.float32) * 2
    on = rng.normal(size=(B, M, A)).astype(np.float32)
    on[:, :, 1] += 1.0  # a clear online argmax (mean over quantiles) per row ...
    on[::2, :, 2] += 2.5  # ... action 2 on even rows
    tg = rng.normal(size=(B, M, A)).astype(np.float32) * 3
    r = rng.uniform(-1, 1, B).astype(np.float32)
    d = np.array([0.97, 0.0, 0.97, 0.97, 0.0, 0.97], np.float32)
    a = rng.integers(0, A, B).astype(np.int32)
    w = rng.uniform(0.2, 1, B).astype(np.float32)
    tau = rng.uniform(0, 1, (B, N)).astype(np.float32)

    a_star = on.astype(np.float64).mean(axis=1).argmax(axis=1)
    T = np.array([[float(r[b]) + float(d[b]) * float(tg[b, j, a_star[b]]) for j in range(M)] for b in range(B)])
    T_tw, a_tw = quantile_ref.targets(on, tg, r, d)
    np.testing.assert_array_equal(a_tw, a_star)
    np.testing.assert_allclose(T_tw, T, rtol=1e-6, atol=1e-6)

    def rho(u, t, kappa):
        weight = abs(t - (1.0 if u < 0 else 0.0))
        if kappa == 0:
            return weight * abs(u)
        huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
        return weight * huber / kappa

    for kappa in (1.0, 0.5, 0.0):
        per = np.zeros(B)
        for b in range(B):
            for i in range(N):
                for j in range(M):
                    per[b] += rho(T_tw[b, j] - float(theta[b, i, a[b]]), float(tau[b, i]), kappa)
            per[b] /= M
        per_tw, mean_tw, _ = quantile_ref.huber_loss(theta, a, T_tw, tau, w, kappa=kappa)
        np.testing.assert_allclose(per_tw, per, rtol=2e-6, atol=1e-6)
        assert float(mean_tw) == pytest.approx(float((w * per).sum() / B), rel=2e-6)

    C = 64
    cos = np.empty((B * N, C), np.float32)
    nn_ref.iqn_cos_embed(tau, cos)
    want = np.array([[math.cos(math.pi * i * float(t)) for i in range(C)] for t in tau.reshape(-1)])
    np.testing.assert_allclose(cos, want, rtol=0, atol=1e-7)


def test_risk_acting_cvar_is_the_mean_of_the_quantile_function_below_alpha():
    """CVaR_alpha = (1 / alpha) int_0^alpha F^-1(u) du (Rockafellar & Uryasev 2000; Acerbi & Tasche 2002), the
    risk measure Dabney et al. (2018, sec. 3.1) act on, and the mean - lambda sd measure: the oracle integrates
    each distribution's quantile function numerically on a grid of 2^16 midpoints (the categorical one from its
    sorted atoms and cumulative mass; QR-DQN's quantile n standing for fractions [n/N, (n+1)/N) as the twin's
    docstring says), so it shares no formula with the twin. IQN's CVaR maps its fractions tau -> alpha tau
    (Dabney et al. 2018, sec. 3.1). Twins: ``cudarl.reference.agent.c51_risk``, ``quantile_risk``,
    ``cvar_taus``."""
    from cudarl.reference import agent as agent_ref

    rng = np.random.default_rng(2000)
    n, A, K, N, lam = 5, 3, 11, 8, 0.7
    z = np.linspace(-2, 2, K).astype(np.float32)
    logits = (rng.normal(size=(n, A, K)) * 2).astype(np.float32)
    theta = rng.normal(size=(n, N, A)).astype(np.float32)
    u = (np.arange(1 << 16) + 0.5) / (1 << 16)
    p = _softmax64(logits)
    for alpha in (0.05, 0.25, 0.6, 1.0):
        q_c51, q_qr = np.empty((n, A), np.float32), np.empty((n, A), np.float32)
        agent_ref.c51_risk(q_c51, logits, z, agent_ref.CVAR, alpha, 0.0)
        agent_ref.quantile_risk(q_qr, theta, agent_ref.CVAR, alpha, 0.0)
        tail = u[u < alpha]
        for b in range(n):
            for a in range(A):
                cdf = np.cumsum(p[b, a])
                inv = z.astype(np.float64)[np.minimum(np.searchsorted(cdf, tail, side="right"), K - 1)]
                assert q_c51[b, a] == pytest.approx(inv.sum() / tail.size, abs=2e-4)
                inv_qr = theta[b, :, a].astype(np.float64)[np.minimum((tail * N).astype(int), N - 1)]
                assert q_qr[b, a] == pytest.approx(inv_qr.sum() / tail.size, abs=2e-4)
    q = np.empty((n, A), np.float32)
    agent_ref.c51_risk(q, logits, z, agent_ref.MEAN_STD, 0.0, lam)
    mu = (p * z).sum(-1)
    np.testing.assert_allclose(q, mu - lam * np.sqrt((p * (z - mu[..., None]) ** 2).sum(-1)), rtol=1e-5, atol=1e-6)
    agent_ref.quantile_risk(q, theta, agent_ref.MEAN_STD, 0.0, lam)
    t64 = theta.astype(np.float64)
    np.testing.assert_allclose(q, t64.mean(1) - lam * t64.std(1), rtol=1e-5, atol=1e-6)
    tau = rng.uniform(size=(4, N)).astype(np.float32)
    scaled = tau.copy()
    agent_ref.cvar_taus(scaled, 0.3)
    np.testing.assert_allclose(scaled, 0.3 * tau.astype(np.float64), rtol=1e-7)


# --- 4. PopArt --------------------------------------------------------------------------------------------------
def test_popart_statistics_and_output_preserving_rescale_follow_van_hasselt_2016():
    """van Hasselt, Guez, Hessel, Mnih & Silver (2016), sec. 2 and Algorithm 1: ``mu_t = (1 - beta) mu_{t-1} +
    beta Y_t``, ``nu_t = (1 - beta) nu_{t-1} + beta Y_t^2``, ``sigma_t = sqrt(nu_t - mu_t^2)``, and the
    Preserving Outputs step ``W' = W sigma / sigma'``, ``b' = (sigma b + mu - mu') / sigma'`` (eq. 6).
    Documented variants the oracle encodes (``cudarl/reference/popart.py``): a batch of targets moves the
    averages once with its mean of Y and of Y^2; the averages are bias-corrected like Adam's (divided by
    ``1 - (1 - beta)^t``); sigma is floored at sigma_min; the first update preserves nothing; and with
    ``scale != 1`` every sigma above reads ``sigma / scale``. With scale 1 the rescale is eq. 6 itself."""
    rng = np.random.default_rng(2016)
    beta, sigma_min = 0.05, 1e-4
    for scale in (1.0, 10 / 3):
        state = popart_ref.init_state(scale)
        m1 = m2 = 0.0
        mu = sigma = None
        for t in range(1, 8):
            y = rng.normal(3.0 * t, 0.5 + t, 33).astype(np.float32)
            y64 = y.astype(np.float64)
            m1 = (1 - beta) * m1 + beta * y64.mean()
            m2 = (1 - beta) * m2 + beta * (y64 * y64).mean()
            c = 1 - (1 - beta) ** t
            mu_new, sigma_new = m1 / c, math.sqrt(max(m2 / c - (m1 / c) ** 2, sigma_min**2))
            new = popart_ref.update(y, state, beta, sigma_min)
            assert float(new[popart_ref.MU]) == pytest.approx(mu_new, rel=2e-5, abs=1e-5)
            assert float(new[popart_ref.SIGMA]) == pytest.approx(sigma_new, rel=2e-4)
            if t > 1:
                W = rng.normal(size=(16, 1)).astype(np.float32)
                b = rng.normal(size=1).astype(np.float32)
                W2, b2 = popart_ref.rescale(W, b, new)
                # eq. 6 with the twin's own statistics (sigma read as sigma / scale)
                s_old = float(new[popart_ref.SIGMA_PREV]) / scale
                s_new = float(new[popart_ref.SIGMA]) / scale
                mu_old, mu_now = float(new[popart_ref.MU_PREV]), float(new[popart_ref.MU])
                assert mu_old == pytest.approx(mu) and s_old * scale == pytest.approx(sigma)
                np.testing.assert_allclose(W2, W * (s_old / s_new), rtol=1e-6)
                np.testing.assert_allclose(b2, (s_old * b + mu_old - mu_now) / s_new, rtol=1e-5, atol=1e-5)
                h = rng.normal(size=(5, 16))
                before = s_old * (h @ W.astype(np.float64) + b) + mu_old
                after = s_new * (h @ W2.astype(np.float64) + b2) + mu_now
                np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-4 * s_old)
            state, mu, sigma = new, float(new[popart_ref.MU]), float(new[popart_ref.SIGMA])


def test_c51_targets_with_popart_are_the_normalised_td_target_projected():
    """The C51 targets as the agent builds them with PopArt on (the default): van Hasselt et al. (2016), sec. 2,
    statistics of the TD targets ``Y = R + gamma^n (s v + mu)`` (``v = sum_k p_k z_k`` of the target net at
    the double-DQN action, the statistics before the step), then Bellemare et al. (2017) Algorithm 1 applied
    to ``(Y - mu') / s'`` with the atoms read in the new coordinates: ``T z_j = (R - (1 - gamma^n) mu') / s' +
    gamma^n z_j``. Documented variant (``cudarl/reference/c51_chain.py``, ``targets``; docs/guide.md): the
    update moves the statistics with this step's targets before they normalise the rewards, bias-corrected as
    in :func:`test_popart_statistics_and_output_preserving_rescale_follow_van_hasselt_2016`, and the C51
    head's last layer is not rescaled (its statistics freeze after a warm-up instead)."""
    rng = np.random.default_rng(99)
    B, A, K, n, gamma, beta, scale = 24, 3, 51, 3, 0.99, 0.02, 10 / 3
    z, (va_tm1, va_on, va_tg), rewards, terminal, a, wts = _c51_inputs(rng, B, A, K, n, gamma)
    rewards *= 0.1  # returns near the statistics' scale
    R, d = _n_step_oracle(rewards, terminal, gamma)
    R32, d32 = R.astype(np.float32), d.astype(np.float32)
    state = popart_ref.init_state(scale)
    state = popart_ref.update(rng.normal(0.5, 2.0, 64).astype(np.float32), state, 0.1)  # statistics that moved
    m1, m2, decay = (float(state[i]) for i in (popart_ref.M1, popart_ref.M2, popart_ref.DECAY))
    mu, s = float(state[popart_ref.MU]), float(state[popart_ref.SIGMA]) / scale

    z64 = z.astype(np.float64)
    q_on = (_softmax64(_dueling_oracle(va_on, A, K)) * z64).sum(-1)
    a_star = q_on.argmax(1)
    p = _softmax64(_dueling_oracle(va_tg, A, K))[np.arange(B), a_star]
    Y = R32 + d32 * (s * (p @ z64) + mu)
    m1, m2, decay = (1 - beta) * m1 + beta * Y.mean(), (1 - beta) * m2 + beta * (Y * Y).mean(), decay * (1 - beta)
    mu2 = m1 / (1 - decay)
    s2 = math.sqrt(max(m2 / (1 - decay) - mu2 * mu2, 1e-8)) / scale
    r_norm = (R32 - (1 - d32) * mu2) / s2
    m = np.array([_project_oracle(p[b], r_norm[b], d32[b], z64) for b in range(B)])
    logits = _dueling_oracle(va_tm1, A, K)[np.arange(B), a]
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    ce = -(m * logp).sum(1)

    out = c51_ref.targets_loss_popart(va_tm1, va_on, va_tg, a, wts, z, R32, d32, state, np.float32(beta))
    m_tw, _, a_tw, y_tw, r_norm_tw, state_tw, loss_per = out[:7]
    np.testing.assert_array_equal(a_tw, a_star)
    np.testing.assert_allclose(y_tw, Y, rtol=1e-5, atol=1e-5)
    assert float(state_tw[popart_ref.MU]) == pytest.approx(mu2, rel=1e-5)
    assert float(state_tw[popart_ref.SIGMA]) / scale == pytest.approx(s2, rel=1e-4)
    np.testing.assert_allclose(r_norm_tw, r_norm, rtol=1e-5, atol=1e-5)
    tol = 8 * K * 2.0**-24  # float32's grid position, as in the test without PopArt, and r_norm's error / dz
    np.testing.assert_allclose(m_tw, m, rtol=0, atol=tol)
    np.testing.assert_allclose(loss_per, ce, rtol=1e-5, atol=20 * tol)


# --- 5. Adam(W), clipping, Polyak ---------------------------------------------------------------------------------
def test_adamw_with_global_norm_clipping_and_polyak_target_follow_the_papers():
    """Kingma & Ba (2015), Algorithm 1 (moments, bias corrections ``1 - beta^t``, ``alpha m^ / (sqrt(v^) +
    eps)``); decoupled weight decay, Loshchilov & Hutter (2019), Algorithm 2 line 12, ``theta -= eta_t lambda
    theta`` on the masked (decayed) parameters, with the twin's documented parametrisation ``eta_t lambda =
    lr wd`` (PyTorch's AdamW: the decay is scaled by the learning rate); global-norm clipping, Pascanu,
    Mikolov & Bengio (2013), Algorithm 1, ``g <- g c / ||g||`` when ``||g|| > c`` (the twin's documented
    ``c / (||g|| + 1e-6)``, PyTorch's ``clip_grad_norm_``); Polyak averaging of the target net, Lillicrap et
    al. (2016), ``theta' <- tau theta + (1 - tau) theta'``. Twin: ``cudarl.reference.optim`` driven step by
    step as the trainer drives it (lr_schedule, grad_norm, adam_update, soft_update)."""
    rng = np.random.default_rng(2015)
    n, steps = 1000, 6
    # the hyper-parameters as the kernels receive them (float32 arguments): 1 - float32(0.999) is 1.3e-5 off 1e-3
    lr, b1, b2, eps, wd, max_norm, tau = (float(np.float32(x)) for x in (3e-3, 0.9, 0.999, 1e-8, 0.05, 5.0, 0.01))
    p = rng.normal(size=n).astype(np.float32)
    target = p.copy()
    mask = (rng.uniform(size=n) < 0.7).astype(np.uint8)
    grads = [(rng.normal(size=n) * (0.5 if t % 2 else 0.05)).astype(np.float32) for t in range(steps)]

    P, Tg = p.astype(np.float64), target.astype(np.float64)
    M, V = np.zeros(n), np.zeros(n)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    step = np.zeros(1, np.int64)
    lr_d, m_scale, bc1, bc2 = (np.zeros(1, np.float32) for _ in range(4))
    partial = np.zeros(optim_ref.GN_BLOCKS)
    norm, clip, tau_d = np.zeros(1, np.float32), np.zeros(1, np.float32), np.full(1, tau, np.float32)
    clipped = 0
    for t in range(1, steps + 1):
        g = grads[t - 1].astype(np.float64)
        gn = math.sqrt(float((g * g).sum()))
        if gn > max_norm:
            g = g * max_norm / (gn + 1e-6)
            clipped += 1
        M = b1 * M + (1 - b1) * g
        V = b2 * V + (1 - b2) * g * g
        mhat, vhat = M / (1 - b1**t), V / (1 - b2**t)
        P = P - lr * wd * mask * P - lr * mhat / (np.sqrt(vhat) + eps)
        Tg = tau * P + (1 - tau) * Tg

        optim_ref.lr_schedule(step, lr_d, m_scale, bc1, bc2, optim_ref.CONSTANT, lr, 0.0, 0, 1, 1, 1.0, b1, b2)
        optim_ref.grad_norm(grads[t - 1], partial, norm, clip, max_norm)
        assert float(norm[0]) == pytest.approx(gn, rel=1e-6)
        optim_ref.adam_update(p, grads[t - 1], m, v, mask, lr_d, m_scale, bc1, bc2, clip, b1, b2, eps, wd)
        optim_ref.soft_update(target, p, tau_d)
        np.testing.assert_allclose(m, M, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(v, V, rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(p, P, rtol=0, atol=2e-6)
        np.testing.assert_allclose(target, Tg, rtol=0, atol=2e-6)
    assert 0 < clipped < steps  # both branches of the clip ran


# --- 6. Evaluation statistics -------------------------------------------------------------------------------------
def test_sharpe_psr_dsr_and_drawdown_follow_sharpe_and_bailey_lopez_de_prado():
    """Sharpe (1994): ``mean / sd`` of the per-bar returns (ddof 1), annualised by ``sqrt(bars a year)``
    (Lo 2002, eq. 16, for IID returns); Probabilistic Sharpe Ratio, Bailey & Lopez de Prado (2012), eq. 10:
    ``Phi((SR - SR*) sqrt(n - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2))`` with ``g4`` the non-excess kurtosis;
    Deflated Sharpe Ratio, Bailey & Lopez de Prado (2014), eq. 2: the PSR against ``SR*_0 = sqrt(V)((1 - g)
    Z^-1(1 - 1/N) + g Z^-1(1 - 1/(N e)))``, ``g`` Euler-Mascheroni. Documented variant: without the trials'
    Sharpe variance the twin takes ``V = 1 / (n - 1)``, the estimator's variance under no skill
    (``cudarl/evaluate/_stats.py``). Maximum drawdown: ``min_t W_t / max_{s<=t} W_s - 1`` over the wealth path
    with ``W_0 = 1`` (Magdon-Ismail & Atiya 2004). Every input skewed and fat-tailed, so g3 and g4 matter."""
    rng = np.random.default_rng(2012)
    n = 757
    r = 0.0006 + 0.01 * rng.standard_t(4, n) + 0.004 * (rng.exponential(1.0, n) - 1.0)
    Phi, Zinv, g = NormalDist().cdf, NormalDist().inv_cdf, 0.5772156649015329
    mean = math.fsum(r) / n
    central = {k: math.fsum((x - mean) ** k for x in r) / n for k in (2, 3, 4)}  # the moments m_k of the paper
    sr = mean / math.sqrt(central[2] * n / (n - 1))  # the sample sd, ddof 1
    g3, g4 = central[3] / central[2] ** 1.5, central[4] / central[2] ** 2  # skewness, non-excess kurtosis
    assert abs(g3) > 0.1 and g4 > 3.5

    def psr(benchmark):
        return Phi((sr - benchmark) * math.sqrt(n - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr * sr))

    wealth, peak, mdd = 1.0, 1.0, 0.0
    for x in r:
        wealth *= 1 + x
        peak = max(peak, wealth)
        mdd = min(mdd, wealth / peak - 1)

    for ppy in (252.0, 365.0, 8766.0, 98280.0):
        got = metrics(r, ppy)
        assert got["sharpe"] == pytest.approx(sr * math.sqrt(ppy), rel=1e-12)
        assert got["max_drawdown"] == pytest.approx(mdd, rel=1e-12)
    for trials, variance in ((1, None), (20, None), (20, 4e-4), (1000, 1e-3)):
        st = return_statistics(r, 252.0, trials=trials, trial_variance=variance, resamples=20)
        V = 1.0 / (n - 1) if variance is None else variance
        sr0 = 0.0
        if trials > 1:
            sr0 = math.sqrt(V) * ((1 - g) * Zinv(1 - 1 / trials) + g * Zinv(1 - 1 / (trials * math.e)))
        assert st["sharpe"] == pytest.approx(sr * math.sqrt(252), rel=1e-12)
        assert (st["skew"], st["kurtosis"]) == pytest.approx((g3, g4), rel=1e-10)
        assert st["psr"] == pytest.approx(psr(0.0), rel=1e-10)
        assert st["expected_max_sharpe"] == pytest.approx(sr0 * math.sqrt(252), rel=1e-10, abs=1e-15)
        assert st["dsr"] == pytest.approx(psr(sr0), rel=1e-9, abs=1e-300)
