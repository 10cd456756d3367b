#include "blis/aocl.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>

#include <cerrno>
#include <cstring>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu_features.gen.hpp"
#include "runtime/cpu_features.hpp"

namespace kt {

namespace {
std::mutex linked_mutex;

std::string& linked_path() {
  static std::string path;
  return path;
}
}  // namespace

// Under KTFORGE_DISABLE_CPU_FEATURES AOCL's own dispatch must not run what the mask hides: its
// code path is capped (AOCL_ENABLE_INSTRUCTIONS, read when the library initialises, at its first
// call; a value the user set is kept). AOCL has no path between AVX2 and AVX-512 to cap at.
void Aocl::follow_cpu_mask() {
  const char* cap = nullptr;
  for (const auto& f : disabled_cpu_features()) {
    if (!cpu_feature_disabled(f)) continue;  // the CPU lacks it anyway
    if (generated::os_state_of(f) == generated::OsState::avx512 && !cap) cap = "AVX2";
    if (f == "avx2" || f == "fma" || f == "f16c") cap = "GENERIC";
  }
  if (cap) setenv("AOCL_ENABLE_INSTRUCTIONS", cap, 0);
}

void Aocl::set_linked_library(const std::string& path) {
  std::lock_guard<std::mutex> lock(linked_mutex);
  linked_path() = path;
}

std::string Aocl::linked_library() {
  std::lock_guard<std::mutex> lock(linked_mutex);
  return linked_path();
}

void Aocl::verify(Element m) const {
  // AOCL's integer GEMMs need AVX-512 VNNI and read the CPU themselves (AOCL_ENABLE_INSTRUCTIONS
  // does not reach them): a mask that hides VNNI refuses them, as a CPU without it would
  if (m == Element::int8 && cpu_feature_disabled("avx512_vnni"))
    throw std::invalid_argument(path_ + " (" + version_ + "): aocl_gemm_s8s8s32os32 is refused: AOCL's integer "
                                "kernels need AVX-512 VNNI, which KTFORGE_DISABLE_CPU_FEATURES hides; use backend='auto'");
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, std::string> verdicts;  // "" = correct
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(path_, static_cast<int>(m));
  auto found = verdicts.find(key);
  if (found == verdicts.end()) {
    // Odd sizes exercise the fringe paths; small integers are exact in int32 and in fp32 sums.
    const int M = 3, N = 5, K = 7;
    std::vector<int32_t> want(M * N, 0);
    std::vector<int> a(M * K), b(K * N);
    for (int i = 0; i < M * K; ++i) a[i] = (i * 37) % 7 - 3;
    for (int i = 0; i < K * N; ++i) b[i] = (i * 53) % 5 - 2;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j)
        for (int k = 0; k < K; ++k) want[i * N + j] += a[i * K + k] * b[k * N + j];
    bool ok = true;
    std::string entry;
    if (m == Element::int8) {
      entry = "aocl_gemm_s8s8s32os32";
      std::vector<int8_t> a8(a.begin(), a.end()), b8(b.begin(), b.end());
      std::vector<int32_t> c(M * N, -1);
      gemm_s8_('r', 'n', 'n', M, N, K, 1, a8.data(), K, 'n', b8.data(), N, 'n', 0, c.data(), N, nullptr);
      ok = c == want;
    } else if (m == Element::bf16 && gemm_bf16_) {
      entry = "aocl_gemm_bf16bf16f32of32";
      auto bf16 = [](int v) {  // small integers are exact in bf16: the top half of the float
        float f = static_cast<float>(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        return static_cast<int16_t>(bits >> 16);
      };
      std::vector<int16_t> a16(M * K), b16(K * N);
      for (int i = 0; i < M * K; ++i) a16[i] = bf16(a[i]);
      for (int i = 0; i < K * N; ++i) b16[i] = bf16(b[i]);
      std::vector<float> c(M * N, -1.f);
      gemm_bf16_('r', 'n', 'n', M, N, K, 1.f, a16.data(), K, 'n', b16.data(), N, 'n', 0.f, c.data(), N, nullptr);
      for (int i = 0; i < M * N; ++i) ok = ok && c[i] == static_cast<float>(want[i]);
    }
    found = verdicts.emplace(key, ok ? "" : entry).first;
  }
  if (!found->second.empty())
    throw std::invalid_argument(path_ + " (" + version_ + "): " + found->second +
                                " gives wrong results on this CPU (AOCL's aocl_gemm kernels for it need AVX-512 "
                                "VNNI/BF16, AMD Zen 4 or newer); use backend='auto' (`kt doctor --check blis.gemm`)");
}

const Aocl& Aocl::load(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Aocl>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = loaded.find(path); found != loaded.end()) return *found->second;
  follow_cpu_mask();
  // dlopen reads whatever it is given: a FIFO would block forever, a device read without end.
  // A path is absolute and a regular file; a bare name is the loader's to find (never the
  // working directory); a relative path would be the working directory's.
  if (path.empty() || path.find('/') != std::string::npos) {
    struct stat info {};
    const char* why = path.empty() || path[0] != '/' ? "not an absolute path"
                      : stat(path.c_str(), &info) != 0 ? std::strerror(errno)
                      : !S_ISREG(info.st_mode)         ? "not a regular file"
                                                       : nullptr;
    if (why)
      throw std::invalid_argument("cannot load BLIS library '" + path + "': " + why +
                                  " (check KTFORGE_BLIS_LIBRARY; `kt doctor --check blis.found` lists the libraries "
                                  "found)");
  }
  // RTLD_NOW: a library missing symbols fails here, with the loader's message, not later.
  // Wheels bundle a library's dependencies beside it (libomp for aoclda) without an rpath:
  // load such a sibling by absolute path first, so no LD_LIBRARY_PATH is needed.
  void* handle = nullptr;
  std::string error;  // the loader's own reason: dlerror() is read once, so it is kept here
  const std::string dir = path.substr(0, path.find_last_of('/') + 1);
  for (int attempt = 0; attempt < 8 && !handle; ++attempt) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    const char* raw = dlerror();
    error = raw ? raw : "dlopen failed without a reason";
    const std::string missing = error.substr(0, error.find(':'));
    if (missing.find('/') != std::string::npos || !dlopen((dir + missing).c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      dlerror();
      break;
    }
  }
  if (!handle)
    throw std::invalid_argument("cannot load BLIS library " + path + ": " + error +
                                " (check it with `kt doctor --check blis.found`)");
  // Cached only once complete: a library refused here is refused again on the next call, never
  // handed out as an empty entry.
  auto lib = std::make_unique<Aocl>();
  lib->path_ = path;
  auto sym = [&](const char* name) { return dlsym(handle, name); };
  lib->gemm_s8_ = reinterpret_cast<decltype(lib->gemm_s8_)>(sym("aocl_gemm_s8s8s32os32"));
  lib->size_s8_ = reinterpret_cast<decltype(lib->size_s8_)>(sym("aocl_get_reorder_buf_size_s8s8s32os32"));
  lib->reorder_s8_ = reinterpret_cast<decltype(lib->reorder_s8_)>(sym("aocl_reorder_s8s8s32os32"));
  lib->gemm_bf16_ = reinterpret_cast<decltype(lib->gemm_bf16_)>(sym("aocl_gemm_bf16bf16f32of32"));
  lib->size_bf16_ = reinterpret_cast<decltype(lib->size_bf16_)>(sym("aocl_get_reorder_buf_size_bf16bf16f32of32"));
  lib->reorder_bf16_ = reinterpret_cast<decltype(lib->reorder_bf16_)>(sym("aocl_reorder_bf16bf16f32of32"));
  if (!lib->gemm_s8_ || !lib->size_s8_ || !lib->reorder_s8_)
    throw std::invalid_argument(path + " has no aocl_gemm add-on (aocl_gemm_s8s8s32os32 and its reorder API are "
                                "missing: upstream BLIS). Install AOCL-BLAS: ./install.sh deps --with-blis");
  if (!lib->gemm_bf16_ || !lib->size_bf16_ || !lib->reorder_bf16_) lib->gemm_bf16_ = nullptr;
  auto version = reinterpret_cast<const char* (*)()>(sym("bli_info_get_version_str"));
  lib->version_ = version ? version() : "unknown";
  // One owner of the cores: ktforge's pool runs the experts in parallel, each AOCL call
  // on one thread, so BLIS's own OpenMP threads never compete with the pool.
  if (auto set_threads = reinterpret_cast<void (*)(int64_t)>(sym("bli_thread_set_num_threads"))) set_threads(1);
  return *(loaded[path] = std::move(lib));
}

