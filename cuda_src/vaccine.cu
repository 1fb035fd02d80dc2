// Gradient Vaccine (Wang et al., ICLR 2021) between the main and the auxiliary gradients on the
// encoder (agent.aux = [..., "vaccine"]). Twin: cudarl/reference/vaccine.py (the equations and our
// choices). Launchers: cudarl/ops/vaccine.py. Two launches, no float atomics, fixed-order sums:
// dots_control (a block a VC_CHUNK chunk; the last block to finish, by an integer ticket, the control
// step), apply (grid-stride); the _plus pair reads the flat gradient as full + plus (causal's own gradient
// folded in).

#include <cudarl/reduce.cuh>

#define VC_THREADS 256
#define VC_CHUNK 4096
#define VC_PHI_MAX (1.0f - 1e-6f)

// ---------------------------------------------------------------------------------------------
// The control step (one block, thread 0 writes): sums the P partials (strided then a tree), phi = cosine,
// the coefficient c of the paper's eq. 4 against phi_hat = state[0] (read before it moves), then the EMA
// phi_hat <- (1 - beta) phi_hat + beta phi; state = [phi_hat, phi, c, |g_m|, |g_a|]. The partials were
// written by other blocks of the launch before their tickets: read from L2.
__device__ __forceinline__ void vc_control(const float* partial, float* __restrict__ state, int P, float beta,
                                           float* sh) {
  float mg = 0.f, mm = 0.f, aa = 0.f;
  for (int p = threadIdx.x; p < P; p += VC_THREADS) {
    mg += __ldcg(partial + 3 * p + 0);
    mm += __ldcg(partial + 3 * p + 1);
    aa += __ldcg(partial + 3 * p + 2);
  }
  mg = cudarl::block_sum(mg, sh, VC_THREADS);
  mm = cudarl::block_sum(mm, sh, VC_THREADS);
  aa = cudarl::block_sum(aa, sh, VC_THREADS);
  if (threadIdx.x != 0) return;
  const float target = fminf(state[0], VC_PHI_MAX);
  const float nm = sqrtf(mm), na = sqrtf(aa);
  const bool both = nm > 0.f && na > 0.f;
  const float phi = both ? mg / (nm * na) : 0.f;
  float c = 0.f;
  if (both && phi < target) {
    const float st = sqrtf(1.f - target * target);
    c = na * (target * sqrtf(fmaxf(1.f - phi * phi, 0.f)) - phi * st) / (nm * st);
  }
  state[0] = (1.f - beta) * target + beta * phi;
  state[1] = phi;
  state[2] = c;
  state[3] = nm;
  state[4] = na;
}

// ---------------------------------------------------------------------------------------------
// The flat gradient's element i: full[i], or with PLUS full[i] + plus[i] (another signal's own gradient,
// causal intervention's, added on the fly where its grad phase once added it over the whole buffer first:
// the same IEEE sum, so the same bits; one node fewer on the MLP step's tail, issue 19).
template <bool PLUS>
__device__ __forceinline__ float vc_full(const float* full, const float* plus, long long i) {
  return PLUS ? full[i] + plus[i] : full[i];
}

