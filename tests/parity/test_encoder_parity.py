"""The GPU encoders (SSM and attention) against the NumPy ones on the same parameters: forward, backward,
the acting path, and graphed == eager bit for bit. CPU checks of the encoders: tests/unit/test_encoders.py;
their kernels one by one: test_seq.py, test_ssm.py, test_attention.py.
"""

import numpy as np
import pytest

from cudarl.testing import assert_bitwise, assert_oracle, poison, rel_error

F, D = 5, 32


def _make(kind: str, W: int, chunk: int = 8, tf32: bool = False):
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
            tf32=tf32,
        )
    return AttentionEncoder("enc", F, window=W, d_model=D, layers=2, heads=2, mlp_ratio=2, tf32=tf32)


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


def _psi_and_grads(s, x, dpsi):
    """One Standalone's psi and flat parameter gradient (host copies) for windows ``x [B, W, F]`` and dL/dpsi
    ``[B, D]``: its gradients poisoned (a gradient not written shows), the forward, the backward from dpsi."""
    from cudarl.backend import to_numpy

    ws = s.workspace(x.shape[0])
    xs = s.xp.asarray(x.astype(s.dtype))
    poison(s.grads)
    psi = s.enc.forward(xs, ws)
    ws.rows(f"{s.enc.out_name}.dout")[...] = s.xp.asarray(dpsi.astype(s.dtype))
    s.enc.backward(xs, ws)
    return to_numpy(psi).copy(), to_numpy(s.grads).copy()


def sample_floors(s64, x, dpsi) -> dict:
    """``{parameter: floor}``: ``max(2e-5, sqrt(K) u kappa)`` for each parameter's gradient, a sum over the K =
    B W tokens of the batch ``x [B, W, F]`` (u = 2^-24), with ``kappa = || sum_b |g_b| || / || sum_b g_b ||``
    its cancellation over the B samples, from the float64 twin ``s64``'s per-sample gradients ``g_b``.

    Why: the float32 twin's own error is no bound on the GPU's where a gradient is a long sum that cancels.
    A recursive float32 sum of K terms carries about ``sqrt(K) u`` of their absolute sum for random roundings
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sec. 4.2), and the float32 twin sums
    in NumPy's blocked, more accurate order, the GPU in its GEMMs' (which moves with the host's cuBLAS
    choices: `docs/perf-notes.md`, thirty-third session). On the attention case's draws (512 x 64) kappa is
    15-25 (the largest ``enc.1.norm1.weight``, 25.4): floors of 1.6e-4 to 2.7e-4, where the GPU measured up to
    3.44e-5 and the 2e-5 floor failed; with kappa near 1 the floor stays 2e-5."""
    B = x.shape[0]
    total = absum = 0.0
    for b in range(B):
        g = _psi_and_grads(s64, x[b : b + 1], dpsi[b : b + 1])[1]
        total, absum = total + g, absum + np.abs(g)
    bound = np.sqrt(B * x.shape[1]) * 2.0**-24
    out = {}
    for e in s64.layout.entries:
        at = slice(e.offset, e.offset + e.size)
        kappa = np.linalg.norm(absum[at]) / max(np.linalg.norm(total[at]), np.finfo(np.float64).tiny)
        out[e.name] = max(2e-5, float(bound * kappa))
    return out


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_the_sample_floors_sum_the_batchs_gradient_and_stay_at_2e5_without_cancellation(rng, kind):
    """:func:`sample_floors`' per-sample gradients add up to the batch's (the backward is linear in the batch),
    and a batch of one sample (nothing to cancel: kappa 1) keeps every floor at 2e-5."""
    from cudarl.nn.encoders import Standalone

    s64 = Standalone(_make(kind, 5), np, np.float64, seed=5, noise=0.05)
    x, dpsi = rng.standard_normal((6, 5, F)), rng.standard_normal((6, D))
    whole = _psi_and_grads(s64, x, dpsi)[1]
    parts = sum(_psi_and_grads(s64, x[b : b + 1], dpsi[b : b + 1])[1] for b in range(6))
    np.testing.assert_allclose(parts, whole, rtol=1e-9, atol=1e-12)
    assert set(sample_floors(s64, x[:1], dpsi[:1]).values()) == {2e-5}
    floors = sample_floors(s64, x, dpsi)
    assert set(floors) == {e.name for e in s64.layout.entries} and min(floors.values()) == 2e-5


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ssm", "attention"])
@pytest.mark.parametrize("B,W,chunk", [(1, 1, 8), (7, 13, 8), (512, 64, 32)])
def test_gpu_encoder_matches_numpy(cp, rng, kind, B, W, chunk):
    """psi and every parameter's gradient against the NumPy encoder (float32 and float64 twins), and the
    acting path after W bars against the windowed forward."""
    nets = _encoders(cp, kind, W, chunk=chunk)
    x = rng.standard_normal((B, W, F)).astype(np.float32)
    dpsi = rng.standard_normal((B, D)).astype(np.float32)
    res = []
    for s in nets:
        psi, g = _psi_and_grads(s, x, dpsi)
        res.append((psi, {e.name: g[e.offset : e.offset + e.size] for e in s.layout.entries}))
    (gp, gg), (p32, g32), (p64, g64) = res
    assert_oracle(gp, p32, p64, what="psi")
    floors = sample_floors(nets[2], x, dpsi) if B * W > 4096 else {}
    for name in gg:
        assert_oracle(gg[name], g32[name], g64[name], floor=floors.get(name, 2e-5), what=f"grad {name}")
    state = nets[0].enc.new_state(B)
    for t in range(W):
        psi_t = nets[0].enc.step(state, cp.asarray(np.ascontiguousarray(x[:, t])))
    assert rel_error(psi_t, p64) <= 2e-5, "acting path after W bars vs the windowed forward"


