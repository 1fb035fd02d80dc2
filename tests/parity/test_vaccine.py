"""Gradient Vaccine (Wang et al., ICLR 2021): cuda_src/vaccine.cu, cudarl/reference/vaccine.py."""

import numpy as np
import pytest

from cudarl.reference import vaccine as ref
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, poison


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("target", [0.0, 0.3, 0.8])
def test_surgery_lands_exactly_on_the_target_cosine(rng, target):
    gm = rng.normal(size=500)
    ga = -0.7 * gm + rng.normal(size=500)  # conflicting: cosine well below every target
    assert _cos(gm, ga) < target
    new, phi = ref.surgery(gm, ga, target)
    np.testing.assert_allclose(phi, _cos(gm, ga), rtol=1e-12)
    np.testing.assert_allclose(_cos(gm, new), target, atol=1e-10)
    # only g_main's direction is added: the part of g_aux orthogonal to g_main is untouched
    perp = lambda v: v - (v @ gm) / (gm @ gm) * gm  # noqa: E731
    np.testing.assert_allclose(perp(new), perp(ga), atol=1e-10)


def test_gradients_already_aligned_beyond_the_target_are_left_alone(rng):
    gm = rng.normal(size=300)
    ga = gm + 0.1 * rng.normal(size=300)
    new, phi = ref.surgery(gm, ga, 0.5)
    assert phi > 0.5 and np.array_equal(new, ga)


def test_control_moves_the_target_by_its_ema_and_zero_gradients_give_no_correction():
    part = np.array([[-1.0, 4.0, 1.0]])  # g_m.g_a = -1, |g_m| = 2, |g_a| = 1: phi = -1/2
    st = ref.control(part, np.array([0.2, 0, 0, 0, 0]), 0.1, np.float64)
    np.testing.assert_allclose(st[[0, 1, 3, 4]], [0.9 * 0.2 + 0.1 * -0.5, -0.5, 2.0, 1.0])
    assert st[2] > 0
    st = ref.control(np.zeros((3, 3)), np.array([0.2, 0, 0, 0, 0]), 0.1, np.float64)
    assert st[2] == 0 and st[1] == 0


def test_apply_changes_only_the_encoder_slice(rng):
    full, aux = rng.normal(size=50).astype(np.float32), rng.normal(size=50).astype(np.float32)
    out = ref.apply(full, aux, np.float32([0, 0, 0.5, 0, 0]), 10, 30)
    assert np.array_equal(out[:10], full[:10]) and np.array_equal(out[30:], full[30:])
    np.testing.assert_allclose(out[10:30], full[10:30] + 0.5 * (full[10:30] - aux[10:30]), rtol=1e-6)


def test_the_plus_pair_is_the_pair_over_the_float32_sum(rng):
    """``dots_control_plus`` / ``apply_plus`` (causal's gradient folded in) are the pair over ``full + plus``
    summed in float32, as causal's grad phase summed them before vaccine's ran."""
    n, lo, hi = 9000, 100, 8000
    full, plus, aux = (rng.normal(size=n).astype(np.float32) for _ in range(3))
    st = np.float32([0.6, 0, 0, 0, 0])
    s32 = (full + plus).astype(np.float32)
    p1, st1 = ref.dots_control_plus(full, plus, aux, st, lo, hi, 0.1)
    p2, st2 = ref.dots_control(s32, aux, st, lo, hi, 0.1)
    assert np.array_equal(p1, p2) and np.array_equal(st1, st2) and st1[2] > 0
    out = ref.apply_plus(full, plus, aux, st1, lo, hi)
    assert np.array_equal(out, ref.apply(s32, aux, st1, lo, hi)) and np.array_equal(out[:lo], s32[:lo])


