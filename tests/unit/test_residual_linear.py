"""Linear with a residual (``residual_rows``): ``h + x W + b`` written by one GEMM that reads h as cuBLASLt's C
where the forward is a cuBLASLt GEMM (the encoders' out-projections, attention's output projection and fc2), else
the GEMM then seq.residual_add. NumPy: the fused form against the unfused one bit for bit (the twin's documented
order), and the encoders, through QNetwork, take it under the default net.gemm; GPU: against the twin, graphed
== eager, and no residual_add launch left in the encoders' forward where cuBLASLt runs."""

import numpy as np
import pytest
from test_split_linear import workspace

from cudarl import blas
from cudarl.nn import Linear, ParamLayout, SplitLinear
from cudarl.reference import seq
from cudarl.testing import assert_bitwise, assert_parity, poison

R, D, N, B = 3, 8, 12, 5  # rows a sample, inputs, outputs, samples


def _pair(xp, rng, k: int, act: str = "identity", dtype=np.float32, gemm: str = "cublaslt_nosplit"):
    """A Linear with ``residual_rows = k`` under ``gemm`` and one under ``gemm="cublas"`` (the GEMM, the bias
    kernel, then seq.residual_add) on one set of parameters, their workspaces, x [B R, D] and h [k B R, N]."""
    layout, spec = ParamLayout(), []
    lins = [Linear("p", D, N, act=act, rows=R, residual_rows=k, gemm=g) for g in (gemm, "cublas")]
    lins[0].declare(layout, spec)
    params = layout.init_host(3, np.float64)
    params = xp.asarray((params + 0.1 * rng.standard_normal(params.shape)).astype(dtype))  # biases away from 0
    grads = [xp.zeros(params.shape, dtype) for _ in lins]
    for lin, g in zip(lins, grads, strict=True):
        lin.bind(layout.views(params), layout.views(g), xp)
    spaces = [workspace(xp, dtype, B, spec) for _ in lins]
    x = xp.asarray(rng.standard_normal((B * R, D)).astype(dtype))
    h = xp.asarray(rng.standard_normal((k * B * R, N)).astype(dtype))
    return lins, spaces, grads, x, h


def _counting(monkeypatch) -> dict:
    """Count seq.residual_add calls (the NumPy twin's) and blas.gemm_lt calls with and without ``c``."""
    calls = {"residual_add": 0, "gemm_lt_c": 0, "gemm_lt": 0}
    add, gemm_lt = seq.residual_add, blas.gemm_lt

    def spy_add(*args):
        calls["residual_add"] += 1
        return add(*args)

    def spy_gemm(*args, **kw):
        calls["gemm_lt_c" if kw.get("c") is not None else "gemm_lt"] += 1
        return gemm_lt(*args, **kw)

    monkeypatch.setattr(seq, "residual_add", spy_add)
    monkeypatch.setattr(blas, "gemm_lt", spy_gemm)
    return calls


@pytest.mark.parametrize("k", [1, 4])
def test_a_residual_linear_is_the_unfused_path_bitwise(rng, monkeypatch, k):
    """float32 on NumPy: one gemm_lt with c (no residual_add) gives the unfused path's bits (the GEMM, its bias,
    then seq.residual_add of h's last row of each group of k), into a named output or the layer's .out; the
    backward is the Linear's (dout, the identity onto the residual's gradient), the same bits for both."""
    calls = _counting(monkeypatch)
    (fused, unfused), (ws_f, ws_u), (g_f, g_u), x, h = _pair(np, rng, k)
    assert fused.fuses_residual() and not unfused.fuses_residual()
    out = np.full((B * R, N), np.nan, np.float32)
    got = fused.forward(x, ws_f, residual=h, out=out)
    assert got is out and calls == {"residual_add": 0, "gemm_lt_c": 1, "gemm_lt": 0}
    want = unfused.forward(x, ws_u, residual=h)
    assert np.shares_memory(want, ws_u.bufs["p.out"]) and calls["residual_add"] == 1
    assert_bitwise(out, want, what=f"fused vs unfused, k={k}")
    W, b = fused.P["p.weight"].astype(np.float64), fused.P["p.bias"].astype(np.float64)
    ref = h[k - 1 :: k].astype(np.float64) + x.astype(np.float64) @ W + b
    assert_parity(out, ref.astype(np.float32), what="h + x W + b against float64")
    assert_bitwise(fused.forward(x, ws_f, residual=h), out, what="into the layer's own .out")
    d = rng.standard_normal((B * R, N)).astype(np.float32)
    dx_f, dx_u = np.empty((B * R, D), np.float32), np.empty((B * R, D), np.float32)
    for lin, ws, dx in ((fused, ws_f, dx_f), (unfused, ws_u, dx_u)):
        ws.rows("p.dout")[...] = d
        lin.backward(x, ws, dx)
    assert_bitwise(dx_f, dx_u, what="dx")
    assert_bitwise(g_f, g_u, what="parameter gradients")
    assert_bitwise(ws_f.rows("p.dout"), d, what="dout, the residual's gradient, left as it was")


