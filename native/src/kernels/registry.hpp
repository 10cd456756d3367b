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
// A table's CPU features, read from its data (no code of its level runs), and whether this CPU
// and OS have them all (less KTFORGE_DISABLE_CPU_FEATURES). Compiled without ISA flags.
std::vector<std::string> required_features(const KernelTable& table);
bool runs_here(const KernelTable& table);

}  // namespace kt
