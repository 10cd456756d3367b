// kt bench's machine measurements (python/measure.cpp), bound in module.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kt {

// Operations per second of a backend's dot-product instruction ("fp32_fma", "bf16_dot",
// "int8_dot", "int4_dot") on `threads` threads; 0 where the backend has none.
double measure_peak(const std::string& backend, const std::string& kind, int threads, int64_t iterations);
// Bytes per second of `threads` threads streaming a buffer of `bytes`, best of `repeats`.
double measure_read_bandwidth(const std::string& backend, int threads, std::size_t bytes, int repeats);
// The same for threads pinned to `cpus` reading a buffer asked of `memory_node`.
double measure_node_read_bandwidth(const std::string& backend, const std::vector<int>& cpus, int memory_node,
                                   std::size_t bytes, int repeats);

}  // namespace kt
