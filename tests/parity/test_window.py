"""window family: observation windows gathered from state rows and the feature matrix, and the input noise
added to them (agent.input_noise).

CPU: the twin by hand (a window of one bar is the env's former observation, the position features only on
the newest bar, zeros before the first bar, the mirror's sign flip, nothing after the observed bar); the
noise from the Philox stream's draws in order, its moments, the position columns untouched.
GPU: the kernels against the twin bit for bit over random rows and awkward shapes, eager and graphed.
"""

import numpy as np
import pytest

from cudarl.reference import window as ref
from cudarl.reference.env import hold_feature

F32 = np.float32


def state_rows(rng, n: int, t_n: int, mirror_every: int = 3) -> np.ndarray:
    rows = np.zeros((n, ref.STATE_DIM), F32)
    rows[:, ref.BAR] = rng.integers(0, t_n, n)
    rows[:, ref.MIRROR] = (np.arange(n) % mirror_every == 0).astype(F32)
    rows[:, ref.POSITION] = rng.choice(F32([-1, -0.5, 0, 0.5, 1]), n)
    rows[:, ref.HOLD] = hold_feature(rng.integers(0, 80, n), 64)
    return rows


def market(rng, t_n: int, f_n: int):
    feats = rng.standard_normal((t_n, f_n)).astype(F32)
    sign = np.where(np.arange(f_n) % 2 == 0, F32(-1), F32(1)).astype(F32)
    return feats, sign


def gather(rows, feats, sign, window):
    out = np.full((rows.shape[0], ref.width(feats.shape[1], window)), np.nan, F32)
    ref.gather(rows, feats, sign, out, window)
    return out


def test_one_bar_is_the_features_and_the_position_features(rng):
    feats, sign = market(rng, 30, 5)
    rows = state_rows(rng, 9, 30)
    out = gather(rows, feats, sign, 1)
    t = rows[:, ref.BAR].astype(int)
    mir = rows[:, ref.MIRROR] == 1
    np.testing.assert_array_equal(out[~mir, :5], feats[t[~mir]])
    np.testing.assert_array_equal(out[mir, :5], feats[t[mir]] * sign)
    np.testing.assert_array_equal(out[:, 5], rows[:, ref.POSITION])
    np.testing.assert_array_equal(out[:, 6], rows[:, ref.HOLD])


def test_a_window_is_the_last_bars_oldest_first_with_the_position_on_the_newest(rng):
    feats, sign = market(rng, 40, 3)
    rows = np.array([[12, 0, 0.5, 0.25], [12, 1, -1, 1.0]], F32)
    out = gather(rows, feats, sign, 4).reshape(2, 4, 5)
    np.testing.assert_array_equal(out[0, :, :3], feats[9:13])
    np.testing.assert_array_equal(out[1, :, :3], feats[9:13] * sign)
    np.testing.assert_array_equal(out[:, :3, 3:], 0)  # position features only on the newest bar
    np.testing.assert_array_equal(out[:, 3, 3:], rows[:, 2:])


def test_bars_before_the_first_are_zeros(rng):
    feats, sign = market(rng, 10, 2)
    out = gather(np.array([[1, 0, 1, 0.5]], F32), feats, sign, 4).reshape(4, 4)
    np.testing.assert_array_equal(out[:2], 0)
    np.testing.assert_array_equal(out[2:, :2], feats[:2])


def test_no_window_reads_a_bar_after_the_one_it_observes(rng):
    """Every window of bars up to t is unchanged when every bar after t changes."""
    feats, sign = market(rng, 50, 4)
    rows = state_rows(rng, 64, 50)
    t = 25
    rows[:, ref.BAR] = np.minimum(rows[:, ref.BAR], t)
    before = gather(rows, feats, sign, 7)
    feats[t + 1 :] = rng.standard_normal(feats[t + 1 :].shape).astype(F32) * 100
    np.testing.assert_array_equal(gather(rows, feats, sign, 7), before)
    feats[t] += 1  # the observed bar itself does change the windows that end on it
    assert not np.array_equal(gather(rows, feats, sign, 7), before)


def test_noise_is_the_centred_sum_of_the_streams_four_draws_per_feature_element(rng):
    """Feature element e (row-major over [n, window, F]) adds scale * (draws 4e..4e+3 summed - 2) of the
    stream: checked against philox.uniform's draws in order (not the twin's block indexing)."""
    from cudarl.reference import philox

    n, window, f_n, seed, ctr = 5, 3, 4, 11, 7
    x = rng.standard_normal((n, ref.width(f_n, window))).astype(F32)
    before = x.copy()
    scale = ref.noise_scale(0.3)
    ref.noise(x, np.array([ctr], np.int64), window, f_n, scale, seed)
    u = philox.uniform(seed, ctr, ref.NOISE_STREAM, 4 * n * window * f_n).reshape(-1, 4)
    z = ((u[:, 0] + u[:, 1]) + (u[:, 2] + u[:, 3])) - F32(2)
    want = before.reshape(n, window, f_n + 2).copy()
    want[:, :, :f_n] += (scale * z).reshape(n, window, f_n)
    np.testing.assert_array_equal(x, want.reshape(x.shape))
    assert scale == F32(0.3 * np.sqrt(3))


