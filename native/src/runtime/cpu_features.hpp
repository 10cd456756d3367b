// What the running CPU and OS allow, read at run time. Compiled without ISA flags.
#pragma once

#include <string>
#include <vector>

namespace kt {

// Linux /proc/cpuinfo spellings, as in the rest of ktforge.
bool cpu_has(const std::string& feature);
std::vector<std::string> missing_features(const std::vector<std::string>& required);

}  // namespace kt
