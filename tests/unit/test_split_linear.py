"""SplitLinear (the top SSM block's in-projection): its head columns at each sample's last row only, the
others at every row, against a Linear on the same parameters (NumPy, float32: the split path); the GPU side
against the same, and its forward plans made before a capture."""

import numpy as np
import pytest

from cudarl import blas
from cudarl.nn import Linear, ParamLayout, SplitLinear, Workspace
from cudarl.reference.nn import IDENTITY

R, D, N, H, B = 6, 8, 20, 8, 3  # rows a sample, inputs, outputs, head columns, samples


def workspace(xp, dtype, B: int, spec: list) -> Workspace:
    """A workspace of ``B`` samples holding every buffer a module's ``declare`` put in ``spec``."""
    ws = Workspace(xp, dtype, B)
    for name, row, merge in spec:
        ws.add(name, row, merge=merge)
    ws.set_batch(B)
    return ws


def _pair(xp, rng, dtype=np.float32):
    """A SplitLinear and a Linear on one set of parameters, their workspaces, and an input [B R, D]."""
    layout, spec = ParamLayout(), []
    split = SplitLinear("p", D, N, head=H, rows=R)
    split.declare(layout, spec)
    params = layout.init_host(3, np.float64)
    params = (params + 0.1 * rng.standard_normal(params.shape)).astype(dtype)  # biases away from 0
    p, gs, gl = xp.asarray(params), xp.zeros(params.shape, dtype), xp.zeros(params.shape, dtype)
    full = Linear("p", D, N, act="identity", rows=R)
    split.bind(layout.views(p), layout.views(gs), xp)
    full.bind(layout.views(p), layout.views(gl), xp)
    spaces = [workspace(xp, dtype, B, spec) for _ in range(2)]
    x = xp.asarray(rng.standard_normal((B * R, D)).astype(dtype))
    return split, full, spaces, x, layout, gs, gl


def _dout(rng):
    """dL/dout with the head columns 0 at every row but the last of each sample (as the gated norm writes)."""
    d = rng.standard_normal((B * R, N)).astype(np.float32)
    keep = np.zeros(B * R, bool)
    keep[R - 1 :: R] = True
    d[~keep, :H] = 0.0
    return d


