"""``cuda_src/optim.cu`` against ``cudarl.reference.optim``, and the reference against textbook forms.

CPU: Adam against a per-parameter textbook loop (float64), schedules against their closed
forms, tau annealing, soft update and shrink-and-perturb identities, checkpoints.
GPU: parity of every op, Adam over 100 steps, graphed == eager bitwise, and a gradient norm
that is bitwise identical across runs.
"""

import math

import numpy as np
import pytest

from cudarl.backend import to_numpy
from cudarl.optim import Adam, Schedule, SoftUpdate, shrink_perturb
from cudarl.reference import optim as ref
from cudarl.testing import assert_bitwise, assert_parity, poison, rel_error

B1, B2 = 0.875, 0.9990234375  # exactly representable in float32, so the textbook sees the kernel's betas


def _scalars64():
    return {
        k: np.zeros(1, np.int64 if k == "step" else np.float64)
        for k in ("step", "lr", "m_scale", "bc1", "bc2", "norm", "clip")
    }


# --- CPU: Adam against the textbook ----------------------------------------------------------------
@pytest.mark.parametrize("wd,max_norm", [(0.0, 0.0), (0.1, 0.5)])
def test_adam_matches_a_textbook_per_parameter_loop(rng, wd, max_norm):
    n, steps, lr, eps = 37, 100, float(np.float32(1e-2)), 1e-8
    p = rng.standard_normal(n)
    mask = (rng.uniform(size=n) < 0.7).astype(np.uint8)
    m, v, s = np.zeros(n), np.zeros(n), _scalars64()
    partial = np.zeros(ref.GN_BLOCKS)
    tp, tm, tv = list(p), [0.0] * n, [0.0] * n  # the textbook's state, plain Python floats
    for t in range(1, steps + 1):
        g = rng.standard_normal(n) * (1 + t % 3)
        ref.lr_schedule(
            s["step"], s["lr"], s["m_scale"], s["bc1"], s["bc2"], ref.CONSTANT, lr, 0.0, 0, 10, 1, 1.0, B1, B2
        )
        ref.grad_norm(g, partial, s["norm"], s["clip"], max_norm)
        ref.adam_update(p, g, m, v, mask, s["lr"], s["m_scale"], s["bc1"], s["bc2"], s["clip"], B1, B2, eps, wd)
        norm = math.sqrt(sum(x * x for x in g))
        coef = max_norm / (norm + 1e-6) if max_norm > 0 and norm + 1e-6 > max_norm else 1.0
        for i in range(n):  # AdamW, Loshchilov & Hutter, Algorithm 2 with eta = lr
            gi = g[i] * coef
            tm[i] = B1 * tm[i] + (1 - B1) * gi
            tv[i] = B2 * tv[i] + (1 - B2) * gi * gi
            if mask[i] and wd:
                tp[i] -= lr * wd * tp[i]
            tp[i] -= lr * (tm[i] / (1 - B1**t)) / (math.sqrt(tv[i] / (1 - B2**t)) + eps)
        assert abs(s["norm"][0] - norm) <= 1e-12 * norm
    assert s["step"][0] == steps
    assert (
        rel_error(p, np.array(tp)) <= 1e-6 and rel_error(m, np.array(tm)) <= 1e-6 and rel_error(v, np.array(tv)) <= 1e-6
    )
    assert rel_error(p, np.array(tp)) <= 1e-12  # same math in float64: only the last bits may differ


def test_clipping_scales_the_gradient_to_max_norm():
    g = np.array([3.0, 4.0], np.float32)
    partial, norm, scale = np.zeros(ref.GN_BLOCKS), np.zeros(1, np.float32), np.zeros(1, np.float32)
    ref.grad_norm(g, partial, norm, scale, 1.0)
    assert norm[0] == 5.0 and abs(scale[0] * 5.0 - 1.0) < 1e-6
    ref.grad_norm(g, partial, norm, scale, 10.0)
    assert scale[0] == 1.0
    ref.grad_norm(g, partial, norm, scale, 0.0)  # disabled
    assert scale[0] == 1.0
    g[0] = np.nan
    ref.grad_norm(g, partial, norm, scale, 1.0)
    assert np.isnan(norm[0])  # the guard must see it


def test_grad_norm_partials_follow_the_kernel_mapping():
    g = np.ones(ref.GN_THREADS * ref.GN_BLOCKS + 3, np.float32)
    partial = np.zeros(ref.GN_BLOCKS)
    ref.grad_norm_partial(g, partial)
    assert partial[0] == ref.GN_THREADS + 3 and partial[1] == ref.GN_THREADS and partial.sum() == g.size


# --- CPU: schedules against closed forms -------------------------------------------------------------
def _run_schedule(sched: Schedule, steps: int):
    s = _scalars64()
    out = []
    for _ in range(steps):
        ref.lr_schedule(
            s["step"],
            s["lr"],
            s["m_scale"],
            s["bc1"],
            s["bc2"],
            ref.SCHEDULES[sched.kind],
            sched.lr,
            sched.lr_min,
            sched.warmup,
            sched.period,
            sched.mult,
            sched.restart_m_scale,
            0.9,
            0.999,
        )
        out.append((s["lr"][0], s["m_scale"][0], s["bc1"][0], s["bc2"][0]))
    return np.array(out)


def test_constant_schedule_and_bias_corrections():
    r = _run_schedule(Schedule("constant", lr=0.5), 50)
    t = np.arange(1, 51)
    assert (r[:, 0] == 0.5).all() and (r[:, 1] == 1).all()
    b1, b2 = float(np.float32(0.9)), float(np.float32(0.999))
    np.testing.assert_allclose(r[:, 2], 1 - b1**t, rtol=1e-14)
    np.testing.assert_allclose(r[:, 3], 1 - b2**t, rtol=1e-14)


def test_cosine_schedule_with_warmup_closed_form():
    lr, lo, W, T = 0.25, 0.01, 5, 40
    r = _run_schedule(Schedule("cosine", lr=lr, lr_min=lo, warmup=W, period=T), 60)
    lo32, lr32 = float(np.float32(lo)), float(np.float32(lr))
    s = np.arange(60)
    want = np.where(
        s < W, lr32 * (s + 1) / W, lo32 + (lr32 - lo32) * (1 + np.cos(np.pi * np.clip(s - W, 0, T) / T)) / 2
    )
    np.testing.assert_allclose(r[:, 0], want, rtol=1e-13)
    assert r[W, 0] == lr32 and r[-1, 0] == lo32  # peak right after warm-up, floor after the period


@pytest.mark.parametrize("mult", [1, 2, 3])
def test_cosine_restarts_closed_form_and_moment_scaling(mult):
    lr, lo, T0, steps = 1.0, 0.0, 8, 200
    r = _run_schedule(Schedule("cosine_restarts", lr=lr, lr_min=lo, period=T0, mult=mult, restart_m_scale=0.25), steps)
    s = np.arange(steps, dtype=np.float64)
    if mult == 1:
        i, tcur, ti = s // T0, s % T0, np.full(steps, T0, np.float64)
    else:  # SGDR closed form: cycle i = floor(log_mult(1 + s (mult - 1) / T0))
        i = np.floor(np.log1p(s * (mult - 1) / T0) / np.log(mult) + 1e-12)
        start = T0 * (mult**i - 1) / (mult - 1)
        tcur, ti = s - start, T0 * mult**i
    np.testing.assert_allclose(r[:, 0], (1 + np.cos(np.pi * tcur / ti)) / 2, rtol=1e-12, atol=1e-15)
    restarts = np.flatnonzero(r[:, 1] != 1)
    assert restarts.tolist() == np.flatnonzero((tcur == 0) & (i > 0)).tolist() and len(restarts) >= 3
    assert (r[restarts, 1] == 0.25).all() and (r[restarts, 0] == 1.0).all()


