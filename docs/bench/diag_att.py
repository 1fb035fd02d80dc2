# The attention encoder's gradients on the GPU against the float64 twin, per parameter (test_encoder_parity's
# 512 x 64 case), for the failure of the last-bar attention top block at 13421b4 (docs/perf-notes.md, twentieth
# session): run it from the root of a tree (every bar: main; the last-bar top block: main with 3070d5e reverted),
#   python3 docs/bench/diag_att.py TESTS_DIR [SEED|test] [poison]
# SEED draws x and dpsi from default_rng(SEED); "test" draws them as the failing test did (its rng fixture:
# crc32 of the test's node id). "poison" fills the memory pool with NaN before the GPU workspace is made, so a
# kernel that reads a row nothing wrote shows NaN (a fresh pool is mostly zeros; a test run's pool is not).
import sys
import zlib

import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, sys.argv[1])
import cupy as cp  # noqa: E402
from test_encoder_parity import D, F, _make  # noqa: E402

from cudarl.nn.encoders import Standalone  # noqa: E402
from cudarl.testing import rel_error  # noqa: E402

NODE = "tests/parity/test_encoder_parity.py::test_gpu_encoder_matches_numpy[512-64-32-attention]"
B, W = 512, 64
arg = sys.argv[2] if len(sys.argv) > 2 else "0"
rng = np.random.default_rng(zlib.crc32(NODE.encode()) if arg == "test" else int(arg))
poisoned = len(sys.argv) > 3 and sys.argv[3] == "poison"
if poisoned:  # 2 GB of NaN back to the pool: the workspace's blocks come from it
    junk = cp.full(2**29, np.nan, np.float32)
    del junk
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
print(f"data {arg}{', pool poisoned' if poisoned else ''}")
for e, e32, k in errs:
    print(f"{k:28s} gpu {e:.2e}  twin32 {e32:.2e}")
