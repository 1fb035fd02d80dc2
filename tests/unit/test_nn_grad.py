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


def force_dx_epilogue(monkeypatch) -> list:
    """``Linear._dx`` takes the GPU's epilogue path wherever its caller gives ``below`` (``gemm.nt_act``, here its
    twin on the NumPy backend, float32; the GPU takes it under ``cublaslt_nosplit`` and ``cudarl``), and returns
    True as it does there. Returns the list each such dx appends ``(layer, accumulate)`` to."""
    from cudarl.reference import gemm as gref

    calls, plain = [], Linear._dx

    def dx_with_epilogue(self, dz, dx, accumulate, below=None):
        if below is None:
            return plain(self, dz, dx, accumulate)
        calls.append((self.name, accumulate))
        gref.nt_act(dz, self.weight(), below[0], dx, below[1], accumulate=accumulate)
        return True

    monkeypatch.setattr(Linear, "_dx", dx_with_epilogue)
    return calls


def record_activation_backwards(monkeypatch, ops, outs: dict) -> list:
    """Wrap the ``nn`` ops' ``bias_act_backward`` and ``act_backward`` (a layer's backward applies its activation's
    backward in one of them): returns the list each call appends ``(layer, act)`` to, the layer the one of
    ``outs`` (``{name: its .out buffer}``) whose output the call reads."""
    acts = []

    def layer(out) -> str:
        return next(name for name, buf in outs.items() if np.may_share_memory(out, buf))

    def wrap(op):
        def recorded(dout, out, dz, *rest):
            acts.append((layer(out), int(rest[-1])))
            return op(dout, out, dz, *rest)

        return recorded

    monkeypatch.setattr(ops, "bias_act_backward", wrap(ops.bias_act_backward))
    monkeypatch.setattr(ops, "act_backward", wrap(ops.act_backward))
    return acts


def test_a_dx_gemm_that_applies_the_layer_belows_relu_backward_leaves_every_gradient_as_it_was(monkeypatch):
    """The MLP's backward when a dx GEMM takes the ReLU backward of the layer below in its epilogue
    (``Linear._dx``'s ``below``: the GPU's ``gemm.nt_act``, here its twin forced on the NumPy backend, float32):
    that layer skips its own (``dz_ready``), and every gradient is the plain backward's, bit for bit."""

    def grads(fused: bool):
        rng = np.random.default_rng(1)
        mlp = MLP("enc", 12, hidden=(16, 16, 8))
        layout, spec = ParamLayout(), []
        mlp.declare(layout, spec)
        params = layout.init_host(7, np.float32)
        grads = np.zeros_like(params)
        mlp.bind(layout.views(params), layout.views(grads), np)
        ws = workspace(np, np.float32, 32, spec)
        x = rng.standard_normal((32, 12)).astype(np.float32)
        mlp.forward(x, ws)
        ws.rows(f"{mlp.out_name}.dout", 32)[...] = rng.standard_normal((32, 8))
        calls = force_dx_epilogue(monkeypatch) if fused else []
        outs = {c.name: ws.bufs[f"{c.name}.out"] for c in mlp.children}
        acts = record_activation_backwards(monkeypatch, mlp.children[0].ops, outs)
        dx = np.zeros((32, 12), np.float32)
        mlp.backward(x, ws, dx)
        monkeypatch.undo()
        return np.concatenate([grads, dx.ravel()]), calls, acts

    want, _, acts_plain = grads(False)
    got, calls, acts = grads(True)
    # the dx GEMMs above a ReLU layer; enc.0's dx (the input's) has none
    assert calls == [("enc.2", False), ("enc.1", False)]
    assert acts_plain == [("enc.2", 1), ("enc.1", 1), ("enc.0", 1)]
    assert acts == [("enc.2", 1), ("enc.1", 0), ("enc.0", 0)]  # enc.1 and enc.0 skip the ReLU their dz already has
    np.testing.assert_array_equal(got, want)


