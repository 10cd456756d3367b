#include "runtime/numa_memory.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

namespace kt {
namespace {
constexpr int kMpolPreferred = 1, kMpolFAddr = 2;
constexpr unsigned long kMaxNodes = 1024;
}  // namespace

bool prefer_node(void* data, std::size_t bytes, int node) {
  if (node < 0 || node >= static_cast<int>(kMaxNodes) || bytes == 0) return false;
  std::vector<unsigned long> mask(kMaxNodes / (8 * sizeof(unsigned long)), 0);
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  return syscall(SYS_mbind, data, bytes, kMpolPreferred, mask.data(), kMaxNodes + 1, 0) == 0;
}

PolicyAt policy_at(const void* data) {
  int mode = 0;
  std::vector<unsigned long> mask(kMaxNodes / (8 * sizeof(unsigned long)), 0);
  if (syscall(SYS_get_mempolicy, &mode, mask.data(), kMaxNodes + 1, data, kMpolFAddr) != 0) return {};
  return {mode & 0xff, static_cast<uint64_t>(mask[0])};
}

Placement placement(const void* data, std::size_t bytes, int node, int samples) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t pages = bytes / page;
  if (pages == 0 || samples <= 0) return {};
  const std::size_t count = std::min<std::size_t>(pages, static_cast<std::size_t>(samples));
  std::vector<void*> addresses(count);
  std::vector<int> status(count, -1);
  for (std::size_t i = 0; i < count; ++i)
    addresses[i] = const_cast<char*>(static_cast<const char*>(data)) + (pages * i / count) * page;
  if (syscall(SYS_move_pages, 0, count, addresses.data(), nullptr, status.data(), 0) != 0) return {};
  Placement result;
  for (int s : status) {
    if (s < 0) continue;  // not present, or no node known
    ++result.pages;
    result.on_node += s == node;
  }
  return result;
}

}  // namespace kt
