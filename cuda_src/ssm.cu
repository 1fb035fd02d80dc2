// The selective state-space layer of Mamba2 (SSD, Dao & Gu 2024): the causal depthwise conv, the
// chunked scan for training with its backward, and the one-bar forms for acting.
// Twin: cudarl/reference/ssm.py (the notation and equations). Launchers: cudarl/ops/ssm.py.
// Tests: tests/parity/test_ssm.py.
//
// Shapes: B samples, W bars, H heads of P channels, G groups of N state dims, E = H P,
// C_c = E + 2 G N conv channels; an in-projection row is zx = [z (E) | x (E) | B (GN) | C (GN) | dt (H)],
// ld = E + C_c + H. A scan block owns one (sample, head) and walks the window's chunks of Q bars
// with everything of a chunk in shared memory. Every sum has one fixed order (no float atomics):
// the B and C gradients are per head (bc_reduce adds a group's heads in ascending order) and the
// parameter gradients per sample (seq.colsum adds the samples). The chunked scan and its backward have a
// second kernel each, ssd_forward_tc and ssd_backward_tc (net.tf32): their matrix products on TF32 tensor
// cores, the rest as the FP32 kernels (tile_gemm_tc below).
#include <cudarl/reduce.cuh>
#include <cudarl/units.cuh>

typedef long long i64;

#define CONV_MAX_K 8     // the conv's taps live in registers
#define SCAN_THREADS 256 // threads of a scan block (a power of two: block_sum)
#define SOFTPLUS_THRESHOLD 20.f

namespace {

__device__ __forceinline__ float sigmoidf_(float v) { return 1.f / (1.f + expf(-v)); }

__device__ __forceinline__ float softplus(float v) { return v > SOFTPLUS_THRESHOLD ? v : log1pf(expf(v)); }

__device__ __forceinline__ float softplus_grad(float v) { return v > SOFTPLUS_THRESHOLD ? 1.f : sigmoidf_(v); }

// Channel c's taps and bias in registers, w[k] = conv[k, c] (k < K) and w[CONV_MAX_K] = the bias: loaded
// once, not once a bar, by the kernels that walk a window.
__device__ __forceinline__ void conv_taps(const float* conv, int K, int Cc, int c, float* w) {
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k) w[k] = k < K ? conv[(i64)k * Cc + c] : 0.f;
  w[CONV_MAX_K] = conv[(i64)K * Cc + c];
}

// The conv's pre-activation over conv_taps' registers: bias, then the taps k ascending over
// win[k] = in[t - (K - 1) + k] (the twin's order; a tap before the window reads 0).
__device__ __forceinline__ float conv_pre_taps(const float* win, const float* w, int K) {
  float pre = w[CONV_MAX_K];
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k)
    if (k < K) pre += w[k] * win[k];
  return pre;
}

// Bars a window-walking kernel loads ahead: the loads of a batch go out before its stores, so a thread
// waits for one round trip per batch rather than per bar (the walks were latency-bound).
#define CONV_BATCH 8

// The shapes of a scan, and where a (sample, head) block's operands live.
struct Scan {
  int W, H, P, N, G, Q, nc;
  int E, Cc, ld;
  __device__ Scan(int W_, int H_, int P_, int N_, int G_, int Q_)
      : W(W_), H(H_), P(P_), N(N_), G(G_), Q(Q_), nc((W_ + Q_ - 1) / Q_) {
    E = H * P;
    Cc = E + 2 * G * N;
    ld = E + Cc + H;
  }
  __device__ int group(int h) const { return h / (H / G); }
  __device__ int bcol(int h) const { return E + group(h) * N; }          // B's first column in xbc
  __device__ int ccol(int h) const { return E + G * N + group(h) * N; }  // C's first column in xbc
};

// acc[u][v] += sum_{k in [k0, k1)} a(i0 + u, k) b(k, j0 + v J), k ascending: one thread's TM x TN tile of
// rows i0 .. i0 + TM and strided columns j0, j0 + J, ... (rows >= M and columns >= Nn read as 0).
template <int TM, int TN, typename FA, typename FB>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         FA a, FB b) {
  for (int k = k0; k < k1; ++k) {
    float av[TM], bv[TN];
#pragma unroll
    for (int u = 0; u < TM; ++u) av[u] = i0 + u < M ? a(i0 + u, k) : 0.f;
#pragma unroll
    for (int v = 0; v < TN; ++v) bv[v] = j0 + v * J < Nn ? b(k, j0 + v * J) : 0.f;
#pragma unroll
    for (int u = 0; u < TM; ++u)
#pragma unroll
      for (int v = 0; v < TN; ++v) acc[u][v] += av[u] * bv[v];
  }
}

// A row-major shared array read by (its row, column), and the same with row r scaled by s[r]; the operand
// types below differ only in which of tile_acc's indices is the array's row.
struct Pitched {
  const float* p;
  int ld;
  __device__ float at(int r, int c) const { return p[r * ld + c]; }
  __device__ float4 load4(int r, int c) const { return *reinterpret_cast<const float4*>(p + r * ld + c); }
};
struct ScaledPitched {
  const float* p;
  int ld;
  const float* s;
  __device__ float at(int r, int c) const { return s[r] * p[r * ld + c]; }
  __device__ float4 load4(int r, int c) const {
    const float4 v = *reinterpret_cast<const float4*>(p + r * ld + c);
    const float f = s[r];
    return {f * v.x, f * v.y, f * v.z, f * v.w};
  }
};

// Operands stored along k: a(i, k) = p[i ld + k] (RowsK), b(k, j) = p[j ld + k] (ColsK) and b(k, j) = s[j] p[j ld + k]
// (ScaledColsK): the scan's C B^T, C S^T, B dS^T and dy (dt x)^T. tile_acc takes them four k at a time through
// 16-byte shared loads where every row starts on 16 bytes (ld and the range a multiple of 4, p aligned: the scans'
// rows of N + 4 and P + 4 floats), else one at a time. load4 gives the four values at k .. k + 3 of row i (or
// column j) as one would read them one at a time (ScaledColsK: the same products s[j] p[...]).
struct RowsK : Pitched {
  __device__ float operator()(int i, int k) const { return at(i, k); }
};
struct ColsK : Pitched {
  __device__ float operator()(int k, int j) const { return at(j, k); }
};
struct ScaledColsK : ScaledPitched {
  __device__ float operator()(int k, int j) const { return at(j, k); }
};

__device__ __forceinline__ bool rows_of_16_bytes(const float* p, int ld) {
  return ld % 4 == 0 && (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

// tile_acc for RowsK x (Scaled)ColsK: the same multiply-adds in the same order (k ascending for every acc[u][v]),
// so the same sums, with TM + TN 16-byte loads feeding 4 TM TN multiply-adds where the rows allow.
template <int TM, int TN, typename FB>
__device__ __forceinline__ void tile_acc_k4(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0,
                                            int k1, RowsK a, FB b) {
  if (k0 % 4 != 0 || (k1 - k0) % 4 != 0 || !rows_of_16_bytes(a.p, a.ld) || !rows_of_16_bytes(b.p, b.ld)) {
    tile_acc<TM, TN, RowsK, FB>(acc, i0, j0, J, M, Nn, k0, k1, a, b);  // the generic form
    return;
  }
  const float4 zero = {0.f, 0.f, 0.f, 0.f};
  for (int k = k0; k < k1; k += 4) {
    float4 av[TM], bv[TN];
#pragma unroll
    for (int u = 0; u < TM; ++u) av[u] = i0 + u < M ? a.load4(i0 + u, k) : zero;
#pragma unroll
    for (int v = 0; v < TN; ++v) bv[v] = j0 + v * J < Nn ? b.load4(j0 + v * J, k) : zero;
#pragma unroll
    for (int u = 0; u < TM; ++u)
#pragma unroll
      for (int v = 0; v < TN; ++v) {
        acc[u][v] += av[u].x * bv[v].x;
        acc[u][v] += av[u].y * bv[v].y;
        acc[u][v] += av[u].z * bv[v].z;
        acc[u][v] += av[u].w * bv[v].w;
      }
  }
}
template <int TM, int TN>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         RowsK a, ColsK b) {
  tile_acc_k4<TM, TN>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
}
template <int TM, int TN>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         RowsK a, ScaledColsK b) {
  tile_acc_k4<TM, TN>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
}

// b(k, j) = p[k ld + j] (RowsJ), stored along j: the backward's B, C, S_in, dS and dy as the right operand of
// its k-major products (dC, dB, du, dS). Under tile_gemm's C4 mapping (a thread's TN = 4 columns side by side)
// tile_acc reads a thread's four b values of a k in one 16-byte load where the row allows (ld a multiple of 4,
// p + j0 on 16 bytes, all four columns in range), and with a RowsK or ScaledRowsK a, four k at a time through
// 16-byte loads of a too. The multiply-adds are the generic form's, in its order (k ascending for every
// acc[u][v]): the same sums. ScaledRowsK: a(i, k) = s[i] p[i ld + k] (the backward's u = dt x).
struct RowsJ : Pitched {
  __device__ float operator()(int k, int j) const { return at(k, j); }
};
struct ScaledRowsK : ScaledPitched {
  __device__ float operator()(int i, int k) const { return at(i, k); }
};

__device__ __forceinline__ void fma4(float (&acc)[4], float a, float4 b) {
  acc[0] += a * b.x;
  acc[1] += a * b.y;
  acc[2] += a * b.z;
  acc[3] += a * b.w;
}

// Whether a thread's b columns j0 .. j0 + 3 take 16-byte loads (the C4 mapping: J = 1).
template <int TN>
__device__ __forceinline__ bool cols_of_16_bytes(RowsJ b, int j0, int J, int Nn) {
  return TN == 4 && J == 1 && j0 + 3 < Nn && rows_of_16_bytes(b.p + j0, b.ld);
}

