#include "runtime/huge_pages.hpp"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace kt {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
std::size_t round_up_huge(std::size_t v) { return (v + kHugePage - 1) / kHugePage * kHugePage; }
}  // namespace

HugePageBuffer::HugePageBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  // Map one huge page more than needed and start at the first 2 MiB boundary inside.
  const std::size_t span = round_up_huge(bytes);
  mapped_ = span + kHugePage;
  mapping_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    mapped_ = 0;
    throw std::bad_alloc();
  }
  const auto start = reinterpret_cast<std::uintptr_t>(mapping_);
  data_ = reinterpret_cast<uint8_t*>((start + kHugePage - 1) / kHugePage * kHugePage);
  size_ = bytes;
  advised_ = madvise(data_, span, MADV_HUGEPAGE) == 0;
}

void HugePageBuffer::release() {
  if (mapping_) munmap(mapping_, mapped_);
  mapping_ = nullptr;
  mapped_ = size_ = 0;
  data_ = nullptr;
  advised_ = false;
}

HugePageBuffer::~HugePageBuffer() { release(); }

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept { *this = std::move(other); }

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    release();
    std::swap(mapping_, other.mapping_);
    std::swap(mapped_, other.mapped_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(advised_, other.advised_);
  }
  return *this;
}

}  // namespace kt
