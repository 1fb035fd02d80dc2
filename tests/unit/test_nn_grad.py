"""Finite-difference gradient checks, in float64, of every layer and head and of QNetwork.

The loss is ``L = sum(out * R)`` for a fixed random ``R``; the hand-written backward must
match central differences ``(L(p + h e_i) - L(p - h e_i)) / 2h`` (h = 1e-6) over every
parameter and the input, to a relative error of at most 1e-6.
"""

import numpy as np
import pytest
from test_split_linear import workspace

from cudarl.nn import MLP, C51Head, IQNHead, LayerNorm, Linear, ParamLayout, PlanHead, QNetwork

H = 1e-6
TOL = 1e-6


def fd_rel_error(fd, an):
    return np.linalg.norm(fd - an) / max(np.linalg.norm(an), 1e-300)


def build(module, B, rng):
    layout, spec = ParamLayout(), []
    module.declare(layout, spec)
    params = layout.init_host(7, np.float64)
    params += 0.1 * rng.standard_normal(params.shape)  # biases and gammas away from 0 and 1
    grads = np.zeros_like(params)
    module.bind(layout.views(params), layout.views(grads), np)
    return params, grads, workspace(np, np.float64, B, spec)


def fd_in_place(buf: np.ndarray, flat_idx, loss) -> np.ndarray:
    """Central differences of ``loss()`` in the elements ``flat_idx`` of ``buf``, perturbed in place
    (the network reads its own buffers) and restored. Returns an array shaped like ``buf``."""
    fd = np.zeros_like(buf)
    for i in flat_idx:
        old = buf.flat[i]
        buf.flat[i] = old + H
        lp = loss()
        buf.flat[i] = old - H
        lm = loss()
        buf.flat[i] = old
        fd.flat[i] = (lp - lm) / (2 * H)
    return fd


def check(forward, backward, params, grads, x, rng, d_in=True):
    """forward() -> output array; backward(R, dx) writes grads and dx. Returns (param err, input err)."""
    R = rng.standard_normal(forward().shape)

    def loss():
        return float(np.sum(forward() * R))

    loss()
    dx = np.zeros_like(x) if d_in else None
    grads[...] = np.nan  # every gradient must be written, not accumulated into stale values
    backward(R, dx)
    used = ~np.isnan(grads)
    fd = fd_in_place(params, np.flatnonzero(used), loss)
    errs = [fd_rel_error(fd[used], grads[used])]
    assert used.sum() > 0
    if d_in:
        errs.append(fd_rel_error(fd_in_place(x, range(x.size), loss), dx))
    return errs


def _assert_layer_fd(m, x, params, grads, ws, rng) -> None:
    """Finite differences of one layer ``m`` at input ``x``: its parameter and input gradients."""

    def bwd(R, dx):
        ws.rows(f"{m.name}.dout")[...] = R
        m.backward(x, ws, dx)

    errs = check(lambda: m.forward(x, ws), bwd, params, grads, x, rng)
    assert max(errs) <= TOL, errs


@pytest.mark.parametrize("act", ["identity", "relu", "sigmoid"])
def test_linear_fd(act, rng):
    m = Linear("lin", 5, 4, act=act)
    params, grads, ws = build(m, 3, rng)
    _assert_layer_fd(m, rng.standard_normal((3, 5)), params, grads, ws, rng)


@pytest.mark.parametrize("act", ["identity", "sigmoid"])
def test_spectral_linear_fd(act, rng):
    """u and v frozen (the backward holds them constant): L is a function of W alone."""
    m = Linear("lin", 6, 4, act=act, spectral=True)
    params, grads, ws = build(m, 3, rng)
    m.alloc_state(np, np.float64, 7, 0)
    m.sn_update = False
    _assert_layer_fd(m, rng.standard_normal((3, 6)), params, grads, ws, rng)