def test_a_residual_linear_falls_back_where_the_gemm_cannot_add_it(rng, monkeypatch):
    """A ReLU layer (cuBLASLt would apply it after adding C), float64 (gradient checks) and gemm="cublas" add the
    residual after the GEMM with seq.residual_add: out = h + act(x W + b)."""
    calls = _counting(monkeypatch)
    (relu, _), (ws, _), _, x, h = _pair(np, rng, 2, act="relu")
    assert not relu.fuses_residual()
    got = relu.forward(x, ws, residual=h)
    W, b = relu.P["p.weight"].astype(np.float64), relu.P["p.bias"].astype(np.float64)
    ref = h[1::2].astype(np.float64) + np.maximum(x.astype(np.float64) @ W + b, 0.0)
    assert_parity(got, ref.astype(np.float32), what="h + relu(x W + b)")
    assert calls == {"residual_add": 1, "gemm_lt_c": 0, "gemm_lt": 0}
    (f64, _), (ws64, _), _, x64, h64 = _pair(np, rng, 2, dtype=np.float64)
    assert f64.fuses_residual()  # by its options; a float64 pass still takes the fallback
    f64.forward(x64, ws64, residual=h64)
    assert calls == {"residual_add": 2, "gemm_lt_c": 0, "gemm_lt": 0}
    assert not Linear("q", D, N, act="identity", residual_rows=1, gemm="cublas").fuses_residual()
    assert Linear("q", D, N, act="identity", residual_rows=1, gemm="cudarl").fuses_residual()  # where no panel


def test_residual_arguments_are_checked(rng):
    (lin, _), (ws, _), _, x, h = _pair(np, rng, 2)
    with pytest.raises(ValueError, match="built with residual_rows=2, so its forward takes a residual"):
        lin.forward(x, ws)
    with pytest.raises(ValueError, match=r"the residual must be \[30, 12\] \(2 rows for each of the 15 outputs\)"):
        lin.forward(x, ws, residual=h[: B * R])
    with pytest.raises(ValueError, match=r"out must be \[15, 12\]"):
        lin.forward(x, ws, residual=h, out=np.zeros((B * R, N + 1), np.float32))
    plain = Linear("p", D, N, act="identity", rows=R)
    plain.bind(lin.P, lin.G, np)
    with pytest.raises(ValueError, match="built with residual_rows=None, so its forward takes no residual"):
        plain.forward(x, ws, residual=h)
    with pytest.raises(ValueError, match="residual_rows must be at least 1"):
        Linear("q", D, N, residual_rows=0)
    with pytest.raises(ValueError, match="a SplitLinear takes no residual"):
        SplitLinear("q", D, N, head=4, rows=R, residual_rows=1)


def test_residual_plan_keys_carry_the_residuals_row_pitch():
    """The forward's plan is the residual one (its key's c fields: 16-byte alignment, k n_out floats between the
    rows it reads; one row's pitch is its length); a ReLU layer's and gemm="cublas"'s are not."""
    key = Linear("p", 256, 128, act="identity", rows=1, residual_rows=64).forward_plan_keys(512)
    assert [k[:3] for k in key] == [(512, 128, 256)] and key[0][15:] == (16, 64 * 128)
    assert Linear("p", 256, 128, act="identity", rows=1, residual_rows=64).forward_plan_keys(1)[0][15:] == (16, 128)
    assert Linear("p", 256, 128, act="identity", rows=64, residual_rows=1).forward_plan_keys(8)[0][15:] == (16, 128)
    assert Linear("p", 256, 128, act="relu", residual_rows=1).forward_plan_keys(8)[0][15:] == (0, 0)
    assert Linear("p", 256, 128, act="identity", residual_rows=1, gemm="cublas").forward_plan_keys(8) == []


#: the Linears that add the residual stream, and how many a forward runs (L blocks)
_RESIDUAL = {"ssm": ("out_proj",), "attention": ("attn_out", "fc2")}