namespace {

// B = W^T as a row-major K x N matrix, from a packed panel layout [N/16][K/Step][16][Step]
// (Step = 4 int8 or 2 bf16 values per 32-bit lane).
template <typename T, int Step>
std::vector<T> unpack_transposed(const PackedMatrix& w) {
  const int N = w.Np, K = w.Kp;
  std::vector<T> b(static_cast<std::size_t>(K) * N);
  for (int n = 0; n < N; ++n) {
    const auto* panel = reinterpret_cast<const T*>(w.block(n / 16));  // a NUMA share's blocks lie apart
    for (int k = 0; k < K; ++k)
      b[static_cast<std::size_t>(k) * N + n] = panel[((k / Step) * 16 + n % 16) * Step + k % Step];
  }
  return b;
}

}  // namespace

aligned_vector<uint8_t> Aocl::reorder(const PackedMatrix& w) const {
  const int N = w.Np, K = w.Kp;
  if (w.element == Element::int8) {
    const std::vector<int8_t> b = unpack_transposed<int8_t, 4>(w);
    const int blocks = w.colsum_blocks(), rows = K / blocks;
    const std::size_t bytes = size_s8_('r', 'n', 'B', rows, N);
    aligned_vector<uint8_t> out(bytes * blocks);
    for (int kb = 0; kb < blocks; ++kb)
      reorder_s8_('r', 'n', 'B', b.data() + static_cast<std::size_t>(kb) * rows * N,
                  reinterpret_cast<int8_t*>(out.data() + kb * bytes), rows, N, N);
    return out;
  }
  if (w.element == Element::bf16 && gemm_bf16_) {
    const std::vector<int16_t> b = unpack_transposed<int16_t, 2>(w);
    aligned_vector<uint8_t> out(size_bf16_('r', 'n', 'B', K, N));
    reorder_bf16_('r', 'n', 'B', b.data(), reinterpret_cast<int16_t*>(out.data()), K, N, N);
    return out;
  }
  throw std::invalid_argument("the amd-blis backend runs int8 and bf16 through AOCL; the grouped formats use ktforge's kernels");
}

void Aocl::gemm_s8(int m, int n, int k, const int8_t* a, int64_t lda, const uint8_t* b, int32_t* c) const {
  gemm_s8_('r', 'n', 'n', m, n, k, 1, a, lda, 'n', reinterpret_cast<const int8_t*>(b), n, 'r', 0, c, n, nullptr);
}

void Aocl::gemm_bf16(int m, int n, int k, const uint16_t* a, int64_t lda, const uint8_t* b, float* c) const {
  gemm_bf16_('r', 'n', 'n', m, n, k, 1.f, reinterpret_cast<const int16_t*>(a), lda, 'n',
             reinterpret_cast<const int16_t*>(b), n, 'r', 0.f, c, n, nullptr);
}

}  // namespace kt
