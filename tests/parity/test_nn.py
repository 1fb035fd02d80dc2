"""Parity of ``cuda_src/nn.cu`` with ``cudarl.reference.nn``, and of the GPU ``QNetwork`` with the NumPy one.

CPU tests hold hand cases and identities of the reference (finite differences live in
tests/unit/test_nn_grad.py); ``gpu`` tests compare every op and the whole network's forward
and backward with the reference on random inputs, eager and graphed.
"""

import numpy as np
import pytest

from cudarl.reference import nn as ref
from cudarl.reference import philox
from cudarl.testing import assert_bitwise, assert_parity, poison, rel_error


# --- CPU: hand cases and identities -----------------------------------------------------------
def test_dueling_logits_average_to_the_value_stream(rng):
    B, A, Z = 4, 3, 5
    va = rng.standard_normal((B, (1 + A) * Z)).astype(np.float64)
    logits = np.empty((B, A, Z))
    ref.dueling_forward(va, logits)
    np.testing.assert_allclose(logits.mean(axis=1), va[:, :Z], rtol=0, atol=1e-12)
    # shifting every advantage by a constant changes nothing (identifiability of the dueling form)
    va2 = va.copy()
    va2[:, Z:] += 3.0
    logits2 = np.empty_like(logits)
    ref.dueling_forward(va2, logits2)
    np.testing.assert_allclose(logits2, logits, atol=1e-12)


@pytest.mark.parametrize("act", [0, 1, 2])
def test_act_backward_is_bias_act_backwards_dz(rng, act):
    y, d = rng.random((9, 5)).astype(np.float32) - 0.3, rng.standard_normal((9, 5)).astype(np.float32)
    dz, db = np.empty_like(d), np.empty(5, np.float32)
    ref.bias_act_backward(d, y, dz, db, act)
    got = d.copy()
    ref.act_backward(got, y, got, act)  # in place, as the layers run it
    assert_bitwise(got, dz, what="dz")
    if act == 1:
        assert np.array_equal(got == 0, (y <= 0) | (d == 0))


def test_dueling_backward_accumulates(rng):
    dl = rng.standard_normal((4, 3, 5)).astype(np.float32)
    base = rng.standard_normal((4, 20)).astype(np.float32)
    alone, acc = np.empty_like(base), base.copy()
    ref.dueling_backward(dl, alone)
    ref.dueling_backward(dl, acc, accumulate=True)
    assert_bitwise(acc, base + alone, what="accumulated dva")


def test_plan_gate_is_exactly_one_until_ready():
    plan = np.array([[0.1, 0.0], [0.1, 0.4999], [0.1, 0.5], [0.8, 0.9], [0.0, 1.0]], dtype=np.float32)
    scale = np.full(5, np.nan, dtype=np.float32)
    ref.plan_gate(plan, scale)
    assert scale.tolist() == [1.0, 1.0, np.float32(0.1), np.float32(0.8), 0.0]


def _plan_case(rng, B=64, A=3):
    plan = rng.uniform(0.05, 0.95, (B, 2)).astype(np.float32)
    q = rng.normal(size=(B, A)).astype(np.float32)
    greedy = q.argmax(1)
    actions = np.where(rng.uniform(size=B) < 0.7, greedy, rng.integers(0, A, B)).astype(np.int32)
    ret = (rng.normal(size=B) * 0.01).astype(np.float32)
    levels = np.linspace(-1, 1, A).astype(np.float32)
    return plan, q, actions, ret, levels


def _plan_loss_value(plan, q, actions, ret, levels, h):
    """The loss the docstring of ref.plan_loss writes down, in float64."""
    plan, ret = plan.astype(np.float64), ret.astype(np.float64)
    g = q.argmax(1)
    m = (actions == g) & (levels[g] != 0)
    rbar = np.abs(ret[m]).mean()
    wp, wn = np.maximum(ret, 0) / rbar, np.maximum(-ret, 0) / rbar
    c, r = plan[:, 0], plan[:, 1]
    per = -wp * np.log(c) - wn * np.log(1 - c) - wp * np.log(r) - (wn + h) * np.log(1 - r)
    return per[m].sum() / m.sum()


def test_plan_loss_is_the_gradient_of_its_loss_on_the_greedy_rows(rng):
    """Finite differences in float64 of the written-down loss; rows whose data action is not the greedy one,
    or flat, get no gradient (they say nothing about the greedy trade)."""
    plan, q, actions, ret, levels = _plan_case(rng)
    h = 0.1
    dplan, stats = np.empty((64, 2), np.float64), np.empty(2, np.float64)
    ref.plan_loss(plan.astype(np.float64), q, actions, ret.astype(np.float64), levels, dplan, stats, h)
    eps = 1e-6
    for b in range(0, 64, 7):
        for k in (0, 1):
            up, dn = plan.astype(np.float64), plan.astype(np.float64)
            up[b, k] += eps
            dn[b, k] -= eps
            fd = (
                _plan_loss_value(up, q, actions, ret, levels, h) - _plan_loss_value(dn, q, actions, ret, levels, h)
            ) / (2 * eps)
            assert abs(dplan[b, k] - fd) < 1e-6 * max(1.0, abs(fd)), (b, k, dplan[b, k], fd)
    g = q.argmax(1)
    off = (actions != g) | (levels[g] == 0)
    assert off.any() and not dplan[off].any()


def test_plan_loss_minimisers_open_the_gate_only_past_the_hurdle():
    """Per state: conviction -> E[R+]/E|R| and readiness -> E[R+]/(E|R| + h Rbar), so readiness crosses
    1/2 exactly where the expected return clears h Rbar. Two states, one with an edge, one without."""
    rng = np.random.default_rng(5)
    B, h = 4000, 0.2
    edge = np.arange(B) % 2 == 0
    ret = (rng.normal(size=B) + np.where(edge, 0.5, 0.0)).astype(np.float64)
    q = np.tile(np.float32([0.0, 0.0, 1.0]), (B, 1))  # greedy: long
    actions = np.full(B, 2, np.int32)
    levels = np.float32([-1, 0, 1])
    rbar = np.abs(ret).mean()
    want_c = [np.maximum(ret[s], 0).sum() / np.abs(ret[s]).sum() for s in (edge, ~edge)]
    want_r = [np.maximum(ret[s], 0).sum() / (np.abs(ret[s]).sum() + h * rbar * s.sum()) for s in (edge, ~edge)]
    # at the minimiser the gradient of each state's rows sums to zero
    for k, want in ((0, want_c), (1, want_r)):
        plan = np.full((B, 2), 0.5)
        plan[edge, k], plan[~edge, k] = want[0], want[1]
        dplan, stats = np.empty((B, 2)), np.empty(2)
        ref.plan_loss(plan, q, actions, ret, levels, dplan, stats, h)
        for s in (edge, ~edge):
            assert abs(dplan[s, k].sum()) < 1e-9
    assert want_r[0] > 0.5 > want_r[1]  # the gate opens on the edge, stays shut without one
    assert want_c[0] > 0.5


def test_plan_loss_writes_zeros_without_a_teaching_row():
    plan = np.full((4, 2), 0.5, np.float32)
    q = np.tile(np.float32([0, 1, 0]), (4, 1))  # greedy: flat
    dplan, stats = np.full((4, 2), np.nan, np.float32), np.empty(2, np.float32)
    ref.plan_loss(plan, q, np.ones(4, np.int32), np.ones(4, np.float32), np.float32([-1, 0, 1]), dplan, stats, 0.1)
    assert not dplan.any() and stats.tolist() == [1.0, 0.5]


def test_plan_head_gate_is_closed_at_initialisation(rng):
    """The seed scaled every reward by ~0.1 at init; here the initial gate must return exactly 1."""
    from cudarl.nn import QNetwork

    net = QNetwork(64, 3, plan=True, max_batch=256, seed=11)
    x = 3.0 * rng.standard_normal((256, 64)).astype(np.float32)
    plan = net.forward(x)["plan"]
    assert (plan[:, 1] < 0.5).all() and (plan >= 0).all() and (plan <= 1).all()
    assert (net.plan.scale(net.ws) == 1.0).all()


