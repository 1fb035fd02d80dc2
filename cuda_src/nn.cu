// Layer and head kernels with hand-written backward passes.
// Twin: cudarl/reference/nn.py. Launchers: cudarl/ops/nn.py. Tests: tests/parity/test_nn.py.
//
// Activation codes (shared with the twin): 0 identity, 1 ReLU, 2 sigmoid; derivatives are
// taken from the activation's output y: relu' = [y > 0], sigmoid' = y (1 - y).
// Column reductions (bias, gamma, beta gradients) are blocks of a few columns each (see each
// kernel's banner) with a fixed row order per thread and a fixed tree across threads: no
// atomics, bitwise reproducible for a given shape.
//
// The member axis (a population's agents, cudarl/nn/stacked.py): the kernels whose last arguments are
// s_<pointer> strides take blockIdx.y as the member; each pointer advances by member * its stride (in
// elements), and the x grid, block and per-thread work are the single launch's, so member m computes
// exactly what a single launch on its slices would. One member (gridDim.y = 1, strides unused) is the
// single network's launch.
#include <cudarl/dueling.cuh>
#include <cudarl/units.cuh>
#include <cudarl/philox.cuh>
#include <cudarl/reduce.cuh>

typedef long long i64;

namespace {

__device__ __forceinline__ float act_fwd(float z, int act) {
  if (act == 1) return z > 0.f ? z : 0.f;
  if (act == 2) return 1.f / (1.f + expf(-z));
  return z;
}

__device__ __forceinline__ float act_bwd(float dout, float y, int act) {
  if (act == 1) return y > 0.f ? dout : 0.f;
  if (act == 2) return dout * (y * (1.f - y));
  return dout;
}

using cudarl::warp_sum;  // xor butterfly: every lane ends with the same, order-fixed sum

// Tree-reduce sh[ty][tx] over ty (TY rows, a power of 2) into sh[0][tx]; blockDim = (LD - 1, TY).
template <int TY, int LD>
__device__ __forceinline__ void column_tree(float (*sh)[LD]) {
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int s = TY / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (ty < s) sh[ty][tx] += sh[ty + s][tx];
  }
  __syncthreads();
}

}  // namespace

// ---- bias_act_forward ---------------------------------------------------------------------
// out[r, c] = act(y[r, c] + bias[c]). One thread per element, grid-stride.
// Reads 4*rows*cols + 4*cols bytes, writes 4*rows*cols. out may alias y.
#if CUDARL_UNIT_IS(bias_act_forward)
extern "C" __global__ void cudarl_nn_bias_act_forward(const float* y, const float* bias, float* out,
                                                      i64 rows, i64 cols, int act) {
  const i64 n = rows * cols;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = act_fwd(y[i] + bias[i % cols], act);
}
#endif  // bias_act_forward

// ---- bias_act_backward --------------------------------------------------------------------
// dz = dout * act'(out); dbias[c] = sum_r dz[r, c].
// block (BAB_TX, BAB_TY) = (8, 128), grid.x = ceil(cols / 8): thread (tx, ty) owns column
// 8*bx + tx and rows ty, ty + 128, ... in ascending order (its partial sum), then a fixed tree
// over ty; grid.y = members. Reads 8*rows*cols bytes, writes 4*rows*cols + 4*cols.
// Why this shape (ncu, docs/perf-notes.md): with (32, 32) blocks a 512 x 256 launch was 8 blocks
// whose threads each walked 16 rows, and as dz may alias dout every row was a dependent memory
// round trip (5.5-8 us); here 32 blocks, 4 rows a thread, all loads of a thread before its stores.
// A warp reads 4 rows x 8 columns: four whole 32-byte sectors per access.
// A thread's rows go in chunks of BAB_CHUNK (every load of a chunk before its stores), or of
// BAB_TALL_CHUNK from BAB_TALL_ROWS rows on: the encoders' projections (32,768 rows, 16 and 81 blocks)
// walked 64 chunks a thread, a round trip each (40 and 48 us, ncu H100 at a215948). The chunk only
// batches the loads: a thread adds its rows in the same order either way (the same bits).
// With the identity (act 0) and dz == dout nothing is stored (dz already is dout): the kernel then
// only reads, so it may run beside other readers of dout (cudarl/nn/layers.py, Linear.backward).
#define BAB_TX 8
#define BAB_TY 128
#define BAB_CHUNK 4
#define BAB_TALL_CHUNK 16
#define BAB_TALL_ROWS (BAB_TY * BAB_TALL_CHUNK * 2)