def test_split_linear_is_a_linear_where_read(rng):
    split, full, (ws_s, ws_f), x, layout, gs, gl = _pair(np, rng)
    ws_s.rows("p.out")[...] = np.nan
    y_s, y_f = split.forward(x, ws_s), full.forward(x, ws_f)
    last = slice(R - 1, None, R)
    np.testing.assert_allclose(y_s[:, H:], y_f[:, H:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y_s[last, :H], y_f[last, :H], rtol=1e-6, atol=1e-6)
    other = np.ones(B * R, bool)
    other[last] = False
    assert np.isnan(y_s[other, :H]).all(), "the head columns of the other rows must be left alone"
    d = _dout(rng)
    dx_s, dx_f = np.empty((B * R, D), np.float32), np.empty((B * R, D), np.float32)
    for ws, lin, dx in ((ws_s, split, dx_s), (ws_f, full, dx_f)):
        ws.rows("p.dout")[...] = d
        lin.backward(x, ws, dx)
    np.testing.assert_allclose(dx_s, dx_f, rtol=1e-5, atol=1e-6)
    for name in ("p.weight", "p.bias"):
        np.testing.assert_allclose(layout.views(gs)[name], layout.views(gl)[name], rtol=1e-5, atol=1e-6)
    dx2 = dx_s.copy()  # accumulate: dx += the same again
    split.backward(x, ws_s, dx2, accumulate=True)
    np.testing.assert_allclose(dx2, 2 * dx_s, rtol=1e-5, atol=1e-6)


def test_split_linear_takes_every_column_where_it_cannot_split(rng):
    """float64 (gradient checks), one row a sample, or a head the views cannot align: a Linear's forward."""
    split, full, (ws_s, ws_f), x, *_ = _pair(np, rng, np.float64)
    assert not split._split(ws_s.rows("p.out"))
    np.testing.assert_array_equal(split.forward(x, ws_s), full.forward(x, ws_f))
    f32 = np.zeros((1, 1), np.float32)
    assert not SplitLinear("q", D, N, head=6, rows=R)._split(f32)  # 6 % 4: views off 16 bytes
    assert not SplitLinear("q", D + 2, N, head=H, rows=R)._split(f32)  # every R-th row of x off 16 bytes
    assert not SplitLinear("q", D, N + 2, head=H, rows=R)._split(f32)
    assert not SplitLinear("q", D, N, head=H, rows=1)._split(f32)
    assert SplitLinear("q", D, N, head=H, rows=R)._split(f32)
    with pytest.raises(ValueError, match="head must be 1 to 19"):
        SplitLinear("q", D, N, head=N, rows=R)
    assert split.act == IDENTITY


def test_split_linear_plan_keys_name_its_views():
    keys = SplitLinear("p", 128, 644, head=256, rows=64, gemm="cublaslt_nosplit").forward_plan_keys(512)
    assert [k[:3] for k in keys] == [(512 * 64, 388, 128), (512, 256, 128)]
    assert [k[12:15] for k in keys] == [(128, 644, 644), (64 * 128, 644, 64 * 644)]
    assert Linear("p", 128, 644, act="identity", rows=64, gemm="cublas").forward_plan_keys(512) == []


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_split_linear_plan_keys_are_the_calls_keys(batch):
    """The row pitches prepare names are those a call reads from its views (blas._lds), at every batch. Over one
    sample (acting with env.n_envs = 1, a batch of 1) the head GEMM's x[W - 1 :: W] and out rows are one row each,
    whose pitch a call reads as the row length (blas._row_pitch): a key naming the sample's pitch there made a
    capture meet a plan it was not given (found in session 25)."""
    lin = SplitLinear("p", 128, 644, head=256, rows=64, gemm="cublaslt_nosplit")
    x = np.zeros((batch * 64, 128), np.float32)
    w, y = np.zeros((128, 644), np.float32), np.zeros((batch * 64, 644), np.float32)
    last = slice(63, None, 64)
    keys = lin.forward_plan_keys(batch)
    assert [k[12:15] for k in keys] == [
        blas._lds(x, w[:, 256:], y[:, 256:]),
        blas._lds(x[last], w[:, :256], y[last, :256]),
    ]
    if batch == 1:
        assert keys[1][12:15] == (128, 644, 256)


@pytest.mark.gpu
def test_gpu_split_linear_is_a_linear_where_read(cp, rng):
    """On the GPU (cuBLASLt on views): the same comparison, the plans made by prepare / prepare_backward."""
    split, full, (ws_s, ws_f), x, layout, gs, gl = _pair(cp, rng)
    for lin in (split, full):
        lin.prepare(B)
        lin.prepare_backward(B)
    ws_s.rows("p.out")[...] = np.nan
    y_s, y_f = split.forward(x, ws_s).get(), full.forward(x, ws_f).get()
    last = slice(R - 1, None, R)
    np.testing.assert_allclose(y_s[:, H:], y_f[:, H:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y_s[last, :H], y_f[last, :H], rtol=1e-5, atol=1e-5)
    d = cp.asarray(_dout(rng))
    dx_s, dx_f = cp.empty((B * R, D), np.float32), cp.empty((B * R, D), np.float32)
    for ws, lin, dx in ((ws_s, split, dx_s), (ws_f, full, dx_f)):
        ws.rows("p.dout")[...] = d
        lin.backward(x, ws, dx)
    np.testing.assert_allclose(dx_s.get(), dx_f.get(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gs.get(), gl.get(), rtol=1e-4, atol=1e-5)


def test_the_ssm_encoders_top_in_projection_is_the_split_one():
    """The trainer's path reaches SplitLinear: the SSM encoder builds its top block's in-projection as one (z, its
    first E columns, at the last bar), every other block's as a plain Linear."""
    from cudarl.nn import QNetwork

    net = QNetwork(64 * 6, 3, encoder="ssm", window=64, d_model=32, layers=3, ssm_state=16, ssm_headdim=16)
    in_proj = {lin.name: lin for lin in net.encoder.linears if lin.name.endswith("in_proj")}
    top = f"{net.encoder.top}.in_proj"
    assert isinstance(in_proj[top], SplitLinear) and in_proj[top].head == net.encoder.E
    assert all(type(lin) is Linear for name, lin in in_proj.items() if name != top) and len(in_proj) == 3
