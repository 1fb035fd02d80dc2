// gemm: fp32 GEMMs for the network's small shapes, with the whole K panel staged in shared memory.
// Twin: cudarl/reference/gemm.py. Launchers: cudarl/ops/gemm.py. Tests: tests/parity/test_gemm.py.
//
//   nn_bias_act:  out[M, N] = act(a[M, K] @ b[K, N] + bias[N])   (a Linear's forward; act 0 identity, 1 ReLU)
//   nt:           out[M, N] = a[M, K] @ bt[N, K]^T                (a Linear's dx = dz W^T)
//   chain:          up to 4 Linears' nn_bias_act in one launch     (thread block clusters; below)
//   chain_backward: their dx chain, nt then the ReLU mask a step, in one launch
// Two compile units (cudarl/units.cuh): panel (nn_bias_act, nt) and chain (chain, chain_backward). The
// chain's kernels take five times the panel kernels' NVRTC time (3.65 s against 0.69 s for the whole
// family on this project's 2-core machine), and only net.gemm = "chain" launches them: a start-up under
// net.gemm = "cudarl" does not wait for them.
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
#include <cudarl/units.cuh>

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

__device__ __forceinline__ void cp_async4(float* smem, const float* gmem, bool valid) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  const int n = valid ? 4 : 0;  // 0: write a zero, read nothing
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

// K rounded up to a multiple of 4: the panel width a product over K columns stages (the columns
// past K zero, so the sums are the K-column ones: a product 0 * 0 adds nothing).
__device__ __forceinline__ int kpad(int K) { return (K + 3) & ~3; }

// Copy rows [r0, r0 + GEMM_T) x columns [k0, k1) of a row-major [rows, ld] matrix of K columns into
// sh[srow(r)][k] (row length lda(kpad(K)) floats), zero rows at or past `rows`. !kAny: K, ld and k0
// multiples of 4 and g 16-byte aligned (float4 copies); kAny: one float a copy, columns at or past K
// zero (the chain's first layer over an observation row of any width). A template parameter, so the
// panel kernels' code is what it was before the chain (tools/compare_kernels.py).
template <bool kAny = false>
__device__ __forceinline__ void stage_rows(float* sh, int K, const float* g, i64 rows, i64 ld, i64 r0, int k0, int k1) {
  const int L = lda(kAny ? kpad(K) : K);
  if (!kAny) {
    const int q = (k1 - k0) / 4;  // float4s a row
    for (int e = threadIdx.x; e < GEMM_T * q; e += GEMM_THREADS) {
      const int r = e / q, k = k0 + 4 * (e - r * q);
      const bool ok = r0 + r < rows;
      cp_async16(sh + srow(r) * L + k, g + (ok ? (r0 + r) * ld + k : 0), ok);
    }
    return;
  }
  const int q = k1 - k0;
  for (int e = threadIdx.x; e < GEMM_T * q; e += GEMM_THREADS) {
    const int r = e / q, k = k0 + (e - r * q);
    const bool ok = r0 + r < rows && k < K;
    cp_async4(sh + srow(r) * L + k, g + (ok ? (r0 + r) * ld + k : 0), ok);
  }
}