def test_cos_embedding_first_column_is_one_and_matches_closed_form(rng):
    tau = rng.uniform(size=(3, 4)).astype(np.float32)
    cos = np.empty((12, 6), np.float32)
    ref.iqn_cos_embed(tau, cos)
    assert (cos[:, 0] == 1).all()
    np.testing.assert_allclose(cos[:, 5], np.cos(5 * np.pi * tau.reshape(-1).astype(np.float64)), atol=1e-7)


def test_sample_tau_is_the_philox_stream():
    tau = np.empty((3, 5), np.float32)
    ref.iqn_sample_tau(tau, np.array([9], np.uint64), seed=4, stream_id=7)
    np.testing.assert_array_equal(tau.ravel(), philox.uniform(4, 9, 7, 15))
    assert ((tau >= 0) & (tau < 1)).all()


def test_layout_views_are_aligned_and_disjoint():
    from cudarl.nn import ALIGN, QNetwork

    net = QNetwork(64, 3, hidden=(256, 256), layernorm=True, plan=True, max_batch=2)
    ends = []
    for e in net.layout.entries:
        assert e.offset % ALIGN == 0
        v = net.P[e.name]
        assert v.shape == e.shape and np.shares_memory(v, net.params)
        ends.append((e.offset, e.offset + e.size))
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False))
    assert net.layout.padded_size % ALIGN == 0 and net.params.size == net.layout.padded_size


def test_he_and_xavier_limits_and_determinism():
    from cudarl.nn import QNetwork

    a = QNetwork(64, 3, hidden=(256, 256), seed=5, max_batch=1)
    b = QNetwork(64, 3, hidden=(256, 256), seed=5, max_batch=1)
    c = QNetwork(64, 3, hidden=(256, 256), seed=6, max_batch=1)
    assert np.array_equal(a.params, b.params) and not np.array_equal(a.params, c.params)
    w0 = a.P["enc.0.weight"]  # He: U(-sqrt(6/64), sqrt(6/64))
    assert np.abs(w0).max() <= np.sqrt(6 / 64) and np.abs(w0).max() > 0.9 * np.sqrt(6 / 64)
    assert abs(w0.std() - np.sqrt(2 / 64)) < 0.05 * np.sqrt(2 / 64)
    wh = a.P["head.va.weight"]  # Xavier: U(-sqrt(6/(256+204)), ...)
    assert np.abs(wh).max() <= np.sqrt(6 / (256 + 204))
    assert not a.P["enc.0.bias"].any()


def test_state_dict_round_trip_keeps_the_buffer(rng):
    from cudarl.nn import QNetwork

    a = QNetwork(8, 3, hidden=(5,), seed=1, max_batch=2)
    b = QNetwork(8, 3, hidden=(5,), seed=2, max_batch=2)
    addr = b.params.__array_interface__["data"][0]
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.params, b.params) and b.params.__array_interface__["data"][0] == addr
    with pytest.raises(ValueError):
        QNetwork(8, 3, hidden=(6,), max_batch=2).load_state_dict(a.state_dict())


def test_state_dict_carries_the_spectral_vectors(rng):
    from cudarl.nn import QNetwork

    a = QNetwork(8, 3, hidden=(5, 4), seed=1, max_batch=2, spectral=("enc.1",))
    for _ in range(3):
        a.forward(rng.standard_normal((2, 8)).astype(np.float32))
    b = QNetwork(8, 3, hidden=(5, 4), seed=1, max_batch=2, spectral=("enc.1",))
    assert not np.array_equal(a.linears["enc.1"].sn["u"], b.linears["enc.1"].sn["u"])
    b.load_state_dict(a.state_dict())
    x = rng.standard_normal((2, 8)).astype(np.float32)
    assert np.array_equal(a.forward(x)["q"], b.forward(x)["q"])
    with pytest.raises(ValueError):
        QNetwork(8, 3, hidden=(5, 4), seed=1, max_batch=2).load_state_dict(a.state_dict())


# --- the member axis (a population's agents): member i is a single call on its entries ---------------
def _member_ops(act: int) -> tuple:
    """(op, its array arguments' shapes by code, aliases {index: the index it is}, its other arguments) of
    each nn op with a member axis; an alias is an in-place call (dz is dout, as the layers run it)."""
    rows = ("BN", "BN", "BN")
    return (
        ("bias_act_backward", (*rows, "N"), {}, (act,)),
        ("bias_act_backward", (*rows, "N"), {2: 0}, (act,)),
        ("act_backward", rows, {}, (act,)),
        ("act_backward", rows, {2: 0}, (act,)),
        ("dueling_forward", ("BV", "BAZ"), {}, ()),
        ("dueling_backward", ("BAZ", "BV"), {}, (False,)),
        ("dueling_backward", ("BAZ", "BV"), {}, (True,)),  # accumulate: dva's values are read too
    )


def _member_axis_is_single_calls(xp, mod, rng, P, shape, act, padded):
    """Run each op of :func:`_member_ops` once over P members (entries padded apart as the stacked network's,
    or packed) and assert member i's outputs equal one single call of ``mod``'s op on copies of its entries."""
    from cudarl.nn.params import stacked_zeros

    B, N, A, Z = shape
    shapes = {"BN": (B, N), "N": (N,), "BV": (B, (1 + A) * Z), "BAZ": (B, A, Z)}
    for op, codes, alias, extra in _member_ops(act):
        arrays = []
        for k, c in enumerate(codes):
            if k in alias:
                arrays.append(arrays[alias[k]])
                continue
            a = stacked_zeros(xp, P, shapes[c]) if padded else xp.zeros((P, *shapes[c]), dtype=np.float32)
            a[...] = xp.asarray(rng.standard_normal(a.shape).astype(np.float32))
            arrays.append(a)
        singles = []
        for i in range(P):
            one = []
            for k, a in enumerate(arrays):
                one.append(one[alias[k]] if k in alias else a[i].copy())
            singles.append(one)
        getattr(mod, op)(*arrays, *extra)
        for i, one in enumerate(singles):
            getattr(mod, op)(*one, *extra)
            for k, a in enumerate(arrays):
                assert_bitwise(a[i], one[k], what=f"{op} {extra} member {i} of {P}, argument {k}")


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_twins_member_axis_is_single_calls(rng, P, act):
    _member_axis_is_single_calls(np, ref, rng, P, (5, 7, 3, 4), act, padded=True)


def test_member_axis_all_or_none():
    """A launcher and a twin take every array with the member axis or none; the launcher hands the kernel
    entry 0 and each array's member stride in elements."""
    from cudarl.nn.params import stacked_zeros
    from cudarl.ops import nn as ops

    dout, db = stacked_zeros(np, 3, (5, 7)), stacked_zeros(np, 3, (7,))
    P, entries, strides = ops._members("w", (dout, 2), (db, 1))
    assert P == 3 and [e.shape for e in entries] == [(5, 7), (7,)] and strides == (64, 64)
    assert ops._members("w", (dout[0], 2), (db[0], 1))[::2] == (1, (0, 0))
    with pytest.raises(ValueError, match="member axis or none"):
        ops._members("w", (dout, 2), (db[0], 1))
    with pytest.raises(ValueError, match="the same in every array"):
        ops._members("w", (dout, 2), (db[:2], 1))
    with pytest.raises(ValueError, match="member axis or none"):
        ref.bias_act_backward(dout, dout, dout, db[0], 1)


# --- GPU: op parity ---------------------------------------------------------------------------
# The reference runs in float64 on the same float32 inputs and is rounded once to float32, so the
# tolerance measures the kernel's own rounding, not NumPy's float32 summation order.
def _to(cp, *arrs):
    return [cp.asarray(a) for a in arrs]


def _f64(*arrs):
    return [np.asarray(a, dtype=np.float64) for a in arrs]


