// Row ops the sequence encoders share: RMSNorm (plain, gated, last position), the residual add,
// and colsum, the second stage of every ordered parameter-gradient reduction.
// Twin: cudarl/reference/seq.py. Launchers: cudarl/ops/seq.py. Tests: tests/parity/test_seq.py.
//
// Row kernels map one warp to a row (lanes stride the columns) and reduce a row with the xor
// butterfly of reduce.cuh. The backward kernels also write the partial sums of their weight's
// gradient: block k of `parts` owns rows [k c, (k + 1) c), c = ceil(rows / parts), its 8 warps take
// the chunk's rows in turn and add into a per-warp shared row, and the block writes the sum of the
// 8 warp rows (warp 0 first) to part[k]. colsum then adds the parts in a fixed order (slices, then their sums). No float
// atomics: bitwise reproducible for a given shape and `parts`.
#include <cudarl/reduce.cuh>

typedef long long i64;

#define SEQ_WARPS 8  // warps per block of every kernel here (256 threads)

namespace {

using cudarl::warp_sum;

__device__ __forceinline__ float silu(float z) { return z / (1.f + expf(-z)); }

// The partial weight-gradient rows of one block (see the banner). acc: shared [SEQ_WARPS][n].
// row_fn(r, lane, acc_w) handles row r with the warp's lanes and adds its contribution for column j
// into acc_w[j] (each lane owns the columns j = lane, lane + 32, ...).
template <typename RowFn>
__device__ __forceinline__ void partial_rows(float* acc, int n, i64 rows, int parts, float* part, RowFn row_fn) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = threadIdx.x; j < SEQ_WARPS * n; j += blockDim.x) acc[j] = 0.f;
  __syncthreads();
  const i64 c = (rows + parts - 1) / parts;
  const i64 r0 = (i64)blockIdx.x * c;
  const i64 r1 = r0 + c < rows ? r0 + c : rows;
  for (i64 r = r0 + warp; r < r1; r += SEQ_WARPS) row_fn(r, lane, acc + warp * n);
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float s = acc[j];
    for (int w = 1; w < SEQ_WARPS; ++w) s += acc[w * n + j];
    part[(i64)blockIdx.x * n + j] = s;
  }
}

// 1 / sqrt(mean_j v_j^2 + eps) of a row read through get(j), j < n (lanes stride j).
template <typename Get>
__device__ __forceinline__ float row_rstd(int n, int lane, float eps, Get get) {
  float ss = 0.f;
  for (int j = lane; j < n; j += 32) {
    const float v = get(j);
    ss += v * v;
  }
  return 1.f / sqrtf(warp_sum(ss) / (float)n + eps);
}

// mean_j g_j xhat_j of a row (the projection every RMSNorm backward removes).
template <typename G, typename X>
__device__ __forceinline__ float row_mean_gx(int n, int lane, G g, X xhat) {
  float s = 0.f;
  for (int j = lane; j < n; j += 32) s += g(j) * xhat(j);
  return warp_sum(s) / (float)n;
}

}  // namespace

// ---- rmsnorm_forward ------------------------------------------------------------------------------
// out = x rstd w, rstd = 1 / sqrt(mean x^2 + eps). One warp per row, SEQ_WARPS rows a block.
// Reads 8*rows*n + 4*n bytes, writes 4*rows*(n + 1).
extern "C" __global__ void cudarl_seq_rmsnorm_forward(const float* x, const float* w, float* out, float* rstd, i64 rows,
                                                      int n, float eps) {
  const int lane = threadIdx.x & 31;
  const i64 r = (i64)blockIdx.x * SEQ_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps exit together
  const float* xr = x + r * n;
  const float rs = row_rstd(n, lane, eps, [&](int j) { return xr[j]; });
  if (lane == 0) rstd[r] = rs;
  for (int j = lane; j < n; j += 32) out[r * n + j] = xr[j] * rs * w[j];
}

// ---- rmsnorm_backward -----------------------------------------------------------------------------
// dx = dres + rstd (g - xhat mean(g xhat)), g = dout w, xhat = x rstd; part[k] = the chunk's sum of
// dout xhat (banner). grid = parts, block = 256, shared 4 * SEQ_WARPS * n bytes. dx may alias dres.
// dres has rows / k rows: the residual gradient of the last row of each group of k (the others have none;
// k = 1: every row's). Reads 16*rows*n bytes, writes 4*rows*n + 4*parts*n.
extern "C" __global__ void cudarl_seq_rmsnorm_backward(const float* dout, const float* x, const float* w,
                                                       const float* rstd, const float* dres, float* dx, float* part,
                                                       i64 rows, int n, int parts, int k) {
  extern __shared__ float acc[];
  partial_rows(acc, n, rows, parts, part, [&](i64 r, int lane, float* acc_w) {
    const i64 o = r * n;
    const float rs = rstd[r];
    const float m = row_mean_gx(n, lane, [&](int j) { return dout[o + j] * w[j]; }, [&](int j) { return x[o + j] * rs; });
    const float* dr = r % k == k - 1 ? dres + (r / k) * n : nullptr;
    for (int j = lane; j < n; j += 32) {
      const float xh = x[o + j] * rs, d = dout[o + j];
      dx[o + j] = (dr ? dr[j] : 0.f) + rs * (d * w[j] - xh * m);
      acc_w[j] += d * xh;
    }
  });
}