namespace {

template <int CHUNK>
__device__ __forceinline__ float bias_act_rows(const float* dout, const float* out, float* dz, i64 rows, i64 cols,
                                               i64 c, int ty, int act, bool store) {
  float acc = 0.f;
  for (i64 r0 = ty; r0 < rows; r0 += BAB_TY * CHUNK) {
    float g[CHUNK];
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) {  // every load of the chunk before its stores (dz may alias dout)
      const i64 r = r0 + BAB_TY * u;
      g[u] = r < rows ? act_bwd(dout[r * cols + c], out[r * cols + c], act) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) {
      const i64 r = r0 + BAB_TY * u;
      if (r < rows) {
        if (store) dz[r * cols + c] = g[u];
        acc += g[u];
      }
    }
  }
  return acc;
}

}  // namespace

#if CUDARL_UNIT_IS(bias_act_backward)
extern "C" __global__ __launch_bounds__(BAB_TX * BAB_TY) void cudarl_nn_bias_act_backward(
    const float* dout, const float* out, float* dz, float* dbias, i64 rows, i64 cols, int act, i64 s_dout,
    i64 s_out, i64 s_dz, i64 s_dbias) {
  __shared__ float sh[BAB_TY][BAB_TX + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 m = blockIdx.y;  // the member
  dout += m * s_dout;
  out += m * s_out;
  dz += m * s_dz;
  dbias += m * s_dbias;
  const i64 c = (i64)blockIdx.x * BAB_TX + tx;
  const bool store = !(act == 0 && dz == dout);
  float acc = 0.f;
  if (c < cols)
    acc = rows >= BAB_TALL_ROWS ? bias_act_rows<BAB_TALL_CHUNK>(dout, out, dz, rows, cols, c, ty, act, store)
                                : bias_act_rows<BAB_CHUNK>(dout, out, dz, rows, cols, c, ty, act, store);
  sh[ty][tx] = acc;
  column_tree<BAB_TY, BAB_TX + 1>(sh);
  if (ty == 0 && c < cols) dbias[c] = sh[0][tx];
}
#endif  // bias_act_backward

// ---- act_backward -------------------------------------------------------------------------
// dz = dout * act'(out), elementwise (bias_act_backward's dz without its column sums): on the
// backward's dx chain the ReLU mask is all the next GEMM waits for, and the bias gradient, a
// column sum of dz, goes to the weight-gradient branch as bias_act_backward(dz, ., dz, db, 0),
// which only reads: the same dz and dbias bits as one bias_act_backward, and a 4-us node on the
// chain becomes a ~2-us one (ncu, docs/perf-notes.md). One thread per element, grid-stride;
// grid.y = members. dz may alias dout. Reads 8*n bytes, writes 4*n (a member).
#if CUDARL_UNIT_IS(act_backward)
extern "C" __global__ void cudarl_nn_act_backward(const float* dout, const float* out, float* dz, i64 n, int act,
                                                  i64 s_dout, i64 s_out, i64 s_dz) {
  const i64 m = blockIdx.y;
  dout += m * s_dout;
  out += m * s_out;
  dz += m * s_dz;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    dz[i] = act_bwd(dout[i], out[i], act);
}
#endif  // act_backward

// ---- layernorm_forward --------------------------------------------------------------------
// One warp per row (8 rows per 256-thread block). Two passes over the row (mean, then
// variance of the centred values), then out = act((x - mu) * rstd * gamma + beta).
// Reads 4*rows*cols*3 + 8*cols bytes, writes 4*rows*cols + 8*rows.
#if CUDARL_UNIT_IS(layernorm_forward)
extern "C" __global__ void cudarl_nn_layernorm_forward(const float* x, const float* gamma, const float* beta,
                                                       float* out, float* mean, float* rstd, i64 rows, i64 cols,
                                                       float eps, int act) {
  const int lane = threadIdx.x & 31;
  const i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;  // whole warps exit together
  const float* xr = x + r * cols;
  float s = 0.f;
  for (i64 c = lane; c < cols; c += 32) s += xr[c];
  const float mu = warp_sum(s) / (float)cols;
  float q = 0.f;
  for (i64 c = lane; c < cols; c += 32) { const float d = xr[c] - mu; q += d * d; }
  const float var = warp_sum(q) / (float)cols;
  const float rs = 1.f / sqrtf(var + eps);
  if (lane == 0) { mean[r] = mu; rstd[r] = rs; }
  for (i64 c = lane; c < cols; c += 32) out[r * cols + c] = act_fwd((xr[c] - mu) * rs * gamma[c] + beta[c], act);
}
#endif  // layernorm_forward

// ---- layernorm_backward (input part) -------------------------------------------------------
// One warp per row: dy = dout * act'(out), g = dy * gamma, xhat = (x - mu) rstd,
// dx = rstd (g - mean(g) - xhat mean(g xhat)). Reads 4*rows*cols*3 + 4*cols + 8*rows, writes 4*rows*cols.
#if CUDARL_UNIT_IS(layernorm_backward_input)
extern "C" __global__ void cudarl_nn_layernorm_backward_input(const float* dout, const float* out, const float* x,
                                                              const float* gamma, const float* mean, const float* rstd,
                                                              float* dx, i64 rows, i64 cols, int act) {
  const int lane = threadIdx.x & 31;
  const i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;
  const float mu = mean[r], rs = rstd[r];
  const i64 base = r * cols;
  float sg = 0.f, sgx = 0.f;
  for (i64 c = lane; c < cols; c += 32) {
    const float g = act_bwd(dout[base + c], out[base + c], act) * gamma[c];
    const float xh = (x[base + c] - mu) * rs;
    sg += g;
    sgx += g * xh;
  }
  const float mg = warp_sum(sg) / (float)cols, mgx = warp_sum(sgx) / (float)cols;
  for (i64 c = lane; c < cols; c += 32) {
    const float g = act_bwd(dout[base + c], out[base + c], act) * gamma[c];
    const float xh = (x[base + c] - mu) * rs;
    dx[base + c] = rs * (g - mg - xh * mgx);
  }
}
#endif  // layernorm_backward_input

// ---- layernorm_backward (parameter part) ---------------------------------------------------
// dgamma[c] = sum_r dy xhat, dbeta[c] = sum_r dy. Same mapping as bias_act_backward.
// Reads 4*rows*cols*3 + 8*rows bytes, writes 8*cols.
#if CUDARL_UNIT_IS(layernorm_backward_params)
extern "C" __global__ void cudarl_nn_layernorm_backward_params(const float* dout, const float* out, const float* x,
                                                               const float* mean, const float* rstd, float* dgamma,
                                                               float* dbeta, i64 rows, i64 cols, int act) {
  __shared__ float sg[32][33];
  __shared__ float sb[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 c = (i64)blockIdx.x * 32 + tx;
  float ag = 0.f, ab = 0.f;
  if (c < cols) {
    for (i64 r = ty; r < rows; r += 32) {
      const i64 i = r * cols + c;
      const float dy = act_bwd(dout[i], out[i], act);
      ag += dy * ((x[i] - mean[r]) * rstd[r]);
      ab += dy;
    }
  }
  sg[ty][tx] = ag;
  sb[ty][tx] = ab;
  column_tree<32, 33>(sg);
  column_tree<32, 33>(sb);
  if (ty == 0 && c < cols) { dgamma[c] = sg[0][tx]; dbeta[c] = sb[0][tx]; }
}
#endif  // layernorm_backward_params

// ---- dueling_forward / dueling_backward -----------------------------------------------------
// va [B, (1 + A) Z] = (V [B, Z], Adv [B, A, Z]); logits [B, A, Z] = (V + Adv) - sum_a Adv / A.
// One thread per (b, z), actions summed in ascending order; grid.y = members. Reads/writes
// 4*B*(1+A)*Z bytes (a member).
#if CUDARL_UNIT_IS(dueling_forward)
extern "C" __global__ void cudarl_nn_dueling_forward(const float* va, float* logits, i64 B, int A, int Z, i64 s_va,
                                                     i64 s_logits) {
  va += blockIdx.y * s_va;
  logits += blockIdx.y * s_logits;
  const i64 n = B * Z;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 b = i / Z;
    const int z = (int)(i % Z);
    const float* row = va + b * (i64)(1 + A) * Z;
    const float m = cudarl::dueling_mean(row, A, Z, z);
    for (int a = 0; a < A; ++a) logits[(b * A + a) * Z + z] = cudarl::dueling_logit(row, m, a, Z, z);
  }
}
#endif  // dueling_forward

// dV[b, z] = sum_a dL[b, a, z]; dAdv[b, a, z] = dL[b, a, z] - dV[b, z] / A; accumulate = 1 adds them
// into dva (a second loss's gradient on the logits, e.g. CQL's beside the C51 loss's dva).
#if CUDARL_UNIT_IS(dueling_backward)
extern "C" __global__ void cudarl_nn_dueling_backward(const float* dlogits, float* dva, i64 B, int A, int Z,
                                                      int accumulate, i64 s_dlogits, i64 s_dva) {
  dlogits += blockIdx.y * s_dlogits;
  dva += blockIdx.y * s_dva;
  const i64 n = B * Z;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const i64 b = i / Z;
    cudarl::dueling_backward_atom(dlogits + b * (i64)A * Z, dva + b * (i64)(1 + A) * Z, A, Z, (int)(i % Z),
                                  accumulate != 0);
  }
}
#endif  // dueling_backward