def _f32(a):
    return np.asarray(a, dtype=np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("B,N", [(1, 1), (7, 33), (512, 256), (4096, 51), (9001, 20)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_gpu_bias_act(cp, rng, B, N, act):
    from cudarl.ops import nn as ops

    y, b, d = (rng.standard_normal(s).astype(np.float32) for s in ((B, N), (N,), (B, N)))
    if B * N == 1:
        y[...], b[...] = 1.0, 0.5  # one element: keep it on the ReLU's live side
    y64, b64, d64 = _f64(y, b, d)
    out64 = np.empty_like(y64)
    ref.bias_act_forward(y64, b64, out64, act)
    gy, gb, gout = _to(cp, y, b, np.empty_like(y))
    poison(gout)
    ops.bias_act_forward(gy, gb, gout, act)
    assert_parity(gout, _f32(out64), what="bias_act_forward")
    ops.bias_act_forward(gy, gb, gy, act)  # in place
    assert_bitwise(gy, gout, what="in-place forward")
    # backward from the GPU's own activations, so ReLU masks agree exactly
    out_g = gout.get().astype(np.float64)
    dz64, db64 = np.empty_like(y64), np.empty(N)
    ref.bias_act_backward(d64, out_g, dz64, db64, act)
    gd, gdz, gdb = _to(cp, d, np.empty_like(y), np.empty(N, np.float32))
    poison(gdz)
    poison(gdb)
    ops.bias_act_backward(gd, gout, gdz, gdb, act)
    assert_parity(gdz, _f32(dz64), what="dz")
    assert_parity(gdb, _f32(db64), what="dbias")
    db_first = gdb.copy()
    poison(gdb)
    ops.bias_act_backward(gd, gout, gd, gdb, act)  # dz aliasing dout (with the identity: no stores at all)
    assert_bitwise(gd, gdz, what="in-place backward")
    assert_bitwise(gdb, db_first, what="dbias, in place or not")
    # the split the layers use on the GPU: act_backward on the chain, then the column sums of dz
    # by the identity backward (which only reads): the same dz and dbias bits
    gd2 = _to(cp, d)[0]
    ops.act_backward(gd2, gout, gd2, act)
    assert_bitwise(gd2, gdz, what="act_backward (in place) dz")
    gdz3 = _to(cp, np.empty_like(y))[0]
    poison(gdz3)
    ops.act_backward(_to(cp, d)[0], gout, gdz3, act)
    assert_bitwise(gdz3, gdz, what="act_backward dz")
    poison(gdb)
    ops.bias_act_backward(gd2, gout, gd2, gdb, 0)
    assert_bitwise(gdb, db_first, what="dbias as the column sums of act_backward's dz")
    assert_bitwise(gd2, gdz, what="the identity backward left dz alone")


@pytest.mark.gpu
@pytest.mark.parametrize("B,N", [(1, 37), (7, 33), (512, 256), (4096, 256)])
@pytest.mark.parametrize("act", [0, 1])
def test_gpu_layernorm(cp, rng, B, N, act):
    from cudarl.ops import nn as ops

    x = (2 * rng.standard_normal((B, N)) + 3.0).astype(np.float32)  # row means far from 0: no cancellation in mean
    g, be = (1 + 0.2 * rng.standard_normal(N)).astype(np.float32), (0.1 * rng.standard_normal(N)).astype(np.float32)
    d = rng.standard_normal((B, N)).astype(np.float32)
    x64, g64, be64, d64 = _f64(x, g, be, d)
    out, mean, rstd = np.empty_like(x64), np.empty(B), np.empty(B)
    ref.layernorm_forward(x64, g64, be64, out, mean, rstd, 1e-5, act)
    gx, gg, gbe, gd = _to(cp, x, g, be, d)
    go, gm, gr, gdx = _to(cp, *(np.empty(s, np.float32) for s in ((B, N), (B,), (B,), (B, N))))
    gdg, gdb = _to(cp, np.empty(N, np.float32), np.empty(N, np.float32))
    for a in (go, gm, gr, gdx, gdg, gdb):
        poison(a)
    ops.layernorm_forward(gx, gg, gbe, go, gm, gr, 1e-5, act)
    for name, a, e in (("out", go, out), ("mean", gm, mean), ("rstd", gr, rstd)):
        assert_parity(a, _f32(e), what=name)
    # backward from the GPU's forward state (same ReLU masks)
    out_g, mean_g, rstd_g = _f64(go.get(), gm.get(), gr.get())
    dx, dg, db = np.empty_like(x64), np.empty(N), np.empty(N)
    ref.layernorm_backward(d64, out_g, x64, g64, mean_g, rstd_g, dx, dg, db, act)
    ops.layernorm_backward(gd, go, gx, gg, gm, gr, gdx, gdg, gdb, act)
    for name, a, e in (("dx", gdx, dx), ("dgamma", gdg, dg), ("dbeta", gdb, db)):
        assert_parity(a, _f32(e), what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,Z", [(1, 1, 1), (7, 3, 51), (512, 3, 51), (4096, 5, 21)])
def test_gpu_dueling(cp, rng, B, A, Z):
    """The kernel adds in the twin's order and has no product to contract: float32 results agree
    to rounding (a one-element case can cancel, so the float32 twin is the oracle here)."""
    from cudarl.ops import nn as ops

    va = rng.standard_normal((B, (1 + A) * Z)).astype(np.float32)
    dl = rng.standard_normal((B, A, Z)).astype(np.float32)
    lo, dva = np.empty((B, A, Z), np.float32), np.empty_like(va)
    ref.dueling_forward(va, lo)
    ref.dueling_backward(dl, dva)
    gva, gdl, glo, gdva = _to(cp, va, dl, np.empty_like(lo), np.empty_like(va))
    poison(glo)
    poison(gdva)
    ops.dueling_forward(gva, glo)
    ops.dueling_backward(gdl, gdva)
    assert_parity(glo, lo, rtol=1e-6, what="logits")
    assert_parity(gdva, dva, rtol=1e-6, what="dva")
    base = rng.standard_normal(va.shape).astype(np.float32)  # accumulate: added to what dva holds
    acc, gacc = base.copy(), cp.asarray(base)
    ref.dueling_backward(dl, acc, accumulate=True)
    ops.dueling_backward(gdl, gacc, accumulate=True)
    assert_parity(gacc, acc, rtol=1e-6, what="dva accumulated")


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,D,C", [(1, 1, 3, 64), (7, 32, 33, 64), (512, 32, 256, 64), (4096, 8, 64, 16)])
def test_gpu_iqn_ops(cp, rng, B, N, D, C):
    from cudarl.ops import nn as ops

    counter = np.array([123456789012], np.uint64)
    tau = np.empty((B, N), np.float32)
    ref.iqn_sample_tau(tau, counter, 77, 3)
    gtau, gctr = _to(cp, np.empty_like(tau), counter)
    poison(gtau)
    ops.iqn_sample_tau(gtau, gctr, 77, 3)
    assert_bitwise(gtau, tau, what="tau")  # Philox is bit-identical
    cos = np.empty((B * N, C), np.float32)
    ref.iqn_cos_embed(tau, cos)
    gcos = cp.asarray(np.empty_like(cos))
    poison(gcos)
    ops.iqn_cos_embed(gtau, gcos)
    assert_parity(gcos, cos, rtol=1e-6, what="cos")
    psi, phi, dh = (rng.standard_normal(s).astype(np.float32) for s in ((B, D), (B * N, D), (B * N, D)))
    h, dpsi, dphi = np.empty_like(phi), np.empty(psi.shape), np.empty_like(phi)
    ref.iqn_mix_forward(psi, phi, h)
    ref.iqn_mix_backward(dh, psi, phi, np.empty_like(psi), dphi)
    ref.iqn_mix_backward(*_f64(dh, psi, phi), dpsi, np.empty(phi.shape))
    gpsi, gphi, gdh, gh, gdpsi, gdphi = _to(cp, psi, phi, dh, h, np.empty_like(psi), dphi)
    for a in (gh, gdpsi, gdphi):
        poison(a)
    ops.iqn_mix_forward(gpsi, gphi, gh)
    ops.iqn_mix_backward(gdh, gpsi, gphi, gdpsi, gdphi)
    assert_bitwise(gh, h, what="h")  # one product per element
    assert_bitwise(gdphi, dphi, what="dphi")
    assert_parity(gdpsi, _f32(dpsi), what="dpsi")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 4096])
def test_gpu_plan_gate(cp, rng, B):
    from cudarl.ops import nn as ops

    plan = rng.uniform(size=(B, 2)).astype(np.float32)
    plan[0] = (0.25, 0.5)  # on the threshold: ready, scale = conviction
    s = np.empty(B, np.float32)
    ref.plan_gate(plan, s)
    gp, gs = _to(cp, plan, s)
    poison(gs)
    ops.plan_gate(gp, gs)
    assert_bitwise(gs, s, what="scale")
    assert float(gs.get()[0]) == 0.25


@pytest.mark.gpu
@pytest.mark.parametrize("B,A", [(1, 3), (7, 3), (256, 3), (4097, 5)])
def test_gpu_plan_loss(cp, rng, B, A):
    from cudarl.ops import nn as ops

    plan, q, actions, ret, levels = _plan_case(rng, B, A)
    plan[0, 1] = 0.5  # on the threshold
    dp, st = np.empty((B, 2), np.float32), np.empty(2, np.float32)
    ref.plan_loss(plan, q, actions, ret, levels, dp, st, 0.1)
    gp, gq, ga, gr, gl = _to(cp, plan, q, actions, ret, levels)
    gdp, gst = cp.empty((B, 2), np.float32), cp.empty(2, np.float32)
    poison(gdp)
    poison(gst)
    ops.plan_loss(gp, gq, ga, gr, gl, gdp, gst, 0.1)
    if dp.any():
        assert_parity(gdp, dp, what="dplan")  # Rbar's sum in another order: within rounding
    else:
        assert not gdp.get().any()
    assert_bitwise(gst[:1], st[:1], what="gate open share")  # counts: exact
    assert_parity(gst[1:], st[1:], what="mean scale")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (7, 33, 3, 51), (512, 256, 3, 51)])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("padded", [True, False])
