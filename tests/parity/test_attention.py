"""Parity of ``cuda_src/attention.cu`` with ``cudarl.reference.attention`` (causal RoPE attention and its
key/value-cache step). The whole AttentionEncoder on the GPU: tests/parity/test_encoder_parity.py.

CPU tests hold the twin's identities: RoPE's scores depend on position differences only, a window of one
bar returns its value, the mask hides later bars, the cache step is the windowed forward's last row and,
past W bars, a window of the last W. ``gpu`` tests compare the fused kernels with the float64 twin on random
float32 inputs (poisoned outputs; windows up to 128 and head dims up to 64).
"""

import numpy as np
import pytest

from cudarl.reference import attention as ref
from cudarl.testing import assert_bitwise, assert_oracle, poison, rel_error

BASE = 10000.0


def fwd(qkv, B, W, H, dtype=np.float64):
    d = qkv.shape[1] // 3
    o, lse = np.empty((B * W, d), dtype), np.empty((B, H, W), dtype)
    ref.forward(np.asarray(qkv, dtype), o, lse, BASE)
    return o, lse


# --- CPU: identities ----------------------------------------------------------------------------------
def test_rope_scores_depend_on_the_position_difference_only(rng):
    Dh = 8
    q, k = rng.standard_normal((1, Dh)), rng.standard_normal((1, Dh))
    dots = []
    for shift in (0, 5, 1000):
        cq, sq = ref.rope_angles([3 + shift], Dh, BASE)
        ck, sk = ref.rope_angles([1 + shift], Dh, BASE)
        dots.append((ref.rope(q, cq, sq) @ ref.rope(k, ck, sk).T).item())
    np.testing.assert_allclose(dots[1:], dots[0], rtol=1e-11)
    c, s = ref.rope_angles([7], Dh, BASE)
    np.testing.assert_allclose(ref.rope(ref.rope(q, c, s), c, s, -1), q, rtol=1e-14)  # rotating back


def test_one_bar_attends_to_itself(rng):
    B, H, Dh = 3, 2, 4
    qkv = rng.standard_normal((B, 3 * H * Dh))
    o, lse = fwd(qkv, B, 1, H)
    np.testing.assert_array_equal(o, qkv[:, 2 * H * Dh :])
    dq = np.empty_like(qkv)
    ref.backward(rng.standard_normal(o.shape), qkv, o, lse, dq, BASE)
    assert np.abs(dq[:, : 2 * H * Dh]).max() < 1e-14  # one key: the softmax is constant, no q or k gradient


@pytest.mark.parametrize("B,W,H,Dh", [(2, 6, 2, 4), (3, 1, 1, 2), (1, 9, 3, 6)])
def test_last_position_is_the_windows_last_row(rng, B, W, H, Dh):
    """last_forward is forward's last row (o and lse); last_backward from do_T is backward from a do that is zero
    before the last position (float64, every gradient)."""
    d = H * Dh
    qkv = rng.standard_normal((B * W, 3 * d))
    o, lse = fwd(qkv, B, W, H)
    ol, ll = np.empty((B, d)), np.empty((B, H))
    ref.last_forward(qkv, ol, ll, BASE)
    np.testing.assert_allclose(ol, o.reshape(B, W, d)[:, -1], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ll, lse[..., -1], rtol=1e-12)
    dol = rng.standard_normal((B, d))
    do = np.zeros((B * W, d))
    do.reshape(B, W, d)[:, -1] = dol
    full, last = np.empty_like(qkv), np.full_like(qkv, np.nan)
    ref.backward(do, qkv, o, lse, full, BASE)
    ref.last_backward(dol, qkv, ol, ll, last, BASE)
    np.testing.assert_allclose(last, full, rtol=1e-11, atol=1e-13)


def test_later_bars_do_not_change_earlier_rows(rng):
    B, W, H, Dh, t = 2, 6, 2, 4, 3
    qkv = rng.standard_normal((B * W, 3 * H * Dh))
    o, lse = fwd(qkv, B, W, H)
    q2 = qkv.reshape(B, W, -1).copy()
    q2[:, t:] = rng.standard_normal(q2[:, t:].shape)
    o2, lse2 = fwd(q2.reshape(B * W, -1), B, W, H)
    np.testing.assert_array_equal(o.reshape(B, W, -1)[:, :t], o2.reshape(B, W, -1)[:, :t])
    np.testing.assert_array_equal(lse[..., :t], lse2[..., :t])