// FA x RowsJ, a read one k at a time.
template <int TM, int TN, typename FA>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         FA a, RowsJ b) {
  if constexpr (TN != 4) {
    tile_acc<TM, TN, FA, RowsJ>(acc, i0, j0, J, M, Nn, k0, k1, a, b);  // the generic form
  } else {
    if (!cols_of_16_bytes<TN>(b, j0, J, Nn)) {
      tile_acc<TM, TN, FA, RowsJ>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
      return;
    }
    for (int k = k0; k < k1; ++k) {
      float av[TM];
#pragma unroll
      for (int u = 0; u < TM; ++u) av[u] = i0 + u < M ? a(i0 + u, k) : 0.f;
      const float4 bv = b.load4(k, j0);
#pragma unroll
      for (int u = 0; u < TM; ++u) fma4(acc[u], av[u], bv);
    }
  }
}

// (Scaled)RowsK x RowsJ: four k at a time where a's rows allow, else as above.
template <int TM, int TN, typename FA>
__device__ __forceinline__ void tile_acc_k4j4(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0,
                                              int k1, FA a, RowsJ b) {
  if (TN != 4 || k0 % 4 != 0 || (k1 - k0) % 4 != 0 || !rows_of_16_bytes(a.p, a.ld) ||
      !cols_of_16_bytes<TN>(b, j0, J, Nn)) {
    tile_acc<TM, TN, FA>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
    return;
  }
  if constexpr (TN == 4) {
    const float4 zero = {0.f, 0.f, 0.f, 0.f};
    for (int k = k0; k < k1; k += 4) {
      float4 av[TM];
#pragma unroll
      for (int u = 0; u < TM; ++u) av[u] = i0 + u < M ? a.load4(i0 + u, k) : zero;
      const float4 b0 = b.load4(k, j0), b1 = b.load4(k + 1, j0), b2 = b.load4(k + 2, j0), b3 = b.load4(k + 3, j0);
#pragma unroll
      for (int u = 0; u < TM; ++u) {  // per acc[u][v]: k, k + 1, k + 2, k + 3
        fma4(acc[u], av[u].x, b0);
        fma4(acc[u], av[u].y, b1);
        fma4(acc[u], av[u].z, b2);
        fma4(acc[u], av[u].w, b3);
      }
    }
  }
}
template <int TM, int TN>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         RowsK a, RowsJ b) {
  tile_acc_k4j4<TM, TN>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
}
template <int TM, int TN>
__device__ __forceinline__ void tile_acc(float (&acc)[TM][TN], int i0, int j0, int J, int M, int Nn, int k0, int k1,
                                         ScaledRowsK a, RowsJ b) {
  tile_acc_k4j4<TM, TN>(acc, i0, j0, J, M, Nn, k0, k1, a, b);
}

// The k range of a tile's second product in tile_gemm2 when its a is triangular: LOWER (a(i, k) = 0 for
// k > i) stops after the tile's last row, UPPER (a(i, k) = 0 for k < i) starts at its first, FULL takes
// every k. A skipped product is an exact zero added to the sum's start (+0) or end, so the sum keeps the
// bits of the untrimmed one (finite operands).
enum Tri { FULL, LOWER, UPPER };

// out(i, j, v) with v = sum_k a(i, k) b(k, j), k ascending, for i < M, j < Nn: the block's threads each
// own a TM x TN tile of rows i0 .. i0 + TM and strided columns j0, j0 + J, ... (J = ceil(Nn / TN) column
// groups; consecutive threads take consecutive columns, so b's loads are conflict-free and a's are
// broadcasts). TM + TN shared loads feed TM TN multiply-adds. The scan's [P x N] products take 4 x 4
// tiles (256 of them for P = N = 64, a thread each); its [Q x P] and [Q x N] products 2 x 4 (256 tiles
// for Q = 32, where 4 x 4 left half the block idle). The tile shape does not change any sum's order.
// C4: a thread's columns side by side instead (j0 = TN g, j0 + 1, ...: RowsJ's 16-byte loads, consecutive
// threads on consecutive 16 bytes of a row); the same sums, other threads.
template <int TM, int TN, bool C4 = false, typename FA, typename FB, typename FO>
__device__ __forceinline__ void tile_gemm(int M, int Nn, int K, FA a, FB b, FO out) {
  const int J = (Nn + TN - 1) / TN, tiles = ((M + TM - 1) / TM) * J, Js = C4 ? 1 : J;
  for (int tile = threadIdx.x; tile < tiles; tile += blockDim.x) {
    const int i0 = (tile / J) * TM, j0 = C4 ? (tile % J) * TN : tile % J;
    float acc[TM][TN] = {};
    tile_acc<TM, TN>(acc, i0, j0, Js, M, Nn, 0, K, a, b);
#pragma unroll
    for (int u = 0; u < TM; ++u)
#pragma unroll
      for (int v = 0; v < TN; ++v)
        if (i0 + u < M && j0 + v * Js < Nn) out(i0 + u, j0 + v * Js, acc[u][v]);
  }
}

// Two products on one tile mapping, each its own sum: out(i, j, v1, v2) with v1 = sum_{k < K1} a1(i, k)
// b1(k, j) and v2 = sum_{k < K2} a2(i, k) b2(k, j), both k ascending; a2 triangular as T2 says (Tri). For
// the scan's "sum over s <= t" terms, which ran as one serial loop per output (a dependent chain of up to
// Q multiply-adds with two shared loads each, the block waiting on its longest rows): as a tile, TM + TN
// loads feed TM TN independent multiply-adds, with the same sums.
template <int TM, int TN, Tri T2, bool C4 = false, typename FA1, typename FB1, typename FA2, typename FB2,
          typename FO>
__device__ __forceinline__ void tile_gemm2(int M, int Nn, int K1, FA1 a1, FB1 b1, int K2, FA2 a2, FB2 b2, FO out) {
  const int J = (Nn + TN - 1) / TN, tiles = ((M + TM - 1) / TM) * J, Js = C4 ? 1 : J;  // C4: as tile_gemm's
  for (int tile = threadIdx.x; tile < tiles; tile += blockDim.x) {
    const int i0 = (tile / J) * TM, j0 = C4 ? (tile % J) * TN : tile % J;
    float acc1[TM][TN] = {}, acc2[TM][TN] = {};
    tile_acc<TM, TN>(acc1, i0, j0, Js, M, Nn, 0, K1, a1, b1);
    const int k0 = T2 == UPPER ? min(i0, K2) : 0, k1 = T2 == LOWER ? min(i0 + TM, K2) : K2;
    tile_acc<TM, TN>(acc2, i0, j0, Js, M, Nn, k0, k1, a2, b2);
#pragma unroll
    for (int u = 0; u < TM; ++u)
#pragma unroll
      for (int v = 0; v < TN; ++v)
        if (i0 + u < M && j0 + v * Js < Nn) out(i0 + u, j0 + v * Js, acc1[u][v], acc2[u][v]);
  }
}

// ---- the products on TF32 tensor cores (the _tc scans: net.tf32) -----------------------------------
// tile_gemm and tile_gemm2 as warp-level mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: every operand value
// rounded to TF32 (cvt.rna: to nearest, ties away from zero, 10 mantissa bits), the products summed in float32
// in the tensor core's order: the FP32 form's sums to about 1e-3 (tests/parity/test_ssm.py derives the bound),
// not its bits. A warp owns a 16 x 8 NF tile of out (rows i0 .. i0 + 16, columns j0 .. j0 + 8 NF; the block's
// warps take the tiles in turn, so every lane of a warp runs every mma) and walks k over [k0, k1) 8 at a time.
// The operands are the FP32 form's functors, read a value at a time; one at a row >= M, a column >= Nn or a
// k >= k1 is 0, never read (shared memory past an operand may hold anything, NaN too, and 0 * NaN is NaN).
// A thread stores the out(i, j, v) of its own fragment elements: for given M, Nn and NF one thread owns one
// (i, j) in every product, as tile_gemm's tiles do (ssd_backward's CB then dM relies on it).
//
// Fragments (PTX ISA 9.7.14.5.7 "Matrix Fragments for mma.m16n8k8", Figures 72, 75 and 77: .tf32 A and B,
// .f32 C and D), g = lane >> 2, t = lane % 4:
//   A [16 x 8], row:  a0 = A[g][t]   a1 = A[g + 8][t]   a2 = A[g][t + 4]   a3 = A[g + 8][t + 4]
//   B [8 x 8], col:   b0 = B[t][g]   b1 = B[t + 4][g]
//   C, D [16 x 8]:    c0 = C[g][2t]  c1 = C[g][2t + 1]  c2 = C[g + 8][2t]  c3 = C[g + 8][2t + 1]
// tests/unit/test_ssm_fragments.py replays this mapping in NumPy over the 32 lanes. TF32 mma needs sm_80: below
// it the _tc kernels run the FP32 form (as cuBLAS does TF32 GEMMs without TF32 tensor cores).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define SSM_TF32_MMA 1
#else
#define SSM_TF32_MMA 0
#endif
#define TC_M 16  // rows of an mma tile
#define TC_N 8   // its columns
#define TC_K 8   // its k

// A shared row of n floats as the _tc scans pad it: n' >= n with n' = 4 (mod 8). The rows r0 + g (g < 8) then
// start in 8 distinct groups of 4 banks, so a fragment's 8 rows x 4 consecutive columns (A's a_i; B's b_i where
// B is stored along k, ColsK) are 32 distinct banks, and its 4 rows x 8 columns (B stored along j, RowsJ; A read
// transposed) at most two per bank. (Rows of 64 floats put all 8 rows in one bank: an 8-way conflict a load.)
__device__ __forceinline__ int tc_pad(int n) { return n + (12 - n % 8) % 8; }

// v rounded to TF32 (its float32 bits with the low 13 mantissa bits clear), as the mma reads a .tf32 register.
__device__ __forceinline__ unsigned tf32_bits(float v) {
#if SSM_TF32_MMA
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return r;
#else
  __trap();  // not reached: scan_gemm takes the FP32 form below sm_80
  return 0u;
#endif
}