@pytest.mark.parametrize("with_plus", [False, True])
def test_the_one_launchs_twins_are_the_pair(rng, with_plus):
    """``dots_control_apply`` (``_plus``) is ``dots_control`` then ``apply`` (``_plus``) with the new state: the
    twin of the one launch the GPU takes with ``run.grid_barrier``, the bits of the two launches."""
    n, lo, hi = 3 * ref.CHUNK + 70, 33, 3 * ref.CHUNK + 9
    full, plus, aux = (rng.normal(size=n).astype(np.float32) for _ in range(3))
    fulls = (full, plus) if with_plus else (full,)
    st = np.float32([0.6, 0, 0, 0, 0])
    one = ref.dots_control_apply_plus if with_plus else ref.dots_control_apply
    dc, ap = (ref.dots_control_plus, ref.apply_plus) if with_plus else (ref.dots_control, ref.apply)
    part, state, grads = one(*fulls, aux, st, lo, hi, 0.1)
    p2, st2 = dc(*fulls, aux, st, lo, hi, 0.1)
    assert np.array_equal(part, p2) and np.array_equal(state, st2) and state[2] > 0
    assert np.array_equal(grads, ap(*fulls, aux, st2, lo, hi)) and grads.dtype == np.float32
    assert np.array_equal(st, np.float32([0.6, 0, 0, 0, 0]))  # the old state is read, not written


def test_the_one_launch_refuses_one_buffer_as_both_counters(rng):
    from cudarl.ops import vaccine as ops

    n, lo, hi = 100, 0, 100
    full, aux, grads = (np.zeros(n, np.float32) for _ in range(3))
    part, state, counter = np.zeros((1, 3), np.float32), np.zeros(ref.STATE, np.float32), np.zeros(1, np.uint32)
    with pytest.raises(ValueError, match="barrier and done must be counters of their own"):
        ops.dots_control_apply(full, aux, grads, part, state, counter, counter, lo, hi, 0.1)
    with pytest.raises(ValueError, match="done has dtype"):
        ops.dots_control_apply(full, aux, grads, part, state, counter, np.zeros(1, np.int32), lo, hi, 0.1)


def test_dots_chunks_cover_the_slice_once(rng):
    n = 3 * ref.CHUNK + 17
    full, aux = rng.normal(size=n + 40), rng.normal(size=n + 40)
    part = ref.dots(full, aux, 20, 20 + n, np.float64)
    assert part.shape == (4, 3)
    gm, ga = (full - aux)[20 : 20 + n], aux[20 : 20 + n]
    np.testing.assert_allclose(part.sum(0), [gm @ ga, gm @ gm, ga @ ga], rtol=1e-12)


# ---- GPU ------------------------------------------------------------------------------------
def _case(rng, n):
    gm = rng.normal(size=n).astype(np.float32)
    ga = (-0.5 * gm + rng.normal(size=n)).astype(np.float32)
    return gm + ga, ga


@pytest.mark.gpu
@pytest.mark.parametrize("n,lo,hi", [(10, 0, 10), (5000, 3, 4999), (70_001, 0, 65_537), (300_000, 1024, 299_999)])
def test_gpu_matches_reference(cp, rng, n, lo, hi):
    from cudarl.ops import vaccine as ops

    full, aux = _case(rng, n)
    P = ref.blocks(hi - lo)
    part, grads = cp.empty((P, 3), np.float32), cp.empty(n, np.float32)
    poison(part)
    poison(grads)
    state, done = cp.asarray(np.float32([0.3, 0, 0, 0, 0])), cp.zeros(1, np.uint32)
    ops.dots_control(cp.asarray(full), cp.asarray(aux), part, state, done, lo, hi, 0.05)
    assert int(done.get()[0]) == 0  # the ticket is left ready for the next launch
    ops.apply(cp.asarray(full), cp.asarray(aux), grads, state, lo, hi)
    r_part, r_state = ref.dots_control(full, aux, np.float32([0.3, 0, 0, 0, 0]), lo, hi, 0.05)
    assert_parity(part, r_part, rtol=1e-5, what="partial sums")
    assert_parity(state, r_state, rtol=1e-5, what="state")
    assert_parity(grads, ref.apply(full, aux, r_state, lo, hi), rtol=1e-5, what="grads")
    inplace = cp.asarray(aux)
    ops.apply(cp.asarray(full), inplace, inplace, state, lo, hi)
    assert_bitwise(inplace, grads, what="in place (grads = aux)")