def test_noise_has_the_asked_moments_spares_the_position_columns_and_moves_with_the_counter(rng):
    n, window, f_n = 2000, 4, 6
    clean = rng.standard_normal((n, ref.width(f_n, window))).astype(F32)
    draws = []
    for ctr in (0, 0, 1):
        x = clean.copy()
        ref.noise(x, np.array([ctr], np.int64), window, f_n, ref.noise_scale(0.7), seed=3)
        draws.append((x - clean).reshape(n, window, f_n + 2))
    assert np.array_equal(draws[0], draws[1])  # the same counter, the same draws
    d = draws[0][:, :, :f_n].astype(np.float64)
    assert abs(d.mean()) < 0.01 and abs(d.std() - 0.7) < 0.01
    assert abs(d.max()) <= 2 * np.sqrt(3) * 0.7 + 1e-6  # four uniforms: bounded
    assert np.all(draws[0][:, :, f_n:] == 0)
    assert np.corrcoef(d.ravel(), draws[2][:, :, :f_n].ravel())[0, 1] < 0.01  # a new counter, new draws
    x = clean.copy()
    ref.noise(x, np.array([0], np.int64), window, f_n, F32(0), seed=3)
    assert np.array_equal(x, clean)  # scale 0: the windows as they were


def test_noise_refuses_more_feature_elements_than_uint32_indexes():
    """Both faces index the Philox blocks by a uint32: the shared count refuses 2**32 elements and more."""
    assert ref.noise_elements(2**10, 2**11, 2**11 - 1) == 2**32 - 2**21
    with pytest.raises(ValueError, match="uint32"):
        ref.noise_elements(2**10, 2**11, 2**11)


@pytest.mark.gpu
@pytest.mark.parametrize("n,window,f_n", [(1, 1, 1), (7, 3, 5), (512, 64, 11), (4096, 2, 66)])
def test_gpu_noise_matches_reference(cp, rng, n, window, f_n):
    from cudarl.ops import window as ops
    from cudarl.testing import assert_bitwise

    x = rng.standard_normal((n, ref.width(f_n, window))).astype(F32)
    counter = np.array([2**33 + 5], np.int64)  # both halves of the counter in the key
    d = cp.asarray(x)
    ops.noise(d, cp.asarray(counter), window, f_n, ref.noise_scale(0.5), seed=2**40 + 9)
    ref.noise(x, counter, window, f_n, ref.noise_scale(0.5), seed=2**40 + 9)
    assert_bitwise(d, x, what="noisy windows")


@pytest.mark.gpu
def test_gpu_noise_graphed_reads_the_counter_at_replay_time(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import window as ops
    from cudarl.testing import assert_bitwise

    x = rng.standard_normal((64, ref.width(9, 8))).astype(F32)
    d, counter = cp.asarray(x), cp.zeros(1, np.int64)
    scale = ref.noise_scale(1.0)
    g = StepGraph("noise_test", [("noise", lambda: ops.noise(d, counter, 8, 9, scale, 5))], xp=cp)
    g.capture()
    for ctr in (3, 4):
        d[...] = cp.asarray(x)
        counter[...] = ctr
        cp.cuda.Device().synchronize()
        g.replay()
        cp.cuda.Device().synchronize()
        want = x.copy()
        ref.noise(want, np.array([ctr], np.int64), 8, 9, scale, 5)
        assert_bitwise(d, want, what=f"replay at counter {ctr}")


@pytest.mark.gpu
@pytest.mark.parametrize("n,t_n,f_n,window", [(1, 1, 1, 1), (7, 33, 5, 1), (513, 200, 13, 64), (4096, 1000, 66, 3)])
def test_gpu_gather_matches_reference(cp, rng, n, t_n, f_n, window):
    from cudarl.ops import window as ops
    from cudarl.testing import assert_bitwise, poison

    feats, sign = market(rng, t_n, f_n)
    rows = state_rows(rng, n, t_n)
    out = cp.zeros((n, ref.width(f_n, window)), F32)
    poison(out)
    ops.gather(cp.asarray(rows), cp.asarray(feats), cp.asarray(sign), out, window)
    assert_bitwise(out, gather(rows, feats, sign, window), what="windows")


@pytest.mark.gpu
def test_gpu_gather_graphed_equals_eager_and_reads_new_rows(cp, rng):
    """Captured once, a replay gathers the rows and features the buffers hold at replay time."""
    from cudarl.graph import StepGraph
    from cudarl.ops import window as ops
    from cudarl.testing import assert_reruns_bitwise

    feats, sign = market(rng, 300, 9)
    rows = state_rows(rng, 1000, 300)
    d_rows, d_feats, d_sign = cp.asarray(rows), cp.asarray(feats), cp.asarray(sign)
    out = cp.zeros((1000, ref.width(9, 16)), F32)
    g = StepGraph("window_test", [("gather", lambda: ops.gather(d_rows, d_feats, d_sign, out, 16))], xp=cp)
    g.capture()
    assert_reruns_bitwise(g, {"out": out}, {"out": gather(rows, feats, sign, 16)})
    rows2 = state_rows(rng, 1000, 300)
    d_rows[...] = cp.asarray(rows2)
    cp.cuda.Device().synchronize()
    assert_reruns_bitwise(g, {"out": out}, {"out": gather(rows2, feats, sign, 16)})


@pytest.mark.gpu
def test_gpu_launcher_checks_shapes(cp):
    from cudarl.ops import window as ops

    rows, feats, sign = cp.zeros((3, 4), F32), cp.zeros((5, 2), F32), cp.zeros(2, F32)
    with pytest.raises(ValueError, match="out"):
        ops.gather(rows, feats, sign, cp.zeros((3, 7), F32), 2)
    with pytest.raises(ValueError, match="rows"):
        ops.gather(cp.zeros((3, 3), F32), feats, sign, cp.zeros((3, 8), F32), 2)
    with pytest.raises(ValueError, match="x has shape"):
        ops.noise(cp.zeros((3, 7), F32), cp.zeros(1, np.int64), 2, 2, 1.0, 0)
    with pytest.raises(ValueError, match="counter"):
        ops.noise(cp.zeros((3, 8), F32), cp.zeros(1, np.int32), 2, 2, 1.0, 0)