// The body of dots_control over chunk blockIdx.x of [lo, hi), with g_m = full - aux and g_a = aux:
//   partial[p] = (sum g_m g_a, sum g_m^2, sum g_a^2) (elements strided per thread in order, then the
//   block's tree); the block that finishes last (cudarl::last_block on the integer ticket *done, 0 at
//   launch and left 0) then takes the control step over the P = gridDim.x partials. One launch where
//   dots and a one-block control kernel were two (issue 19: one node fewer on the MLP step's path),
//   the same arithmetic in the same order: the same bits.
template <bool PLUS>
__device__ __forceinline__ void vc_dots_control(const float* __restrict__ full, const float* __restrict__ plus,
                                                const float* __restrict__ aux, float* partial,
                                                float* __restrict__ state, unsigned int* __restrict__ done,
                                                long long lo, long long hi, float beta) {
  __shared__ float sh[VC_THREADS];
  const long long start = lo + (long long)blockIdx.x * VC_CHUNK;
  const long long stop = min(start + VC_CHUNK, hi);
  float mg = 0.f, mm = 0.f, aa = 0.f;
  for (long long i = start + threadIdx.x; i < stop; i += VC_THREADS) {
    const float a = aux[i];
    const float m = vc_full<PLUS>(full, plus, i) - a;
    mg += m * a;
    mm += m * m;
    aa += a * a;
  }
  mg = cudarl::block_sum(mg, sh, VC_THREADS);
  mm = cudarl::block_sum(mm, sh, VC_THREADS);
  aa = cudarl::block_sum(aa, sh, VC_THREADS);
  if (threadIdx.x == 0) {
    partial[3 * blockIdx.x + 0] = mg;
    partial[3 * blockIdx.x + 1] = mm;
    partial[3 * blockIdx.x + 2] = aa;
  }
  if (!cudarl::last_block(done)) return;
  vc_control(partial, state, (int)gridDim.x, beta, sh);
}

// The body of apply: grads[i] = f + c (f - aux[i]) on [lo, hi), f elsewhere, f = vc_full (c = state[2];
// grads may be full or aux: each element is read, then written, by one thread). Grid-stride.
template <bool PLUS>
__device__ __forceinline__ void vc_apply(const float* full, const float* plus, const float* aux, float* grads,
                                         const float* __restrict__ state, long long n, long long lo, long long hi) {
  const float c = state[2];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float f = vc_full<PLUS>(full, plus, i);
    grads[i] = (i >= lo && i < hi) ? f + c * (f - aux[i]) : f;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_vaccine_dots_control: vc_dots_control over full (the flat gradient as it is).
// Threads: one VC_THREADS block per chunk. Reads 8 (hi - lo) + 12 P bytes; writes 12 P + 20.
extern "C" __global__ void cudarl_vaccine_dots_control(const float* __restrict__ full, const float* __restrict__ aux,
                                                       float* partial, float* __restrict__ state,
                                                       unsigned int* __restrict__ done, long long lo, long long hi,
                                                       float beta) {
  vc_dots_control<false>(full, nullptr, aux, partial, state, done, lo, hi, beta);
}

// cudarl_vaccine_dots_control_plus: vc_dots_control over full + plus.
// Threads: one VC_THREADS block per chunk. Reads 12 (hi - lo) + 12 P bytes; writes 12 P + 20.
extern "C" __global__ void cudarl_vaccine_dots_control_plus(const float* __restrict__ full,
                                                            const float* __restrict__ plus,
                                                            const float* __restrict__ aux, float* partial,
                                                            float* __restrict__ state, unsigned int* __restrict__ done,
                                                            long long lo, long long hi, float beta) {
  vc_dots_control<true>(full, plus, aux, partial, state, done, lo, hi, beta);
}

// ---------------------------------------------------------------------------------------------
// cudarl_vaccine_apply: grads[i] = full[i] + c (full[i] - aux[i]) on [lo, hi), full[i] elsewhere.
// Threads: grid-stride. Reads 8n bytes; writes 4n.
extern "C" __global__ void cudarl_vaccine_apply(const float* full, const float* aux, float* grads,
                                                const float* __restrict__ state, long long n, long long lo,
                                                long long hi) {
  vc_apply<false>(full, nullptr, aux, grads, state, n, lo, hi);
}

// cudarl_vaccine_apply_plus: as apply over f = full[i] + plus[i] (grads may be full: each element is read,
// then written, by one thread). Threads: grid-stride. Reads 12n bytes; writes 4n.
extern "C" __global__ void cudarl_vaccine_apply_plus(const float* full, const float* plus, const float* aux,
                                                     float* grads, const float* __restrict__ state, long long n,
                                                     long long lo, long long hi) {
  vc_apply<true>(full, plus, aux, grads, state, n, lo, hi);
}
