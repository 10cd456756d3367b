#include "kernels/lattice.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kt {

void put_lattice_row(PackedMatrix& out, int n, const uint8_t* codes, const uint16_t* d) {
  const Element m = out.element;
  const int bytes = lattice_block_bytes(m) - 2, chunk_bytes = lattice_chunk_bytes(m), c = n % 16;
  const int supers = out.Kp / kQ4kSuperBlock;
  uint8_t* panel = out.values + static_cast<std::size_t>(n / 16) * out.block_bytes();
  uint8_t* meta = out.group_meta.data() + static_cast<std::size_t>(n / 16) * out.meta_bytes_per_block();
  for (int s = 0; s < supers; ++s) {
    const uint8_t* blk = codes + static_cast<std::size_t>(s) * bytes;
    std::memcpy(meta + s * kLatticeSuperBytes + 2 * c, d + s, 2);
    for (int ib = 0; ib < kQ4kSuperBlock / kLatticeChunkValues; ++ib) {
      uint8_t* chunk = panel + static_cast<std::size_t>(s * 8 + ib) * chunk_bytes;
      for (int l = 0; l < 4; ++l) {
        if (m == Element::iq2xxs) chunk[l * 16 + c] = blk[8 * ib + l];
        if (m == Element::iq2xs) std::memcpy(chunk + (l * 16 + c) * 2, blk + 2 * (4 * ib + l), 2);
        if (m == Element::iq3xxs) std::memcpy(chunk + (l * 16 + c) * 2, blk + 8 * ib + 2 * l, 2);
        if (m == Element::iq1s) chunk[l * 16 + c] = blk[4 * ib + l];
      }
      if (m == Element::iq2xxs) std::memcpy(chunk + 64 + 4 * c, blk + 8 * ib + 4, 4);
      if (m == Element::iq2xs) chunk[128 + c] = blk[64 + ib];
      if (m == Element::iq3xxs) std::memcpy(chunk + 128 + 4 * c, blk + 64 + 4 * ib, 4);
      if (m == Element::iq1s) std::memcpy(chunk + 64 + 2 * c, blk + 32 + 2 * ib, 2);
    }
  }
}

namespace {

// The grid's entries, each its values widened (IQ3_XXS: 4 of them)
struct Grid {
  const void* entries;
  int count, width;
  int value(int e, int j) const {
    if (width == 4) return static_cast<int>((static_cast<const uint32_t*>(entries)[e] >> (8 * j)) & 0xFF);
    const uint64_t bits = static_cast<const uint64_t*>(entries)[e] >> (8 * j);
    return width < 0 ? static_cast<int8_t>(bits & 0xFF) : static_cast<int>(bits & 0xFF);  // width -8: IQ1_S's signed
  }
  int values() const { return width < 0 ? -width : width; }
};
Grid grid_of(Element m) {
  if (m == Element::iq2xxs) return {kIq2xxsGrid, 256, 8};
  if (m == Element::iq2xs) return {kIq2xsGrid, 512, 8};
  if (m == Element::iq3xxs) return {kIq3xxsGrid, 256, 4};
  return {kIq1sGrid, 2048, -8};
}

// The entry nearest t (t[j]: the wanted values / scale; IQ1_S: times 8, less the shift), and its error
int nearest(const Grid& grid, const float* t, int shift, float& error) {
  int best = 0;
  error = std::numeric_limits<float>::infinity();
  for (int e = 0; e < grid.count; ++e) {
    float sum = 0.f;
    for (int j = 0; j < grid.values() && sum < error; ++j) {
      const float diff = t[j] - static_cast<float>(grid.width < 0 ? 8 * grid.value(e, j) + shift : grid.value(e, j));
      sum += diff * diff;
    }
    if (sum < error) error = sum, best = e;
  }
  return best;
}

}  // namespace