// ---- iqn_sample_tau -------------------------------------------------------------------------
// tau[j] = uniform draw j of Philox stream (seed, counter[0], stream_id). One thread per
// Philox block (4 draws). Reads 8 bytes, writes 4*n.
#if CUDARL_UNIT_IS(iqn_sample_tau)
extern "C" __global__ void cudarl_nn_iqn_sample_tau(float* tau, const unsigned long long* counter, i64 n,
                                                    unsigned long long seed, unsigned int stream_id) {
  const i64 nb = (n + 3) / 4;
  const unsigned long long ctr = counter[0];
  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < nb; t += (i64)gridDim.x * blockDim.x) {
    const uint4 v = cudarl::philox_block(seed, ctr, stream_id, (unsigned int)t);
    const unsigned int lanes[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * t + k < n) tau[4 * t + k] = cudarl::u32_to_uniform(lanes[k]);
  }
}
#endif  // iqn_sample_tau

// ---- iqn_cos_embed --------------------------------------------------------------------------
// cos[r, i] = cos(pi * i * tau[r]), in double then rounded once (matches the twin to the last
// bit except where two correctly-rounded-ish libms disagree). One thread per output.
// Reads 4*rows bytes, writes 4*rows*C.
#if CUDARL_UNIT_IS(iqn_cos_embed)
extern "C" __global__ void cudarl_nn_iqn_cos_embed(const float* tau, float* cos_out, i64 rows, int C) {
  const i64 n = rows * C;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
    const i64 r = k / C;
    const int i = (int)(k % C);
    cos_out[k] = (float)cos((3.141592653589793 * (double)i) * (double)tau[r]);
  }
}
#endif  // iqn_cos_embed