def test_cache_step_is_the_forward_then_a_sliding_window(rng):
    """Bars 0..W-1 through the cache give the windowed forward's rows; bar W + 4 attends to bars 5..W+4,
    the forward over that window (RoPE: shifting every position changes no score)."""
    B, W, H, Dh = 2, 5, 2, 4
    d = H * Dh
    T = W + 5
    qkv = rng.standard_normal((B, T, 3 * d))
    kc, vc, pos = np.zeros((B, H, W, Dh)), np.zeros((B, H, W, Dh)), np.zeros(B, np.int64)
    o, _ = fwd(qkv[:, :W].reshape(B * W, -1), B, W, H)
    ot = np.empty((B, d))
    for t in range(T):
        ref.step(qkv[:, t], kc, vc, pos, ot, BASE)
        ref.advance(pos)
        if t < W:
            np.testing.assert_allclose(ot, o.reshape(B, W, d)[:, t], rtol=1e-12)
    last, _ = fwd(np.ascontiguousarray(qkv[:, T - W :]).reshape(B * W, -1), B, W, H)
    np.testing.assert_allclose(ot, last.reshape(B, W, d)[:, -1], rtol=1e-10)
    assert (pos == T).all()


def test_lse_is_the_log_normaliser(rng):
    B, W, H, Dh = 1, 4, 1, 2
    qkv = rng.standard_normal((B * W, 3 * H * Dh))
    _, lse = fwd(qkv, B, W, H)
    q, k = qkv[:, :2], qkv[:, 2:4]
    c, s = ref.rope_angles(np.arange(W), Dh, BASE)
    S = ref.rope(q, c, s) @ ref.rope(k, c, s).T / np.sqrt(2)
    want = [np.log(np.exp(S[t, : t + 1]).sum()) for t in range(W)]
    np.testing.assert_allclose(lse[0, 0], want, rtol=1e-13)


def test_launchers_check_shapes_before_launching():
    from cudarl.ops import attention as ops

    f = np.float32
    with pytest.raises(ValueError, match="even head dim <= 64"):
        ops.forward(np.zeros((4, 9), f), np.zeros((4, 3), f), np.zeros((1, 1, 4), f), BASE)
    with pytest.raises(ValueError, match="W=129"):
        ops.forward(np.zeros((129, 12), f), np.zeros((129, 4), f), np.zeros((1, 2, 129), f), BASE)
    with pytest.raises(ValueError, match="step: pos"):
        ops.step(
            np.zeros((2, 12), f), np.zeros((2, 2, 3, 2), f), np.zeros((2, 2, 3, 2), f), np.zeros(3, np.int64), None, 1.0
        )
    assert ops.backward_shared(128, 64) <= 227 * 1024  # the largest window and head fit one block