def test_gpu_member_axis_is_single_launches_bitwise(cp, rng, P, shape, act, padded):
    """The bias/activation backward and dueling kernels with a member axis (blockIdx.y the member) give
    member i the bits of a single launch on its entries; P = 1 is the single launch."""
    from cudarl.ops import nn as ops

    _member_axis_is_single_calls(cp, ops, rng, P, shape, act, padded)


# --- GPU: the whole network ----------------------------------------------------------------------
def _nets(cp, head, layernorm, B, seed=3, spectral=()):
    from cudarl.nn import QNetwork

    kw = dict(
        hidden=(256, 256),
        head=head,
        layernorm=layernorm,
        plan=True,
        atoms=51,
        max_batch=B,
        seed=seed,
        spectral=spectral,
        gemm="cublas",
    )
    return (QNetwork(64, 3, xp=cp, **kw), QNetwork(64, 3, **kw), QNetwork(64, 3, dtype=np.float64, **kw))


def _entries(net, buf):
    """The tensors of a flat buffer, concatenated (padding left out)."""
    from cudarl.backend import to_numpy

    b = to_numpy(buf)
    return np.concatenate([b[e.offset : e.offset + e.size] for e in net.layout.entries])


def _set_grad_outputs(net, gq, gp):
    g = net.grad_outputs()
    g["q"][...] = net.xp.asarray(gq.astype(net.dtype))
    g["plan"][...] = net.xp.asarray(gp.astype(net.dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 512, 4096])
@pytest.mark.parametrize("head,layernorm,spectral", [("c51", False, ()), ("c51", True, ("enc.1",)), ("iqn", False, ())])
def test_gpu_qnetwork_forward_backward_match_numpy(cp, rng, B, head, layernorm, spectral):
    """Forward against the twins' own forward; backward against the twins' backward run on the
    GPU's activations (so ReLU masks agree exactly). GPU error against the float64 twin at most
    twice the float32 twin's own, or 1e-5."""
    gpu, cpu32, cpu64 = _nets(cp, head, layernorm, B, spectral=spectral)
    x = rng.standard_normal((B, 64)).astype(np.float32)
    tau = rng.uniform(size=(B, 32)).astype(np.float32) if head == "iqn" else None
    gq = rng.standard_normal(cpu32.forward_shape(B)).astype(np.float32)
    gp = rng.standard_normal((B, 2)).astype(np.float32)
    for e in gpu.layout.entries:
        poison(gpu.G[e.name])
    outs = {}
    for net, xp in ((gpu, cp), (cpu32, np), (cpu64, np)):
        kw = {} if tau is None else {"tau": xp.asarray(tau.astype(net.dtype))}
        o = net.forward(xp.asarray(x.astype(net.dtype)), **kw)
        outs[net] = {k: (v.get() if xp is cp else v.copy()) for k, v in o.items()}
    for k in ("q", "plan"):
        tol = max(1e-5, 2 * rel_error(outs[cpu32][k], outs[cpu64][k]))
        assert rel_error(outs[gpu][k], outs[cpu64][k]) <= tol, k
        assert_parity(outs[gpu][k], outs[cpu32][k], rtol=2 * tol, what=k)
    _set_grad_outputs(gpu, gq, gp)
    gpu.backward()
    for net in (cpu32, cpu64):
        for name, buf in gpu.ws.bufs.items():
            net.ws.bufs[name][...] = buf.get().astype(net.dtype)
        _set_grad_outputs(net, gq, gp)
        net.backward()
    g_gpu, g32, g64 = (_entries(n, n.grads) for n in (gpu, cpu32, cpu64))
    tol = max(1e-5, 2 * rel_error(g32, g64))
    assert rel_error(g_gpu, g64) <= tol, f"grads: {rel_error(g_gpu, g64):.2e} > {tol:.2e}"
    for e in gpu.layout.entries:  # every tensor's gradient is written and close
        sl = slice(e.offset, e.offset + e.size)
        assert_parity(gpu.grads[sl], cpu64.grads[sl].astype(np.float32), rtol=1e-4, what=f"grad {e.name}")


def _fwd_bwd(cp, net, x, gq, gp, outs: dict):
    """A graph phase: forward on x (outputs into ``outs``), the fixed output gradients, backward."""

    def step():
        o = net.forward(x)
        outs.update(q=o["q"], plan=o["plan"])
        g = net.grad_outputs()
        cp.copyto(g["q"], gq)  # device-to-device copies, no allocation
        cp.copyto(g["plan"], gp)
        net.backward(x)

    return step


def _random_fwd_bwd(cp, rng, net, head, B, outs: dict):
    """:func:`_fwd_bwd` on a random input and random output gradients (IQN: random taus in the workspace)."""
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    if head == "iqn":
        net.ws.bufs["head.tau"][...] = cp.asarray(rng.uniform(size=(B, 32)).astype(np.float32))
    gq = cp.asarray(rng.standard_normal(net.forward_shape(B)).astype(np.float32))
    gp = cp.asarray(rng.standard_normal((B, 2)).astype(np.float32))
    return _fwd_bwd(cp, net, x, gq, gp, outs)


def _rerun_bitwise(cp, run, net, outs: dict, want: dict, what: str) -> None:
    """Poison the gradients and the outputs, ``run()`` (a replay or an eager run), and compare the
    outputs and gradients with ``want`` bit for bit."""
    for e in net.layout.entries:
        poison(net.G[e.name])
    poison(outs["q"])
    poison(outs["plan"])
    cp.cuda.Device().synchronize()
    run()
    cp.cuda.Device().synchronize()
    for k in ("q", "plan"):
        assert_bitwise(outs[k], want[k], what=f"{what} {k}")
    assert_bitwise(net.grads, want["grads"], what=f"{what} grads")


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_qnetwork_graphed_equals_eager_bitwise(cp, rng, head):
    from cudarl.graph import StepGraph

    B = 512
    gpu = _nets(cp, head, True, B, spectral=("enc.1",))[0]
    outs = {}
    step = _random_fwd_bwd(cp, rng, gpu, head, B, outs)
    sn = gpu.linears["enc.1"].sn  # the power iteration advances u at each forward: replay from the same u
    u0, v0 = sn["u"].copy(), sn["v"].copy()
    cp.cuda.Device().synchronize()
    g = StepGraph("nn_parity_" + head, [("fwd_bwd", step)], xp=cp)
    g.run_eager()
    g.synchronize()
    first = {"q": outs["q"].get(), "plan": outs["plan"].get(), "grads": gpu.grads.get(), "u": sn["u"].get()}
    g.capture()
    sn["u"][...] = u0
    sn["v"][...] = v0
    _rerun_bitwise(cp, g.replay, gpu, outs, first, "graphed")
    assert_bitwise(sn["u"], first["u"], what="graphed power iteration")


