// AOCL-BLAS LPGEMM entry points used by the amd-blis recipe. Declared here because AOCL
// installs shipped inside Python wheels carry no headers (see probes/blis.c for the probe).
#include <cstdint>
#include <string>

extern "C" {
typedef int64_t dim_t;  // BLIS's default integer size
const char* bli_info_get_version_str(void);
void aocl_gemm_s8s8s32os32(char order, char transa, char transb, dim_t m, dim_t n, dim_t k, int32_t alpha,
                           const int8_t* a, dim_t lda, char mem_format_a, const int8_t* b, dim_t ldb,
                           char mem_format_b, int32_t beta, int32_t* c, dim_t ldc, void* post_ops);
}

namespace kt {

// The linked library's version, and whether a small GEMM through it is right (checked at
// verification time, so a broken link fails the build, not a user's first forward()).
std::string blis_version() { return bli_info_get_version_str(); }

bool blis_gemm_selftest() {
  const int M = 3, N = 5, K = 7;
  int8_t a[M * K], b[K * N];
  int32_t c[M * N];
  for (int i = 0; i < M * K; ++i) a[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  for (int i = 0; i < K * N; ++i) b[i] = static_cast<int8_t>((i * 53) % 251 - 125);
  aocl_gemm_s8s8s32os32('r', 'n', 'n', M, N, K, 1, a, K, 'n', b, N, 'n', 0, c, N, nullptr);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int32_t s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<int32_t>(a[m * K + k]) * b[k * N + n];
      if (s != c[m * N + n]) return false;
    }
  return true;
}

}  // namespace kt
