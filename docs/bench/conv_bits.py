"""Writes conv_forward's output bits for a few shapes to an .npz (argv[1]), from the cudarl tree this runs in, so
two trees' outputs can be compared bit for bit (session 23: conv_forward split into segments of bars).
Usage, on a GPU host from each tree: PYTHONPATH=. python3 docs/bench/conv_bits.py OUT.npz; then --compare A B."""

import sys

import numpy as np

SHAPES = [(512, 64, 256, 4), (3, 33, 24, 2), (2, 7, 12, 8), (4, 100, 40, 8), (1, 1, 8, 3)]  # B, W, E, K


def run(path):
    import cupy as cp

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
    np.savez(path, **out)


def compare(a, b):
    a, b = np.load(a), np.load(b)
    bad = 0
    for k in a.files:
        same = np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))
        print(f"{k} {SHAPES[int(k[1:])]}: {'same bits' if same else 'DIFFERENT'}; NaN left {int(np.isnan(b[k]).sum())}")
        bad += not same
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "--compare" else run(sys.argv[1])