// d += A B over one 16 x 8 x 8 step, the fragments as the banner says.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if SSM_TF32_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// A lane's place in a warp's tile at (i0, j0): its A rows r[0] = i0 + g, r[1] = i0 + g + 8 (a0 / a2, a1 / a3;
// also its accumulators' rows, c0 / c1 and c2 / c3), its B column c[f] = j0 + 8 f + g in fragment f, and which
// of them are in range; its accumulator columns are col(f, e).
template <int NF>
struct TcLane {
  int j0, t, r[2], c[NF];
  bool r_ok[2], c_ok[NF];
  __device__ TcLane(int i0, int j0_, int M, int Nn) : j0(j0_) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r[h] = i0 + g + 8 * h;
      r_ok[h] = r[h] < M;
    }
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      c[f] = j0 + TC_N * f + g;
      c_ok[f] = c[f] < Nn;
    }
  }
  __device__ int col(int f, int e) const { return j0 + TC_N * f + 2 * t + (e & 1); }  // of c_e in fragment f
};

// acc[f] += A[i0 .. i0 + 16, k .. k + 8] B[k .. k + 8, j0 + 8 f ..] for f < NF. KCHECK: the step may pass k1 (a
// range's last step when its length is not a multiple of 8); else every k of it is in range.
template <int NF, bool KCHECK, typename FA, typename FB>
__device__ __forceinline__ void tc_step(float (&acc)[NF][4], const TcLane<NF>& l, int k, int k1, FA a, FB b) {
  const int ka = k + l.t, kb = ka + 4;  // the lane's k of a0, a1, b0 and of a2, a3, b1
  const bool ka_ok = !KCHECK || ka < k1, kb_ok = !KCHECK || kb < k1;
  const unsigned af[4] = {
      tf32_bits(l.r_ok[0] && ka_ok ? a(l.r[0], ka) : 0.f), tf32_bits(l.r_ok[1] && ka_ok ? a(l.r[1], ka) : 0.f),
      tf32_bits(l.r_ok[0] && kb_ok ? a(l.r[0], kb) : 0.f), tf32_bits(l.r_ok[1] && kb_ok ? a(l.r[1], kb) : 0.f)};
#pragma unroll
  for (int f = 0; f < NF; ++f) {
    const unsigned bf[2] = {tf32_bits(l.c_ok[f] && ka_ok ? b(ka, l.c[f]) : 0.f),
                            tf32_bits(l.c_ok[f] && kb_ok ? b(kb, l.c[f]) : 0.f)};
    mma_tf32(acc[f], af, bf);
  }
}

// acc += the products over k in [k0, k1), 8 k a step, the last one checked (none when k1 <= k0).
template <int NF, typename FA, typename FB>
__device__ __forceinline__ void tc_acc(float (&acc)[NF][4], const TcLane<NF>& l, int k0, int k1, FA a, FB b) {
  int k = k0;
  for (; k + TC_K <= k1; k += TC_K) tc_step<NF, false>(acc, l, k, k1, a, b);
  if (k < k1) tc_step<NF, true>(acc, l, k, k1, a, b);
}

// The warp tiles of an M x Nn product, 16 x 8 NF each, J of them across: tile w at rows 16 (w / J) ..,
// columns 8 NF (w % J) ..; a warp takes w = warp, warp + warps, ... (uniform over its lanes).
template <int NF>
__device__ __forceinline__ int tc_tiles(int M, int Nn, int& J) {
  J = (Nn + TC_N * NF - 1) / (TC_N * NF);
  return ((M + TC_M - 1) / TC_M) * J;
}

// tile_gemm's out(i, j, v), v = sum_{k < K} a(i, k) b(k, j), on tensor cores (the banner).
template <int NF, typename FA, typename FB, typename FO>
__device__ __forceinline__ void tile_gemm_tc(int M, int Nn, int K, FA a, FB b, FO out) {
  int J;
  const int tiles = tc_tiles<NF>(M, Nn, J);
  for (int w = threadIdx.x >> 5; w < tiles; w += blockDim.x >> 5) {
    const TcLane<NF> l((w / J) * TC_M, (w % J) * TC_N * NF, M, Nn);
    float acc[NF][4] = {};
    tc_acc<NF>(acc, l, 0, K, a, b);
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (l.r_ok[e >> 1] && l.col(f, e) < Nn) out(l.r[e >> 1], l.col(f, e), acc[f][e]);
  }
}

// tile_gemm2's out(i, j, v1, v2) on tensor cores: v1 over k < K1, v2 over a2's k range as T2 says (Tri) for the
// warp tile's rows: LOWER stops after its last row, UPPER starts at its first (a multiple of 16, so the steps
// keep their alignment). The k skipped are products with a2 = 0 exactly.
template <int NF, Tri T2, typename FA1, typename FB1, typename FA2, typename FB2, typename FO>
__device__ __forceinline__ void tile_gemm2_tc(int M, int Nn, int K1, FA1 a1, FB1 b1, int K2, FA2 a2, FB2 b2,
                                              FO out) {
  int J;
  const int tiles = tc_tiles<NF>(M, Nn, J);
  for (int w = threadIdx.x >> 5; w < tiles; w += blockDim.x >> 5) {
    const int i0 = (w / J) * TC_M;
    const TcLane<NF> l(i0, (w % J) * TC_N * NF, M, Nn);
    float acc1[NF][4] = {}, acc2[NF][4] = {};
    tc_acc<NF>(acc1, l, 0, K1, a1, b1);
    const int k0 = T2 == UPPER ? min(i0, K2) : 0, k1 = T2 == LOWER ? min(i0 + TC_M, K2) : K2;
    tc_acc<NF>(acc2, l, k0, k1, a2, b2);
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (l.r_ok[e >> 1] && l.col(f, e) < Nn) out(l.r[e >> 1], l.col(f, e), acc1[f][e], acc2[f][e]);
  }
}

// The scans' products: tile_gemm / tile_gemm2 (TC false: the FP32 kernels, whose code this leaves as it was) or
// their tensor-core forms (TC: the _tc kernels) with NF fragments a warp tile. TM, TN and C4 shape the FP32
// form, NF the TF32 one; each call site picks both for the benchmark's shapes (a tile a thread, a tile a warp).
template <bool TC, int NF, int TM, int TN, bool C4 = false, typename FA, typename FB, typename FO>
__device__ __forceinline__ void scan_gemm(int M, int Nn, int K, FA a, FB b, FO out) {
  if constexpr (TC && SSM_TF32_MMA)
    tile_gemm_tc<NF>(M, Nn, K, a, b, out);
  else
    tile_gemm<TM, TN, C4>(M, Nn, K, a, b, out);
}
template <bool TC, int NF, int TM, int TN, Tri T2, bool C4 = false, typename FA1, typename FB1, typename FA2,
          typename FB2, typename FO>
__device__ __forceinline__ void scan_gemm2(int M, int Nn, int K1, FA1 a1, FB1 b1, int K2, FA2 a2, FB2 b2, FO out) {
  if constexpr (TC && SSM_TF32_MMA)
    tile_gemm2_tc<NF, T2>(M, Nn, K1, a1, b1, K2, a2, b2, out);
  else
    tile_gemm2<TM, TN, T2, C4>(M, Nn, K1, a1, b1, K2, a2, b2, out);
}

// The row and column (r, c) of a flat index i = r w + c that a thread walks as i = i0, i0 + step, ...: one
// division at the start, none a step (a division by a width known only at run time is a few dozen
// instructions; the loaders below made one or two per element). The same (r, c) as i / w and i % w.
struct RowCol {
  int r, c;
  const int w, dr, dc;
  __device__ RowCol(int i0, int step, int w_) : r(i0 / w_), c(i0 % w_), w(w_), dr(step / w_), dc(step % w_) {}
  __device__ void next() {
    r += dr;
    c += dc;
    if (c >= w) {
      c -= w;
      ++r;
    }
  }
};

// A chunk's B and C rows of head h's group into shared rows of N1 floats (bars row0 .. row0 + Qc).
__device__ __forceinline__ void load_bc(const float* xbc, const Scan& sc, int h, i64 row0, int Qc, float* Bs,
                                        float* Cs, int N1) {
  const int N = sc.N, bc = sc.bcol(h), cc = sc.ccol(h);
  RowCol rc(threadIdx.x, blockDim.x, N);
  for (int i = threadIdx.x; i < Qc * N; i += blockDim.x, rc.next()) {
    const i64 r = (row0 + rc.r) * sc.Cc;
    Bs[rc.r * N1 + rc.c] = xbc[r + bc + rc.c];
    Cs[rc.r * N1 + rc.c] = xbc[r + cc + rc.c];
  }
}

// cum[t] = sum_{r <= t} dt[r] A within the chunk: one thread, products then sums rounded as the twin's
// cumsum (no contraction), so the forward and the backward see the same bits.
__device__ __forceinline__ void chunk_cumsum(const float* dts, float* cum, int Qc, float A) {
  if (threadIdx.x == 0) {
    float acc = 0.f;
    for (int t = 0; t < Qc; ++t) {
      acc = __fadd_rn(acc, __fmul_rn(dts[t], A));
      cum[t] = acc;
    }
  }
  __syncthreads();
}

// 16 or 4 bytes from global to shared memory with cp.async, done for this thread at cp_async_wait_all (sm_80 on;
// below it, a plain copy). Here, outside the compile units, because a unit holds no #if (cudarl/kernels.py).
__device__ __forceinline__ void cp_async16(float* s, const float* g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned int a = (unsigned int)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g) : "memory");
#else
  *reinterpret_cast<float4*>(s) = *reinterpret_cast<const float4*>(g);
#endif
}
__device__ __forceinline__ void cp_async4(float* s, const float* g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned int a = (unsigned int)__cvta_generic_to_shared(s);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g) : "memory");
#else
  *s = *g;
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace

// Two compile units (cudarl/units.cuh): fp32, every kernel but the _tc scans, and tf32, the _tc scans (at the end of
// the file), so an FP32 start-up does not compile the tensor-core forms (about 2 s of NVRTC) and a TF32 one
// compiles both side by side.
#if CUDARL_UNIT_IS(fp32)
// ---- conv_forward ---------------------------------------------------------------------------------
// xbc[b, t, c] = silu(conv_pre) over in = zx[:, E + c]. Thread per (sample, channel, segment of CONV_SEG bars):
// it loads its segment's bars and the K - 1 before it at once, then walks them with a register window of
// the last K inputs (the same window values and taps as one walk over the whole window: the same bits).
// grid (ceil(C_c / 128) S, B), block 128: block x = segment * ceil(C_c / 128) + channel block (a sample's
// segments side by side, so a segment's K - 1 earlier bars, loaded by its neighbour too, are L2 hits);
// a thread takes segments s, s + S, ... so any S covers the window. One thread a window walked it in
// batches of CONV_BATCH bars, a memory round trip each (8 for W = 64): latency-bound, 58 us a call at
// issue 22's workload (ncu, H100, a215948) against 34 us to move its bytes.
// Reads 4*B*W*C_c (+ the halos, L2) + 4*(K+1)*C_c bytes, writes 4*B*W*C_c.
#define CONV_SEG 16
extern "C" __global__ void cudarl_ssm_conv_forward(const float* zx, const float* conv, float* xbc, int W, int E, int Cc,
                                                   i64 ld, int K) {
  const int nb = (Cc + blockDim.x - 1) / blockDim.x, S = gridDim.x / nb;
  const int c = (blockIdx.x % nb) * blockDim.x + threadIdx.x;
  if (c >= Cc) return;
  const i64 b = blockIdx.y;
  // The taps right-aligned, wr[CONV_MAX_K - K + k] = conv[k, c], so bar t's window is in[] at fixed offsets
  // (a register array indexed by the run-time K went to local memory).
  float wr[CONV_MAX_K];
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k) wr[k] = k >= CONV_MAX_K - K ? conv[(i64)(k - (CONV_MAX_K - K)) * Cc + c] : 0.f;
  const float bias = conv[(i64)K * Cc + c];
  constexpr int L = CONV_MAX_K - 1 + CONV_SEG;  // in[j] is bar t0 - (CONV_MAX_K - 1) + j
  for (int t0 = (blockIdx.x / nb) * CONV_SEG; t0 < W; t0 += S * CONV_SEG) {
    float in[L];
#pragma unroll
    for (int j = 0; j < L; ++j) {  // 0 before bar 0 and past W; the bars before the first tap's are not read
      const int t = t0 - (CONV_MAX_K - 1) + j;
      in[j] = t >= 0 && t < W && t >= t0 - (K - 1) ? zx[(b * W + t) * ld + E + c] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < CONV_SEG; ++u) {
      if (t0 + u >= W) break;
      float pre = bias;  // conv_pre_taps' sum: bias, then taps k ascending over bars t - (K - 1) + k
#pragma unroll
      for (int k = 0; k < CONV_MAX_K; ++k)
        if (k >= CONV_MAX_K - K) pre += wr[k] * in[u + k];
      xbc[(b * W + t0 + u) * Cc + c] = pre * sigmoidf_(pre);
    }
  }
}

// ---- conv_backward --------------------------------------------------------------------------------
// g = dxbc silu'(pre); din[s] = sum_k w[k] g[s + K - 1 - k] into zx's conv columns of dzx; the taps'
// and bias's gradients summed over the samples of chunk blockIdx.y (rows of seq.chunk_rows over B)
// into part [parts, (K + 1) C_c]. Thread per (chunk, channel) walks its samples and t from the last
// bar down, with register windows of inputs and of g. grid (ceil(C_c / 128), parts), block 128.
// Reads 8*B*W*C_c bytes, writes 4*B*W*C_c + 4*parts*(K+1)*C_c.
extern "C" __global__ void cudarl_ssm_conv_backward(const float* dxbc, const float* zx, const float* conv, float* dzx,
                                                    float* part, i64 B, int W, int E, int Cc, i64 ld, int K,
                                                    int parts) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= Cc) return;
  const i64 chunk = (B + parts - 1) / parts;
  const i64 b0 = (i64)blockIdx.y * chunk;
  const i64 b1 = b0 + chunk < B ? b0 + chunk : B;
  float dw[CONV_MAX_K + 1], w[CONV_MAX_K + 1], wr[CONV_MAX_K];  // wr[j] = w[K - 1 - j] (din's taps)
  conv_taps(conv, K, Cc, c, w);
#pragma unroll
  for (int j = 0; j < CONV_MAX_K; ++j) wr[j] = j < K ? conv[(i64)(K - 1 - j) * Cc + c] : 0.f;
#pragma unroll
  for (int k = 0; k <= CONV_MAX_K; ++k) dw[k] = 0.f;
  for (i64 b = b0; b < b1; ++b) {
    const float* in = zx + b * W * ld + E + c;
    float win[CONV_MAX_K], gwin[CONV_MAX_K];  // win[k] = in[t - (K - 1) + k]; gwin[j] = g[t + j]
#pragma unroll
    for (int k = 0; k < CONV_MAX_K; ++k) {
      const int s = W - 1 - (K - 1) + k;
      win[k] = (k < K && s >= 0) ? in[(i64)s * ld] : 0.f;
      gwin[k] = 0.f;
    }
    for (int t0 = W - 1; t0 >= 0; t0 -= CONV_BATCH) {
      float dx[CONV_BATCH], nx[CONV_BATCH];  // bar t = t0 - u's dxbc, and the input win[0] takes after it
#pragma unroll
      for (int u = 0; u < CONV_BATCH; ++u) {
        const int t = t0 - u, s0 = t - 1 - (K - 1);
        dx[u] = t >= 0 ? dxbc[(b * W + t) * Cc + c] : 0.f;
        nx[u] = (t >= 0 && s0 >= 0) ? in[(i64)s0 * ld] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < CONV_BATCH; ++u) {
        const int t = t0 - u;
        if (t < 0) break;
        const float pre = conv_pre_taps(win, w, K);
        const float s = sigmoidf_(pre);
        const float g = dx[u] * (s * (1.f + pre * (1.f - s)));
#pragma unroll
        for (int j = CONV_MAX_K - 1; j > 0; --j) gwin[j] = gwin[j - 1];
        gwin[0] = g;
        float din = 0.f;  // sum_k w[k] g[t + K - 1 - k], as j = K - 1 - k ascending (registers need fixed indices)
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; ++j)
          if (j < K) din += wr[j] * gwin[j];
#pragma unroll
        for (int k = 0; k < CONV_MAX_K; ++k)
          if (k < K) dw[k] += g * win[k];
        dw[CONV_MAX_K] += g;
        dzx[(b * W + t) * ld + E + c] = din;
#pragma unroll
        for (int k = CONV_MAX_K - 1; k > 0; --k) win[k] = win[k - 1];
        win[0] = nx[u];
      }
    }
  }
  float* out = part + (i64)blockIdx.y * (K + 1) * Cc + c;
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k)
    if (k < K) out[(i64)k * Cc] = dw[k];
  out[(i64)K * Cc] = dw[CONV_MAX_K];
}

// ---- conv_step ------------------------------------------------------------------------------------
// One bar: pre = bias + sum_{k < K-1} w[k] state[k] + w[K-1] in (conv_forward's order), the state
// shifted and in appended. Thread per (env, channel). Reads 4*B*K*C_c bytes, writes 4*B*K*C_c.
extern "C" __global__ void cudarl_ssm_conv_step(const float* zx, const float* conv, float* state, float* xbc, i64 B,
                                                int E, int Cc, i64 ld, int K) {
  const i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  if (i >= B * Cc) return;
  const i64 b = i / Cc;
  const int c = (int)(i % Cc);
  float* st = state + b * (K - 1) * (i64)Cc + c;
  float win[CONV_MAX_K];
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k) win[k] = k < K - 1 ? st[(i64)k * Cc] : 0.f;
  const float in = zx[b * ld + E + c];
#pragma unroll
  for (int k = 0; k < CONV_MAX_K; ++k)
    if (k == K - 1) win[k] = in;
  float w[CONV_MAX_K + 1];
  conv_taps(conv, K, Cc, c, w);
  const float pre = conv_pre_taps(win, w, K);
#pragma unroll
  for (int k = 0; k < CONV_MAX_K - 1; ++k)
    if (k < K - 1) st[(i64)k * Cc] = win[k + 1];
  xbc[b * Cc + c] = pre * sigmoidf_(pre);
}

#endif  // fp32