def test_warm_restart_scales_the_first_moment_once():
    n = 5
    p, m, v, mask = np.ones(n, np.float32), np.full(n, 2.0, np.float32), np.ones(n, np.float32), np.ones(n, np.uint8)
    g = np.zeros(n, np.float32)
    one = np.ones(1, np.float32)
    ref.adam_update(
        p, g, m, v, mask, np.zeros(1, np.float32), np.full(1, 0.5, np.float32), one, one, one, 0.9, 0.999, 1e-8, 0.0
    )
    np.testing.assert_array_equal(m, np.float32(0.9) * (np.float32(0.5) * np.float32(2.0)))


def test_tau_schedule_closed_form_and_soft_update():
    count, tau = np.zeros(1, np.int64), np.zeros(1, np.float32)
    a, b, T = 0.05, 0.001, 10
    got = []
    for _ in range(15):
        ref.tau_schedule(count, tau, a, b, T)
        got.append(tau[0])
    c = np.minimum(np.arange(15), T)
    a32, b32 = float(np.float32(a)), float(np.float32(b))
    np.testing.assert_allclose(got, b32 + (a32 - b32) * (1 + np.cos(np.pi * c / T)) / 2, rtol=1e-6)
    assert got[0] == np.float32(a) and got[-1] == np.float32(b)
    t, o = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    ref.soft_update(t, o, np.ones(1, np.float32))
    assert np.array_equal(t, o)  # tau = 1 copies
    ref.soft_update(t, np.zeros(4, np.float32), np.full(1, 0.5, np.float32))
    assert np.array_equal(t, o / 2)


def test_soft_update_object_anneals_tau_on_each_step(rng):
    target, online = np.zeros(6, np.float32), rng.standard_normal(6).astype(np.float32)
    su = SoftUpdate(target, online, tau_start=1.0, tau_end=0.1, period=4)
    su.step()
    assert np.array_equal(target, online) and su.scalars.get("tau") == 1.0
    for _ in range(5):
        su.step()
    assert su.scalars.get("tau") == np.float32(0.1) and su.scalars.get("count") == 6


def test_shrink_perturb_identity_statistics_and_determinism():
    theta = np.linspace(-1, 1, 100_001).astype(np.float32)
    same = theta.copy()
    shrink_perturb(same, 1.0, 0.0, seed=3, epoch=1)
    assert np.array_equal(same, theta)
    z = np.zeros(100_001, np.float32)
    shrink_perturb(z, 0.5, 1.0, seed=3, epoch=1)
    # N(0, 1): mean within 5 standard errors, std within 2 %
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and abs(z.std() - 1) < 0.02
    z2 = np.zeros_like(z)
    shrink_perturb(z2, 0.5, 1.0, seed=3, epoch=1)
    z3 = np.zeros_like(z)
    shrink_perturb(z3, 0.5, 1.0, seed=3, epoch=2)
    assert np.array_equal(z, z2) and not np.array_equal(z, z3)
    t = theta.copy()
    shrink_perturb(t, 0.8, 0.01, seed=3, epoch=1)
    np.testing.assert_allclose(t, np.float32(0.8) * theta + np.float32(0.01) * z, rtol=1e-6, atol=1e-7)


def test_adam_state_dict_resumes_exactly(rng):
    def make():
        p = np.linspace(-1, 1, 50).astype(np.float32)
        g = np.zeros_like(p)
        return (
            p,
            g,
            Adam(
                p,
                g,
                schedule=Schedule("cosine_restarts", lr=1e-2, period=3, restart_m_scale=0.5),
                weight_decay=0.01,
                max_grad_norm=1.0,
            ),
        )

    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(10)]
    p, g, opt = make()
    for k in range(10):
        g[...] = grads[k]
        opt.step()
        if k == 4:
            saved, p_saved = opt.state_dict(), p.copy()
    p2, g2, opt2 = make()
    p2[...] = p_saved
    opt2.load_state_dict(saved)
    for k in range(5, 10):
        g2[...] = grads[k]
        opt2.step()
    assert np.array_equal(p, p2) and np.array_equal(opt.m, opt2.m) and opt2.scalars.get("step") == 10


def test_schedule_validation():
    with pytest.raises(ValueError):
        Schedule("linear")
    with pytest.raises(ValueError):
        Schedule("cosine_restarts", mult=1.5)
    with pytest.raises(ValueError):
        Schedule(lr=1e-3, lr_min=1e-2)


# --- GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 1000, 131_075, 3_000_001])
def test_gpu_grad_norm_matches_and_is_bitwise_repeatable(cp, rng, n):
    from cudarl.ops import optim as ops

    g = (rng.standard_normal(n) * rng.uniform(0.1, 10, n)).astype(np.float32)
    partial, norm, scale = np.zeros(ref.GN_BLOCKS), np.zeros(1, np.float32), np.zeros(1, np.float32)
    max_norm = float(np.sqrt(n)) * 0.5
    ref.grad_norm(g, partial, norm, scale, max_norm)
    gg = cp.asarray(g)
    done = cp.zeros(1, cp.uint32)  # the one-launch form's ticket, reused: each launch must leave it 0
    outs = []
    for one_launch in (False, False, False, True, True, True):
        gp, gn, gs = cp.zeros(ref.GN_BLOCKS), cp.zeros(1, cp.float32), cp.zeros(1, cp.float32)
        poison(gp)
        poison(gn)
        poison(gs)
        ops.grad_norm(gg, gp, gn, gs, max_norm, done=done if one_launch else None)
        outs.append((gp.get(), gn.get(), gs.get()))
    assert int(done.get()[0]) == 0
    assert_parity(outs[0][0], partial, kind="float64", what="partials")
    assert_parity(outs[0][1], norm, rtol=1e-6, what="norm")
    assert_parity(outs[0][2], scale, rtol=1e-6, what="clip scale")
    for o in outs[1:]:  # repeated, and the one-launch form against the two launches: the same bits
        for a, b in zip(o, outs[0], strict=True):
            assert_bitwise(a, b, what="repeated grad norm, one launch or two")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 300, 131_075, 1_000_003])
