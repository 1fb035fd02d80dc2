"""PopArt family: statistics, output preservation, fitting returns to the atom support, GPU parity."""

import numpy as np
import pytest

from cudarl.popart import PopArt
from cudarl.reference import c51_chain as c51
from cudarl.reference import popart as ref
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, poison, rel_error


def utilisation(probs) -> float:
    """Fraction of atoms whose batch-mean probability exceeds 1 / (10 K)."""
    K = probs.shape[-1]
    return float(np.mean(probs.reshape(-1, K).mean(0) > 1.0 / (10 * K)))


def test_first_update_sets_the_batch_statistics_then_tracks_an_ema(rng):
    st = ref.init_state(scale=2.0)
    y = rng.normal(5.0, 2.0, 4096).astype(np.float32)
    st = ref.update(y, st, beta=0.01)
    np.testing.assert_allclose(st[ref.MU], y.mean(), rtol=1e-5)  # bias correction: no pull towards 0
    np.testing.assert_allclose(st[ref.SIGMA], y.std(), rtol=1e-4)
    # the first update adopts its statistics (no rescale of a fresh network's outputs: nothing to preserve)
    assert (st[ref.MU_PREV], st[ref.SIGMA_PREV]) == (st[ref.MU], st[ref.SIGMA])
    st2 = ref.update(y + 1, st, beta=0.01)
    assert (st2[ref.MU_PREV], st2[ref.SIGMA_PREV]) == (st[ref.MU], st[ref.SIGMA])
    for _ in range(2000):
        st = ref.update(rng.normal(-3.0, 0.5, 256), st, beta=0.01)
    np.testing.assert_allclose([st[ref.MU], st[ref.SIGMA]], [-3.0, 0.5], rtol=0.05)


def _preservation_errors(rng, dtype, scale, moves, beta):
    n_out, n_in = 8, 16
    W = rng.normal(size=(n_in, n_out)).astype(dtype)  # cudarl.nn.Linear's layout
    b = rng.normal(size=n_out).astype(dtype)
    h = rng.normal(size=(32, n_in)).astype(dtype)
    st = ref.update(rng.normal(0.0, 1.0, 512), ref.init_state(scale).astype(dtype), beta=beta, compute_dtype=dtype)
    errs = []
    for loc, sd in moves:
        before = ref.normalize(h @ W + b, st, inverse=True, compute_dtype=dtype)
        st = ref.update(rng.normal(loc, sd, 512), st, beta=beta, compute_dtype=dtype)
        W, b = ref.rescale(W, b, st, compute_dtype=dtype)
        after = ref.normalize(h @ W + b, st, inverse=True, compute_dtype=dtype)
        errs.append(np.linalg.norm(after - before) / np.linalg.norm(before))
    assert abs(st[ref.MU]) > 0.01 and st[ref.SIGMA] != 1.0  # the statistics moved
    return errs


@pytest.mark.parametrize("scale", [1.0, 50 / 3])
def test_rescale_preserves_denormalised_outputs_across_updates(rng, scale):
    # float32, the kernels' precision: a step size and target drift a trainer sees
    moves = [(1.0, 0.5)] + [(1.0 + 0.2 * i, 0.5 + 0.05 * i) for i in range(20)]
    errs = _preservation_errors(rng, np.float32, scale, moves, beta=0.05)
    assert max(errs) < 1e-5, errs


@pytest.mark.parametrize("scale", [1.0, 50 / 3])
def test_rescale_is_exact_in_float64_under_violent_moves(rng, scale):
    errs = _preservation_errors(rng, np.float64, scale, [(100.0, 30.0), (-7.0, 0.1), (0.3, 3.0)], beta=0.3)
    assert max(errs) < 1e-12, errs


def test_popart_object_preserves_outputs_and_round_trips_its_state(rng):
    pop = PopArt(beta=0.2, scale=4.0, xp=np)
    pop.update(rng.normal(0.0, 1.0, 128).astype(np.float32))  # the first update only sets the statistics
    W = rng.normal(size=(5, 3)).astype(np.float32)  # [n_in, n_out]
    b = rng.normal(size=3).astype(np.float32)
    h = rng.normal(size=(10, 5)).astype(np.float32)
    before = pop.denormalize(h @ W + b)
    pop.update(rng.normal(20.0, 5.0, 128).astype(np.float32))
    pop.rescale(W, b)
    assert rel_error(pop.denormalize(h @ W + b), before) < 1e-5
    mu, sigma = pop.statistics()
    assert mu > 9 and sigma > 3  # half way from the first batch (mean 0) to this one (mean 20)
    other = PopArt(xp=np)
    other.load_state_dict(pop.state_dict())
    assert other.statistics() == (mu, sigma) and other.state_dict()["beta"] == np.float32(0.2)