// Copy rows [k0, k1) x columns [n0, n0 + GEMM_T) of b [K, N] into sh[k][n] (row length
// GEMM_T + 4), zero columns at or past N (N a multiple of 4) and, kAny, rows at or past K.
template <bool kAny = false>
__device__ __forceinline__ void stage_cols(float* sh, const float* b, i64 N, i64 n0, int k0, int k1, int K) {
  constexpr int q = GEMM_T / 4;
  for (int e = threadIdx.x; e < (k1 - k0) * q; e += GEMM_THREADS) {
    const int k = k0 + e / q, c = 4 * (e % q);
    const bool ok = n0 + c < N && (!kAny || k < K);
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
// fixed order, the same bits every run. a is [M, K] with row pitch lda_a; kAny: K need not be a
// multiple of 4 nor a aligned (stage_rows; the panels are kpad(K) wide, the columns past K zero, and
// the sums the same k blocks in the same order as a product over kpad(K) columns).
template <bool kTransB, bool kAny = false>
__device__ __forceinline__ void tile_product(float (&acc)[4][4], float* sa, float* sb, float* red, const float* a,
                                             const float* b, i64 M, i64 N, int K, i64 m0, i64 n0, i64 lda_a) {
  const int Kp = kAny ? kpad(K) : K;
  const int split = Kp < GEMM_CHUNK ? Kp : GEMM_CHUNK;
  stage_rows<kAny>(sa, K, a, M, lda_a, m0, 0, split);
  if (kTransB) stage_rows(sb, K, b, N, K, n0, 0, split);
  else stage_cols<kAny>(sb, b, N, n0, 0, split, K);
  cp_async_commit();
  stage_rows<kAny>(sa, K, a, M, lda_a, m0, split, Kp);
  if (kTransB) stage_rows(sb, K, b, N, K, n0, split, Kp);
  else stage_cols<kAny>(sb, b, N, n0, split, Kp, K);
  cp_async_commit();
  const int t = threadIdx.x % GEMM_GROUP, g = threadIdx.x / GEMM_GROUP;
  const int tx = t % (GEMM_T / 4), ty = t / (GEMM_T / 4);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  cp_async_wait<1>();
  __syncthreads();
  mma_range<kTransB>(acc, sa, sb, Kp, 0, split, ty, tx, g);
  cp_async_wait<0>();
  __syncthreads();
  mma_range<kTransB>(acc, sa, sb, Kp, split, Kp, ty, tx, g);
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
  tile_product<kTransB>(acc, sa, sa + GEMM_T * lda(K), sa, a, b, M, N, K, m0, n0, K);
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

// The bias added after the K sum, then ReLU (act 1): cuBLASLt's RELU_BIAS epilogue order; then
// store_tile (group 0's threads).
__device__ __forceinline__ void store_bias_act(float* out, float (&acc)[4][4], const float* bias, i64 M, i64 N, i64 m0,
                                               i64 n0, int act) {
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

}  // namespace

#if CUDARL_UNIT_IS(panel)
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
  store_bias_act(out, acc, bias, M, N, m0, n0, act);
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
#endif  // panel

// ---- chain -------------------------------------------------------------------------------------
// A chain of up to GEMM_CHAIN_LAYERS Linears in one launch: y_0 = act_0(x @ w_0 + b_0), then
// y_l = act_l(y_{l-1} @ w_l + b_l), every y_l [M, n_l] written (the backward reads them). Each layer
// is nn_bias_act's tile product and epilogue, so y_l is bit for bit what nn_bias_act gives from
// y_{l-1} (and from x where K0 and ldx are multiples of 4 and x is 16-byte aligned; otherwise x is
// staged a float at a time, its panel kpad(K0) wide with zero columns past K0: any observation width).
//
// Why (docs/perf-notes.md, "The MLP as one chain"): the train step's forwards were a GEMM node a
// layer on the chain, each 32 x 32 tiles over 128 blocks, most of a node's time its launch, tail
// and round trip through L2. Here a thread block cluster of GEMM_CHAIN_CLUSTER blocks owns 32 rows:
// block x computes columns [32 x, 32 x + 32) of every layer, and the cluster's barrier (release,
// then acquire: the layer's rows, stored to global memory, visible to the other blocks, which stage
// them with cp.async.cg from L2) separates the layers. A layer with fewer columns leaves the
// blocks past them idle until the barrier.
// Members (a population, cudarl/nn/stacked.py): P chains of the same shapes in one launch, member
// blockIdx.z's operands sx (x), sp (every w_l and b_l: one stacked parameter buffer) and sy_l (y_l)
// elements past member 0's; each member's y_l the single chain's bits (P = 1: the strides unused).
// grid (GEMM_CHAIN_CLUSTER, ceil(M / 32), P), block GEMM_THREADS, clusters (GEMM_CHAIN_CLUSTER, 1, 1);
// dynamic shared memory the largest layer's nn_bias_act panels (4 (32 lda(kpad(K)) + 36 kpad(K))
// bytes). n_l multiples of 4, at most 32 GEMM_CHAIN_CLUSTER; w_l, b_l, y_l 16-byte aligned in every
// member (sp, sy_l multiples of 4; the launcher checks). sm_90 and later (clusters); elsewhere it traps,
// and the launcher refuses it.
#define GEMM_CHAIN_LAYERS 4
#define GEMM_CHAIN_CLUSTER 8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GEMM_CHAIN_DIMS __cluster_dims__(GEMM_CHAIN_CLUSTER, 1, 1)

namespace {

// Every block of the cluster, between two steps of a chain: the step's rows, stored to global memory,
// visible to the other blocks (release, then acquire), which stage them with cp.async.cg from L2; and
// this block's reads of its shared memory (the groups' sums) done before the next step's staging.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The ReLU mask of the layer below (act 1: y > 0 ? v : 0, the exact expression of nn.cu's act_bwd, so
// the stored bits are nt's then act_backward's), or none (act 0); then store_tile (group 0's threads).
// y [M, N] is the output of the layer below, read at the tile's own elements.
// With add, out's old values are added to the product first (acc + old: a plain float add, the order of
// a GEMM with beta = 1 adding C after the sum), then the mask.
__device__ __forceinline__ void store_act_grad(float* out, float (&acc)[4][4], const float* y, i64 M, i64 N, i64 m0,
                                               i64 n0, int act, bool add) {
  const int tx = threadIdx.x % (GEMM_T / 4), ty = threadIdx.x / (GEMM_T / 4);
  const i64 n = n0 + 4 * tx;
  if (add && n < N) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const i64 m = m0 + 4 * ty + i;
      if (m >= M) continue;
      const float4 ov = *reinterpret_cast<const float4*>(out + m * N + n);
      acc[i][0] += ov.x;
      acc[i][1] += ov.y;
      acc[i][2] += ov.z;
      acc[i][3] += ov.w;
    }
  }
  if (act == 1 && n < N) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const i64 m = m0 + 4 * ty + i;
      if (m >= M) continue;
      const float4 yv = *reinterpret_cast<const float4*>(y + m * N + n);
      const float yy[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = yy[j] > 0.f ? acc[i][j] : 0.f;
    }
  }
  store_tile(out, acc, M, N, m0, n0);
}

// cudarl_gemm_chain's body (a function, so that the unit holds no #if: cudarl/units.cuh).
// The member blockIdx.z reads and writes its operands sx (x), sp (every weight and bias) and sy_l (y_l)
// elements past member 0's; the rest is the single chain's code.
__device__ __forceinline__ void chain_forward(
    const float* __restrict__ x, i64 sx, i64 M, int K0, i64 ldx, int layers, i64 sp, const float* w0, const float* b0,
    float* y0, i64 sy0, int n0, int act0, const float* w1, const float* b1, float* y1, i64 sy1, int n1, int act1,
    const float* w2, const float* b2, float* y2, i64 sy2, int n2, int act2, const float* w3, const float* b3,
    float* y3, i64 sy3, int n3, int act3) {
  extern __shared__ float4 gemm_smem4[];
  float* sa = reinterpret_cast<float*>(gemm_smem4);
  const i64 m0 = (i64)blockIdx.y * GEMM_T, c0 = (i64)blockIdx.x * GEMM_T, z = blockIdx.z;
  x += z * sx;
  const float* ws[GEMM_CHAIN_LAYERS] = {w0 + z * sp, w1 + z * sp, w2 + z * sp, w3 + z * sp};
  const float* bs[GEMM_CHAIN_LAYERS] = {b0 + z * sp, b1 + z * sp, b2 + z * sp, b3 + z * sp};
  float* ys[GEMM_CHAIN_LAYERS] = {y0 + z * sy0, y1 + z * sy1, y2 + z * sy2, y3 + z * sy3};
  const int ns[GEMM_CHAIN_LAYERS] = {n0, n1, n2, n3}, acts[GEMM_CHAIN_LAYERS] = {act0, act1, act2, act3};
  const float* in = x;
  int K = K0;
  i64 ld = ldx;
  bool vec = K0 % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<unsigned long long>(x) % 16 == 0;
#pragma unroll
  for (int l = 0; l < GEMM_CHAIN_LAYERS; ++l) {
    if (l >= layers) break;
    const i64 N = ns[l];
    if (c0 < N) {  // uniform over the block: tile_product's barriers are the block's
      float acc[4][4];
      float* sb = sa + GEMM_T * lda(kpad(K));
      if (vec) tile_product<false>(acc, sa, sb, sa, in, ws[l], M, N, K, m0, c0, ld);
      else tile_product<false, true>(acc, sa, sb, sa, in, ws[l], M, N, K, m0, c0, ld);
      if (threadIdx.x < GEMM_GROUP) store_bias_act(ys[l], acc, bs[l], M, N, m0, c0, acts[l]);
    }
    if (l + 1 < layers) cluster_barrier();  // every block of the cluster, its tile of layer l stored
    in = ys[l];
    K = (int)N;
    ld = N;
    vec = true;
  }
}

// cudarl_gemm_chain_backward's body.
// The member blockIdx.z: sd (d), sp (every weight) and s_i (y_i and dx_i) elements past member 0's.
__device__ __forceinline__ void chain_dx(
    i64 M, int layers, const float* d, i64 sd, int n_top, int acc_top, i64 sp, const float* w0, const float* y0,
    float* dx0, i64 s0, int k0, int act0, const float* w1, const float* y1, float* dx1, i64 s1, int k1, int act1,
    const float* w2, const float* y2, float* dx2, i64 s2, int k2, int act2, const float* w3, const float* y3,
    float* dx3, i64 s3, int k3, int act3) {
  extern __shared__ float4 gemm_smem4[];
  float* sa = reinterpret_cast<float*>(gemm_smem4);
  const i64 m0 = (i64)blockIdx.y * GEMM_T, c0 = (i64)blockIdx.x * GEMM_T, z = blockIdx.z;
  const float* ws[GEMM_CHAIN_LAYERS] = {w0 + z * sp, w1 + z * sp, w2 + z * sp, w3 + z * sp};
  const float* ys[GEMM_CHAIN_LAYERS] = {y0 + z * s0, y1 + z * s1, y2 + z * s2, y3 + z * s3};
  float* dxs[GEMM_CHAIN_LAYERS] = {dx0 + z * s0, dx1 + z * s1, dx2 + z * s2, dx3 + z * s3};
  const int ks[GEMM_CHAIN_LAYERS] = {k0, k1, k2, k3}, acts[GEMM_CHAIN_LAYERS] = {act0, act1, act2, act3};
  const float* in = d + z * sd;
  int K = n_top;
#pragma unroll
  for (int l = 0; l < GEMM_CHAIN_LAYERS; ++l) {
    if (l >= layers) break;
    const i64 N = ks[l];
    if (c0 < N) {  // uniform over the block: tile_product's barriers are the block's
      float acc[4][4];
      tile_product<true>(acc, sa, sa + GEMM_T * lda(K), sa, in, ws[l], M, N, K, m0, c0, K);
      if (threadIdx.x < GEMM_GROUP) store_act_grad(dxs[l], acc, ys[l], M, N, m0, c0, acts[l], l == 0 && acc_top);
    }
    if (l + 1 < layers) cluster_barrier();  // every block of the cluster, its tile of step l stored
    in = dxs[l];
    K = (int)N;
  }
}

}  // namespace
#else
#define GEMM_CHAIN_DIMS
namespace {  // no clusters before sm_90: the kernels trap (the launchers refuse such a device)
template <class... A>
__device__ void chain_forward(A...) {
  __trap();
}
template <class... A>
__device__ void chain_dx(A...) {
  __trap();
}
}  // namespace
#endif

