"""Parity of ``cuda_src/seq.cu`` with ``cudarl.reference.seq``: the encoders' RMSNorms, residual add and
ordered column sums.

CPU tests hold identities of the twin; ``gpu`` tests compare every op with the float64 twin on random
float32 inputs (poisoned outputs, odd shapes): the GPU's error at most twice the float32 twin's, or 1e-5
(:func:`cudarl.testing.assert_oracle`); reruns are bitwise equal.
"""

import numpy as np
import pytest

from cudarl.reference import seq as ref
from cudarl.testing import assert_bitwise, assert_oracle, poison

EPS = 1e-5


def _f64(*arrs):
    return [np.asarray(a, dtype=np.float64) for a in arrs]


# --- CPU: identities --------------------------------------------------------------------------------
def test_chunks_cover_every_row_once():
    for rows in (1, 7, 128, 129, 1000):
        for parts in {1, ref.n_parts(rows), min(rows, 5)}:
            idx = np.concatenate([np.arange(rows)[sl] for sl in ref.chunk_rows(rows, parts)])
            np.testing.assert_array_equal(idx, np.arange(rows))
    assert ref.n_parts(1) == 1 and ref.n_parts(10_000) == ref.PARTS


def test_partials_then_colsum_do_not_depend_on_the_chunking(rng):
    R, n = 37, 5
    dout, x, dres = (rng.standard_normal((R, n)) for _ in range(3))
    w, rstd = rng.standard_normal(n), rng.uniform(0.5, 2, R)
    got = []
    for parts in (1, 4, 37):
        dx, part, dw = np.empty((R, n)), np.empty((parts, n)), np.empty(n)
        ref.rmsnorm_backward(dout, x, w, rstd, dres, dx, part)
        ref.colsum(part, dw)
        got.append(dw)
    np.testing.assert_allclose(got[1], got[0], rtol=1e-13)
    np.testing.assert_allclose(got[2], got[0], rtol=1e-13)


def test_the_launchers_constants_are_the_kernels():
    """seq.cu's block shapes and slice count, which the launchers and the twin mirror in Python."""
    from cudarl import signatures
    from cudarl.ops import seq as ops

    assert signatures.define("seq", "COLSUM_SLICES") == ref.COLSUM_SLICES  # the twin's colsum order
    assert signatures.define("seq", "SEQ_WARPS") == ops._WARPS