// ---- ssd_forward ----------------------------------------------------------------------------------
// The chunked scan (twin's docstring). Block per (sample, head) = blockIdx.x / H, % H; SCAN_THREADS.
// Per chunk: x, B, C, dt into shared; cum; M[t][s] = (C_t . B_s) exp(cum_t - cum_s) dt_s (s <= t);
// y_t = sum_s M[t][s] x_s + exp(cum_t) S C_t + D x_t; S = exp(cum_end) S + sum_s exp(cum_end - cum_s) dt_s x_s B_s^T,
// written to states[b, h, chunk] for every chunk but the last (the state entering the next chunk; the state
// after the window is not computed: the backward reads only S_in). Shared (floats): x Q*P, B and C Q*N1 each, S P*N1,
// M Q*(Q+1), dt, cum, f 3Q, with N1 = N + 4 where N and Q*P are multiples of 4 (B, C and S rows on 16 bytes: the
// C B^T and C S^T products read them 16 bytes a load, RowsK/ColsK; a warp's quarter reads 8 rows 68 floats apart,
// 32 distinct banks), else N + 1 (rows padded by one against bank conflicts). reference.ssm.forward_shared's size.
// A block reads its head's x, its group's B and C and its dt_raw over the window (4*W*(P + 2N + 1)
// bytes) and writes y, dt and the chunk states (4*W*(P + 1) + 4*(nc - 1)*P*N bytes).
// cudarl_ssm_ssd_forward (TC false) and cudarl_ssm_ssd_forward_tc (TC: the products on TF32 tensor cores, the
// shared rows they read padded by tc_pad; the sums' other terms and everything between the products as the FP32
// kernel's).
namespace {
template <bool TC>
__device__ __forceinline__ void ssd_forward_body(const float* xbc, const float* zx, const float* head, float* y,
                                                 float* dt_out, float* states, int W, int H, int P, int N, int G,
                                                 int Q) {
  extern __shared__ float sh[];
  const Scan sc(W, H, P, N, G, Q);
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x, nt = blockDim.x;
  // TC: the rows of x (XP), B, C, S (N1) and M (Q1) as tc_pad says (the fragments' loads), x's unpadded otherwise
  const int N1 = TC ? tc_pad(N) : N % 4 == 0 && (Q * P) % 4 == 0 ? N + 4 : N + 1, Q1 = TC ? tc_pad(Q) : Q + 1;
  const int XP = TC ? tc_pad(P) : P;
  float* xs = sh;
  float* Bs = xs + Q * XP;
  float* Cs = Bs + Q * N1;
  float* S = Cs + Q * N1;
  float* M = S + P * N1;
  float* dts = M + Q * Q1;
  float* cum = dts + Q;
  float* fs = cum + Q;
  const float A = -expf(head[h]), D = head[H + h], dtb = head[2 * H + h];
  {
    RowCol rc(tid, nt, N);
    for (int i = tid; i < P * N; i += nt, rc.next()) S[rc.r * N1 + rc.c] = 0.f;
  }
  for (int c = 0; c < sc.nc; ++c) {
    const int t0 = c * Q, Qc = min(Q, W - t0);
    const i64 row0 = b * W + t0;
    {
      RowCol rc(tid, nt, P);
      for (int i = tid; i < Qc * P; i += nt, rc.next())
        xs[TC ? rc.r * XP + rc.c : i] = xbc[(row0 + rc.r) * sc.Cc + h * P + rc.c];
    }
    load_bc(xbc, sc, h, row0, Qc, Bs, Cs, N1);
    for (int t = tid; t < Qc; t += nt) {
      const float d = softplus(zx[(row0 + t) * sc.ld + sc.E + sc.Cc + h] + dtb);
      dts[t] = d;
      dt_out[(row0 + t) * H + h] = d;
    }
    __syncthreads();
    chunk_cumsum(dts, cum, Qc, A);
    scan_gemm<TC, 1, 2, 2>(  // M[t][s] = (C_t . B_s) exp(cum_t - cum_s) dt_s for s <= t, else 0
        Qc, Qc, N, RowsK{Cs, N1}, ColsK{Bs, N1},
        [&](int t, int s, float cb) { M[t * Q1 + s] = s <= t ? cb * expf(cum[t] - cum[s]) * dts[s] : 0.f; });
    for (int s = tid; s < Qc; s += nt) fs[s] = expf(cum[Qc - 1] - cum[s]) * dts[s];
    __syncthreads();
    scan_gemm2<TC, 2, 2, 4, LOWER>(  // y_t = sum_{s <= t} M[t][s] x_s + exp(cum_t) (S C_t) + D x_t; S = 0 in chunk 0
        Qc, P, c > 0 ? N : 0, RowsK{Cs, N1}, ColsK{S, N1}, Qc, [&](int t, int s) { return M[t * Q1 + s]; }, [&](int s, int p) { return xs[s * XP + p]; },
        [&](int t, int p, float off, float acc) {
          y[(row0 + t) * sc.E + h * P + p] = acc + expf(cum[t]) * off + D * xs[t * XP + p];
        });
    __syncthreads();  // every y read S before it moves on
    if (c + 1 == sc.nc) break;  // the state after the window: nothing in training reads it
    const float decay = expf(cum[Qc - 1]);
    float* st = states + ((b * H + h) * (sc.nc - 1) + c) * (i64)P * N;
    scan_gemm<TC, 4, 4, 4, true>(  // S = exp(cum_end) S + sum_s f_s x_s B_s^T
        P, N, Qc, [&](int p, int s) { return fs[s] * xs[s * XP + p]; }, RowsJ{Bs, N1},
        [&](int p, int n, float acc) {
          const float v = decay * S[p * N1 + n] + acc;
          S[p * N1 + n] = v;
          st[p * N + n] = v;
        });
    __syncthreads();
  }
}
}  // namespace

#if CUDARL_UNIT_IS(fp32)
extern "C" __global__ __launch_bounds__(SCAN_THREADS) void cudarl_ssm_ssd_forward(
    const float* xbc, const float* zx, const float* head, float* y, float* dt_out, float* states, int W, int H, int P,
    int N, int G, int Q) {
  ssd_forward_body<false>(xbc, zx, head, y, dt_out, states, W, H, P, N, G, Q);
}
#endif  // fp32

