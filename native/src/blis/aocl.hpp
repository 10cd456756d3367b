// AOCL-BLAS's low-precision GEMM (the aocl_gemm / LPGEMM add-on), loaded by absolute path
// with dlopen: the library the probe found to work, named by the amd-blis build or by
// KTFORGE_BLIS_LIBRARY. Weights are reordered once into AOCL's own layout at load.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/types.hpp"

namespace kt {

class Aocl {
 public:
  // Throws std::invalid_argument naming the library and what is missing.
  static const Aocl& load(const std::string& path);
  // The library an amd-blis build linked: registered by the module at import (it alone is
  // compiled with the build's KTFORGE_BLIS_LIBRARY), read by the layers; "" when none.
  static void set_linked_library(const std::string& path);
  static std::string linked_library();
  // Caps AOCL's own code path to what KTFORGE_DISABLE_CPU_FEATURES leaves (the module calls it
  // at import, before any AOCL call: a linked library initialises at its first one).
  static void follow_cpu_mask();

  // A small GEMM with a known answer through the entry point `m` uses (once per library and
  // method); throws std::invalid_argument when AOCL computes it wrong on this CPU (its integer
  // kernels need AVX-512 VNNI: on a Zen 3 it returns without a correct result).
  void verify(Element m) const;

  const std::string& path() const { return path_; }
  const std::string& version() const { return version_; }
  bool has_bf16() const { return gemm_bf16_ != nullptr; }

  // B = W^T of a packed int8/bf16 matrix, reordered for AOCL (K x N, N = W.Np); int8 as one
  // reordered B per activation block of K, each block's bytes one after the other.
  aligned_vector<uint8_t> reorder(const PackedMatrix& w) const;
  // C[m][N] = A[m][K] . B, A rows `lda` apart (int8: s8 activations; bf16: bf16).
  void gemm_s8(int m, int n, int k, const int8_t* a, int64_t lda, const uint8_t* b, int32_t* c) const;
  void gemm_bf16(int m, int n, int k, const uint16_t* a, int64_t lda, const uint8_t* b, float* c) const;

 private:
  using dim_t = int64_t;
  std::string path_, version_;
  void (*gemm_s8_)(char, char, char, dim_t, dim_t, dim_t, int32_t, const int8_t*, dim_t, char, const int8_t*, dim_t,
                   char, int32_t, int32_t*, dim_t, void*) = nullptr;
  uint64_t (*size_s8_)(char, char, char, dim_t, dim_t) = nullptr;
  void (*reorder_s8_)(char, char, char, const int8_t*, int8_t*, dim_t, dim_t, dim_t) = nullptr;
  void (*gemm_bf16_)(char, char, char, dim_t, dim_t, dim_t, float, const int16_t*, dim_t, char, const int16_t*,
                     dim_t, char, float, float*, dim_t, void*) = nullptr;
  uint64_t (*size_bf16_)(char, char, char, dim_t, dim_t) = nullptr;
  void (*reorder_bf16_)(char, char, char, const int16_t*, int16_t*, dim_t, dim_t, dim_t) = nullptr;
};

}  // namespace kt