def test_gpu_grad_norm_partial_bits_do_not_depend_on_the_fold(cp, rng, n):
    """grad_norm_partial with GN_BLOCKS / F blocks, F = 1, 2, 4, GN_FOLD virtual blocks a block (the
    launchers take GN_FOLD): the same partials, bit for bit, as GN_BLOCKS blocks of one."""
    from cudarl.kernels import launch

    g = cp.asarray((rng.standard_normal(n) * rng.uniform(0.1, 10, n)).astype(np.float32))
    outs = []
    for fold in (1, 2, 4, ref.GN_FOLD):
        partial = cp.zeros(ref.GN_BLOCKS)
        poison(partial)
        launch("optim", "grad_norm_partial", (ref.GN_BLOCKS // fold, 1), ref.GN_THREADS, (g, partial, n, n))
        outs.append(partial.get())
    for fold, o in zip((2, 4, ref.GN_FOLD), outs[1:], strict=True):
        assert_bitwise(o, outs[0], what=f"partials with {fold} virtual blocks a block")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["constant", "cosine", "cosine_restarts"])
def test_gpu_lr_schedule_matches_reference(cp, kind):
    sched = Schedule(kind, lr=3e-4, lr_min=1e-5, warmup=7, period=23, mult=2, restart_m_scale=0.3)
    want = _run_schedule(sched, 200)
    from cudarl.ops import optim as ops
    from cudarl.pinned import DeviceScalars

    sc = DeviceScalars(
        {"step": np.int64, "lr": np.float32, "m_scale": np.float32, "bc1": np.float32, "bc2": np.float32}, cp
    )
    got = []
    for _ in range(200):
        ops.lr_schedule(
            sc.view("step"),
            sc.view("lr"),
            sc.view("m_scale"),
            sc.view("bc1"),
            sc.view("bc2"),
            ref.SCHEDULES[kind],
            sched.lr,
            sched.lr_min,
            sched.warmup,
            sched.period,
            sched.mult,
            sched.restart_m_scale,
            0.9,
            0.999,
        )
        got.append([sc.get(k) for k in ("lr", "m_scale", "bc1", "bc2")])
    got = np.array(got, np.float64)
    assert sc.get("step") == 200
    assert rel_error(got, want.astype(np.float32)) <= 1e-7
    assert np.array_equal(got[:, 1] != 1, want[:, 1] != 1)  # restarts on the same steps


def _adam_pair(cp, seed: int, n=100_003):
    """The same Adam on both backends: parameters and decay mask drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(n).astype(np.float32) * 0.1
    mask = (rng.uniform(size=n) < 0.8).astype(np.uint8)
    kw = dict(
        schedule=Schedule("cosine_restarts", lr=1e-3, lr_min=1e-5, warmup=5, period=30, restart_m_scale=0.5),
        weight_decay=0.01,
        max_grad_norm=50.0,
        decay_mask=mask,
    )
    cpu_p, cpu_g = p0.copy(), np.zeros(n, np.float32)
    gpu_p, gpu_g = cp.asarray(p0), cp.zeros(n, cp.float32)
    return (Adam(cpu_p, cpu_g, **kw), cpu_p, cpu_g), (Adam(gpu_p, gpu_g, xp=cp, **kw), gpu_p, gpu_g)


@pytest.mark.gpu
def test_gpu_adam_matches_reference_over_100_steps(cp, rng):
    (ca, cpn, cg), (ga, gpn, gg) = _adam_pair(cp, 1)
    for _ in range(100):
        g = (rng.standard_normal(cpn.size) * 0.2).astype(np.float32)
        cg[...] = g
        gg[...] = cp.asarray(g)
        ca.step()
        ga.step()
    assert ga.scalars.get("step") == 100
    assert_parity(gpn, cpn, rtol=1e-6, what="params after 100 steps")
    assert_parity(ga.m, ca.m, rtol=1e-5, what="m")
    assert_parity(ga.v, ca.v, rtol=1e-5, what="v")
    for k in ("lr", "bc1", "bc2", "grad_norm", "clip_scale"):
        assert abs(ga.scalars.get(k) - ca.scalars.get(k)) <= 1e-6 * abs(ca.scalars.get(k)), k


def _adam_soft_steps(xp, seed: int, fused: bool, steps: int = 30, n: int = 100_003):
    """``steps`` Adam steps then soft updates of a target toward the parameters: fused into one launch
    (``update_step(soft)``) or as the two calls. Returns (params, target) as NumPy."""
    rng = np.random.default_rng(seed)
    p = xp.asarray(rng.standard_normal(n).astype(np.float32) * 0.1)
    target = xp.asarray(rng.standard_normal(n).astype(np.float32) * 0.1)
    g = xp.zeros(n, np.float32)
    adam = Adam(
        p, g, schedule=Schedule("cosine", lr=1e-3, lr_min=1e-5, period=20), weight_decay=0.01, max_grad_norm=5.0, xp=xp
    )
    soft = SoftUpdate(target, p, tau_start=0.5, tau_end=0.01, period=10, xp=xp)
    for _ in range(steps):
        g[...] = xp.asarray((rng.standard_normal(n) * 0.2).astype(np.float32))
        adam.schedule_step()
        soft.schedule_step()
        adam.clip_step()
        if fused:
            adam.update_step(soft=soft)
        else:
            adam.update_step()
            soft.update_step()
    return to_numpy(p), to_numpy(target)


def test_reference_adam_update_with_soft_update_equals_the_two_calls():
    a_p, a_t = _adam_soft_steps(np, 3, fused=True)
    b_p, b_t = _adam_soft_steps(np, 3, fused=False)
    assert_bitwise(a_p, b_p, what="params")
    assert_bitwise(a_t, b_t, what="target")


def test_adam_update_with_soft_update_refuses_mismatched_arguments():
    p, g, other = np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    adam = Adam(p, g, xp=np)
    with pytest.raises(ValueError, match="soft.online is params"):
        adam.update_step(soft=SoftUpdate(np.zeros(8, np.float32), other, xp=np))


@pytest.mark.gpu
def test_gpu_adam_update_with_soft_update_against_the_two_launches(cp):
    """The parameters and the target are the two launches' bits (both kernels spell the soft update's
    rounding out; left to the compiler it differed by one rounding, the H200 at 18f8334)."""
    fused_p, fused_t = _adam_soft_steps(cp, 4, fused=True)
    again_p, again_t = _adam_soft_steps(cp, 4, fused=True)
    two_p, two_t = _adam_soft_steps(cp, 4, fused=False)
    assert_bitwise(fused_p, two_p, what="params, one launch against two")
    assert_bitwise(fused_t, two_t, what="target, one launch against two")
    assert_bitwise(again_p, fused_p, what="params, fused, run again")
    assert_bitwise(again_t, fused_t, what="target, fused, run again")
    ref_p, ref_t = _adam_soft_steps(np, 4, fused=True)
    assert_parity(fused_p, ref_p, rtol=1e-6, what="params against the twin")
    assert_parity(fused_t, ref_t, rtol=1e-6, what="target against the twin")


@pytest.mark.gpu
def test_gpu_adam_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph

    (_, _, _), (ea, ep, eg) = _adam_pair(cp, 2)
    (_, _, _), (ga, gp, gg) = _adam_pair(cp, 2)
    g = cp.asarray((rng.standard_normal(ep.size) * 0.2).astype(np.float32))
    eg[...] = g
    gg[...] = g
    cp.cuda.Device().synchronize()
    eager = StepGraph("adam_eager_ref", [("adam", ea.step)], xp=cp)
    graphed = StepGraph("adam_graphed", [("adam", ga.step)], xp=cp)
    graphed.capture()
    for _ in range(40):  # crosses the warm-up and a restart: the device counters drive the replay
        eager.run_eager()
        graphed.replay()
    eager.synchronize()
    graphed.synchronize()
    assert ga.scalars.get("step") == 40
    for a, b, what in (
        (gp, ep, "params"),
        (ga.m, ea.m, "m"),
        (ga.v, ea.v, "v"),
        (ga.scalars.buffer, ea.scalars.buffer, "scalars"),
    ):
        assert_bitwise(a, b, what=what)


# --- clip_adam_soft: grad_norm + adam_update_soft + agent publish in one launch ----------------------
_CAS_SLOTS, _CAS_EPS, _CAS_WD = 3, 1e-8, 0.01
_CAS_STATE = ("p", "m", "v", "target")  # what the update moves
_CAS_OUT = ("partial", "norm", "scale", "ring")  # what it writes from nothing


def _cas_inputs(rng, n: int, clip: str) -> dict:
    """Host inputs of one clip_adam_soft: ``clip`` "clips" (max_norm half the norm), "below" (twice it:
    scale 1) or "off" (max_norm 0). Scalars are one optimiser step past a warm restart (m_scale 0.5)."""
    f32 = np.float32
    g = (rng.standard_normal(n) * rng.uniform(0.1, 3.0, n)).astype(f32)
    norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
    t = 7
    return dict(
        p=rng.standard_normal(n).astype(f32),
        g=g,
        m=(rng.standard_normal(n) * 0.01).astype(f32),
        v=rng.uniform(0, 1e-4, n).astype(f32),
        mask=(rng.uniform(size=n) < 0.7).astype(np.uint8),
        target=rng.standard_normal(n).astype(f32),
        partial=np.zeros(ref.GN_BLOCKS),
        norm=np.zeros(1, f32),
        scale=np.zeros(1, f32),
        ring=np.full(2 * _CAS_SLOTS, -1.0, f32),
        lr=np.array([3e-3], f32),
        m_scale=np.array([0.5], f32),
        bc1=np.array([1 - B1**t], f32),
        bc2=np.array([1 - B2**t], f32),
        tau=np.array([0.05], f32),
        loss=np.array([1.2345], f32),
        step=np.array([t], np.int64),
        max_norm={"clips": 0.5 * norm, "below": 2.0 * norm, "off": 0.0}[clip],
    )


def _cas_args(b: dict, done, barrier) -> tuple:
    """clip_adam_soft's positional arguments from the buffers ``b``."""
    return (
        b["p"],
        b["g"],
        b["m"],
        b["v"],
        b["mask"],
        b["target"],
        b["partial"],
        b["norm"],
        b["scale"],
        b["max_norm"],
        done,
        barrier,
        b["lr"],
        b["m_scale"],
        b["bc1"],
        b["bc2"],
        b["tau"],
        b["ring"],
        b["loss"],
        b["step"],
        _CAS_SLOTS,
        B1,
        B2,
        _CAS_EPS,
        _CAS_WD,
    )