// ---- ssd_backward ---------------------------------------------------------------------------------
// The scan's backward, chunk by chunk from the last, carrying dS = dL/dS_out (twin for the
// equations). Block per (sample, head), SCAN_THREADS. Per chunk, with u_s = dt_s x_s, e_t = exp(cum_t),
// f_s = exp(cum_end - cum_s), S_in = states[chunk - 1] (0 for the first):
//   M = (C_t . B_s) exp(cum_t - cum_s) (s <= t), dM = dy_t . u_s, dCB = dM exp(cum_t - cum_s), Z = dM M
//   wS_s = dS B_s; du_s = sum_{t >= s} M[t][s] dy_t + f_s wS_s; yoff_t = S_in C_t
//   dC_t = sum_{s <= t} dCB[t][s] B_s + e_t S_in^T dy_t; dB_s = sum_{t >= s} dCB[t][s] C_t + f_s dS^T u_s
//   dcum_t = sum_{s < t} Z[t][s] - sum_{t' > t} Z[t'][t] + e_t dy_t . yoff_t - f_t u_t . wS_t
//            (+ exp(cum_end) <dS, S_in> + sum_s f_s u_s . wS_s at t = end); da = reverse cumsum of dcum
//   dx = dt du + D dy; ddt = x . du + da A; d dt_raw = ddt softplus'(dt_raw + dt_bias)
//   dS <- exp(cum_end) dS + sum_t e_t dy_t C_t^T
// Writes dx into dxbc's x columns, d dt_raw into dzx's dt column, dB | dC per head into
// dbc_part [B W, H, 2N], and (dA_log, dD, ddt_bias) summed over this sample's bars into
// dhead_part [B, 3, H]. Shared (floats): x Q*P1; dy, wS, du, yoff Q*P each; B, C Q*N1; S_in, dS P*N1;
// M, dCB, Z Q*(Q+1); 6 Q vectors; SCAN_THREADS for block sums. With N and P multiples of 4, N1 = N + 4 and
// P1 = P + 4: rows on 16 bytes, so C B^T, dy u^T, B dS^T and C S_in^T read them 16 bytes a load (RowsK,
// (Scaled)ColsK; a warp's quarter reads 8 rows 68 floats apart, 32 distinct banks). Else N + 1 and P + 1:
// padded by one because dM[t][s] = dy_t . u_s, read one float at a time, is read by a warp of 32 bars s at one
// channel p: with rows of P = 64 floats every lane hit one bank (a 32-way conflict, most of this kernel's time on
// the H200 at bf6ed31). reference.ssm.backward_shared's size.
// cudarl_ssm_ssd_backward (TC false) and cudarl_ssm_ssd_backward_tc (TC: as ssd_forward_body's; dy's rows padded
// too, unpadded in the FP32 kernel).
namespace {
template <bool TC>
__device__ __forceinline__ void ssd_backward_body(const float* dy, const float* xbc, const float* zx, const float* dt,
                                                  const float* head, const float* states, float* dxbc, float* dzx,
                                                  float* dbc_part, float* dhead_part, int W, int H, int P, int N, int G,
                                                  int Q) {
  extern __shared__ float sh[];
  const Scan sc(W, H, P, N, G, Q);
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x, nt = blockDim.x;
  const bool k4 = N % 4 == 0 && P % 4 == 0;  // rows of 16 bytes (the banner)
  // TC: the rows of x (P1), dy (PY), B, C, S_in, dS (N1) and M, dCB, Z (Q1) as tc_pad says; dy's unpadded otherwise
  const int N1 = TC ? tc_pad(N) : k4 ? N + 4 : N + 1, Q1 = TC ? tc_pad(Q) : Q + 1, QP = Q * P;
  const int P1 = TC ? tc_pad(P) : k4 ? P + 4 : P + 1, PY = TC ? tc_pad(P) : P;
  float* xs = sh;  // x_s at xs[s * P1 + p]
  float* dys = xs + Q * P1;  // dy_t at dys[t * PY + p]
  float* wS = dys + Q * PY;
  float* du = wS + QP;
  float* yoff = du + QP;
  float* Bs = yoff + QP;
  float* Cs = Bs + Q * N1;
  float* Sin = Cs + Q * N1;
  float* dS = Sin + P * N1;
  float* M = dS + P * N1;
  float* dCB = M + Q * Q1;
  float* Z = dCB + Q * Q1;
  float* dts = Z + Q * Q1;
  float* cum = dts + Q;
  float* es = cum + Q;
  float* fs = es + Q;
  float* dcum = fs + Q;
  float* vq = dcum + Q;  // q_s = f_s u_s . wS_s
  float* red = vq + Q;   // SCAN_THREADS floats for block sums
  const float A = -expf(head[h]), D = head[H + h], dtb = head[2 * H + h];
  float dA = 0.f, dD = 0.f, dbias = 0.f;  // this sample's parameter sums (thread 0 keeps them)
  {
    RowCol rc(tid, nt, N);
    for (int i = tid; i < P * N; i += nt, rc.next()) dS[rc.r * N1 + rc.c] = 0.f;
  }
  for (int c = sc.nc - 1; c >= 0; --c) {
    const int t0 = c * Q, Qc = min(Q, W - t0);
    const i64 row0 = b * W + t0;
    {
      RowCol rc(tid, nt, P);
      for (int i = tid; i < Qc * P; i += nt, rc.next()) {
        xs[rc.r * P1 + rc.c] = xbc[(row0 + rc.r) * sc.Cc + h * P + rc.c];
        dys[TC ? rc.r * PY + rc.c : i] = dy[(row0 + rc.r) * sc.E + h * P + rc.c];
      }
    }
    load_bc(xbc, sc, h, row0, Qc, Bs, Cs, N1);
    const float* sin_g = states + ((b * H + h) * (sc.nc - 1) + (c - 1)) * (i64)P * N;
    {
      RowCol rc(tid, nt, N);
      for (int i = tid; i < P * N; i += nt, rc.next()) Sin[rc.r * N1 + rc.c] = c > 0 ? sin_g[i] : 0.f;
    }
    for (int t = tid; t < Qc; t += nt) dts[t] = dt[(row0 + t) * H + h];
    __syncthreads();
    chunk_cumsum(dts, cum, Qc, A);
    for (int t = tid; t < Qc; t += nt) {
      es[t] = expf(cum[t]);
      fs[t] = expf(cum[Qc - 1] - cum[t]);
    }
    // CB[t][s] = C_t . B_s into M, then dM[t][s] = dy_t . u_s; the two products have one tile mapping,
    // so the thread that wrote CB[t][s] is the one that reads it (no barrier between them).
    scan_gemm<TC, 1, 2, 2>(Qc, Qc, N, RowsK{Cs, N1}, ColsK{Bs, N1}, [&](int t, int s, float cb) { M[t * Q1 + s] = cb; });
    scan_gemm<TC, 1, 2, 2>(  // M = CB L, dCB = dM L, Z = dM M with L = exp(cum_t - cum_s), for s <= t (else 0)
        Qc, Qc, P, RowsK{dys, PY}, ScaledColsK{xs, P1, dts}, [&](int t, int s, float dm) {
          float m = 0.f, dcb = 0.f, z = 0.f;
          if (s <= t) {
            const float L = expf(cum[t] - cum[s]);
            m = M[t * Q1 + s] * L;
            dcb = dm * L;
            z = dm * m;
          }
          M[t * Q1 + s] = m;
          dCB[t * Q1 + s] = dcb;
          Z[t * Q1 + s] = z;
        });
    // A zero operand's product is skipped (K = 0 gives +0, the bits its sum of +0 products had): dS is
    // zero in the last chunk (the first one walked), S_in in the first.
    const int kS = c < sc.nc - 1 ? 1 : 0, kSin = c > 0 ? 1 : 0;
    scan_gemm<TC, 2, 2, 4>(  // wS_s = dS B_s
        Qc, P, kS * N, RowsK{Bs, N1}, ColsK{dS, N1}, [&](int s, int p, float v) { wS[s * P + p] = v; });
    scan_gemm<TC, 2, 2, 4>(  // yoff_t = S_in C_t
        Qc, P, kSin * N, RowsK{Cs, N1}, ColsK{Sin, N1}, [&](int t, int p, float v) { yoff[t * P + p] = v; });
    __syncthreads();
    scan_gemm2<TC, 2, 2, 4, UPPER, true>(  // du_s = sum_{t >= s} M[t][s] dy_t + f_s wS_s; dx = dt du + D dy
        Qc, P, 0, [&](int, int) { return 0.f; }, [&](int, int) { return 0.f; },
        Qc, [&](int s, int t) { return M[t * Q1 + s]; }, RowsJ{dys, PY},
        [&](int s, int p, float, float acc) {
          const float d = acc + fs[s] * wS[s * P + p];
          du[s * P + p] = d;
          dxbc[(row0 + s) * sc.Cc + h * P + p] = dts[s] * d + D * dys[s * PY + p];
        });
    float* dbc = dbc_part + (row0 * H + h) * 2 * (i64)N;
    scan_gemm2<TC, 2, 2, 4, LOWER, true>(  // dC_t = sum_{s <= t} dCB[t][s] B_s + e_t S_in^T dy_t
        Qc, N, kSin * P, RowsK{dys, PY}, RowsJ{Sin, N1},
        Qc, [&](int t, int s) { return dCB[t * Q1 + s]; }, RowsJ{Bs, N1},
        [&](int t, int n, float sc_in, float dc) { dbc[(i64)t * H * 2 * N + N + n] = dc + es[t] * sc_in; });
    scan_gemm2<TC, 2, 2, 4, UPPER, true>(  // dB_s = sum_{t >= s} dCB[t][s] C_t + f_s dS^T u_s
        Qc, N, kS * P, ScaledRowsK{xs, P1, dts}, RowsJ{dS, N1},
        Qc, [&](int s, int t) { return dCB[t * Q1 + s]; }, RowsJ{Cs, N1},
        [&](int s, int n, float sc_out, float db) { dbc[(i64)s * H * 2 * N + n] = db + fs[s] * sc_out; });
    __syncthreads();  // du is complete
    // dcum and q: one warp per bar t
    for (int t = tid >> 5; t < Qc; t += nt >> 5) {
      const int lane = tid & 31;
      float zr = 0.f, zc = 0.f, yo = 0.f, q = 0.f;
      for (int s = lane; s < t; s += 32) zr += Z[t * Q1 + s];
      for (int t2 = t + 1 + lane; t2 < Qc; t2 += 32) zc += Z[t2 * Q1 + t];
      for (int p = lane; p < P; p += 32) {
        yo += dys[t * PY + p] * yoff[t * P + p];
        q += (dts[t] * xs[t * P1 + p]) * wS[t * P + p];
      }
      zr = cudarl::warp_sum(zr);
      zc = cudarl::warp_sum(zc);
      yo = cudarl::warp_sum(yo);
      q = cudarl::warp_sum(q);
      if (lane == 0) {
        vq[t] = fs[t] * q;
        dcum[t] = (zr - zc) + es[t] * yo - vq[t];
      }
    }
    // <dS, S_in> and sum dy . x of the chunk (block sums, fixed tree)
    float part_ss = 0.f, part_dd = 0.f;
    {
      RowCol rc(tid, nt, N);
      for (int i = tid; i < P * N; i += nt, rc.next()) part_ss += dS[rc.r * N1 + rc.c] * Sin[rc.r * N1 + rc.c];
    }
    {
      RowCol rc(tid, nt, P);
      for (int i = tid; i < Qc * P; i += nt, rc.next()) part_dd += dys[TC ? rc.r * PY + rc.c : i] * xs[rc.r * P1 + rc.c];
    }
    const float ss = cudarl::block_sum(part_ss, red, SCAN_THREADS);
    const float dd = cudarl::block_sum(part_dd, red, SCAN_THREADS);
    if (tid == 0) {
      float qsum = 0.f;
      for (int s = 0; s < Qc; ++s) qsum += vq[s];
      dcum[Qc - 1] += expf(cum[Qc - 1]) * ss + qsum;
      float da = 0.f;  // da_r = sum_{t >= r} dcum_t
      for (int r = Qc - 1; r >= 0; --r) {
        da += dcum[r];
        dcum[r] = da;
      }
      dD += dd;
    }
    __syncthreads();
    for (int t = tid >> 5; t < Qc; t += nt >> 5) {  // ddt, one warp per bar
      const int lane = tid & 31;
      float xdu = 0.f;
      for (int p = lane; p < P; p += 32) xdu += xs[t * P1 + p] * du[t * P + p];
      xdu = cudarl::warp_sum(xdu);
      if (lane == 0) {
        const float v = zx[(row0 + t) * sc.ld + sc.E + sc.Cc + h] + dtb;
        const float draw = (xdu + dcum[t] * A) * softplus_grad(v);
        dzx[(row0 + t) * sc.ld + sc.E + sc.Cc + h] = draw;
        vq[t] = draw;  // q is spent: keep d dt_raw for the sums below
      }
    }
    __syncthreads();
    if (tid == 0) {
      for (int t = Qc - 1; t >= 0; --t) {
        dA += dcum[t] * dts[t];
        dbias += vq[t];
      }
    }
    const float decay = expf(cum[Qc - 1]);
    if (c > 0)  // dS for the chunk before (every read of dS is done; chunk 0 has none before it)
      scan_gemm<TC, 4, 4, 4, true>(  // exp(cum_end) dS + sum_t e_t dy_t C_t^T
          P, N, Qc, [&](int p, int t) { return es[t] * dys[t * PY + p]; }, RowsJ{Cs, N1},
          [&](int p, int n, float acc) { dS[p * N1 + n] = decay * dS[p * N1 + n] + acc; });
    __syncthreads();
  }
  if (tid == 0) {
    float* out = dhead_part + b * 3 * (i64)H + h;
    out[0] = dA * A;  // A = -exp(A_log)
    out[H] = dD;
    out[2 * H] = dbias;
  }
}
}  // namespace

#if CUDARL_UNIT_IS(fp32)
extern "C" __global__ __launch_bounds__(SCAN_THREADS) void cudarl_ssm_ssd_backward(
    const float* dy, const float* xbc, const float* zx, const float* dt, const float* head, const float* states,
    float* dxbc, float* dzx, float* dbc_part, float* dhead_part, int W, int H, int P, int N, int G, int Q) {
  ssd_backward_body<false>(dy, xbc, zx, dt, head, states, dxbc, dzx, dbc_part, dhead_part, W, H, P, N, G, Q);
}

#endif  // fp32

