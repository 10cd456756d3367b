// The ISA features the including translation unit is compiled for, from the compiler's
// predefined macros (Linux /proc/cpuinfo spellings). Each backend's table reports them,
// so what a binary may execute is known without trusting the build host.
#pragma once

#include <string>
#include <vector>

namespace kt {

// static: each translation unit keeps its own copy (an inline function would be merged across
// TUs compiled with different flags, and report one TU's features for all).
static inline std::vector<std::string> compiled_features() {
  std::vector<std::string> f;
#ifdef __AVX__
  f.emplace_back("avx");
#endif
#ifdef __AVX2__
  f.emplace_back("avx2");
#endif
#ifdef __FMA__
  f.emplace_back("fma");
#endif
#ifdef __F16C__
  f.emplace_back("f16c");
#endif
#ifdef __AVX512F__
  f.emplace_back("avx512f");
#endif
#ifdef __AVX512BW__
  f.emplace_back("avx512bw");
#endif
#ifdef __AVX512VL__
  f.emplace_back("avx512vl");
#endif
#ifdef __AVX512DQ__
  f.emplace_back("avx512dq");
#endif
#ifdef __AVX512CD__
  f.emplace_back("avx512cd");
#endif
#ifdef __AVX512VNNI__
  f.emplace_back("avx512_vnni");
#endif
#ifdef __AVX512VBMI__
  f.emplace_back("avx512vbmi");
#endif
#ifdef __AVX512VBMI2__
  f.emplace_back("avx512_vbmi2");
#endif
#ifdef __AVX512BF16__
  f.emplace_back("avx512_bf16");
#endif
#ifdef __AVX512FP16__
  f.emplace_back("avx512_fp16");
#endif
#ifdef __AVXVNNI__
  f.emplace_back("avx_vnni");
#endif
#ifdef __AMX_TILE__
  f.emplace_back("amx_tile");
#endif
#ifdef __AMX_INT8__
  f.emplace_back("amx_int8");
#endif
#ifdef __AMX_BF16__
  f.emplace_back("amx_bf16");
#endif
#ifdef __AMX_FP16__
  f.emplace_back("amx_fp16");
#endif
  return f;
}

}  // namespace kt
