// The dueling combine of a C51 head (Wang et al. 2016) per atom, shared by cudarl_nn_dueling_*
// (cuda_src/nn.cu) and the fused C51 targets-and-loss kernels (cuda_src/c51.cu), so both round alike.
// Twin: cudarl/reference/nn.py dueling_forward / dueling_backward.
//
// va [(1 + A) Z] is one sample's head output: V [Z], then Adv [A, Z].
//   dueling_mean(va, A, Z, z)        (sum_a Adv[a, z], summed a = 0, 1, ... in order) / A
//   dueling_logit(va, mean, a, Z, z) dueling_combine(V[z], Adv[a, z], mean) = (V[z] + Adv[a, z]) - mean
// The backward of logits [A, Z] with gradient d [A, Z] (d_a = d[a * Z + z]):
//   dV[z] = sum_a d_a (in order),  dAdv[a, z] = d_a - dV[z] / A   (dueling_backward_atom)
// The *_regs forms are the same roundings on one atom's values held in registers (adv[a], d[a]
// for a < A <= MAXA), for kernels that load a whole row up front (c51.cu's register path).
#pragma once

namespace cudarl {

__device__ __forceinline__ float dueling_mean(const float* va, int A, int Z, int z) {
  float s = va[Z + z];
  for (int a = 1; a < A; ++a) s += va[(1 + a) * Z + z];
  return s / (float)A;
}

// The combine's one rounding order, (v + adv) - mean, for every caller.
__device__ __forceinline__ float dueling_combine(float v, float adv, float mean) { return (v + adv) - mean; }

__device__ __forceinline__ float dueling_logit(const float* va, float mean, int a, int Z, int z) {
  return dueling_combine(va[z], va[(1 + a) * Z + z], mean);
}

// d: one sample's dL/dlogits [A, Z]; dva: its dL/dva [(1 + A) Z]; writes (accumulate: adds into)
// atom z of both streams.
__device__ __forceinline__ void dueling_backward_atom(const float* d, float* dva, int A, int Z, int z,
                                                      bool accumulate = false) {
  float s = d[z];
  for (int a = 1; a < A; ++a) s += d[a * Z + z];
  const float m = s / (float)A;
  dva[z] = accumulate ? dva[z] + s : s;
  for (int a = 0; a < A; ++a) {
    const float g = d[a * Z + z] - m;
    dva[(1 + a) * Z + z] = accumulate ? dva[(1 + a) * Z + z] + g : g;
  }
}

template <int MAXA>
__device__ __forceinline__ float dueling_mean_regs(const float (&adv)[MAXA], int A) {
  float s = adv[0];
#pragma unroll
  for (int a = 1; a < MAXA; ++a)
    if (a < A) s += adv[a];
  return s / (float)A;
}

// dV = sum_a d[a] (in order), dadv[a] = d[a] - dV / A, as dueling_backward_atom.
template <int MAXA>
__device__ __forceinline__ void dueling_backward_regs(const float (&d)[MAXA], int A, float& dv, float (&dadv)[MAXA]) {
  float s = d[0];
#pragma unroll
  for (int a = 1; a < MAXA; ++a)
    if (a < A) s += d[a];
  const float m = s / (float)A;
  dv = s;
#pragma unroll
  for (int a = 0; a < MAXA; ++a) dadv[a] = d[a] - m;
}

}  // namespace cudarl