// ---- iqn_mix_forward / iqn_mix_backward -------------------------------------------------------
// h[b, n, d] = psi[b, d] * phi[b, n, d]. One thread per output. Reads 8*B*N*D, writes 4*B*N*D.
#if CUDARL_UNIT_IS(iqn_mix_forward)
extern "C" __global__ void cudarl_nn_iqn_mix_forward(const float* psi, const float* phi, float* h, i64 B, int N, int D) {
  const i64 total = B * N * (i64)D;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < total; k += (i64)gridDim.x * blockDim.x) {
    const i64 b = k / ((i64)N * D);
    const int d = (int)(k % D);
    h[k] = phi[k] * psi[b * D + d];
  }
}
#endif  // iqn_mix_forward

// dphi = dh * psi[b]; dpsi[b, d] = sum_n dh[b, n, d] phi[b, n, d] (n ascending).
// One thread per (b, d). Reads 8*B*N*D + 4*B*D bytes, writes 4*B*N*D + 4*B*D.
#if CUDARL_UNIT_IS(iqn_mix_backward)
extern "C" __global__ void cudarl_nn_iqn_mix_backward(const float* dh, const float* psi, const float* phi,
                                                      float* dpsi, float* dphi, i64 B, int N, int D) {
  const i64 total = B * (i64)D;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < total; k += (i64)gridDim.x * blockDim.x) {
    const i64 b = k / D;
    const int d = (int)(k % D);
    const float p = psi[k];
    const i64 base = b * (i64)N * D + d;
    float acc = dh[base] * phi[base];
    dphi[base] = dh[base] * p;
    for (int n = 1; n < N; ++n) {
      const i64 j = base + (i64)n * D;
      acc += dh[j] * phi[j];
      dphi[j] = dh[j] * p;
    }
    dpsi[k] = acc;
  }
}
#endif  // iqn_mix_backward

