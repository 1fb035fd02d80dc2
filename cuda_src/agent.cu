// agent: the small glue of the collect step. Twin: cudarl/reference/agent.py.
// Launchers: cudarl/ops/agent.py.

// quantile_mean: q[b, a] = (1/N) sum_n theta[b, n, a], the expected Q of IQN quantiles, summed
// in order n = 0..N-1 (so the float32 result matches the twin's sequential sum). One thread per
// (b, a). Reads B*N*A floats, writes B*A.
extern "C" __global__ void cudarl_agent_quantile_mean(float* __restrict__ q, const float* __restrict__ theta,
                                                      int B, int N, int A) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  const int b = i / A, a = i % A;
  float s = 0.0f;
  for (int n = 0; n < N; ++n) s += theta[((long long)b * N + n) * A + a];
  q[i] = s / (float)N;
}

// discount: out[i] = gamma * (1 - done[i]), gamma read from device memory (so a schedule or the
// adaptive controller can move it between replays). One thread per row; reads 4n+4 bytes, writes 4n.
extern "C" __global__ void cudarl_agent_discount(float* __restrict__ out, const float* __restrict__ done,
                                                 const float* __restrict__ gamma, long long n) {
  const float g = *gamma;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = g * (1.0f - done[i]);
}

// epsilon: the linear exploration schedule on the device. With c = *count:
//   eps = start + (end - start) * min(c, steps) / steps;  then *count = c + 1.
// One thread; computed in double and rounded once, like the twin.
extern "C" __global__ void cudarl_agent_epsilon(float* __restrict__ eps, long long* __restrict__ count,
                                                double start, double end, long long steps) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long c = *count;
  const double f = (double)(c < steps ? c : steps) / (double)steps;
  *eps = (float)(start + (end - start) * f);
  *count = c + 1;
}

// publish: copy this step's loss and gradient norm into slot (*step % slots) of a pinned ring
// (mapped host memory), so the host reads step t - 1 from one slot while step t writes another.
// One thread; reads 16 bytes, writes 8 bytes over the bus.
extern "C" __global__ void cudarl_agent_publish(float* __restrict__ ring, const float* __restrict__ loss,
                                                const float* __restrict__ grad_norm, const long long* __restrict__ step,
                                                int slots) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long s = *step % slots;
  ring[2 * s] = *loss;
  ring[2 * s + 1] = *grad_norm;
}
