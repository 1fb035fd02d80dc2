"""Parity of ``cuda_src/ssm.cu`` with ``cudarl.reference.ssm`` (Mamba2's conv and SSD scan).

CPU tests hold the twin's identities: the chunked scan equals the recurrence and does not depend on the
chunk length, a scalar case by hand, the one-bar conv against the windowed conv. ``gpu`` tests compare
every op with the float64 twin on random float32 inputs (poisoned outputs, odd shapes and the benchmark's
shape); reruns are bitwise equal. The whole SSMEncoder on the GPU: tests/parity/test_encoder_parity.py.
"""

import numpy as np
import pytest

from cudarl.reference import seq as rseq
from cudarl.reference import ssm as ref
from cudarl.testing import assert_bitwise, assert_oracle, assert_parity, poison, rel_error


def case(rng, B, W, H, P, N, G, K, dtype=np.float64):
    """Random scan inputs: zx ``[B W, 2E + 2GN + H]``, conv ``[K + 1, C_c]``, head ``[3, H]`` (A in [1, 4],
    dt_bias so that dt spans about 0.05 .. 1)."""
    E, GN = H * P, G * N
    Cc = E + 2 * GN
    zx = rng.standard_normal((B * W, E + Cc + H))
    conv = 0.5 * rng.standard_normal((K + 1, Cc))
    head = np.stack([np.log(rng.uniform(1, 4, H)), rng.standard_normal(H), rng.uniform(-3, 0, H)])
    return dict(zx=zx.astype(dtype), conv=conv.astype(dtype), head=head.astype(dtype), E=E, Cc=Cc)


def scan(c, B, W, H, P, N, chunk, dtype=np.float64):
    """conv then the chunked scan of a :func:`case`; returns xbc, y, dt, states."""
    xbc = np.empty((B * W, c["Cc"]), dtype)
    ref.conv_forward(c["zx"], c["conv"], xbc, W, c["E"])
    y, dt = np.empty((B * W, c["E"]), dtype), np.empty((B * W, H), dtype)
    st = np.empty((B, H, ref.n_states(W, chunk), P, N), dtype)
    ref.ssd_forward(xbc, c["zx"], c["head"], y, dt, st, W, chunk)
    return xbc, y, dt, st


def scan_backward(c, xbc, dt, st, dy, B, W, H, N, chunk):
    """The scan's backward plus bc_reduce; returns dxbc (x, B, C columns), d dt_raw ``[B W, H]``, dhead_part."""
    dxbc, dzx = np.full(xbc.shape, np.nan), np.full(c["zx"].shape, np.nan)
    dbc, dhead = np.empty((B * W, H, 2 * N)), np.empty((B, 3, H))
    ref.ssd_backward(dy, xbc, c["zx"], dt, c["head"], st, dxbc, dzx, dbc, dhead, W, chunk)
    ref.bc_reduce(dbc, dxbc, c["E"])
    return dxbc, dzx[:, c["E"] + c["Cc"] :], dhead