def _backward_with_and_without_the_epilogue(monkeypatch, net, ws, backward) -> list:
    """``backward()`` (a :class:`QNetwork` backward over ``ws``, returning dx or None) from ``ws``'s buffers as they
    are now, without and then with the dx epilogue forced (:func:`force_dx_epilogue`): for each,
    ``(every gradient and dx, the dx GEMMs that took it, the activation backwards the layers applied)``."""
    saved = {k: v.copy() for k, v in ws.bufs.items()}
    outs = {name: ws.bufs[f"{name}.out"] for name in net.linears}
    ops = next(iter(net.linears.values())).ops
    runs = []
    for fused in (False, True):
        for k, v in saved.items():
            ws.bufs[k][...] = v
        net.grads[...] = 0.0
        calls = force_dx_epilogue(monkeypatch) if fused else []
        acts = record_activation_backwards(monkeypatch, ops, outs)
        dx = backward()
        monkeypatch.undo()
        dx = np.zeros(0, net.grads.dtype) if dx is None else dx.ravel()
        runs.append((np.concatenate([net.grads, dx]), calls, acts))
    return runs


def _seeded(ws, rng) -> None:
    """Every float buffer of ``ws`` random: what the forward leaves alone holds values too (IQN's taus, the
    two-head backward's IQN activations, which its rule's forward would write)."""
    for buf in ws.bufs.values():
        buf[...] = rng.standard_normal(buf.shape).astype(buf.dtype) if buf.dtype.kind == "f" else buf


def _masks(acts: list, layer: str) -> int:
    """How many activation backwards other than the identity's were applied to ``layer``'s dout."""
    return sum(1 for name, a in acts if name == layer and a != 0)