// ---- last_rmsnorm_forward -------------------------------------------------------------------------
// psi: out[b] = RMSNorm(h[b, W - 1]). h [B, W, n]; out [B, n]; rstd [B]. One warp per sample.
// Reads 8*B*n bytes, writes 4*B*(n + 1).
extern "C" __global__ void cudarl_seq_last_rmsnorm_forward(const float* h, const float* w, float* out, float* rstd,
                                                           i64 B, int W, int n, float eps) {
  const int lane = threadIdx.x & 31;
  const i64 b = (i64)blockIdx.x * SEQ_WARPS + (threadIdx.x >> 5);
  if (b >= B) return;
  const float* xr = h + (b * W + (W - 1)) * (i64)n;
  const float rs = row_rstd(n, lane, eps, [&](int j) { return xr[j]; });
  if (lane == 0) rstd[b] = rs;
  for (int j = lane; j < n; j += 32) out[b * n + j] = xr[j] * rs * w[j];
}

// ---- last_rmsnorm_backward ------------------------------------------------------------------------
// dh[b, W - 1] = rstd (g - xhat mean(g xhat)) and dh[b, t < W - 1] = 0 (the whole gradient w.r.t. h);
// part as rmsnorm_backward over the B rows. grid = parts, block = 256, shared 4 * SEQ_WARPS * n.
// Reads 12*B*n bytes, writes 4*B*W*n + 4*parts*n.
extern "C" __global__ void cudarl_seq_last_rmsnorm_backward(const float* dout, const float* h, const float* w,
                                                            const float* rstd, float* dh, float* part, i64 B, int W,
                                                            int n, int parts) {
  extern __shared__ float acc[];
  partial_rows(acc, n, B, parts, part, [&](i64 b, int lane, float* acc_w) {
    const i64 o = (b * W + (W - 1)) * (i64)n;
    const float rs = rstd[b];
    const float* d = dout + b * n;
    const float m = row_mean_gx(n, lane, [&](int j) { return d[j] * w[j]; }, [&](int j) { return h[o + j] * rs; });
    for (i64 j = lane; j < (i64)(W - 1) * n; j += 32) dh[b * W * (i64)n + j] = 0.f;
    for (int j = lane; j < n; j += 32) {
      const float xh = h[o + j] * rs;
      dh[o + j] = rs * (d[j] * w[j] - xh * m);
      acc_w[j] += d[j] * xh;
    }
  });
}

// ---- gated_rmsnorm_forward ------------------------------------------------------------------------
// Rows of at most 32 GATED_CACHE columns keep each lane's g in registers between the sum of squares and the
// output (the issue-22 SSM's E = 256: 8 a lane), where the loop form loaded y and z and took silu twice (the
// same operations in the same order: the same bits).
#define GATED_CACHE 8
// Mamba2's gated norm: g = y silu(z), out = g rstd w, rstd = 1 / sqrt(mean g^2 + eps); z is the
// first n columns of zx [k rows, ld] (row r's z: zx's row r k + k - 1, the last of its group; k = 1 for
// row r). One warp per row. Reads 8*rows*n + 4*n bytes, writes 4*rows*(n + 1).
extern "C" __global__ void cudarl_seq_gated_rmsnorm_forward(const float* y, const float* zx, const float* w,
                                                            float* out, float* rstd, i64 rows, int n, i64 ld,
                                                            float eps, int k) {
  const int lane = threadIdx.x & 31;
  const i64 r = (i64)blockIdx.x * SEQ_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  const float* yr = y + r * n;
  const float* zr = zx + (r * k + k - 1) * ld;
  if (n <= 32 * GATED_CACHE) {  // g kept in registers between the two passes: one load and one silu an element
    float g[GATED_CACHE];
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < GATED_CACHE; ++u) {
      const int j = lane + 32 * u;
      g[u] = j < n ? yr[j] * silu(zr[j]) : 0.f;
      if (j < n) ss += g[u] * g[u];
    }
    const float rs = 1.f / sqrtf(warp_sum(ss) / (float)n + eps);  // row_rstd's sum, in its order
    if (lane == 0) rstd[r] = rs;
#pragma unroll
    for (int u = 0; u < GATED_CACHE; ++u) {
      const int j = lane + 32 * u;
      if (j < n) out[r * n + j] = g[u] * rs * w[j];
    }
    return;
  }
  const float rs = row_rstd(n, lane, eps, [&](int j) { return yr[j] * silu(zr[j]); });
  if (lane == 0) rstd[r] = rs;
  for (int j = lane; j < n; j += 32) out[r * n + j] = yr[j] * silu(zr[j]) * rs * w[j];
}

