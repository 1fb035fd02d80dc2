// Compile units: a family whose kernels take long to compile is split into units, each one NVRTC
// program that emits only its own kernels, so a start-up compiles (and waits for) only the units
// holding the kernels it launches, side by side (cudarl/kernels.py). A unit's kernels sit between
//   #if CUDARL_UNIT_IS(name)   ...   #endif  // name
// and every kernel of such a family sits in exactly one unit (cudarl/signatures.py reads the guards;
// tools/check_faces.py checks them). The loader defines CUDARL_UNIT and CUDARL_UNIT_<name> as 1 for
// the unit it compiles; without CUDARL_UNIT (nvcc in tools/compile_cuda.py, the whole-family compile the
// tests compare against) every unit is in. Only which kernels are emitted changes: a kernel's
// machine code is the same in its unit as in the whole family (tests/unit/test_compile_units.py).
#pragma once

#ifdef CUDARL_UNIT
#define CUDARL_UNIT_IS(name) CUDARL_UNIT_##name  // 1 for the unit compiled; an unknown name is 0 in #if
#else
#define CUDARL_UNIT_IS(name) 1
#endif
