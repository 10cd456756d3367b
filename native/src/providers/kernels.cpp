// The selected backend's kernel table (SIMD, or AMX tiles with their SIMD decode path): takes
// every format whose element family the kernels compute, at every token count, in column slices.
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
  }

 private:
  const KernelTable& kernels_;
  Element element_;
};

}  // namespace

std::unique_ptr<Provider> make_kernels_provider(const ProviderContext& context) {
  return std::make_unique<KernelProvider>(context.kernels, element_of(context.config.method));
}

}  // namespace kt
