"""The lane -> (row, column) arithmetic of cuda_src/ssm.cu's tensor-core products (tile_gemm_tc, tile_gemm2_tc),
replayed in NumPy over a warp's 32 lanes. No GPU: this holds the index arithmetic, not the hardware.

Two mappings meet here. ``ptx_a``, ``ptx_b`` and ``ptx_c`` transcribe the PTX ISA's table (9.7.14.5.7 "Matrix
Fragments for mma.m16n8k8", Figures 72, 75 and 77: .tf32 A and B, .f32 C and D): where the hardware takes each
lane's registers from and where it puts the results. ``Lane``, ``step``, ``acc_range``, ``tile_gemm_tc`` and
``tile_gemm2_tc`` mirror ssm.cu's TcLane, tc_step, tc_acc, tile_gemm_tc and tile_gemm2_tc expression by
expression: which a(i, k) and b(k, j) a lane loads into which register, and to which out(i, j) it stores which
accumulator. The emulated mma scatters the 32 lanes' registers by the PTX table, multiplies, and gathers the
result by it; the stored products must then be A @ B (float64 values, no TF32 rounding: indices only), every
(i, j) stored once, and no operand read out of range, for shapes that are and are not multiples of the
fragment, several fragments a warp tile, and tile_gemm2's triangular k ranges. A change to the kernel's index
expressions must be mirrored here.
"""

import numpy as np
import pytest

TC_M, TC_N, TC_K = 16, 8, 8