@pytest.mark.parametrize(
    "head, raw, head_dx",
    [
        ("c51", False, [("head.va", False)]),  # the reference head: dL/dpsi is va's dx, which overwrites dpsi
        ("c51", True, [("head.va", False)]),  # from dL/dva (the fused C51 loss's)
        ("qrdqn", False, [("head.out", False)]),
        ("iqn", False, []),  # the mixing kernel writes dL/dpsi: no GEMM to carry the mask
        ("c51+iqn", False, [("head.va", True)]),  # C51's dx adds onto IQN's, the last write: the mask on the sum
    ],
)
def test_the_q_heads_dx_gemm_applies_the_encoders_top_relu_and_every_gradient_is_as_it_was(
    monkeypatch, head, raw, head_dx
):
    """Across the head -> encoder boundary: ``QNetwork.backward`` gives the Q head ``below = (psi, enc.out_act)``
    (``Head.backward``), its dx GEMM writes the encoder's top layer's dz (the twin of ``gemm.nt_act``, forced on
    NumPy, float32), and that layer skips its ReLU's backward (``dz_ready``); every gradient and dx is the plain
    backward's, bit for bit. IQN's head reports it did not, and the encoder applies the ReLU itself."""
    rng = np.random.default_rng(2)
    net = QNetwork(12, 3, hidden=(16, 8), head=head, atoms=5, n_quantiles=4, n_cos=6, max_batch=6, seed=4)
    ws = net.ws
    assert net.encoder.out_act == 1  # the MLP's top layer: Linear + ReLU
    _seeded(ws, rng)
    x = rng.standard_normal((6, 12)).astype(np.float32)
    net.forward(x, ws, raw_head=raw)
    for g in net.grad_outputs(ws, raw_head=raw).values():
        g[...] = rng.standard_normal(g.shape).astype(np.float32)

    def backward():
        dx = np.zeros_like(x)
        net.backward(x, ws, dx)
        return dx

    (want, _, acts_plain), (got, calls, acts) = _backward_with_and_without_the_epilogue(monkeypatch, net, ws, backward)
    assert calls == [*head_dx, ("enc.1", False)]  # and the MLP's own: enc.1's dx carries enc.0's ReLU
    assert _masks(acts_plain, "enc.1") == 1
    assert _masks(acts, "enc.1") == (0 if head_dx else 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "aux, heads, early, last_layer, head_dx",
    [
        (["horizons", "risk"], "all", False, False, None),  # they add into dL/dpsi after the Q head: no mask there
        (["horizons", "risk"], "all", True, False, True),  # their sum first (extras_backward): Q's dx adds, masks
        (["horizons", "risk"], ("plan",), False, False, False),  # the plan head, a probe, writes no dL/dpsi
        (["selectivity"], "all", False, False, False),  # through the input gate
        (["selectivity"], "all", False, True, False),  # the last layer's backward only
    ],
)
def test_the_network_gives_the_q_head_the_encoders_relu_only_where_its_dx_is_the_last_write(
    monkeypatch, aux, heads, early, last_layer, head_dx
):
    """The agent's online network (C51, the plan head, the auxiliary signals' heads or input gate, the layers'
    weight gradients on side streams): the Q head's dx GEMM takes the encoder's top ReLU (twin forced on NumPy)
    only where nothing adds into dL/dpsi after it (``head_dx``: None, it is not given ``below``; False, it
    overwrites dpsi; True, it adds onto the extra heads' sum, ``QNetwork.backward_extras`` having run first),
    and every gradient is the plain backward's, bit for bit."""
    from test_trainer import small

    from cudarl.trainer import Trainer

    t = Trainer(small(net={"head": "c51", "plan": True}, agent={"aux": aux}), run_dir=False, echo=lambda m: None)
    net, rng = t.agent.online, np.random.default_rng(3)
    ws = net.new_workspace(16)
    _seeded(ws, rng)
    x = rng.standard_normal((16, net.n_in)).astype(np.float32)
    net.forward(x, ws, heads=heads)
    for g in net.grad_outputs(ws).values():
        g[...] = rng.standard_normal(g.shape).astype(np.float32)

    def backward():
        if early:
            assert net.backward_extras(ws) is True
        net.backward(x, ws, last_layer=last_layer, extras_done=early)

    (want, _, acts_plain), (got, calls, acts) = _backward_with_and_without_the_epilogue(monkeypatch, net, ws, backward)
    top = net.encoder.out_name
    assert calls == ([] if head_dx is None else [("head.va", head_dx)]) + ([] if last_layer else [(top, False)])
    assert _masks(acts_plain, top) == 1  # on the side streams: act_backward, then the bias sums as the identity's
    assert _masks(acts, top) == (1 if head_dx is None else 0)
    np.testing.assert_array_equal(got, want)


def test_an_encoder_without_a_separate_activation_backward_declares_none_and_refuses_dz_ready():
    """``Encoder.out_act`` is None where psi's layer has no activation backward of its own for a head to take
    (an MLP with LayerNorm: the ReLU is in its kernel; the windowed encoders' final RMSNorm), and their backward
    refuses ``dz_ready`` rather than skip nothing."""
    x = np.ones((2, 64), np.float32)
    ln = QNetwork(64, 3, hidden=(8, 8), layernorm=True, max_batch=2)
    ssm = QNetwork(64, 3, encoder="ssm", window=4, d_model=32, layers=1, ssm_state=16, ssm_headdim=16, max_batch=2)
    attn = QNetwork(64, 3, encoder="attention", window=4, d_model=32, layers=1, max_batch=2)
    assert ln.encoder.out_act is None and ssm.encoder.out_act is None and attn.encoder.out_act is None
    assert QNetwork(64, 3, hidden=(8, 8), max_batch=2).encoder.out_act == 1
    for net in (ln, ssm, attn):
        net.forward(x)
        for backward in (net.encoder.backward, net.encoder.backward_last):
            with pytest.raises(ValueError, match="dz_ready"):
                backward(x, net.ws, dz_ready=True)


