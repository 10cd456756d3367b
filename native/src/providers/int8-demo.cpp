// A throwaway format's provider: int8-demo is int8 under another name, computed by the
// reference kernels whatever the backend (it shows what adding a format takes).
#include "kernels/registry.hpp"
#include "moe/provider.hpp"

namespace kt {
namespace {

class Int8DemoProvider final : public Provider {
 public:
  const char* name() const override { return "int8-demo"; }
  std::string describe() const override { return "int8-demo: " + reference_kernels.describe(Element::int8); }
  void gemm(const ExpertGemm& c) override {
    reference_kernels.gemm(GemmArgs{c.act, c.rows, c.m, c.w, c.n0, c.n1, c.out, c.ld_out});
  }
};

}  // namespace

std::unique_ptr<Provider> make_int8_demo_provider(const ProviderContext&) {
  return std::make_unique<Int8DemoProvider>();
}

}  // namespace kt