def test_normalised_rewards_give_the_normalised_target(rng):
    st = ref.update(rng.normal(3.0, 2.0, 100), ref.init_state(5.0), beta=0.5)
    r = rng.normal(size=20).astype(np.float32)
    d = rng.choice(np.float32([0.0, 0.9]), 20)
    z_hat = rng.normal(size=20).astype(np.float32)  # a normalised next-state value
    y = ref.td_targets(r, d, z_hat, st)  # return space
    np.testing.assert_allclose(ref.normalize(y, st), ref.normalize_rewards(r, d, st) + d * z_hat, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref.normalize(ref.normalize(y, st), st, inverse=True), y, rtol=1e-5)


def test_update_normalize_rewards_is_update_then_normalize_rewards(rng):
    st = ref.update(rng.normal(3.0, 2.0, 100), ref.init_state(5.0), beta=0.5)
    before = st.copy()
    y = rng.normal(1.0, 4.0, 33).astype(np.float32)
    r = rng.uniform(-2, 2, 33).astype(np.float32)
    d = rng.choice(np.float32([0.0, 0.99]), 33)
    new, r_norm = ref.update_normalize_rewards(y, r, d, st, np.float32(0.1))
    want = ref.update(y, st, np.float32(0.1))
    assert_bitwise(new, want, what="state")
    assert_bitwise(r_norm, ref.normalize_rewards(r, d, want), what="normalised rewards (updated statistics)")
    assert not np.array_equal(r_norm, ref.normalize_rewards(r, d, st))  # the order matters
    np.testing.assert_array_equal(st, before)
    # the object: the same numbers as its two calls (IQN passes the rewards as y)
    one, two = PopArt(beta=0.1, scale=5.0, xp=np), PopArt(beta=0.1, scale=5.0, xp=np)
    one.state[...] = two.state[...] = st
    got = one.update_normalize_rewards(r, r, d)
    two.update(r)
    assert_bitwise(got, two.normalize_rewards(r, d), what="object: normalised rewards")
    assert_bitwise(one.state, two.state, what="object: state")


def _tabular_c51_utilisation(use_popart, gamma, steps=400, B=256, K=51, lr=20.0, seed=0):
    """One-state MDP, rewards U(-1, 1), support [-50, 50]: train C51 logits by gradient descent
    on the C51 loss (target = online), optionally through PopArt; return the final atom
    utilisation and the PopArt statistics."""
    rng = np.random.default_rng(seed)
    z = np.linspace(-50, 50, K, dtype=np.float32)
    theta = np.zeros((1, 1, K), np.float32)
    pop = PopArt.for_support(z, n_sigma=3.0, beta=0.05, xp=np)
    y_prev = None
    for _ in range(steps):
        if use_popart and y_prev is not None:
            pop.update(y_prev)  # before the forward pass, with the previous step's targets
        r = rng.uniform(-1, 1, B).astype(np.float32)
        d = np.full(B, gamma, np.float32)
        logits = np.repeat(theta, B, axis=0)
        p = c51.softmax(logits[:, 0]).astype(np.float32)
        r_in = pop.normalize_rewards(r, d) if use_popart else r
        m = c51.project(p, r_in, d, z)
        if use_popart:
            y_prev = pop.td_targets(r, d, (p * z).sum(1))
        _, _, grad, _ = c51.loss(logits, np.zeros(B, np.int32), m, np.ones(B, np.float32))
        theta -= lr * grad.sum(0, keepdims=True)
    return utilisation(c51.softmax(theta[0])), pop.statistics()


@pytest.mark.parametrize("gamma,floor", [(0.5, 0.75), (0.0, 0.5)])
def test_popart_fits_returns_to_the_atom_support(gamma, floor):
    raw, stats_raw = _tabular_c51_utilisation(False, gamma)
    fitted, (mu, sigma) = _tabular_c51_utilisation(True, gamma)
    assert raw < 0.1, f"raw rewards in [-1, 1] on [-50, 50] should use a few percent of atoms, used {raw:.0%}"
    assert fitted >= floor, f"PopArt should spread returns over most atoms, used {fitted:.0%}"
    assert stats_raw == (0.0, 1.0) and abs(sigma - np.sqrt(1 / 3)) < 0.1  # the observable moved: sigma ~ std U(-1, 1)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 256, 4096])