@pytest.mark.gpu
@pytest.mark.parametrize("kind,tf32", [("ssm", False), ("attention", False), ("ssm", True)])
def test_gpu_encoder_graphed_equals_eager_bitwise(cp, rng, kind, tf32):
    """Forward + backward captured in one graph replays the eager run bit for bit (twice); so does the acting
    path (reset, then W bars) in a graph of its own. ``tf32`` (net.tf32): the Linears' GEMMs and the SSM scans'
    products on TF32 tensor cores (the scans' _tc kernels, loaded in the graph's context)."""
    from cudarl import kernels
    from cudarl.graph import StepGraph

    B, W = 64, 16
    gpu = _encoders(cp, kind, W, tf32=tf32)[0]
    enc, ws = gpu.enc, gpu.workspace(B)
    x = cp.asarray(rng.standard_normal((B, W, F)).astype(np.float32))
    dpsi = cp.asarray(rng.standard_normal((B, D)).astype(np.float32))
    psi = ws.rows(f"{enc.out_name}.out")

    def fwd_bwd():
        enc.forward(x, ws)
        cp.copyto(ws.rows(f"{enc.out_name}.dout"), dpsi)
        enc.backward(x, ws)

    name = f"{kind}{'_tf32' if tf32 else ''}_encoder_parity"
    g = StepGraph(name, [("fwd_bwd", fwd_bwd)], xp=cp)
    g.run_eager()
    g.synchronize()
    # every parameter's gradient; the ALIGN padding between entries is no parameter's and nothing writes it
    grads = gpu.layout.views(gpu.grads)
    want = {"psi": psi.get(), **{name: v.get() for name, v in grads.items()}}
    g.capture()
    assert (("ssm", "tf32", name) in kernels.loaded()) == (kind == "ssm" and tf32)
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

    a = StepGraph(f"{kind}{'_tf32' if tf32 else ''}_encoder_act_parity", [("act", act)], xp=cp)
    a.run_eager()
    a.synchronize()
    first = out["psi"].get()
    a.capture()
    poison(out["psi"])
    cp.cuda.Device().synchronize()
    a.replay()
    a.synchronize()
    assert_bitwise(out["psi"], first, what="graphed acting path")


@pytest.mark.gpu
def test_gpu_ssm_encoder_in_tf32_stays_near_the_float64_twin(cp, rng):
    """net.tf32 with the SSM encoder (TF32 GEMMs and _tc scans) against the float64 NumPy encoder: psi and the
    gradients within 1e-2. A sanity bound, not a derived one: each TF32 product is within about 1e-3 of its exact
    value (tests/parity/test_ssm.py derives the scans' 4 * 2^-11, DESIGN.md gives TF32 GEMMs 1e-3), and psi is
    about eight products deep (embedding, two blocks of in-projection, scan and out-projection); the norms
    normalise rather than amplify. The kernels one by one hold their own bounds."""
    B, W = 64, 16
    nets = _encoders(cp, "ssm", W, tf32=True)
    x = rng.standard_normal((B, W, F)).astype(np.float32)
    dpsi = rng.standard_normal((B, D)).astype(np.float32)
    (gp, gg), (p64, g64) = (_psi_and_grads(s, x, dpsi) for s in (nets[0], nets[2]))
    assert rel_error(gp, p64) <= 1e-2, f"psi {rel_error(gp, p64):.2e}"
    for e in nets[0].layout.entries:
        err = rel_error(gg[e.offset : e.offset + e.size], g64[e.offset : e.offset + e.size])
        assert err <= 1e-2, f"grad {e.name}: {err:.2e}"
