"""Writes the output bits of kernels changed without changing their sums (session 23: ssm conv_forward in segments
of bars, nn bias_act_backward's tall chunks, ssm ssd_backward's 16-byte operand loads, seq gated_rmsnorm_forward's
cached rows; session 24: ssm ssd_step's staged state; session 25: ssm ssd_last_forward / ssd_last_backward's staged
tiles) for a few shapes to an .npz (argv[1]), from the cudarl tree this runs in, so two trees' outputs can be compared
bit for bit.
Usage, on a GPU host from each tree: PYTHONPATH=. python3 docs/bench/op_bits.py OUT.npz; then --compare A B."""

import sys

import numpy as np

SHAPES = [(512, 64, 256, 4), (3, 33, 24, 2), (2, 7, 12, 8), (4, 100, 40, 8), (1, 1, 8, 3)]  # conv: B, W, E, K
BIAS = [
    (32768, 644, 0),
    (32768, 128, 0),
    (9001, 20, 1),
    (512, 256, 1),
    (4096, 51, 2),
]  # bias_act_backward: rows, cols, act
GATED = [(32768, 1, 256), (512, 64, 256), (100, 3, 300), (7, 2, 40)]  # gated_rmsnorm_forward: rows, k, n
SCANS = [(64, 64, 4, 64, 64, 32), (3, 33, 2, 16, 16, 32), (2, 20, 2, 6, 8, 8), (2, 9, 4, 3, 5, 4)]  # B, W, H, P, N, Q
LAST = [  # the last-bar scans: B, W, H, P, N, G, xbc 4 bytes past 16 (the 4-byte copies on this branch)
    (512, 64, 4, 64, 64, 1, 0),
    (64, 64, 4, 64, 64, 1, 1),
    (3, 9, 4, 3, 5, 2, 0),
    (2, 20, 2, 6, 8, 1, 0),
    (3, 100, 2, 16, 8, 1, 0),
]


