"""Capture-safe GEMM: the NumPy path against float64 on the CPU; cuBLAS eager and captured on the GPU."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudarl import blas
from cudarl.testing import assert_bitwise, assert_parity, poison

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
#: the reference step's GEMMs (forwards with their epilogues, dx, dW), shared with the bench's batched arm
from bench_gemm import STEP_GEMMS  # noqa: E402

SHAPES = [(1, 1, 1), (7, 13, 5), (512, 256, 256), (4096, 64, 256)]
TRANS = [(False, False), (True, False), (False, True), (True, True)]


def _operands(rng, m, n, k, ta, tb, xp=np):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    ref = 0.75 * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64) - 0.5 * c
    return a, b, c, ref


@pytest.mark.parametrize("m,n,k", SHAPES[:3])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_numpy_gemm_against_float64(rng, m, n, k, ta, tb):
    a, b, c, ref = _operands(rng, m, n, k, ta, tb)
    blas.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5)
    assert_parity(c, ref.astype(np.float32))


def test_shape_and_dtype_errors():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(blas.BlasError, match="expected out 3x5"):
        blas.gemm(a, np.zeros((4, 5), np.float32), np.zeros((3, 4), np.float32))
    with pytest.raises(blas.BlasError, match="float32"):
        blas.gemm(a, np.zeros((4, 5), np.float64), np.zeros((3, 5), np.float32))
    with pytest.raises(blas.BlasError, match="2-D"):
        blas.gemm(a, np.zeros(4, np.float32), np.zeros((3, 5), np.float32))
    with pytest.raises(blas.BlasError, match="C-contiguous"):
        blas.gemm(a, np.zeros((5, 4), np.float32).T, np.zeros((3, 5), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_eager_and_captured(cp, rng, m, n, k, ta, tb, tf32):
    from cudarl.graph import StepGraph

    a, b, c, ref = _operands(rng, m, n, k, ta, tb)
    kind = "tf32" if tf32 else "float32"
    da, db = cp.asarray(a), cp.asarray(b)
    out = cp.asarray(c)
    blas.gemm(da, db, out, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5, tf32=tf32)
    assert_parity(out, ref.astype(np.float32), kind=kind, what="eager")

    cap = cp.asarray(c)
    g = StepGraph(
        "gemm", [("gemm", lambda: blas.gemm(da, db, cap, trans_a=ta, trans_b=tb, alpha=0.75, beta=-0.5, tf32=tf32))]
    )
    g.capture()
    g.replay()
    g.synchronize()
    assert_parity(cap, ref.astype(np.float32), kind=kind, what="captured")
    # the replay must read the inputs' current contents
    a2 = rng.standard_normal(a.shape).astype(np.float32)
    da[...] = cp.asarray(a2)
    cap[...] = cp.asarray(c)
    # the copies ran on the current stream and the graph replays on its own non-blocking one: without
    # this wait the replay may read the old inputs (it did once for m = 4096, ta, on an H200)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    ref2 = 0.75 * (a2.T if ta else a2).astype(np.float64) @ (b.T if tb else b).astype(np.float64) - 0.5 * c
    assert_parity(cap, ref2.astype(np.float32), kind=kind, what="captured, new inputs")


@pytest.mark.gpu
def test_gpu_gemm_without_prepared_handle_inside_capture(cp):
    a = cp.ones((4, 4), np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(blas.BlasError, match="no prepared cuBLAS handle"):
                blas.gemm(a, a, cp.ones((4, 4), np.float32), stream=s)
        finally:
            s.end_capture()


class _QueuedStream:
    """Stands in for a stream whose owner is gone: what release_queued calls on it."""

    ptr = 0x5EED

    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("synchronize")


def test_release_queued_waits_for_the_end_of_a_capture(monkeypatch):
    """Inside a StepGraph capture (its kernel context) the queue is left alone: the synchronisation and
    cublasDestroy would invalidate the capture. Outside, every queued stream is synchronised, then released."""
    from cudarl import kernels

    log = []
    monkeypatch.setattr(blas, "_released", [_QueuedStream(log)])
    monkeypatch.setattr(blas, "release", lambda ptr: log.append(("release", ptr)))
    with kernels.use_context("train"):
        blas.release_queued()
    assert log == [] and len(blas._released) == 1
    blas.release_queued()
    assert log == ["synchronize", ("release", 0x5EED)] and blas._released == []


@pytest.mark.gpu
def test_gpu_release_queued_releases_a_dead_owners_handle_after_the_capture_not_inside(cp):
    import gc

    from cudarl.graph import SideStream, StepGraph

    owners = [SideStream(cp)]
    ptr = owners[0].stream.ptr
    seen = []

    def phase():
        owners.clear()  # the side stream's finalizer queues its stream, inside the capture
        blas.release_queued()
        seen.append(ptr in blas.prepared())

    g = StepGraph("train", [("drop", phase)], xp=cp)
    g.capture()
    assert seen == [True]
    gc.collect()
    blas.release_queued()
    assert ptr not in blas.prepared()


# --- gemm_lt: out = act(op(a) @ op(b) + bias), cuBLASLt with the bias/ReLU epilogue ------------
LT_EPILOGUES = [
    ("identity", False),
    ("relu", False),
    ("identity", True),
    ("relu", True),
]  # DEFAULT, RELU, BIAS, RELU_BIAS


def _lt_operands(rng, m, n, k, ta, tb, act, with_bias):
    """float32 operands and the float64 reference; the bias is scaled like the product, so the
    ReLU cuts a row-dependent part of every column (a bias on the wrong axis cannot pass)."""
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    bias = (np.sqrt(k) * rng.standard_normal(n)).astype(np.float32) if with_bias else None
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    if with_bias:
        ref += bias.astype(np.float64)
    if act == "relu":
        if (ref <= 0).all():  # e.g. one element: flip the signs so the ReLU keeps something to compare
            a, ref = -a, -ref
            bias = None if bias is None else -bias
        ref = np.maximum(ref, 0.0)
    return a, b, bias, ref


@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (7, 13, 5), (64, 33, 17)])
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("act,with_bias", LT_EPILOGUES)
def test_numpy_gemm_lt_against_float64(rng, m, n, k, ta, tb, act, with_bias):
    a, b, bias, ref = _lt_operands(rng, m, n, k, ta, tb, act, with_bias)
    out = np.full((m, n), np.nan, np.float32)
    blas.gemm_lt(a, b, out, bias=bias, act=act, trans_a=ta, trans_b=tb)
    assert_parity(out, ref.astype(np.float32))


def test_numpy_gemm_lt_bias_is_per_column():
    """``bias[j]`` lands on column j of every row (row-major ``x @ W + b``)."""
    out = np.full((3, 4), np.nan, np.float32)
    blas.gemm_lt(
        np.zeros((3, 2), np.float32),
        np.ones((2, 4), np.float32),
        out,
        bias=np.array([-1, 0, 1, 2], np.float32),
        act="relu",
    )
    assert out.tolist() == [[0, 0, 1, 2]] * 3


def test_gemm_lt_argument_errors():
    a, b, out = np.zeros((3, 4), np.float32), np.zeros((4, 5), np.float32), np.zeros((3, 5), np.float32)
    with pytest.raises(blas.BlasError, match="act must be one of"):
        blas.gemm_lt(a, b, out, act="sigmoid")
    with pytest.raises(blas.BlasError, match=r"bias must be a contiguous float32 \[5\]"):
        blas.gemm_lt(a, b, out, bias=np.zeros(3, np.float32))
    with pytest.raises(blas.BlasError, match="bias must be"):
        blas.gemm_lt(a, b, out, bias=np.zeros(5, np.float64))
    with pytest.raises(blas.BlasError, match="expected out 3x5"):
        blas.gemm_lt(a, b, np.zeros((3, 4), np.float32))
    with pytest.raises(blas.BlasError, match="inner dimension"):
        blas.gemm_lt(np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32), out)


def test_gemm_lt_plan_keys_count_alignment_up_to_16_bytes_and_the_bias_up_to_256():
    key = blas._lt_key(7, 5, 3, False, True, 0x1000, "relu", True, 0x1004, 0x2008, 0x3100)
    assert key == (7, 5, 3, False, True, 6, True, 4, 8, 16, 256, True, 3, 3, 5, 0, 0)  # packed pitches, no c
    assert blas._lt_key(7, 5, 3, False, False, 0, "identity", False, 0x100, 0x100, 0x100)[5] == 1  # no bias: DEFAULT
    assert blas._lt_key(7, 5, 3, False, False, 0x1010, "identity", False, 0x100, 0x100, 0x100)[5:] == (
        4,
        False,
        16,
        16,
        16,
        16,
        True,
        3,
        5,
        5,
        0,
        0,
    )
    assert blas._lt_key(7, 5, 3, False, True, 0x1000, "relu", True, 0x1004, 0x2008, 0x3100, split_k=False)[11] is False


def test_gemm_lt_plan_keys_carry_row_pitches():
    """A GEMM on views (a column block, every k-th row) gets a key of its own: its row pitches are the layouts'
    leading dimensions; packed pitches given are the default key's; a pitch shorter than its row is refused."""
    packed = blas._lt_key(8, 388, 128, False, False, 0x100, "identity", False, 0x100, 0x100, 0x100)
    assert (
        blas._lt_key(8, 388, 128, False, False, 0x100, "identity", False, 0x100, 0x100, 0x100, lds=(128, 388, 388))
        == packed
    )
    viewed = blas._lt_key(
        8, 388, 128, False, False, 0x100, "identity", False, 0x100, 0x100, 0x100, lds=(8192, 644, 644)
    )
    assert viewed[:12] == packed[:12] and viewed[12:15] == (8192, 644, 644) and viewed != packed
    assert blas.plan_key(8, 388, 128, bias_align=256, lds=(8192, 644, 644))[12:15] == (8192, 644, 644)
    assert "row pitches a/b/out 8192/644/644" in blas._describe(viewed) and "row pitches" not in blas._describe(packed)
    # a [8, 128] rows 8192 apart, b [128, 388] rows 644 apart, out [8, 388] rows 644 apart
    assert blas._extents(viewed) == (7 * 8192 + 128, 127 * 644 + 388, 7 * 644 + 388, 388, 0)
    assert blas._extents(packed) == (8 * 128, 128 * 388, 8 * 388, 388, 0)
    with pytest.raises(blas.BlasError, match="row pitches"):
        blas._lt_key(8, 388, 128, False, False, 0, "identity", False, 0x100, 0x100, 0x100, lds=(128, 300, 388))


