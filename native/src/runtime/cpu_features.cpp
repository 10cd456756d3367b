#include "runtime/cpu_features.hpp"

#include <cpuid.h>

#include <cstdint>
#include <map>

namespace kt {
namespace {

struct Bit {
  unsigned leaf, subleaf, reg, bit;  // reg: 0 eax, 1 ebx, 2 ecx, 3 edx
};

// The subset of features the kernels are compiled for (see ktforge/features.py for all).
const std::map<std::string, Bit>& feature_bits() {
  static const std::map<std::string, Bit> bits = {
      {"sse4_2", {1, 0, 2, 20}},       {"avx", {1, 0, 2, 28}},          {"fma", {1, 0, 2, 12}},
      {"f16c", {1, 0, 2, 29}},         {"avx2", {7, 0, 1, 5}},          {"avx512f", {7, 0, 1, 16}},
      {"avx512dq", {7, 0, 1, 17}},     {"avx512cd", {7, 0, 1, 28}},     {"avx512bw", {7, 0, 1, 30}},
      {"avx512vl", {7, 0, 1, 31}},     {"avx512vbmi", {7, 0, 2, 1}},    {"avx512_vbmi2", {7, 0, 2, 6}},
      {"avx512_vnni", {7, 0, 2, 11}},  {"avx512_fp16", {7, 0, 3, 23}},  {"amx_bf16", {7, 0, 3, 22}},
      {"amx_tile", {7, 0, 3, 24}},     {"amx_int8", {7, 0, 3, 25}},     {"avx_vnni", {7, 1, 0, 4}},
      {"avx512_bf16", {7, 1, 0, 5}},   {"amx_fp16", {7, 1, 0, 21}},
  };
  return bits;
}

uint64_t xcr0() {
  unsigned a, b, c, d;
  __cpuid(1, a, b, c, d);
  if (!(c & (1u << 27))) return 0;  // no OSXSAVE: xgetbv would fault
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool os_allows(const std::string& feature) {
  const uint64_t x = xcr0();
  const bool avx = (x & 0x6) == 0x6;
  const bool avx512 = avx && (x & 0xE0) == 0xE0;
  const bool amx = (x & 0x60000) == 0x60000;
  if (feature.rfind("amx", 0) == 0) return amx;
  if (feature.rfind("avx512", 0) == 0) return avx512;
  if (feature.rfind("avx", 0) == 0 || feature == "fma" || feature == "f16c") return avx;
  return true;
}

}  // namespace

bool cpu_has(const std::string& feature) {
  auto it = feature_bits().find(feature);
  if (it == feature_bits().end()) return false;
  const Bit& bit = it->second;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (bit.leaf > max_leaf) return false;
  unsigned r[4] = {0, 0, 0, 0};
  __cpuid_count(bit.leaf, bit.subleaf, r[0], r[1], r[2], r[3]);
  return ((r[bit.reg] >> bit.bit) & 1u) && os_allows(feature);
}

std::vector<std::string> missing_features(const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const auto& f : required)
    if (!cpu_has(f)) missing.push_back(f);
  return missing;
}

}  // namespace kt