#if CUDARL_UNIT_IS(chain)
extern "C" __global__ __launch_bounds__(GEMM_THREADS) void GEMM_CHAIN_DIMS cudarl_gemm_chain(
    const float* __restrict__ x, i64 sx, i64 M, int K0, i64 ldx, int layers, i64 sp, const float* w0, const float* b0,
    float* y0, i64 sy0, int n0, int act0, const float* w1, const float* b1, float* y1, i64 sy1, int n1, int act1,
    const float* w2, const float* b2, float* y2, i64 sy2, int n2, int act2, const float* w3, const float* b3,
    float* y3, i64 sy3, int n3, int act3) {
  chain_forward(x, sx, M, K0, ldx, layers, sp, w0, b0, y0, sy0, n0, act0, w1, b1, y1, sy1, n1, act1, w2, b2, y2, sy2,
                n2, act2, w3, b3, y3, sy3, n3, act3);
}

// ---- chain_backward ----------------------------------------------------------------------------
// The backward's dx chain of up to GEMM_CHAIN_LAYERS Linears in one launch: dx_0 = mask_0(d @ w_0^T),
// then dx_i = mask_i(dx_{i-1} @ w_i^T), every dx_i [M, k_i] written (the weight gradients read them
// as the layers' dz). d [M, n_top] is dz of the top layer; w_i [k_i, n_i] its weight, row-major
// (n_0 = n_top, n_i = k_{i-1}), so d_i @ w_i^T is nt's product with bt = w_i; y_i [M, k_i] the output
// of the layer below it, whose ReLU mask (act_i 1; 0: none) makes dx_i that layer's dz. Each step is
// nt's tile product and the mask is act_backward's expression (store_act_grad), so dx_i is bit for bit
// gemm.nt then nn.act_backward of dx_{i-1}. acc_top: dx_0's old values are added to the first step's
// product before its mask (dL/dpsi that the auxiliary heads wrote first: QNetwork.backward_extras).
//
// Why (docs/perf-notes.md, "The backward's dx chain"): under net.gemm = "chain" the backward's
// critical path was a dx GEMM node and a ReLU node a layer, each a launch and a round trip through L2
// for a few us of work. The cluster scheme is the forward chain's (cudarl_gemm_chain): a cluster of
// GEMM_CHAIN_CLUSTER blocks a 32-row slab, block x computing columns [32 x, 32 x + 32) of every
// step, the cluster's barrier between steps; a step with fewer columns leaves the blocks past them
// idle until the barrier. Members as the forward chain's: member blockIdx.z's d, w_i and (y_i, dx_i)
// sd, sp and s_i elements past member 0's (a layer's out and dout rows are laid out alike).
// grid (GEMM_CHAIN_CLUSTER, ceil(M / 32), P), block GEMM_THREADS, clusters (GEMM_CHAIN_CLUSTER, 1, 1);
// dynamic shared memory the largest step's nt panels (4 * 64 lda(n_i) bytes, at least the groups'
// sums). n_top and k_i multiples of 4, k_i at most 32 GEMM_CHAIN_CLUSTER; every pointer 16-byte
// aligned in every member; no dx_i overlapping another operand (the launcher checks). sm_90 and later
// (clusters); elsewhere it traps, and the launcher refuses it.
extern "C" __global__ __launch_bounds__(GEMM_THREADS) void GEMM_CHAIN_DIMS cudarl_gemm_chain_backward(
    i64 M, int layers, const float* d, i64 sd, int n_top, int acc_top, i64 sp, const float* w0, const float* y0,
    float* dx0, i64 s0, int k0, int act0, const float* w1, const float* y1, float* dx1, i64 s1, int k1, int act1,
    const float* w2, const float* y2, float* dx2, i64 s2, int k2, int act2, const float* w3, const float* y3,
    float* dx3, i64 s3, int k3, int act3) {
  chain_dx(M, layers, d, sd, n_top, acc_top, sp, w0, y0, dx0, s0, k0, act0, w1, y1, dx1, s1, k1, act1, w2, y2, dx2, s2,
           k2, act2, w3, y3, dx3, s3, k3, act3);
}
#endif  // chain