#if CUDARL_UNIT_IS(fp32)
// ---- ssd_last_forward / ssd_last_backward ---------------------------------------------------------
// The scan's output at the last bar only, for the top block of an encoder whose heads read psi = the last
// bar (the twin's ssd_last_forward: y_T = sum_s m_s x_s + D x_T, m_s = (C_T . B_s) e_s dt_s, e_s =
// exp(suf_s), suf_s = sum_{r > s} a_r). One block per (sample, head), LAST_THREADS threads; a thread
// per bar for the W-long sums (m, the dot products), a thread per channel for the sums over bars, and
// the prefix sums by thread 0 in the twin's order.
// The sums read the window's B rows (head h's group) and x rows (head h) from shared memory, a tile of up to
// LAST_TILE bars at a time (issue 22's W = 64 in one; a longer window tile by tile, the sums over bars carried
// from tile to tile in bar order), copied with cp.async: every copy of a tile goes out before the first is
// waited for, so a tile costs one memory round trip, and the first tile's overlaps last_setup's loads and
// prefix sum. Why: at 963c627 a thread per channel read its W x values from global memory, each load issued
// after the multiply-add before it (the SASS): W dependent round trips a block; and a thread per bar read its
// own B row (a warp's load touching 32 rows). ncu had both kernels stalled on those loads (0.07 and 0.27
// instructions issued a scheduler a cycle; 93 and 136 us on an H100, fb169ad). The staged branch of session 21
// (docs/bench/ssd-last-shared.patch) copied the rows a load then a store an element, one load an iteration in
// its SASS: 64 round trips a thread again, with fewer blocks an SM, and was slower (103 and 152 us).
// Copies and the dot products' reads are 16 bytes where N and P are multiples of 4 and xbc is on 16 bytes (rows
// of N + 4 and P + 4 floats: at multiples of 8, a quarter warp's float4 reads of 8 rows fall in 32 distinct
// banks), else 4 (rows of N + 1 and P + 1, in the same space). Every sum keeps its operands, its order and its
// expression (acc += a * b, one multiply-add a term), so the outputs keep their bits (docs/bench/op_bits.py
// compares two trees). The sums over bars and over n leave half the block idle at P = N = 64: splitting one
// channel's sum between threads would change its order, and the SM's other blocks (6 at the workload, as many
// as shared memory allows) fill the gap.
// Shared, every part on 16 bytes: C_T and the per-channel sums carried from tile to tile (y's; the backward's
// dy_T and dC_T's), PAD4 each (the compiler reads a dot product's left-over elements at once, up to 3 floats
// past the last: memcheck flagged it at 13421b4 where C_T ended the allocation); the window's dt, suf / e, cb,
// m (g, da) [4 W (PAD4(6 W))]; the tile [min(W, LAST_TILE) (N + 4 + P + 4)] (ops.ssm._last_shared). No float
// atomics.
#define LAST_THREADS 128
#define LAST_TILE 64  // bars of the window staged at a time
#define PAD4(n) (((n) + 3) & ~3)

namespace {

// This thread's copies done (cp_async_wait_all), then the block's (a barrier).
__device__ __forceinline__ void last_wait() {
  cp_async_wait_all();
  __syncthreads();
}

// The staged tile: bars t0 .. t0 + n of the sample's B rows (head h's group) in sb, rows of NB floats, and its x
// rows (head h) in sx, rows of XP floats, at s (on 16 bytes); v4: 16-byte copies and reads (the banner).
struct LastTile {
  const float *Bg, *xg;  // bar 0's B and x columns in xbc, rows Cc floats apart
  i64 Cc;
  int N, P, tw, NB, XP;
  bool v4;
  float *sb, *sx;
  __device__ LastTile(const Scan& sc, const float* xbc, i64 b, int h, float* s)
      : Bg(xbc + b * sc.W * (i64)sc.Cc + sc.bcol(h)),
        xg(xbc + b * sc.W * (i64)sc.Cc + h * sc.P),
        Cc(sc.Cc),
        N(sc.N),
        P(sc.P),
        tw(min(sc.W, LAST_TILE)) {
    v4 = N % 4 == 0 && P % 4 == 0 && rows_of_16_bytes(xbc, sc.Cc);  // then B's and x's first columns are on 16 too
    NB = v4 ? N + 4 : N + 1;
    XP = v4 ? P + 4 : P + 1;
    sb = s;
    sx = s + tw * (N + 4);  // sized for rows of N + 4 either way
  }
  __device__ const float* B(int t) const { return sb + t * NB; }
  __device__ const float* x(int t) const { return sx + t * XP; }
  // Issues the copies of bars t0 .. t0 + n: their B rows, and their x rows with x (coalesced: consecutive threads
  // on consecutive 16 or 4 bytes of a row).
  __device__ void load(int t0, int n, bool x) const {
    rows(sb, NB, Bg + t0 * Cc, n, N);
    if (x) rows(sx, XP, xg + t0 * Cc, n, P);
  }
  // Tile k's bars t0 = k tw .. t0 + bars staged and waited for, bars returned: tile 0's copies went out before
  // last_setup (load(0, tw, true)); a later tile's go out after the block's barrier (every read of the one before).
  __device__ int stage(int k, int W) const {
    const int t0 = k * tw, bars = min(tw, W - t0);
    if (k > 0) {
      __syncthreads();
      load(t0, bars, true);
    }
    last_wait();
    return bars;
  }
  __device__ void rows(float* s, int ld, const float* g, int n, int w) const {
    if (v4) {
      RowCol rc(threadIdx.x, blockDim.x, w / 4);
      for (int i = threadIdx.x; i < n * (w / 4); i += blockDim.x, rc.next())
        cp_async16(s + rc.r * ld + 4 * rc.c, g + rc.r * Cc + 4 * rc.c);
    } else {
      RowCol rc(threadIdx.x, blockDim.x, w);
      for (int i = threadIdx.x; i < n * w; i += blockDim.x, rc.next())
        cp_async4(s + rc.r * ld + rc.c, g + rc.r * Cc + rc.c);
    }
  }
};

// sum_k a[k] b[k], k ascending, each term one multiply-add into the sum (acc += a[k] * b[k]); v4: a and b on 16
// bytes and n a multiple of 4, read 16 bytes a load (the same terms in the same order).
__device__ __forceinline__ float last_dot(const float* a, const float* b, int n, bool v4) {
  float acc = 0.f;
  if (v4) {
    for (int k = 0; k < n; k += 4) {
      const float4 u = *reinterpret_cast<const float4*>(a + k), v = *reinterpret_cast<const float4*>(b + k);
      acc += u.x * v.x;
      acc += u.y * v.y;
      acc += u.z * v.z;
      acc += u.w * v.w;
    }
  } else {
    for (int k = 0; k < n; ++k) acc += a[k] * b[k];
  }
  return acc;
}

// dt of every bar (computed and written to dt_out when it is set; read from dt_in otherwise), C_T, and suf_s
// in se[] (thread 0 adds from the last bar down, as the twin's flipped cumsum). Ends with a barrier.
__device__ __forceinline__ void last_setup(const Scan& sc, const float* xbc, const float* zx, const float* head,
                                           const float* dt_in, float* dt_out, i64 b, int h, float* sdt, float* se,
                                           float* cT) {
  const i64 row0 = b * sc.W;
  const float A = -expf(head[h]);
  for (int t = threadIdx.x; t < sc.W; t += blockDim.x) {
    const i64 r = row0 + t;
    if (dt_out) {
      const float d = softplus(zx[r * sc.ld + sc.E + sc.Cc + h] + head[2 * sc.H + h]);
      dt_out[r * sc.H + h] = d;
      sdt[t] = d;
    } else {
      sdt[t] = dt_in[r * sc.H + h];
    }
  }
  for (int n = threadIdx.x; n < sc.N; n += blockDim.x) cT[n] = xbc[(row0 + sc.W - 1) * sc.Cc + sc.ccol(h) + n];
  __syncthreads();
  if (threadIdx.x == 0) {
    float acc = 0.f;
    se[sc.W - 1] = 0.f;
    for (int t = sc.W - 1; t > 0; --t) {
      acc += sdt[t] * A;
      se[t - 1] = acc;
    }
  }
  __syncthreads();
}

// For the bars t0 .. t0 + n of the staged tile: cb_s = C_T . B_s (n ascending) into cb[], e_s = exp(suf_s) over se[]
// in place, m_s = cb_s e_s dt_s into m[]; with dyT, also g_s = x_s . dy_T (p ascending) into g[].
__device__ __forceinline__ void last_terms(const LastTile& tl, int t0, int n, const float* sdt, float* se,
                                           const float* cT, float* cb, float* m, const float* dyT, float* g) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int t = t0 + i;
    const float acc = last_dot(cT, tl.B(i), tl.N, tl.v4);
    const float e = expf(se[t]);
    se[t] = e;
    cb[t] = acc;
    m[t] = acc * e * sdt[t];
    if (dyT) g[t] = last_dot(tl.x(i), dyT, tl.P, tl.v4);
  }
}

}  // namespace

// y [B, E] (the last bar's), dt [B W, H] (every bar's). grid B H, block LAST_THREADS, shared 4 (PAD4(N) + PAD4(P)
// + 4 W + min(W, LAST_TILE) (N + P + 8)).
extern "C" __global__ __launch_bounds__(LAST_THREADS) void cudarl_ssm_ssd_last_forward(
    const float* xbc, const float* zx, const float* head, float* y, float* dt, int W, int H, int P, int N, int G) {
  extern __shared__ float sh[];
  const Scan sc(W, H, P, N, G, W);
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  float *cT = sh, *ya = cT + PAD4(N), *sdt = ya + PAD4(P), *se = sdt + W, *cb = se + W, *m = cb + W;
  const LastTile tl(sc, xbc, b, h, m + W);
  const int tiles = (W + tl.tw - 1) / tl.tw;
  tl.load(0, tl.tw, true);  // in flight through last_setup
  last_setup(sc, xbc, zx, head, nullptr, dt, b, h, sdt, se, cT);
  const float D = head[H + h];
  for (int k = 0; k < tiles; ++k) {
    const int t0 = k * tl.tw, bars = tl.stage(k, W);
    last_terms(tl, t0, bars, sdt, se, cT, cb, m, nullptr, nullptr);
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {  // y_T = sum_s m_s x_s (s ascending, tile after tile) + D x_T
      float acc = k == 0 ? 0.f : ya[p];
      for (int t = 0; t < bars; ++t) acc += m[t0 + t] * tl.x(t)[p];
      if (k + 1 < tiles)
        ya[p] = acc;
      else
        y[b * sc.E + h * P + p] = acc + D * tl.x(bars - 1)[p];
    }
  }
}