# --- GPU: ops ----------------------------------------------------------------------------------------
GPU_CASES = [
    (1, 1, 1, 2),
    (3, 7, 2, 4),
    (2, 40, 3, 6),
    (5, 64, 4, 32),
    (2, 128, 1, 64),
    (512, 64, 4, 32),
    (64, 128, 2, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,Dh", GPU_CASES)
def test_gpu_forward_backward(cp, rng, B, W, H, Dh):
    from cudarl.ops import attention as ops

    d = H * Dh
    qkv = rng.standard_normal((B * W, 3 * d)).astype(np.float32)
    do = rng.standard_normal((B * W, d)).astype(np.float32)
    (o32, l32), (o64, l64) = fwd(qkv, B, W, H, np.float32), fwd(qkv, B, W, H)
    gqkv = cp.asarray(qkv)
    go, gl = cp.empty((B * W, d), np.float32), cp.empty((B, H, W), np.float32)
    poison(go)
    poison(gl)
    ops.forward(gqkv, go, gl, BASE)
    assert_oracle(go, o32, o64, what="o")
    assert_oracle(gl, l32, l64, what="lse")
    o, lse = go.get(), gl.get()  # the backward from the GPU's forward on both sides
    want = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        dq = np.empty(qkv.shape, cast)
        ref.backward(*(np.asarray(a, cast) for a in (do, qkv, o, lse)), dq, BASE)
        want[name] = dq
    gd = cp.empty(qkv.shape, np.float32)
    poison(gd)
    ops.backward(cp.asarray(do), gqkv, go, gl, gd, BASE)
    for name, sl in (("dq", slice(0, d)), ("dk", slice(d, 2 * d)), ("dv", slice(2 * d, 3 * d))):
        if W == 1 and name != "dv":  # one key: the softmax is constant and q, k get no gradient
            assert float(cp.abs(gd[:, sl]).max()) < 1e-6, name
            continue
        assert_oracle(gd[:, sl], want["32"][:, sl], want["64"][:, sl], what=name)
    first = gd.get()
    ops.backward(cp.asarray(do), gqkv, go, gl, gd, BASE)
    assert_bitwise(gd, first, what="rerun")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,Dh", GPU_CASES)
def test_gpu_last_position(cp, rng, B, W, H, Dh):
    """last_forward and last_backward against the float64 twin (poisoned outputs), the forward kernel's last row
    bit for bit (the same row code), and a rerun bitwise."""
    from cudarl.ops import attention as ops

    d = H * Dh
    qkv = rng.standard_normal((B * W, 3 * d)).astype(np.float32)
    dol = rng.standard_normal((B, d)).astype(np.float32)
    gqkv = cp.asarray(qkv)
    go, gl = cp.empty((B, d), np.float32), cp.empty((B, H), np.float32)
    poison(go)
    poison(gl)
    ops.last_forward(gqkv, go, gl, BASE)
    want = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        o, lse = np.empty((B, d), cast), np.empty((B, H), cast)
        ref.last_forward(qkv.astype(cast), o, lse, BASE)
        dq = np.empty(qkv.shape, cast)
        ref.last_backward(*(np.asarray(a, cast) for a in (dol, qkv, go.get(), gl.get())), dq, BASE)
        want[name] = dict(o=o, lse=lse, dqkv=dq)
    assert_oracle(go, want["32"]["o"], want["64"]["o"], what="o at the last position")
    assert_oracle(gl, want["32"]["lse"], want["64"]["lse"], what="lse at the last position")
    fo, fl = cp.empty((B * W, d), np.float32), cp.empty((B, H, W), np.float32)
    ops.forward(gqkv, fo, fl, BASE)
    assert_bitwise(go, fo.reshape(B, W, d)[:, -1], what="the forward kernel's last row")
    gd = cp.empty(qkv.shape, np.float32)
    poison(gd)
    ops.last_backward(cp.asarray(dol), gqkv, go, gl, gd, BASE)
    for name, sl in (("dq", slice(0, d)), ("dk", slice(d, 2 * d)), ("dv", slice(2 * d, 3 * d))):
        if W == 1 and name != "dv":
            assert float(cp.abs(gd[:, sl]).max()) < 1e-6, name
            continue
        assert_oracle(gd[:, sl], want["32"]["dqkv"][:, sl], want["64"]["dqkv"][:, sl], what=name)
    assert bool((gd.reshape(B, W, 3 * d)[:, :-1, :d] == 0).all()), "dq before the last position must be written 0"
    first = gd.get()
    ops.last_backward(cp.asarray(dol), gqkv, go, gl, gd, BASE)
    assert_bitwise(gd, first, what="rerun")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,Dh", GPU_CASES[:5] + [(4096, 64, 4, 32)])
def test_gpu_cache_step(cp, rng, B, W, H, Dh):
    """W + 3 bars through the GPU cache against the twin's cache; at bar W - 1 against the GPU's forward."""
    from cudarl.ops import attention as ops

    d, T = H * Dh, W + 3
    qkv = rng.standard_normal((B, T, 3 * d)).astype(np.float32)
    go, gl = cp.empty((B * W, d), np.float32), cp.empty((B, H, W), np.float32)
    ops.forward(cp.asarray(np.ascontiguousarray(qkv[:, :W]).reshape(B * W, -1)), go, gl, BASE)
    g = dict(k=cp.zeros((B, H, W, Dh), np.float32), v=cp.zeros((B, H, W, Dh), np.float32), pos=cp.zeros(B, np.int64))
    r = {
        n: dict(k=np.zeros((B, H, W, Dh), t), v=np.zeros((B, H, W, Dh), t), pos=np.zeros(B, np.int64))
        for n, t in (("32", np.float32), ("64", np.float64))
    }
    got = cp.empty((B, d), np.float32)
    for t in range(T):
        xt = np.ascontiguousarray(qkv[:, t])
        poison(got)
        ops.step(cp.asarray(xt), g["k"], g["v"], g["pos"], got, BASE)
        ops.advance(g["pos"])
        outs = {}
        for n, cast in (("32", np.float32), ("64", np.float64)):
            outs[n] = np.empty((B, d), cast)
            ref.step(xt.astype(cast), r[n]["k"], r[n]["v"], r[n]["pos"], outs[n], BASE)
            ref.advance(r[n]["pos"])
        assert_oracle(got, outs["32"], outs["64"], what=f"step at bar {t}")
        if t == W - 1:
            assert rel_error(got, go.reshape(B, W, d)[:, -1]) <= 1e-5, "cache step vs the windowed forward"
    assert_oracle(g["k"], r["32"]["k"], r["64"]["k"], what="key cache")
    assert int(g["pos"].get().min()) == T
