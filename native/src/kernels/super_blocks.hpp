// Rows of GGUF's K-quants with records of their own (q4k, q5k, q6k, q3k, q2k; kernels/types.hpp):
// quantized from floats for load_weights, or packed from their portable parts
// (ktforge.formats.quantize). iq4xs shares iq4nl's codes and goes with it in kernels/pack.cpp.
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

inline bool super_block_rows(Element m) { return k_quant(m) && m != Element::iq4xs; }

// Row n of `out` from Kp floats (zeros past K); false if they hold NaN or infinity.
bool pack_super_block_floats(PackedMatrix& out, int n, const float* row);

// Row n of `out` from its portable parts: codes (q4k: two a byte in int4's order; the others one
// a byte) and a record a super-block.
void put_super_block_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* records);

}  // namespace kt
