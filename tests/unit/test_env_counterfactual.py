"""Counterfactual and mirrored transitions against direct recomputation from the prices.

Prices do not depend on the agent, so every other action's reward is exact; the mirror's reward
is the reward of the mirrored market (returns negated) at the mirrored positions. The seed
system negated that reward twice (cf_reward = -reward where reward was already flipped); here
it is recomputed from scratch and must never be the negation of the real reward.
"""

import numpy as np
import pytest

from cudarl import costs
from cudarl.env import EnvConfig, TradingEnv
from cudarl.reference import env as ref

F32 = np.float32


def make_env(rng, n=11, a_n=3, f_n=5, t_n=120, **kw):
    close = (50 * np.exp(np.cumsum(rng.normal(0, 0.02, t_n)))).astype(F32)
    open_ = (close * (1 + rng.normal(0, 0.005, t_n))).astype(F32)
    feats = rng.normal(size=(t_n, f_n)).astype(F32)
    sign = np.zeros(f_n, bool)
    sign[::2] = True
    cfg = EnvConfig(
        n_envs=n,
        n_actions=a_n,
        episode_len=kw.pop("episode_len", 6),
        cost_bps=kw.pop("cost_bps", 7.0),
        slippage_bps=kw.pop("slippage_bps", 3.0),
        **kw,
    )
    return TradingEnv(open_, close, feats, sign, cfg, backend="numpy"), open_, close, feats, sign


def windows(env, out):
    """The observations of a record's state rows (obs, next_obs), as the learner gathers them."""
    return env.windows.of(out.obs), env.windows.of(out.next_obs)


def fill_return_f64(env, open_, close, t):
    px = (open_ if env.config.fill == "open" else close).astype(np.float64)
    return px[t + 2] / px[t + 1] - 1.0


def run_steps(env, rng, n_steps, with_scale=True):
    """Yield (state before, actions, scale, transitions) for n_steps record + step calls."""
    out = env.make_transitions()
    for _ in range(n_steps):
        before = ref.EnvState(*(a.copy() for a in env.state))
        a = rng.integers(0, env.n_actions, env.n_envs).astype(np.int32)
        s = rng.random(env.n_envs).astype(F32) if with_scale else np.ones(env.n_envs, F32)
        env.record(out, a, s)
        yield before, a, s, out
        env.step(a, s)


@pytest.mark.parametrize("a_n,fill", [(2, "open"), (3, "open"), (5, "close")])
def test_every_counterfactual_reward_equals_direct_recomputation(rng, a_n, fill):
    env, open_, close, _, _ = make_env(rng, a_n=a_n, counterfactual=True, mirror=True, fill=fill)
    n, lv, rate = env.n_envs, env.config.position_levels(), env.params.rate
    checked = 0
    for st, a, s, out in run_steps(env, rng, 25):
        for g in range(a_n):
            rows = slice(g * n, (g + 1) * n)
            act = (a + g) % a_n
            np.testing.assert_array_equal(out.action[rows], act)
            p = lv[act] * s
            # float64 from the prices: the cost model itself
            r64 = costs.bar_net_return(
                st.position.astype(np.float64),
                p.astype(np.float64),
                fill_return_f64(env, open_, close, st.t),
                env.config.cost_bps,
                env.config.slippage_bps,
            )
            np.testing.assert_allclose(out.reward[rows], r64, rtol=1e-5, atol=1e-7)
            # float32, op by op: exactly what both kernels compute
            px = open_ if fill == "open" else close
            ret32 = px[st.t + 2] / px[st.t + 1] - F32(1)
            r32 = (p * ret32 - rate * np.abs(p - st.position)).astype(F32)
            np.testing.assert_array_equal(out.reward[rows], r32)
            checked += n
    assert checked == 25 * n * a_n


def test_each_env_gets_every_action_exactly_once(rng):
    env, *_ = make_env(rng, a_n=5, counterfactual=True)
    n = env.n_envs
    for _, a, _, out in run_steps(env, rng, 3):
        acts = out.action.reshape(5, n)
        np.testing.assert_array_equal(np.sort(acts, axis=0), np.tile(np.arange(5)[:, None], (1, n)))
        np.testing.assert_array_equal(acts[0], a)


def test_mirror_reward_is_the_mirrored_market_reward_not_its_negation(rng):
    env, open_, close, _, _ = make_env(rng, a_n=3, mirror=True)
    n, lv = env.n_envs, env.config.position_levels()
    nonzero = 0
    for st, a, s, out in run_steps(env, rng, 40):
        real, mir = slice(0, n), slice(n, 2 * n)
        np.testing.assert_array_equal(out.action[mir], 2 - a)
        # the mirrored market, recomputed directly in float64: returns negated, positions negated
        ret_m = -fill_return_f64(env, open_, close, st.t)
        p_m = -(lv[a] * s).astype(np.float64)
        prev_m = -st.position.astype(np.float64)
        r_m = p_m * ret_m - (env.config.cost_bps + env.config.slippage_bps) * 1e-4 * np.abs(p_m - prev_m)
        np.testing.assert_allclose(out.reward[mir], r_m, rtol=1e-5, atol=1e-7)
        # the symmetry: mirroring position and market together leaves the reward unchanged ...
        np.testing.assert_array_equal(np.abs(out.reward[mir]), np.abs(out.reward[real]))
        np.testing.assert_allclose(out.reward[mir], out.reward[real], rtol=0, atol=0)
        # ... so the seed's double negation (-reward) is wrong wherever the reward is not zero
        big = np.abs(out.reward[real]) > 1e-6
        assert not np.any(np.isclose(out.reward[mir][big], -out.reward[real][big], rtol=1e-3, atol=0))
        nonzero += int(big.sum())
    assert nonzero > 100


