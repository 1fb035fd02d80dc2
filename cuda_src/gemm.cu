// gemm: fp32 GEMMs for the network's small shapes, with the whole K panel staged in shared memory.
// Twin: cudarl/reference/gemm.py. Launchers: cudarl/ops/gemm.py. Tests: tests/parity/test_gemm.py.
//
//   nn_bias_act:  out[M, N] = act(a[M, K] @ b[K, N] + bias[N])   (a Linear's forward; act 0 identity, 1 ReLU)
//   nt:           out[M, N] = a[M, K] @ bt[N, K]^T                (a Linear's dx = dz W^T)
// Row-major, dense; K, N multiples of 4 and every pointer 16-byte aligned (the launchers check).
//
// Why (ncu on an H200, docs/perf-notes.md): cuBLAS(Lt) ran these shapes (M = 512..4096, N, K <= 256)
// with 32x32x8 tiles through a 3-stage pipeline, so each block waited on a global load every 8 of K:
// 8.5-8.9 us for 512..1024 x 256 x 256, about four times the arithmetic. Here a block owns a 32 x 32
// tile of out and copies its whole A panel [32, K] and B panel (K rows of 32, or 32 rows of K) into
// shared memory with cp.async at once, in two groups (the first 64 of K, then the rest), and
// computes from shared memory: one wait for memory, not K / 8.
//
// A block is GEMM_KG = 4 groups of 64 threads (8 warps: a 64-thread block left the SM's schedulers
// idle, 9.3 us at 512 x 256 x 256 in the first version, ncu at 25a5683). In each group a thread
// computes a 4 x 4 block of out (rows 4 ty.., columns 4 tx..) over the group's 4-wide k blocks
// g, g + 4, g + 8, ... as 16 fmaf chains, k ascending; group 0 then adds groups 1, 2, 3's sums in
// that order: bitwise repeatable, the same bits for any grid. Shared rows of the panels read along
// k are padded to lda(K) = 4 mod 32 floats and permuted (srow) so the float4 reads of a warp are
// conflict-free. Rows of a past M and columns past N are zero-filled in shared memory (cp.async
// with a source size of 0) and never stored.
// Shared memory: 4 * 64 lda(K) bytes (nt) or 4 (32 lda(K) + 36 K) (nn), at least the groups' sums'
// 12 KiB (they overlay the panels): about 67 KB at K = 256, past 48 KiB, so the launch opts in
// (cudarl.kernels.launch).
#include <cudarl/reduce.cuh>

typedef long long i64;

#define GEMM_T 32         // tile rows (of a) and columns (of out)
#define GEMM_GROUP 64     // (GEMM_T / 4) x (GEMM_T / 4) threads: a 4 x 4 block of out each
#define GEMM_KG 4         // k groups: group g sums the 4-wide k blocks g, g + 4, g + 8, ...
#define GEMM_THREADS (GEMM_GROUP * GEMM_KG)
#define GEMM_CHUNK 64     // the first cp.async group: k < 64