@pytest.mark.gpu
@pytest.mark.parametrize("n,lo,hi", [(10, 0, 10), (70_001, 3, 65_537), (300_000, 1024, 299_999)])
def test_gpu_plus_pair_matches_reference_and_is_the_pair_after_the_add_bitwise(cp, rng, n, lo, hi):
    """The _plus kernels against their twins, and bit for bit the plain pair run after ``util.add_f32`` (causal's
    grad phase's add, which the fold replaces)."""
    from cudarl.backend import family
    from cudarl.ops import vaccine as ops

    full, aux = _case(rng, n)
    plus = rng.normal(size=n).astype(np.float32)
    P, st0 = ref.blocks(hi - lo), np.float32([0.3, 0, 0, 0, 0])
    out = {}
    for way in ("plus", "add"):
        part, state, done = cp.empty((P, 3), np.float32), cp.asarray(st0), cp.zeros(1, np.uint32)
        poison(part)
        g = cp.asarray(full)
        if way == "plus":
            ops.dots_control_plus(g, cp.asarray(plus), cp.asarray(aux), part, state, done, lo, hi, 0.05)
            ops.apply_plus(g, cp.asarray(plus), cp.asarray(aux), g, state, lo, hi)
        else:
            family("util", cp).add_f32(g, g, cp.asarray(plus))
            ops.dots_control(g, cp.asarray(aux), part, state, done, lo, hi, 0.05)
            ops.apply(g, cp.asarray(aux), g, state, lo, hi)
        out[way] = (part, state, g)
    r_part, r_state = ref.dots_control_plus(full, plus, aux, st0, lo, hi, 0.05)
    assert_parity(out["plus"][0], r_part, rtol=1e-5, what="partial sums")
    assert_parity(out["plus"][1], r_state, rtol=1e-5, what="state")
    assert_parity(out["plus"][2], ref.apply_plus(full, plus, aux, r_state, lo, hi), rtol=1e-5, what="grads")
    for a, b, what in zip(out["plus"], out["add"], ("partial", "state", "grads"), strict=True):
        assert_bitwise(a, b, what=f"{what}: plus against add then the pair")


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise_and_the_target_moves_each_replay(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import vaccine as ops

    n, lo, hi = 100_000, 0, 90_000
    full, aux = (cp.asarray(a) for a in _case(rng, n))
    part, grads, state = (
        cp.zeros((ref.blocks(hi - lo), 3), np.float32),
        cp.zeros(n, np.float32),
        cp.zeros(5, np.float32),
    )
    done = cp.zeros(1, np.uint32)

    def phase():
        ops.dots_control(full, aux, part, state, done, lo, hi, 0.1)
        ops.apply(full, aux, grads, state, lo, hi)

    g = StepGraph("vaccine_parity", [("v", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    want_g, want_s = grads.get(), state.get()
    g.capture()
    state[...] = 0  # the eager run moved the target; the replay starts where it started
    poison(grads)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_bitwise(grads, want_g, what="graphed grads")
    assert_bitwise(state, want_s, what="graphed state")
    g.replay()
    g.synchronize()
    assert state.get()[0] != want_s[0], "the target's EMA did not move on the second replay"


# the cases of the tests above; 300_000 elements: P = 74 chunks; hi - lo = 600_000: P = 147, more than the
# resident grid of an H100 or H200 (132 SMs), so blocks take two chunks
ONE_LAUNCH_CASES = [
    (10, 0, 10),
    (5000, 3, 4999),
    (70_001, 0, 65_537),
    (70_001, 3, 65_537),
    (300_000, 1024, 299_999),
    (700_001, 50_000, 650_000),
]


def _one_and_pair(ops, with_plus):
    if with_plus:
        return ops.dots_control_apply_plus, ops.dots_control_plus, ops.apply_plus
    return ops.dots_control_apply, ops.dots_control, ops.apply


@pytest.mark.gpu
@pytest.mark.parametrize(
    "with_plus,into", [(False, "grads"), (False, "full"), (False, "aux"), (True, "grads"), (True, "full")]
)
@pytest.mark.parametrize("n,lo,hi", ONE_LAUNCH_CASES)
def test_gpu_one_launch_matches_reference_and_is_the_two_launches_bitwise(cp, rng, n, lo, hi, with_plus, into):
    """``dots_control_apply`` (``_plus``: causal's gradient folded in): its twin within rounding, and bit for
    bit ``dots_control`` then ``apply`` (the partials, the state, the gradient), into a buffer of its own or in
    place (``full``, as the grad phase runs it; ``aux``); both counters 0 after the launch."""
    from cudarl.ops import vaccine as ops

    full, aux = _case(rng, n)
    plus = rng.normal(size=n).astype(np.float32)
    fulls_h = (full, plus) if with_plus else (full,)
    P, st0 = ref.blocks(hi - lo), np.float32([0.3, 0, 0, 0, 0])
    one, dots_control, apply = _one_and_pair(ops, with_plus)
    out = {}
    for way in ("one", "two"):
        f, a = cp.asarray(full), cp.asarray(aux)
        fulls = (f, cp.asarray(plus)) if with_plus else (f,)
        grads = {"grads": cp.empty(n, np.float32), "full": f, "aux": a}[into]
        if into == "grads":
            poison(grads)
        part, state = cp.empty((P, 3), np.float32), cp.asarray(st0)
        barrier, done = cp.zeros(1, np.uint32), cp.zeros(1, np.uint32)
        poison(part)
        if way == "one":
            one(*fulls, a, grads, part, state, barrier, done, lo, hi, 0.05)
            assert barrier.get()[0] == 0 and done.get()[0] == 0, "the counters are left 0"
        else:
            dots_control(*fulls, a, part, state, done, lo, hi, 0.05)
            apply(*fulls, a, grads, state, lo, hi)
        out[way] = (part, state, grads)
    twin = ref.dots_control_apply_plus if with_plus else ref.dots_control_apply
    r_part, r_state, r_grads = twin(*fulls_h, aux, st0, lo, hi, 0.05)
    assert_parity(out["one"][0], r_part, rtol=1e-5, what="partial sums")
    assert_parity(out["one"][1], r_state, rtol=1e-5, what="state")
    assert_parity(out["one"][2], r_grads, rtol=1e-5, what="grads")
    for a, b, what in zip(out["one"], out["two"], ("partial", "state", "grads"), strict=True):
        assert_bitwise(a, b, what=f"{what}: the one launch against the two")


@pytest.mark.gpu
@pytest.mark.parametrize("with_plus", [False, True])
def test_gpu_one_launch_graphed_equals_eager_bitwise_and_the_target_moves_each_replay(cp, rng, with_plus):
    """The one launch captured: its replay the bits of its eager run (state, partials, the gradient in place,
    as the grad phase runs it), the counters left 0, and the target's EMA read and moved by each replay."""
    from cudarl.graph import StepGraph
    from cudarl.ops import vaccine as ops

    n, lo, hi = 700_001, 3, 650_000  # P = 159 chunks, more than one a block
    full0, aux = (cp.asarray(a) for a in _case(rng, n))
    plus = cp.asarray(rng.normal(size=n).astype(np.float32))
    full = full0.copy()
    fulls = (full, plus) if with_plus else (full,)
    part, state = cp.zeros((ref.blocks(hi - lo), 3), np.float32), cp.zeros(5, np.float32)
    barrier, done = cp.zeros(1, np.uint32), cp.zeros(1, np.uint32)
    one = _one_and_pair(ops, with_plus)[0]

    def phase():
        one(*fulls, aux, full, part, state, barrier, done, lo, hi, 0.1)

    g = StepGraph("vaccine_one_parity", [("v", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    want_s = state.get()
    want = {"grads": full.get(), "state": want_s, "partials": part.get()}
    g.capture()

    def reset():  # the eager run moved the target and the gradient; the replay starts where it started
        state[...] = 0
        full[...] = full0

    def counters_left_zero(_):
        assert barrier.get()[0] == 0 and done.get()[0] == 0

    outputs = {"grads": full, "state": state, "partials": part}
    assert_reruns_bitwise(g, outputs, want, ("graphed",), reset=reset, check=counters_left_zero)
    full[...] = full0
    g.replay()
    g.synchronize()
    moved = state.get()
    assert moved[0] != want_s[0], "the target's EMA did not move on the second replay"
    assert moved[2] != want_s[2], "the second replay's coefficient is not against the moved target"
    assert barrier.get()[0] == 0 and done.get()[0] == 0
