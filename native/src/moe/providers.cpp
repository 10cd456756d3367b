#include <stdexcept>

#include "moe/provider.hpp"
#include "providers.gen.hpp"

namespace kt {

std::vector<std::unique_ptr<Provider>> make_providers(const ProviderContext& context) {
  const FormatInfo& format = format_info(context.config.method);
  std::vector<std::unique_ptr<Provider>> providers;
  if (context.config.mixed()) {  // two formats: the kernel table, which takes every element family
    providers.push_back(make_kernels_provider(context));
    return providers;
  }
  for (int i = 0; i < format.provider_count; ++i) {
    const ProviderFactory make = provider_factory(format.providers[i]);
    if (!make) throw std::logic_error(std::string("no provider file for '") + format.providers[i] + "'");
    if (auto provider = make(context)) providers.push_back(std::move(provider));
  }
  if (providers.empty() || providers.back()->min_rows() > 1)
    throw std::invalid_argument(std::string("no provider computes method '") + format.name + "' on backend '" +
                                context.kernels.name + "' for every token count");
  return providers;
}

}  // namespace kt
