"""Writes the GPU encoders' outputs (psi, every parameter's gradient, the one-bar acting psi) for a few shapes to an
.npz (argv[1]), from the cudarl tree this runs in, so two trees can be compared: branch ``res-epilogue`` (the
residual adds in the out-projections' cuBLASLt GEMMs) against main (the GEMM, then seq.residual_add). The bits are
expected to differ (cuBLASLt's epilogue rounds h + (x W + b) in an order its documentation leaves open, and the
heuristic may pick another kernel for beta = 1); --compare prints, per output, "same bits" or the relative
difference, which should be float32 rounding (about 1e-7 to 1e-6), not more.
Usage, on a GPU host from each tree: PYTHONPATH=. python3 docs/bench/res_bits.py OUT.npz; then --compare A B."""

import re
import sys

import numpy as np

#: kind, B, W, d_model, layers, tf32: the workload's widths at a smaller batch, an odd window, TF32
SHAPES = [("ssm", 64, 64, 128, 2, False), ("attention", 64, 64, 128, 2, False), ("ssm", 7, 13, 32, 3, False),
          ("attention", 7, 13, 32, 3, False), ("ssm", 64, 64, 128, 2, True)]  # fmt: skip
F = 6


def _encoder(kind, W, d, L, tf32):
    from cudarl.nn.encoders import AttentionEncoder, SSMEncoder

    if kind == "ssm":
        return SSMEncoder("enc", F, window=W, d_model=d, layers=L, expand=2, d_state=min(64, d // 2),
                          headdim=min(64, d // 2), groups=1, conv_kernel=4, chunk=32, tf32=tf32)  # fmt: skip
    return AttentionEncoder("enc", F, window=W, d_model=d, layers=L, heads=4, mlp_ratio=4, tf32=tf32)


def run(path):
    import cupy as cp

    from cudarl.nn.encoders import Standalone

    out = {}
    for i, (kind, B, W, d, L, tf32) in enumerate(SHAPES):
        rng = np.random.default_rng(300 + i)
        s = Standalone(_encoder(kind, W, d, L, tf32), cp, np.float32, seed=7, noise=0.05)
        ws = s.workspace(B)
        x = cp.asarray(rng.standard_normal((B, W, F)).astype(np.float32))
        out[f"psi{i}"] = s.enc.forward(x, ws).get()
        ws.rows(f"{s.enc.out_name}.dout")[...] = cp.asarray(rng.standard_normal((B, d)).astype(np.float32))
        s.enc.backward(x, ws)
        out[f"grad{i}"] = s.grads.get()
        state = s.enc.new_state(B)
        for t in range(W):
            psi_t = s.enc.step(state, cp.ascontiguousarray(x[:, t]))
        out[f"act{i}"] = psi_t.get()
    np.savez(path, **out)


def compare(a, b):
    a, b = np.load(a), np.load(b)
    for k in a.files:
        shape = SHAPES[int(re.sub(r"\D", "", k))]
        if np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)):
            print(f"{k} {shape}: same bits")
            continue
        rel = float(
            np.linalg.norm(a[k].astype(np.float64) - b[k]) / max(np.linalg.norm(b[k].astype(np.float64)), 1e-30)
        )
        differ = int((a[k].view(np.uint32) != b[k].view(np.uint32)).sum())
        print(f"{k} {shape}: {differ} of {a[k].size} differ, relative difference {rel:.2e}")


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "--compare" else run(sys.argv[1])
