"""env family: the NumPy twin against a plain Python loop (CPU); the kernels against the twin (GPU).

The GPU acceptance test runs 4096 envs for 1000 steps: positions and every integer of the
state bitwise, rewards within 1e-6 relative (they are computed op by op in float32 on both
faces, so in practice they agree bitwise too).
"""

import numpy as np
import pytest

from cudarl.env import EnvConfig, TradingEnv
from cudarl.reference import env as ref
from cudarl.reference import philox
from cudarl.testing import assert_bitwise, assert_parity, poison

F32 = np.float32


def market(rng, t_n, f_n, vol=0.01):
    """A random-walk market: open, close float32 [T], features float32 [T, F], return_sign bool [F]."""
    close = (100 * np.exp(np.cumsum(rng.normal(0, vol, t_n)))).astype(F32)
    open_ = (close * (1 + rng.normal(0, vol / 4, t_n))).astype(F32)
    feats = rng.normal(size=(t_n, f_n)).astype(F32)
    sign = rng.random(f_n) < 0.5
    sign[0] = True
    return open_, close, feats, sign


# --- a plain Python loop: one env, one step at a time ----------------------------------------------
class LoopEnv:
    """The semantics of docs/env.md written as scalar Python, env by env (float32 scalars)."""

    def __init__(self, open_, close, feats, cfg: EnvConfig, t_begin=0, t_end=None):
        px = open_ if cfg.fill == "open" else close
        self.px, self.feats, self.cfg = px, feats, cfg
        t_end = feats.shape[0] if t_end is None else t_end
        self.t_begin, self.n_starts = t_begin, t_end - t_begin - cfg.episode_len - 1
        self.levels = cfg.position_levels()
        self.rate = F32((cfg.cost_bps + cfg.slippage_bps) * 1e-4)
        n = cfg.n_envs
        self.t, self.start, self.left = [0] * n, [0] * n, [0] * n
        self.pos, self.hold, self.count = [F32(0)] * n, [0] * n, [0] * n
        for i in range(n):
            blk = philox.blocks(cfg.seed, self.count[i], ref.STREAM_RESET, np.array([i // 2]))[0]
            x_start, x_len = int(blk[2 * (i % 2)]), int(blk[2 * (i % 2) + 1])
            s = t_begin + (x_start * self.n_starts >> 32)
            self.t[i] = self.start[i] = s
            self.left[i] = 1 + (x_len * cfg.episode_len >> 32) if cfg.stagger else cfg.episode_len

    def ret(self, t):
        return F32(self.px[t + 2] / self.px[t + 1] - F32(1))

    def obs(self, i):
        hf = F32(min(self.hold[i], self.cfg.hold_cap)) / F32(self.cfg.hold_cap)
        return np.concatenate([self.feats[self.t[i]], np.array([self.pos[i], hf], F32)])

    def step(self, actions, scale):
        rewards, dones = [], []
        for i in range(self.cfg.n_envs):
            a = min(max(int(actions[i]), 0), self.cfg.n_actions - 1)
            p = F32(self.levels[a] * F32(scale[i]))
            r = F32(F32(p * self.ret(self.t[i])) - F32(self.rate * abs(F32(p - self.pos[i]))))
            self.hold[i] = self.hold[i] + 1 if p == self.pos[i] else 1
            self.pos[i], self.t[i], self.left[i], self.count[i] = p, self.t[i] + 1, self.left[i] - 1, self.count[i] + 1
            dones.append(F32(self.left[i] == 0))
            if self.left[i] == 0:
                x = int(philox.blocks(self.cfg.seed, self.count[i], ref.STREAM_EPISODE, np.array([i // 4]))[0][i % 4])
                self.t[i] = self.start[i] = self.t_begin + (x * self.n_starts >> 32)
                self.left[i], self.pos[i], self.hold[i] = self.cfg.episode_len, F32(0), 0
            rewards.append(r)
        return np.array(rewards, F32), np.array(dones, F32)


@pytest.mark.parametrize(
    "cfg_kw",
    [
        dict(n_envs=9, episode_len=7, n_actions=3),
        dict(n_envs=5, episode_len=1, n_actions=2, fill="close", stagger=False),
        dict(n_envs=13, episode_len=11, n_actions=5, cost_bps=3.0, slippage_bps=2.5, hold_cap=4, seed=2**63 + 5),
    ],
)
@pytest.mark.parametrize("with_scale", [False, True])
def test_twin_equals_python_loop(rng, cfg_kw, with_scale):
    cfg = EnvConfig(**cfg_kw)
    open_, close, feats, sign = market(rng, 80, 4)
    env = TradingEnv(open_, close, feats, sign, cfg, t_begin=3, t_end=70, backend="numpy")
    loop = LoopEnv(open_, close, feats, cfg, t_begin=3, t_end=70)
    n_done = 0
    for k in range(60):
        actions = rng.integers(-1, cfg.n_actions + 1, cfg.n_envs).astype(np.int32)  # includes out-of-range
        scale = rng.random(cfg.n_envs).astype(F32) if with_scale else np.ones(cfg.n_envs, F32)
        if with_scale:
            scale[rng.random(cfg.n_envs) < 0.2] = F32(0)
        for i in range(cfg.n_envs):
            np.testing.assert_array_equal(env.obs[i], loop.obs(i), err_msg=f"obs of env {i} at step {k}")
        r, d = loop.step(actions, scale)
        env.step(actions, scale)
        assert_bitwise(env.reward, r, f"reward at step {k}")
        assert_bitwise(env.state.position, np.array(loop.pos, F32), f"position at step {k}")
        np.testing.assert_array_equal(env.state.t, loop.t)
        np.testing.assert_array_equal(env.state.start, loop.start)
        np.testing.assert_array_equal(env.state.steps_left, loop.left)
        np.testing.assert_array_equal(env.state.hold, loop.hold)
        np.testing.assert_array_equal(env.state.count, loop.count)
        np.testing.assert_array_equal(env.done, d, err_msg=f"done at step {k}")
        n_done += int(d.sum())
    assert n_done >= cfg.n_envs * (60 // cfg.episode_len - 1)  # episodes ended and reset


def test_loop_twin_check_can_fail(rng):
    """The loop comparison sees a one-ulp change of the cost rate (so it is not vacuous)."""
    cfg = EnvConfig(n_envs=4, episode_len=5, cost_bps=5.0)
    open_, close, feats, sign = market(rng, 40, 2)
    env = TradingEnv(open_, close, feats, sign, cfg, backend="numpy")
    loop = LoopEnv(open_, close, feats, cfg)
    loop.rate = np.nextafter(loop.rate, F32(1))
    actions = np.array([0, 2, 0, 2], np.int32)
    r, _ = loop.step(actions, np.ones(4, F32))
    env.step(actions)
    assert not np.array_equal(env.reward, r)


# --- GPU ------------------------------------------------------------------------------------------
def _pair(rng, cfg, t_n=3000, f_n=16, **kw):
    open_, close, feats, sign = market(rng, t_n, f_n)
    cpu = TradingEnv(open_, close, feats, sign, cfg, backend="numpy", **kw)
    gpu = TradingEnv(open_, close, feats, sign, cfg, backend="cupy", **kw)
    return cpu, gpu


def _assert_state_equal(gpu, cpu, what):
    for name in ("t", "start", "steps_left", "hold", "count"):
        np.testing.assert_array_equal(
            getattr(gpu.state, name).get(), getattr(cpu.state, name), err_msg=f"{what}: state.{name}"
        )
    assert_bitwise(gpu.state.position, cpu.state.position, f"{what}: state.position")


@pytest.mark.gpu
def test_gpu_env_parity_4096_envs_1000_steps(cp, rng):
    """Acceptance: 4096 envs, 1000 steps of act + step, conviction sizing on half the steps; observation
    windows of 8 bars (reaching back before t_begin = 20 at an episode's first bars)."""
    cfg = EnvConfig(n_envs=4096, episode_len=97, n_actions=3, cost_bps=2.0, slippage_bps=1.0, seed=12345)
    cpu, gpu = _pair(rng, cfg, t_n=5000, f_n=16, t_begin=20, window=8)
    _assert_state_equal(gpu, cpu, "after reset")
    assert_bitwise(gpu.rows, cpu.rows, "state rows after reset")
    assert_bitwise(gpu.obs, cpu.obs, "obs after reset")
    eps_c = np.array([0.25], F32)
    eps_g = cp.asarray(eps_c)
    n_done = 0
    for k in range(1000):
        q = rng.normal(size=(4096, 3)).astype(F32)
        a_c = cpu.act(q, eps_c)
        a_g = gpu.act(cp.asarray(q), eps_g)
        np.testing.assert_array_equal(a_g.get(), a_c, err_msg=f"actions at step {k}")
        for buf in (gpu.rows, gpu.obs, gpu.reward, gpu.done):
            poison(buf)
        if k % 2:
            s = rng.random(4096).astype(F32)
            cpu.step(scale=s)
            gpu.step(scale=cp.asarray(s))
        else:
            cpu.step()
            gpu.step()
        _assert_state_equal(gpu, cpu, f"step {k}")
        assert_parity(gpu.reward, cpu.reward, rtol=1e-6, what=f"reward at step {k}")
        np.testing.assert_array_equal(gpu.done.get(), cpu.done, err_msg=f"done at step {k}")
        assert_bitwise(gpu.rows, cpu.rows, f"state rows at step {k}")
        assert_bitwise(gpu.obs, cpu.obs, f"obs at step {k}")
        n_done += int(cpu.done.sum())
    assert n_done > 4096 * 5  # many episodes ended and reset on the device


@pytest.mark.gpu
@pytest.mark.parametrize("n,a_n,f_n", [(1, 2, 1), (33, 3, 7), (257, 5, 64), (1000, 4, 3)])
@pytest.mark.parametrize("cf,mirror", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_record_parity(cp, rng, n, a_n, f_n, cf, mirror):
    cfg = EnvConfig(
        n_envs=n, episode_len=5, n_actions=a_n, cost_bps=4.0, slippage_bps=1.5, counterfactual=cf, mirror=mirror, seed=7
    )
    cpu, gpu = _pair(rng, cfg, t_n=200, f_n=f_n)
    out_c, out_g = cpu.make_transitions(), gpu.make_transitions()
    _assert_state_equal(gpu, cpu, "after reset")
    for k in range(12):
        a = rng.integers(0, a_n, n).astype(np.int32)
        s = rng.random(n).astype(F32)
        for arr in out_g:
            poison(arr)
        cpu.record(out_c, a, s)
        gpu.record(out_g, cp.asarray(a), cp.asarray(s))
        for name in ("obs", "action", "next_obs", "done"):
            assert_bitwise(getattr(out_g, name), getattr(out_c, name), f"{name} at step {k}")
        assert_parity(out_g.reward, out_c.reward, rtol=1e-6, what=f"reward at step {k}")
        cpu.step(a, s)
        gpu.step(cp.asarray(a), cp.asarray(s))
        _assert_state_equal(gpu, cpu, f"step {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,a_n", [(1, 2), (5, 3), (1000, 7), (4099, 3)])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_gpu_act_parity(cp, rng, n, a_n, eps):
    from cudarl.ops import env as ops

    q = rng.normal(size=(n, a_n)).astype(F32)
    q[::3, -1] = q[::3, 0]  # ties: the first index wins
    count = rng.integers(0, 2**40, n, dtype=np.uint64)
    seed = np.array([99], np.uint64)
    out_c = np.zeros(n, np.int32)
    ref.act(out_c, q, np.array([eps], F32), count, seed)
    out_g = cp.full(n, -7, dtype=np.int32)
    ops.act(out_g, cp.asarray(q), cp.asarray(np.array([eps], F32)), cp.asarray(count), cp.asarray(seed))
    np.testing.assert_array_equal(out_g.get(), out_c)


def _graph_test_envs(rng):
    """Two GPU envs of 300 (counterfactual and mirror rows, 4-bar windows) on one market, and their
    transitions: (eager, graphed, out_eager, out_graphed)."""
    cfg = EnvConfig(n_envs=300, episode_len=9, n_actions=3, counterfactual=True, mirror=True, seed=3)
    open_, close, feats, sign = market(rng, 400, 8)
    eager, graphed = (TradingEnv(open_, close, feats, sign, cfg, window=4, backend="cupy") for _ in range(2))
    return eager, graphed, eager.make_transitions(), graphed.make_transitions()


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_and_sees_device_epsilon(cp, rng):
    """act + record + step captured once and replayed equals eager launches bit for bit; epsilon
    lives in device memory, so changing it between replays changes what the graph does."""
    from cudarl.graph import StepGraph
    from cudarl.pinned import DeviceScalars

    eager, graphed, out_e, out_g = _graph_test_envs(rng)
    eps_e = DeviceScalars({"epsilon": np.float32}, xp=cp)
    eps_g = DeviceScalars({"epsilon": np.float32}, xp=cp)
    q_e = cp.zeros((300, 3), np.float32)
    q_g = cp.zeros((300, 3), np.float32)
    g = StepGraph(
        "collect_env_test",
        [
            ("act", lambda: graphed.act(q_g, eps_g.view("epsilon"))),
            ("record", lambda: graphed.record(out_g)),
            ("step", lambda: graphed.step()),
        ],
        xp=cp,
    )
    cp.cuda.Device().synchronize()  # construction (reset) ran on the default stream; the graph's stream is non-blocking
    g.capture()
    explored = []
    for k in range(25):
        eps = 1.0 if k % 5 == 4 else 0.0
        q = rng.normal(size=(300, 3)).astype(F32)
        with g.stream:
            q_g.set(q, stream=g.stream)
            eps_g.set("epsilon", eps, stream=g.stream)
        g.replay()
        g.synchronize()
        q_e.set(q)
        eps_e.set("epsilon", eps)
        eager.act(q_e, eps_e.view("epsilon"))
        eager.record(out_e)
        eager.step()
        cp.cuda.get_current_stream().synchronize()
        for name in ("t", "start", "steps_left", "position", "hold", "count"):
            assert_bitwise(getattr(graphed.state, name), getattr(eager.state, name), f"state.{name} at step {k}")
        for name in ("rows", "obs", "reward", "done", "actions"):
            assert_bitwise(getattr(graphed, name), getattr(eager, name), f"{name} at step {k}")
        for name in out_e._fields:
            assert_bitwise(getattr(out_g, name), getattr(out_e, name), f"transitions.{name} at step {k}")
        explored.append(float((graphed.actions.get() != np.argmax(q, axis=1)).mean()))
    explored = np.array(explored)
    assert np.all(explored[[k for k in range(25) if k % 5 != 4]] == 0.0)  # epsilon 0: greedy
    assert np.all(explored[4::5] > 0.4)  # epsilon 1: uniform actions, 2/3 differ from greedy


# --- record_step: record + discount + step + window gather in one launch ---------------------------
def _env_outputs(env, out, disc):
    """Every buffer record_step writes, by name."""
    named = {f"state.{k}": v for k, v in env.state._asdict().items()}
    named.update(rows=env.rows, obs=env.obs, reward=env.reward, done=env.done, discount=disc)
    named.update({f"transitions.{k}": getattr(out, k) for k in out._fields})
    return named


@pytest.mark.parametrize("cf,mirror,window", [(False, False, 1), (True, True, 3)])
def test_record_step_twin_is_the_unfused_sequence(rng, cf, mirror, window):
    """CPU: TradingEnv.record_step writes what record, discount and step (with its gather) write."""
    from cudarl.reference.agent import discount

    cfg = EnvConfig(n_envs=7, episode_len=3, n_actions=3, cost_bps=2.0, counterfactual=cf, mirror=mirror, seed=5)
    open_, close, feats, sign = market(rng, 80, 4)
    fused, split = (TradingEnv(open_, close, feats, sign, cfg, backend="numpy", window=window) for _ in range(2))
    m = fused.rows_per_step * 7
    out_f, out_s = fused.make_transitions(), split.make_transitions()
    disc_f, disc_s, gamma = np.zeros(m, F32), np.zeros(m, F32), np.array([0.97], F32)
    for k in range(8):
        a = rng.integers(0, 3, 7).astype(np.int32)
        fused.actions[:], split.actions[:] = a, a
        fused.record_step(out_f, disc_f, gamma)
        split.record(out_s)
        discount(disc_s, out_s.done, gamma)
        split.step()
        want, got = _env_outputs(split, out_s, disc_s), _env_outputs(fused, out_f, disc_f)
        for name in want:
            assert_bitwise(got[name], want[name], f"{name} at step {k}")
    assert (disc_f == 0).any() and (disc_f == gamma[0]).any()  # episodes ended within the 8 steps


@pytest.mark.parametrize("cf,mirror,window", [(False, False, 1), (True, True, 3)])
def test_launchers_pass_their_kernels_c_parameters(monkeypatch, rng, cf, mirror, window):
    """CPU: the arguments cudarl.ops.env's step, record and record_step build (recorded, not launched)
    are what cuda_src/env.cu declares, and a transitions buffer of the wrong size is refused by both
    record launchers, naming it."""
    from cudarl.ops import env as ops
    from cudarl.testing import assert_launch_args

    launched = []
    monkeypatch.setattr(ops, "launch", lambda family, op, grid, block, args, stream=None: launched.append((op, args)))
    cfg = EnvConfig(n_envs=7, episode_len=3, n_actions=3, counterfactual=cf, mirror=mirror, seed=5)
    env = TradingEnv(*market(rng, 80, 4), cfg, backend="numpy", window=window)
    out, m = env.make_transitions(), env.rows_per_step * 7
    disc, gamma = np.zeros(m, F32), np.array([0.97], F32)
    ops.step(env.state, env.rows, env.reward, env.done, env.actions, env.scale, env.data, env.params, env.seed)
    ops.record(out, env.state, env.actions, env.scale, env.data, env.params)
    ops.record_step(out, disc, gamma, env.state, env.rows, env.reward, env.done, env.obs, env.actions, env.scale,
                    env.data, env.params, env.seed, window)  # fmt: skip
    assert [op for op, _ in launched] == ["step", "record", "record_step"]
    for op, args in launched:
        assert_launch_args("env", op, args)
    short = out._replace(done=np.zeros(m - 1, F32))
    with pytest.raises(ValueError, match="out.done"):
        ops.record(short, env.state, env.actions, env.scale, env.data, env.params)
    with pytest.raises(ValueError, match="out.done"):
        ops.record_step(short, disc, gamma, env.state, env.rows, env.reward, env.done, env.obs, env.actions,
                        env.scale, env.data, env.params, env.seed, window)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n,a_n,f_n,window,cf,mirror",
    [
        (1, 2, 1, 1, False, False),  # one warp, one lane of groups, a 3-float window
        (33, 3, 7, 1, True, True),  # a block and a bit; 5 groups
        (257, 5, 64, 1, False, True),  # the reference's features: a 66-float window, 3 lanes' strides
        (1000, 4, 3, 8, True, False),  # windows reaching back before bar 0 (t_begin = 2 < window - 1)
        (4096, 3, 64, 1, True, True),  # the reference collect step
        (70, 40, 5, 2, True, True),  # 41 row groups: more groups than lanes
        (9, 2, 30, 40, False, False),  # a 1280-float window
    ],
)
def test_gpu_record_step_parity(cp, rng, n, a_n, f_n, window, cf, mirror):
    """The fused launch equals the twin's composition (record, discount, step, gather) bit for bit,
    and the four unfused GPU launches bit for bit, over steps with episode ends, conviction sizing and
    gamma moved between steps; every output poisoned before each launch."""
    from cudarl.ops.agent import discount as gpu_discount

    cfg = EnvConfig(
        n_envs=n,
        episode_len=4,
        n_actions=a_n,
        cost_bps=4.0,
        slippage_bps=1.5,
        counterfactual=cf,
        mirror=mirror,
        seed=11,
    )
    open_, close, feats, sign = market(rng, 150, f_n)
    kw = dict(window=window, t_begin=2)
    cpu = TradingEnv(open_, close, feats, sign, cfg, backend="numpy", **kw)
    fused = TradingEnv(open_, close, feats, sign, cfg, backend="cupy", **kw)
    split = TradingEnv(open_, close, feats, sign, cfg, backend="cupy", **kw)
    m = cpu.rows_per_step * n
    out_c, out_f, out_s = cpu.make_transitions(), fused.make_transitions(), split.make_transitions()
    disc_c, disc_f, disc_s = np.zeros(m, F32), cp.zeros(m, F32), cp.zeros(m, F32)
    n_done = 0
    for k in range(10):
        a = rng.integers(-1, a_n + 1, n).astype(np.int32)  # out-of-range actions are clamped
        s = rng.random(n).astype(F32) if k % 2 else np.ones(n, F32)
        gamma = np.array([0.99 if k % 3 else 0.5], F32)
        for env in (cpu, fused, split):
            env.actions[...] = env.xp.asarray(a)
            env.scale[...] = env.xp.asarray(s)
        for env, out, d in ((fused, out_f, disc_f), (split, out_s, disc_s)):
            for arr in (env.rows, env.obs, env.reward, env.done, d, *out):  # not the state: it is read
                poison(arr)
        cpu.record_step(out_c, disc_c, gamma)
        fused.record_step(out_f, disc_f, cp.asarray(gamma))
        split.record(out_s)
        gpu_discount(disc_s, out_s.done, cp.asarray(gamma))
        split.step()
        want, got, unfused = (
            _env_outputs(e, o, d) for e, o, d in ((cpu, out_c, disc_c), (fused, out_f, disc_f), (split, out_s, disc_s))
        )
        for name in want:
            assert_bitwise(got[name], want[name], f"{name} at step {k} (fused against the twin)")
            assert_bitwise(got[name], unfused[name], f"{name} at step {k} (fused against the unfused launches)")
        n_done += int(cpu.done.sum())
    assert n_done >= n  # episodes ended (episode_len 4) and were reset inside the fused launch


@pytest.mark.gpu
def test_gpu_record_step_graphed_equals_eager(cp, rng):
    """record_step captured once and replayed equals eager launches bit for bit; gamma and the actions
    live in device memory, so moving them between replays changes what the graph writes."""
    from cudarl.graph import StepGraph

    eager, graphed, out_e, out_g = _graph_test_envs(rng)
    m = eager.rows_per_step * 300
    disc_e, disc_g = cp.zeros(m, F32), cp.zeros(m, F32)
    gam_e, gam_g = cp.zeros(1, F32), cp.zeros(1, F32)
    g = StepGraph("record_step_test", [("env_step", lambda: graphed.record_step(out_g, disc_g, gam_g))], xp=cp)
    cp.cuda.Device().synchronize()  # construction (reset) ran on the default stream; the graph's is non-blocking
    g.capture()
    for k in range(25):
        a = rng.integers(0, 3, 300).astype(np.int32)
        gamma = np.array([0.9 + 0.004 * k], F32)
        with g.stream:
            graphed.actions.set(a, stream=g.stream)
            gam_g.set(gamma, stream=g.stream)
        g.replay()
        g.synchronize()
        eager.actions.set(a)
        gam_e.set(gamma)
        eager.record_step(out_e, disc_e, gam_e)
        cp.cuda.get_current_stream().synchronize()
        want, got = _env_outputs(eager, out_e, disc_e), _env_outputs(graphed, out_g, disc_g)
        for name in want:
            assert_bitwise(got[name], want[name], f"{name} at step {k}")
        done = out_e.done.get()
        np.testing.assert_array_equal(disc_g.get(), (gamma[0] * (F32(1) - done)).astype(F32))