// ---- plan_gate / plan_loss ---------------------------------------------------------------------
// plan [B, 2] = (conviction, readiness). scale[b] = readiness >= threshold ? conviction : 1
// exactly (the gate: no effect until ready, so conviction can never shrink every position at
// init, the seed's bug). One thread per row. Reads 8*B bytes, writes 4*B.
#if CUDARL_UNIT_IS(plan_gate)
extern "C" __global__ void cudarl_nn_plan_gate(const float* plan, float* scale, i64 B, float threshold) {
  for (i64 b = blockIdx.x * (i64)blockDim.x + threadIdx.x; b < B; b += (i64)gridDim.x * blockDim.x)
    scale[b] = plan[2 * b + 1] >= threshold ? plan[2 * b] : 1.f;
}
#endif  // plan_gate

#define PLAN_THREADS 256
namespace {
__device__ __forceinline__ float plan_clamp(float x) { return fminf(fmaxf(x, 1e-6f), 1.f - 1e-6f); }

// Whether row b trains the plan head: its data action is the greedy one (the first maximum of
// q[b]) and not flat.
__device__ __forceinline__ bool plan_row(const float* q, const int* actions, const float* levels, i64 b, int A) {
  const float* qb = q + b * A;
  int g = 0;
  for (int a = 1; a < A; ++a)
    if (qb[a] > qb[g]) g = a;
  return actions[b] == g && levels[g] != 0.f;
}
}  // namespace

// plan_loss: the plan head's loss gradient dplan [B, 2] and its statistics, from the batch's n-step
// returns R = ret of the rows whose data action is the greedy one and not flat (m_b; n of them):
//   Rbar = sum m|R| / n,  w+ = max(R, 0) / Rbar,  w- = max(-R, 0) / Rbar
//   L = (1/n) sum_b m_b [-w+ log c - w- log(1 - c) - w+ log r - (w- + h) log(1 - r)]
//   dplan[b] = (m_b / n) (-w+/c + w-/(1 - c), -w+/r + (w- + h)/(1 - r))   (c, r clamped to [1e-6, 1 - 1e-6])
// so conviction c -> E[R+ | s] / E[|R| | s] and readiness r -> E[R+ | s] / (E[|R| | s] + h Rbar),
// which reaches 1/2 exactly where E[R | s] >= h Rbar (the hurdle h in units of the batch's mean |R|).
// stats[0] = share of the batch with r >= threshold (the gate open), stats[1] = mean gate scale.
// One block of PLAN_THREADS: strided per-thread sums, block_sum (fixed order). Reads 8B + 4AB + 8B + 4A;
// writes 8B + 8 bytes.
#if CUDARL_UNIT_IS(plan_loss)
extern "C" __global__ void cudarl_nn_plan_loss(const float* plan, const float* q, const int* actions, const float* ret,
                                               const float* levels, float* dplan, float* stats, int B, int A,
                                               float hurdle, float threshold) {
  __shared__ float sh[PLAN_THREADS];
  const int t = threadIdx.x;
  float n = 0.f, abs_r = 0.f, ready = 0.f, scale = 0.f;
  for (i64 b = t; b < B; b += PLAN_THREADS) {
    if (plan_row(q, actions, levels, b, A)) { n += 1.f; abs_r += fabsf(ret[b]); }
    const bool open = plan[2 * b + 1] >= threshold;
    ready += open ? 1.f : 0.f;
    scale += open ? plan[2 * b] : 1.f;
  }
  n = cudarl::block_sum(n, sh, PLAN_THREADS);
  abs_r = cudarl::block_sum(abs_r, sh, PLAN_THREADS);
  ready = cudarl::block_sum(ready, sh, PLAN_THREADS);
  scale = cudarl::block_sum(scale, sh, PLAN_THREADS);
  const bool learn = n > 0.f && abs_r > 0.f;
  const float rbar = learn ? abs_r / n : 1.f;
  for (i64 b = t; b < B; b += PLAN_THREADS) {
    float dc = 0.f, dr = 0.f;
    if (learn && plan_row(q, actions, levels, b, A)) {
      const float wp = fmaxf(ret[b], 0.f) / rbar, wn = fmaxf(-ret[b], 0.f) / rbar;
      const float c = plan_clamp(plan[2 * b]), r = plan_clamp(plan[2 * b + 1]);
      dc = (-wp / c + wn / (1.f - c)) / n;
      dr = (-wp / r + (wn + hurdle) / (1.f - r)) / n;
    }
    dplan[2 * b] = dc;
    dplan[2 * b + 1] = dr;
  }
  if (t == 0) { stats[0] = ready / (float)B; stats[1] = scale / (float)B; }
}
#endif  // plan_loss