def test_mirror_observations(rng):
    env, _, _, feats, sign = make_env(rng, a_n=5, mirror=True, counterfactual=True)
    n, f_n, lv = env.n_envs, env.n_features, env.config.position_levels()
    for st, a, s, out in run_steps(env, rng, 15):
        real, mir = slice(0, n), slice(5 * n, 6 * n)
        for x, t in zip(windows(env, out), (st.t, st.t + 1), strict=True):
            o_r, o_m = x[real], x[mir]
            np.testing.assert_array_equal(o_r[:, :f_n], feats[t])
            np.testing.assert_array_equal(o_m[:, :f_n][:, sign], -feats[t][:, sign])  # return-sign columns negated
            np.testing.assert_array_equal(o_m[:, :f_n][:, ~sign], feats[t][:, ~sign])  # the rest unchanged
            np.testing.assert_array_equal(o_m[:, f_n], -o_r[:, f_n])  # position negated
            np.testing.assert_array_equal(o_m[:, f_n + 1], o_r[:, f_n + 1])  # hold unchanged
        obs, next_obs = windows(env, out)
        np.testing.assert_array_equal(obs[real][:, f_n], st.position)
        np.testing.assert_array_equal(next_obs[real][:, f_n], lv[a] * s)
        np.testing.assert_array_equal(out.done[mir], out.done[real])
        np.testing.assert_array_equal(out.obs[mir][:, 1], 1.0)  # the state rows say which rows are mirrored
        np.testing.assert_array_equal(out.obs[real][:, 1], 0.0)


def test_mirror_of_the_mirror_is_the_real_transition(rng):
    """Applying the mirror map (sign columns, position, action A-1-a) to the mirror row gives the real row."""
    env, *_ = make_env(rng, a_n=3, mirror=True)
    n, f_n = env.n_envs, env.n_features
    flip = np.concatenate([env.data.sign, np.array([-1, 1], F32)])
    for _, _, _, out in run_steps(env, rng, 10):
        real, mir = slice(0, n), slice(n, 2 * n)
        obs, next_obs = windows(env, out)
        np.testing.assert_array_equal(obs[mir] * flip, obs[real])
        np.testing.assert_array_equal(next_obs[mir] * flip, next_obs[real])
        np.testing.assert_array_equal(2 - out.action[mir], out.action[real])
        assert np.any(obs[mir][:, :f_n] != obs[real][:, :f_n])  # the map is not the identity here


def test_counterfactual_next_obs_and_done(rng):
    env, _, _, feats, _ = make_env(rng, a_n=3, counterfactual=True, episode_len=3, hold_cap=2)
    n, f_n, lv = env.n_envs, env.n_features, env.config.position_levels()
    saw_done = saw_hold = False
    for st, a, _, out in run_steps(env, rng, 12, with_scale=False):
        obs, next_obs = windows(env, out)
        for g in range(3):
            rows = slice(g * n, (g + 1) * n)
            p = lv[(a + g) % 3]
            np.testing.assert_array_equal(out.obs[rows], out.obs[:n])  # every row starts from the real obs
            np.testing.assert_array_equal(next_obs[rows][:, :f_n], feats[st.t + 1])
            np.testing.assert_array_equal(next_obs[rows][:, f_n], p)
            hold = np.where(p == st.position, st.hold + 1, 1)
            np.testing.assert_array_equal(next_obs[rows][:, f_n + 1], np.minimum(hold, 2) / F32(2))
            np.testing.assert_array_equal(out.done[rows], (st.steps_left == 1).astype(F32))
            saw_hold |= bool(np.any(hold > 1))
        saw_done |= bool(np.any(st.steps_left == 1))
    assert saw_done and saw_hold


def test_real_row_equals_what_step_reports(rng):
    env, *_ = make_env(rng, a_n=3, counterfactual=True, mirror=True, episode_len=4)
    n = env.n_envs
    for _ in range(20):
        obs_before, rows_before = env.obs.copy(), env.rows.copy()
        a = rng.integers(0, 3, n).astype(np.int32)
        out = env.make_transitions()
        env.record(out, a)
        env.step(a)
        obs, next_obs = windows(env, out)
        np.testing.assert_array_equal(out.obs[:n], rows_before)
        np.testing.assert_array_equal(obs[:n], obs_before)
        np.testing.assert_array_equal(out.reward[:n], env.reward)
        np.testing.assert_array_equal(out.done[:n], env.done)
        live = env.done == 0  # after an episode end env.obs is the new episode's first obs
        np.testing.assert_array_equal(next_obs[:n][live], env.obs[live])
        np.testing.assert_array_equal(out.next_obs[:n][live], env.rows[live])
        assert not np.array_equal(next_obs[:n][~live], env.obs[~live]) or not np.any(~live)


def test_record_refuses_a_buffer_of_the_wrong_size(rng):
    env, *_ = make_env(rng, a_n=3, counterfactual=True)
    small = ref.Transitions.allocate(np, env.n_envs)
    with pytest.raises(ValueError, match="rows"):
        env.record(small)
