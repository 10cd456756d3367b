// AOCL-BLAS's aocl_gemm for the formats whose row names "aocl", where the layer's backend is a
// library backend of AOCL (amd-blis): whole experts from the token count where it measured
// faster than the kernels at load, on its own reordered copy of the weights.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#include "blis/aocl.hpp"
#include "kernels/pack.hpp"
#include "moe/provider.hpp"

namespace kt {
namespace {

// The BLIS library of a library backend: KTFORGE_BLIS_LIBRARY, else the one its build linked
// (registered by the module when it is imported).
std::string blis_library_path(const LibraryBackend& lib) {
  if (const char* env = std::getenv("KTFORGE_BLIS_LIBRARY"); env && *env) return env;
  if (std::string linked = Aocl::linked_library(); !linked.empty()) return linked;
  throw std::invalid_argument(std::string("backend '") + lib.name +
                              "' needs AOCL-BLAS with the aocl_gemm add-on: build with `kt build --backend " + lib.name +
                              "`, or set KTFORGE_BLIS_LIBRARY to the library (`kt doctor --check blis.addon` shows "
                              "which works)");
}

// One activation block's AOCL int32 results, times each row's scale of the block, added to the
// float sums in out (AOCL's s8s8 GEMM takes the signed activations as they are: no offset).
void accumulate(const int32_t* acc, int m, int n, const float* x_scale, bool first, float* out, int64_t ld) {
  for (int i = 0; i < m; ++i)
    for (int c = 0; c < n; ++c)
      out[i * ld + c] = (first ? 0.f : out[i * ld + c]) + static_cast<float>(acc[static_cast<int64_t>(i) * n + c]) * x_scale[i];
}

class AoclProvider final : public Provider {
 public:
  AoclProvider(const ProviderContext& context, const Aocl& aocl)
      : kernels_(context.kernels), config_(context.config), element_(element_of(context.config.method)), aocl_(aocl),
        gathered_(context.threads), accumulators_(context.threads), scales_(context.threads) {}

  const char* name() const override { return "aocl"; }
  std::string describe() const override {
    const std::string gemm = element_ == Element::int8 ? "aocl_gemm_s8s8s32os32" : "aocl_gemm_bf16bf16f32of32";
    return gemm + " (" + aocl_.version() + ") for experts with >= " + std::to_string(min_rows_) + " tokens";
  }
  int min_rows() const override { return min_rows_; }
  bool whole_expert() const override { return true; }
  std::map<std::string, std::string> facts() const override {
    return {{"library", aocl_.path()}, {"version", aocl_.version()}};
  }

  void attach(const std::vector<PackedMatrix>& gate_up, const std::vector<PackedMatrix>& down, ThreadPool& pool,
              Provider& next) override {
    reordered_[0].assign(gate_up.size(), {});
    reordered_[1].assign(down.size(), {});
    pool.parallel_for(static_cast<int64_t>(gate_up.size()), [&](int64_t e, int) {
      reordered_[0][e] = aocl_.reorder(gate_up[e]);
      reordered_[1][e] = aocl_.reorder(down[e]);
    });
    calibrate(gate_up[0], next);
  }

  void gemm(const ExpertGemm& c) override {
    const PackedMatrix& w = *c.w;
    const int N = w.Np, Kp = w.Kp, m = c.m;
    if (c.n0 != 0 || c.n1 != N || c.ld_out != N) throw std::logic_error("AOCL computes whole experts only");
    const uint8_t* b = reordered_[c.projection == Projection::gate_up ? 0 : 1][c.expert].data();
    const Activations& act = *c.act;
    const std::size_t elem = element_ == Element::int8 ? 1 : 2;
    const uint8_t* base = element_ == Element::int8 ? reinterpret_cast<const uint8_t*>(act.q.data())
                                                    : reinterpret_cast<const uint8_t*>(act.bf16.data());
    auto& a = gathered_[c.thread];  // the expert's token rows as one matrix
    a.resize(static_cast<std::size_t>(m) * Kp * elem);
    for (int i = 0; i < m; ++i) {
      const uint8_t* src = base + static_cast<int64_t>(c.rows[i]) * Kp * elem;
      std::copy(src, src + Kp * elem, a.data() + static_cast<std::size_t>(i) * Kp * elem);
    }
    if (element_ == Element::int8) {  // a GEMM per activation block of K (Aocl::reorder's blocks)
      auto& acc = accumulators_[c.thread];
      acc.resize(static_cast<std::size_t>(m) * N);
      auto& xs = scales_[c.thread];
      xs.resize(m);
      const int blocks = w.colsum_blocks(), rows = Kp / blocks;
      const std::size_t bytes = reordered_[c.projection == Projection::gate_up ? 0 : 1][c.expert].size() / blocks;
      for (int kb = 0; kb < blocks; ++kb) {
        aocl_.gemm_s8(m, N, rows, reinterpret_cast<const int8_t*>(a.data()) + kb * rows, Kp, b + kb * bytes, acc.data());
        for (int i = 0; i < m; ++i) xs[i] = act.scales(c.rows[i])[kb * rows / act.block];
        accumulate(acc.data(), m, N, xs.data(), kb == 0, c.out, c.ld_out);
      }
      for (int i = 0; i < m; ++i)
        for (int n = 0; n < N; ++n) c.out[i * c.ld_out + n] *= w.row_scales(n / 16)[n % 16];
    } else {
      aocl_.gemm_bf16(m, N, Kp, reinterpret_cast<const uint16_t*>(a.data()), Kp, b, c.out);
    }
  }