def test_row_pitch_of_views():
    w = np.zeros((128, 644), np.float32)
    x = np.zeros((64 * 8, 128), np.float32)
    assert blas._row_pitch(w) == 644 and blas._row_pitch(w[:, 256:]) == 644 and blas._row_pitch(w[:, :256]) == 644
    assert blas._row_pitch(x[63::64]) == 64 * 128  # the last row of each group of 64
    assert blas._row_pitch(w[:1, 3:]) == 641 and blas._row_pitch(np.zeros((5, 0), np.float32)) == 1
    assert blas._row_pitch(w.T) == 0 and blas._row_pitch(w[::-1]) == 0 and blas._row_pitch(w[:, ::2]) == 0


def test_a_batch_of_one_has_the_packed_key():
    """gemm_lt_batched's [P, rows, cols] operands are packed entries for every P, 1 too: no 2-D row pitch is read
    from them (a batch of one's pitches once came from its 3-D shape, [1, 512, 64] read as 512, and every
    population of one failed on the GPU), and a single GEMM's 2-D operands give theirs."""
    a, b, out = np.zeros((1, 512, 64), np.float32), np.zeros((1, 64, 256), np.float32), np.zeros((1, 512, 256))
    assert blas._lds(a, b, out) is None
    assert blas._lds(a[0], b[0], out[0]) == (64, 256, 256)
    assert blas._lds(a[0, :, 8:], b[0, 1::2], out[0]) == (64, 512, 256)


@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
def test_gemm_and_gemm_lt_take_views_of_rows_on_numpy(rng, trans):
    """The NumPy side of a GEMM on views: the values of the same GEMM on packed copies, out's other columns
    and rows untouched (the top SSM block's column blocks of one projection, and its last bars)."""
    ta, tb = trans
    m, n, k = 10, 5, 7
    big, wide = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((12, 20)).astype(np.float32)
    a = big[3::4, 2 : 2 + k] if not ta else big[3 : 3 + k, 2 : 2 + m]  # every 4th row, or a column block
    b = wide[:k, 4 : 4 + n] if not tb else wide[:n, 4 : 4 + k]
    host = np.full((m + 3, n + 6), 7.0, np.float32)
    for fn, kw in ((blas.gemm, {}), (blas.gemm_lt, {"bias": np.arange(n, dtype=np.float32), "act": "relu"})):
        out = host.copy()
        view = out[1 : 1 + m, 2 : 2 + n]
        fn(a, b, view, trans_a=ta, trans_b=tb, **kw)
        want = np.empty((m, n), np.float32)
        fn(np.ascontiguousarray(a), np.ascontiguousarray(b), want, trans_a=ta, trans_b=tb, **kw)
        np.testing.assert_array_equal(view, want)
        keep = np.ones(out.shape, bool)
        keep[1 : 1 + m, 2 : 2 + n] = False
        assert (out[keep] == 7.0).all(), f"{fn.__name__} wrote outside its view"