def _three_calls(optim_ops, agent_ops, b: dict, done) -> None:
    """The sequence clip_adam_soft stands for: grad_norm (one launch, ``done``), adam_update_soft, publish."""
    optim_ops.grad_norm(b["g"], b["partial"], b["norm"], b["scale"], b["max_norm"], done=done)
    _update_soft(optim_ops, b)
    agent_ops.publish(b["ring"], b["loss"], b["norm"], b["step"], _CAS_SLOTS)


def _update_soft(optim_ops, b: dict) -> None:
    """adam_update_soft of the buffers ``b`` with ``clip = scale`` (clip_adam_soft's update)."""
    optim_ops.adam_update_soft(
        b["p"],
        b["g"],
        b["m"],
        b["v"],
        b["mask"],
        b["target"],
        b["lr"],
        b["m_scale"],
        b["bc1"],
        b["bc2"],
        b["scale"],
        b["tau"],
        B1,
        B2,
        _CAS_EPS,
        _CAS_WD,
    )


def _publish_args(b: dict, done) -> tuple:
    """grad_norm_publish's positional arguments from the buffers ``b``."""
    return (b["g"], b["partial"], b["norm"], b["scale"], b["max_norm"], done, b["ring"], b["loss"], b["step"],
            _CAS_SLOTS)  # fmt: skip


def _host_copy(host: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in host.items()}


@pytest.mark.parametrize("n", [1, 257, 70_001])
@pytest.mark.parametrize("clip", ["clips", "below", "off"])
def test_reference_clip_adam_soft_is_grad_norm_adam_update_soft_and_publish(rng, n, clip):
    from cudarl.reference import agent as ref_agent

    host = _cas_inputs(rng, n, clip)
    fused, three = _host_copy(host), _host_copy(host)
    ref.clip_adam_soft(*_cas_args(fused, np.zeros(1, np.uint32), np.zeros(1, np.uint32)))
    _three_calls(ref, ref_agent, three, np.zeros(1, np.uint32))
    for k in _CAS_STATE + _CAS_OUT:
        assert_bitwise(fused[k], three[k], what=k)
    assert (fused["scale"][0] < 1) == (clip == "clips")
    assert fused["ring"][2] == host["loss"][0] and fused["ring"][3] == fused["norm"][0]  # slot 7 % 3 = 1
    assert np.array_equal(fused["ring"][[0, 1, 4, 5]], host["ring"][[0, 1, 4, 5]])  # the other slots untouched


def _adam_publish_steps(xp, seed: int, fused: bool, steps: int = 12, n: int = 5_003):
    """``steps`` Adam steps with the target update and the publish: ``clip_update_publish`` or the three
    calls it stands for. Returns the state, the scalars and the ring as NumPy."""
    from cudarl.reference import agent as ref_agent

    rng = np.random.default_rng(seed)
    p = xp.asarray(rng.standard_normal(n).astype(np.float32) * 0.1)
    target = xp.asarray(rng.standard_normal(n).astype(np.float32) * 0.1)
    g, loss, ring = xp.zeros(n, np.float32), xp.zeros(1, np.float32), xp.zeros(2 * _CAS_SLOTS, np.float32)
    adam = Adam(
        p,
        g,
        schedule=Schedule("cosine_restarts", lr=1e-3, lr_min=1e-5, warmup=2, period=4, restart_m_scale=0.5),
        weight_decay=0.01,
        max_grad_norm=float(np.sqrt(n)) * 0.2,
        xp=xp,
    )
    soft = SoftUpdate(target, p, tau_start=0.5, tau_end=0.01, period=5, xp=xp)
    rings = []
    for k in range(steps):
        g[...] = xp.asarray((rng.standard_normal(n) * (0.1 + k % 3 * 0.2)).astype(np.float32))  # clips on some steps
        loss[...] = xp.asarray(np.array([1.0 / (k + 1)], np.float32))
        adam.schedule_step()
        soft.schedule_step()
        if fused:
            adam.clip_update_publish(soft, ring, loss, _CAS_SLOTS)
        else:
            adam.clip_step()
            adam.update_step(soft=soft)
            ref_agent.publish(ring, loss, adam.grad_norm_out, adam.scalars.view("step"), _CAS_SLOTS)
        rings.append(to_numpy(ring).copy())
    return {
        "p": to_numpy(p),
        "target": to_numpy(target),
        "m": to_numpy(adam.m),
        "v": to_numpy(adam.v),
        "scalars": to_numpy(adam.scalars.buffer),
        "ring": np.array(rings),
    }


def test_adam_clip_update_publish_equals_the_three_calls_on_numpy():
    a, b = _adam_publish_steps(np, 5, fused=True), _adam_publish_steps(np, 5, fused=False)
    for k in a:
        assert_bitwise(a[k], b[k], what=k)
    assert len(set(a["ring"][:, 1::2].ravel().tolist())) > 3  # the published norms moved