// ---- gated_rmsnorm_backward -----------------------------------------------------------------------
// With s = sigmoid(z), ghat = y z s rstd: dg = rstd (dout w - ghat mean(dout w ghat)), dy = dg z s,
// dz = dg y s (1 + z (1 - s)) into zx's first n columns of dzx (no other column touched); part: the
// chunk's sums of dout ghat; zx and dzx [k rows, ld] as the forward's, and the other k - 1 rows of each group
// get dz = 0 (the whole gradient w.r.t. z). grid = parts, block = 256, shared 4 * SEQ_WARPS * n.
// Reads 16*rows*n bytes, writes 8*rows*n + 4*(k - 1)*rows*n + 4*parts*n.
extern "C" __global__ void cudarl_seq_gated_rmsnorm_backward(const float* dout, const float* y, const float* zx,
                                                             const float* w, const float* rstd, float* dy, float* dzx,
                                                             float* part, i64 rows, int n, i64 ld, int parts, int k) {
  extern __shared__ float acc[];
  {  // dz = 0 on the other k - 1 rows of each group of this block's rows, by all its warps, a row a warp at a time
    // (one warp a group, an i64 division an element, was 70 us of the SSM step's top block: ncu H100, 76e1a80)
    const i64 c = (rows + parts - 1) / parts, r0 = (i64)blockIdx.x * c, r1 = r0 + c < rows ? r0 + c : rows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (i64 g = r0 * (k - 1) + warp; g < r1 * (k - 1); g += SEQ_WARPS) {  // g = (r, q), q < k - 1
      float* zrow = dzx + ((g / (k - 1)) * k + g % (k - 1)) * ld;
      for (int j = lane; j < n; j += 32) zrow[j] = 0.f;
    }
  }
  partial_rows(acc, n, rows, parts, part, [&](i64 r, int lane, float* acc_w) {
    const i64 o = r * n, oz = (r * k + k - 1) * ld;
    const float rs = rstd[r];
    const float m = row_mean_gx(
        n, lane, [&](int j) { return dout[o + j] * w[j]; }, [&](int j) { return y[o + j] * silu(zx[oz + j]) * rs; });
    for (int j = lane; j < n; j += 32) {
      const float z = zx[oz + j], yy = y[o + j], d = dout[o + j];
      const float s = 1.f / (1.f + expf(-z));
      const float gh = yy * (z * s) * rs;
      const float dg = rs * (d * w[j] - gh * m);
      dy[o + j] = dg * (z * s);
      dzx[oz + j] = dg * yy * (s * (1.f + z * (1.f - s)));
      acc_w[j] += d * gh;
    }
  });
}

// ---- residual_add ---------------------------------------------------------------------------------
// out = a + b, one thread per element, grid-stride. out may alias a or b. a may have k rows of `cols` for
// each of out's: its last of each group is added (k = 1: a is out's shape). Reads 8n bytes, writes 4n.
extern "C" __global__ void cudarl_seq_residual_add(const float* a, const float* b, float* out, i64 n, i64 cols, int k) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = a[k == 1 ? i : ((i / cols) * k + k - 1) * cols + i % cols] + b[i];
}

// ---- colsum ---------------------------------------------------------------------------------------
// out[j] = sum over the COLSUM_SLICES slices of the parts (slice g: parts [g c, (g + 1) c), c =
// ceil(parts / COLSUM_SLICES), each summed in ascending order), the non-empty slices' sums added in
// ascending order: the twin's colsum. Block (32 columns, COLSUM_SLICES slices), the slices' sums in
// shared memory; a slice's loads go out COLSUM_BATCH at a time before their adds. One thread a column
// over 512 parts was latency-bound (17-21 us on the H200 at 8bd35a5). Reads 4*parts*n bytes, writes 4n.
#define COLSUM_SLICES 8
#define COLSUM_BATCH 16
extern "C" __global__ void cudarl_seq_colsum(const float* part, float* out, int parts, i64 n) {
  __shared__ float slice_sum[COLSUM_SLICES][32];
  const i64 j = blockIdx.x * (i64)32 + threadIdx.x;
  const int g = threadIdx.y, c = (parts + COLSUM_SLICES - 1) / COLSUM_SLICES;
  const int k0 = g * c, k1 = min(k0 + c, parts);
  if (j < n && k0 < k1) {
    float s = part[(i64)k0 * n + j];
    int k = k0 + 1;
    for (; k + COLSUM_BATCH <= k1; k += COLSUM_BATCH) {
      float v[COLSUM_BATCH];
#pragma unroll
      for (int u = 0; u < COLSUM_BATCH; ++u) v[u] = part[(i64)(k + u) * n + j];
#pragma unroll
      for (int u = 0; u < COLSUM_BATCH; ++u) s += v[u];
    }
    for (; k < k1; ++k) s += part[(i64)k * n + j];
    slice_sum[g][threadIdx.x] = s;
  }
  __syncthreads();
  if (g == 0 && j < n) {
    float s = slice_sum[0][threadIdx.x];  // slice 0 is never empty (parts >= 1)
    for (int h = 1; h < COLSUM_SLICES && h * c < parts; ++h) s += slice_sum[h][threadIdx.x];
    out[j] = s;
  }
}