def _network(kind: str, W: int = 8, **kw):
    from cudarl.nn import QNetwork

    sizes = dict(d_model=16, layers=2, ssm_state=8, ssm_headdim=8, attn_heads=2)
    return QNetwork(W * 4, 3, encoder=kind, window=W, max_batch=3, **sizes, **kw)


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_the_encoders_add_the_residual_in_the_gemm_under_the_default_gemm(rng, monkeypatch, kind):
    """The trainer's networks (QNetwork from the config's defaults, net.gemm = "cublaslt_nosplit") build each
    block's output projections with the residual (the top block's reading the last bar of each window) and
    their forwards, windowed and one-bar, run no seq.residual_add; gemm="cublas" runs one per residual and
    gives the same bits (the NumPy twin's order is the unfused path's)."""
    from cudarl.config import NetConfig

    assert NetConfig().gemm == "cublaslt_nosplit"
    net, base = _network(kind), _network(kind, gemm="cublas")
    enc, L, W = net.encoder, net.encoder.L, net.encoder.W
    res = {n: lin for n, lin in net.linears.items() if n.rsplit(".", 1)[-1] in _RESIDUAL[kind]}
    assert len(res) == L * len(_RESIDUAL[kind])
    assert all(lin.fuses_residual() for lin in res.values())
    top_first = f"{enc.top}.{_RESIDUAL[kind][0]}"
    assert {n: lin.residual_rows for n, lin in res.items()} == {n: W if n == top_first else 1 for n in res}
    calls = _counting(monkeypatch)
    x = rng.standard_normal((3, W * 4)).astype(np.float32)
    d = rng.standard_normal(base.forward_shape(3)).astype(np.float32)
    outs = []
    for network in (net, base):
        calls.update(residual_add=0, gemm_lt_c=0)
        outs.append(network.forward(x)["q"].copy())
        network.grad_outputs()["q"][...] = d
        network.backward()
        want = (0, len(res)) if network is net else (len(res), 0)
        assert (calls["residual_add"], calls["gemm_lt_c"]) == want, f"{network.config.gemm}: {calls}"
    assert_bitwise(outs[0], outs[1], what="q, fused vs unfused")
    assert_bitwise(net.grads, base.grads, what="gradients, fused vs unfused")
    calls.update(residual_add=0, gemm_lt_c=0)
    state = enc.new_state(2)
    enc.reset_state(state)
    enc.step(state, rng.standard_normal((2, enc.F)).astype(np.float32))
    assert (calls["residual_add"], calls["gemm_lt_c"]) == (0, len(res)), "the one-bar step's Linears too"


# --- GPU ----------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 8])
def test_gpu_residual_linear_against_numpy_and_graphed_equals_eager(cp, rng, k):
    """On the GPU the residual Linear is one cuBLASLt GEMM (beta 1, no seq.residual_add launch): the NumPy twin's
    values to rounding, its plan made by prepare, captured, and its replay the eager call's bits."""
    from cudarl import kernels
    from cudarl.graph import StepGraph

    (lin, _), (ws, _), _, x, h = _pair(cp, rng, k)
    (twin, _), (ws_t, _), _, _, _ = _pair(np, rng, k)
    twin.P["p.weight"][...], twin.P["p.bias"][...] = lin.P["p.weight"].get(), lin.P["p.bias"].get()
    want = twin.forward(x.get(), ws_t, residual=h.get())
    lin.prepare(B)
    out = cp.empty((B * R, N), np.float32)
    poison(out)
    with kernels.tracing() as events:
        lin.forward(x, ws, residual=h, out=out)
    assert_parity(out, want, what=f"GPU vs NumPy, k={k}")
    gemms = [e for e in events if e.get("name") == "cublaslt_matmul"]
    assert [e["beta"] for e in gemms] == [1.0] and not any("residual_add" in e.get("name", "") for e in events)
    eager = out.copy()
    g = StepGraph(f"residual_linear_{k}", [("fwd", lambda: lin.forward(x, ws, residual=h, out=out))], xp=cp)
    g.capture()
    poison(out)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_bitwise(out, eager, what="graphed vs eager")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_gpu_the_encoders_train_and_act_without_residual_add_under_the_default_gemm(cp, rng, kind):
    """The GPU forward, backward and one-bar step of each encoder under the default net.gemm launch no
    seq.residual_add (one cuBLASLt GEMM with beta 1 for each residual); under gemm="cublas" one each."""
    from cudarl import kernels

    W = 8
    for gemm, fused in (("cublaslt_nosplit", True), ("cublas", False)):
        net = _network(kind, W, gemm=gemm, xp=cp)
        n_res = net.encoder.L * len(_RESIDUAL[kind])
        x = cp.asarray(rng.standard_normal((3, W * 4)).astype(np.float32))
        net.forward(x)  # plans of the batch made eagerly
        state = net.encoder.new_state(2)  # (its prepare runs the one-bar Linears' GEMMs once on scratch)
        net.grad_outputs()["q"][...] = cp.asarray(rng.standard_normal(net.forward_shape(3)).astype(np.float32))
        bar = cp.asarray(rng.standard_normal((2, net.encoder.F)).astype(np.float32))
        with kernels.tracing() as events:
            net.forward(x)
            net.backward()
            net.encoder.step(state, bar)
        adds = sum(e.get("name") == "cudarl_seq_residual_add" for e in events)
        with_c = sum(e.get("name") == "cublaslt_matmul" and e.get("beta") == 1.0 for e in events)
        assert (adds, with_c) == ((0, 2 * n_res) if fused else (2 * n_res, 0)), f"{gemm}: {adds} adds, {with_c}"