bool quantize_lattice_row(Element m, const float* w, int Kp, uint8_t* codes, uint16_t* d_out) {
  for (int k = 0; k < Kp; ++k)
    if (!std::isfinite(w[k])) return false;
  const Grid grid = grid_of(m);
  const bool iq1 = m == Element::iq1s;
  const int bytes = lattice_block_bytes(m) - 2, group = m == Element::iq2xs ? 16 : 32, ls_max = iq1 ? 7 : 15;
  // the largest grid magnitude the group's largest |w| lands on
  const float top = iq1 ? 9.f : m == Element::iq3xxs ? 62.f : 43.f, factor = lattice_factor(m);
  for (int s = 0; s < Kp / kQ4kSuperBlock; ++s) {
    const float* x = w + s * kQ4kSuperBlock;
    uint8_t* blk = codes + static_cast<std::size_t>(s) * bytes;
    std::memset(blk, 0, bytes);
    float wanted[16] = {}, largest = 0.f;
    for (int g = 0; g < kQ4kSuperBlock / group; ++g) {
      for (int k = g * group; k < (g + 1) * group; ++k) wanted[g] = std::max(wanted[g], std::fabs(x[k]));
      wanted[g] /= top;
      largest = std::max(largest, wanted[g]);
    }
    d_out[s] = f32_to_f16(largest / (factor * static_cast<float>(2 * ls_max + 1)));
    const float d = f16_to_f32(d_out[s]);
    for (int g = 0; g < kQ4kSuperBlock / group; ++g) {
      const int ls = d > 0.f ? std::clamp(static_cast<int>(std::lround((wanted[g] / (d * factor) - 1.f) / 2.f)), 0, ls_max) : 0;
      const float scale = d * factor * static_cast<float>(2 * ls + 1);
      const float inverse = scale > 0.f ? 1.f / scale : 0.f;
      const int ib = g * group / kLatticeChunkValues;  // the 32 values' block
      if (m == Element::iq2xs) blk[64 + ib] |= static_cast<uint8_t>(ls << (4 * (g % 2)));
      uint32_t aux = static_cast<uint32_t>(ls) << 28;
      int best_shift = 1;
      if (iq1) {  // the group's shift: the sign that fits its lines better
        float errors[2] = {0.f, 0.f};
        for (int shift : {1, -1})
          for (int l = 0; l < 4; ++l) {
            float t[8], e;
            for (int j = 0; j < 8; ++j) t[j] = x[g * group + 8 * l + j] * inverse;
            nearest(grid, t, shift, e);
            errors[shift < 0] += e;
          }
        best_shift = errors[1] < errors[0] ? -1 : 1;
      }
      for (int l = 0; l < group / 8; ++l) {
        const float* v = x + g * group + 8 * l;
        const int line = (g * group % kLatticeChunkValues) / 8 + l;  // in the 32 values' block
        float t[8], e;
        if (iq1) {
          for (int j = 0; j < 8; ++j) t[j] = v[j] * inverse;
          const int index = nearest(grid, t, best_shift, e);
          blk[4 * ib + line] = static_cast<uint8_t>(index & 0xFF);
          uint32_t qh = load_u16(blk + 32 + 2 * ib) | static_cast<uint32_t>((index >> 8) << (3 * line)) |
                        static_cast<uint32_t>(ls << 12) | (best_shift < 0 ? 0x8000u : 0u);
          const uint16_t packed = static_cast<uint16_t>(qh);
          std::memcpy(blk + 32 + 2 * ib, &packed, 2);
          continue;
        }
        int signs = 0;
        for (int j = 0; j < 8; ++j) {
          t[j] = std::fabs(v[j]) * inverse;
          if (v[j] < 0.f) signs |= 1 << j;
        }
        int index[2];
        for (int h = 0; h < 8 / grid.values(); ++h) index[h] = nearest(grid, t + h * grid.values(), 0, e);
        const auto magnitude = [&](int j) { return grid.value(index[j / grid.values()], j % grid.values()); };
        if (__builtin_popcount(static_cast<unsigned>(signs)) & 1) {  // an odd count: flip the cheapest
          int cheapest = 0;
          for (int j = 1; j < 8; ++j)
            if (std::fabs(v[j]) * static_cast<float>(magnitude(j)) < std::fabs(v[cheapest]) * static_cast<float>(magnitude(cheapest)))
              cheapest = j;
          signs ^= 1 << cheapest;
        }
        const uint32_t s7 = static_cast<uint32_t>(signs & 127);
        if (m == Element::iq2xxs) {
          blk[8 * ib + line] = static_cast<uint8_t>(index[0]);
          aux |= s7 << (7 * line);
        } else if (m == Element::iq2xs) {
          const uint16_t q = static_cast<uint16_t>(index[0] | (s7 << 9));
          std::memcpy(blk + 2 * (4 * ib + line), &q, 2);
        } else {
          blk[8 * ib + 2 * line] = static_cast<uint8_t>(index[0]);
          blk[8 * ib + 2 * line + 1] = static_cast<uint8_t>(index[1]);
          aux |= s7 << (7 * line);
        }
      }
      if (m == Element::iq2xxs) std::memcpy(blk + 8 * ib + 4, &aux, 4);
      if (m == Element::iq3xxs) std::memcpy(blk + 64 + 4 * ib, &aux, 4);
    }
  }
  return true;
}

}  // namespace kt
