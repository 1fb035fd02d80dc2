"""The GPU encoders (SSM and attention) against the NumPy ones on the same parameters: forward, backward,
the acting path, and graphed == eager bit for bit. CPU checks of the encoders: tests/unit/test_encoders.py;
their kernels one by one: test_seq.py, test_ssm.py, test_attention.py.
"""

import numpy as np
import pytest

from cudarl.testing import assert_bitwise, assert_oracle, poison, rel_error

F, D = 5, 32


def _make(kind: str, W: int, chunk: int = 8):
    from cudarl.nn.encoders import AttentionEncoder, SSMEncoder

    if kind == "ssm":
        return SSMEncoder(
            "enc",
            F,
            window=W,
            d_model=D,
            layers=2,
            expand=2,
            d_state=16,
            headdim=16,
            groups=2,
            conv_kernel=4,
            chunk=chunk,
        )
    return AttentionEncoder("enc", F, window=W, d_model=D, layers=2, heads=2, mlp_ratio=2)


def _encoders(cp, kind: str, W: int, **kw):
    """The GPU encoder and NumPy float32 and float64 encoders on its parameters."""
    from cudarl.nn.encoders import Standalone

    gpu = Standalone(_make(kind, W, **kw), cp, np.float32, seed=5, noise=0.05)
    p = gpu.params.get()
    return (
        gpu,
        Standalone(_make(kind, W, **kw), np, np.float32, params=p),
        Standalone(_make(kind, W, **kw), np, np.float64, params=p),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ssm", "attention"])
@pytest.mark.parametrize("B,W,chunk", [(1, 1, 8), (7, 13, 8), (512, 64, 32)])
def test_gpu_encoder_matches_numpy(cp, rng, kind, B, W, chunk):
    """psi and every parameter's gradient against the NumPy encoder (float32 and float64 twins), and the
    acting path after W bars against the windowed forward."""
    from cudarl.backend import to_numpy

    nets = _encoders(cp, kind, W, chunk=chunk)
    x = rng.standard_normal((B, W, F)).astype(np.float32)
    dpsi = rng.standard_normal((B, D)).astype(np.float32)
    res = []
    for s in nets:
        ws = s.workspace(B)
        xs = s.xp.asarray(x.astype(s.dtype))
        poison(s.grads)
        psi = s.enc.forward(xs, ws)
        ws.rows(f"{s.enc.out_name}.dout")[...] = s.xp.asarray(dpsi.astype(s.dtype))
        s.enc.backward(xs, ws)
        g = to_numpy(s.grads)
        res.append((to_numpy(psi).copy(), {e.name: g[e.offset : e.offset + e.size] for e in s.layout.entries}))
    (gp, gg), (p32, g32), (p64, g64) = res
    assert_oracle(gp, p32, p64, what="psi")
    for name in gg:
        assert_oracle(gg[name], g32[name], g64[name], floor=2e-5, what=f"grad {name}")
    state = nets[0].enc.new_state(B)
    for t in range(W):
        psi_t = nets[0].enc.step(state, cp.asarray(np.ascontiguousarray(x[:, t])))
    assert rel_error(psi_t, p64) <= 2e-5, "acting path after W bars vs the windowed forward"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_gpu_encoder_graphed_equals_eager_bitwise(cp, rng, kind):
    """Forward + backward captured in one graph replays the eager run bit for bit (twice); so does the acting
    path (reset, then W bars) in a graph of its own."""
    from cudarl.graph import StepGraph

    B, W = 64, 16
    gpu = _encoders(cp, kind, W)[0]
    enc, ws = gpu.enc, gpu.workspace(B)
    x = cp.asarray(rng.standard_normal((B, W, F)).astype(np.float32))
    dpsi = cp.asarray(rng.standard_normal((B, D)).astype(np.float32))
    psi = ws.rows(f"{enc.out_name}.out")

    def fwd_bwd():
        enc.forward(x, ws)
        cp.copyto(ws.rows(f"{enc.out_name}.dout"), dpsi)
        enc.backward(x, ws)

    g = StepGraph(f"{kind}_encoder_parity", [("fwd_bwd", fwd_bwd)], xp=cp)
    g.run_eager()
    g.synchronize()
    # every parameter's gradient; the ALIGN padding between entries is no parameter's and nothing writes it
    grads = gpu.layout.views(gpu.grads)
    want = {"psi": psi.get(), **{name: v.get() for name, v in grads.items()}}
    g.capture()
    for attempt in range(2):
        for v in grads.values():
            poison(v)
        poison(psi)
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        assert_bitwise(psi, want["psi"], what=f"replay {attempt} psi")
        for name, v in grads.items():
            assert_bitwise(v, want[name], what=f"replay {attempt} grad {name}")
    state = enc.new_state(B)
    bars = [cp.ascontiguousarray(x[:, t]) for t in range(W)]  # made before any capture
    out = {}

    def act():
        enc.reset_state(state)
        for t in range(W):
            out["psi"] = enc.step(state, bars[t])

    a = StepGraph(f"{kind}_encoder_act_parity", [("act", act)], xp=cp)
    a.run_eager()
    a.synchronize()
    first = out["psi"].get()
    a.capture()
    poison(out["psi"])
    cp.cuda.Device().synchronize()
    a.replay()
    a.synchronize()
    assert_bitwise(out["psi"], first, what="graphed acting path")
