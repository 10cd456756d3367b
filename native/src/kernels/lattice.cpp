#include "kernels/lattice.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

// A grid's entries as floats, each of its values a row over all entries (IQ1_S's times 8), and
// each entry's squared norm: the nearest entry to t is the least norm - 2 t . entry, a loop the
// compiler vectorizes over the entries (a search of every entry; 20x the time of one that stops
// early at the first worse partial sum, which no compiler vectorizes).
// The values a grid's entries take (its levels) and, for each point of the full product of them,
// the entry that is that point (-1: none): where t's nearest level in every value is an entry,
// that entry is the nearest, and no search is needed.
struct Grid {
  int count = 0, width = 0;
  std::vector<float> columns;  // [width][count]
  std::vector<float> norms;    // [count]
  std::vector<float> levels;   // ascending
  std::vector<int> point;      // [levels^width]
  int value(int e, int j) const { return static_cast<int>(columns[static_cast<std::size_t>(j) * count + e]); }
  int level(float t) const {
    int l = 0;
    while (l + 1 < static_cast<int>(levels.size()) && t > 0.5f * (levels[l] + levels[l + 1])) ++l;
    return l;
  }
};
Grid make_grid(const void* entries, int count, int width, bool signed_times_8) {
  Grid g;
  g.count = count, g.width = width;
  g.columns.resize(static_cast<std::size_t>(count) * width);
  g.norms.assign(count, 0.f);
  for (int e = 0; e < count; ++e)
    for (int j = 0; j < width; ++j) {
      const uint64_t bits = width == 4 ? static_cast<const uint32_t*>(entries)[e] : static_cast<const uint64_t*>(entries)[e];
      const int byte = static_cast<int>((bits >> (8 * j)) & 0xFF);
      const float v = signed_times_8 ? 8.f * static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
      g.columns[static_cast<std::size_t>(j) * count + e] = v;
      g.norms[e] += v * v;
      if (std::find(g.levels.begin(), g.levels.end(), v) == g.levels.end()) g.levels.push_back(v);
    }
  std::sort(g.levels.begin(), g.levels.end());
  std::size_t points = 1;
  for (int j = 0; j < width; ++j) points *= g.levels.size();
  g.point.assign(points, -1);
  for (int e = 0; e < count; ++e) {
    std::size_t key = 0;
    for (int j = width - 1; j >= 0; --j) key = key * g.levels.size() + g.level(static_cast<float>(g.value(e, j)));
    g.point[key] = e;
  }
  return g;
}
const Grid& grid_of(Element m) {
  static const Grid iq2xxs = make_grid(kIq2xxsGrid, 256, 8, false), iq2xs = make_grid(kIq2xsGrid, 512, 8, false);
  static const Grid iq3xxs = make_grid(kIq3xxsGrid, 256, 4, false), iq1s = make_grid(kIq1sGrid, 2048, 8, true);
  return m == Element::iq2xxs ? iq2xxs : m == Element::iq2xs ? iq2xs : m == Element::iq3xxs ? iq3xxs : iq1s;
}

// The entry nearest t (width values; IQ1_S's less the group's shift), and its squared distance
int nearest(const Grid& grid, const float* t, float& error) {
  std::size_t key = 0;
  for (int j = grid.width - 1; j >= 0; --j) key = key * grid.levels.size() + grid.level(t[j]);
  if (const int e = grid.point[key]; e >= 0) {
    error = 0.f;
    for (int j = 0; j < grid.width; ++j) {
      const float diff = t[j] - static_cast<float>(grid.value(e, j));
      error += diff * diff;
    }
    return e;
  }
  thread_local std::vector<float> score;
  score.assign(grid.norms.begin(), grid.norms.end());
  float tt = 0.f;
  for (int j = 0; j < grid.width; ++j) {
    const float twice = 2.f * t[j];
    const float* column = grid.columns.data() + static_cast<std::size_t>(j) * grid.count;
    for (int e = 0; e < grid.count; ++e) score[e] -= twice * column[e];
    tt += t[j] * t[j];
  }
  const int best = static_cast<int>(std::min_element(score.begin(), score.end()) - score.begin());
  error = std::max(0.f, score[best] + tt);
  return best;
}