def test_gpu_popart_ops_match_reference(cp, rng, B):
    from cudarl.ops import popart as ops

    st = ref.update(rng.normal(2.0, 3.0, 64), ref.init_state(50 / 3), beta=0.1)
    y = rng.normal(10.0, 4.0, B).astype(np.float32)
    state = cp.asarray(st)
    ops.update(cp.asarray(y), state, cp.asarray(np.float32([0.1])))
    want = ref.update(y, st, 0.1)
    assert_parity(state, want, what="state after update")  # rel error of the whole state vector
    np.testing.assert_allclose(state.get(), want, rtol=1e-5, atol=1e-6)
    st = want
    n_out, n_in = 5, 33
    W, b = rng.normal(size=(n_in, n_out)).astype(np.float32), rng.normal(size=n_out).astype(np.float32)
    Wd, bd = cp.asarray(W), cp.asarray(b)
    ops.rescale(Wd, bd, cp.asarray(st))
    rW, rb = ref.rescale(W, b, st)
    assert_parity(Wd, rW, what="rescaled W")
    assert_parity(bd, rb, what="rescaled b")
    r = rng.uniform(-1, 1, B).astype(np.float32)
    d = rng.choice(np.float32([0.0, 0.99]), B)
    v = rng.normal(size=B).astype(np.float32)
    for name, launch_, want_ in [
        ("normalize", lambda o: ops.normalize(cp.asarray(y), cp.asarray(st), o), ref.normalize(y, st)),
        (
            "denormalize",
            lambda o: ops.normalize(cp.asarray(y), cp.asarray(st), o, inverse=True),
            ref.normalize(y, st, inverse=True),
        ),
        (
            "normalize_rewards",
            lambda o: ops.normalize_rewards(cp.asarray(r), cp.asarray(d), cp.asarray(st), o),
            ref.normalize_rewards(r, d, st),
        ),
        (
            "td_targets",
            lambda o: ops.td_targets(cp.asarray(r), cp.asarray(d), cp.asarray(v), cp.asarray(st), o),
            ref.td_targets(r, d, v, st),
        ),
    ]:
        out = cp.empty(B, np.float32)
        poison(out)
        launch_(out)
        assert_parity(out, want_.astype(np.float32), what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 256, 257, 4096])
@pytest.mark.parametrize("y_is_r", [False, True])
def test_gpu_update_normalize_rewards_matches_reference_and_replays_bitwise(cp, rng, B, y_is_r):
    """One launch: the update with y, then (r - (1 - d) mu') / s' with the updated statistics;
    y may be the rewards themselves (IQN). Eager and graphed bitwise, the state restored between."""
    from cudarl.graph import StepGraph
    from cudarl.ops import popart as ops

    st = ref.update(rng.normal(2.0, 3.0, 64), ref.init_state(50 / 3), beta=0.1)
    r = rng.uniform(-1, 1, B).astype(np.float32) * 5
    y = r if y_is_r else rng.normal(10.0, 4.0, B).astype(np.float32)
    d = rng.choice(np.float32([0.0, 0.9, 0.99]), B)
    dev = dict(r=cp.asarray(r), d=cp.asarray(d), state=cp.asarray(st), beta=cp.asarray(np.float32([0.1])))
    dev["y"] = dev["r"] if y_is_r else cp.asarray(y)
    out = cp.empty(B, np.float32)
    poison(out)

    def run():
        ops.update_normalize_rewards(dev["y"], dev["r"], dev["d"], dev["state"], dev["beta"], out)

    cp.cuda.Device().synchronize()
    g = StepGraph("popart_update_normalize", [("popart", run)], xp=cp)
    g.run_eager()
    g.synchronize()
    want_state, want_r = ref.update_normalize_rewards(y, r, d, st, np.float32(0.1))
    assert_parity(dev["state"], want_state, what="state after update")
    np.testing.assert_allclose(dev["state"].get(), want_state, rtol=1e-5, atol=1e-6)
    assert_parity(out, want_r, what="normalised rewards")
    first = {"state": dev["state"].get(), "r_norm": out.get()}
    g.capture()

    def restore():
        dev["state"][...] = cp.asarray(st)

    assert_reruns_bitwise(
        g,
        {"r_norm": out},
        first,
        reset=restore,
        check=lambda attempt: assert_bitwise(dev["state"], first["state"], what=f"{attempt} state"),
    )
    # the same statistics as the standalone update kernel (the same reduction), bit for bit
    alone = cp.asarray(st)
    ops.update(dev["y"], alone, dev["beta"])
    assert_bitwise(alone, first["state"], what="state vs cudarl_popart_update")


