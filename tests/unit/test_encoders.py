"""The windowed encoders on the NumPy backend: float64 finite-difference gradients of every parameter
and the input, the one-bar acting path against the windowed forward, and construction errors.

GPU parity of the same encoders (against these twins, eager and graphed) is in
tests/parity/test_encoder_parity.py.
"""

import numpy as np
import pytest

from cudarl.nn import ParamLayout
from cudarl.nn.encoders import ENCODERS, AttentionEncoder, SSMEncoder, Standalone
from cudarl.testing import assert_bitwise

H = 1e-6
TOL = 1e-6
F = 3


def make(kind: str, window: int, **kw):
    """A small encoder with odd shapes: SSM with two groups and a chunk that does not divide the window."""
    if kind == "ssm":
        args = dict(d_model=8, layers=2, expand=2, d_state=3, headdim=4, groups=2, conv_kernel=4, chunk=3)
        return SSMEncoder("enc", F, window=window, **{**args, **kw})
    return AttentionEncoder("enc", F, window=window, **{**dict(d_model=8, layers=2, heads=2, mlp_ratio=2), **kw})


def build(enc, B: int, dtype, params=None, seed: int = 3):
    """Parameters of its own (initial values plus noise: norms and biases away from 1 and 0), a workspace for B."""
    s = Standalone(enc, np, dtype, seed=seed, noise=0.1, params=params)
    return s.layout, s.params, s.grads, s.workspace(B)


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_gradients_match_finite_differences(kind, rng):
    """L = sum(psi R): the hand-written backward against central differences in float64, for every
    parameter tensor (up to 8 sampled elements each, always the first) and every input element."""
    B, W = 3, 7
    enc = make(kind, W)
    layout, params, grads, ws = build(enc, B, np.float64)
    x = rng.standard_normal((B, W, F))
    R = rng.standard_normal((B, enc.n_out))

    def loss() -> float:
        return float((enc.forward(x, ws) * R).sum())

    loss()
    ws.rows(f"{enc.out_name}.dout")[...] = R
    dx = np.full_like(x, np.nan)
    grads[...] = np.nan  # every gradient must be written
    for name in ws.bufs:  # and every gradient buffer the backward reads (dout), not left from before
        if name.endswith("dout") and name != f"{enc.out_name}.dout":
            ws.bufs[name][...] = np.nan
    enc.backward(x, ws, dx)
    assert all(np.isfinite(grads[e.offset : e.offset + e.size]).all() for e in layout.entries)
    assert np.isfinite(dx).all()
    for e in layout.entries:
        idx = [e.offset] + sorted(rng.choice(np.arange(e.offset + 1, e.offset + e.size), min(7, e.size - 1), False))
        fd = np.empty(len(idx))
        for k, i in enumerate(idx):
            old = params[i]
            params[i] = old + H
            lp = loss()
            params[i] = old - H
            lm = loss()
            params[i] = old
            fd[k] = (lp - lm) / (2 * H)
        an = grads[idx]
        err = np.linalg.norm(fd - an) / max(np.linalg.norm(an), 1e-12)
        assert err <= TOL, f"{e.name}: finite differences {fd} vs backward {an} (rel {err:.1e})"
    fdx = np.empty_like(x)
    for i in range(x.size):
        old = x.flat[i]
        x.flat[i] = old + H
        lp = loss()
        x.flat[i] = old - H
        lm = loss()
        x.flat[i] = old
        fdx.flat[i] = (lp - lm) / (2 * H)
    assert np.linalg.norm(fdx - dx) / np.linalg.norm(dx) <= TOL


@pytest.mark.parametrize("kind", ["ssm", "attention"])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_step_equals_the_windowed_forward_at_every_bar(kind, dtype, tol, rng):
    """From a reset state, the acting path after bars 0..t gives the psi of the windowed forward over
    those t + 1 bars (an encoder of window t + 1 on the same parameters), for every t < W."""
    B, W = 3, 7
    enc = make(kind, W)
    layout, params, grads, ws = build(enc, B, dtype)
    x = rng.standard_normal((B, W, F)).astype(dtype)
    state = enc.new_state(B)
    for t in range(W):
        psi_t = enc.step(state, np.ascontiguousarray(x[:, t])).copy()
        short = make(kind, t + 1)
        _, _, _, ws_t = build(short, B, dtype, params=params)
        want = short.forward(np.ascontiguousarray(x[:, : t + 1]), ws_t)
        err = np.linalg.norm(psi_t - want) / np.linalg.norm(want)
        assert err <= tol, f"bar {t}: step vs windowed forward {err:.1e}"
    enc.reset_state(state)
    assert all(not b.any() for b in state.bufs.values())
    again = enc.step(state, np.ascontiguousarray(x[:, 0]))
    first = make(kind, 1)
    _, _, _, ws1 = build(first, B, dtype, params=params)
    np.testing.assert_array_equal(again, first.forward(np.ascontiguousarray(x[:, :1]), ws1))


