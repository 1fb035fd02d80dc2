# The attention encoder's gradients on the GPU against the float64 twin, per parameter (test_encoder_parity's
# 512 x 64 case), for the failure of the last-bar attention top block at 13421b4 (docs/perf-notes.md, twentieth
# session): run it from the root of main (every bar) and of a tree with 3070d5e reverted (the last-bar top block),
# on one machine:  python3 docs/bench/diag_att.py tests/parity [seed]
import sys

import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, sys.argv[1])
import cupy as cp  # noqa: E402
from test_encoder_parity import D, F, _make  # noqa: E402

from cudarl.nn.encoders import Standalone  # noqa: E402
from cudarl.testing import rel_error  # noqa: E402

B, W = 512, 64
rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
gpu = Standalone(_make("attention", W, chunk=32), cp, np.float32, seed=5, noise=0.05)
p = gpu.params.get()
x = rng.standard_normal((B, W, F)).astype(np.float32)
dpsi = rng.standard_normal((B, D)).astype(np.float32)
res = []
for s in (
    gpu,
    Standalone(_make("attention", W, chunk=32), np, np.float64, params=p),
    Standalone(_make("attention", W, chunk=32), np, np.float32, params=p),
):
    ws = s.workspace(B)
    xs = s.xp.asarray(x.astype(s.dtype))
    s.enc.forward(xs, ws)
    ws.rows(f"{s.enc.out_name}.dout")[...] = s.xp.asarray(dpsi.astype(s.dtype))
    s.enc.backward(xs, ws)
    g = s.grads.get() if s.xp is cp else s.grads
    res.append({e.name: np.asarray(g[e.offset : e.offset + e.size], np.float64) for e in s.layout.entries})
errs = sorted(
    (
        (
            rel_error(res[0][k].astype(np.float32), res[1][k].astype(np.float32)),
            rel_error(res[2][k].astype(np.float32), res[1][k].astype(np.float32)),
            k,
        )
        for k in res[0]
    ),
    reverse=True,
)
for e, e32, k in errs[:6]:
    print(f"{k:28s} gpu {e:.2e}  twin32 {e32:.2e}")