@pytest.mark.gpu
@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("head,layernorm", [("c51", False), ("c51", True), ("iqn", False)])
def test_gpu_side_stream_weight_gradients_equal_one_stream_bitwise(cp, rng, head, layernorm, per_layer):
    """The weight-gradient GEMMs on a side stream, or one per layer (parallel branches of the
    graph; the ReLU backward on the chain, the bias sums on the branches), compute the same bits as
    on one stream, eager and graphed: same kernels, same inputs, only the order changes."""
    from cudarl.graph import SideStream, StepGraph

    B = 512
    gpu = _nets(cp, head, layernorm, B)[0]
    outs = {}
    step = _random_fwd_bwd(cp, rng, gpu, head, B, outs)
    one = StepGraph(f"nn_one_stream_{head}_{layernorm}", [("fwd_bwd", step)], xp=cp)
    one.run_eager()
    one.synchronize()
    want = {"q": outs["q"].get(), "plan": outs["plan"].get(), "grads": gpu.grads.get()}
    gpu.set_side_stream([SideStream(xp=cp) for _ in gpu.linears] if per_layer else SideStream(xp=cp))
    two = StepGraph(f"nn_side_stream_{head}_{layernorm}_{per_layer}", [("fwd_bwd", step)], xp=cp)
    _rerun_bitwise(cp, two.run_eager, gpu, outs, want, "eager, side stream")
    two.capture()
    for i in range(3):
        _rerun_bitwise(cp, two.replay, gpu, outs, want, f"graphed, side stream, replay {i}")


