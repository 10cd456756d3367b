// Where memory lies on a NUMA machine, through the kernel's own calls (no libnuma): a layer's
// node shares ask for their node with mbind before first touch, then check with move_pages
// where the pages went.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kt {

// Asks that the pages of [data, data + bytes) come from `node` (MPOL_PREFERRED: another node's
// memory when it is full, never an allocation failure). False where the kernel refused (no NUMA
// support, a node outside the process's cpuset, a seccomp filter); the pages then go where first
// touch puts them. data must be page-aligned.
bool prefer_node(void* data, std::size_t bytes, int node);

// The memory-policy mode the kernel holds for the page at `data` (get_mempolicy MPOL_F_ADDR:
// 0 default, 1 preferred, 2 bind, 3 interleave, ...) and its first 64 nodes as a mask; mode -1
// where the call failed.
struct PolicyAt {
  int mode = -1;
  uint64_t nodes = 0;
};
PolicyAt policy_at(const void* data);

// Of up to `samples` pages spread evenly over [data, data + bytes), already touched: how many
// the kernel reports, and how many lie on `node` (move_pages, query only).
struct Placement {
  int64_t pages = 0, on_node = 0;
};
Placement placement(const void* data, std::size_t bytes, int node, int samples);

}  // namespace kt