def test_clip_adam_soft_refuses_bad_arguments_before_launching(rng):
    from cudarl.ops import optim as ops

    host = _cas_inputs(rng, 9, "clips")
    done, barrier = np.zeros(1, np.uint32), np.zeros(1, np.uint32)

    def call(**change):
        b = dict(_host_copy(host), **{k: v for k, v in change.items() if k not in ("done", "barrier")})
        ops.clip_adam_soft(*_cas_args(b, change.get("done", done), change.get("barrier", barrier)))

    with pytest.raises(ValueError, match="ring"):
        call(ring=np.zeros(2 * _CAS_SLOTS + 1, np.float32))
    with pytest.raises(ValueError, match="two counters"):
        call(barrier=done)
    with pytest.raises(ValueError, match="barrier must be a uint32"):
        call(barrier=np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="partial"):
        call(partial=np.zeros(ref.GN_BLOCKS - 1))
    with pytest.raises(ValueError, match="clip_adam_soft: target must be flat"):
        call(target=np.zeros(8, np.float32))
    p = host["p"].copy()
    with pytest.raises(ValueError, match="buffer of its own"):
        call(p=p, target=p)
    with pytest.raises(ValueError, match="soft.online is params"):
        q, g = np.zeros(8, np.float32), np.zeros(8, np.float32)
        Adam(q, g, xp=np).clip_update_publish(
            SoftUpdate(np.zeros(8, np.float32), g, xp=np), np.zeros(4, np.float32), np.zeros(1, np.float32), 2
        )


def _cas_device(cp, host: dict) -> dict:
    """Device copies of ``host`` with the outputs poisoned (NaN, so both runs start from the same bits)."""
    b = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    for k in ("partial", "norm", "scale"):
        poison(b[k])
    return b


def _cas_gpu(cp, host: dict, fused, grid=None, done=None, barrier=None) -> dict:
    """One clip_adam_soft (``fused`` True), its two launches without the barrier (``"two"``: through its
    launcher; ``"two_direct"``: grad_norm_publish and adam_update_soft) or the three launches (False) on fresh
    device copies of ``host``; NumPy results."""
    from cudarl.ops import agent as agent_ops
    from cudarl.ops import optim as ops

    b = _cas_device(cp, host)
    done = cp.zeros(1, cp.uint32) if done is None else done
    barrier = cp.zeros(1, cp.uint32) if barrier is None else barrier
    if fused == "two":  # the two launches through the launcher
        ops.clip_adam_soft(*_cas_args(b, done, barrier), grid_barrier=False)
    elif fused == "two_direct":  # the two launched directly
        ops.grad_norm_publish(*_publish_args(b, done))
        _update_soft(ops, b)
    elif fused:
        ops.clip_adam_soft(*_cas_args(b, done, barrier), grid=grid)
    else:
        _three_calls(ops, agent_ops, b, done)
    cp.cuda.Device().synchronize()
    out = {k: b[k].get() for k in _CAS_STATE + _CAS_OUT}
    out["done"], out["barrier"] = done.get(), barrier.get()
    return out


def _assert_cas_equal(got: dict, want: dict, what: str) -> None:
    for k in _CAS_STATE + _CAS_OUT:
        assert_bitwise(got[k], want[k], what=f"{what}: {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 257, 135_000, 1_000_003])
@pytest.mark.parametrize("clip", ["clips", "below", "off"])
def test_gpu_clip_adam_soft_is_the_three_launches_bitwise(cp, rng, n, clip):
    """p, m, v, target, the partials, norm, scale and the ring: the bits of grad_norm (one launch) +
    adam_update_soft + agent publish; both counters left 0; the twin within rounding."""
    host = _cas_inputs(rng, n, clip)
    fused = _cas_gpu(cp, host, fused=True)
    three = _cas_gpu(cp, host, fused=False)
    _assert_cas_equal(fused, three, "one launch against three")
    assert int(fused["done"][0]) == 0 and int(fused["barrier"][0]) == 0, "a counter was not left 0"
    assert (fused["scale"][0] < 1) == (clip == "clips")
    twin = _host_copy(host)
    ref.clip_adam_soft(*_cas_args(twin, np.zeros(1, np.uint32), np.zeros(1, np.uint32)))
    for k in ("p", "m", "v", "target"):
        assert_parity(fused[k], twin[k], rtol=1e-6, what=k)
    assert_parity(fused["partial"], twin["partial"], kind="float64", what="partials")
    assert_parity(fused["norm"], twin["norm"], rtol=1e-6, what="norm")
    assert_parity(fused["scale"], twin["scale"], rtol=1e-6, what="scale")
    assert fused["ring"][2] == host["loss"][0] and fused["ring"][3] == fused["norm"][0]
    assert np.array_equal(fused["ring"][[0, 1, 4, 5]], host["ring"][[0, 1, 4, 5]])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 135_000, 1_000_003])
def test_gpu_clip_adam_soft_bits_do_not_depend_on_the_grid(cp, rng, n):
    """Grids of 1 block (every virtual block of the norm in one, 128 rounds) up to the resident limit."""
    from cudarl.kernels import resident_grid_limit

    host = _cas_inputs(rng, n, "clips")
    three = _cas_gpu(cp, host, fused=False)
    for grid in sorted({1, 2, 3, 7, 33, resident_grid_limit()}):
        got = _cas_gpu(cp, host, fused=True, grid=grid)
        _assert_cas_equal(got, three, f"grid {grid}")
        assert int(got["done"][0]) == 0 and int(got["barrier"][0]) == 0, f"grid {grid}: a counter was not left 0"


@pytest.mark.parametrize("n", [1, 257, 70_001])
@pytest.mark.parametrize("clip", ["clips", "below", "off"])
def test_reference_grad_norm_publish_then_adam_update_soft_is_clip_adam_soft(rng, n, clip):
    """The two launches without the barrier (grad_norm_publish, adam_update_soft with clip = scale) compose to
    the one launch's twin, bit for bit; grad_norm_publish is grad_norm + publish."""
    from cudarl.reference import agent as ref_agent

    host = _cas_inputs(rng, n, clip)
    one, two, three = _host_copy(host), _host_copy(host), _host_copy(host)
    ref.clip_adam_soft(*_cas_args(one, np.zeros(1, np.uint32), np.zeros(1, np.uint32)))
    ref.grad_norm_publish(*_publish_args(two, np.zeros(1, np.uint32)))
    _update_soft(ref, two)
    ref.grad_norm(three["g"], three["partial"], three["norm"], three["scale"], three["max_norm"])
    _update_soft(ref, three)
    ref_agent.publish(three["ring"], three["loss"], three["norm"], three["step"], _CAS_SLOTS)
    for k in _CAS_STATE + _CAS_OUT:
        assert_bitwise(two[k], one[k], what=f"two launches against one: {k}")
        assert_bitwise(two[k], three[k], what=f"grad_norm_publish + adam_update_soft against three twins: {k}")


def test_grad_norm_publish_refuses_bad_arguments_before_launching(rng):
    from cudarl.ops import optim as ops

    host = _cas_inputs(rng, 9, "clips")

    def call(done=None, **change):
        b = dict(_host_copy(host), **change)
        ops.grad_norm_publish(*_publish_args(b, np.zeros(1, np.uint32) if done is None else done))

    with pytest.raises(ValueError, match="grad_norm_publish: ring"):
        call(ring=np.zeros(2 * _CAS_SLOTS + 1, np.float32))
    with pytest.raises(ValueError, match="grad_norm_publish: partial"):
        call(partial=np.zeros(ref.GN_BLOCKS - 1))
    with pytest.raises(ValueError, match="grad_norm_publish: done must be a uint32"):
        call(done=np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="grad_norm_publish: step must be"):
        call(step=np.zeros(2, np.int64))