# --- the PTX ISA's fragment table (the hardware) ---------------------------------------------------------
def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of register a_i of ``lane`` in A [16 x 8]: row g for a0, a2 and g + 8 for a1, a3; col t for
    a0, a1 and t + 4 for a2, a3."""
    g, t = lane >> 2, lane % 4
    return (g if i in (0, 2) else g + 8), (t if i in (0, 1) else t + 4)


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of b_i in B [8 x 8]: row t for b0, t + 4 for b1; col g."""
    g, t = lane >> 2, lane % 4
    return (t if i == 0 else t + 4), g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of c_i (and d_i) in C [16 x 8]: row g for c0, c1 and g + 8 for c2, c3; col 2 t + (i & 1)."""
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), 2 * t + (i & 1)


def mma(a_regs, b_regs, c_regs):
    """mma.sync.aligned.m16n8k8.row.col over a warp: registers [32, 4], [32, 2], [32, 4] -> d [32, 4]."""
    A, B, C = np.full((TC_M, TC_K), np.nan), np.full((TC_K, TC_N), np.nan), np.full((TC_M, TC_N), np.nan)
    for lane in range(32):
        for i in range(4):
            A[ptx_a(lane, i)] = a_regs[lane][i]
            C[ptx_c(lane, i)] = c_regs[lane][i]
        for i in range(2):
            B[ptx_b(lane, i)] = b_regs[lane][i]
    assert not (np.isnan(A).any() or np.isnan(B).any() or np.isnan(C).any()), "the lanes do not cover a fragment"
    D = A @ B + C
    return np.array([[D[ptx_c(lane, i)] for i in range(4)] for lane in range(32)])


# --- ssm.cu's side, expression by expression --------------------------------------------------------------
class Lane:
    """TcLane<NF>(i0, j0, M, Nn) of thread ``lane``."""

    def __init__(self, lane: int, NF: int, i0: int, j0: int, M: int, Nn: int):
        g = lane >> 2
        self.t, self.j0 = lane & 3, j0
        self.r = [i0 + g + 8 * h for h in range(2)]
        self.r_ok = [r < M for r in self.r]
        self.c = [j0 + TC_N * f + g for f in range(NF)]
        self.c_ok = [c < Nn for c in self.c]

    def col(self, f: int, e: int) -> int:
        return self.j0 + TC_N * f + 2 * self.t + (e & 1)


def step(acc, lanes, NF: int, kcheck: bool, k: int, k1: int, a, b) -> None:
    """tc_step<NF, KCHECK> for every lane of the warp (the mma is the warp's)."""
    af, bf = [], [[] for _ in range(NF)]
    for lane in lanes:
        ka = k + lane.t
        kb = ka + 4
        ka_ok, kb_ok = (not kcheck) or ka < k1, (not kcheck) or kb < k1
        af.append(
            [
                a(lane.r[0], ka) if lane.r_ok[0] and ka_ok else 0.0,
                a(lane.r[1], ka) if lane.r_ok[1] and ka_ok else 0.0,
                a(lane.r[0], kb) if lane.r_ok[0] and kb_ok else 0.0,
                a(lane.r[1], kb) if lane.r_ok[1] and kb_ok else 0.0,
            ]
        )
        for f in range(NF):
            bf[f].append(
                [
                    b(ka, lane.c[f]) if lane.c_ok[f] and ka_ok else 0.0,
                    b(kb, lane.c[f]) if lane.c_ok[f] and kb_ok else 0.0,
                ]
            )
    for f in range(NF):
        acc[:, f] = mma(af, bf[f], acc[:, f])


def acc_range(acc, lanes, NF: int, k0: int, k1: int, a, b) -> None:
    """tc_acc: full steps of 8, then the last one checked."""
    k = k0
    while k + TC_K <= k1:
        step(acc, lanes, NF, False, k, k1, a, b)
        k += TC_K
    if k < k1:
        step(acc, lanes, NF, True, k, k1, a, b)


def warp_tiles(M: int, Nn: int, NF: int):
    """tc_tiles and the loop's (i0, j0) of each warp tile (any warp takes it: the order changes nothing)."""
    J = (Nn + TC_N * NF - 1) // (TC_N * NF)
    for w in range(((M + TC_M - 1) // TC_M) * J):
        yield (w // J) * TC_M, (w % J) * TC_N * NF


def tile_gemm_tc(NF: int, M: int, Nn: int, K: int, a, b, out) -> None:
    for i0, j0 in warp_tiles(M, Nn, NF):
        lanes = [Lane(lane, NF, i0, j0, M, Nn) for lane in range(32)]
        acc = np.zeros((32, NF, 4))
        acc_range(acc, lanes, NF, 0, K, a, b)
        for li, lane in enumerate(lanes):
            for f in range(NF):
                for e in range(4):
                    if lane.r_ok[e >> 1] and lane.col(f, e) < Nn:
                        out(lane.r[e >> 1], lane.col(f, e), acc[li, f, e])


def tile_gemm2_tc(NF: int, T2: str, M: int, Nn: int, K1: int, a1, b1, K2: int, a2, b2, out) -> None:
    for i0, j0 in warp_tiles(M, Nn, NF):
        lanes = [Lane(lane, NF, i0, j0, M, Nn) for lane in range(32)]
        acc1, acc2 = np.zeros((32, NF, 4)), np.zeros((32, NF, 4))
        acc_range(acc1, lanes, NF, 0, K1, a1, b1)
        k0 = min(i0, K2) if T2 == "UPPER" else 0
        k1 = min(i0 + TC_M, K2) if T2 == "LOWER" else K2
        acc_range(acc2, lanes, NF, k0, k1, a2, b2)
        for li, lane in enumerate(lanes):
            for f in range(NF):
                for e in range(4):
                    if lane.r_ok[e >> 1] and lane.col(f, e) < Nn:
                        out(lane.r[e >> 1], lane.col(f, e), acc1[li, f, e], acc2[li, f, e])


# --- the checks ---------------------------------------------------------------------------------------------
def reader(X):
    """X[i, k] as an operand functor that refuses a read out of range (the kernel's would read past an array)."""

    def at(i, k):
        assert 0 <= i < X.shape[0] and 0 <= k < X.shape[1], f"read at ({i}, {k}) of {X.shape}"
        return X[i, k]

    return at


SHAPES = [  # M, Nn, K, NF: the scans' products at issue 22's shapes, then odd ones
    (32, 32, 64, 1),  # C B^T, dy u^T (Q = 32, N = P = 64)
    (32, 64, 64, 2),  # C S^T, wS, yoff
    (64, 64, 32, 4),  # the state updates
    (5, 3, 3, 1),
    (17, 9, 13, 2),
    (1, 1, 1, 4),
    (33, 65, 20, 4),
    (9, 6, 0, 2),  # K = 0: a skipped product, +0
]


@pytest.mark.parametrize("M,Nn,K,NF", SHAPES)
def test_tile_gemm_tc_lanes_compute_a_at_b(rng, M, Nn, K, NF):
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, Nn))
    got, count = np.full((M, Nn), np.nan), np.zeros((M, Nn), int)

    def out(i, j, v):
        got[i, j] = v
        count[i, j] += 1

    tile_gemm_tc(NF, M, Nn, K, reader(A), reader(B), out)
    assert (count == 1).all(), "an output stored twice or never"
    np.testing.assert_allclose(got, A @ B, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("T2", ["LOWER", "UPPER", "FULL"])
@pytest.mark.parametrize("Q,Nn,K1,NF", [(32, 64, 64, 2), (9, 6, 5, 2), (17, 3, 0, 1), (40, 20, 3, 4)])
def test_tile_gemm2_tc_lanes_compute_both_products_in_their_k_ranges(rng, T2, Q, Nn, K1, NF):
    """Two products a tile, the second over a triangular Q x Q a2 (as the scans' M and dCB): its k range per
    warp tile as T2 says, and no read of a2 where a triangular range skips it."""
    A1, B1, B2 = rng.standard_normal((Q, K1)), rng.standard_normal((K1, Nn)), rng.standard_normal((Q, Nn))
    A2 = rng.standard_normal((Q, Q))
    if T2 != "FULL":
        A2 = np.tril(A2) if T2 == "LOWER" else np.triu(A2)
    got1, got2, count = np.full((Q, Nn), np.nan), np.full((Q, Nn), np.nan), np.zeros((Q, Nn), int)

    def out(i, j, v1, v2):
        got1[i, j], got2[i, j] = v1, v2
        count[i, j] += 1

    def a2(i, k):  # a triangular range reads only within its tile's span
        tile = (i // TC_M) * TC_M
        if T2 == "LOWER":
            assert k < tile + TC_M, (i, k)
        if T2 == "UPPER":
            assert k >= tile, (i, k)
        return reader(A2)(i, k)

    tile_gemm2_tc(NF, T2, Q, Nn, K1, reader(A1), reader(B1), Q, a2, reader(B2), out)
    assert (count == 1).all()
    np.testing.assert_allclose(got1, A1 @ B1, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(got2, A2 @ B2, rtol=1e-13, atol=1e-13)


def test_the_lanes_cover_each_fragment_once():
    """The PTX table itself: the 32 lanes' registers cover A, B and C, each element once."""
    for fn, regs, shape in ((ptx_a, 4, (TC_M, TC_K)), (ptx_b, 2, (TC_K, TC_N)), (ptx_c, 4, (TC_M, TC_N))):
        seen = np.zeros(shape, int)
        for lane in range(32):
            for i in range(regs):
                seen[fn(lane, i)] += 1
        assert (seen == 1).all(), fn.__name__
