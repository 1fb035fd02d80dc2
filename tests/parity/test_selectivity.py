"""The selectivity gate (cuda_src/selectivity.cu, cudarl/reference/selectivity.py, its module in QNetwork)."""

import numpy as np
import pytest

from cudarl.auxiliary.selectivity import InputGate
from cudarl.nn import QNetwork
from cudarl.reference import selectivity as ref
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison


def test_gate_index_never_gates_the_position_columns():
    idx = ref.gate_index(3, 4, 2, "features").reshape(3, 4)
    assert idx.tolist() == [[0, 1, -1, -1]] * 3
    idx = ref.gate_index(3, 4, 2, "positions").reshape(3, 4)
    assert idx.tolist() == [[0, 0, -1, -1], [1, 1, -1, -1], [2, 2, -1, -1]]


@pytest.mark.parametrize("over", ["features", "positions"])
def test_backward_matches_finite_differences_of_the_gated_loss_and_penalty(rng, over):
    B, W, F = 3, 4, 5
    C = F + 2
    x = rng.normal(size=(B, W * C))
    R = rng.normal(size=(B, W * C))  # L = sum(R * x') + penalty
    logit = rng.normal(size=ref.n_gates(W, F, over))

    def loss(lg):
        return float((R * ref.forward(x, lg, W, C, F, over, np.float64)).sum()) + ref.penalty(lg, 0.3)

    got = ref.backward(x, R, logit, W, C, F, over, 0.3, np.float64)
    np.testing.assert_allclose(got, finite_difference(loss, logit), atol=1e-9, rtol=1e-6)


@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
def test_the_networks_gradient_through_the_gate_matches_finite_differences(rng, encoder):
    """QNetwork with the gate, float64: every parameter's gradient (the gate's, the encoder's below it)
    against central differences of ``sum(out * R)`` plus the gate's penalty."""
    W, F, A = 3, 2, 3
    net_kw = {"mlp": {}, "ssm": {"d_model": 8, "layers": 1, "ssm_state": 4, "ssm_headdim": 4, "ssm_chunk": 3}}
    net_kw["attention"] = {"d_model": 8, "layers": 1, "attn_heads": 2}
    net = QNetwork(
        W * (F + 2),
        A,
        encoder=encoder,
        window=W,
        hidden=(6,),
        atoms=5,
        input_gate=lambda n: InputGate(n, W, "features", 0.2),
        dtype=np.float64,
        max_batch=4,
        **net_kw[encoder],
    )
    assert (net.folded is not None) == (encoder == "mlp")  # the MLP folds the gate into its first layer
    _assert_gradients_match_finite_differences(net, rng, l1=0.2, samples=150)


