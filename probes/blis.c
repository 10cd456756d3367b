/* BLIS probe: load one candidate library and say what it really offers.
 *
 * Usage: blis <path-to-libblis.so>. Prints JSON: whether dlopen worked (and its
 * error), the version and threading model BLIS reports about itself, which
 * aocl_gemm (LPGEMM add-on) entry points it exports, and whether a small
 * s8s8s32 GEMM through it, plain and with a reordered B, matches a reference.
 * Runs as its own process so that a library that crashes cannot take the
 * caller down. The LPGEMM prototypes are declared here: AOCL installs shipped
 * inside Python wheels carry no headers.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t dim_t; /* BLIS's default integer size (BLIS_INT_TYPE_SIZE=64) */

typedef void (*gemm_s8s8s32os32_fn)(char order, char transa, char transb, dim_t m, dim_t n,
                                    dim_t k, int32_t alpha, const int8_t *a, dim_t lda,
                                    char mem_format_a, const int8_t *b, dim_t ldb,
                                    char mem_format_b, int32_t beta, int32_t *c, dim_t ldc,
                                    void *post_ops);
typedef uint64_t (*reorder_size_fn)(char order, char trans, char mat_type, dim_t k, dim_t n);
typedef void (*reorder_s8_fn)(char order, char trans, char mat_type, const int8_t *in,
                              int8_t *out, dim_t k, dim_t n, dim_t ldb);
typedef const char *(*version_fn)(void);
typedef long (*flag_fn)(void);

static const char *const lpgemm_symbols[] = {
    "aocl_gemm_s8s8s32os32",          "aocl_reorder_s8s8s32os32",
    "aocl_get_reorder_buf_size_s8s8s32os32", "aocl_gemm_s8s8s32of32",
    "aocl_gemm_s8s8s32obf16",         "aocl_gemm_bf16bf16f32of32",
    "aocl_reorder_bf16bf16f32of32",   "aocl_get_reorder_buf_size_bf16bf16f32of32",
    "aocl_gemm_bf16s4f32of32",        "aocl_reorder_bf16s4f32of32",
    "aocl_gemm_u8s4s32os32",          "aocl_reorder_u8s4s32os32",
};

static void json_string(const char *s) {
  putchar('"');
  for (; s && *s; ++s) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

enum { M = 3, N = 5, K = 7 }; /* odd on purpose: exercises every fringe path */

static const char *check_gemm(void *lib) {
  gemm_s8s8s32os32_fn gemm = (gemm_s8s8s32os32_fn)dlsym(lib, "aocl_gemm_s8s8s32os32");
  if (!gemm) return "not-run";
  int8_t a[M * K], b[K * N];
  int32_t c[M * N], ref[M * N];
  for (int i = 0; i < M * K; ++i) a[i] = (int8_t)((i * 37) % 255 - 127);
  for (int i = 0; i < K * N; ++i) b[i] = (int8_t)((i * 53) % 251 - 125);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int32_t s = 0;
      for (int k = 0; k < K; ++k) s += (int32_t)a[m * K + k] * b[k * N + n];
      ref[m * N + n] = s;
    }
  memset(c, 0x5A, sizeof c);
  gemm('r', 'n', 'n', M, N, K, 1, a, K, 'n', b, N, 'n', 0, c, N, NULL);
  if (memcmp(c, ref, sizeof c) != 0) return "mismatch";

  reorder_size_fn size_of = (reorder_size_fn)dlsym(lib, "aocl_get_reorder_buf_size_s8s8s32os32");
  reorder_s8_fn reorder = (reorder_s8_fn)dlsym(lib, "aocl_reorder_s8s8s32os32");
  if (!size_of || !reorder) return "ok";
  uint64_t bytes = size_of('r', 'n', 'B', K, N);
  if (bytes == 0 || bytes > (1u << 24)) return "reorder-size-invalid";
  int8_t *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!packed) return "out-of-memory";
  reorder('r', 'n', 'B', b, packed, K, N, N);
  memset(c, 0x5A, sizeof c);
  gemm('r', 'n', 'n', M, N, K, 1, a, K, 'n', packed, N, 'r', 0, c, N, NULL);
  free(packed);
  return memcmp(c, ref, sizeof c) == 0 ? "ok" : "reordered-mismatch";
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
    return 2;
  }
  printf("{\"path\": ");
  json_string(argv[1]);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf(", \"loaded\": false, \"error\": ");
    json_string(dlerror());
    printf("}\n");
    return 0;
  }
  printf(", \"loaded\": true");

  version_fn version = (version_fn)dlsym(lib, "bli_info_get_version_str");
  printf(", \"version\": ");
  if (version) json_string(version());
  else printf("null");

  flag_fn openmp = (flag_fn)dlsym(lib, "bli_info_get_enable_openmp");
  flag_fn pthreads = (flag_fn)dlsym(lib, "bli_info_get_enable_pthreads");
  const char *threading = "unknown";
  if (openmp && openmp()) threading = "openmp";
  else if (pthreads && pthreads()) threading = "pthreads";
  else if (openmp || pthreads) threading = "single";
  printf(", \"threading\": \"%s\"", threading);

  printf(", \"symbols\": {");
  for (size_t i = 0; i < sizeof lpgemm_symbols / sizeof lpgemm_symbols[0]; ++i)
    printf("%s\"%s\": %s", i ? ", " : "", lpgemm_symbols[i],
           dlsym(lib, lpgemm_symbols[i]) ? "true" : "false");
  printf("}");
  fflush(stdout); /* what was learnt so far survives a crash inside the GEMM */
  printf(", \"gemm_s8s8s32\": \"%s\"}\n", check_gemm(lib));
  return 0;
}
