#include "kernels/registry.hpp"

#include <stdexcept>

#include "runtime/cpu_features.hpp"

namespace kt {

std::vector<const KernelTable*> compiled_backends() {
  std::vector<const KernelTable*> all;
#ifdef KTFORGE_HAVE_AMX
  all.push_back(&amx_kernels);
#endif
#ifdef KTFORGE_HAVE_AVX512
  all.push_back(&avx512_kernels);
#endif
#ifdef KTFORGE_HAVE_AVX2
  all.push_back(&avx2_kernels);
#endif
#ifdef KTFORGE_HAVE_AMX_MODEL
  all.push_back(&amx_model_kernels);
#endif
  all.push_back(&reference_kernels);
  return all;
}

const KernelTable* select_backend(const std::string& name) {
  std::string compiled;
  for (const KernelTable* table : compiled_backends()) {
    compiled += (compiled.empty() ? "" : ", ") + std::string(table->name);
    if (name != "auto" && name != table->name) continue;
    if (name == "auto" && std::string(table->name) == "amx-model") continue;  // a verification tool, slow
    auto missing = missing_features(table->compiled_features());
    if (missing.empty()) return table;
    if (name == "auto") continue;
    std::string list;
    for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
    throw std::invalid_argument("backend '" + name + "' needs CPU features this machine lacks: " + list);
  }
  throw std::invalid_argument("backend '" + name + "' is not compiled into this build (compiled: " + compiled + ")");
}

}  // namespace kt