# --- CPU: identities ----------------------------------------------------------------------------------
@pytest.mark.parametrize("B,W,H,P,N,G,K", [(2, 7, 2, 3, 4, 1, 4), (3, 10, 4, 2, 3, 2, 3), (1, 1, 1, 1, 1, 1, 2)])
def test_chunked_scan_equals_the_recurrence(rng, B, W, H, P, N, G, K):
    """The training scan over chunks of 3 against W calls of the acting path's one-bar ops, float64."""
    c = case(rng, B, W, H, P, N, G, K)
    xbc, y, dt, st = scan(c, B, W, H, P, N, 3)
    cs, ss = np.zeros((B, K - 1, c["Cc"])), np.zeros((B, H, P, N))
    zx3 = c["zx"].reshape(B, W, -1)
    xt, yt = np.empty((B, c["Cc"])), np.empty((B, c["E"]))
    for t in range(W):
        zt = np.ascontiguousarray(zx3[:, t])
        ref.conv_step(zt, c["conv"], cs, xt, c["E"])
        assert_bitwise(xt, xbc.reshape(B, W, -1)[:, t], what=f"conv_step at bar {t}")  # the same sum order
        ref.ssd_step(xt, zt, c["head"], ss, yt)
        np.testing.assert_allclose(yt, y.reshape(B, W, -1)[:, t], rtol=1e-12, atol=1e-13)
        if (t + 1) % 3 == 0 and t + 1 < W:  # the state entering the next chunk
            np.testing.assert_allclose(ss, st[:, :, (t + 1) // 3 - 1], rtol=1e-12, atol=1e-14)
    assert st.shape[2] == (W - 1) // 3  # one state entering each chunk after the first, none after the window


def test_chunk_length_changes_nothing_but_rounding(rng):
    """Chunks of 1, 2, 3, 7 (the window) and 16 (longer than it): the same y and gradients."""
    B, W, H, P, N, G, K = 2, 7, 2, 3, 4, 2, 4
    c = case(rng, B, W, H, P, N, G, K)
    dy = rng.standard_normal((B * W, c["E"]))
    base = None
    for chunk in (1, 2, 3, 7, 16):
        xbc, y, dt, st = scan(c, B, W, H, P, N, chunk)
        got = (y, *scan_backward(c, xbc, dt, st, dy, B, W, H, N, chunk))
        if base is None:
            base = got
        for a, b in zip(got, base, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_one_channel_scan_by_hand():
    """H = P = N = 1 on a given xbc: S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t, y_t = S_t C_t + D x_t."""
    W = 4
    x, Bv, Cv = np.array([1.0, -2.0, 0.5, 3.0]), np.array([0.5, 1.0, -1.0, 2.0]), np.array([2.0, 1.0, 1.0, -0.5])
    dt_raw = np.array([0.3, -1.0, 2.0, 25.0])  # the last is past softplus's threshold: dt = dt_raw + dt_bias
    A_log, D, dt_bias = np.log(0.7), 0.25, 0.1
    xbc = np.stack([x, Bv, Cv], axis=1)
    zx = np.concatenate([np.zeros((W, 1)), xbc, dt_raw[:, None]], axis=1)
    head = np.array([[A_log], [D], [dt_bias]])
    y, dt, st = np.empty((W, 1)), np.empty((W, 1)), np.empty((1, 1, 1, 1, 1))
    ref.ssd_forward(xbc, zx, head, y, dt, st, W, 2)
    S, want = 0.0, []
    for t in range(W):
        v = dt_raw[t] + dt_bias
        d = v if v > 20 else np.log1p(np.exp(v))
        S = np.exp(-0.7 * d) * S + d * x[t] * Bv[t]
        want.append(S * Cv[t] + D * x[t])
        assert dt[t, 0] == pytest.approx(d, rel=1e-15)
    np.testing.assert_allclose(y[:, 0], want, rtol=1e-14)
    assert dt[3, 0] == 25.1


def last_scan(c, xbc, B, W, H, N, dtype=np.float64):
    """ssd_last_forward of a :func:`case` on its xbc; returns y ``[B, E]`` and dt."""
    y, dt = np.empty((B, c["E"]), dtype), np.empty((B * W, H), dtype)
    ref.ssd_last_forward(xbc, c["zx"], c["head"], y, dt, W, N)
    return y, dt


def last_backward(c, xbc, dt, dy, B, W, H, N):
    """ssd_last_backward plus bc_reduce; returns what :func:`scan_backward` returns."""
    dxbc, dzx = np.full(xbc.shape, np.nan, xbc.dtype), np.full(c["zx"].shape, np.nan, xbc.dtype)
    dbc, dhead = np.empty((B * W, H, 2 * N), xbc.dtype), np.empty((B, 3, H), xbc.dtype)
    ref.ssd_last_backward(dy, xbc, c["zx"], dt, c["head"], dxbc, dzx, dbc, dhead, W)
    ref.bc_reduce(dbc, dxbc, c["E"])
    return dxbc, dzx[:, c["E"] + c["Cc"] :], dhead


@pytest.mark.parametrize("B,W,H,P,N,G,K", [(2, 7, 4, 3, 5, 2, 3), (3, 10, 2, 2, 3, 1, 4), (1, 1, 1, 1, 1, 1, 2)])
def test_last_bar_scan_is_the_chunked_scans_last_row(rng, B, W, H, P, N, G, K):
    """ssd_last_forward's y is the chunked scan's y at the last bar, and its backward from dy_T is the chunked
    backward from a dy that is zero before the last bar (float64, every gradient)."""
    c = case(rng, B, W, H, P, N, G, K)
    xbc, y, dt, st = scan(c, B, W, H, P, N, 3)
    yl, dtl = last_scan(c, xbc, B, W, H, N)
    np.testing.assert_allclose(yl, y.reshape(B, W, -1)[:, -1], rtol=1e-12, atol=1e-14)
    assert_bitwise(dtl, dt, what="dt of every bar")
    dyl = rng.standard_normal((B, c["E"]))
    dy = np.zeros((B * W, c["E"]))
    dy.reshape(B, W, -1)[:, -1] = dyl
    for got, want, name in zip(
        last_backward(c, xbc, dtl, dyl, B, W, H, N),
        scan_backward(c, xbc, dt, st, dy, B, W, H, N, 3),
        ("dxbc", "d dt_raw", "dhead"),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13, err_msg=name)


def test_bc_reduce_sums_a_groups_heads(rng):
    R, H, N, G, E = 3, 4, 2, 2, 5
    part = rng.standard_normal((R, H, 2 * N))
    dxbc = np.full((R, E + 2 * G * N), 9.0)
    ref.bc_reduce(part, dxbc, E)
    np.testing.assert_allclose(dxbc[:, E : E + N], part[:, 0, :N] + part[:, 1, :N])  # group 0's B: heads 0, 1
    np.testing.assert_allclose(dxbc[:, E + 3 * N :], part[:, 2, N:] + part[:, 3, N:])  # group 1's C: heads 2, 3
    assert (dxbc[:, :E] == 9.0).all()


def test_softplus_threshold_and_gradient():
    v = np.array([-30.0, 0.0, 19.9, 20.0, 20.1, 50.0])
    np.testing.assert_allclose(ref.softplus(v)[[1, 4, 5]], [np.log(2), 20.1, 50.0])
    g = ref.softplus_grad(v)
    assert g[4] == 1.0 and g[5] == 1.0 and g[1] == 0.5 and 0 < g[0] < 1e-12


def test_the_scan_block_is_the_kernels():
    """ssm.cu's scan block, which the twin's shared-memory sizes (and so config's check) count."""
    from cudarl import signatures

    assert signatures.define("ssm", "SCAN_THREADS") == ref.SCAN_THREADS
    from cudarl.ops import ssm as ops

    assert signatures.define("ssm", "LAST_THREADS") == ops._LAST_THREADS  # the last-bar scan's launch bounds
    assert signatures.define("ssm", "LAST_TILE") == ops._LAST_TILE  # the bars it stages at a time


def test_last_bar_scans_shared_memory():
    """The last-bar scans' shared memory (ssm.cu's banner): at the benchmark's layer (W = P = N = 64) a tile of the
    whole window, under the 48 KiB a launch gets without opting in; a longer window adds its arrays, not rows."""
    from cudarl.ops import ssm as ops

    tile = 64 * (64 + 4 + 64 + 4)
    assert ops._last_shared(64, 64, 64, False) == 64 + 64 + 4 * 64 + tile
    assert ops._last_shared(64, 64, 64, True) == 3 * 64 + 6 * 64 + tile
    assert 4 * ops._last_shared(64, 64, 64, True) <= 48 * 1024
    assert ops._last_shared(1000, 64, 64, True) - ops._last_shared(64, 64, 64, True) == 6 * (1000 - 64)
    assert ops._last_shared(9, 3, 5, False) == 8 + 4 + 4 * 9 + 9 * (5 + 4 + 3 + 4)  # rows sized for + 4 either way


def test_launchers_check_shapes_before_launching():
    from cudarl.ops import ssm as ops

    f = np.float32
    zx, conv = np.zeros((14, 6 + 10 + 2), f), np.zeros((5, 10), f)  # E = 6 (2 heads of 3), G N = 2
    with pytest.raises(ValueError, match="conv_forward: 14 rows are not whole windows of 4"):
        ops.conv_forward(zx, conv, np.zeros((14, 10), f), 4, 6)
    with pytest.raises(ValueError, match=r"conv must be \[K \+ 1, 10\] with 2 <= K <= 8"):
        ops.conv_forward(zx, np.zeros((10, 10), f), np.zeros((14, 10), f), 7, 6)
    with pytest.raises(ValueError, match="ssd_forward: states"):
        ops.ssd_forward(
            np.zeros((14, 10), f),
            zx,
            np.zeros((3, 2), f),
            np.zeros((14, 6), f),
            np.zeros((14, 2), f),
            np.zeros((2, 2, 2, 3, 2), f),  # a window of 7 in chunks of 4 has 2 chunks: 1 state between them
            7,
            4,
        )
    with pytest.raises(ValueError, match=r"ssd_last_forward: dt must have shape \(14, 2\)"):
        ops.ssd_last_forward(
            np.zeros((14, 10), f), zx, np.zeros((3, 2), f), np.zeros((2, 6), f), np.zeros((2, 2), f), 7, 2
        )
    with pytest.raises(ValueError, match="ssd_last_backward: E=6, H=2, P=3, N=3 do not fit xbc with 10 columns"):
        ops.ssd_last_backward(
            *(np.zeros(s, f) for s in ((2, 6), (14, 10), (14, 18), (14, 2), (3, 2), (14, 10), (14, 18))),
            np.zeros((14, 2, 6), f),  # N = 3, but xbc's B and C columns are G N = 2 wide
            np.zeros((2, 3, 2), f),
            7,
        )
    W = 10_000  # the last-bar scan holds six rows of the window: too long a window is refused, not launched
    with pytest.raises(ValueError, match="ssd_last_backward: needs .* use a shorter window"):
        ops.ssd_last_backward(
            *(np.zeros(s, f) for s in ((1, 6), (W, 10), (W, 18), (W, 2), (3, 2), (W, 10), (W, 18))),
            np.zeros((W, 2, 4), f),
            np.zeros((1, 3, 2), f),
            W,
        )
    assert 4 * ops.backward_shared(64, 64, 64) <= ops.MAX_SHARED  # the benchmark's window in one chunk fits
    assert 4 * ops.backward_shared(64, 64, 64, tf32=True) <= ops.MAX_SHARED  # its _tc kernel too
    with pytest.raises(ValueError, match="use a shorter chunk"):
        ops.ssd_backward(
            np.zeros((128, 64), f),
            np.zeros((128, 192), f),
            np.zeros((128, 257), f),
            np.zeros((128, 1), f),
            np.zeros((3, 1), f),
            np.zeros((1, 1, 0, 64, 64), f),  # one chunk: no states
            np.zeros((128, 192), f),
            np.zeros((128, 257), f),
            np.zeros((128, 1, 128), f),
            np.zeros((1, 3, 1), f),
            128,
            128,  # one chunk of 128 bars: Q^2 matrices and Q-row operands past 227 KiB
        )


# --- GPU: ops ----------------------------------------------------------------------------------------
GPU_CASES = [  # B, W, H, P, N, G, K, chunk
    (1, 1, 1, 2, 1, 1, 2, 1),
    (3, 9, 4, 3, 5, 2, 3, 4),
    (2, 33, 2, 16, 16, 2, 4, 32),
    (7, 64, 4, 64, 64, 1, 4, 16),
    (2, 16, 2, 8, 8, 1, 4, 16),  # one chunk covers the window: no states
    (5, 64, 4, 64, 64, 1, 4, 64),  # the benchmark's layer in one chunk (Q = W = 64; 205 KB of shared memory)
    (2, 20, 2, 6, 8, 1, 4, 8),  # N a multiple of 4, P not: the forward's 16-byte rows, the backward's padded by one
    (512, 64, 4, 64, 64, 1, 4, 32),  # the benchmark's layer: d_model 128, expand 2, state 64
]


def _gpu_scan(cp, c, W, H, P, N, chunk, B):
    from cudarl.ops import ssm as ops

    g = {k: cp.asarray(np.asarray(c[k], np.float32)) for k in ("zx", "conv", "head")}
    xbc = cp.empty((B * W, c["Cc"]), np.float32)
    y, dt = cp.empty((B * W, c["E"]), np.float32), cp.empty((B * W, H), np.float32)
    st = cp.empty((B, H, ref.n_states(W, chunk), P, N), np.float32)
    for a in (xbc, y, dt, st):
        poison(a)
    ops.conv_forward(g["zx"], g["conv"], xbc, W, c["E"])
    ops.ssd_forward(xbc, g["zx"], g["head"], y, dt, st, W, chunk)
    return g, xbc, y, dt, st


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", GPU_CASES)
def test_gpu_conv_and_scan_forward(cp, rng, B, W, H, P, N, G, K, chunk):
    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    c64 = {k: (np.asarray(v, np.float64) if isinstance(v, np.ndarray) else v) for k, v in c32.items()}
    _, gxbc, gy, gdt, gst = _gpu_scan(cp, c32, W, H, P, N, chunk, B)
    r32, r64 = scan(c32, B, W, H, P, N, chunk, np.float32), scan(c64, B, W, H, P, N, chunk)
    for k, name in enumerate(("xbc", "y", "dt", "states")[: 4 if gst.size else 3]):  # one chunk: no states
        assert_oracle((gxbc, gy, gdt, gst)[k], r32[k], r64[k], what=name)
    # the scan on the GPU's own conv output (what the encoder runs), against the twin on it
    xbc = gxbc.get().astype(np.float64)
    y, dt = np.empty((B * W, c32["E"])), np.empty((B * W, H))
    st = np.empty((B, H, ref.n_states(W, chunk), P, N))
    ref.ssd_forward(xbc, c64["zx"], c64["head"], y, dt, st, W, chunk)
    assert_oracle(gy, r32[1], y, what="y on the GPU's xbc")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", GPU_CASES)
def test_gpu_conv_and_scan_backward(cp, rng, B, W, H, P, N, G, K, chunk):
    """The backward from the GPU's forward (xbc, dt, states) for both sides, so they see the same activations."""
    from cudarl.ops import ssm as ops

    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    g, gxbc, _, gdt, gst = _gpu_scan(cp, c32, W, H, P, N, chunk, B)
    E, Cc = c32["E"], c32["Cc"]
    dy = rng.standard_normal((B * W, E)).astype(np.float32)
    dxin = rng.standard_normal((B * W, Cc)).astype(np.float32)
    acts = dict(xbc=gxbc.get(), dt=gdt.get(), st=gst.get())
    parts = rseq.n_parts(B)
    want = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        cc = {k: (np.asarray(v, cast) if isinstance(v, np.ndarray) else v) for k, v in c32.items()}
        a = {k: np.asarray(v, cast) for k, v in acts.items()}
        dxbc, ddt, dhead = scan_backward(cc, a["xbc"], a["dt"], a["st"], dy.astype(cast), B, W, H, N, chunk)
        dzx, part = np.full(cc["zx"].shape, np.nan, cast), np.empty((parts, (K + 1) * Cc), cast)
        ref.conv_backward(dxin.astype(cast), cc["zx"], cc["conv"], dzx, part, W, E)
        dconv = np.empty((K + 1) * Cc, cast)
        rseq.colsum(part, dconv)
        want[name] = dict(dx=dxbc[:, :E], dbc=dxbc[:, E:], ddt=ddt, dhead=dhead, din=dzx[:, E : E + Cc], dconv=dconv)
    gdxbc, gdzx = cp.empty((B * W, Cc), np.float32), cp.empty(c32["zx"].shape, np.float32)
    gdbc, gdhead = cp.empty((B * W, H, 2 * N), np.float32), cp.empty((B, 3, H), np.float32)
    for a in (gdxbc, gdzx, gdbc, gdhead):
        poison(a)
    ops.ssd_backward(cp.asarray(dy), gxbc, g["zx"], gdt, g["head"], gst, gdxbc, gdzx, gdbc, gdhead, W, chunk)
    ops.bc_reduce(gdbc, gdxbc, E)
    got = dict(dx=gdxbc[:, :E], dbc=gdxbc[:, E:], ddt=gdzx[:, E + Cc :], dhead=gdhead)
    assert bool(cp.isnan(gdzx[:, : E + Cc]).all()), "ssd_backward wrote outside the dt columns of dzx"
    gpart, gdconv = cp.empty((parts, (K + 1) * Cc), np.float32), cp.empty((K + 1) * Cc, np.float32)
    poison(gpart)
    poison(gdconv)
    ops.conv_backward(cp.asarray(dxin), g["zx"], g["conv"], gdzx, gpart, W, E)
    from cudarl.ops import seq as oseq

    oseq.colsum(gpart, gdconv)
    got.update(din=gdzx[:, E : E + Cc], dconv=gdconv)
    assert bool(cp.isnan(gdzx[:, :E]).all()), "conv_backward wrote into the z columns"
    for k, v in got.items():
        assert_oracle(v, want["32"][k], want["64"][k], what=k)
    # rerun: bitwise the same (fixed-order sums)
    first = {k: v.get() for k, v in got.items()}
    ops.ssd_backward(cp.asarray(dy), gxbc, g["zx"], gdt, g["head"], gst, gdxbc, gdzx, gdbc, gdhead, W, chunk)
    ops.bc_reduce(gdbc, gdxbc, E)
    for k in ("dx", "dbc", "ddt", "dhead"):
        assert_bitwise(got[k], first[k], what=f"rerun {k}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,W,H,P,N,G,K,chunk",
    GPU_CASES + [(3, 100, 2, 16, 8, 1, 4, 32), (2, 129, 4, 64, 64, 1, 4, 32)],  # windows of 2 and 3 staged tiles
)
def test_gpu_last_bar_scan(cp, rng, B, W, H, P, N, G, K, chunk):
    """ssd_last_forward and ssd_last_backward on the GPU's conv output against the float64 twin (poisoned
    outputs; nothing of dzx but the dt columns written), the last row of the GPU's chunked scan, and a rerun
    bitwise."""
    from cudarl.ops import ssm as ops

    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    g, gxbc, gy, gdt_full, _ = _gpu_scan(cp, c32, W, H, P, N, chunk, B)
    E, Cc = c32["E"], c32["Cc"]
    gyl, gdt = cp.empty((B, E), np.float32), cp.empty((B * W, H), np.float32)
    poison(gyl)
    poison(gdt)
    ops.ssd_last_forward(gxbc, g["zx"], g["head"], gyl, gdt, W, N)
    xbc = gxbc.get()
    dy = rng.standard_normal((B, E)).astype(np.float32)
    want = {}
    for name, cast in (("32", np.float32), ("64", np.float64)):
        cc = {k: (np.asarray(v, cast) if isinstance(v, np.ndarray) else v) for k, v in c32.items()}
        y, dt = last_scan(cc, xbc.astype(cast), B, W, H, N, cast)
        dxbc, ddt, dhead = last_backward(cc, xbc.astype(cast), gdt.get().astype(cast), dy.astype(cast), B, W, H, N)
        want[name] = dict(y=y, dt=dt, dx=dxbc[:, :E], dbc=dxbc[:, E:], ddt=ddt, dhead=dhead)
    assert_oracle(gyl, want["32"]["y"], want["64"]["y"], what="y at the last bar")
    assert_oracle(gdt, want["32"]["dt"], want["64"]["dt"], what="dt")
    assert_bitwise(gdt, gdt_full, what="dt as ssd_forward's")
    assert rel_error(gyl, gy.reshape(B, W, E)[:, -1]) <= 1e-5, "last-bar y vs the chunked scan's last row"
    gdxbc, gdzx = cp.empty((B * W, Cc), np.float32), cp.full(c32["zx"].shape, np.nan, np.float32)
    gdbc, gdhead = cp.empty((B * W, H, 2 * N), np.float32), cp.empty((B, 3, H), np.float32)
    for a in (gdxbc, gdbc, gdhead):
        poison(a)
    ops.ssd_last_backward(cp.asarray(dy), gxbc, g["zx"], gdt, g["head"], gdxbc, gdzx, gdbc, gdhead, W)
    ops.bc_reduce(gdbc, gdxbc, E)
    got = dict(dx=gdxbc[:, :E], dbc=gdxbc[:, E:], ddt=gdzx[:, E + Cc :], dhead=gdhead)
    assert bool(cp.isnan(gdzx[:, : E + Cc]).all()), "ssd_last_backward wrote outside the dt columns of dzx"
    for k, v in got.items():
        assert_oracle(v, want["32"][k], want["64"][k], what=k)
    first = {k: v.get() for k, v in got.items()}
    ops.ssd_last_backward(cp.asarray(dy), gxbc, g["zx"], gdt, g["head"], gdxbc, gdzx, gdbc, gdhead, W)
    ops.bc_reduce(gdbc, gdxbc, E)
    for k in first:
        assert_bitwise(got[k], first[k], what=f"rerun {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N", [(4, 64, 4, 64, 64), (3, 100, 2, 16, 8)])
def test_gpu_last_bar_scan_stages_16_or_4_bytes_alike(cp, rng, B, W, H, P, N):
    """The last-bar scans copy xbc's rows 16 bytes at a time where N and P are multiples of 4 and xbc is on 16
    bytes, else 4 (ssm.cu's banner): the same xbc 4 bytes past a 16-byte boundary takes the second path, and every
    output keeps its bits (the same sums in the same order)."""
    from cudarl.ops import ssm as ops

    c = case(rng, B, W, H, P, N, 1, 4, np.float32)
    E, Cc = c["E"], c["Cc"]
    g = {k: cp.asarray(c[k]) for k in ("zx", "conv", "head")}
    xbc = cp.empty((B * W, Cc), np.float32)
    ops.conv_forward(g["zx"], g["conv"], xbc, W, E)
    moved = cp.empty(xbc.size + 1, np.float32)[1:].reshape(xbc.shape)
    moved[...] = xbc
    assert xbc.data.ptr % 16 == 0 and moved.data.ptr % 16 == 4
    dy = cp.asarray(rng.standard_normal((B, E)).astype(np.float32))
    outs = []
    for x in (xbc, moved):
        y, dt = cp.empty((B, E), np.float32), cp.empty((B * W, H), np.float32)
        dxbc, dzx = cp.empty(x.shape, np.float32), cp.full(g["zx"].shape, np.nan, np.float32)
        dbc, dhead = cp.empty((B * W, H, 2 * N), np.float32), cp.empty((B, 3, H), np.float32)
        for a in (y, dt, dxbc, dbc, dhead):
            poison(a)
        ops.ssd_last_forward(x, g["zx"], g["head"], y, dt, W, N)
        ops.ssd_last_backward(dy, x, g["zx"], dt, g["head"], dxbc, dzx, dbc, dhead, W)
        outs.append((y, dt, dxbc[:, :E], dzx[:, E + Cc :], dbc, dhead))
    for a, b, name in zip(*outs, ("y", "dt", "dx", "d dt_raw", "dbc_part", "dhead_part"), strict=True):
        assert not bool(cp.isnan(a).any()), f"{name} left unwritten"
        assert_bitwise(b, a, what=f"{name}, 4-byte copies against 16")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", GPU_CASES[:4] + [(4096, 5, 4, 64, 64, 1, 4, 32)])
def test_gpu_steps_match_the_twin_and_the_window(cp, rng, B, W, H, P, N, G, K, chunk):
    """W bars of conv_step + ssd_step from zero state: against the twin's steps, and the GPU conv_step's
    xbc against the GPU conv_forward's last row bit for bit (the same sum order)."""
    from cudarl.ops import ssm as ops

    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    g, gxbc, gy, _, gst = _gpu_scan(cp, c32, W, H, P, N, chunk, B)
    E, Cc = c32["E"], c32["Cc"]
    gcs, gss = cp.zeros((B, K - 1, Cc), np.float32), cp.zeros((B, H, P, N), np.float32)
    cs = {n: np.zeros((B, K - 1, Cc), t) for n, t in (("32", np.float32), ("64", np.float64))}
    ss = {n: np.zeros((B, H, P, N), t) for n, t in (("32", np.float32), ("64", np.float64))}
    zx3 = c32["zx"].reshape(B, W, -1)
    gxt, gyt = cp.empty((B, Cc), np.float32), cp.empty((B, E), np.float32)
    for t in range(W):
        zt = np.ascontiguousarray(zx3[:, t])
        poison(gxt)
        poison(gyt)
        gz = cp.asarray(zt)
        ops.conv_step(gz, g["conv"], gcs, gxt, E)
        ops.ssd_step(gxt, gz, g["head"], gss, gyt)
        if (t + 1) % chunk == 0 and t + 1 < W:  # the chunked scan's state entering the next chunk
            assert rel_error(gss, gst[:, :, (t + 1) // chunk - 1]) <= 1e-5, f"recurrent vs chunk state at bar {t}"
        outs = {}
        for n, cast in (("32", np.float32), ("64", np.float64)):
            xt, yt = np.empty((B, Cc), cast), np.empty((B, E), cast)
            ref.conv_step(zt.astype(cast), c32["conv"].astype(cast), cs[n], xt, E)
            ref.ssd_step(xt, zt.astype(cast), c32["head"].astype(cast), ss[n], yt)
            outs[n] = (xt, yt)
        assert_oracle(gxt, outs["32"][0], outs["64"][0], what=f"conv_step bar {t}")
        assert_oracle(gyt, outs["32"][1], outs["64"][1], what=f"ssd_step bar {t}")
    assert_oracle(gss, ss["32"], ss["64"], what="state after W bars")
    assert_bitwise(gxt, gxbc.reshape(B, W, Cc)[:, -1], what="conv_step vs conv_forward")
    assert rel_error(gyt, gy.reshape(B, W, E)[:, -1]) <= 1e-5, "recurrent vs chunked y at the last bar"


# --- the _tc scans (net.tf32): the products on TF32 tensor cores ----------------------------------------
#: TF32's unit roundoff: 10 explicit mantissa bits, operands rounded to nearest (cvt.rna.tf32.f32).
U_TF32 = 2.0**-11
#: The _tc scans' bound on ||gpu - twin64|| / ||twin64|| (derivation: :func:`test_gpu_tc_scans_match_the_float64_twin`).
TC_TOL = 4 * U_TF32


def _tf32(a):
    """``a`` rounded to TF32 as cvt.rna does (to nearest, ties away from zero; finite values), as float64."""
    f = np.asarray(a, np.float32)
    bits = ((f.view(np.uint32).astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(np.isfinite(f), bits.view(np.float32), f).astype(np.float64)


@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", [(3, 9, 4, 3, 5, 2, 3, 4), (2, 20, 2, 6, 8, 1, 4, 8)])
def test_tf32_operands_in_the_twin_stay_within_the_tc_bound(rng, monkeypatch, B, W, H, P, N, G, K, chunk):
    """The rounding model behind :data:`TC_TOL`, on the CPU: the float64 twin with every operand of its matrix
    contractions rounded to TF32 (as the _tc kernels' products read theirs; the rest in float64) stays within
    TC_TOL of the exact twin on every output, and moves (the rounding is there to bound)."""
    c = case(rng, B, W, H, P, N, G, K)
    dy = rng.standard_normal((B * W, c["E"]))
    xbc, y, dt, st = scan(c, B, W, H, P, N, chunk)
    want = (y, st, *scan_backward(c, xbc, dt, st, dy, B, W, H, N, chunk))
    exact = ref._contract
    monkeypatch.setattr(ref, "_contract", lambda spec, *ops: exact(spec, *(_tf32(o) for o in ops)))
    _, y_tc, _, st_tc = scan(c, B, W, H, P, N, chunk)
    got = (y_tc, st_tc, *scan_backward(c, xbc, dt, st, dy, B, W, H, N, chunk))
    for g, w, name in zip(got, want, ("y", "states", "dxbc", "d dt_raw", "dhead"), strict=True):
        err = rel_error(g, w)
        assert U_TF32 / 100 < err <= TC_TOL, f"{name}: {err:.2e}"


def test_the_tf32_flag_picks_the_tc_kernels_with_the_same_launch(monkeypatch):
    """ssd_forward / ssd_backward launch cudarl_ssm_<op> by default and cudarl_ssm_<op>_tc with ``tf32=True``,
    with the same grid, block and arguments (as the kernels declare them) and the _tc kernels' shared memory
    (rows padded by tc_pad); every other op of the family has no tf32 form (the last-bar scans are
    matrix-vector products). The kernels are two compile units: fp32 (every FP32 kernel) and tf32."""
    from cudarl import testing
    from cudarl.ops import ssm as ops

    calls = []
    monkeypatch.setattr(
        ops, "launch", lambda fam, op, grid, block, args, **kw: calls.append((op, grid, block, args, kw))
    )
    f = np.float32
    B, W, H, P, N, Q = 2, 7, 2, 3, 4, 4
    E, Cc = H * P, H * P + 2 * N
    ns = ref.n_states(W, Q)
    fwd = (
        np.zeros((B * W, Cc), f),
        np.zeros((B * W, E + Cc + H), f),
        np.zeros((3, H), f),
        np.zeros((B * W, E), f),
        np.zeros((B * W, H), f),
        np.zeros((B, H, ns, P, N), f),
        W,
        Q,
    )
    bwd = (
        np.zeros((B * W, E), f),
        fwd[0],
        fwd[1],
        fwd[4],
        fwd[2],
        fwd[5],
        np.zeros((B * W, Cc), f),
        np.zeros((B * W, E + Cc + H), f),
        np.zeros((B * W, H, 2 * N), f),
        np.zeros((B, 3, H), f),
        W,
        Q,
    )
    for tf32 in (False, True):
        ops.ssd_forward(*fwd, tf32=tf32)
        ops.ssd_backward(*bwd, tf32=tf32)
    ops.ssd_forward(*fwd)
    (f0, b0, f1, b1, fd) = calls
    assert (f0[0], b0[0], f1[0], b1[0], fd[0]) == (
        "ssd_forward",
        "ssd_backward",
        "ssd_forward_tc",
        "ssd_backward_tc",
        "ssd_forward",
    )
    for plain, tc, smem in ((f0, f1, ref.forward_shared), (b0, b1, ref.backward_shared)):
        assert plain[1:3] == tc[1:3]
        assert plain[4]["shared_mem"] == 4 * smem(Q, P, N) and tc[4]["shared_mem"] == 4 * smem(Q, P, N, True)
        assert {k: v for k, v in plain[4].items() if k != "shared_mem"} == {
            k: v for k, v in tc[4].items() if k != "shared_mem"
        }
        assert len(plain[3]) == len(tc[3]) and all(a is b for a, b in zip(plain[3], tc[3], strict=True))
        testing.assert_launch_args("ssm", tc[0], tc[3])
    assert ops.KERNEL_VARIANTS == {"ssd_forward": ("tc",), "ssd_backward": ("tc",)}
    from cudarl import kernels

    assert kernels.unit_of("ssm", "ssd_forward_tc") == kernels.unit_of("ssm", "ssd_backward_tc") == "tf32"
    assert {kernels.unit_of("ssm", op) for op in ("ssd_forward", "ssd_backward", "conv_forward", "ssd_step")} == {
        "fp32"
    }


def test_the_tc_scans_pad_their_rows_and_the_config_counts_it():
    """tc_pad (ssm.cu's): rows of n' >= n floats, n' = 4 mod 8, so a fragment's 8 rows start in 8 distinct groups
    of 4 banks; the _tc kernels' shared memory counts them, and net.tf32 with an SSM encoder is checked against
    the _tc backward's size (a chunk that fits the FP32 kernel can miss the _tc one by the padding)."""
    from cudarl.config import ConfigError, NetConfig

    for n in range(1, 200):
        m = ref.tc_pad(n)
        assert n <= m < n + 8 and m % 8 == 4
        assert len({(g * m) % 32 // 4 for g in range(8)}) == 8
    assert [ref.tc_pad(n) for n in (3, 16, 32, 64)] == [4, 20, 36, 68]
    assert 4 * ref.forward_shared(32, 64, 64, True) == 48512 and 4 * ref.backward_shared(32, 64, 64, True) == 109824
    kw = dict(encoder="ssm", window=64, d_model=128, ssm_expand=2, ssm_headdim=64, ssm_state=128, ssm_chunk=53)
    NetConfig(**kw)  # FP32: 228,880 bytes of the backward's
    with pytest.raises(ConfigError, match="needs 233544 bytes of shared memory"):
        NetConfig(**kw, tf32=True)


def _gpu_tc_scan(cp, rng, B, W, H, P, N, G, K, chunk):
    """Inputs on the GPU (conv_forward's xbc), the _tc forward and backward on them (poisoned outputs), and the
    float64 twin on the same xbc and, for the backward, on the GPU forward's dt and states."""
    from cudarl.ops import ssm as ops

    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    E, Cc = c32["E"], c32["Cc"]
    g, gxbc, gy32, gdt32, gst32 = _gpu_scan(cp, c32, W, H, P, N, chunk, B)  # the FP32 kernel's, for comparisons
    gy, gdt = cp.empty((B * W, E), np.float32), cp.empty((B * W, H), np.float32)
    gst = cp.empty((B, H, ref.n_states(W, chunk), P, N), np.float32)
    for a in (gy, gdt, gst):
        poison(a)
    ops.ssd_forward(gxbc, g["zx"], g["head"], gy, gdt, gst, W, chunk, tf32=True)
    dy = cp.asarray(rng.standard_normal((B * W, E)).astype(np.float32))
    gdxbc, gdzx = cp.empty((B * W, Cc), np.float32), cp.full(c32["zx"].shape, np.nan, np.float32)
    gdbc, gdhead = cp.empty((B * W, H, 2 * N), np.float32), cp.empty((B, 3, H), np.float32)
    for a in (gdxbc, gdbc, gdhead):
        poison(a)
    ops.ssd_backward(dy, gxbc, g["zx"], gdt, g["head"], gst, gdxbc, gdzx, gdbc, gdhead, W, chunk, tf32=True)
    ops.bc_reduce(gdbc, gdxbc, E)
    xbc = gxbc.get().astype(np.float64)
    c64 = {k: (np.asarray(v, np.float64) if isinstance(v, np.ndarray) else v) for k, v in c32.items()}
    y, dt = np.empty((B * W, E)), np.empty((B * W, H))
    st = np.empty((B, H, ref.n_states(W, chunk), P, N))
    ref.ssd_forward(xbc, c64["zx"], c64["head"], y, dt, st, W, chunk)
    dxbc, ddt, dhead = scan_backward(
        c64,
        xbc,
        gdt.get().astype(np.float64),
        gst.get().astype(np.float64),
        dy.get().astype(np.float64),
        B,
        W,
        H,
        N,
        chunk,
    )
    gpu = dict(y=gy, states=gst, dx=gdxbc[:, :E], dbc=gdxbc[:, E:], ddt=gdzx[:, E + Cc :], dhead=gdhead)
    twin = dict(y=y, states=st, dx=dxbc[:, :E], dbc=dxbc[:, E:], ddt=ddt, dhead=dhead)
    fp32 = dict(y=gy32, dt=gdt32, states=gst32)
    return dict(gpu=gpu, twin=twin, fp32=fp32, dt=gdt, dzx=gdzx, g=g, gxbc=gxbc, dy=dy, bufs=(gdxbc, gdbc, gdhead))


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", GPU_CASES)
def test_gpu_tc_scans_match_the_float64_twin(cp, rng, B, W, H, P, N, G, K, chunk):
    """ssd_forward_tc and ssd_backward_tc against the float64 twin: ``||gpu - twin|| / ||twin|| <= TC_TOL = 4u``,
    u = 2^-11.

    Derivation. A _tc product rounds each operand value to TF32 once (relative error at most u: 10 explicit
    mantissa bits, rounded to nearest) and sums the exact products (a TF32 product fits a float32) in float32
    (relative error about K 2^-24 <= 4e-6 for the scans' K <= 64: negligible). The deepest chain of products is
    two: y = C (S) with S = sum f x B^T; M x with M from C B^T; du = M^T dy; dC from dCB = (dy u^T) L; dB and
    wS from dS = sum e dy C^T. So a term of any output carries at most four roundings, relative error at most
    (1 + u)^4 - 1 ~ 4u, and an output whose terms do not cancel is within 4u of the twin. Where terms cancel the
    worst case grows with sum|terms| / |sum terms|, but the roundings are independent and of either sign, so the
    expected error is about sqrt(4/3) u ~ 0.56e-3 whatever the sum's length: 4u leaves a factor of about 3.5
    for cancellation (:func:`test_tf32_operands_in_the_twin_stay_within_the_tc_bound` measures the twin with
    TF32 operands at 1e-4 .. 7e-4 on these shapes). The elementwise float32 work between the products adds the
    float32 twin's own error, about 1e-6. dt is the FP32 kernel's code: bit for bit its dt.

    Also: nothing of dzx but its dt columns is written, a rerun is bitwise the same, and where the sums are
    long enough to show rounding, y differs from the FP32 kernel's (the products did run on tensor cores)."""
    r = _gpu_tc_scan(cp, rng, B, W, H, P, N, G, K, chunk)
    for k, v in r["gpu"].items():
        if k == "states" and not v.size:
            continue  # one chunk over the window: no states
        assert_parity(v, np.asarray(r["twin"][k], np.float32), rtol=TC_TOL, what=f"{k} (tc)")
    assert_bitwise(r["dt"], r["fp32"]["dt"], what="dt as the FP32 kernel's")
    E, Cc = r["gpu"]["y"].shape[1], r["gxbc"].shape[1]
    assert bool(cp.isnan(r["dzx"][:, : E + Cc]).all()), "ssd_backward_tc wrote outside the dt columns of dzx"
    if N * P >= 64:
        assert not np.array_equal(r["gpu"]["y"].get(), r["fp32"]["y"].get()), "y is the FP32 kernel's, bit for bit"
    from cudarl.ops import ssm as ops

    first = {k: v.get() for k, v in r["gpu"].items()}
    gdxbc, gdbc, gdhead = r["bufs"]
    ops.ssd_backward(
        r["dy"],
        r["gxbc"],
        r["g"]["zx"],
        r["dt"],
        r["g"]["head"],
        r["gpu"]["states"],
        gdxbc,
        r["dzx"],
        gdbc,
        gdhead,
        W,
        chunk,
        tf32=True,
    )
    ops.bc_reduce(gdbc, gdxbc, E)
    for k in ("dx", "dbc", "ddt", "dhead"):
        assert_bitwise(r["gpu"][k], first[k], what=f"rerun {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("B,W,H,P,N,G,K,chunk", [(7, 64, 4, 64, 64, 1, 4, 16), (3, 9, 4, 3, 5, 2, 3, 4)])
def test_gpu_tc_scans_graphed_equal_eager_bitwise(cp, rng, B, W, H, P, N, G, K, chunk):
    """The _tc forward and backward captured in one graph replay their eager run bit for bit (twice: replay,
    then eager again), from modules of the graph's own context."""
    from cudarl import kernels
    from cudarl.graph import StepGraph
    from cudarl.ops import ssm as ops
    from cudarl.testing import assert_reruns_bitwise

    c32 = case(rng, B, W, H, P, N, G, K, np.float32)
    g, gxbc, _, _, _ = _gpu_scan(cp, c32, W, H, P, N, chunk, B)
    E, Cc = c32["E"], c32["Cc"]
    out = dict(
        y=cp.empty((B * W, E), np.float32),
        dt=cp.empty((B * W, H), np.float32),
        states=cp.empty((B, H, ref.n_states(W, chunk), P, N), np.float32),
        dxbc=cp.empty((B * W, Cc), np.float32),
        dzx=cp.empty(c32["zx"].shape, np.float32),
        dbc=cp.empty((B * W, H, 2 * N), np.float32),
        dhead=cp.empty((B, 3, H), np.float32),
    )
    dy = cp.asarray(rng.standard_normal((B * W, E)).astype(np.float32))

    def scans():
        ops.ssd_forward(gxbc, g["zx"], g["head"], out["y"], out["dt"], out["states"], W, chunk, tf32=True)
        ops.ssd_backward(
            dy,
            gxbc,
            g["zx"],
            out["dt"],
            g["head"],
            out["states"],
            out["dxbc"],
            out["dzx"],
            out["dbc"],
            out["dhead"],
            W,
            chunk,
            tf32=True,
        )
        ops.bc_reduce(out["dbc"], out["dxbc"], E)

    graph = StepGraph("ssm_tc_parity", [("scans", scans)], xp=cp)
    for v in out.values():
        v.fill(0)  # dzx's other columns are not written: zero in every attempt
    graph.run_eager()
    graph.synchronize()
    want = {k: v.get() for k, v in out.items()}
    graph.capture()
    assert ("ssm", "tf32", "ssm_tc_parity") in kernels.loaded()
    assert_reruns_bitwise(graph, out, want, reset=lambda: out["dzx"].fill(0))
