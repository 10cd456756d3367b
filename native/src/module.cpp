// Python entry point of the native kernels.
//
// For now it only reports what it was compiled for. The feature list comes from
// the compiler's predefined macros, so it states what the binary may execute,
// not what the build host happened to have.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Names follow the Linux /proc/cpuinfo flag spelling used everywhere in ktforge.
std::vector<std::string> compiled_cpu_features() {
  std::vector<std::string> f;
#ifdef __SSE4_2__
  f.emplace_back("sse4_2");
#endif
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

std::string compiler_id() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "ktforge native kernels";
  m.def(
      "build_info",
      [] {
        py::dict info;
        info["version"] = KTFORGE_VERSION;
        info["compiler"] = compiler_id();
        info["arch_flags"] = KTFORGE_ARCH_FLAGS;
        info["required_cpu_features"] = compiled_cpu_features();
        return info;
      },
      "What this extension was compiled with and the CPU features it requires.");
}