namespace {

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  const int n = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tile row r (0..31) is stored as shared row (r % 4) * 8 + r / 4, and a panel row read along k is
// L = lda(K) floats long, L = 4 mod 32: the rows 4 t + i that the 8 threads t of a warp read at once
// then land 4 banks apart, so a float4 read is conflict-free (unpermuted, or with K + 4 at K = 204,
// they shared banks: the nt at 512 x 256 x 204 took 7.4 us against 5.8 at K = 256).
__device__ __forceinline__ int srow(int r) { return (r & 3) * 8 + (r >> 2); }
__device__ __forceinline__ int lda(int K) { return K + ((36 - K % 32) % 32); }

// Copy rows [r0, r0 + GEMM_T) x columns [k0, k1) of a row-major [rows, ld] matrix into
// sh[srow(r)][k] (row length lda(K) floats), zero rows at or past `rows`. k0, k1, ld multiples of 4.
__device__ __forceinline__ void stage_rows(float* sh, int K, const float* g, i64 rows, i64 ld, i64 r0, int k0, int k1) {
  const int q = (k1 - k0) / 4;  // float4s a row
  for (int e = threadIdx.x; e < GEMM_T * q; e += GEMM_THREADS) {
    const int r = e / q, k = k0 + 4 * (e - r * q);
    const bool ok = r0 + r < rows;
    cp_async16(sh + srow(r) * lda(K) + k, g + (ok ? (r0 + r) * ld + k : 0), ok);
  }
}

// Copy rows [k0, k1) x columns [n0, n0 + GEMM_T) of b [K, N] into sh[k][n] (row length
// GEMM_T + 4), zero columns at or past N (N a multiple of 4).
__device__ __forceinline__ void stage_cols(float* sh, const float* b, i64 N, i64 n0, int k0, int k1) {
  constexpr int q = GEMM_T / 4;
  for (int e = threadIdx.x; e < (k1 - k0) * q; e += GEMM_THREADS) {
    const int k = k0 + e / q, c = 4 * (e % q);
    const bool ok = n0 + c < N;
    cp_async16(sh + k * (GEMM_T + 4) + c, b + (ok ? k * N + n0 + c : 0), ok);
  }
}

// acc[i][j] += sum over this group's 4-wide k blocks in [k0, k1) of a[4 ty + i][k] * b[k][4 tx + j],
// k ascending (k0 a multiple of 4). kTransB: sb holds bt rows (sb[srow(n)][k], row length lda(K)),
// else b rows (sb[k][n], row length 36).
template <bool kTransB>
__device__ __forceinline__ void mma_range(float (&acc)[4][4], const float* sa, const float* sb, int K, int k0, int k1,
                                          int ty, int tx, int g) {
  const int kb0 = k0 + 4 * ((g - k0 / 4 % GEMM_KG + GEMM_KG) % GEMM_KG);  // this group's first block at or past k0
  const int L = lda(K);
#pragma unroll 2
  for (int k = kb0; k < k1; k += 4 * GEMM_KG) {
    float4 a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(sa + (i * 8 + ty) * L + k);
    if (kTransB) {
      float4 b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const float4*>(sb + (j * 8 + tx) * L + k);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
          acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
          acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
          acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
        }
    } else {
      const float* bk = sb + k * (GEMM_T + 4) + 4 * tx;
      const float4 b0 = *reinterpret_cast<const float4*>(bk);
      const float4 b1 = *reinterpret_cast<const float4*>(bk + (GEMM_T + 4));
      const float4 b2 = *reinterpret_cast<const float4*>(bk + 2 * (GEMM_T + 4));
      const float4 b3 = *reinterpret_cast<const float4*>(bk + 3 * (GEMM_T + 4));
      const float bj[4][4] = {{b0.x, b0.y, b0.z, b0.w}, {b1.x, b1.y, b1.z, b1.w}, {b2.x, b2.y, b2.z, b2.w},
                              {b3.x, b3.y, b3.z, b3.w}};  // [k offset][j]
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float ak[4] = {a[i].x, a[i].y, a[i].z, a[i].w};
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ak[kk], bj[kk][j], acc[i][j]);
      }
    }
  }
}

// The tile's product into acc (valid in group 0's threads): both panels requested at once, the first
// GEMM_CHUNK of K computed as soon as it lands, then the rest; each of the GEMM_KG groups of 64
// threads sums its own k blocks, then group 0 adds groups 1, 2, 3's sums in that order through
// shared memory (red, GEMM_KG - 1 tiles of 16 x 64 floats, over the panels once they are read): a
// fixed order, the same bits every run.
template <bool kTransB>
__device__ __forceinline__ void tile_product(float (&acc)[4][4], float* sa, float* sb, float* red, const float* a,
                                             const float* b, i64 M, i64 N, int K, i64 m0, i64 n0) {
  const int split = K < GEMM_CHUNK ? K : GEMM_CHUNK;
  stage_rows(sa, K, a, M, K, m0, 0, split);
  if (kTransB) stage_rows(sb, K, b, N, K, n0, 0, split);
  else stage_cols(sb, b, N, n0, 0, split);
  cp_async_commit();
  stage_rows(sa, K, a, M, K, m0, split, K);
  if (kTransB) stage_rows(sb, K, b, N, K, n0, split, K);
  else stage_cols(sb, b, N, n0, split, K);
  cp_async_commit();
  const int t = threadIdx.x % GEMM_GROUP, g = threadIdx.x / GEMM_GROUP;
  const int tx = t % (GEMM_T / 4), ty = t / (GEMM_T / 4);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  cp_async_wait<1>();
  __syncthreads();
  mma_range<kTransB>(acc, sa, sb, K, 0, split, ty, tx, g);
  cp_async_wait<0>();
  __syncthreads();
  mma_range<kTransB>(acc, sa, sb, K, split, K, ty, tx, g);
  __syncthreads();  // red may overlay the panels: every group is done reading them
  if (g > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) red[((g - 1) * 16 + i * 4 + j) * GEMM_GROUP + t] = acc[i][j];
  }
  __syncthreads();
  if (g == 0) {
    for (int h = 0; h < GEMM_KG - 1; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += red[(h * 16 + i * 4 + j) * GEMM_GROUP + t];
  }
}