def test_ssm_window_states_are_the_recurrent_states(rng):
    """The training forward keeps S_out of every chunk but the last: the states the acting path reaches
    at the chunks' ends (bars 2 and 5 of 8 in chunks of 3). The top block computes the last bar only and
    keeps no states."""
    B, W = 2, 8
    enc = make("ssm", W, chunk=3, layers=3)
    _, _, _, ws = build(enc, B, np.float64)
    x = rng.standard_normal((B, W, F))
    enc.forward(x, ws)
    state = enc.new_state(B)
    assert f"{enc.top}.states" not in ws.bufs and len(enc.blocks) == 3
    for t in range(W):
        enc.step(state, np.ascontiguousarray(x[:, t]))
        if (t + 1) % 3 or t + 1 == W:
            continue
        for p in enc.blocks[:-1]:
            got = ws.rows(f"{p}.states")[:, :, (t + 1) // 3 - 1]
            np.testing.assert_allclose(got, state.bufs[f"{p}.ssm_state"], rtol=1e-12, atol=1e-14)
            assert np.abs(got).max() > 1e-3
    assert ws.rows(f"{enc.blocks[0]}.states").shape[1:3] == (enc.H, 2)  # 3 chunks: 2 states between them


def test_ssm_in_one_chunk_keeps_no_states_and_computes_the_same(rng):
    """net.ssm_chunk >= net.window: the scan runs one chunk, its states buffer is empty (the GPU launchers pass
    it under empty_ok), and psi and every gradient are those of chunks of 3, to rounding (float64)."""
    B, W = 2, 8
    x = rng.standard_normal((B, W, F))
    dpsi = rng.standard_normal((B, 8))
    out = []
    for chunk in (3, W):
        enc = make("ssm", W, chunk=chunk)
        _, params, grads, ws = build(enc, B, np.float64, params=out[0][2] if out else None)
        psi = enc.forward(x, ws).copy()
        ws.rows(f"{enc.out_name}.dout")[...] = dpsi
        enc.backward(x, ws)
        out.append((psi, grads.copy(), params.copy(), ws.rows(f"{enc.blocks[0]}.states").shape))
    assert out[0][3][2] == 2 and out[1][3][2] == 0
    assert np.abs(out[0][1]).max() > 1e-3 and np.abs(out[0][0]).max() > 1e-3
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-10, atol=1e-12)