def run(path):
    import cupy as cp

    from cudarl.ops import nn
    from cudarl.ops import ssm as ops

    out = {}
    for i, (B, W, E, K) in enumerate(SHAPES):
        rng = np.random.default_rng(i)
        Cc = E + 2 * 16
        zx = cp.asarray(rng.standard_normal((B * W, E + Cc + 4)).astype(np.float32))
        conv = cp.asarray(rng.standard_normal((K + 1, Cc)).astype(np.float32))
        xbc = cp.full((B * W, Cc), np.nan, np.float32)
        ops.conv_forward(zx, conv, xbc, W, E)
        out[f"s{i}"] = xbc.get()
    for i, (R, N, act) in enumerate(BIAS):
        rng = np.random.default_rng(100 + i)
        d, y = (cp.asarray(rng.standard_normal((R, N)).astype(np.float32)) for _ in range(2))
        dz, db = cp.full((R, N), np.nan, np.float32), cp.full(N, np.nan, np.float32)
        nn.bias_act_backward(d, y, dz, db, act)
        out[f"b{i}"], out[f"z{i}"] = db.get(), dz.get()
    for i, (B, W, H, P, N, Q) in enumerate(SCANS):  # forward then backward, one group, conv of 4 taps
        rng = np.random.default_rng(200 + i)
        E, Cc = H * P, H * P + 2 * N
        f = lambda *s, scale=1.0, g=rng: cp.asarray((scale * g.standard_normal(s)).astype(np.float32))  # noqa: E731
        zx, conv = f(B * W, E + Cc + H, scale=0.5), f(5, Cc, scale=0.3)
        head = cp.asarray(np.stack([np.log(rng.uniform(1, 4, H)), np.ones(H), np.full(H, -2.0)]).astype(np.float32))
        xbc, y, dt = (cp.empty((B * W, n), np.float32) for n in (Cc, E, H))
        st = cp.empty((B, H, -(-W // Q) - 1, P, N), np.float32)  # a state entering each chunk but the first
        ops.conv_forward(zx, conv, xbc, W, E)
        ops.ssd_forward(xbc, zx, head, y, dt, st, W, Q)
        dxbc, dzx = cp.full((B * W, Cc), np.nan, np.float32), cp.full(zx.shape, np.nan, np.float32)
        dbc, dhead = cp.empty((B * W, H, 2 * N), np.float32), cp.empty((B, 3, H), np.float32)
        ops.ssd_backward(f(B * W, E), xbc, zx, dt, head, st, dxbc, dzx, dbc, dhead, W, Q)
        out[f"y{i}"], out[f"x{i}"], out[f"d{i}"] = y.get(), dxbc[:, :E].get(), dzx[:, E + Cc :].get()
        out[f"c{i}"], out[f"h{i}"] = dbc.get(), dhead.get()
        ss, yt = cp.zeros((B, H, P, N), np.float32), cp.empty((B, E), np.float32)  # four bars of the recurrence
        zx3, xbc3 = zx.reshape(B, W, -1), xbc.reshape(B, W, -1)
        for t in range(min(W, 4)):
            ops.ssd_step(cp.ascontiguousarray(xbc3[:, t]), cp.ascontiguousarray(zx3[:, t]), head, ss, yt)
        out[f"u{i}"], out[f"v{i}"] = yt.get(), ss.get()
    for i, (B, W, H, P, N, G, moved) in enumerate(LAST):  # conv, then the last bar's scan forward and backward
        rng = np.random.default_rng(400 + i)
        E, Cc = H * P, H * P + 2 * G * N
        f = lambda *s, scale=1.0, g=rng: cp.asarray((scale * g.standard_normal(s)).astype(np.float32))  # noqa: E731
        zx, conv = f(B * W, E + Cc + H, scale=0.5), f(5, Cc, scale=0.3)
        head = cp.asarray(np.stack([np.log(rng.uniform(1, 4, H)), np.ones(H), np.full(H, -2.0)]).astype(np.float32))
        xbc = cp.empty((B * W, Cc), np.float32)
        ops.conv_forward(zx, conv, xbc, W, E)
        if moved:
            xbc = cp.concatenate([cp.zeros(1, np.float32), xbc.ravel()])[1:].reshape(B * W, Cc)
        y, dt = cp.full((B, E), np.nan, np.float32), cp.full((B * W, H), np.nan, np.float32)
        ops.ssd_last_forward(xbc, zx, head, y, dt, W, N)
        dxbc, dzx = cp.full((B * W, Cc), np.nan, np.float32), cp.full(zx.shape, np.nan, np.float32)
        dbc, dhead = cp.full((B * W, H, 2 * N), np.nan, np.float32), cp.full((B, 3, H), np.nan, np.float32)
        ops.ssd_last_backward(f(B, E), xbc, zx, dt, head, dxbc, dzx, dbc, dhead, W)
        out[f"Ly{i}"], out[f"Lt{i}"], out[f"Lx{i}"] = y.get(), dt.get(), dxbc[:, :E].get()
        out[f"Ld{i}"], out[f"Lc{i}"], out[f"Lh{i}"] = dzx[:, E + Cc :].get(), dbc.get(), dhead.get()
    from cudarl.ops import seq

    for i, (R, k, n) in enumerate(GATED):  # zx [k R, 2 n + 5]: z its first n columns, the last row of each group
        rng = np.random.default_rng(300 + i)
        y, zx, w = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((R, n), (k * R, 2 * n + 5), (n,)))
        o, r = cp.full((R, n), np.nan, np.float32), cp.full(R, np.nan, np.float32)
        seq.gated_rmsnorm_forward(y, zx, w, o, r, 1e-5)
        out[f"g{i}"], out[f"r{i}"] = o.get(), r.get()
    np.savez(path, **out)


def compare(a, b):
    a, b = np.load(a), np.load(b)
    bad = 0
    for k in a.files:
        same = np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))
        if k[0] == "L":
            shape = LAST[int(k[2:])]
        else:
            shape = (SHAPES if k[0] == "s" else BIAS if k[0] in "bz" else GATED if k[0] in "gr" else SCANS)[int(k[1:])]
        print(f"{k} {shape}: {'same bits' if same else 'DIFFERENT'}; NaN left {int(np.isnan(b[k]).sum())}")
        bad += not same
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "--compare" else run(sys.argv[1])