@pytest.mark.gpu
def test_gpu_popart_object_follows_its_numpy_twin_and_replays_bitwise(cp, rng):
    from cudarl.graph import StepGraph

    B = 512
    gpu, cpu = PopArt(beta=0.05, scale=10.0, xp=cp), PopArt(beta=0.05, scale=10.0, xp=np)
    W = rng.normal(size=(16, 4)).astype(np.float32)  # [n_in, n_out], as a Linear stores it
    b = rng.normal(size=4).astype(np.float32)
    Wd, bd = cp.asarray(W), cp.asarray(b)
    y = cp.asarray(rng.normal(4.0, 2.0, B).astype(np.float32))
    g = StepGraph("popart_parity", [("popart", lambda: (gpu.update(y), gpu.rescale(Wd, bd)))], xp=cp)
    cp.cuda.Device().synchronize()
    g.run_eager()
    g.synchronize()
    cpu.update(y.get())
    cpu.rescale(W, b)
    np.testing.assert_allclose(gpu.state.get(), cpu.state, rtol=1e-5, atol=1e-6)
    assert_parity(Wd, W, what="W after one step")
    snapshot = (gpu.state.copy(), Wd.copy(), bd.copy())
    g.capture()
    g.replay()  # second step, graphed
    g.synchronize()
    cpu.update(y.get())
    cpu.rescale(W, b)
    np.testing.assert_allclose(gpu.state.get(), cpu.state, rtol=1e-5, atol=1e-6)
    assert_parity(Wd, W, what="W after a graphed step")
    assert_parity(bd, b, what="b after a graphed step")
    after_graph = (gpu.state.copy(), Wd.copy(), bd.copy())
    gpu.state[...] = snapshot[0]
    Wd[...] = snapshot[1]
    bd[...] = snapshot[2]
    cp.cuda.Device().synchronize()
    g.run_eager()  # the same second step, eager
    g.synchronize()
    for got, want, what in zip((gpu.state, Wd, bd), after_graph, ("state", "W", "b"), strict=True):
        assert_bitwise(got, want, what=f"eager vs graphed {what}")


def test_rescale_is_the_identity_when_the_statistics_did_not_move(rng):
    """Frozen statistics (agent.popart_warmup): W and b keep their bits ((s b) / s would round b)."""
    st = ref.update(rng.normal(1.0, 2.0, 64), ref.init_state(3.0), beta=0.1)
    st = ref.update(rng.normal(1.0, 2.0, 64), st, beta=0.0)  # beta 0: the statistics stay
    assert st[ref.MU] == st[ref.MU_PREV] and st[ref.SIGMA] == st[ref.SIGMA_PREV]
    W, b = rng.normal(size=(7, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32) * 1e3
    W2, b2 = ref.rescale(W, b, st)
    assert_bitwise(W2, W, what="W")
    assert_bitwise(b2, b, what="b")


@pytest.mark.gpu
def test_gpu_rescale_takes_a_networks_own_last_layer_and_freezes_exactly(cp, rng):
    """The launcher takes a Linear's views of the flat parameters, W [n_in, n_out] (it wanted
    [n_out, n_in] and refused the project's own layers); with unmoved statistics nothing changes."""
    from cudarl.nn import QNetwork
    from cudarl.ops import popart as ops

    net = QNetwork(9, 3, head="iqn", hidden=(16,), n_quantiles=4, n_cos=8, max_batch=4, xp=cp)
    W, b = net.P["head.out.weight"], net.P["head.out.bias"]
    b[...] = cp.asarray(rng.standard_normal(b.shape).astype(np.float32))  # a zero bias maps to zeros
    # the first update only adopts its statistics (no rescale): the second moves them
    st = ref.update(rng.normal(0.5, 2.0, 64), ref.init_state(1.0), beta=0.2)
    st = ref.update(rng.normal(1.5, 3.0, 64), st, beta=0.2)
    W0, b0 = W.get(), b.get()
    ops.rescale(W, b, cp.asarray(st))
    rW, rb = ref.rescale(W0, b0, st)
    assert_parity(W, rW, what="W of head.out")
    assert_parity(b, rb, what="b of head.out")
    frozen = ref.update(rng.normal(0.5, 2.0, 64), st, beta=0.0)
    W1, b1 = W.get(), b.get()
    ops.rescale(W, b, cp.asarray(frozen))
    assert_bitwise(W, W1, what="frozen W")
    assert_bitwise(b, b1, what="frozen b")