def test_spectral_power_iteration_finds_the_top_singular_value(rng):
    m = Linear("lin", 40, 30, act="identity", spectral=True)
    params, grads, ws = build(m, 2, rng)
    m.alloc_state(np, np.float64, 7, 0)
    x = rng.standard_normal((2, 40))
    for _ in range(200):
        m.forward(x, ws)
    top = np.linalg.svd(m.P["lin.weight"], compute_uv=False)[0]
    assert abs(m.sn["sigma"][0] - top) <= 1e-6 * top
    assert abs(np.linalg.svd(m.sn["w"], compute_uv=False)[0] - 1.0) <= 1e-6


@pytest.mark.parametrize("act", ["identity", "relu"])
def test_layernorm_fd(act, rng):
    m = LayerNorm("ln", 6, act=act)
    params, grads, ws = build(m, 4, rng)
    _assert_layer_fd(m, 2.0 * rng.standard_normal((4, 6)) + 0.5, params, grads, ws, rng)


@pytest.mark.parametrize("layernorm", [False, True])
def test_mlp_fd(layernorm, rng):
    m = MLP("enc", 7, (6, 5), layernorm=layernorm)
    params, grads, ws = build(m, 3, rng)
    x = rng.standard_normal((3, 7))

    def bwd(R, dx):
        ws.rows(f"{m.out_name}.dout")[...] = R
        m.backward(x, ws, dx)

    errs = check(lambda: m.forward(x, ws), bwd, params, grads, x, rng)
    assert max(errs) <= TOL, errs


def test_c51_head_fd(rng):
    m = C51Head("head", 6, 3, atoms=5)
    params, grads, ws = build(m, 4, rng)
    psi = rng.standard_normal((4, 6))

    def bwd(R, dpsi):
        ws.rows(m.grad_name)[...] = R
        m.backward(psi, ws, dpsi)

    errs = check(lambda: m.forward(psi, ws), bwd, params, grads, psi, rng)
    assert max(errs) <= TOL, errs


def test_iqn_head_fd(rng):
    m = IQNHead("head", 6, 3, n_quantiles=4, n_cos=8)
    params, grads, ws = build(m, 3, rng)
    psi = rng.standard_normal((3, 6))
    tau = rng.uniform(size=(3, 4))

    def bwd(R, dpsi):
        ws.rows(m.grad_name)[...] = R.reshape(3 * 4, 3)
        m.backward(psi, ws, dpsi)

    errs = check(lambda: m.forward(psi, ws, tau), bwd, params, grads, psi, rng)
    assert max(errs) <= TOL, errs


def test_plan_head_fd_and_it_leaves_the_encoder_alone(rng):
    """The plan head's own gradients by finite differences; it reads psi but writes no dL/dpsi (a probe:
    trained into the encoder it learned the training noise, see PlanHead)."""
    m = PlanHead("plan", 6, gain=1.0, readiness_bias=0.3)
    params, grads, ws = build(m, 5, rng)
    psi = rng.standard_normal((5, 6))
    dpsi = np.full_like(psi, 7.0)

    def bwd(R, _):
        ws.rows(m.grad_name)[...] = R
        m.backward(psi, ws, dpsi, accumulate=True)

    errs = check(lambda: m.forward(psi, ws), bwd, params, grads, psi, rng, d_in=False)
    assert max(errs) <= TOL, errs
    assert (dpsi == 7.0).all()


