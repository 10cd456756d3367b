// The selected backend's kernel table (SIMD, or AMX tiles with their SIMD decode path): takes
// every format whose element family the kernels compute, at every token count, in column slices.
#include <algorithm>

#include "moe/provider.hpp"

namespace kt {
namespace {

class KernelProvider final : public Provider {
 public:
  KernelProvider(const KernelTable& kernels, Element element) : kernels_(kernels), element_(element) {}
  const char* name() const override { return "kernels"; }
  std::string describe() const override { return kernels_.describe(element_); }
  void gemm(const ExpertGemm& c) override {
    kernels_.gemm(GemmArgs{c.act, c.rows, c.m, c.w, c.n0, c.n1, c.out, c.ld_out});
    if (c.w->element == Element::nvfp4) scale_columns(c);
  }

 private:
  // nvfp4: each output column times its row's tensor scale, after the kernels (one place for every
  // backend; m x 16 floats a block, in cache)
  static void scale_columns(const ExpertGemm& c) {
    for (int n0 = c.n0; n0 < c.n1; n0 += 16) {
      const float* scale = c.w->row_scales(n0 / 16);
      for (int i = 0; i < c.m; ++i) {
        float* out = c.out + i * c.ld_out + (n0 - c.n0);
        for (int j = 0; j < std::min(16, c.n1 - n0); ++j) out[j] *= scale[j];
      }
    }
  }

 public:

 private:
  const KernelTable& kernels_;
  Element element_;
};

}  // namespace

std::unique_ptr<Provider> make_kernels_provider(const ProviderContext& context) {
  return std::make_unique<KernelProvider>(context.kernels, element_of(context.config.method));
}

}  // namespace kt