// IQ1_S's group of 32 (4 lines of v, at `inverse`): the shift (+-1) that fits them better, and the
// lines' 11-bit indices and 3-bit scale into the block's qs and qh
void encode_iq1s_group(const Grid& grid, const float* v, float inverse, int ls, uint8_t* blk, int ib) {
  int best[2][4];
  float errors[2] = {0.f, 0.f};
  for (int side = 0; side < 2; ++side)
    for (int l = 0; l < 4; ++l) {
      float t[8], e;
      for (int j = 0; j < 8; ++j) t[j] = v[8 * l + j] * inverse - (side ? -1.f : 1.f);
      best[side][l] = nearest(grid, t, e);
      errors[side] += e;
    }
  const int side = errors[1] < errors[0] ? 1 : 0;
  uint32_t qh = static_cast<uint32_t>(ls << 12) | (side ? 0x8000u : 0u);
  for (int l = 0; l < 4; ++l) {
    blk[4 * ib + l] = static_cast<uint8_t>(best[side][l] & 0xFF);
    qh |= static_cast<uint32_t>((best[side][l] >> 8) << (3 * l));
  }
  const uint16_t packed = static_cast<uint16_t>(qh);
  std::memcpy(blk + 32 + 2 * ib, &packed, 2);
}

// A line of 8 values v (at `inverse`) of the signed types: each 8 (IQ3_XXS: 4) magnitudes' nearest
// grid point and the values' signs, their count made even (the 8th sign is the others' parity) by
// flipping the one that costs least; the indices into the block, the 7 signs returned.
uint32_t encode_signed_line(Element m, const Grid& grid, const float* v, float inverse, uint8_t* blk, int ib, int line) {
  float t[8], e;
  int signs = 0, index[2] = {0, 0};
  for (int j = 0; j < 8; ++j) {
    t[j] = std::fabs(v[j]) * inverse;
    if (v[j] < 0.f) signs |= 1 << j;
  }
  for (int h = 0; h < 8 / grid.width; ++h) index[h] = nearest(grid, t + h * grid.width, e);
  const auto cost = [&](int j) { return std::fabs(v[j]) * static_cast<float>(grid.value(index[j / grid.width], j % grid.width)); };
  if (__builtin_popcount(static_cast<unsigned>(signs)) & 1) {
    int cheapest = 0;
    for (int j = 1; j < 8; ++j)
      if (cost(j) < cost(cheapest)) cheapest = j;
    signs ^= 1 << cheapest;
  }
  const uint32_t s7 = static_cast<uint32_t>(signs & 127);
  if (m == Element::iq2xxs) blk[8 * ib + line] = static_cast<uint8_t>(index[0]);
  if (m == Element::iq2xs) {
    const uint16_t q = static_cast<uint16_t>(index[0] | (s7 << 9));
    std::memcpy(blk + 2 * (4 * ib + line), &q, 2);
  }
  if (m == Element::iq3xxs) blk[8 * ib + 2 * line] = static_cast<uint8_t>(index[0]), blk[8 * ib + 2 * line + 1] = static_cast<uint8_t>(index[1]);
  return s7;
}

}  // namespace

bool quantize_lattice_row(Element m, const float* w, int Kp, uint8_t* codes, uint16_t* d_out) {
  for (int k = 0; k < Kp; ++k)
    if (!std::isfinite(w[k])) return false;
  const Grid& grid = grid_of(m);
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
      const float scale = d * factor * static_cast<float>(2 * ls + 1), inverse = scale > 0.f ? 1.f / scale : 0.f;
      const int ib = g * group / kLatticeChunkValues;  // the 32 values' block
      if (iq1) {
        encode_iq1s_group(grid, x + g * group, inverse, ls, blk, ib);
        continue;
      }
      if (m == Element::iq2xs) blk[64 + ib] |= static_cast<uint8_t>(ls << (4 * (g % 2)));
      uint32_t aux = static_cast<uint32_t>(ls) << 28;  // IQ2_XXS's, IQ3_XXS's signs and scale
      for (int l = 0; l < group / 8; ++l) {
        const int line = (g * group % kLatticeChunkValues) / 8 + l;  // in the 32 values' block
        aux |= encode_signed_line(m, grid, x + g * group + 8 * l, inverse, blk, ib, line) << (7 * line);
      }
      if (m == Element::iq2xxs) std::memcpy(blk + 8 * ib + 4, &aux, 4);
      if (m == Element::iq3xxs) std::memcpy(blk + 64 + 4 * ib, &aux, 4);
    }
  }
  return true;
}

void pack_lattice_floats(PackedMatrix& out, int n, const float* row) {
  const Element m = out.element;
  std::vector<uint8_t> codes(static_cast<std::size_t>(out.Kp / kQ4kSuperBlock) * (lattice_block_bytes(m) - 2));
  std::vector<uint16_t> d(out.Kp / kQ4kSuperBlock);
  quantize_lattice_row(m, row, out.Kp, codes.data(), d.data());
  put_lattice_row(out, n, codes.data(), d.data());
}

}  // namespace kt
