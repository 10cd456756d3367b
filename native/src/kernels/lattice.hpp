// GGUF's i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S; kernels/types.hpp's lattice()): the panel's
// chunks, what a value and a group's scale are, packing rows from the file's blocks or from floats.
//
// A chunk holds 32 values of K of a 16-column block, the file's bits of them regrouped by line
// (8 values of K; l = 0..3) and column c:
//   iq2xxs (128 bytes): idx[l][c] (a byte), then aux[c] (uint32: 4 x 7 sign bits, ls in bits 28-31)
//   iq2xs  (144 bytes): q[l][c] (uint16: a 9-bit index, 7 sign bits above), then sc[c] (lines 0-1's
//                       4-bit ls in the low nibble, 2-3's in the high)
//   iq3xxs (192 bytes): idx[l][c][2] (a byte per 4 values), then aux[c] as iq2xxs's
//   iq1s   (96 bytes):  idx[l][c] (the index's low 8 bits), then qh[c] (uint16: 3 high index bits a
//                       line, ls in bits 12-14, the shift's sign in bit 15)
// exactly the file's bytes, d[16] a super-block in group_meta. Every backend reads them so.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/types.hpp"
#include "lattice_grids.gen.hpp"

namespace kt {

// 7 sign bits and the 8th, their parity (llama.cpp's ksigns_iq2xs)
inline int lattice_signs(uint32_t s7) { return static_cast<int>(s7 | ((__builtin_popcount(s7) & 1u) << 7)); }

// The file's block of 256 values, d included (66, 74, 98, 50 bytes)
inline int lattice_block_bytes(Element m) {
  return m == Element::iq2xxs ? 66 : m == Element::iq2xs ? 74 : m == Element::iq3xxs ? 98 : 50;
}
// w = scale * value, scale = d * (2 ls + 1) * kLatticeFactor: IQ2's 1/8, IQ3_XXS's 1/4, IQ1_S's 1/8
// (its values 8 * grid +- 1)
inline float lattice_factor(Element m) { return m == Element::iq3xxs ? 0.25f : 0.125f; }

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint32_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Value k (of Kp) of column c of a block's panel: the grid's value with its sign (IQ1_S: 8 times
// the grid's value plus the group's shift, +-1), an integer the kernels multiply exactly.
inline int lattice_value(Element m, const uint8_t* panel, int c, int k) {
  const uint8_t* chunk = panel + static_cast<std::size_t>(k / kLatticeChunkValues) * lattice_chunk_bytes(m);
  const int l = (k % kLatticeChunkValues) / 8, j = k % 8;
  if (m == Element::iq1s) {
    const uint32_t qh = load_u16(chunk + 64 + 2 * c);
    const int index = chunk[l * 16 + c] | static_cast<int>(((qh >> (3 * l)) & 7) << 8);
    const int g = static_cast<int8_t>(kIq1sGrid[index] >> (8 * j));
    return 8 * g + ((qh & 0x8000) ? -1 : 1);
  }
  int g = 0, signs = 0;
  if (m == Element::iq2xxs) {
    g = static_cast<int>((kIq2xxsGrid[chunk[l * 16 + c]] >> (8 * j)) & 0xFF);
    signs = lattice_signs((load_u32(chunk + 64 + 4 * c) >> (7 * l)) & 127);
  } else if (m == Element::iq2xs) {
    const uint32_t q = load_u16(chunk + (l * 16 + c) * 2);
    g = static_cast<int>((kIq2xsGrid[q & 511] >> (8 * j)) & 0xFF);
    signs = lattice_signs(q >> 9);
  } else {
    g = static_cast<int>((kIq3xxsGrid[chunk[(l * 16 + c) * 2 + j / 4]] >> (8 * (j % 4))) & 0xFF);
    signs = lattice_signs((load_u32(chunk + 128 + 4 * c) >> (7 * l)) & 127);
  }
  return (signs >> j) & 1 ? -g : g;
}

// The 4-bit (IQ1_S: 3-bit) ls of group g (of the matrix's group: 16 for iq2xs, else 32) of column c
inline int lattice_ls(Element m, const uint8_t* panel, int g, int c) {
  if (m == Element::iq2xs) return (panel[static_cast<std::size_t>(g / 2) * 144 + 128 + c] >> (4 * (g % 2))) & 15;
  const uint8_t* chunk = panel + static_cast<std::size_t>(g) * lattice_chunk_bytes(m);
  if (m == Element::iq1s) return static_cast<int>((load_u16(chunk + 64 + 2 * c) >> 12) & 7);
  return static_cast<int>(load_u32(chunk + (m == Element::iq2xxs ? 64 : 128) + 4 * c) >> 28);
}

// Column c's d of the super-block holding value k
inline float lattice_d(const PackedMatrix& w, int block, int k, int c) {
  return f16_to_f32(static_cast<uint16_t>(load_u16(w.block_meta(block) + (k / kQ4kSuperBlock) * kLatticeSuperBytes + 2 * c)));
}

// Group g's scale of column c: d * (2 ls + 1) * factor, exact in float32 (11 + 5 significant bits)
inline float lattice_scale(const PackedMatrix& w, int block, int g, int c) {
  const int ls = lattice_ls(w.element, w.block(block), g, c);
  return lattice_d(w, block, g * w.group, c) * static_cast<float>(2 * ls + 1) * lattice_factor(w.element);
}

// Row n from the file's blocks less their d (`codes`, Kp / 256 blocks of lattice_block_bytes - 2
// bytes) and the blocks' d (float16 bits), as ktforge.formats.quantize's portable layout has them.
void put_lattice_row(PackedMatrix& out, int n, const uint8_t* codes, const uint16_t* d);

// A row of Kp floats (Kp a multiple of 256) into the file's blocks less d and their d, a simple
// search (each 8 or 4 values the nearest grid point at a scale from the group's largest value,
// signs kept, their parity mended at the least cost): what load_weights packs floats to. False if
// w holds NaN or infinity.
bool quantize_lattice_row(Element m, const float* w, int Kp, uint8_t* codes, uint16_t* d);
// Row n of `out` from Kp finite floats (load_weights checks them): quantize_lattice_row, then put_lattice_row.
void pack_lattice_floats(PackedMatrix& out, int n, const float* row);

}  // namespace kt