@pytest.mark.parametrize("K", [1, 3, 8, 9, 512, 517])
def test_colsum_adds_slices_then_their_sums(rng, K):
    """colsum's order (the kernel's): slices of ceil(K / COLSUM_SLICES) rows in ascending order, then the slices'
    sums; in float64 it is the plain sum."""
    part = rng.standard_normal((K, 7)).astype(np.float32)
    got = np.empty(7, np.float32)
    ref.colsum(part, got)
    c = -(-K // ref.COLSUM_SLICES)
    slices = []
    for k0 in range(0, K, c):
        s = part[k0].copy()
        for k in range(k0 + 1, min(k0 + c, K)):
            s = s + part[k]
        slices.append(s)
    want = slices[0]
    for s in slices[1:]:
        want = want + s
    assert len(slices) <= ref.COLSUM_SLICES
    np.testing.assert_array_equal(got, want)
    got64 = np.empty(7)
    ref.colsum(part.astype(np.float64), got64)
    np.testing.assert_allclose(got64, part.astype(np.float64).sum(axis=0), rtol=1e-12, atol=1e-12)


def test_rmsnorm_of_a_constant_row_is_the_weight():
    x = np.full((2, 4), 3.0)
    out, rstd = np.empty((2, 4)), np.empty(2)
    w = np.array([1.0, -2.0, 0.5, 4.0])
    ref.rmsnorm_forward(x, w, out, rstd, 0.0)
    np.testing.assert_allclose(out, np.tile(w, (2, 1)), rtol=1e-15)
    np.testing.assert_allclose(rstd, [1 / 3, 1 / 3], rtol=1e-15)


def test_last_rmsnorm_is_rmsnorm_of_the_last_bar_and_its_gradient_is_zero_before(rng):
    B, W, n = 3, 4, 6
    h, w, d = rng.standard_normal((B, W, n)), rng.standard_normal(n), rng.standard_normal((B, n))
    out, rstd, out2, rstd2 = np.empty((B, n)), np.empty(B), np.empty((B, n)), np.empty(B)
    ref.last_rmsnorm_forward(h, w, out, rstd, EPS)
    ref.rmsnorm_forward(np.ascontiguousarray(h[:, -1]), w, out2, rstd2, EPS)
    np.testing.assert_array_equal(out, out2)
    dh, part = np.full((B, W, n), np.nan), np.empty((B, n))
    ref.last_rmsnorm_backward(d, h, w, rstd, dh, part)
    dx, part2 = np.empty((B, n)), np.empty((B, n))
    ref.rmsnorm_backward(d, np.ascontiguousarray(h[:, -1]), w, rstd, np.zeros((B, n)), dx, part2)
    assert not dh[:, :-1].any()
    np.testing.assert_array_equal(dh[:, -1], dx)
    np.testing.assert_array_equal(part, part2)


def test_gated_norm_is_rmsnorm_of_y_silu_z_and_leaves_other_columns(rng):
    R, E, ld = 5, 4, 9
    y, zx, w = rng.standard_normal((R, E)), rng.standard_normal((R, ld)), rng.standard_normal(E)
    out, rstd, out2, rstd2 = np.empty((R, E)), np.empty(R), np.empty((R, E)), np.empty(R)
    ref.gated_rmsnorm_forward(y, zx, w, out, rstd, EPS)
    z = zx[:, :E]
    ref.rmsnorm_forward(y * z / (1 + np.exp(-z)), w, out2, rstd2, EPS)
    np.testing.assert_allclose(out, out2, rtol=1e-14)
    dzx = np.full((R, ld), 7.0)
    ref.gated_rmsnorm_backward(rng.standard_normal((R, E)), y, zx, w, rstd, np.empty((R, E)), dzx, np.empty((2, E)))
    assert (dzx[:, E:] == 7.0).all() and (dzx[:, :E] != 7.0).all()


def test_launchers_check_shapes_before_launching():
    """Shape errors surface in Python with the op's name (no GPU needed: the check runs first)."""
    from cudarl.ops import seq as ops

    z = np.zeros
    with pytest.raises(ValueError, match="rmsnorm_forward: w"):
        ops.rmsnorm_forward(z((4, 3), np.float32), z(4, np.float32), z((4, 3), np.float32), z(4, np.float32), EPS)
    with pytest.raises(ValueError, match="rmsnorm_backward: part must be"):
        a = z((4, 3), np.float32)
        ops.rmsnorm_backward(a, a, z(3, np.float32), z(4, np.float32), a, a, z((5, 3), np.float32))
    with pytest.raises(ValueError, match="gated_rmsnorm_forward: zx"):
        ops.gated_rmsnorm_forward(
            z((4, 3), np.float32), z((4, 2), np.float32), z(3, np.float32), z((4, 3), np.float32), z(4, np.float32), EPS
        )
    with pytest.raises(ValueError, match="colsum: out has 4"):
        ops.colsum(z((2, 3), np.float32), z(4, np.float32))


# --- GPU ----------------------------------------------------------------------------------------------
SHAPES = [(1, 1), (7, 33), (37, 128), (4096, 256), (32768, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("R,n", SHAPES)
def test_gpu_rmsnorm(cp, rng, R, n):
    from cudarl.ops import seq as ops

    x, w, d, dres = (rng.standard_normal(s).astype(np.float32) for s in ((R, n), (n,), (R, n), (R, n)))
    K = ref.n_parts(R)
    r32 = dict(out=np.empty((R, n), np.float32), rstd=np.empty(R, np.float32))
    r64 = dict(out=np.empty((R, n)), rstd=np.empty(R))
    ref.rmsnorm_forward(x, w, r32["out"], r32["rstd"], EPS)
    ref.rmsnorm_forward(*_f64(x, w), r64["out"], r64["rstd"], EPS)
    gx, gw, gd, gres = (cp.asarray(a) for a in (x, w, d, dres))
    go, gr = cp.empty((R, n), np.float32), cp.empty(R, np.float32)
    poison(go)
    poison(gr)
    ops.rmsnorm_forward(gx, gw, go, gr, EPS)
    assert_oracle(go, r32["out"], r64["out"], what="out")
    assert_oracle(gr, r32["rstd"], r64["rstd"], what="rstd")
    rstd = gr.get()  # the backward from the GPU's rstd
    b32 = dict(dx=np.empty((R, n), np.float32), part=np.empty((K, n), np.float32), dw=np.empty(n, np.float32))
    b64 = dict(dx=np.empty((R, n)), part=np.empty((K, n)), dw=np.empty(n))
    for b, cast in ((b32, np.float32), (b64, np.float64)):
        ref.rmsnorm_backward(*(np.asarray(a, cast) for a in (d, x, w, rstd, dres)), b["dx"], b["part"])
        ref.colsum(b["part"], b["dw"])
    gdx, gpart, gdw = cp.empty((R, n), np.float32), cp.empty((K, n), np.float32), cp.empty(n, np.float32)
    for a in (gdx, gpart, gdw):
        poison(a)
    ops.rmsnorm_backward(gd, gx, gw, gr, gres, gdx, gpart)
    ops.colsum(gpart, gdw)
    assert_oracle(gdx, b32["dx"], b64["dx"], what="dx")
    assert_oracle(gdw, b32["dw"], b64["dw"], what="dw")
    first = (gdx.copy(), gdw.copy())
    ops.rmsnorm_backward(gd, gx, gw, gr, gres, gres, gpart)  # dx aliasing dres, as the encoders run it
    ops.colsum(gpart, gdw)
    assert_bitwise(gres, first[0], what="dx in place")
    assert_bitwise(gdw, first[1], what="dw rerun")


@pytest.mark.gpu
@pytest.mark.parametrize("R,n", SHAPES)
def test_gpu_gated_rmsnorm(cp, rng, R, n):
    from cudarl.ops import seq as ops

    ld = 2 * n + 5
    y, zx, w, d = (rng.standard_normal(s).astype(np.float32) for s in ((R, n), (R, ld), (n,), (R, n)))
    K = ref.n_parts(R)
    outs = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        o, r = np.empty((R, n), cast), np.empty(R, cast)
        ref.gated_rmsnorm_forward(*(np.asarray(a, cast) for a in (y, zx)), np.asarray(w, cast), o, r, EPS)
        outs[name] = (o, r)
    gy, gzx, gw, gd = (cp.asarray(a) for a in (y, zx, w, d))
    go, gr = cp.empty((R, n), np.float32), cp.empty(R, np.float32)
    poison(go)
    poison(gr)
    ops.gated_rmsnorm_forward(gy, gzx, gw, go, gr, EPS)
    assert_oracle(go, outs["32"][0], outs["64"][0], what="out")
    assert_oracle(gr, outs["32"][1], outs["64"][1], what="rstd")
    rstd = gr.get()
    back = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        dy, dzx, part, dw = (
            np.empty((R, n), cast),
            np.full((R, ld), 7.0, cast),
            np.empty((K, n), cast),
            np.empty(n, cast),
        )
        ref.gated_rmsnorm_backward(*(np.asarray(a, cast) for a in (d, y, zx, w, rstd)), dy, dzx, part)
        ref.colsum(part, dw)
        back[name] = (dy, dzx[:, :n].copy(), dw)
    gdy, gdzx, gpart, gdw = (cp.empty(s, np.float32) for s in ((R, n), (R, ld), (K, n), (n,)))
    for a in (gdy, gpart, gdw):
        poison(a)
    gdzx.fill(7.0)
    ops.gated_rmsnorm_backward(gd, gy, gzx, gw, gr, gdy, gdzx, gpart)
    ops.colsum(gpart, gdw)
    for k, (name, got) in enumerate((("dy", gdy), ("dz", gdzx[:, :n]), ("dw", gdw))):
        assert_oracle(got, back["32"][k], back["64"][k], what=name)
    assert bool((gdzx[:, n:] == 7.0).all()), "gated_rmsnorm_backward wrote outside z's columns"


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,n", [(1, 1, 5), (7, 5, 33), (512, 64, 128), (4096, 1, 128)])
def test_gpu_last_rmsnorm(cp, rng, B, W, n):
    from cudarl.ops import seq as ops

    h, w, d = (rng.standard_normal(s).astype(np.float32) for s in ((B, W, n), (n,), (B, n)))
    K = ref.n_parts(B)
    fw = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        o, r = np.empty((B, n), cast), np.empty(B, cast)
        ref.last_rmsnorm_forward(np.asarray(h, cast), np.asarray(w, cast), o, r, EPS)
        fw[name] = (o, r)
    gh, gw, gd = (cp.asarray(a) for a in (h, w, d))
    go, gr = cp.empty((B, n), np.float32), cp.empty(B, np.float32)
    poison(go)
    poison(gr)
    ops.last_rmsnorm_forward(gh, gw, go, gr, EPS)
    assert_oracle(go, fw["32"][0], fw["64"][0], what="psi")
    rstd = gr.get()
    bw = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        dh, part, dw = np.empty((B, W, n), cast), np.empty((K, n), cast), np.empty(n, cast)
        ref.last_rmsnorm_backward(*(np.asarray(a, cast) for a in (d, h, w, rstd)), dh, part)
        ref.colsum(part, dw)
        bw[name] = (dh[:, -1].copy(), dw)
    gdh, gpart, gdw = cp.empty((B, W, n), np.float32), cp.empty((K, n), np.float32), cp.empty(n, np.float32)
    for a in (gdh, gpart, gdw):
        poison(a)
    ops.last_rmsnorm_backward(gd, gh, gw, gr, gdh, gpart)
    ops.colsum(gpart, gdw)
    assert_oracle(gdh[:, -1], bw["32"][0], bw["64"][0], what="dh at the last bar")
    assert_oracle(gdw, bw["32"][1], bw["64"][1], what="dw")
    assert bool((gdh[:, :-1] == 0).all()), "dh before the last bar must be written 0"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 1000, 32768 * 128])
def test_gpu_residual_add_and_colsum(cp, rng, n):
    from cudarl.ops import seq as ops

    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = cp.empty(n, np.float32)
    poison(out)
    ops.residual_add(cp.asarray(a), cp.asarray(b), out)
    assert_bitwise(out, a + b, what="a + b")  # one rounding per element on both sides
    m = max(1, n // 1000)
    for K in (1, 7, 9, 512, 517):  # fewer parts than slices, uneven slices, the SSM step's 512
        part = rng.standard_normal((K, m)).astype(np.float32)
        got = cp.empty(m, np.float32)
        poison(got)
        ops.colsum(cp.asarray(part), got)
        want = np.empty(m, np.float32)
        ref.colsum(part, want)
        assert_bitwise(got, want, what=f"colsum of {K} parts")  # the same slices and order on both sides


# --- the last row of each group of k (an encoder's top block that computes the last bar only) --------------
def test_ops_on_last_rows_are_the_ops_on_those_rows(rng):
    """With a k-times longer operand, gated_rmsnorm (zx, dzx), residual_add (a) and rmsnorm_backward (dres, the
    other way round) are the plain ops on ``last_rows`` (and on dres spread with zeros), float64."""
    R, k, n, ld = 5, 4, 6, 15
    y, w, d = rng.standard_normal((R, n)), rng.standard_normal(n), rng.standard_normal((R, n))
    zx = rng.standard_normal((k * R, ld))
    zl = np.ascontiguousarray(ref.last_rows(zx, R))
    np.testing.assert_array_equal(zl, zx[k - 1 :: k])
    o1, r1, o2, r2 = np.empty((R, n)), np.empty(R), np.empty((R, n)), np.empty(R)
    ref.gated_rmsnorm_forward(y, zx, w, o1, r1, EPS)
    ref.gated_rmsnorm_forward(y, zl, w, o2, r2, EPS)
    np.testing.assert_array_equal(o1, o2)
    dzx, dzl = np.full((k * R, ld), 7.0), np.full((R, ld), 7.0)
    dy1, dy2, p1, p2 = np.empty((R, n)), np.empty((R, n)), np.empty((2, n)), np.empty((2, n))
    ref.gated_rmsnorm_backward(d, y, zx, w, r1, dy1, dzx, p1)
    ref.gated_rmsnorm_backward(d, y, zl, w, r2, dy2, dzl, p2)
    np.testing.assert_array_equal(dzx[k - 1 :: k], dzl)
    others = np.delete(dzx, np.s_[k - 1 :: k], axis=0)
    np.testing.assert_array_equal(others[:, :n], 0.0)  # the other rows' z: no gradient, written 0
    np.testing.assert_array_equal(others[:, n:], 7.0)  # the other columns untouched
    np.testing.assert_array_equal(dy1, dy2)
    a, b = rng.standard_normal((k * R, n)), rng.standard_normal((R, n))
    out = np.empty((R, n))
    ref.residual_add(a, b, out)
    np.testing.assert_array_equal(out, a[k - 1 :: k] + b)
    x, dout, dres = rng.standard_normal((k * R, n)), rng.standard_normal((k * R, n)), rng.standard_normal((R, n))
    rstd = rng.uniform(0.5, 2, k * R)
    full = np.zeros((k * R, n))
    full[k - 1 :: k] = dres
    dx1, dx2, q1, q2 = np.empty((k * R, n)), np.empty((k * R, n)), np.empty((3, n)), np.empty((3, n))
    ref.rmsnorm_backward(dout, x, w, rstd, dres, dx1, q1)
    ref.rmsnorm_backward(dout, x, w, rstd, full, dx2, q2)
    np.testing.assert_array_equal(dx1, dx2)
    np.testing.assert_array_equal(q1, q2)
    with pytest.raises(ValueError, match="not whole groups"):
        ref.residual_add(rng.standard_normal((7, n)), b, out)


def test_launchers_check_the_groups():
    from cudarl.ops import seq as ops

    f = np.float32
    with pytest.raises(ValueError, match="gated_rmsnorm_forward: zx: 12 rows are not k rows for each of 5"):
        ops.gated_rmsnorm_forward(
            np.zeros((5, 6), f), np.zeros((12, 9), f), np.zeros(6, f), np.zeros((5, 6), f), np.zeros(5, f), EPS
        )
    with pytest.raises(ValueError, match=r"gated_rmsnorm_forward: zx must be \[k 5, >= 6\]"):
        ops.gated_rmsnorm_forward(
            np.zeros((5, 6), f), np.zeros((10, 4), f), np.zeros(6, f), np.zeros((5, 6), f), np.zeros(5, f), EPS
        )
    with pytest.raises(ValueError, match="residual_add: a: 3 rows are not k rows for each of 5"):  # fewer rows
        ops.residual_add(np.zeros((3, 3), f), np.zeros((5, 3), f), np.zeros((5, 3), f))
    with pytest.raises(ValueError, match="residual_add: a: 7 rows are not k rows for each of 5"):
        ops.residual_add(np.zeros((7, 3), f), np.zeros((5, 3), f), np.zeros((5, 3), f))
    with pytest.raises(ValueError, match="rmsnorm_backward: dres: 8 rows are not k rows for each of 3"):
        z = np.zeros((8, 4), f)
        ops.rmsnorm_backward(z, z, np.zeros(4, f), np.zeros(8, f), np.zeros((3, 4), f), z, np.zeros((1, 4), f))


@pytest.mark.gpu
@pytest.mark.parametrize("R,k,n", [(1, 1, 5), (3, 7, 33), (1000, 3, 40), (512, 64, 128), (512, 64, 256)])
def test_gpu_ops_on_last_rows(cp, rng, R, k, n):
    """gated_rmsnorm with zx [k R, ld], residual_add with a [k R, n], rmsnorm_backward with dres [R, n] over
    [k R, n] rows: against the float64 twin, dzx's other rows untouched, reruns bitwise."""
    from cudarl.ops import seq as ops

    ld = 2 * n + 5
    y, zx, w, d = (rng.standard_normal(s).astype(np.float32) for s in ((R, n), (k * R, ld), (n,), (R, n)))
    K = ref.n_parts(R)
    want = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        a = [np.asarray(v, cast) for v in (y, zx, w, d)]
        o, r = np.empty((R, n), cast), np.empty(R, cast)
        ref.gated_rmsnorm_forward(a[0], a[1], a[2], o, r, EPS)
        dy, dzx, part = np.empty((R, n), cast), np.full((k * R, ld), 7.0, cast), np.empty((K, n), cast)
        ref.gated_rmsnorm_backward(a[3], a[0], a[1], a[2], r.astype(cast), dy, dzx, part)
        want[name] = dict(out=o, rstd=r, dy=dy, dz=dzx[k - 1 :: k, :n].copy(), part=part)
    gy, gzx, gw, gd = (cp.asarray(a) for a in (y, zx, w, d))
    go, gr, gdy, gpart = (cp.empty(s, np.float32) for s in ((R, n), (R,), (R, n), (K, n)))
    gdzx = cp.full((k * R, ld), 7.0, np.float32)
    for a in (go, gr, gdy, gpart):
        poison(a)
    ops.gated_rmsnorm_forward(gy, gzx, gw, go, gr, EPS)
    ops.gated_rmsnorm_backward(gd, gy, gzx, gw, gr, gdy, gdzx, gpart)
    got = dict(out=go, rstd=gr, dy=gdy, dz=gdzx[k - 1 :: k, :n], part=gpart)
    for key, v in got.items():
        assert_oracle(v, want["32"][key], want["64"][key], what=f"gated {key}")
    keep = np.ones(k * R, bool)
    keep[k - 1 :: k] = False
    others = gdzx[cp.asarray(keep)]
    assert bool((others[:, :n] == 0).all()), "the other rows' z columns must be written 0"
    assert bool((others[:, n:] == 7.0).all()) and bool((gdzx[k - 1 :: k, n:] == 7.0).all()), "wrote outside z"
    a, b = rng.standard_normal((k * R, n)).astype(np.float32), rng.standard_normal((R, n)).astype(np.float32)
    out = cp.empty((R, n), np.float32)
    poison(out)
    ops.residual_add(cp.asarray(a), cp.asarray(b), out)
    assert_bitwise(out, a[k - 1 :: k] + b, what="a's last rows + b")
    x, dout = (rng.standard_normal((k * R, n)).astype(np.float32) for _ in range(2))
    rstd, dres = rng.uniform(0.5, 2, k * R).astype(np.float32), rng.standard_normal((R, n)).astype(np.float32)
    Kx = ref.n_parts(k * R)
    bw = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        dx, part = np.empty((k * R, n), cast), np.empty((Kx, n), cast)
        ref.rmsnorm_backward(*(np.asarray(v, cast) for v in (dout, x, w, rstd, dres)), dx, part)
        bw[name] = (dx, part)
    gdx, gp = cp.empty((k * R, n), np.float32), cp.empty((Kx, n), np.float32)
    poison(gdx)
    poison(gp)
    args = [cp.asarray(v) for v in (dout, x, w, rstd, dres)]
    ops.rmsnorm_backward(*args, gdx, gp)
    assert_oracle(gdx, bw["32"][0], bw["64"][0], what="dx with dres at the last rows")
    assert_oracle(gp, bw["32"][1], bw["64"][1], what="dw partials")
    first = gdx.get()
    ops.rmsnorm_backward(*args, gdx, gp)
    assert_bitwise(gdx, first, what="rerun")
