// q4k, q5k and q2k (GGUF's Q4_K, Q5_K and Q2_K, kernels/types.hpp's records of scales and mins):
// packing their portable rows, and quantizing float rows to them for load_weights.
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// Row n's q4k super-block records (the portable kQ4kRowRecordBytes each) into its blocks' records.
void put_q4k_meta(PackedMatrix& out, int n, const uint8_t* row_records);

// Q4_K (levels 15) or Q5_K (31) of one row (K a multiple of 256): codes into q, a portable record
// a super-block into records; false if w holds NaN or infinity.
bool quantize_q4k_row(const float* w, int K, int8_t* q, uint8_t* records, int levels = 15);

// Row n of a q5k matrix: Kp codes q in [0, 31] into the panel (nibbles and high bits).
void put_q5k_codes(PackedMatrix& out, int n, const int8_t* codes);

// Q2_K of one row (K a multiple of 256): codes q in [0, 3] into q, a portable record
// (kQ2kRowRecordBytes) a super-block into records; false if w holds NaN or infinity.
bool quantize_q2k_row(const float* w, int K, int8_t* q, uint8_t* records);

// Row n of a q2k matrix: Kp codes in [0, 3] and its portable records into the panel and records.
void put_q2k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records);

}  // namespace kt
