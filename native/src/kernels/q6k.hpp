// q6k (GGUF's Q6_K, kernels/types.hpp's layout and record): packing its portable rows, and
// quantizing float rows to it for load_weights.
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// Row n of a q6k matrix: Kp codes q in [0, 63] and its portable records (kQ6kRowRecordBytes a
// super-block) into the panel and its blocks' records.
void put_q6k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records);

// Q6_K of one row (K a multiple of 256): codes into q, a portable record a super-block into
// records; false if w holds NaN or infinity.
bool quantize_q6k_row(const float* w, int K, uint8_t* q, uint8_t* records);

}  // namespace kt
