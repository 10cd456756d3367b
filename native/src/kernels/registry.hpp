// The compiled backends. Which exist is decided at configure time (KTFORGE_BACKENDS);
// which may run is decided at run time from the CPU.
#pragma once

#include <string>
#include <vector>

#include "backends.gen.hpp"
#include "kernels/types.hpp"

namespace kt {

extern const KernelTable reference_kernels;
// The compiled SIMD backends' tables, generated from the backend table at configure time.
// Compiled backends, best first.
std::vector<const KernelTable*> compiled_backends();
// A backend by name ("auto": the best one this CPU can run); throws std::invalid_argument
// naming the reason when it is not compiled in or the CPU lacks what it needs.
const KernelTable* select_backend(const std::string& name);

}  // namespace kt
