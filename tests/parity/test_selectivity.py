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
    net.params += 0.1 * rng.standard_normal(net.params.shape)
    x = rng.normal(size=(4, W * (F + 2)))
    R = rng.normal(size=net.forward_shape(4))

    def loss():
        return float((net.forward(x)["q"] * R).sum()) + ref.penalty(net.P["sel.logit"], 0.2)

    loss()
    net.grad_outputs()["q"][...] = R
    net.backward(x)
    an = net.grads.copy()
    idx = [e.offset + k for e in net.layout.entries for k in range(int(np.prod(e.shape)))]
    idx = idx[:: max(1, len(idx) // 150)] + list(
        range(net.layout["sel.logit"].offset, net.layout["sel.logit"].offset + F)
    )
    fd = np.zeros_like(an)
    for i in idx:
        old = net.params[i]
        net.params[i] = old + 1e-6
        hi = loss()
        net.params[i] = old - 1e-6
        lo = loss()
        net.params[i] = old
        fd[i] = (hi - lo) / 2e-6
    np.testing.assert_allclose(an[idx], fd[idx], atol=1e-7, rtol=1e-5)


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
