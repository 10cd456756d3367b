// MoeLayer's NUMA shares: their buffers, each asked of its node and first touched by its own
// threads, the experts' blocks and metadata moved into them, and what `info` says of them.
#include <algorithm>
#include <cstring>

#include "moe/layer.hpp"
#include "runtime/numa_memory.hpp"

namespace kt {

std::vector<HugePageBuffer> MoeLayer::allocate_shares(std::size_t gate_up_block, std::size_t down_block,
                                                      std::vector<bool>& preferred) {
  const std::size_t G = shares_.size(), E = static_cast<std::size_t>(config_.experts);
  constexpr std::size_t kChunk = std::size_t{2} << 20;
  std::vector<HugePageBuffer> buffers;
  preferred.assign(G, false);
  std::vector<int64_t> ends;
  int64_t chunks = 0;
  for (std::size_t g = 0; g < G; ++g) {
    const std::size_t bytes = E * ((gate_up_split_[g + 1] - gate_up_split_[g]) * gate_up_block +
                                   (down_split_[g + 1] - down_split_[g]) * down_block);
    buffers.emplace_back(bytes);
    // the node's memory asked for before any page exists; then each page touched by the node's
    // own threads, so first touch agrees where the kernel refused the request
    if (bytes) preferred[g] = prefer_node(buffers[g].data(), bytes, shares_[g].node);
    chunks += static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
    ends.push_back(chunks);
  }
  run_tasks(ends, [&](int64_t task, int) {
    std::size_t g = 0;
    while (task >= ends[g]) ++g;
    const std::size_t at = static_cast<std::size_t>(task - (g ? ends[g - 1] : 0)) * kChunk;
    HugePageBuffer& buffer = buffers[g];
    std::memset(buffer.data() + at, 0, std::min(kChunk, buffer.size() - at));
  });
  return buffers;
}

void MoeLayer::scatter_to_shares(std::vector<HugePageBuffer>& buffers, int e, PackedMatrix& gate_up,
                                 PackedMatrix& down) const {
  for (PackedMatrix* m : {&gate_up, &down}) m->block_at.assign(m->blocks(), nullptr);
  const std::size_t gub = gate_up.block_bytes(), dnb = down.block_bytes();
  for (std::size_t g = 0; g < shares_.size(); ++g) {
    const int gu0 = gate_up_split_[g], gu1 = gate_up_split_[g + 1], dn0 = down_split_[g], dn1 = down_split_[g + 1];
    const std::size_t expert_bytes = (gu1 - gu0) * gub + (dn1 - dn0) * dnb;
    uint8_t* base = buffers[g].data() + static_cast<std::size_t>(e) * expert_bytes;
    if (gu1 > gu0) std::memcpy(base, gate_up.values + gu0 * gub, (gu1 - gu0) * gub);
    for (int b = gu0; b < gu1; ++b) gate_up.block_at[b] = base + (b - gu0) * gub;
    uint8_t* down_base = base + (gu1 - gu0) * gub;
    if (dn1 > dn0) std::memcpy(down_base, down.values + dn0 * dnb, (dn1 - dn0) * dnb);
    for (int b = dn0; b < dn1; ++b) down.block_at[b] = down_base + (b - dn0) * dnb;
  }
  gate_up.values = down.values = nullptr;  // the staging is the next expert's: every read goes through block_at
}

std::vector<HugePageBuffer> MoeLayer::place_metadata(std::vector<PackedMatrix>& gate_up,
                                                     std::vector<PackedMatrix>& down, std::vector<bool>& preferred) {
  const std::size_t G = shares_.size(), E = gate_up.size();
  // share g's blocks of a matrix (gate/up's in whole pairs, down's of hidden columns), as scatter_to_shares
  auto range = [&](const PackedMatrix& m, bool is_down, std::size_t g) {
    const std::vector<int>& split = is_down ? down_split_ : gate_up_split_;
    return std::pair<int, int>{std::min(m.blocks(), split[g]), std::min(m.blocks(), split[g + 1])};
  };
  // each kind's run of a share's blocks, 64-byte aligned
  auto run_bytes = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
  auto bytes_of = [&](const PackedMatrix& m, bool is_down, std::size_t g) {
    const auto [b0, b1] = range(m, is_down, g);
    std::size_t total = 0;
    for (const auto& part : m.meta_parts()) total += run_bytes(static_cast<std::size_t>(b1 - b0) * part.second);
    return total;
  };
  std::vector<std::vector<std::size_t>> offset(G, std::vector<std::size_t>(E + 1, 0));
  std::vector<HugePageBuffer> buffers;
  std::vector<int64_t> ends;
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t e = 0; e < E; ++e) offset[g][e + 1] = offset[g][e] + bytes_of(gate_up[e], false, g) + bytes_of(down[e], true, g);
    buffers.emplace_back(offset[g][E]);
    if (offset[g][E] && !prefer_node(buffers[g].data(), offset[g][E], shares_[g].node)) preferred[g] = false;
    ends.push_back(static_cast<int64_t>((g + 1) * E));
  }
  for (auto* set : {&gate_up, &down})
    for (auto& m : *set) m.meta_at.assign(m.blocks(), {});
  // each share's records copied by its own threads: its pages first touched on its node
  run_tasks(ends, [&](int64_t task, int) {
    const std::size_t g = static_cast<std::size_t>(task) / E, e = static_cast<std::size_t>(task) % E;
    uint8_t* at = buffers[g].data() + offset[g][e];
    for (PackedMatrix* m : {&gate_up[e], &down[e]}) {
      const auto [b0, b1] = range(*m, m == &down[e], g);
      const auto parts = m->meta_parts();
      for (int kind = 0; kind < PackedMatrix::kMetaKinds; ++kind) {
        const auto [source, per_block] = parts[kind];
        if (per_block == 0) continue;
        std::memcpy(at, source + static_cast<std::size_t>(b0) * per_block, static_cast<std::size_t>(b1 - b0) * per_block);
        for (int b = b0; b < b1; ++b) m->meta_at[b][kind] = at + static_cast<std::size_t>(b - b0) * per_block;
        at += run_bytes(static_cast<std::size_t>(b1 - b0) * per_block);
      }
    }
  });
  for (auto* set : {&gate_up, &down})
    for (auto& m : *set) {  // every read goes through meta_at now: the vectors' memory is given back
      const std::size_t placed = m.metadata_bytes();
      m.scale = {}, m.group_scale = {}, m.colsum = {}, m.group_e8m0 = {}, m.group_meta = {}, m.block_scale = {};
      m.placed_meta_bytes = placed;
    }
  return buffers;
}