@pytest.mark.parametrize(
    "head,layernorm,spectral",
    [("c51", False, ()), ("c51", True, ("enc.1",)), ("iqn", False, ()), ("iqn", True, ("enc.0", "head.out"))],
)
def test_qnetwork_fd(head, layernorm, spectral, rng):
    net = QNetwork(
        6,
        3,
        hidden=(7, 5),
        head=head,
        layernorm=layernorm,
        plan=True,
        atoms=4,
        n_quantiles=3,
        n_cos=5,
        dtype=np.float64,
        max_batch=3,
        seed=3,
        spectral=spectral,
    )
    for name in spectral:
        net.linears[name].sn_update = False
    net.params += 0.1 * rng.standard_normal(net.params.shape)
    x = rng.standard_normal((3, 6))
    tau = rng.uniform(size=(3, 3))
    Rq, Rp = rng.standard_normal(net.forward_shape(3)), rng.standard_normal((3, 2))
    # the plan head's loss reaches its own parameters only (it is a probe of psi): the loss the
    # backward differentiates holds psi constant in the plan term, which this linearisation does
    psi0 = net.forward(x, **({"tau": tau} if head == "iqn" else {}))["plan"]
    lin = net.plan.lin
    psi_fixed = net.ws.rows(f"{net.encoder.out_name}.out").copy()

    def loss():
        o = net.forward(x, **({"tau": tau} if head == "iqn" else {}))
        plan = 1.0 / (1.0 + np.exp(-(psi_fixed @ net.P[f"{lin.name}.weight"] + net.P[f"{lin.name}.bias"])))
        return float(np.sum(o["q"] * Rq) + np.sum(plan * Rp))

    del psi0

    loss()
    g = net.grad_outputs()
    g["q"][...] = Rq
    g["plan"][...] = Rp
    net.grads[...] = np.nan
    dx = np.zeros_like(x)
    net.backward(x, dx=dx)
    used = np.zeros(net.params.shape, bool)
    for e in net.layout.entries:
        used[e.offset : e.offset + e.size] = True
    assert not np.isnan(net.grads[used]).any(), "a parameter gradient was not written"
    fd = fd_in_place(net.params, np.flatnonzero(used), loss)
    assert fd_rel_error(fd[used], net.grads[used]) <= TOL
    for e in net.layout.entries:  # per tensor, so a small tensor's error is not hidden by a big one
        sl = slice(e.offset, e.offset + e.size)
        assert fd_rel_error(fd[sl], net.grads[sl]) <= 1e-5, e.name


def test_forward_plan_keys_name_the_plans_of_a_workspace_without_a_network():
    """forward_plan_keys lists the cuBLASLt plan key of each linear layer's forward at a batch size, as
    new_workspace(batch) makes them on the GPU (blas.gemm_lt_prepare's key for 256-byte aligned
    parameter views), with no network made and no device: the key names the shape, the bias and
    ReLU epilogue, TF32 and the one-kernel choice of net.gemm."""
    from cudarl import blas
    from cudarl.config import NetConfig
    from cudarl.nn.network import forward_plan_keys

    net = NetConfig(hidden=(64, 32), head="c51", atoms=11)
    keys = forward_plan_keys(10, 3, net, 4096)
    # m, n, k of the encoder's two ReLU layers and the dueling head's linear (1 + A) K outputs
    assert [k[:3] for k in keys] == [(4096, 64, 10), (4096, 32, 64), (4096, 4 * 11, 32)]
    assert [k[5] for k in keys] == [6, 6, 4]  # cuBLASLt's RELU_BIAS, RELU_BIAS, BIAS epilogues
    assert all(k[11] is False for k in keys)  # cublaslt_nosplit (the default): one-kernel algorithms
    lt = forward_plan_keys(10, 3, NetConfig(hidden=(64, 32), head="c51", atoms=11, gemm="cublaslt", tf32=True), 8)
    assert [k[:3] for k in lt] == [(8, 64, 10), (8, 32, 64), (8, 44, 32)] and all(k[6] and k[11] for k in lt)
    assert forward_plan_keys(10, 3, NetConfig(hidden=(64, 32), gemm="cublas"), 8) == []  # no cuBLASLt forward
    # the key gemm_lt_prepare computes for a parameter view's bias (512-byte aligned pool address + 256 k)
    m, n, k = keys[0][:3]
    made = blas._lt_key(m, n, k, False, False, 0x7F0000000200, "relu", False, 512, 512, 512, False)
    assert made == keys[0] == blas.plan_key(m, n, k, bias_align=256, act="relu", split_k=False)
    assert blas.plan_key(m, n, k, bias_align=0)[5] == 1  # no bias: cuBLASLt's DEFAULT epilogue