def test_ssm_passes_its_tf32_flag_to_the_chunked_scans(rng):
    """net.tf32 reaches the scans: the SSM encoder calls ssm.ssd_forward and ssd_backward (the blocks below the
    top; the top block's last-bar scans have no tensor-core form) with ``tf32`` = its own flag, which on the GPU
    launches their _tc kernels, in the train step and in acting (the act phase is this forward). On the NumPy
    backend the twin ignores the flag: psi and every gradient are bit for bit the tf32=False encoder's."""
    B, W = 2, 7
    x = rng.standard_normal((B, W, F)).astype(np.float32)
    dpsi = rng.standard_normal((B, 8)).astype(np.float32)
    out, seen = [], []

    class Recording:
        def __init__(self, family):
            self.family = family

        def __getattr__(self, op):
            fn = getattr(self.family, op)
            if op not in ("ssd_forward", "ssd_backward"):
                return fn

            def call(*args, **kw):
                seen.append((op, kw.get("tf32")))
                return fn(*args, **kw)

            return call

    for tf32 in (False, True):
        enc = make("ssm", W, layers=3, tf32=tf32)
        _, params, grads, ws = build(enc, B, np.float32, params=out[0][2] if out else None)
        enc.ssm = Recording(enc.ssm)
        psi = enc.forward(x, ws).copy()
        ws.rows(f"{enc.out_name}.dout")[...] = dpsi
        enc.backward(x, ws)
        out.append((psi, grads.copy(), params.copy()))
        assert seen == [("ssd_forward", tf32)] * 2 + [("ssd_backward", tf32)] * 2, seen
        seen.clear()
    assert_bitwise(out[1][0], out[0][0], what="psi")
    assert_bitwise(out[1][1], out[0][1], what="gradients")


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_bars_after_t_do_not_move_the_first_t_positions(kind, rng):
    """Causality: with the window's later bars changed, every block's output at the earlier
    positions is bit for bit the same (the conv and the scan, and the attention mask, look back only)."""
    B, W, t = 2, 7, 4
    enc = make(kind, W)
    _, _, _, ws = build(enc, B, np.float64)
    x = rng.standard_normal((B, W, F))
    enc.forward(x, ws)
    # the blocks that compute every bar (not an ssm top block, which computes the last bar only)
    every = [p for p in enc.blocks if ws.rows(f"{p}.h").shape[0] == B * W]
    assert every and len(every) >= len(enc.blocks) - 1
    before = {p: ws.rows(f"{p}.h").reshape(B, W, -1)[:, :t].copy() for p in every}
    x2 = x.copy()
    x2[:, t:] = rng.standard_normal((B, W - t, F))
    enc.forward(x2, ws)
    for p in every:
        np.testing.assert_array_equal(ws.rows(f"{p}.h").reshape(B, W, -1)[:, :t], before[p])


def test_flattened_input_is_the_same_window(rng):
    enc = make("ssm", 5)
    _, _, _, ws = build(enc, 2, np.float64)
    x = rng.standard_normal((2, 5, F))
    a = enc.forward(x, ws).copy()
    np.testing.assert_array_equal(enc.forward(x.reshape(2, 5 * F), ws), a)
    with pytest.raises(ValueError, match=r"input must be C-contiguous \[B, 5, 3\]"):
        enc.forward(np.zeros((2, 4, F)), ws)


def test_construction_errors_name_the_field():
    with pytest.raises(ValueError, match="heads of 5"):
        make("ssm", 4, headdim=5)
    with pytest.raises(ValueError, match="conv_kernel >= 2"):
        make("ssm", 4, conv_kernel=1)
    with pytest.raises(ValueError, match="head dim 3 must be even"):
        make("attention", 4, d_model=6, heads=2)
    with pytest.raises(ValueError, match="window 129"):
        make("attention", 129)
    assert set(ENCODERS) == {"mlp", "ssm", "attention"}


def test_ssm_initialisation_is_mamba2s():
    """A in [1, 16], D = 1, softplus(dt_bias) in [1e-3, 1e-1] (log-spaced), conv taps within 1/sqrt(K)."""
    from cudarl.reference.ssm import softplus

    enc = make("ssm", 4, d_model=16, headdim=4)  # 8 heads
    layout, spec = ParamLayout(), []
    enc.declare(layout, spec)
    P = layout.views(layout.init_host(0, np.float64))
    A_log, D, dt_bias = P["enc.0.head"]
    np.testing.assert_allclose(np.exp(A_log[[0, -1]]), [1.0, 16.0])
    assert (D == 1).all()
    np.testing.assert_allclose(softplus(dt_bias)[[0, -1]], [1e-3, 1e-1], rtol=1e-12)
    assert np.all(np.diff(np.log(softplus(dt_bias))) > 0)
    conv = P["enc.0.conv"]
    assert np.abs(conv).max() <= 0.5 and np.abs(conv).max() > 0.4  # U(-1/sqrt(4), 1/sqrt(4))


def test_partials_scratch_fits_every_reduction_at_small_batches(rng):
    """B = 1 and a window longer than the batch: every partial view fits the one scratch buffer."""
    for kind in ("ssm", "attention"):
        enc = make(kind, 9)
        layout, params, grads, ws = build(enc, 1, np.float32)
        x = rng.standard_normal((1, 9, F)).astype(np.float32)
        enc.forward(x, ws)
        ws.rows(f"{enc.out_name}.dout")[...] = 1.0
        grads[...] = np.nan
        enc.backward(x, ws)
        assert all(np.isfinite(grads[e.offset : e.offset + e.size]).all() for e in layout.entries)