std::vector<ShareFacts> MoeLayer::share_facts() const {
  std::vector<ShareFacts> facts;
  for (std::size_t g = 0; g < shares_.size(); ++g) {
    ShareFacts f{};
    f.node = shares_[g].node;
    f.threads = static_cast<int>(shares_[g].cpus.size());
    const int I = config_.intermediate, H = config_.hidden;  // a gate/up block pair is 16 columns of I
    f.gate_up_columns = std::min(I, gate_up_split_[g + 1] * 8) - std::min(I, gate_up_split_[g] * 8);
    f.down_columns = std::min(H, down_split_[g + 1] * 16) - std::min(H, down_split_[g] * 16);
    const std::size_t value_bytes = g < share_weights_.size() ? share_weights_[g].size() : 0;
    const std::size_t meta_bytes = g < share_metadata_.size() ? share_metadata_[g].size() : 0;
    f.bytes = value_bytes + meta_bytes;
    f.preferred = g < share_preferred_.size() && share_preferred_[g];
    f.policy = -1;
    if (value_bytes) {
      f.policy = policy_at(share_weights_[g].data()).mode;
      const Placement p = placement(share_weights_[g].data(), value_bytes, f.node, 1024);
      f.pages_sampled = p.pages;
      f.pages_on_node = p.on_node;
    }
    if (meta_bytes) {  // the scales and records, sampled too
      const Placement p = placement(share_metadata_[g].data(), meta_bytes, f.node, 256);
      f.pages_sampled += p.pages;
      f.pages_on_node += p.on_node;
    }
    facts.push_back(f);
  }
  return facts;
}

}  // namespace kt
