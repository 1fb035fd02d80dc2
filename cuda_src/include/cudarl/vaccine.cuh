// Gradient Vaccine's correction of one element of the flat gradient (cuda_src/vaccine.cu's apply; the
// agent's clip_adam_soft_vaccine in cuda_src/optim.cu applies it on the fly): one text, so both kernels
// compute its bits alike. Twin: cudarl/reference/vaccine.py (apply).
#pragma once

namespace cudarl {

// f + c (f - a): element f of the main gradient (plus causal's where it is folded in), a of the auxiliary.
__device__ __forceinline__ float vaccine_elem(float f, float a, float c) { return f + c * (f - a); }

}  // namespace cudarl