@pytest.mark.gpu
def test_gpu_the_reference_backward_applies_the_hidden_relus_in_the_dx_gemms():
    """The reference step (C51 on an MLP of two hidden ReLU layers): the head's dx GEMM writes the top layer's
    dz and that layer's dx GEMM the first layer's (``gemm.nt_act``: the ReLU backward in their epilogues), so no
    ReLU mask kernel is left in the backward (issue 20: two nodes fewer on the step's dx chain)."""
    from test_aux_branches import traced_train_graph

    nodes, t = traced_train_graph({})
    back = [n["name"] for n in nodes if n["phase"] == "backward"]
    assert back.count("cudarl_gemm_nt_act") == 2 and back.count("cudarl_nn_act_backward") == 0, back


@pytest.mark.gpu
def test_gpu_with_head_signals_the_q_heads_dx_adds_onto_their_sum_and_applies_the_relu():
    """C51 with head signals (``Agent.extras_early``: their backward first, on the auxiliary branch): the Q head's
    dx GEMM adds onto their dL/dpsi and applies the top layer's ReLU (``gemm.nt_act`` with ``accumulate``), so
    the step's backward has no ReLU mask kernel either."""
    from test_aux_branches import traced_train_graph

    nodes, t = traced_train_graph({"agent": {"aux": ["horizons", "risk"]}})
    assert t.agent.extras_early
    back = [n["name"] for n in nodes if n["phase"] == "backward"]
    assert back.count("cudarl_gemm_nt_act") == 2 and back.count("cudarl_nn_act_backward") == 0, back


@pytest.mark.gpu
@pytest.mark.parametrize("aux", [False, True])
def test_gpu_the_q_heads_relu_epilogue_gives_the_gradients_of_the_mask_kernel(cp, monkeypatch, aux):
    """A float32 GPU network under ``gemm="cudarl"`` (the reference widths, batch 512): its backward with the
    encoder's top ReLU in the Q head's dx GEMM against the same network's with ``below`` dropped (the panel's
    ``nt`` then the mask kernel: the same bits, the parity test of ``nt_act``), every gradient bit for bit; with
    an extra head summed first (``aux``) the plain path adds through cuBLAS, so to float32 rounding only."""
    from cudarl.ops import gemm as panel
    from cudarl.testing import assert_bitwise, assert_parity

    rng = np.random.default_rng(5)
    extra = {"probe": lambda d: Linear("aux.probe", d, 4, act="identity", gemm="cudarl")} if aux else None
    net = QNetwork(64, 3, hidden=(256, 256), gemm="cudarl", extra_heads=extra, xp=cp, max_batch=512)
    net.prepare_backward(512)
    x = cp.asarray(rng.standard_normal((512, 64)).astype(np.float32))
    net.forward(x)
    outs = {k: rng.standard_normal(g.shape).astype(np.float32) for k, g in net.grad_outputs().items()}
    plain, panel_nt_act, launched = Linear._dx, panel.nt_act, []

    def dx_without_the_heads_epilogue(self, dz, dx, accumulate, below=None):  # the MLP's own dx GEMMs keep theirs
        return plain(self, dz, dx, accumulate, None if self.name.startswith("head.") else below)

    def nt_act(a, bt, y, out, act, accumulate=False):
        launched.append((tuple(a.shape), accumulate))
        panel_nt_act(a, bt, y, out, act, accumulate=accumulate)

    def grads(fused: bool):
        for k, g in net.grad_outputs().items():
            g[...] = cp.asarray(outs[k])
        monkeypatch.setattr(panel, "nt_act", nt_act)
        if not fused:
            monkeypatch.setattr(Linear, "_dx", dx_without_the_heads_epilogue)
        if aux:
            net.backward_extras()
        net.backward(x, extras_done=aux)
        monkeypatch.undo()
        cp.cuda.Device().synchronize()
        return net.grads.get()

    want = grads(False)
    assert launched == [((512, 256), False)]  # enc.1's dx into enc.0's dz only
    launched.clear()
    got = grads(True)
    assert launched == [((512, 204), aux), ((512, 256), False)]  # the head's dx (dva [512, 4 * 51]) first
    if aux:
        assert_parity(got, want, rtol=1e-5, what="gradients, the Q head's dx added by the panel and by cuBLAS")
    else:
        assert_bitwise(got, want, what="gradients")
