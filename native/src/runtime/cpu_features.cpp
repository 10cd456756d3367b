#include "runtime/cpu_features.hpp"

#include <cpuid.h>

#include <algorithm>
#include <cstdint>
#include "cpu_features.gen.hpp"

namespace kt {
namespace {

// KTFORGE_DISABLE_CPU_FEATURES, as ktforge.detect.mask read it (set once, at module import,
// before any kernel is chosen; read-only afterwards)
std::vector<std::string>& disabled() {
  static std::vector<std::string> features;
  return features;
}

bool masked(const std::string& feature) {
  return std::find(disabled().begin(), disabled().end(), feature) != disabled().end();
}

uint64_t xcr0() {
  unsigned a, b, c, d;
  __cpuid(1, a, b, c, d);
  if (!(c & (1u << 27))) return 0;  // no OSXSAVE: xgetbv would fault
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Whether the OS enabled the register state a feature needs (the families are
// ktforge.detect.features' AVX_FAMILY, AVX512_FAMILY and AMX_FAMILY, generated).
bool os_allows(const std::string& feature) {
  const uint64_t x = xcr0();
  const bool avx = (x & 0x6) == 0x6;
  switch (generated::os_state_of(feature)) {
    case generated::OsState::amx:
      return (x & 0x60000) == 0x60000;
    case generated::OsState::avx512:
      return avx && (x & 0xE0) == 0xE0;
    case generated::OsState::avx:
      return avx;
    case generated::OsState::none:
      break;
  }
  return true;
}

// What the CPU and OS allow, whatever the mask says.
bool cpu_and_os_have(const std::string& feature) {
  auto it = generated::cpuid_bits().find(feature);
  if (it == generated::cpuid_bits().end()) return false;
  const generated::CpuidBit& bit = it->second;
  // basic and extended leaves each have their own maximum
  const unsigned max_leaf = __get_cpuid_max(bit.leaf & 0x80000000u, nullptr);
  if (bit.leaf > max_leaf) return false;
  unsigned r[4] = {0, 0, 0, 0};
  __cpuid_count(bit.leaf, bit.subleaf, r[0], r[1], r[2], r[3]);
  return ((r[bit.reg] >> bit.bit) & 1u) && os_allows(feature);
}

}  // namespace

void disable_cpu_features(const std::vector<std::string>& features) { disabled() = features; }

std::vector<std::string> disabled_cpu_features() { return disabled(); }

bool cpu_has(const std::string& feature) { return !masked(feature) && cpu_and_os_have(feature); }

bool cpu_feature_disabled(const std::string& feature) { return masked(feature) && cpu_and_os_have(feature); }

std::vector<std::string> missing_features(const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const auto& f : required)
    if (!cpu_has(f)) missing.push_back(f);
  return missing;
}

}  // namespace kt