def test_clip_adam_soft_form_is_the_barrier_rule():
    """ops.clip_adam_soft_one_launch (the launcher's pick) and its twin: the one launch where grid_barrier
    permits it and barrier_grid_fits over the given resident grid; "always" forces it, False never; the twin
    without a limit has no residency (grid_barrier)."""
    from cudarl.kernels import barrier_grid_fits
    from cudarl.ops import optim as ops

    limit, n = 132, 135_000  # an H200; the reference network's parameters: 132 blocks of 1024 a member
    full = ref.clip_adam_soft_blocks(n)
    for mod in (ops, ref):
        for P in (1, 2, 3, 8, 64, 256):
            want = barrier_grid_fits(P, full, limit)
            assert mod.clip_adam_soft_one_launch(P, n, True, limit) == want, (mod.__name__, P)
            assert mod.clip_adam_soft_one_launch(P, n, "always", limit) is True
            assert mod.clip_adam_soft_one_launch(P, n, False, limit) is False
        assert mod.clip_adam_soft_one_launch(16, 8 * 1024, True, limit)  # 132 // 16 = 8 blocks each: fits
        assert not mod.clip_adam_soft_one_launch(17, 8 * 1024, True, limit)
    assert [ops.clip_adam_soft_one_launch(P, n, True, limit) for P in (1, 2)] == [True, False]
    assert ref.clip_adam_soft_one_launch(64, n) and not ref.clip_adam_soft_one_launch(64, n, False)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 257, 135_000, 1_000_003])
@pytest.mark.parametrize("clip", ["clips", "below", "off"])
def test_gpu_clip_adam_soft_two_launches_are_the_one_and_the_three_bitwise(cp, rng, n, clip):
    """grad_norm_publish (the ticket's last block finishing the norm and publishing) + adam_update_soft with
    clip = scale: p, m, v, target, the partials, norm, scale and the ring bit for bit those of the one launch
    (grid barrier) and of the three (grad_norm, adam_update_soft, publish); the counters left 0; the twin
    within rounding."""
    host = _cas_inputs(rng, n, clip)
    one = _cas_gpu(cp, host, fused=True)
    three = _cas_gpu(cp, host, fused=False)
    for form in ("two", "two_direct"):
        two = _cas_gpu(cp, host, fused=form)
        _assert_cas_equal(two, one, f"{form} against one launch")
        _assert_cas_equal(two, three, f"{form} against three")
        assert int(two["done"][0]) == 0 and int(two["barrier"][0]) == 0
    twin = _host_copy(host)
    ref.grad_norm_publish(*_publish_args(twin, np.zeros(1, np.uint32)))
    _update_soft(ref, twin)
    for k in ("p", "m", "v", "target", "norm", "scale"):
        assert_parity(two[k], twin[k], rtol=1e-6, what=k)
    assert_parity(two["partial"], twin["partial"], kind="float64", what="partials")
    assert two["ring"][2] == host["loss"][0] and two["ring"][3] == two["norm"][0]
    assert np.array_equal(two["ring"][[0, 1, 4, 5]], host["ring"][[0, 1, 4, 5]])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 135_000])
def test_gpu_clip_adam_soft_leaves_its_counters_zero_and_reruns_bitwise(cp, rng, n):
    """One pair of counters for every launch: a second launch from the same inputs gives the first's
    bits, and five launches back to back (no host sync between), in the one-launch form and the two-launch
    form sharing the counters, the bits of five three-launch steps."""
    from cudarl.ops import agent as agent_ops
    from cudarl.ops import optim as ops

    host = _cas_inputs(rng, n, "clips")
    done, barrier = cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint32)
    first = _cas_gpu(cp, host, fused=True, done=done, barrier=barrier)
    assert int(done.get()[0]) == 0 and int(barrier.get()[0]) == 0
    again = _cas_gpu(cp, host, fused=True, done=done, barrier=barrier)  # the same counters, fresh inputs
    _assert_cas_equal(again, first, "second launch on the same counters")
    _assert_cas_equal(_cas_gpu(cp, host, fused=True), first, "fresh counters")
    fb, wb, tb = _cas_device(cp, host), _cas_device(cp, host), _cas_device(cp, host)
    tdone = cp.zeros(1, cp.uint32)
    for k in range(5):  # the state moves: each launch reads what the last one wrote
        for b in (fb, wb, tb):
            b["step"][...] = k
        ops.clip_adam_soft(*_cas_args(fb, done, barrier))
        ops.clip_adam_soft(*_cas_args(wb, done, barrier), grid_barrier=False)  # the two launches, the same counters
        _three_calls(ops, agent_ops, tb, tdone)
    cp.cuda.Device().synchronize()
    assert int(done.get()[0]) == 0 and int(barrier.get()[0]) == 0
    for k in _CAS_STATE + _CAS_OUT:
        assert_bitwise(fb[k], tb[k], what=f"five launches: {k}")
        assert_bitwise(wb[k], tb[k], what=f"five two-launch steps: {k}")


@pytest.mark.gpu
def test_gpu_clip_update_publish_graphed_equals_eager_and_the_three_launches(cp):
    """Adam + SoftUpdate + the publish into a pinned ring over 25 steps (gradients and loss new each
    step, warm-up and restarts crossed): graphed == eager == schedule, clip_step, update_step(soft),
    publish, bit for bit, the ring after every step; clip_update_publish in its one launch and in its two
    (grid_barrier=False: grad_norm_publish + adam_update_soft)."""
    from cudarl.graph import StepGraph
    from cudarl.ops import agent as agent_ops
    from cudarl.pinned import PinnedReadback

    n, slots, steps = 135_000, 2, 25
    rng = np.random.default_rng(11)
    p0 = (rng.standard_normal(n) * 0.1).astype(np.float32)
    t0 = (rng.standard_normal(n) * 0.1).astype(np.float32)
    mask = (rng.uniform(size=n) < 0.8).astype(np.uint8)
    twins = {}
    for name in ("cas_eager", "cas_graphed", "cas_two_eager", "cas_two_graphed", "cas_three"):
        p, g, target, loss = cp.asarray(p0), cp.zeros(n, cp.float32), cp.asarray(t0), cp.zeros(1, cp.float32)
        adam = Adam(
            p,
            g,
            schedule=Schedule("cosine_restarts", lr=1e-3, lr_min=1e-5, warmup=3, period=5, restart_m_scale=0.5),
            weight_decay=0.01,
            max_grad_norm=float(np.sqrt(n)) * 0.2,
            decay_mask=mask,
            xp=cp,
        )
        soft = SoftUpdate(target, p, tau_start=0.5, tau_end=0.01, period=10, xp=cp)
        ring = PinnedReadback(2, np.float32, cp, slots=slots)
        ring.device.fill(-1.0)

        def fused(adam=adam, soft=soft, ring=ring, loss=loss, barrier="two" not in name):
            adam.schedule_step()
            soft.schedule_step()
            adam.clip_update_publish(soft, ring.device, loss, slots, grid_barrier=barrier)

        def three(adam=adam, soft=soft, ring=ring, loss=loss):
            adam.schedule_step()
            soft.schedule_step()
            adam.clip_step()
            adam.update_step(soft=soft)
            agent_ops.publish(ring.device, loss, adam.grad_norm_out, adam.scalars.view("step"), slots)

        graph = StepGraph(name, [("adam", three if name == "cas_three" else fused)], xp=cp)
        twins[name] = dict(p=p, g=g, target=target, loss=loss, adam=adam, soft=soft, ring=ring, graph=graph)
    cp.cuda.Device().synchronize()
    twins["cas_graphed"]["graph"].capture()
    twins["cas_two_graphed"]["graph"].capture()
    clipped = set()
    for k in range(steps):
        g = cp.asarray((rng.standard_normal(n) * (0.1 + k % 3 * 0.2)).astype(np.float32))  # clips on some steps
        for tw in twins.values():
            tw["g"][...] = g
            tw["loss"][...] = 1.0 / (k + 1)
        cp.cuda.Device().synchronize()
        for name, tw in twins.items():
            tw["graph"].replay() if name.endswith("graphed") else tw["graph"].run_eager()
        for tw in twins.values():
            tw["graph"].synchronize()
        want = twins["cas_three"]["ring"].device
        for name in ("cas_eager", "cas_graphed", "cas_two_eager", "cas_two_graphed"):
            assert_bitwise(twins[name]["ring"].device, want, what=f"step {k}: {name} ring")
        clipped.add(bool(twins["cas_three"]["adam"].scalars.get("clip_scale") < 1))
    assert clipped == {True, False}, "want steps that clip and steps that do not"
    ref3 = twins["cas_three"]
    assert ref3["adam"].scalars.get("step") == steps
    for name in ("cas_eager", "cas_graphed", "cas_two_eager", "cas_two_graphed"):
        tw = twins[name]
        for what, a, b in (
            ("params", tw["p"], ref3["p"]),
            ("target", tw["target"], ref3["target"]),
            ("m", tw["adam"].m, ref3["adam"].m),
            ("v", tw["adam"].v, ref3["adam"].v),
            ("partials", tw["adam"].partial, ref3["adam"].partial),
            ("adam scalars", tw["adam"].scalars.buffer, ref3["adam"].scalars.buffer),
            ("tau", tw["soft"].scalars.buffer, ref3["soft"].scalars.buffer),
        ):
            assert_bitwise(a, b, what=f"{name} {what}")
        assert int(tw["adam"].gn_done.get()[0]) == 0 and int(tw["adam"].gn_barrier.get()[0]) == 0
    assert not np.array_equal(ref3["p"].get(), p0), "the step did not train"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 300_001])