def test_launchers_check_shapes_before_launching():
    """Shape errors surface in Python with the op's name, before any device work (no GPU needed)."""
    from cudarl.ops import nn as ops

    with pytest.raises(ValueError, match="bias_act_forward: bias"):
        ops.bias_act_forward(np.zeros((2, 3), np.float32), np.zeros(4, np.float32), np.zeros((2, 3), np.float32), 1)
    with pytest.raises(ValueError, match="dueling_forward: va"):
        ops.dueling_forward(np.zeros((2, 10), np.float32), np.zeros((2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="activation code"):
        ops.bias_act_forward(np.zeros((2, 3), np.float32), np.zeros(3, np.float32), np.zeros((2, 3), np.float32), 5)


def test_two_workspaces_keep_their_own_forward(rng):
    """DDQN runs the online net on s and s': a backward over ws must use ws's forward, not the latest."""
    from cudarl.nn import QNetwork

    net = QNetwork(8, 3, hidden=(6,), atoms=5, max_batch=4, seed=2)
    ws2 = net.new_workspace(4)
    x1, x2 = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    d = rng.standard_normal((4, 3, 5)).astype(np.float32)
    net.forward(x1)
    net.grad_outputs()["q"][...] = d
    net.backward()
    alone = net.grads.copy()
    net.forward(x1)
    net.forward(x2, ws=ws2)
    net.grad_outputs()["q"][...] = d
    net.backward()
    assert np.array_equal(net.grads, alone)


# --- net.gemm options: cuBLASLt with its bias/ReLU epilogue, one-kernel algorithms, panel GEMMs --------
@pytest.mark.parametrize("gemm", ["cublaslt", "cublaslt_nosplit", "cudarl", "chain"])
def test_gemm_option_reaches_every_linear_and_numpy_ignores_it(rng, gemm):
    """On NumPy the option changes nothing (same math); the fused GEMM is asked for the identity and
    ReLU layers only (the plan head's sigmoid keeps the bias/activation kernel)."""
    from cudarl.nn import QNetwork
    from cudarl.nn.layers import Linear

    for head in ("c51", "iqn"):
        kw = dict(hidden=(6, 5), head=head, plan=True, atoms=5, n_quantiles=4, n_cos=8, max_batch=3, seed=4)
        lt, base = QNetwork(8, 3, gemm=gemm, **kw), QNetwork(8, 3, gemm="cublas", **kw)
        lt.prepare_backward(3)  # nothing to make on NumPy
        assert lt.config.gemm == gemm and base.config.gemm == "cublas"
        assert {lin.lt_all for lin in lt.linears.values()} == {gemm in ("cublaslt_nosplit", "cudarl", "chain")}
        assert lt._chain == ()  # the chain is a GPU launch: NumPy runs the layers one by one
        assert {lin.panel for lin in lt.linears.values() if lin.lt_act is not None} == {gemm == "cudarl"}
        acts = {n: lin.lt_act for n, lin in lt.linears.items()}
        want = {
            "enc.0": "relu",
            "enc.1": "relu",
            "plan.lin": None,
            **({"head.va": "identity"} if head == "c51" else {"head.phi": "relu", "head.out": "identity"}),
        }
        assert acts == want
        assert all(lin.lt_act is None for lin in base.linears.values())
        x = rng.standard_normal((3, 8)).astype(np.float32)
        tau = rng.uniform(size=(3, 4)).astype(np.float32) if head == "iqn" else None
        outs = [net.forward(x, **({} if tau is None else {"tau": tau})) for net in (lt, base)]
        for k in ("q", "plan"):
            assert np.array_equal(outs[0][k], outs[1][k])
        d = rng.standard_normal(base.forward_shape(3)).astype(np.float32)
        dp = rng.standard_normal((3, 2)).astype(np.float32)
        for net in (lt, base):
            net.grad_outputs()["q"][...] = d
            net.grad_outputs()["plan"][...] = dp
            net.backward()
        assert np.array_equal(lt.grads, base.grads)
    with pytest.raises(ValueError, match="gemm 'cutlass' not in"):
        Linear("l", 4, 3, gemm="cutlass")


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("hidden", [(8,), (12, 8), (12, 8, 16)])
@pytest.mark.parametrize("aux", ["none", "after", "early"])
def test_chained_backward_on_numpy_is_the_layer_by_layer_backward(rng, monkeypatch, raw, hidden, aux):
    """QNetwork's chained backward (net.gemm = "chain" on the GPU) run on NumPy, the launches replaced by
    their twins (gemm.chain, gemm.chain_backward) and their eligibility taken as given: the gradients and
    every dz buffer bit for bit the layer-by-layer backward's, through one chain_backward from the head's
    layer down to the first layer's dz (the plan head, a probe, beside it). With an extra head that writes
    dL/dpsi: run after the Q head's backward (``after``), the chained backward declines and the layers run
    one by one; run first (``early``: ``backward_extras``, then ``backward(extras_done=True)``, the agent's
    order), the chain's first step adds the Q head's part to its dL/dpsi before the mask."""
    from cudarl.nn import QNetwork
    from cudarl.nn.layers import Linear
    from cudarl.reference import gemm as twin

    monkeypatch.setattr(twin, "chain_eligible", lambda x, layers: True, raising=False)
    monkeypatch.setattr(twin, "chain_backward_eligible", lambda d, layers: True, raising=False)
    calls, chain_backward = [], twin.chain_backward

    def spy(d, layers, accumulate=False):
        calls.append(([tuple(w.shape) for w, *_ in layers], accumulate))
        chain_backward(d, layers, accumulate)

    monkeypatch.setattr(twin, "chain_backward", spy)
    extra = {"aux": lambda d: Linear("aux", d, 4, act="identity")} if aux != "none" else None
    kw = dict(hidden=hidden, plan=True, atoms=5, max_batch=6, seed=7, extra_heads=extra)
    chained, plain = QNetwork(8, 3, gemm="chain", **kw), QNetwork(8, 3, **kw)
    chained._chain = (*chained.encoder.chain_linears(), chained.head.chain_linear)  # the GPU's (NumPy's is ())
    x = rng.standard_normal((6, 8)).astype(np.float32)
    for net in (chained, plain):
        net.forward(x, raw_head=raw)
    assert chained.ws.chained and not plain.ws.chained
    grads = {k: rng.standard_normal(g.shape).astype(np.float32) for k, g in plain.grad_outputs(raw_head=raw).items()}
    for net in (chained, plain):
        for k, g in net.grad_outputs(raw_head=raw).items():
            g[...] = grads[k]
        if aux == "early":
            assert net.backward_extras()
        net.backward(extras_done=aux == "early")
    shapes = [(hidden[-1], 20)] + [(hidden[i - 1], hidden[i]) for i in range(len(hidden) - 1, 0, -1)]
    want = [] if aux == "after" else [(shapes, aux == "early")]
    assert calls == want, "one chain_backward: va's weight, then the encoder's from the top down to enc.1's"
    assert_bitwise(chained.grads, plain.grads, what="gradients")
    for name in chained.ws.bufs:
        if name.endswith(".dout"):
            assert_bitwise(chained.ws.rows(name), plain.ws.rows(name), what=name)


def test_backward_grads_refuses_a_spectral_layer(rng):
    """Linear.backward_grads (the chained backward's parameter gradients from dz in dout) is no spectral
    layer's: W_sn's backward is Linear.backward's only (a spectral layer never chains)."""
    from cudarl.nn import QNetwork

    net = QNetwork(8, 3, hidden=(6, 5), atoms=5, max_batch=2, spectral=("enc.1",))
    x = rng.standard_normal((2, 8)).astype(np.float32)
    net.forward(x)
    with pytest.raises(ValueError, match="enc.1: a spectrally normalised layer"):
        net.linears["enc.1"].backward_grads(net.ws.rows("enc.0.out"), net.ws)


def test_agent_builds_its_networks_with_the_configured_gemm():
    from cudarl.agent import Agent
    from cudarl.config import from_dict

    cfg = from_dict({"net": {"hidden": [8], "gemm": "cublaslt"}, "agent": {"batch_size": 4}})
    agent = Agent(cfg, 6, 3, 2, np)
    for net in (agent.online, agent.target):
        assert net.config.gemm == "cublaslt"
        assert {lin.gemm for lin in net.linears.values()} == {"cublaslt"}


# --- net.dw_gemm: the weight gradients' GEMM algorithm --------------------------------------------------
def _dw_calls(monkeypatch) -> list:
    """Record ``(out.shape, split_k)`` of every ``blas.gemm_lt`` call with ``trans_a`` (a weight gradient)."""
    from cudarl import blas

    calls, gemm_lt = [], blas.gemm_lt

    def spy(a, b, out, **kw):
        if kw.get("trans_a"):
            calls.append((tuple(out.shape), kw.get("split_k", True)))
        return gemm_lt(a, b, out, **kw)

    monkeypatch.setattr(blas, "gemm_lt", spy)
    return calls


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_dw_gemm_reaches_every_linear_and_numpy_computes_the_same(rng, monkeypatch, head):
    """net.dw_gemm = "one_kernel" sets every layer's weight-gradient GEMM (the plan head's, and a twin's),
    whose float32 backward calls gemm_lt(trans_a, split_k=False) once a layer; on NumPy that is the same
    product as the default's cuBLAS call, so the gradients are the default's bit for bit. A float64
    network (gradient checks) keeps matmul."""
    from cudarl.nn import QNetwork

    calls = _dw_calls(monkeypatch)
    kw = dict(hidden=(6, 5), head=head, plan=True, atoms=5, n_quantiles=4, n_cos=8, max_batch=3, seed=4)
    one, base = QNetwork(8, 3, dw_gemm="one_kernel", **kw), QNetwork(8, 3, **kw)
    assert base.config.dw_gemm == "split_k" and {lin.dw_gemm for lin in base.linears.values()} == {"split_k"}
    for net in (one, one.twin()):
        assert {lin.dw_gemm for lin in net.linears.values()} == {"one_kernel"}
    one.prepare_backward(3)  # nothing to make on NumPy
    x = rng.standard_normal((3, 8)).astype(np.float32)
    tau = {"tau": rng.uniform(size=(3, 4)).astype(np.float32)} if head == "iqn" else {}
    d = rng.standard_normal(base.forward_shape(3)).astype(np.float32)
    dp = rng.standard_normal((3, 2)).astype(np.float32)
    for net in (one, base):
        net.forward(x, **tau)
        _set_grad_outputs(net, d, dp)
        net.backward()
    assert_bitwise(one.grads, base.grads, what="one-kernel dW vs split-K dW on NumPy")
    want = sorted(((lin.n_in, lin.n_out), False) for lin in one.linears.values())
    assert sorted(calls) == want, "one gemm_lt(trans_a, split_k=False) a layer, nothing else"
    calls.clear()
    f64 = QNetwork(8, 3, dw_gemm="one_kernel", dtype=np.float64, **kw)
    f64.forward(x.astype(np.float64), **{k: v.astype(np.float64) for k, v in tau.items()})
    _set_grad_outputs(f64, d, dp)
    f64.backward()
    assert calls == [] and np.all(np.isfinite(f64.grads))


def test_dw_gemm_is_validated():
    from cudarl.config import ConfigError, NetConfig, from_dict
    from cudarl.nn.layers import Linear

    with pytest.raises(ConfigError, match=r"net: dw_gemm must be one of \['split_k', 'one_kernel'\], got 'splitk'"):
        NetConfig(dw_gemm="splitk")
    with pytest.raises(ConfigError, match="dw_gemm must be one of"):
        from_dict({"net": {"dw_gemm": "batched"}})
    with pytest.raises(ValueError, match="dw_gemm 'x' not in"):
        Linear("l", 4, 3, dw_gemm="x")
    assert from_dict({"net": {"dw_gemm": "one_kernel"}}).net.dw_gemm == "one_kernel"


def _gemm_pair(cp, head, layernorm, B, spectral=(), seed=3, gemm="cublaslt"):
    """The same network (same seed, same parameters) with ``gemm`` and with the default; the first
    has its backward's plans made too (``cublaslt_nosplit``)."""
    from cudarl.nn import QNetwork

    kw = dict(
        hidden=(256, 256),
        head=head,
        layernorm=layernorm,
        plan=True,
        atoms=51,
        max_batch=B,
        seed=seed,
        spectral=spectral,
        xp=cp,
    )
    lt = QNetwork(64, 3, gemm=gemm, **kw)
    lt.prepare_backward(B)
    return lt, QNetwork(64, 3, gemm="cublas", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt", "cublaslt_nosplit", "cudarl", "chain"])
@pytest.mark.parametrize("B", [1, 7, 512, 4096])
@pytest.mark.parametrize("head,layernorm,spectral", [("c51", False, ()), ("c51", True, ("enc.1",)), ("iqn", False, ())])
def test_gpu_qnetwork_gemm_option_matches_the_default_network(cp, rng, B, head, layernorm, spectral, gemm):
    """Forward: the outputs and every layer's activations of the network with the gemm option match the
    default network's to rel. error <= 1e-5. Backward: its gradients (from its own forward) match the
    default network's backward run on the same activations (so ReLU masks agree exactly)."""
    lt, base = _gemm_pair(cp, head, layernorm, B, spectral, gemm=gemm)
    assert cp.array_equal(lt.params, base.params)
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    tau = cp.asarray(rng.uniform(size=(B, 32)).astype(np.float32)) if head == "iqn" else None
    for e in lt.layout.entries:
        poison(lt.G[e.name])
    for name in lt.ws.bufs:
        if name.endswith(".out"):
            poison(lt.ws.bufs[name])
    kw = {} if tau is None else {"tau": tau}
    o_lt, o_base = lt.forward(x, **kw), base.forward(x, **kw)
    for k in ("q", "plan"):
        assert_parity(o_lt[k], o_base[k].get(), rtol=1e-5, what=f"forward {k}")
    for name in lt.ws.bufs:
        if name.endswith(".out"):
            assert_parity(lt.ws.rows(name), base.ws.rows(name).get(), rtol=1e-5, what=f"activation {name}")
    gq = rng.standard_normal(lt.forward_shape(B)).astype(np.float32)
    gp = rng.standard_normal((B, 2)).astype(np.float32)
    _set_grad_outputs(lt, gq, gp)
    lt.backward()
    for name, buf in lt.ws.bufs.items():
        cp.copyto(base.ws.bufs[name], buf)
    _set_grad_outputs(base, gq, gp)
    base.backward()
    for e in lt.layout.entries:
        sl = slice(e.offset, e.offset + e.size)
        assert_parity(lt.grads[sl], base.grads[sl].get(), rtol=1e-5, what=f"grad {e.name}")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 512, 1024])
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_chain_network_is_the_panel_network_bitwise(cp, rng, B, head):
    """net.gemm = "chain": the encoder's two layers (and the C51 head's va) in one chain launch, whose every
    activation and output is bit for bit the network under "cudarl" (the panel GEMM a layer, at these
    shapes: 64 input columns, at most 1024 rows); the backward: the test below."""
    from cudarl import kernels

    chain, _ = _gemm_pair(cp, head, False, B, gemm="chain")
    panel, _ = _gemm_pair(cp, head, False, B, gemm="cudarl")
    want = ("enc.0", "enc.1", "head.va") if head == "c51" else ("enc.0", "enc.1")
    assert tuple(lin.name for lin in chain._chain) == want
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    kw = {"tau": cp.asarray(rng.uniform(size=(B, 32)).astype(np.float32))} if head == "iqn" else {}
    for name in chain.ws.bufs:
        if name.endswith(".out"):
            poison(chain.ws.bufs[name])
    with kernels.tracing() as events:
        o_chain = chain.forward(x, **kw)
    launched = [e["name"] for e in events if e.get("kind") == "kernel"]
    assert launched.count("cudarl_gemm_chain") == 1 and "cudarl_gemm_nn_bias_act" not in launched, launched
    o_panel = panel.forward(x, **kw)
    assert_bitwise(o_chain["plan"], o_panel["plan"], what="forward plan")
    if head == "c51":
        assert_bitwise(o_chain["q"], o_panel["q"], what="forward q")
    else:  # the IQN head's layers are cuBLASLt's under "chain", the panel's under "cudarl" where they fit
        assert_parity(o_chain["q"], o_panel["q"].get(), rtol=1e-5, what="forward q")
    for name in want:
        assert_bitwise(chain.ws.rows(f"{name}.out"), panel.ws.rows(f"{name}.out"), what=f"activation {name}")
    raw = chain.forward(x, raw_head=True, **kw)["q"] if head == "c51" else None
    if raw is not None:
        assert_bitwise(raw, panel.forward(x, raw_head=True)["q"], what="raw va")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 7, 512, 1024])