// The block's tile of out into acc (group 0's threads; see tile_product), the shared memory laid
// out as the kernels' banners say: a's panel, then b's; the groups' sums over them once read.
template <bool kTransB>
__device__ __forceinline__ void block_tile(float (&acc)[4][4], const float* a, const float* b, i64 M, i64 N, int K,
                                           i64& m0, i64& n0) {
  extern __shared__ float4 gemm_smem4[];
  float* sa = reinterpret_cast<float*>(gemm_smem4);
  m0 = (i64)blockIdx.y * GEMM_T;
  n0 = (i64)blockIdx.x * GEMM_T;
  tile_product<kTransB>(acc, sa, sa + GEMM_T * lda(K), sa, a, b, M, N, K, m0, n0);
}

// Store the thread's 4 x 4 block (group 0; rows past M, columns past N skipped; N a multiple of 4).
__device__ __forceinline__ void store_tile(float* out, const float (&v)[4][4], i64 M, i64 N, i64 m0, i64 n0) {
  const int tx = threadIdx.x % (GEMM_T / 4), ty = threadIdx.x / (GEMM_T / 4);
  const i64 n = n0 + 4 * tx;
  if (n >= N) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const i64 m = m0 + 4 * ty + i;
    if (m < M) *reinterpret_cast<float4*>(out + m * N + n) = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
  }
}

}  // namespace

// ---- nn_bias_act -------------------------------------------------------------------------------
// out = act(a @ b + bias): grid (ceil(N / 32), ceil(M / 32)), block GEMM_THREADS; dynamic shared
// memory 4 (32 lda(K) + 36 K) bytes, at least the groups' sums. The bias is added after the K sum, then ReLU (act 1): cuBLASLt's
// RELU_BIAS epilogue order. Reads 4 (K (M ceil(N / 32) + N ceil(M / 32)) + N) bytes, writes 4 M N.
extern "C" __global__ __launch_bounds__(GEMM_THREADS) void cudarl_gemm_nn_bias_act(const float* __restrict__ a,
                                                                               const float* __restrict__ b,
                                                                               const float* __restrict__ bias,
                                                                               float* __restrict__ out, i64 M, i64 N,
                                                                               int K, int act) {
  float acc[4][4];
  i64 m0, n0;
  block_tile<false>(acc, a, b, M, N, K, m0, n0);
  if (threadIdx.x >= GEMM_GROUP) return;
  const int tx = threadIdx.x % (GEMM_T / 4);
  const i64 n = n0 + 4 * tx;
  if (n < N) {
    const float4 bv = *reinterpret_cast<const float4*>(bias + n);
    const float bb[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float v = acc[i][j] + bb[j];
        acc[i][j] = act == 1 ? (v > 0.f ? v : 0.f) : v;
      }
  }
  store_tile(out, acc, M, N, m0, n0);
}

// ---- nt ----------------------------------------------------------------------------------------
// out = a @ bt^T: grid (ceil(N / 32), ceil(M / 32)), block GEMM_THREADS; dynamic shared memory
// 4 * 64 lda(K) bytes, at least the groups' sums. Reads 4 K (M ceil(N / 32) + N ceil(M / 32)) bytes, writes 4 M N.
extern "C" __global__ __launch_bounds__(GEMM_THREADS) void cudarl_gemm_nt(const float* __restrict__ a,
                                                                      const float* __restrict__ bt,
                                                                      float* __restrict__ out, i64 M, i64 N, int K) {
  float acc[4][4];
  i64 m0, n0;
  block_tile<true>(acc, a, bt, M, N, K, m0, n0);
  if (threadIdx.x >= GEMM_GROUP) return;
  store_tile(out, acc, M, N, m0, n0);
}
