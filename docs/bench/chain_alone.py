"""Session 31: the chain kernel alone against the panel GEMMs layer by layer, at the reference MLP's shapes
(66 -> 256 -> 256 -> 204, ReLU, ReLU, identity), 512 and 4,096 rows; 20 calls captured in a cudarl
StepGraph, replayed 200 times. Answers why the step under net.gemm = "chain" measured slower (docs/perf-notes.md,
thirty-first session)."""

import cupy as cp

from cudarl.ops import gemm

WIDTHS, ACTS = (66, 256, 256, 204), (1, 1, 0)


def timed(fn, n=20, reps=200):
    """Mean us a call: ``n`` calls captured in one cudarl StepGraph (no host launch cost; kernels refuse a
    capture outside cudarl.graph), ``reps`` replays after an eager run."""
    from cudarl.graph import StepGraph

    g = StepGraph("chain_alone", [("calls", lambda: [fn() for _ in range(n)])], xp=cp)
    g.run_eager()
    g.synchronize()
    g.capture()
    g.replay()
    g.synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(g.stream)
    for _ in range(reps):
        g.replay()
    b.record(g.stream)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / (n * reps)


rng = cp.random.default_rng(0)


def case(M):
    x = rng.standard_normal((M, WIDTHS[0]), dtype=cp.float32)
    xp = cp.zeros((M, 68), cp.float32)
    xp[:, :66] = x
    ws = [rng.standard_normal((k, n), dtype=cp.float32) * 0.05 for k, n in zip(WIDTHS, WIDTHS[1:], strict=False)]
    wp = cp.zeros((68, 256), cp.float32)
    wp[:66] = ws[0]
    bs = [rng.standard_normal(n, dtype=cp.float32) for n in WIDTHS[1:]]
    ys = [cp.empty((M, n), cp.float32) for n in WIDTHS[1:]]
    layers = list(zip(ws, bs, ys, ACTS, strict=True))

    def panel():
        h = xp
        for w, b, y, act in zip([wp, *ws[1:]], bs, ys, ACTS, strict=True):
            gemm.nn_bias_act(h, w, b, y, act)
            h = y

    def one(i):
        h = xp if i == 0 else ys[i - 1]
        w = wp if i == 0 else ws[i]
        return lambda: gemm.nn_bias_act(h, w, bs[i], ys[i], ACTS[i])

    print(
        f"M {M}: chain (3 layers, 66 wide) {timed(lambda: gemm.chain(x, layers)):.2f} us; "
        f"chain over the 68-wide padded x {timed(lambda: gemm.chain(xp, [(wp, *layers[0][1:]), *layers[1:]])):.2f} us; "
        f"chain of layer 1 alone {timed(lambda: gemm.chain(ys[0], [layers[1]])):.2f} us; "
        f"panel x3 {timed(panel):.2f} us; panel layers " + ", ".join(f"{timed(one(i)):.2f}" for i in range(3)) + " us"
    )


for M in (512, 4096):
    case(M)
