#include "kernels/registry.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/amx_permission.hpp"
#include "runtime/cpu_features.hpp"

namespace kt {

std::vector<const KernelTable*> compiled_backends() { return {KTFORGE_COMPILED_BACKENDS & reference_kernels}; }

std::vector<std::string> required_features(const KernelTable& table) {
  std::vector<std::string> features;
  for (const char* const* name = table.compiled_features; *name; ++name) features.emplace_back(*name);
  return features;
}

bool runs_here(const KernelTable& table) { return missing_features(required_features(table)).empty(); }

const KernelTable* select_backend(const std::string& name) {
  std::string compiled;
  for (const KernelTable* table : compiled_backends()) {
    compiled += (compiled.empty() ? "" : ", ") + std::string(table->name);
    if (name != "auto" && name != table->name) continue;
    if (name == "auto" && !auto_may_choose(table->name)) continue;  // a verification tool, slow
    const auto required = required_features(*table);
    auto missing = missing_features(required);
    // auto: a level that needs AMX needs the tiles granted too (by name, it runs its SIMD
    // path without them and says so in its description)
    const bool needs_tiles = std::find(required.begin(), required.end(), "amx_tile") != required.end();
    if (missing.empty() && !(name == "auto" && needs_tiles && request_amx_permission() != 0)) return table;
    if (name == "auto") continue;
    std::string list;
    for (const auto& f : missing)
      list += (list.empty() ? "" : ", ") + f +
              (cpu_feature_disabled(f) ? " (disabled by KTFORGE_DISABLE_CPU_FEATURES)" : "");
    throw std::invalid_argument("backend '" + name + "' needs CPU features this machine lacks: " + list);
  }
  throw std::invalid_argument("backend '" + name + "' is not compiled into this build (compiled: " + compiled + ")");
}

}  // namespace kt
