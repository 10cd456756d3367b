// The compiled backends. Which exist is decided at configure time (KTFORGE_BACKENDS);
// which may run is decided at run time from the CPU.
#pragma once

#include <string>
#include <vector>

#include "kernels/types.hpp"

namespace kt {

extern const KernelTable reference_kernels;
#ifdef KTFORGE_HAVE_AVX2
extern const KernelTable avx2_kernels;
#endif
#ifdef KTFORGE_HAVE_AVX512
extern const KernelTable avx512_kernels;
#endif
#ifdef KTFORGE_HAVE_AMX
extern const KernelTable amx_kernels;
#endif
#ifdef KTFORGE_HAVE_AMX_MODEL
extern const KernelTable amx_model_kernels;  // AMX kernels on the software tile unit
#endif

// Compiled backends, best first.
std::vector<const KernelTable*> compiled_backends();
// A backend by name ("auto": the best one this CPU can run); throws std::invalid_argument
// naming the reason when it is not compiled in or the CPU lacks what it needs.
const KernelTable* select_backend(const std::string& name);

}  // namespace kt