@pytest.mark.parametrize("raw", [False, True])
def test_gpu_chain_network_backward_is_the_panel_networks_bitwise(cp, rng, B, raw):
    """net.gemm = "chain" with the C51 head: the backward's dx chain, dL/dva through the encoder down to
    enc.0's dz, is one chain_backward launch (no dx GEMM and no ReLU-mask kernel), and over the same
    activations (the chain network's, copied: the forwards' own equality is the test above) every gradient
    and dz buffer is bit for bit the network's under "cudarl" (the panel nt then act_backward a layer, at
    these shapes); the weight gradients are the same cuBLAS GEMMs of the same dz."""
    from cudarl import kernels

    chain, _ = _gemm_pair(cp, "c51", False, B, gemm="chain")
    panel, _ = _gemm_pair(cp, "c51", False, B, gemm="cudarl")
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    for net in (chain, panel):
        net.forward(x, raw_head=raw)
    assert chain.ws.chained and not panel.ws.chained
    for name, buf in chain.ws.bufs.items():
        if name.endswith(".out"):
            cp.copyto(panel.ws.bufs[name], buf)
    outs = panel.grad_outputs(raw_head=raw)
    grads = {k: cp.asarray(rng.standard_normal(g.shape).astype(np.float32)) for k, g in outs.items()}
    for net in (chain, panel):
        for k, g in net.grad_outputs(raw_head=raw).items():
            g[...] = grads[k]
    for e in chain.layout.entries:
        poison(chain.G[e.name])
    for name in ("enc.0.dout", "enc.1.dout"):
        poison(chain.ws.bufs[name])
    with kernels.tracing() as events:
        chain.backward()
    launched = [e["name"] for e in events if e.get("kind") in ("kernel", "library")]
    assert launched.count("cudarl_gemm_chain_backward") == 1, launched
    assert not {"cudarl_nn_act_backward", "cudarl_gemm_nt", "cublaslt_matmul"} & set(launched), launched
    panel.backward()
    for e in chain.layout.entries:
        assert_bitwise(chain.G[e.name], panel.G[e.name], what=f"grad {e.name}")
    for name in ("head.va.dout", "enc.1.dout", "enc.0.dout"):
        assert_bitwise(chain.ws.rows(name), panel.ws.rows(name), what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt", "cublaslt_nosplit", "cudarl", "chain"])
@pytest.mark.parametrize("head,layernorm", [("c51", False), ("c51", True), ("iqn", False)])
def test_gpu_qnetwork_gemm_option_captures_before_any_eager_run(cp, rng, head, layernorm, gemm):
    """The trainer captures its step without running it eagerly first: a network's workspace with
    the gemm option made its cuBLASLt plans, so forward + backward capture at once, the replay equals a
    later eager run bit for bit, and its output matches the default network's (rel. error <= 1e-5)."""
    from cudarl.graph import StepGraph

    B = 512
    lt, base = _gemm_pair(cp, head, layernorm, B, seed=5, gemm=gemm)
    x = cp.asarray(rng.standard_normal((B, 64)).astype(np.float32))
    if head == "iqn":
        tau = cp.asarray(rng.uniform(size=(B, 32)).astype(np.float32))
        lt.ws.bufs["head.tau"][...] = tau
        base.ws.bufs["head.tau"][...] = tau
    gq = cp.asarray(rng.standard_normal(lt.forward_shape(B)).astype(np.float32))
    gp = cp.asarray(rng.standard_normal((B, 2)).astype(np.float32))
    outs = {}
    step = _fwd_bwd(cp, lt, x, gq, gp, outs)
    cp.cuda.Device().synchronize()
    g = StepGraph(f"nn_{gemm}_" + head + ("_ln" if layernorm else ""), [("fwd_bwd", step)], xp=cp)
    g.capture()  # no eager run before: the plans come from QNetwork.new_workspace
    g.replay()
    g.synchronize()
    graphed = {"q": outs["q"].get(), "plan": outs["plan"].get(), "grads": lt.grads.get()}
    assert_parity(graphed["q"], base.forward(x)["q"].get(), rtol=1e-5, what="graphed cuBLASLt q vs default network")
    _rerun_bitwise(cp, g.run_eager, lt, outs, graphed, "eager (after the graph) vs graphed:")


@pytest.mark.gpu
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_dw_gemm_is_the_weight_gradients_gemm_and_captures_before_any_eager_run(cp, rng, dw_gemm):
    """The reference network with the plan head (66 inputs, 256-256, 51 atoms, batch 512): forward and
    backward captured before any eager run (prepare_backward made the dW plans), the replay equal to a
    later eager run bit for bit. Under "one_kernel" each layer's weight gradient is, bit for bit,
    blas.gemm_lt(x, dz, trans_a=True, split_k=False) on the backward's own operands (its input rows and
    the dz its dout rows hold after the backward), and the gradients match the default (split-K)
    network's to rel. error <= 1e-5; under "split_k" they are the default network's bit for bit."""
    from cudarl import blas
    from cudarl.graph import StepGraph
    from cudarl.nn import QNetwork

    B = 512
    kw = dict(hidden=(256, 256), plan=True, atoms=51, max_batch=B, seed=5, xp=cp)
    net, base = QNetwork(66, 3, dw_gemm=dw_gemm, **kw), QNetwork(66, 3, **kw)
    net.prepare_backward(B)
    x = cp.asarray(rng.standard_normal((B, 66)).astype(np.float32))
    gq = cp.asarray(rng.standard_normal(net.forward_shape(B)).astype(np.float32))
    gp = cp.asarray(rng.standard_normal((B, 2)).astype(np.float32))
    outs = {}
    cp.cuda.Device().synchronize()
    g = StepGraph(f"nn_dw_{dw_gemm}", [("fwd_bwd", _fwd_bwd(cp, net, x, gq, gp, outs))], xp=cp)
    g.capture()  # no eager run before: the plans come from new_workspace and prepare_backward
    g.replay()
    g.synchronize()
    graphed = {"q": outs["q"].get(), "plan": outs["plan"].get(), "grads": net.grads.get()}
    psi = net.ws.rows("enc.1.out", B)
    inputs = {"enc.0": x, "enc.1": net.ws.rows("enc.0.out", B), "head.va": psi, "plan.lin": psi}
    assert set(inputs) == set(net.linears)
    if dw_gemm == "one_kernel":
        for name, xin in inputs.items():
            want = cp.full(net.G[f"{name}.weight"].shape, np.nan, np.float32)
            blas.gemm_lt(xin, net.ws.rows(f"{name}.dout", B), want, trans_a=True, split_k=False)
            assert_bitwise(net.G[f"{name}.weight"], want, what=f"{name}: dW against one one-kernel cuBLASLt GEMM")
    base.forward(x)
    _set_grad_outputs(base, gq, gp)
    base.backward(x)
    if dw_gemm == "split_k":
        assert_bitwise(graphed["grads"], base.grads.get(), what="split-K dW vs the default network")
    else:
        assert_parity(graphed["grads"], base.grads.get(), rtol=1e-5, what="one-kernel dW vs split-K dW")
    _rerun_bitwise(cp, g.run_eager, net, outs, graphed, f"dw_gemm {dw_gemm}: eager (after the graph) vs graphed:")


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt", "chain"])
def test_gpu_trainer_with_cublaslt_captures_and_is_reproducible(gemm):
    """A training run with net.gemm = "cublaslt" or "chain" (the trainer captures without an eager step):
    two runs give the same losses bit for bit, and the first loss matches the cuBLAS run's. Under "chain"
    the captured forwards are chain launches and the backward's dx chain one chain_backward (traced)."""
    from cudarl.config import from_dict
    from cudarl.trainer import Trainer

    def losses(gemm):
        cfg = from_dict(
            {
                "run": {"device": "gpu", "steps": 30, "eval_every": 0, "checkpoint_every": 0, "log_every": 10},
                "data": {"source": "builtin:regime?n=1500"},
                "env": {"n_envs": 64, "episode_len": 128},
                "replay": {"capacity": 20_000},
                "agent": {"batch_size": 128, "learning_starts": 1000},
                "net": {"hidden": [64, 64], "gemm": gemm},
                "guard": {"snapshot_every": 20},
            }
        )
        t = Trainer(cfg, run_dir=False, echo=lambda m: None)
        t.run(30)
        return t.losses

    from cudarl import kernels

    with kernels.tracing() as events:
        a = losses(gemm)
    b, ref = losses(gemm), losses("cublas")
    for kernel in ("cudarl_gemm_chain", "cudarl_gemm_chain_backward"):
        chains = [e for e in events if e.get("name") == kernel]
        assert bool(chains) == (gemm == "chain"), f"{len(chains)} {kernel} launches under net.gemm = {gemm!r}"
    assert len(a) == 30 and np.all(np.isfinite(a))
    assert a == b, f"two {gemm} runs differ"
    assert abs(a[0] - ref[0]) <= 1e-3 * abs(ref[0]), f"first loss {a[0]} ({gemm}) vs {ref[0]} (cuBLAS)"


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt_nosplit", "cudarl"])
def test_gpu_linear_dx_accumulates_in_one_cublaslt_gemm(cp, rng, gemm):
    """A Linear's dx that adds into a gradient already there (the Q head's onto the extra heads' dL/dpsi):
    one cuBLASLt GEMM with dx as C in place (beta 1; before, cuBLAS's beta = 1 split K into a second
    kernel), planned by prepare_backward, captured == eager bit for bit, and dx + dz W^T to rounding."""
    from cudarl import kernels
    from cudarl.graph import StepGraph
    from cudarl.nn.layers import Linear
    from cudarl.nn.params import ParamLayout

    B, n_in, n_out = 96, 64, 36
    lin = Linear("l", n_in, n_out, act="identity", gemm=gemm)
    layout = ParamLayout()
    lin.declare(layout, [])
    params = cp.asarray(layout.init_host(3, np.float32))
    lin.bind(layout.views(params), layout.views(cp.zeros_like(params)), cp)
    lin.prepare_backward(B)
    dz = cp.asarray(rng.standard_normal((B, n_out)).astype(np.float32))
    was = cp.asarray(rng.standard_normal((B, n_in)).astype(np.float32))
    eager, cap = was.copy(), cp.empty_like(was)
    with kernels.tracing() as events:
        lin._dx(dz, eager, accumulate=True)
    gemms = [e for e in events if e["kind"] == "library"]
    assert [(e["name"], e["beta"]) for e in gemms] == [("cublaslt_matmul", 1.0)]
    want = was.get().astype(np.float64) + dz.get().astype(np.float64) @ lin.weight().get().astype(np.float64).T
    assert_parity(eager, want.astype(np.float32), what="dx accumulated in place")
    g = StepGraph("dx_accumulate", [("dx", lambda: lin._dx(dz, cap, accumulate=True))], xp=cp)
    g.capture()  # the in-place plan prepare_backward made (a capture makes none)
    cap[...] = was
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_bitwise(cap, eager, what="dx accumulated, graphed vs eager")


def _addend_linear(xp, gemm="cublaslt_nosplit", B=96, n_in=64, n_out=36, seed=3):
    from cudarl.nn.layers import Linear
    from cudarl.nn.params import ParamLayout

    lin = Linear("l", n_in, n_out, act="identity", gemm=gemm)
    layout = ParamLayout()
    lin.declare(layout, [])
    params = xp.asarray(layout.init_host(seed, np.float32))
    lin.bind(layout.views(params), layout.views(xp.zeros_like(params)), xp)
    lin.prepare_backward(B)
    return lin


def test_linear_dx_with_an_addend_is_the_in_place_sum_and_leaves_the_addend(rng):
    """``accumulate=<array>`` (Gradient Vaccine's buffer of the extra heads' dL/dpsi): dx = dz W^T + it, bit
    for bit the in-place sum over a copy of it, and the addend as it was."""
    lin = _addend_linear(np)
    dz = rng.standard_normal((96, 36)).astype(np.float32)
    addend = rng.standard_normal((96, 64)).astype(np.float32)
    kept, in_place, dx = addend.copy(), addend.copy(), np.full((96, 64), np.nan, np.float32)
    lin._dx(dz, in_place, accumulate=True)
    lin._dx(dz, dx, accumulate=addend)
    assert_bitwise(dx, in_place, what="dx with an addend")
    assert_bitwise(addend, kept, what="the addend")
    with pytest.raises(ValueError, match="addend"):
        lin._dx(dz, dx, accumulate=addend[:10])


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt_nosplit", "cublas"])
def test_gpu_linear_dx_with_an_addend_is_the_in_place_sum_bit_for_bit(cp, rng, gemm):
    """The addend as cuBLASLt's C (C != D, one GEMM, the in-place plan's kernel) or, under cuBLAS, copied
    into dx first: the bits of the in-place sum, the addend unchanged, captured == eager."""
    from cudarl import kernels
    from cudarl.graph import StepGraph

    lin = _addend_linear(cp, gemm)
    dz = cp.asarray(rng.standard_normal((96, 36)).astype(np.float32))
    addend = cp.asarray(rng.standard_normal((96, 64)).astype(np.float32))
    kept, in_place, dx, cap = addend.copy(), addend.copy(), cp.empty_like(addend), cp.empty_like(addend)
    for a in (dx, cap):
        poison(a)
    lin._dx(dz, in_place, accumulate=True)
    with kernels.tracing() as events:
        lin._dx(dz, dx, accumulate=addend)
    if gemm == "cublaslt_nosplit":
        gemms = [e for e in events if e["kind"] == "library"]
        assert [(e["name"], e["beta"]) for e in gemms] == [("cublaslt_matmul", 1.0)]
        assert not [e for e in events if e["kind"] != "library"]  # no copy
    assert_bitwise(dx, in_place, what=f"dx with an addend ({gemm})")
    assert_bitwise(addend, kept, what="the addend")
    g = StepGraph("dx_addend", [("dx", lambda: lin._dx(dz, cap, accumulate=addend))], xp=cp)
    g.capture()
    g.replay()
    g.synchronize()
    assert_bitwise(cap, in_place, what="dx with an addend, graphed vs eager")