def test_gpu_soft_update_and_shrink_perturb(cp, rng, n):
    from cudarl.graph import GraphCaptureError, StepGraph
    from cudarl.kernels import KernelError

    t0, o = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    ct = t0.copy()
    cs = SoftUpdate(ct, o, tau_start=0.5, tau_end=0.01, period=3)
    gt = cp.asarray(t0)
    gs = SoftUpdate(gt, cp.asarray(o), tau_start=0.5, tau_end=0.01, period=3)
    for _ in range(5):
        cs.step()
        gs.step()
    assert gs.scalars.get("tau") == cs.scalars.get("tau")
    assert_parity(gt, ct, rtol=1e-6, what="soft update")
    theta = rng.standard_normal(n).astype(np.float32)
    ct = theta.copy()
    shrink_perturb(ct, 0.8, 0.05, seed=9, epoch=4)
    gth = cp.asarray(theta)
    shrink_perturb(gth, 0.8, 0.05, seed=9, epoch=4)
    assert_parity(gth, ct, rtol=1e-6, what="shrink_perturb")
    graph = StepGraph(f"sp_refused_{n}", [("sp", lambda: shrink_perturb(gth, 0.8, 0.05, seed=9, epoch=5))], xp=cp)
    with pytest.raises((KernelError, GraphCaptureError)):
        graph.capture()


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(1, 5), (5, 1), (7, 33), (64, 256), (256, 256), (256, 204)])
@pytest.mark.parametrize("iterate", [0, 1])
def test_gpu_spectral_ops_match_reference(cp, rng, rows, cols, iterate):
    from cudarl.ops import optim as ops

    W = rng.standard_normal((rows, cols)).astype(np.float32)
    u0 = rng.standard_normal(rows).astype(np.float32)
    u0 /= np.linalg.norm(u0)
    v0 = rng.standard_normal(cols).astype(np.float32)
    v0 /= np.linalg.norm(v0)
    dws = rng.standard_normal((rows, cols)).astype(np.float32)
    # the float64 reference on the same float32 inputs, rounded once
    W64, u, v, dws64 = W.astype(np.float64), u0.astype(np.float64), v0.astype(np.float64), dws.astype(np.float64)
    wv, sigma, w_sn = np.empty(rows), np.empty(1), np.empty((rows, cols))
    partial, dW = np.empty(ref.GN_BLOCKS), np.empty((rows, cols))
    ref.spectral_power_iter(W64, u, v, wv, sigma, iterate)
    ref.spectral_scale(W64, sigma, w_sn)
    ref.spectral_dot_partial(dws64, w_sn, partial)
    ref.spectral_backward(dws64, u, v, sigma, partial, dW)
    gW, gu, gv, gd = (cp.asarray(a) for a in (W, u0, v0, dws))
    gwv, gs, gwsn = cp.zeros(rows, cp.float32), cp.zeros(1, cp.float32), cp.zeros((rows, cols), cp.float32)
    gpart, gdW = cp.zeros(ref.GN_BLOCKS), cp.zeros((rows, cols), cp.float32)
    for a in (gwv, gs, gwsn, gpart, gdW):
        poison(a)
    ops.spectral_power_iter(gW, gu, gv, gwv, gs, iterate)
    ops.spectral_scale(gW, gs, gwsn)
    ops.spectral_dot_partial(gd, gwsn, gpart)
    ops.spectral_backward(gd, gu, gv, gs, gpart, gdW)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    for name, a, e in (
        ("u", gu, u),
        ("v", gv, v),
        ("wv", gwv, wv),
        ("sigma", gs, sigma),
        ("w_sn", gwsn, w_sn),
        ("dW", gdW, dW),
    ):
        assert_parity(a, f32(e), what=name)
    assert_parity(gpart, partial, rtol=1e-5, what="partials")  # W_sn is float32 on the GPU


def test_optim_launchers_check_shapes_before_launching():
    from cudarl.ops import optim as ops

    one = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="adam_update: m"):
        ops.adam_update(
            np.zeros(4, np.float32),
            np.zeros(4, np.float32),
            np.zeros(3, np.float32),
            np.zeros(4, np.float32),
            np.zeros(4, np.uint8),
            one,
            one,
            one,
            one,
            one,
            0.9,
            0.999,
            1e-8,
            0.0,
        )
    with pytest.raises(ValueError, match="soft_update: tau"):
        ops.soft_update(np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(2, np.float32))


@pytest.mark.gpu
def test_gpu_train_step_graphed_equals_eager_bitwise(cp, rng):
    """forward + backward + Adam + soft target update, 30 replays against 30 eager runs of a twin."""
    from cudarl.graph import StepGraph
    from cudarl.nn import QNetwork

    B = 512
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    d = cp.asarray((rng.standard_normal((B, 3, 51)) / B).astype(np.float32))
    twins = []
    for name in ("train_eager_ref", "train_graphed"):
        kw = dict(hidden=(256, 256), gemm="cublas", xp=cp, max_batch=B, seed=5, layernorm=True)
        net = QNetwork(64, 3, spectral=("enc.1",), **kw)
        tgt = QNetwork(64, 3, **kw)
        opt = Adam(
            net.params,
            net.grads,
            schedule=Schedule("cosine_restarts", lr=1e-3, period=7, restart_m_scale=0.5),
            max_grad_norm=1.0,
            weight_decay=0.01,
            decay_mask=net.layout.decay_mask(),
        )
        su = SoftUpdate(tgt.params, net.params, tau_start=0.5, tau_end=0.01, period=20)
        net.forward(x)
        net.grad_outputs()["q"][...] = d  # the loss's output; backward only reads it

        def step(net=net, opt=opt, su=su):
            net.forward(x)
            net.backward(x)
            opt.step()
            su.step()

        twins.append((net, tgt, opt, su, StepGraph(name, [("train", step)], xp=cp)))
    init = twins[0][0].params.get()
    cp.cuda.Device().synchronize()
    twins[1][4].capture()
    for _ in range(30):
        twins[0][4].run_eager()
        twins[1][4].replay()
    twins[0][4].synchronize()
    twins[1][4].synchronize()
    (n0, t0, o0, s0, _), (n1, t1, o1, s1, _) = twins
    assert not np.array_equal(n0.params.get(), init), "the step did not train"
    assert o1.scalars.get("step") == 30 and s1.scalars.get("count") == 30
    for a, b, what in (
        (n1.params, n0.params, "params"),
        (o1.m, o0.m, "m"),
        (o1.v, o0.v, "v"),
        (t1.params, t0.params, "target"),
        (o1.scalars.buffer, o0.scalars.buffer, "adam scalars"),
        (s1.scalars.buffer, s0.scalars.buffer, "tau"),
        (n1.linears["enc.1"].sn["u"], n0.linears["enc.1"].sn["u"], "spectral u"),
    ):
        assert_bitwise(a, b, what=what)


