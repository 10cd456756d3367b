#include "kernels/registry.hpp"

#include <stdexcept>

#include "runtime/cpu_features.hpp"

namespace kt {

std::vector<const KernelTable*> compiled_backends() { return {KTFORGE_COMPILED_BACKENDS & reference_kernels}; }

const KernelTable* select_backend(const std::string& name) {
  std::string compiled;
  for (const KernelTable* table : compiled_backends()) {
    compiled += (compiled.empty() ? "" : ", ") + std::string(table->name);
    if (name != "auto" && name != table->name) continue;
    if (name == "auto" && !auto_may_choose(table->name)) continue;  // a verification tool, slow
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
