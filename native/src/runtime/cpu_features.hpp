// What the running CPU and OS allow, read at run time. Compiled without ISA flags.
#pragma once

#include <string>
#include <vector>

namespace kt {

// Linux /proc/cpuinfo spellings, as in the rest of ktforge. A disabled feature
// (KTFORGE_DISABLE_CPU_FEATURES) is one the CPU lacks.
bool cpu_has(const std::string& feature);
std::vector<std::string> missing_features(const std::vector<std::string>& required);
// KTFORGE_DISABLE_CPU_FEATURES: set once when the module is imported (ktforge.detect.mask).
void disable_cpu_features(const std::vector<std::string>& features);
std::vector<std::string> disabled_cpu_features();
// The CPU and OS have it, the mask hides it.
bool cpu_feature_disabled(const std::string& feature);

}  // namespace kt
