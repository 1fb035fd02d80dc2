"""Writes the output bits of kernels changed without changing their sums (session 23: ssm conv_forward in segments
of bars, nn bias_act_backward's tall chunks) for a few shapes to an .npz (argv[1]), from the cudarl tree this runs
in, so two trees' outputs can be compared bit for bit.
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
    np.savez(path, **out)


def compare(a, b):
    a, b = np.load(a), np.load(b)
    bad = 0
    for k in a.files:
        same = np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))
        shape = (SHAPES if k[0] == "s" else BIAS)[int(k[1:])]
        print(f"{k} {shape}: {'same bits' if same else 'DIFFERENT'}; NaN left {int(np.isnan(b[k]).sum())}")
        bad += not same
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "--compare" else run(sys.argv[1])