// The twin's ssd_last_backward: dy [B, E] (the last bar's gradient); dx into dxbc's x columns and d dt_raw
// into dzx's dt columns for every bar, dbc_part [B W, H, 2 N] (dC zero before the last bar), dhead_part
// [B, 3, H]. grid B H, block LAST_THREADS, shared 4 (2 PAD4(N) + PAD4(P) + PAD4(6 W) + min(W, LAST_TILE) (N + P +
// 8)). With one tile (W <= LAST_TILE) the B rows staged for cb are still there for dC_T; else dC_T stages them again.
extern "C" __global__ __launch_bounds__(LAST_THREADS) void cudarl_ssm_ssd_last_backward(
    const float* dy, const float* xbc, const float* zx, const float* dt, const float* head, float* dxbc, float* dzx,
    float* dbc_part, float* dhead_part, int W, int H, int P, int N, int G) {
  extern __shared__ float sh[];
  const Scan sc(W, H, P, N, G, W);
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  float *cT = sh, *dyT = cT + PAD4(N), *dcs = dyT + PAD4(P), *sdt = dcs + PAD4(N), *se = sdt + W, *cb = se + W,
        *m = cb + W, *g = m + W, *da = g + W;
  const LastTile tl(sc, xbc, b, h, sdt + PAD4(6 * W));
  const int tiles = (W + tl.tw - 1) / tl.tw;
  const float* dyb = dy + b * sc.E + h * P;
  for (int p = threadIdx.x; p < P; p += blockDim.x) dyT[p] = dyb[p];
  tl.load(0, tl.tw, true);  // in flight through last_setup
  last_setup(sc, xbc, zx, head, dt, nullptr, b, h, sdt, se, cT);
  for (int k = 0; k < tiles; ++k) {  // cb, e, m and g_s = x_s . dy_T of every bar
    const int t0 = k * tl.tw, bars = tl.stage(k, W);
    last_terms(tl, t0, bars, sdt, se, cT, cb, m, dyT, g);
  }
  __syncthreads();
  const i64 row0 = b * W;
  const float A = -expf(head[h]), D = head[H + h];
  if (threadIdx.x == 0) {  // da_s = sum_{r < s} g_r m_r; dA = sum_s da_s dt_s; dD = x_T . dy_T
    const float* xT = tl.x(W - 1 - (tiles - 1) * tl.tw);  // the last tile's last row
    float acc = 0.f, dA = 0.f, dD = 0.f;
    for (int t = 0; t < W; ++t) {
      da[t] = acc;
      dA += acc * sdt[t];
      acc += g[t] * m[t];
    }
    for (int p = 0; p < P; ++p) dD += dyT[p] * xT[p];
    dhead_part[(b * 3 + 0) * H + h] = dA * A;
    dhead_part[(b * 3 + 1) * H + h] = dD;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < W; t += blockDim.x) {  // d dt_raw; da[] becomes it, for the sum below
    const i64 r = row0 + t;
    const float v = zx[r * sc.ld + sc.E + sc.Cc + h] + head[2 * H + h];
    const float draw = (g[t] * cb[t] * se[t] + da[t] * A) * softplus_grad(v);
    dzx[r * sc.ld + sc.E + sc.Cc + h] = draw;
    da[t] = draw;
    g[t] = g[t] * se[t] * sdt[t];  // g[] becomes dcb_s = g_s e_s dt_s
  }
  RowCol tp(threadIdx.x, blockDim.x, P);
  for (int i = threadIdx.x; i < W * P; i += blockDim.x, tp.next()) {  // dx_s = m_s dy_T (+ D dy_T at the last bar)
    const int t = tp.r, p = tp.c;
    const float v = m[t] * dyT[p];
    dxbc[(row0 + t) * sc.Cc + h * P + p] = t == W - 1 ? v + D * dyT[p] : v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float acc = 0.f;
    for (int t = 0; t < W; ++t) acc += da[t];
    dhead_part[(b * 3 + 2) * H + h] = acc;
  }
  const i64 N2 = 2 * (i64)N;
  RowCol tn(threadIdx.x, blockDim.x, N);
  for (int i = threadIdx.x; i < W * N; i += blockDim.x, tn.next()) {  // dB_s = dcb_s C_T; dC zero before the last bar
    const int t = tn.r, n = tn.c;
    float* o = dbc_part + ((row0 + t) * H + h) * N2;
    o[n] = g[t] * cT[n];
    if (t < W - 1) o[N + n] = 0.f;
  }
  for (int k = 0; k < tiles; ++k) {  // dC_T = sum_s dcb_s B_s, s ascending (tile after tile)
    const int t0 = k * tl.tw, bars = min(tl.tw, W - t0);
    if (tiles > 1) {  // one tile: its B rows are still staged
      __syncthreads();  // every read of the tile before
      tl.load(t0, bars, false);
      last_wait();
    }
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
      float acc = k == 0 ? 0.f : dcs[n];
      for (int t = 0; t < bars; ++t) acc += g[t0 + t] * tl.B(t)[n];
      if (k + 1 < tiles)
        dcs[n] = acc;
      else
        dbc_part[((row0 + W - 1) * H + h) * N2 + N + n] = acc;
    }
  }
}

// ---- bc_reduce ------------------------------------------------------------------------------------
// dxbc's B and C columns = the sums over each group's heads (ascending) of dbc_part [R, H, 2N].
// Thread per (row, column of the 2GN). Reads 4*R*H*2N bytes, writes 4*R*2GN.
extern "C" __global__ void cudarl_ssm_bc_reduce(const float* dbc_part, float* dxbc, i64 R, int H, int N, int G, int E) {
  const int GN = G * N, Cc = E + 2 * GN, rep = H / G;
  const i64 n_items = R * 2 * GN;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n_items; i += (i64)gridDim.x * blockDim.x) {
    const i64 r = i / (2 * GN);
    const int j = (int)(i % (2 * GN));
    const int is_c = j >= GN, jj = is_c ? j - GN : j;
    const int g = jj / N, n = jj % N;
    const float* src = dbc_part + r * H * 2 * (i64)N + (is_c ? N : 0) + n;
    float s = src[(i64)(g * rep) * 2 * N];
    for (int k = 1; k < rep; ++k) s += src[(i64)(g * rep + k) * 2 * N];
    dxbc[r * Cc + E + j] = s;
  }
}

// ---- ssd_step -------------------------------------------------------------------------------------
// One bar of the recurrence: S = exp(dt A) S + (dt x) B^T, y = S C + D x. Block per (env, head),
// 128 threads; shared x P, B and C N, and the state S [P, N] staged with rows of N + 1 floats. The
// arithmetic is a thread per row of S, summing y_p over n in order; the staging makes the global
// reads and writes of S (8*B*H*P*N bytes, the step's whole cost) whole lines, where a thread walking its
// own row in global memory made each warp access touch 32 lines 4 bytes at a time. The padded rows keep
// the row-per-thread reads of shared memory free of bank conflicts.
extern "C" __global__ void cudarl_ssm_ssd_step(const float* xbc, const float* zx, const float* head, float* state,
                                               float* y, int H, int P, int N, int G) {
  extern __shared__ float sh[];
  const Scan sc(1, H, P, N, G, 1);
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x, nt = blockDim.x, ld = N + 1, PN = P * N;
  float* xs = sh;
  float* Bv = xs + P;
  float* Cv = Bv + N;
  float* St = Cv + N;
  const float* row = xbc + b * sc.Cc;
  for (int i = tid; i < P; i += nt) xs[i] = row[h * P + i];
  for (int i = tid; i < N; i += nt) {
    Bv[i] = row[sc.bcol(h) + i];
    Cv[i] = row[sc.ccol(h) + i];
  }
  float* S = state + (b * H + h) * (i64)PN;
  for (int i = tid; i < PN; i += nt) St[(i / N) * ld + i % N] = S[i];
  __syncthreads();
  const float A = -expf(head[h]);
  const float d = softplus(zx[b * sc.ld + sc.E + sc.Cc + h] + head[2 * H + h]);
  const float decay = expf(d * A);
  for (int p = tid; p < P; p += nt) {  // a thread owns a row of S: y_p sums n in order
    const float u = d * xs[p];
    float* Sp = St + p * ld;
    float acc = 0.f;
    for (int n = 0; n < N; ++n) {
      const float v = decay * Sp[n] + u * Bv[n];
      Sp[n] = v;
      acc += v * Cv[n];
    }
    y[b * sc.E + h * P + p] = acc + head[H + h] * xs[p];
  }
  __syncthreads();
  for (int i = tid; i < PN; i += nt) S[i] = St[(i / N) * ld + i % N];
}
#endif  // fp32

// ---- ssd_forward_tc / ssd_backward_tc ---------------------------------------------------------------
// ssd_forward and ssd_backward with their products on TF32 tensor cores (tile_gemm_tc, tile_gemm2_tc): the
// scans of net.tf32. Everything else as the FP32 kernels: the grid, block, shared layout and size, and every
// sum outside the products, but the shared rows the products read padded by tc_pad (x, dy, B, C, the states
// and M, dCB, Z: reference.ssm.forward_shared / backward_shared with tf32; at issue 22's shapes 48.5 and 109.8 KB
// a block against 47.6 and 108.2). ssd_forward_tc is bounded to 64 registers (4 blocks of 256 threads an SM,
// which its shared memory allows): about 108 unbounded, 2 blocks, no spills either way (nvcc 13.0, sm_90).
// ssd_backward_tc's shared memory allows 2 blocks an SM, which its 123 registers do.
#if CUDARL_UNIT_IS(tf32)
extern "C" __global__ __launch_bounds__(SCAN_THREADS, 4) void cudarl_ssm_ssd_forward_tc(
    const float* xbc, const float* zx, const float* head, float* y, float* dt_out, float* states, int W, int H, int P,
    int N, int G, int Q) {
  ssd_forward_body<true>(xbc, zx, head, y, dt_out, states, W, H, P, N, G, Q);
}
extern "C" __global__ __launch_bounds__(SCAN_THREADS) void cudarl_ssm_ssd_backward_tc(
    const float* dy, const float* xbc, const float* zx, const float* dt, const float* head, const float* states,
    float* dxbc, float* dzx, float* dbc_part, float* dhead_part, int W, int H, int P, int N, int G, int Q) {
  ssd_backward_body<true>(dy, xbc, zx, dt, head, states, dxbc, dzx, dbc_part, dhead_part, W, H, P, N, G, Q);
}
#endif  // tf32
