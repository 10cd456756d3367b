// GGUF's Q4_0, Q4_1, Q5_0 and Q5_1 (q40, q41, q50, q51; kernels/types.hpp): rows quantized from
// floats for load_weights, or packed from their portable parts (ktforge.formats.quantize).
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// A zero matrix's scales and records (begin_quantized): d 0, m 0.
void begin_legacy(PackedMatrix& out);

// Row n of `out` from Kp floats (zeros past K); false if they hold NaN or infinity.
bool pack_legacy_floats(PackedMatrix& out, int n, const float* row);

// Row n of `out` from its portable parts: codes (q40, q41: two a byte in int4's order; q50, q51:
// one a byte) and float16 bits a group: d (q41, q51: d then m).
void put_legacy_row(PackedMatrix& out, int n, const uint8_t* codes, const uint16_t* scales);

}  // namespace kt