 private:
  // Times AOCL against `next` on expert 0's gate/up, single-threaded, for growing token
  // counts; AOCL takes over from the first count where it is faster.
  void calibrate(const PackedMatrix& w, Provider& next) {
    min_rows_ = kNever;
    if (const char* forced = std::getenv("KTFORGE_AOCL_MIN_TOKENS"); forced && *forced) {
      char* end = nullptr;
      const long value = std::strtol(forced, &end, 10);
      if (*end != '\0' || value < 1 || value > kNever)
        throw std::invalid_argument(std::string("KTFORGE_AOCL_MIN_TOKENS must be a positive token count, got '") +
                                    forced + "'");
      min_rows_ = static_cast<int>(value);  // the user (or a test) knows better
      return;
    }
    using clock = std::chrono::steady_clock;
    const int H = config_.hidden, N = w.Np;
    std::vector<float> x(static_cast<std::size_t>(256) * H);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f;
    // AOCL must win clearly (by 10%) at two sizes in a row: the machine is noisy, and a
    // wrong switch costs more than a missed one.
    bool won_previous = false;
    for (int m : {1, 4, 16, 32, 64, 128, 256}) {
      Activations act;
      prepare_activations(kernels_, act, element_, config_.group, w.Kp, x.data(), DType::f32, m, H, H, nullptr,
                          "calibration");
      std::vector<int32_t> rows(m);
      std::iota(rows.begin(), rows.end(), 0);
      aligned_vector<float> out(static_cast<std::size_t>(m) * N);
      const ExpertGemm call{&act, rows.data(), m, 0, Projection::gate_up, &w, 0, N, out.data(), N, 0};
      auto best = [&](Provider& provider) {
        double t = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
          auto start = clock::now();
          provider.gemm(call);
          t = std::min(t, std::chrono::duration<double>(clock::now() - start).count());
        }
        return t;
      };
      const double ours = best(next), theirs = best(*this);
      const bool wins = theirs * 1.1 < ours;
      if (wins && won_previous) break;
      if (wins && !won_previous) min_rows_ = m;
      if (!wins) min_rows_ = kNever;
      won_previous = wins;
    }
    if (!won_previous) min_rows_ = kNever;
  }

  const KernelTable& kernels_;
  const MoeConfig config_;
  const Element element_;
  const Aocl& aocl_;
  int min_rows_ = kNever;
  std::vector<aligned_vector<uint8_t>> reordered_[2];  // gate/up, down: per expert
  std::vector<aligned_vector<uint8_t>> gathered_;      // per thread
  std::vector<aligned_vector<int32_t>> accumulators_;  // per thread
  std::vector<std::vector<float>> scales_;             // per thread
};

}  // namespace

std::unique_ptr<Provider> make_aocl_provider(const ProviderContext& context) {
  const LibraryBackend* lib = context.library;
  if (!lib || std::string(lib->library) != "aocl") return nullptr;
  const Aocl& aocl = Aocl::load(blis_library_path(*lib));
  const Element element = element_of(context.config.method);
  if (element == Element::bf16 && !aocl.has_bf16())
    throw std::invalid_argument(aocl.path() + " lacks aocl_gemm_bf16bf16f32of32");
  aocl.verify(element);  // never a fast wrong answer (calibration only times)
  return std::make_unique<AoclProvider>(context, aocl);
}

}  // namespace kt