def _assert_gradients_match_finite_differences(net, rng, l1: float, samples: int) -> None:
    """A float64 gated ``net``'s gradient of ``sum(q * R) + penalty(gate, l1)`` (its parameters perturbed) at
    about ``samples`` parameters spread over the layout and every gate logit, against central differences."""
    net.params += 0.1 * rng.standard_normal(net.params.shape)
    x = rng.normal(size=(4, net.n_in))
    R = rng.normal(size=net.forward_shape(4))

    def loss():
        return float((net.forward(x)["q"] * R).sum()) + ref.penalty(net.P["sel.logit"], l1)

    loss()
    net.grad_outputs()["q"][...] = R
    net.backward(x)
    an = net.grads.copy()
    idx = [e.offset + k for e in net.layout.entries for k in range(int(np.prod(e.shape)))]
    lo = net.layout["sel.logit"].offset
    idx = sorted(set(idx[:: max(1, len(idx) // samples)]) | set(range(lo, lo + net.layout["sel.logit"].shape[0])))
    fd = np.zeros_like(an)
    for i in idx:
        old = net.params[i]
        net.params[i] = old + 1e-6
        up = loss()
        net.params[i] = old - 1e-6
        down = loss()
        net.params[i] = old
        fd[i] = (up - down) / 2e-6
    np.testing.assert_allclose(an[idx], fd[idx], atol=1e-7, rtol=1e-5)


# ---- the gate folded into the first layer's weight ------------------------------------------------
def _folded_case(rng, B, W, F, H, over, dtype=np.float64):
    C = F + 2
    x = rng.normal(size=(B, W * C)).astype(dtype)
    w = rng.normal(size=(W * C, H)).astype(dtype)
    logit = rng.normal(size=ref.n_gates(W, F, over)).astype(dtype)
    return x, w, logit, C


@pytest.mark.parametrize("over", ["features", "positions"])
def test_the_fold_twins_against_a_float64_oracle(rng, over):
    """fold: each element the one product s_j w (the position rows copied, exactly); fold_backward: dW1 the one
    product s_j R, dlogit within float32 rounding of the float64 sums."""
    B, W, F, H = 5, 4, 3, 7
    x, w, logit, C = _folded_case(rng, B, W, F, H, over)
    s64 = np.concatenate([1.0 / (1.0 + np.exp(-logit)), [1.0]])[ref.gate_index(W, C, F, over)]  # [W C]
    want_wg = s64[:, None] * w
    w32, l32 = w.astype(np.float32), logit.astype(np.float32)
    wg = np.full(w.shape, np.nan, np.float32)
    ref.fold(w32, l32, wg, W, C, F, over)
    np.testing.assert_allclose(wg, want_wg, rtol=2e-7, atol=0)
    pos = ref.gate_index(W, C, F, over) < 0
    np.testing.assert_array_equal(wg[pos], w32[pos])  # never gated: copied
    R = rng.normal(size=w.shape)
    J = logit.shape[0]
    per = np.array([(w * R).sum(1)[ref.gate_index(W, C, F, over) == j].sum() for j in range(J)])
    sj = 1.0 / (1.0 + np.exp(-logit))
    want_dl = sj * (1 - sj) * (per + 0.3 / J)
    dw, dl = R.astype(np.float32), np.full(J, np.nan, np.float32)
    ref.fold_backward(w32, l32, dw, dl, W, C, F, over, 0.3)
    np.testing.assert_allclose(dw, s64[:, None] * R, rtol=2e-7, atol=0)
    np.testing.assert_allclose(dl, want_dl, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("over", ["features", "positions"])
def test_the_folded_backward_matches_finite_differences(rng, over):
    """float64: L = sum(Y * (x @ fold(W1, l))) + penalty(l); the first layer's dW GEMM over the ungated x gives
    R = x^T Y, which fold_backward turns into dL/dW1 and dL/dl: both against central differences."""
    B, W, F, H = 3, 3, 2, 4
    x, w, logit, C = _folded_case(rng, B, W, F, H, over)
    Y = rng.normal(size=(B, H))

    def loss(w_, lg):
        wg = np.empty_like(w_)
        ref.fold(w_, lg, wg, W, C, F, over)
        return float((Y * (x @ wg)).sum()) + ref.penalty(lg, 0.2)

    dw, dl = x.T @ Y, np.zeros_like(logit)
    ref.fold_backward(w, logit, dw, dl, W, C, F, over, 0.2)
    np.testing.assert_allclose(dl, finite_difference(lambda lg: loss(w, lg), logit), atol=1e-8, rtol=1e-6)
    np.testing.assert_allclose(dw, finite_difference(lambda w_: loss(w_, logit), w), atol=1e-8, rtol=1e-6)


def _gated_net(over, folded: bool, dtype=np.float32, **net):
    W, F = 3, 4
    kw = {"window": W, "hidden": (16, 8), "atoms": 5, **net}
    q = QNetwork(W * (F + 2), 3, input_gate=lambda n: InputGate(n, W, over, 0.05), dtype=dtype, max_batch=6, **kw)
    assert (q.folded is not None) == folded
    return q


def _unfold(net) -> None:
    """The same network with its gate in front of the encoder again (the path the fold replaced)."""
    net.encoder.gate_linear.fold, net.folded = None, None


@pytest.mark.parametrize("over", ["features", "positions"])
@pytest.mark.parametrize("net_kw", [{}, {"layernorm": True}, {"hidden": (8,)}], ids=["mlp", "layernorm", "one-layer"])
def test_the_folded_network_is_the_gated_network_to_rounding(rng, over, net_kw):
    """The MLP folds the gate (QNetwork.folded): its forward and every gradient (the gate's included) agree
    with the gate in front of the encoder to float32 rounding ((x s) W1 and x (s W1) round differently)."""
    net = _gated_net(over, True, **net_kw)
    net.params += (0.1 * rng.standard_normal(net.params.shape)).astype(np.float32)
    x = rng.normal(size=(6, net.n_in)).astype(np.float32)
    R = rng.normal(size=net.forward_shape(6)).astype(np.float32)
    runs = []
    for _ in range(2):
        q = net.forward(x)["q"].copy()
        net.grad_outputs()["q"][...] = R
        net.backward(x)
        runs.append((q, net.grads.copy()))
        _unfold(net)
    (q1, g1), (q0, g0) = runs
    assert_parity(q1, q0, rtol=1e-5, what="folded forward")
    assert_parity(g1, g0, rtol=1e-5, what="folded gradient")
    lo = net.layout["sel.logit"].offset
    J = net.layout["sel.logit"].shape[0]
    assert_parity(g1[lo : lo + J], g0[lo : lo + J], rtol=1e-4, what="dlogit")


@pytest.mark.parametrize("over", ["features", "positions"])
def test_the_folded_networks_gradient_matches_finite_differences(rng, over):
    net = _gated_net(over, True, dtype=np.float64, hidden=(6,))
    _assert_gradients_match_finite_differences(net, rng, l1=0.05, samples=120)


def test_the_gate_folds_only_into_a_first_layer_without_spectral_norm():
    """Spectral norm on the first layer (W_sn is no row-scaled weight) and the windowed encoders keep the gate
    in front of the encoder; spectral norm elsewhere does not stop the fold."""
    assert _gated_net("features", True, spectral=("enc.1",)).folded is not None
    net = _gated_net("features", False, spectral=("enc.0",))
    assert net.encoder.gate_linear.fold is None
    for encoder, kw in [("ssm", {"d_model": 8, "layers": 1, "ssm_state": 4, "ssm_headdim": 4, "ssm_chunk": 3}),
                        ("attention", {"d_model": 8, "layers": 1, "attn_heads": 2})]:  # fmt: skip
        assert _gated_net("features", False, encoder=encoder, **kw).encoder.gate_linear is None


def test_a_forward_folds_first_unless_prefolded(rng):
    """Outside the train step every forward folds from the current parameters (a poisoned fold is rewritten);
    prefolded, it reads the fold as fold_gate() left it."""
    net = _gated_net("positions", True)
    x = rng.normal(size=(6, net.n_in)).astype(np.float32)
    want = net.forward(x)["q"].copy()
    net.folded.weight[...] = np.nan
    np.testing.assert_array_equal(net.forward(x)["q"], want)
    net.folded.weight[...] = np.nan
    with net.prefolded_forwards():
        assert np.isnan(net.forward(x)["q"]).all()  # it read the poisoned fold
        net.fold_gate()
        np.testing.assert_array_equal(net.forward(x)["q"], want)
    assert not net.prefolded


def test_the_twin_folds_into_a_weight_of_its_own_and_backs_up_the_same_bits(rng):
    net = _gated_net("features", True)
    twin = net.twin()
    assert twin.folded is not None and twin.folded.weight is not net.folded.weight
    assert twin.folded.w1 is not None and np.shares_memory(twin.folded.w1, net.folded.w1)
    assert not np.shares_memory(twin.folded.dw1, net.folded.dw1)
    x = rng.normal(size=(6, net.n_in)).astype(np.float32)
    net.forward(x)
    net.grad_outputs()["q"][...] = rng.normal(size=net.forward_shape(6)).astype(np.float32)
    twin.backward(x, net.ws)
    net.backward(x)
    assert_bitwise(twin.grads, net.grads)


# ---- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("over", ["features", "positions"])
@pytest.mark.parametrize("B,W,F", [(1, 1, 1), (7, 16, 5), (512, 64, 14), (33, 7, 30)])
def test_gpu_matches_reference(cp, rng, over, B, W, F):
    from cudarl.ops import selectivity as ops

    C = F + 2
    x = rng.normal(size=(B, W * C)).astype(np.float32)
    dxg = rng.normal(size=(B, W * C)).astype(np.float32)
    logit = rng.normal(size=ref.n_gates(W, F, over)).astype(np.float32)
    out, dl = cp.empty(x.shape, np.float32), cp.empty(logit.shape, np.float32)
    poison(out)
    poison(dl)
    ops.forward(cp.asarray(x), cp.asarray(logit), out, W, C, F, over)
    ops.backward(cp.asarray(x), cp.asarray(dxg), cp.asarray(logit), dl, W, C, F, over, 0.1)
    assert_parity(out, ref.forward(x, logit, W, C, F, over), what="gated x")
    r32 = ref.backward(x, dxg, logit, W, C, F, over, 0.1)
    assert_parity(dl, r32, rtol=1e-4, what="dlogit")


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import selectivity as ops

    B, W, F = 256, 32, 9
    C = F + 2
    x, dxg = (cp.asarray(rng.normal(size=(B, W * C)).astype(np.float32)) for _ in range(2))
    logit = cp.asarray(rng.normal(size=F).astype(np.float32))
    out, dl = cp.zeros(x.shape, np.float32), cp.zeros(F, np.float32)

    def phase():
        ops.forward(x, logit, out, W, C, F, "features")
        ops.backward(x, dxg, logit, dl, W, C, F, "features", 0.01)

    g = StepGraph("selectivity_parity", [("s", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    want = out.get(), dl.get()
    g.capture()
    poison(out)
    poison(dl)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_bitwise(out, want[0])
    assert_bitwise(dl, want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("over", ["features", "positions"])
@pytest.mark.parametrize("W,F,H", [(1, 1, 1), (7, 5, 33), (64, 14, 256), (16, 30, 5)])
def test_gpu_fold_matches_reference(cp, rng, over, W, F, H):
    from cudarl.ops import selectivity as ops

    C = F + 2
    w = rng.normal(size=(W * C, H)).astype(np.float32)
    R = rng.normal(size=(W * C, H)).astype(np.float32)
    logit = rng.normal(size=ref.n_gates(W, F, over)).astype(np.float32)
    wg, dl = cp.empty(w.shape, np.float32), cp.empty(logit.shape, np.float32)
    poison(wg)
    poison(dl)
    ops.fold(cp.asarray(w), cp.asarray(logit), wg, W, C, F, over)
    want = np.empty_like(w)
    ref.fold(w, logit, want, W, C, F, over)
    assert_parity(wg, want, what="folded weight")
    dw = cp.asarray(R)
    ops.fold_backward(cp.asarray(w), cp.asarray(logit), dw, dl, W, C, F, over, 0.1)
    want_dw, want_dl = R.copy(), np.empty_like(logit)
    ref.fold_backward(w, logit, want_dw, want_dl, W, C, F, over, 0.1)
    assert_parity(dw, want_dw, what="dW1")
    assert_parity(dl, want_dl, rtol=1e-4, what="dlogit")


@pytest.mark.gpu
def test_gpu_fold_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import selectivity as ops

    W, F, H = 32, 9, 256
    C = F + 2
    w, R = (cp.asarray(rng.normal(size=(W * C, H)).astype(np.float32)) for _ in range(2))
    logit = cp.asarray(rng.normal(size=F).astype(np.float32))
    wg, dw, dl = cp.zeros(w.shape, np.float32), cp.zeros(w.shape, np.float32), cp.zeros(F, np.float32)

    def phase():
        ops.fold(w, logit, wg, W, C, F, "features")
        dw[...] = R
        ops.fold_backward(w, logit, dw, dl, W, C, F, "features", 0.01)

    g = StepGraph("selectivity_fold_parity", [("s", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    want = wg.get(), dw.get(), dl.get()
    g.capture()
    for a in (wg, dw, dl):
        poison(a)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    for a, b in zip((wg, dw, dl), want, strict=True):
        assert_bitwise(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("over", ["features", "positions"])
def test_gpu_the_folded_network_matches_its_numpy_twin(cp, rng, over):
    """The folded forward and backward on the GPU against the same network on the NumPy backend."""
    nets = [_gated_net(over, True), None]
    nets[1] = QNetwork(
        nets[0].n_in, 3, nets[0].config, input_gate=lambda n: InputGate(n, 3, over, 0.05), xp=cp, max_batch=6
    )
    nets[0].params += (0.1 * rng.standard_normal(nets[0].params.shape)).astype(np.float32)
    nets[1].params[...] = cp.asarray(nets[0].params)
    x = rng.normal(size=(6, nets[0].n_in)).astype(np.float32)
    R = rng.normal(size=nets[0].forward_shape(6)).astype(np.float32)
    out = []
    for net, xp in zip(nets, (np, cp), strict=True):
        q = net.forward(xp.asarray(x))["q"].copy()
        net.grad_outputs()["q"][...] = xp.asarray(R)
        net.backward(xp.asarray(x))
        out.append((q, net.grads.copy()))
    assert_parity(out[1][0], out[0][0], rtol=1e-5, what="q")
    assert_parity(out[1][1], out[0][1], rtol=1e-4, what="grads")