# --- the residual c (cuBLASLt's C, beta = 1): h' = h + x W + b -----------------------------------------------
def _residual_operands(xp, rng, m, n, k, with_bias, group: int = 1):
    """a [m, k], b [k, n], the bias, the residual's parent h [group m, n] and its view c = h[group - 1 :: group]
    (the top block's last bar of each window; ``group`` 1: h itself), and the float64 reference."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    h = rng.standard_normal((group * m, n)).astype(np.float32)
    c = h[group - 1 :: group]
    ref = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    if with_bias:
        ref += bias.astype(np.float64)
    a, b, bias, h = (None if x is None else xp.asarray(x) for x in (a, b, bias, h))
    return a, b, bias, h, h[group - 1 :: group], ref


@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (7, 13, 5), (64, 32, 17)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_numpy_gemm_lt_with_a_residual_is_the_unfused_path_bitwise(rng, m, n, k, with_bias, group):
    """out = a b + bias + c: against float64, and bit for bit the unfused path's order (the GEMM with its bias,
    then seq.residual_add), the order the twin documents; c packed or every group-th row of h (its row pitch)."""
    from cudarl.reference import seq

    a, b, bias, h, c, ref = _residual_operands(np, rng, m, n, k, with_bias, group)
    out = np.full((m, n), np.nan, np.float32)
    blas.gemm_lt(a, b, out, bias=bias, c=c)
    assert_parity(out, ref.astype(np.float32), what=f"gemm_lt with c, bias={with_bias}, group={group}")
    branch = np.empty((m, n), np.float32)
    blas.gemm_lt(a, b, branch, bias=bias)
    unfused = np.empty((m, n), np.float32)
    seq.residual_add(h, branch, unfused)  # the last row of each group of h, plus the branch
    assert_bitwise(out, unfused, what="gemm_lt with c vs the GEMM then seq.residual_add")


def test_gemm_lt_residual_argument_errors(rng):
    """c: out's shape, float32, the same backend, rows evenly spaced, an identity epilogue, and no overlap with
    out unless it is out itself (cuBLASLt documents C == D only in place, with D's layout)."""
    a, b, out = np.zeros((3, 4), np.float32), np.zeros((4, 5), np.float32), np.zeros((3, 5), np.float32)
    with pytest.raises(blas.BlasError, match=r"c must be a float32 \(3, 5\) like out"):
        blas.gemm_lt(a, b, out, c=np.zeros((3, 4), np.float32))
    with pytest.raises(blas.BlasError, match="c must be a float32"):
        blas.gemm_lt(a, b, out, c=np.zeros((3, 5), np.float64))
    with pytest.raises(blas.BlasError, match="c must be C-contiguous or a view"):
        blas.gemm_lt(a, b, out, c=np.zeros((5, 3), np.float32).T)
    with pytest.raises(blas.BlasError, match="takes act='identity' only"):
        blas.gemm_lt(a, b, out, c=np.zeros((3, 5), np.float32), act="relu")
    big = np.zeros((4, 5), np.float32)
    with pytest.raises(blas.BlasError, match="c overlaps out"):
        blas.gemm_lt(a, b, big[1:], c=big[:3])  # two rows shared
    wide = np.zeros((3, 10), np.float32)
    with pytest.raises(blas.BlasError, match="c overlaps out"):  # interleaved column blocks: the spans overlap
        blas.gemm_lt(a, b, wide[:, :5], c=wide[:, 5:])
    side = np.zeros((6, 5), np.float32)
    blas.gemm_lt(a, b, side[:3], c=side[3:])  # adjacent, not overlapping: taken
    with pytest.raises(blas.BlasError, match="takes act='identity' only"):
        blas.plan_key(8, 8, 8, bias_align=0, act="relu", c_ld=8)
    with pytest.raises(blas.BlasError, match="has no c"):
        blas.plan_key(8, 8, 8, bias_align=0, split_k=False, batch=2, strides=(64, 64, 64, 0), c_ld=8)
    with pytest.raises(blas.BlasError, match="c's row pitch 7 is shorter than its rows of 8"):
        blas.plan_key(8, 8, 8, bias_align=0, c_ld=7)


def test_gemm_lt_in_place_adds_the_product_to_out(rng):
    """c = out (the same bytes and row pitch): out += a @ b (+ bias), the product's float32 sum then out added,
    the order of the residual's twin; a view with out's very layout is in place too."""
    a, b = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    bias, was = rng.standard_normal(4).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    out = was.copy()
    blas.gemm_lt(a, b, out, c=out, bias=bias)
    want = np.matmul(a, b)
    want += bias
    want += was
    np.testing.assert_array_equal(out, want)
    wide = np.zeros((6, 9), np.float32)
    wide[:, 2:6] = was
    blas.gemm_lt(a, b, wide[:, 2:6], c=wide[:, 2:6], bias=bias)
    np.testing.assert_array_equal(wide[:, 2:6], want)
    assert not wide[:, :2].any() and not wide[:, 6:].any()


def test_gemm_lt_plan_keys_carry_the_residual():
    """A GEMM with c is a plan of its own (beta 1, a C layout): its key's last two fields are c's alignment (up
    to 16 bytes) and row pitch, (0, 0) without c; the extents and the description name it."""
    plain = blas.plan_key(512, 128, 256, bias_align=256, split_k=False)
    packed = blas.plan_key(512, 128, 256, bias_align=256, split_k=False, c_ld=128)
    pitched = blas.plan_key(512, 128, 256, bias_align=256, split_k=False, c_ld=64 * 128)
    assert plain[15:] == (0, 0) and packed[15:] == (16, 128) and pitched[15:] == (16, 64 * 128)
    assert plain[:15] == packed[:15] == pitched[:15] and len({plain, packed, pitched}) == 3
    viewed = blas._lt_key(512, 128, 256, False, False, 0x100, "identity", False, 0x100, 0x100, 0x100,
                          c_ptr=0x2008, c_ld=8192)  # fmt: skip
    assert viewed[15:] == (8, 8192)
    assert blas._lt_key(512, 128, 256, False, False, 0, "identity", False, 16, 16, 16, c_ptr=0x100)[15:] == (16, 128)
    assert blas._extents(pitched)[4] == 511 * 64 * 128 + 128 and blas._extents(packed)[4] == 512 * 128
    one = blas.plan_key(1, 128, 256, bias_align=256, split_k=False, c_ld=64 * 128)
    assert one[15:] == (16, 128)  # one row: its pitch is its length, as blas._row_pitch reads a one-row view
    assert "residual c aligned to 16 bytes with row pitch 8192" in blas._describe(pitched)
    assert "residual" not in blas._describe(plain)
    assert blas._aligns(viewed) == (16, 16, 16, 8) and blas._aligns(plain) == (16, 16, 16, 16)
    probe = blas.plan_key(512, 128, 256, bias_align=256, split_k=False, c_ld=128, algo="probe")
    assert probe == packed + (1, 0, 0, 0, 0, "probe")  # a probed single GEMM with its residual


# GPU: shapes of the reference model (batch 512 and 2x512, 64 features, 256 hidden, 3x51 = 204 C51
# outputs), odd ones, single rows, and the IQN output (N = 3: rows of 12 bytes).
LT_SHAPES = [(512, 64, 256), (1024, 256, 256), (7, 256, 204), (7, 204, 256), (1, 204, 256), (1, 1, 1), (33, 3, 256)]


def _lt_kind(tf32):
    return {"rtol": 5e-3 if tf32 else 1e-5}


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", LT_SHAPES)
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("act,with_bias", LT_EPILOGUES)
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_lt_against_float64(cp, rng, m, n, k, ta, tb, act, with_bias, tf32):
    """cuBLASLt with each epilogue against float64 math: fp32 rel. error <= 1e-5, TF32 <= 5e-3."""
    a, b, bias, ref = _lt_operands(rng, m, n, k, ta, tb, act, with_bias)
    out = cp.empty((m, n), np.float32)
    poison(out)
    blas.gemm_lt(
        cp.asarray(a),
        cp.asarray(b),
        out,
        bias=None if bias is None else cp.asarray(bias),
        act=act,
        trans_a=ta,
        trans_b=tb,
        tf32=tf32,
    )
    assert_parity(out, ref.astype(np.float32), **_lt_kind(tf32), what=f"gemm_lt {act}{' + bias' if with_bias else ''}")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", LT_SHAPES + [(256, 256, 512), (512, 256, 1024)])
@pytest.mark.parametrize("ta,tb", TRANS)
def test_gpu_gemm_lt_without_split_k_against_float64(cp, rng, m, n, k, ta, tb):
    """split_k=False (one-kernel algorithms only: the heuristic must still find one for every shape,
    the backward's K = 512 and 1024 included) against float64 math, rel. error <= 1e-5."""
    a, b, bias, ref = _lt_operands(rng, m, n, k, ta, tb, "identity", False)
    out = cp.empty((m, n), np.float32)
    poison(out)
    blas.gemm_lt(cp.asarray(a), cp.asarray(b), out, trans_a=ta, trans_b=tb, split_k=False)
    assert_parity(out, ref.astype(np.float32), **_lt_kind(False), what="gemm_lt, no split-K")


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_and_gemm_lt_on_views_of_rows(cp, rng, ta, tb, tf32):
    """GEMMs on views whose rows are pitched (the SSM top block's shapes at a small batch: every 64th row of
    u, column blocks of the in-projection's weight and output): cuBLAS and cuBLASLt (bias and ReLU epilogue,
    split-K or not) against float64, nothing outside the view written, a plan prepared with the pitches used
    inside a capture, and its replay the eager call's bits."""
    from cudarl.graph import StepGraph

    W, d, ncol, E = 64, 128, 644, 256
    m, n, k = 8, ncol - E, d  # 8 samples' last bars x the xBC and dt columns
    u = cp.asarray(rng.standard_normal((m * W, d)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((d, ncol)) / np.sqrt(d)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(ncol).astype(np.float32))
    a = u[W - 1 :: W] if not ta else cp.ascontiguousarray(u[W - 1 :: W].T)[:, :]  # a^T stored [k, m]
    b = w[:, E:] if not tb else cp.ascontiguousarray(w[:, E:].T)  # b^T stored [n, k] packed
    a64 = cp.asnumpy(a).astype(np.float64)
    b64 = cp.asnumpy(b).astype(np.float64)
    ref = (a64.T if ta else a64) @ (b64.T if tb else b64)
    ref_lt = np.maximum(ref + cp.asnumpy(bias[E:]).astype(np.float64), 0.0)
    kind = "tf32" if tf32 else "float32"
    host = cp.full((m + 2, ncol), np.nan, np.float32)
    out = host[1 : 1 + m, E:]  # rows of 644 floats, the last 388 columns
    blas.gemm(a, b, out, trans_a=ta, trans_b=tb, tf32=tf32)
    assert_parity(out, ref.astype(np.float32), kind=kind, what="gemm on views")
    for split_k in (True, False):
        host[...] = np.nan
        blas.gemm_lt_prepare(
            m, n, k, bias=bias[E:], act="relu", trans_a=ta, trans_b=tb, tf32=tf32, split_k=split_k,
            lds=tuple(blas._row_pitch(x) for x in (a, b, out)),
        )  # fmt: skip
        blas.gemm_lt(a, b, out, bias=bias[E:], act="relu", trans_a=ta, trans_b=tb, tf32=tf32, split_k=split_k)
        assert_parity(out, ref_lt.astype(np.float32), **_lt_kind(tf32), what=f"gemm_lt on views, split_k={split_k}")
        rest = cp.asnumpy(host).copy()
        rest[1 : 1 + m, E:] = np.nan
        assert np.isnan(rest).all(), "gemm_lt wrote outside its view"
        eager = out.copy()
        g = StepGraph(
            "views",
            [("gemm_lt", lambda s=split_k: blas.gemm_lt(a, b, out, bias=bias[E:], act="relu", trans_a=ta,
                                                          trans_b=tb, tf32=tf32, split_k=s))],
        )  # fmt: skip
        out[...] = np.nan
        g.capture()
        g.replay()
        g.synchronize()
        assert_bitwise(out, eager, what=f"captured gemm_lt on views, split_k={split_k}")


# the encoders' fused residual GEMMs at small batches (SSM out-projection 256 -> 128, attention fc2 512 -> 128, the
# top block's one row a sample) and odd shapes; group 64: c is the last of each window's 64 rows
RESIDUAL_SHAPES = [(2048, 128, 256), (2048, 128, 512), (32, 128, 256), (7, 13, 5), (1, 8, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", RESIDUAL_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("group", [1, 64])
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_lt_with_a_residual_against_float64_graphed_equals_eager(cp, rng, m, n, k, with_bias, group, tf32):
    """out = a b + bias + c through cuBLASLt's C (beta 1), split-K or not: against float64 (fp32 1e-5, TF32
    5e-3) and the NumPy twin to rounding, every element of out written, h (c's parent) untouched, a plan
    prepared with c's row pitch used inside a capture, its replay the eager call's bits, and a replay after new
    contents of h reads them."""
    from cudarl.graph import StepGraph

    a, b, bias, h, c, ref = _residual_operands(cp, rng, m, n, k, with_bias, group)
    twin = np.empty((m, n), np.float32)
    blas.gemm_lt(cp.asnumpy(a), cp.asnumpy(b), twin, bias=None if bias is None else cp.asnumpy(bias), c=cp.asnumpy(c))
    h_host = cp.asnumpy(h)
    for split_k in (True, False):
        kw = dict(bias=bias, tf32=tf32, split_k=split_k)
        blas.gemm_lt_prepare(m, n, k, c_ld=group * n, **kw)
        out = cp.empty((m, n), np.float32)
        poison(out)
        blas.gemm_lt(a, b, out, c=c, **kw)
        what = f"gemm_lt with c, bias={with_bias}, group={group}, split_k={split_k}"
        assert_parity(out, ref.astype(np.float32), **_lt_kind(tf32), what=what)
        assert_parity(out, twin, **_lt_kind(tf32), what=f"{what}, vs the NumPy twin")
        assert_bitwise(h, h_host, what="h, c's parent (read only)")
        eager = out.copy()
        cap = cp.empty((m, n), np.float32)
        g = StepGraph("residual", [("gemm_lt", lambda kw=kw, cap=cap: blas.gemm_lt(a, b, cap, c=c, **kw))], xp=cp)
        g.capture()
        poison(cap)
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        assert_bitwise(cap, eager, what=f"{what}: graphed vs eager")
        h[...] = cp.asarray(rng.standard_normal(h.shape).astype(np.float32))
        blas.gemm_lt(a, b, eager, c=c, **kw)
        poison(cap)
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        assert_bitwise(cap, eager, what=f"{what}: graphed vs eager, new contents of h")
        h[...] = cp.asarray(h_host)


@pytest.mark.gpu
def test_gpu_gemm_lt_residual_plans_warm_probe_and_refuse_overlap(cp, rng):
    """warm_plans makes a residual key's plan through the driver (a capture then needs no eager call); the
    probe of a one-kernel residual GEMM adopts only an algorithm with its single plan's bits; c overlapping
    out is refused on the GPU too, and c = out adds in place."""
    from cudarl.graph import StepGraph

    m, n, k, group = 96, 20, 36, 3  # shapes no other test plans
    a, b, bias, h, c, ref = _residual_operands(cp, rng, m, n, k, True, group)
    key = blas.plan_key(m, n, k, bias_align=256, split_k=False, c_ld=group * n)
    assert key not in blas._plans
    cp.cuda.Device().synchronize()
    blas.warm_plans([key])
    assert key in blas._plans
    out = cp.empty((m, n), np.float32)
    g = StepGraph("residual_warm", [("gemm_lt", lambda: blas.gemm_lt(a, b, out, bias=bias, c=c, split_k=False))])
    g.capture()  # no eager call first: the warmed plan
    poison(out)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_parity(out, ref.astype(np.float32), what="a warmed residual plan, captured")
    single = cp.empty((m, n), np.float32)
    blas.gemm_lt(a, b, single, bias=bias, c=c, split_k=False)
    probed = cp.empty((m, n), np.float32)
    blas.gemm_lt(a, b, probed, bias=bias, c=c, split_k=False, algo="probe")
    assert_bitwise(probed, single, what="probed residual GEMM vs its single plan")
    with pytest.raises(blas.BlasError, match="c overlaps out"):
        blas.gemm_lt(a[1:], b, out[1:], bias=bias, c=out[:-1])
    # in place (C == D, out's very layout): out += a @ b + bias, one kernel, to float32 rounding
    was = out.copy()
    blas.gemm_lt_prepare(m, n, k, bias=bias, split_k=False, c_ld=n)
    blas.gemm_lt(a, b, out, bias=bias, c=out, split_k=False)
    want = a.get().astype(np.float64) @ b.get().astype(np.float64) + bias.get() + was.get()
    assert_parity(out, want.astype(np.float32), what="in place (c = out)")


@pytest.mark.gpu
def test_gpu_gemm_lt_bias_is_per_column(cp):
    """The row-major bias broadcast: with a = 0, every row of out is act(bias) (cuBLASLt adds its
    bias along the rows of the column-major C^T, which are the columns of out)."""
    m, n, k = 5, 7, 3
    bias = np.arange(n, dtype=np.float32) - 3.0
    out = cp.full((m, n), np.nan, np.float32)
    blas.gemm_lt(cp.zeros((m, k), np.float32), cp.ones((k, n), np.float32), out, bias=cp.asarray(bias), act="relu")
    assert out.get().tolist() == [np.maximum(bias, 0).tolist()] * m, "bias broadcast along the wrong axis"


@pytest.mark.gpu
@pytest.mark.parametrize("offsets", [(1, 0, 0, 0), (0, 2, 0, 0), (0, 0, 1, 0), (0, 0, 0, 4), (3, 1, 2, 4)])
def test_gpu_gemm_lt_operands_aligned_to_4_bytes(cp, rng, offsets):
    """Operand views starting off a 16-byte boundary (4 or 8 bytes) and a bias 16 but not 256-byte
    aligned get plans of their own (the heuristic is told) and stay correct."""
    m, n, k = 64, 36, 20
    a, b, bias, ref = _lt_operands(rng, m, n, k, False, False, "relu", True)

    def at(offset, arr):  # a C-contiguous copy of arr starting `offset` floats into a fresh buffer
        buf = cp.full(arr.size + 4, np.nan, np.float32)
        view = buf[offset : offset + arr.size].reshape(arr.shape)
        view[...] = cp.asarray(arr)
        return view

    ga, gb, gout, gbias = (
        at(offsets[0], a),
        at(offsets[1], b),
        at(offsets[2], np.full((m, n), np.nan, np.float32)),
        at(offsets[3], bias),
    )
    blas.gemm_lt(ga, gb, gout, bias=gbias, act="relu")
    assert_parity(gout, ref.astype(np.float32), what=f"offsets (floats) a/b/out/bias {offsets}")
    with pytest.raises(blas.BlasError, match="bias must start at a multiple of 16 bytes"):
        blas.gemm_lt(ga, gb, gout, bias=at(1, bias), act="relu")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(512, 64, 256), (7, 204, 256), (33, 3, 256)])
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("act,with_bias", LT_EPILOGUES)
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_lt_graphed_equals_eager_bitwise(cp, rng, m, n, k, ta, tb, act, with_bias, tf32):
    """A captured gemm_lt replays bit for bit like the eager call, reads its inputs' current
    contents at each replay, and keeps the bias pointer it was captured with (the pointer is a
    descriptor attribute shared by every call of the key)."""
    from cudarl.graph import StepGraph

    a, b, bias, _ = _lt_operands(rng, m, n, k, ta, tb, act, with_bias)
    da, db = cp.asarray(a), cp.asarray(b)
    dbias = None if bias is None else cp.asarray(bias)
    kw = dict(act=act, trans_a=ta, trans_b=tb, tf32=tf32)
    eager = cp.empty((m, n), np.float32)
    blas.gemm_lt(da, db, eager, bias=dbias, **kw)  # first call of the key: eager, makes the plan
    cap = cp.empty((m, n), np.float32)
    g = StepGraph("gemm_lt", [("gemm_lt", lambda: blas.gemm_lt(da, db, cap, bias=dbias, **kw))], xp=cp)
    g.capture()
    poison(cap)
    sync = cp.cuda.Device().synchronize  # eager calls and fills run on CuPy's stream, replays on the graph's
    sync()
    g.replay()
    g.synchronize()
    assert_bitwise(cap, eager, what="graphed vs eager")
    # new contents in the same buffers: the replay must read them
    da[...] = cp.asarray(rng.standard_normal(a.shape).astype(np.float32))
    if dbias is not None:
        dbias[...] = cp.asarray(rng.standard_normal(n).astype(np.float32))
    blas.gemm_lt(da, db, eager, bias=dbias, **kw)
    poison(cap)
    sync()
    g.replay()
    g.synchronize()
    assert_bitwise(cap, eager, what="graphed vs eager, new input contents")
    if dbias is None:
        return
    # a second graph of the same key with another bias array; each graph keeps its own pointer
    bias2 = cp.asarray(rng.standard_normal(n).astype(np.float32))
    cap2, eager2 = cp.empty((m, n), np.float32), cp.empty((m, n), np.float32)
    g2 = StepGraph("gemm_lt_2", [("gemm_lt", lambda: blas.gemm_lt(da, db, cap2, bias=bias2, **kw))], xp=cp)
    g2.capture()
    blas.gemm_lt(da, db, eager2, bias=bias2, **kw)
    poison(cap)
    poison(cap2)
    sync()
    g2.replay()
    g.replay()
    g.synchronize()
    g2.synchronize()
    assert_bitwise(cap2, eager2, what="second graph, its own bias")
    assert_bitwise(cap, eager, what="first graph after the second was captured, its own bias")


@pytest.mark.gpu
def test_gpu_gemm_lt_unplanned_key_inside_a_capture_says_run_eagerly_first(cp, rng):
    """A key's plan is made outside any capture (cuBLASLt's heuristic query can fail inside one);
    a capture that meets an unplanned key fails with a message saying what to do, and after one
    eager run the same graph captures and replays correctly."""
    from cudarl.graph import GraphCaptureError, StepGraph

    m, n, k = 13, 11, 9  # a shape no other test plans
    a, b, bias, ref = _lt_operands(rng, m, n, k, True, False, "relu", True)
    da, db, dbias = cp.asarray(a), cp.asarray(b), cp.asarray(bias)
    out = cp.empty((m, n), np.float32)
    g = StepGraph(
        "gemm_lt_unplanned",
        [("gemm_lt", lambda: blas.gemm_lt(da, db, out, bias=dbias, act="relu", trans_a=True))],
        xp=cp,
    )
    with pytest.raises(GraphCaptureError, match="run the step once eagerly first") as info:
        g.capture()
    assert isinstance(info.value.__cause__, blas.BlasError), info.value.__cause__
    assert not g.stream.is_capturing()
    g.run_eager()
    g.capture()
    poison(out)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_parity(out, ref.astype(np.float32), what="captured after one eager run")


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_lt_prepare_lets_a_first_call_be_captured(cp, rng, tf32):
    """gemm_lt_prepare makes the plan (running it once on scratch), so the key's first real call
    can be inside a capture: the path a network takes (QNetwork.new_workspace prepares its layers)."""
    from cudarl.graph import StepGraph

    m, n, k = 19, 23, 29  # a shape no other test plans
    a, b, bias, ref = _lt_operands(rng, m, n, k, False, False, "identity", True)
    da, db, dbias = cp.asarray(a), cp.asarray(b), cp.asarray(bias)
    blas.gemm_lt_prepare(m, n, k, bias=dbias, act="identity", tf32=tf32)
    out = cp.empty((m, n), np.float32)
    g = StepGraph("gemm_lt_prepared", [("gemm_lt", lambda: blas.gemm_lt(da, db, out, bias=dbias, tf32=tf32))], xp=cp)
    g.capture()
    poison(out)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_parity(out, ref.astype(np.float32), **_lt_kind(tf32), what="prepared, then captured")


@pytest.mark.gpu
def test_gpu_one_handle_and_workspace_per_stream_whatever_the_graphs(cp, rng):
    """The seed gave each parallel branch (forward and backward) a cuBLAS workspace of its own, 4 x 32 MB,
    and ran an H100 out of memory. Here a stream has one handle and one 32 MiB workspace, shared by every
    graph captured on it: four graphs on one stream, each captured, profiled phase by phase (a capture
    per phase) and replayed, with gemm, gemm_lt and a branch forked onto one side stream, allocate no
    workspace, and the stream's and the side stream's handles stay the same objects."""
    from cudarl.graph import SideStream, StepGraph

    blas.release_queued()  # earlier tests' finished owners: their releases must not land in the measurement
    s = cp.cuda.Stream(non_blocking=True)
    blas.prepare(s)
    side = SideStream(xp=cp)
    handles = {s.ptr: blas._handles[s.ptr], side.stream.ptr: blas._handles[side.stream.ptr]}
    a32, w32 = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    a, w, bias = cp.asarray(a32), cp.asarray(w32), cp.zeros(16, np.float32)
    outs = [[cp.empty((64, 16), np.float32) for _ in range(3)] for _ in range(4)]
    with s:
        blas.gemm_lt(a, w, outs[0][1], bias=bias, act="relu")  # the key's plan, made outside any capture
    s.synchronize()

    def phases(x, y, z):
        def branch():
            with side.fork():
                blas.gemm(a, w, z)
            side.join()

        def lt():
            blas.gemm_lt(a, w, y, bias=bias, act="relu")

        return [("gemm", lambda: blas.gemm(a, w, x)), ("gemm_lt", lt), ("branch", branch)]

    pool = cp.get_default_memory_pool()
    used = pool.used_bytes()
    graphs = [StepGraph(f"one_workspace_{i}", phases(*out), stream=s, xp=cp) for i, out in enumerate(outs)]
    for g, out in zip(graphs, outs, strict=True):
        g.capture()
        g.profile(repeats=1)  # a capture per phase too, on the same stream
        for x in out:
            poison(x)
        cp.cuda.Device().synchronize()
        g.replay()
    s.synchronize()
    grown = pool.used_bytes() - used
    for ptr, h in handles.items():
        assert blas._handles[ptr] is h, "a capture on a prepared stream made a cuBLAS handle of its own"
    assert grown < blas.WORKSPACE_BYTES, (
        f"four graphs on one stream allocated {grown / 2**20:.1f} MiB (a workspace is {blas.WORKSPACE_BYTES >> 20} MiB)"
    )
    ref = a32.astype(np.float64) @ w32.astype(np.float64)
    for x, y, z in outs:
        assert_parity(x, ref.astype(np.float32), what="gemm")
        assert_parity(y, np.maximum(ref, 0).astype(np.float32), what="gemm_lt")
        assert_parity(z, ref.astype(np.float32), what="gemm on the side stream")
    del graphs, g
    blas.release(s.ptr)


# --- gemm_lt_batched: out[i] = act(op(a[i]) @ op(b[i]) + bias[i]), one strided-batched cuBLASLt GEMM --
#: the bias stride of stacked parameters: each member's bias 256-byte aligned like a single agent's
#: (cudarl.nn.layers.PARAM_ALIGN_BYTES), so each entry keeps the single GEMM's plan key
BIAS_STRIDE_ALIGN = 64


def _padded(n: int, align: int = BIAS_STRIDE_ALIGN) -> int:
    return -(-n // align) * align


def _stacked(xp, rng, P, shape, stride=None, scale=1.0):
    """A float32 ``[P, *shape]`` of random entries ``stride`` elements apart (default packed) in one buffer;
    ``stride`` 0 is one entry shared by all (a broadcast view)."""
    size = int(np.prod(shape))
    stride = size if stride is None else stride
    buf = np.full(size + stride * (P - 1), np.nan, np.float32)
    host = np.lib.stride_tricks.as_strided(buf, (P, *shape), (4 * stride, *np.empty(shape, np.float32).strides))
    for i in range(P if stride else 1):
        host[i] = (scale * rng.standard_normal(shape)).astype(np.float32)
    if xp is np:
        return host
    dev = xp.asarray(buf)
    return xp.lib.stride_tricks.as_strided(dev, host.shape, host.strides)


def _batched_operands(xp, rng, P, m, n, k, ta, tb, with_bias, strides=(None, None, None)):
    a = _stacked(xp, rng, P, (k, m) if ta else (m, k), strides[0])
    b = _stacked(xp, rng, P, (n, k) if tb else (k, n), strides[1], scale=1 / np.sqrt(k))
    bias = _stacked(xp, rng, P, (n,), _padded(n), scale=np.sqrt(k) / 4) if with_bias else None
    out = _stacked(xp, rng, P, (m, n), strides[2])
    return a, b, bias, out


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("m,n,k", [(1, 5, 3), (7, 13, 5), (64, 33, 17)])
@pytest.mark.parametrize("ta,tb", TRANS)
@pytest.mark.parametrize("act,with_bias", LT_EPILOGUES)
def test_numpy_gemm_lt_batched_entry_is_the_single_gemm_bitwise(rng, P, m, n, k, ta, tb, act, with_bias):
    """The NumPy twin: entry i is gemm_lt of entry i, bit for bit (CPU parity of a population member with
    the agent alone stays bitwise), and within float32 rounding of float64 math."""
    a, b, bias, out = _batched_operands(np, rng, P, m, n, k, ta, tb, with_bias)
    poison(out)
    blas.gemm_lt_batched(a, b, out, bias=bias, act=act, trans_a=ta, trans_b=tb)
    for i in range(P):
        single = np.full((m, n), np.nan, np.float32)
        blas.gemm_lt(a[i], b[i], single, bias=None if bias is None else bias[i], act=act, trans_a=ta, trans_b=tb)
        assert_bitwise(out[i], single, what=f"entry {i} of {P}")
        ref = (a[i].T if ta else a[i]).astype(np.float64) @ (b[i].T if tb else b[i]).astype(np.float64)
        ref += 0.0 if bias is None else bias[i].astype(np.float64)
        want = (np.maximum(ref, 0) if act == "relu" else ref).astype(np.float32)
        if want.any():  # (a one-row entry may be all cut by the ReLU; the bitwise check above holds anyway)
            assert_parity(out[i], want, what=f"entry {i} of {P} against float64")


def test_numpy_gemm_lt_batched_takes_padded_and_shared_entries(rng):
    """Entries farther apart than packed (padded strides), and an operand shared by every entry (stride 0,
    e.g. one input for every member), leaving the padding untouched."""
    P, m, n, k = 4, 6, 8, 5
    a, b, bias, out = _batched_operands(np, rng, P, m, n, k, False, True, True, strides=(0, n * k + 12, m * n + 4))
    assert a.strides[0] == 0 and out.strides[0] == 4 * (m * n + 4)
    blas.gemm_lt_batched(a, b, out, bias=bias, act="relu", trans_b=True)
    for i in range(P):
        assert_bitwise(out[i], np.maximum(a[0] @ b[i].T + bias[i], 0), what=f"entry {i}")
    span = np.lib.stride_tricks.as_strided(out, (P - 1, m * n + 4), (out.strides[0], 4))  # entry + its gap
    assert np.isnan(span[:, m * n :]).all(), "the padding between entries was written"


def test_gemm_lt_batched_argument_errors(rng):
    """Each bad argument is named: rank, dtype, entry counts, overlapping outputs, negative strides,
    the bias's shape, the activation, an empty batch."""
    a, b, bias, out = _batched_operands(np, rng, 3, 4, 5, 6, False, False, True)
    cases = [
        (dict(a=a[0]), r"a must be 3-D"),
        (dict(out=out[0]), r"out must be 3-D"),
        (dict(b=b.astype(np.float64)), r"b must be float32"),
        (dict(a=a[:2]), r"a has 2 entries, out has 3"),
        (dict(bias=bias[:, 0]), r"bias must be 2-D"),
        (dict(bias=bias[:, :4]), r"bias must be a contiguous float32 \[5\]"),
        (dict(a=a[::-1]), r"a's batch stride must be a non-negative"),
        (dict(out=np.lib.stride_tricks.as_strided(out, strides=(4 * 7, 20, 4))), r"out's entries overlap"),
        (dict(b=np.zeros((3, 7, 5), np.float32)), r"expected out 4x5 and matching k"),
        (dict(a=np.zeros((3, 4, 6), np.float32)[:, :, ::2].copy()[:, :, :3]), r"expected out|matching k"),
        (dict(act="gelu"), r"gemm_lt_batched: act must be one of"),
        (
            dict(a=a[:0], b=b[:0], out=out[:0], bias=bias[:0]),
            r"at least 1 entry",
        ),
    ]
    for change, match in cases:
        kw = dict(a=a, b=b, out=out, bias=bias, act="relu") | change
        with pytest.raises(blas.BlasError, match=match):
            blas.gemm_lt_batched(kw.pop("a"), kw.pop("b"), kw.pop("out"), **kw)
    strided_rows = np.zeros((3, 4, 12), np.float32)[:, :, ::2]  # entries that are not C-contiguous
    with pytest.raises(blas.BlasError, match="a must be C-contiguous"):
        blas.gemm_lt_batched(strided_rows, b, out)


def test_batched_plan_keys_extend_the_single_key():
    """A batch of 1 is the single GEMM's key (same plan, same call); a batch appends its count and the
    strides of a, b, out and the bias; plan_key names it, and the extents cover the last entry."""
    single = blas.plan_key(512, 256, 64, bias_align=256, act="relu", split_k=False)
    strides = (512 * 64, 64 * 256, 512 * 256, 256)
    assert blas._batch_key(single, 1, strides) == single
    batched = blas.plan_key(512, 256, 64, bias_align=256, act="relu", split_k=False, batch=64, strides=strides)
    assert batched == single + (64,) + strides + ("single",)
    assert blas._extents(batched) == (512 * 64 * 64, 64 * 256 * 64, 512 * 256 * 64, 256 * 63 + 256, 0)
    assert blas._extents(single) == (512 * 64, 64 * 256, 512 * 256, 256, 0)
    assert "batch 64 with strides a/b/out/bias 32768/16384/131072/256 elements, algo single" in blas._describe(batched)
    with pytest.raises(blas.BlasError, match="a batch needs its strides"):
        blas.plan_key(512, 256, 64, bias_align=256, batch=64, split_k=False)
    with pytest.raises(blas.BlasError, match="split_k=False"):
        blas.plan_key(512, 256, 64, bias_align=256, batch=64, strides=strides)


def test_batched_plan_keys_carry_the_algo_choice_and_numpy_ignores_it(rng):
    """net.batched_algo's values (blas.BATCHED_ALGOS) are the last element of a batched key, so a "probe"
    plan is a plan of its own beside the "single" one; a batch of 1 is the single key under "single" and a
    probed single GEMM's key of its own under "probe" (one-kernel only); an unknown choice is refused by
    name; NumPy runs the same math under either."""
    strides = (512 * 64, 64 * 256, 512 * 256, 256)
    kw = dict(bias_align=256, act="relu", split_k=False, batch=64, strides=strides)
    single, probe = (blas.plan_key(512, 256, 64, algo=algo, **kw) for algo in ("single", "probe"))
    assert blas.BATCHED_ALGOS == ("single", "probe")
    assert single[:-1] == probe[:-1] and (single[-1], probe[-1]) == ("single", "probe")
    assert blas.plan_key(512, 256, 64, **kw) == single  # the default
    assert blas._extents(probe) == blas._extents(single)
    assert "algo probe" in blas._describe(probe)
    base = blas.plan_key(512, 256, 64, bias_align=256, act="relu", split_k=False)
    assert blas._batch_key(base, 1, strides, "single") == base
    one = blas.plan_key(512, 256, 64, bias_align=256, act="relu", split_k=False, algo="probe")
    assert blas._batch_key(base, 1, strides, "probe") == one == base + (1, 0, 0, 0, 0, "probe")
    assert blas._extents(one) == blas._extents(base) and "batch 1" in blas._describe(one)
    with pytest.raises(blas.BlasError, match="algo='probe' compares one-kernel algorithms"):
        blas.plan_key(512, 256, 64, bias_align=256, algo="probe")  # split_k defaults to True
    with pytest.raises(blas.BlasError, match=r"plan_key: algo must be one of \('single', 'probe'\), got 'best'"):
        blas.plan_key(512, 256, 64, algo="best", **kw)
    a, b, bias, out = _batched_operands(np, rng, 3, 7, 13, 5, False, True, True)
    want = out.copy()
    blas.gemm_lt_batched(a, b, want, bias=bias, act="relu", trans_b=True)
    blas.gemm_lt_batched(a, b, out, bias=bias, act="relu", trans_b=True, algo="probe")
    assert_bitwise(out, want, what="NumPy under algo='probe'")
    with pytest.raises(blas.BlasError, match="gemm_lt_batched: algo must be one of"):
        blas.gemm_lt_batched(a, b, out, algo="fast", trans_b=True)
    with pytest.raises(blas.BlasError, match="gemm_lt_prepare: algo must be one of"):
        blas.gemm_lt_prepare(7, 13, 5, batch=3, split_k=False, algo="fast")


def test_algorithm_records_read_the_tile_table():
    """batched_plan_info's tile names: cublasLtMatmulTile_t's 36 values of cublasLt.h by index."""
    assert len(blas._TILES) == 36 and blas._TILES[0] == "undefined" and blas._TILES[20] == "128x128"
    assert blas._TILES[35] == "256x32" and blas._TILES[15] == "64x64"


def test_batched_plan_info_copies_the_probe_records(monkeypatch):
    """batched_plan_info's record of a probe plan (a fake plan here, no GPU): every probed candidate's
    equal verdict and time, the single's time, the chosen index and the kept verdict's recall, as copies
    (changing them changes no plan); the algorithms read through _algo_config; a plan that was never
    probed against the cache (recall None) says None."""
    probes = [{"algo_id": 21, "tile_name": "256x128", "stages": 3, "equal": False, "us": None},
              {"algo_id": 21, "tile_name": "128x128", "stages": 3, "equal": True, "us": 7.0}]  # fmt: skip
    info = {"shape": "[512x13] x [13x256]", "batch": 8, "mode": "probe", "candidates": 3, "probed": 2,
            "equal": [False, True], "probes": probes, "single_us": 9.0, "chosen_index": 1, "changed": True}  # fmt: skip
    recall = {"entry": "stem", "outcome": "taken"}
    plan = SimpleNamespace(info=info, single_algo="single", algo="chosen", recall=recall)
    monkeypatch.setitem(blas._plans, ("fake",), plan)
    unrecalled = SimpleNamespace(info=dict(info), single_algo="s", algo="s", recall=None)
    monkeypatch.setitem(blas._plans, ("unrecalled",), unrecalled)
    monkeypatch.setattr(blas, "_algo_config", lambda algo: {"tile_name": algo})
    info_all = blas.batched_plan_info()
    r = info_all[("fake",)]
    assert (r["single"], r["chosen"]) == ({"tile_name": "single"}, {"tile_name": "chosen"})
    assert r["probes"] == probes and r["equal"] == [False, True] and (r["single_us"], r["chosen_index"]) == (9.0, 1)
    assert r["recall"] == recall and info_all[("unrecalled",)]["recall"] is None
    r["probes"][1]["us"], r["equal"][0], r["recall"]["outcome"] = 1.0, True, "no entry"
    assert probes[1]["us"] == 7.0 and info["equal"] == [False, True] and recall["outcome"] == "taken"


def test_probe_timer_times_a_graph_of_repeats_and_takes_the_median(monkeypatch):
    """_EventTimer against a fake driver (no GPU): launch() runs PROBE_REPEATS times inside one capture on
    the timer's own stream, the graph is replayed 2 * PROBE_WARMUP + 2 times, the warm-up replays are not
    counted, the result is the median timed replay over PROBE_REPEATS (us), and everything is freed."""
    calls, elapsed = [], iter([99.0] * blas.PROBE_WARMUP + [3.0, 1.5, 6.0, 1.5, 3.0])  # ms per replay

    class FakeDriver:
        def __getattr__(self, name):
            def fn(*args):
                calls.append(name)
                if name in ("cuStreamCreate", "cuEventCreate", "cuStreamEndCapture", "cuGraphInstantiateWithFlags"):
                    out = next(a for a in args if hasattr(a, "_obj"))  # the handle, written through its pointer
                    out._obj.value = 0x1000 + len(calls)
                return 0

            return fn

        def event_elapsed_time(self, ms, start, end):
            ms._obj.value = next(elapsed)
            return 0

    monkeypatch.setattr(blas, "_cu", lambda: FakeDriver())
    timer = blas._EventTimer()
    streams = []
    us = timer.median_us(lambda t: (streams.append(t), calls.append("launch")))
    assert us == pytest.approx(3.0 * 1e3 / blas.PROBE_REPEATS, rel=1e-6)
    assert streams == [timer.stream.value] * blas.PROBE_REPEATS and timer.stream.value
    begin, end = calls.index("cuStreamBeginCapture_v2"), calls.index("cuStreamEndCapture")
    assert calls[begin + 1 : end] == ["launch"] * blas.PROBE_REPEATS
    assert calls.count("cuGraphLaunch") == 2 * blas.PROBE_WARMUP + 2
    assert calls.count("cuGraphExecDestroy") == calls.count("cuGraphDestroy") == 1
    timer.destroy()
    assert calls.count("cuEventDestroy_v2") == 2 and calls.count("cuStreamDestroy_v2") == 1


def test_batched_strides_must_keep_each_entry_in_entry_0s_alignment_class():
    """Entry i alone must get entry 0's plan: a stride of 204 floats (816 bytes) between 256-byte aligned
    biases would put entry 1 at 16-byte alignment, a plan key of its own, maybe another algorithm."""
    key = blas._lt_key(512, 204, 256, False, False, 0x10000, "identity", False, 0x20000, 0x30000, 0x40000)
    ptrs = (0x20000, 0x30000, 0x40000, 0x10000)
    blas._check_entry_alignment(key, ptrs, (512 * 256, 256 * 204, 512 * 204, 256), 64)
    blas._check_entry_alignment(key, ptrs, (0, 0, 512 * 204, 0), 64)  # shared operands: one address
    blas._check_entry_alignment(key, ptrs, (3, 3, 3, 3), 1)  # a batch of 1 has one entry
    with pytest.raises(blas.BlasError, match=r"bias's batch stride \(816 bytes\).*multiple of 256 bytes"):
        blas._check_entry_alignment(key, ptrs, (512 * 256, 256 * 204, 512 * 204, 204), 64)
    with pytest.raises(blas.BlasError, match=r"a's batch stride \(4100 bytes\).*multiple of 16 bytes"):
        blas._check_entry_alignment(key, ptrs, (1025, 0, 512 * 204, 256), 2)
    # a view 4 bytes into its buffer: entries 4 bytes apart alternate between 4- and 8-byte alignment
    odd = (0x20004,) + ptrs[1:]
    blas._check_entry_alignment(key, odd, (2, 0, 512 * 204, 256), 3)
    with pytest.raises(blas.BlasError, match=r"a's batch stride \(4 bytes\).*entry 0's 4 bytes.*multiple of 8"):
        blas._check_entry_alignment(key, odd, (1, 0, 512 * 204, 256), 3)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("name,m,n,k,ta,tb,act,with_bias", STEP_GEMMS, ids=[g[0] for g in STEP_GEMMS])
def test_gpu_gemm_lt_batched_entry_is_the_single_gemm_bitwise(cp, rng, name, m, n, k, ta, tb, act, with_bias, P, tf32):
    """Issue 23's rule for the agent axis: entry i of one strided-batched GEMM equals the single
    gemm_lt(split_k=False) of entry i bit for bit (the batch runs the single plan's algorithm), for the
    reference step's shapes, with members' parameters stacked as a population would (biases 256-byte
    aligned); and the last entry is within the float32 (TF32) tolerance of float64 math."""
    a, b, bias, out = _batched_operands(cp, rng, P, m, n, k, ta, tb, with_bias)
    kw = dict(act=act, trans_a=ta, trans_b=tb, tf32=tf32)
    poison(out)
    blas.gemm_lt_batched(a, b, out, bias=bias, **kw)
    got = out.get()
    single = cp.empty((m, n), np.float32)
    for i in range(P):
        poison(single)
        blas.gemm_lt(a[i], b[i], single, bias=None if bias is None else bias[i], split_k=False, **kw)
        assert_bitwise(got[i], single, what=f"{name}: entry {i} of {P} vs its single GEMM")
    ha, hb = a[-1].get().astype(np.float64), b[-1].get().astype(np.float64)
    ref = (ha.T if ta else ha) @ (hb.T if tb else hb) + (0.0 if bias is None else bias[-1].get().astype(np.float64))
    ref = np.maximum(ref, 0) if act == "relu" else ref
    assert_parity(got[-1], ref.astype(np.float32), **_lt_kind(tf32), what=f"{name}: entry {P - 1} vs float64")


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_gemm_lt_batched_prepared_then_captured_with_a_shared_operand(cp, rng, tf32):
    """gemm_lt_prepare(batch=...) makes the batch's plan (and its single GEMM's) before capture, so the
    key's first real call can be captured; one operand shared by every entry (stride 0) and padded
    output entries; the replay equals each entry's single GEMM bit for bit and leaves the padding alone."""
    from cudarl.graph import StepGraph

    P, m, n, k = 5, 37, 44, 28  # a shape no other test plans
    strides = (0, k * n, m * n + 4)
    a, b, bias, out = _batched_operands(cp, rng, P, m, n, k, False, False, True, strides=strides)
    blas.gemm_lt_prepare(m, n, k, bias=bias, act="relu", tf32=tf32, split_k=False, batch=P, strides=strides)
    g = StepGraph(
        "gemm_lt_batched",
        [("gemm", lambda: blas.gemm_lt_batched(a, b, out, bias=bias, act="relu", tf32=tf32))],
        xp=cp,
    )
    g.capture()
    poison(out)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    got = out.get()
    single = cp.empty((m, n), np.float32)
    for i in range(P):
        blas.gemm_lt(a[0], b[i], single, bias=bias[i], act="relu", tf32=tf32, split_k=False)
        assert_bitwise(got[i], single, what=f"captured entry {i} of {P}")
    span = cp.lib.stride_tricks.as_strided(out, (P - 1, m * n + 4), (out.strides[0], 4))
    assert bool(cp.isnan(span[:, m * n :]).all()), "the padding between output entries was written"


@pytest.mark.gpu
def test_gpu_gemm_lt_batched_refuses_strides_that_would_change_an_entrys_plan(cp):
    """Biases 204 floats apart put entry 1 at 16-byte alignment while entry 0 has 256: entry 1 alone
    would get a plan key of its own, so the batch is refused with the stride to use."""
    P, m, n, k = 2, 8, 204, 16
    a, b, out = cp.zeros((P, m, k), np.float32), cp.zeros((P, k, n), np.float32), cp.empty((P, m, n), np.float32)
    with pytest.raises(blas.BlasError, match=r"bias's batch stride \(816 bytes\)"):
        blas.gemm_lt_batched(a, b, out, bias=cp.zeros((P, n), np.float32))
    with pytest.raises(blas.BlasError, match="all be NumPy arrays or all CuPy arrays"):
        blas.gemm_lt_batched(a, np.zeros((P, k, n), np.float32), out)


# --- net.batched_algo = "probe": a batched candidate adopted only where its bits are the single algorithm's --
#: the reference MLP's GEMMs at 512 rows (13 -> 256 -> 256 -> 204: forwards with and without their
#: epilogues, dx, dW) beside the reference step's (bench_gemm.STEP_GEMMS)
PROBE_GEMMS = [
    *(
        (f"fwd {k}->{n} {act}{' + bias' if bias else ''}", 512, n, k, False, False, act, bias)
        for k, n in ((13, 256), (256, 256), (256, 204))
        for act, bias in LT_EPILOGUES
    ),
    *((f"dx {n}<-{k}", 512, n, k, False, True, "identity", False) for n, k in ((13, 256),)),
    *((f"dW {m}x{n}", m, n, 512, True, False, "identity", False) for m, n in ((13, 256),)),
    *STEP_GEMMS,
]


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("P", [8, 64])
@pytest.mark.parametrize("name,m,n,k,ta,tb,act,with_bias", PROBE_GEMMS, ids=[g[0] for g in PROBE_GEMMS])
def test_gpu_batched_probe_plan_is_bitwise_the_single_plan(cp, rng, name, m, n, k, ta, tb, act, with_bias, P, tf32):
    """A batched plan under algo="probe" (its own key: the fastest of the single algorithm and the
    heuristic's batched candidates whose probe output is bitwise the single algorithm's) gives the same
    bits as the plan under "single" on other random operands than the probe's, entry by entry; what it
    chose is in batched_plan_info, the fastest of its recorded times."""
    a, b, bias, out = _batched_operands(cp, rng, P, m, n, k, ta, tb, with_bias)
    kw = dict(bias=bias, act=act, trans_a=ta, trans_b=tb, tf32=tf32)
    got = {}
    for algo in ("single", "probe"):
        poison(out)
        blas.gemm_lt_batched(a, b, out, algo=algo, **kw)
        got[algo] = out.get()
    for i in range(P):
        assert_bitwise(got["probe"][i], got["single"][i], what=f"{name}: entry {i} of {P}, probe vs single")
    records = [r for r in blas.batched_plan_info().values() if r["mode"] == "probe" and r["batch"] == P]
    mine = [r for r in records if (r["m"], r["n"], r["k"], r["tf32"]) == (m, n, k, tf32)]
    assert mine, f"{name}: no batched_plan_info record of the probe plan"
    for r in mine:
        _assert_probe_chose_the_fastest(r)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_a_probe_verdict_kept_on_disk_is_taken_by_the_next_build(cp, rng, monkeypatch, tmp_path, tf32):
    """A probe's verdict is written under $CUDARL_CACHE_DIR/probes; the same plan made again (as a new
    process would: the plan dropped) takes it without probing (``cached``), adopts the same algorithm and
    gives the same bits as the single algorithm, entry by entry; another folder probes again."""
    P, m, n, k = 64, 512, 256, 256  # the reference MLP's hidden layer, a population of 64
    a, b, bias, out = _batched_operands(cp, rng, P, m, n, k, False, False, True)
    kw = dict(bias=bias, act="relu", tf32=tf32)
    poison(out)
    blas.gemm_lt_batched(a, b, out, algo="single", **kw)
    want = out.get()

    def build(folder):
        monkeypatch.setenv("CUDARL_CACHE_DIR", str(folder))
        for key in [key for key, r in blas.batched_plan_info().items() if r["mode"] == "probe" and r["batch"] == P]:
            blas._plans.pop(key).destroy()  # as a new process: no plan of this key yet
        poison(out)
        blas.gemm_lt_batched(a, b, out, algo="probe", **kw)
        for i in range(P):
            assert_bitwise(out[i].get(), want[i], what=f"entry {i} of {P}, probe vs single")
        (r,) = [r for r in blas.batched_plan_info().values() if r["mode"] == "probe" and r["batch"] == P]
        return r

    first = build(tmp_path / "a")
    assert not first["cached"] and len(list((tmp_path / "a" / "probes").glob("*.json"))) == 1
    second = build(tmp_path / "a")
    assert second["cached"], "the kept verdict was not taken"
    assert second["chosen"] == first["chosen"] and second["probes"] == first["probes"]
    assert not build(tmp_path / "b")["cached"]


@pytest.mark.gpu
def test_gpu_batched_plan_info_probe_records_say_what_each_plan_chose(cp, rng):
    """batched_plan_info(): per batched key, shape, batch, the single plan's algorithm and the chosen one
    (id, tile, stages, ...), the candidates the heuristic returned, how many were probed and each verdict
    and time (equal ones timed, others not); the single's time where any was equal; a plan "changed"
    exactly when an equal candidate's time is below the single's, the chosen one the fastest."""
    P, m, n, k = 8, 512, 256, 13  # the reference MLP's first layer
    a, b, bias, out = _batched_operands(cp, rng, P, m, n, k, False, False, True)
    for algo in ("single", "probe"):
        blas.gemm_lt_batched(a, b, out, bias=bias, act="relu", algo=algo)
    info = blas.batched_plan_info()
    keys = {algo: blas._batch_key(blas._lt_key(m, n, k, False, False, bias.data.ptr, "relu", False,
            a.data.ptr, b.data.ptr, out.data.ptr, False), P, (m * k, k * n, m * n, _padded(n)), algo)
            for algo in ("single", "probe")}  # fmt: skip
    fields = {"shape", "m", "n", "k", "trans_a", "trans_b", "epilogue", "tf32", "batch", "mode", "single",
              "chosen", "candidates", "probed", "equal", "probes", "single_us", "chosen_index", "changed"}  # fmt: skip
    algo_fields = {"algo_id", "tile", "tile_name", "stages", "splitk", "reduction", "swizzle", "custom"}
    for algo, key in keys.items():
        r = info[key]
        assert fields <= set(r), f"{algo}: fields {sorted(fields - set(r))} missing"
        assert algo_fields <= set(r["single"]) and algo_fields <= set(r["chosen"])
        assert (r["shape"], r["batch"], r["mode"]) == (f"[{m}x{k}] x [{k}x{n}]", P, algo)
        assert r["probed"] == len(r["equal"]) <= r["candidates"] <= blas.PROBE_CANDIDATES
        assert r["single"]["splitk"] <= 1 and r["chosen"]["splitk"] <= 1, "a batch runs one-kernel algorithms"
    single, probe = info[keys["single"]], info[keys["probe"]]
    assert single["probed"] == single["candidates"] == 0 and not single["changed"]
    assert single["chosen"] == single["single"] == probe["single"]
    assert probe["candidates"] >= 1, "the heuristic returned no candidate for the batched problem"
    assert single["probes"] == [] and single["single_us"] is None and single["chosen_index"] is None
    _assert_probe_chose_the_fastest(probe)
    print(f"probe record: {probe}")


def _assert_probe_chose_the_fastest(r: dict) -> None:
    """A probe record's choice is the fastest of its recorded times: the single algorithm unless an equal
    candidate's time is below the single's, then the fastest such candidate (the first of equal times)."""
    assert len(r["probes"]) == r["probed"] == len(r["equal"]) <= r["candidates"]
    assert [p["equal"] for p in r["probes"]] == r["equal"]
    for p in r["probes"]:
        assert (p["us"] is not None) == p["equal"], f"{r['shape']}: only the equal candidates are timed: {p}"
        assert p["us"] is None or p["us"] > 0
    timed = [(p["us"], i) for i, p in enumerate(r["probes"]) if p["equal"]]
    if not timed:
        assert r["single_us"] is None and r["chosen_index"] is None and not r["changed"]
        assert r["chosen"] == r["single"]
        return
    assert r["single_us"] > 0
    best_us, best_i = min(timed)
    if best_us < r["single_us"]:
        assert r["changed"] and r["chosen_index"] == best_i, f"{r['shape']}: not the fastest: {r}"
        p = r["probes"][best_i]
        assert (r["chosen"]["algo_id"], r["chosen"]["tile_name"]) == (p["algo_id"], p["tile_name"])
    else:
        assert not r["changed"] and r["chosen_index"] is None and r["chosen"] == r["single"]


@pytest.mark.gpu
def test_gpu_batched_probe_is_refused_inside_a_capture(cp):
    """A probe plan first met inside a capture is refused (plans, and their probes, are made before)."""
    from cudarl.graph import StepGraph

    P, m, n, k = 3, 40, 24, 12  # a shape no other test plans
    a, b, out = cp.zeros((P, m, k), np.float32), cp.zeros((P, k, n), np.float32), cp.zeros((P, m, n), np.float32)
    blas.gemm_lt(a[0], b[0], out[0], split_k=False)  # the single plan exists; the batched one does not
    g = StepGraph("probe_in_capture", [("gemm", lambda: blas.gemm_lt_batched(a, b, out, algo="probe"))], xp=cp)
    with pytest.raises(Exception, match="inside a capture"):
        g.capture()