# --- clip_adam_soft_vaccine: Gradient Vaccine's apply folded into clip_adam_soft (issue 19) ---------
def _vac_inputs(rng, n: int, plus: bool) -> tuple[dict, dict]:
    """clip_adam_soft's inputs (clipping) and vaccine's: causal's gradient ``plus`` (nonzero on ``[0, stop)``,
    zero past it, as causal's never-written extra heads' entries; ``stop`` 0 without it), the auxiliary gradient
    ``aux``, the state with a coefficient ``c`` that moves the slice, and ``[lo, hi)`` inside ``[0, stop)``."""
    host = _cas_inputs(rng, n, "clips")
    stop = (n - n // 7) if plus else 0
    lo, hi = n // 5, max(n // 5 + 1, (3 * n) // 5)
    p = np.zeros(n, np.float32)
    p[:stop] = rng.standard_normal(stop).astype(np.float32) * 0.3
    vac = {
        "plus": p,
        "aux": rng.standard_normal(n).astype(np.float32) * 0.2,
        "vstate": np.float32([0.3, -0.2, 0.75, 1.0, 1.0]),
        "lo": lo,
        "hi": hi,
        "stop": stop,
    }
    return host, vac


def _vac_args(vac: dict) -> tuple:
    return vac["plus"], vac["aux"], vac["vstate"], vac["lo"], vac["hi"], vac["stop"]


def _vac_apply(vops, g, vac: dict, launcher: bool = False) -> None:
    """Vaccine's apply into ``g`` as its grad phase runs it: ``apply_plus`` over ``[0, stop)``, or ``apply`` over
    the slice; the twin (returns what it writes) or, ``launcher``, the GPU's (writes its ``grads`` argument)."""
    lo, hi, stop, state = vac["lo"], vac["hi"], vac["stop"], vac["vstate"]
    if stop:
        at, op, bounds = slice(0, stop), vops.apply_plus, (lo, hi)
        args = (g[at], vac["plus"][at], vac["aux"][at])
    else:
        at, op, bounds = slice(lo, hi), vops.apply, (0, hi - lo)
        args = (g[at], vac["aux"][at])
    if launcher:
        op(*args, g[at], state, *bounds)
    else:
        g[at] = op(*args, state, *bounds)


@pytest.mark.parametrize("n", [1, 257, 70_001])
@pytest.mark.parametrize("plus", [False, True])
def test_reference_clip_adam_soft_vaccine_is_vaccines_apply_then_clip_adam_soft(rng, n, plus):
    from cudarl.reference import vaccine as vref

    host, vac = _vac_inputs(rng, n, plus)
    fused, two = _host_copy(host), _host_copy(host)
    z = lambda: np.zeros(1, np.uint32)  # noqa: E731
    ref.clip_adam_soft_vaccine(*_cas_args(fused, z(), z()), *_vac_args(vac))
    _vac_apply(vref, two["g"], vac)
    ref.clip_adam_soft(*_cas_args(two, z(), z()))
    for k in (*_CAS_STATE, *_CAS_OUT, "g"):
        assert_bitwise(fused[k], two[k], what=k)
    moved = slice(vac["lo"], vac["hi"]) if not plus else slice(0, vac["stop"])
    assert n == 1 or not np.array_equal(fused["g"][moved], host["g"][moved])  # the gradient was corrected


def test_clip_adam_soft_vaccine_refuses_bad_arguments_before_launching(rng):
    from cudarl.ops import optim as ops

    host, vac = _vac_inputs(rng, 9, True)
    z = lambda: np.zeros(1, np.uint32)  # noqa: E731

    def call(**change):
        v = dict(vac, **change)
        ops.clip_adam_soft_vaccine(*_cas_args(_host_copy(host), z(), z()), *_vac_args(v))

    with pytest.raises(ValueError, match="vaccine's float32"):
        call(vstate=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="lo <= hi"):
        call(lo=5, hi=3)
    with pytest.raises(ValueError, match="stop <= n"):
        call(stop=10)
    with pytest.raises(ValueError, match="aux must be flat"):
        call(aux=np.zeros(8, np.float32))
    b = {k: np.stack([v, v]) if isinstance(v, np.ndarray) and v.shape == (9,) else v for k, v in host.items()}
    with pytest.raises(ValueError, match="one member"):
        ops.clip_adam_soft_vaccine(*_cas_args(b, z(), z()), *_vac_args(vac))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 135_000, 1_000_003])
@pytest.mark.parametrize("plus", [False, True])
def test_gpu_clip_adam_soft_vaccine_is_vaccines_apply_then_clip_adam_soft_bitwise(cp, rng, n, plus):
    """p, m, v, target, the partials, norm, scale, the ring and the corrected gradient g: the bits of vaccine's
    apply (``apply_plus`` with causal's gradient) followed by clip_adam_soft, on grids of 1 block up to the
    resident limit; both counters left 0; the twin within rounding."""
    from cudarl.kernels import resident_grid_limit
    from cudarl.ops import optim as ops
    from cudarl.ops import vaccine as vops

    host, vac = _vac_inputs(rng, n, plus)
    dvac = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in vac.items()}
    keys = (*_CAS_STATE, *_CAS_OUT, "g")
    b = _cas_device(cp, host)
    _vac_apply(vops, b["g"], dvac, launcher=True)
    ops.clip_adam_soft(*_cas_args(b, cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint32)))
    want = {k: b[k].get() for k in keys}
    for grid in sorted({None, 1, 7, resident_grid_limit()}, key=lambda g: g or 0):
        b, done, barrier = _cas_device(cp, host), cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint32)
        ops.clip_adam_soft_vaccine(*_cas_args(b, done, barrier), *_vac_args(dvac), grid=grid)
        cp.cuda.Device().synchronize()
        for k in keys:
            assert_bitwise(b[k].get(), want[k], what=f"grid {grid}: {k}")
        assert int(done.get()[0]) == 0 and int(barrier.get()[0]) == 0, f"grid {grid}: a counter was not left 0"
    twin = _host_copy(host)
    ref.clip_adam_soft_vaccine(*_cas_args(twin, np.zeros(1, np.uint32), np.zeros(1, np.uint32)), *_vac_args(vac))
    for k in ("p", "m", "v", "target", "g"):
        assert_parity(want[k], twin[k], rtol=1e-5, what=k)
