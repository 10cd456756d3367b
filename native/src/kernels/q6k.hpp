// q6k and q3k (GGUF's Q6_K and Q3_K, kernels/types.hpp's layouts and their common record of d and
// int8 scales, iq4xs's too): packing their portable rows, and quantizing float rows to them for
// load_weights.
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// Row n's portable records (d, then `groups` int8 scales, one a super-block) into its blocks'
// records of `super_bytes` (d[16], sc[groups][16]): q6k's, q3k's (16 groups), iq4xs's (8).
void put_signed_records(PackedMatrix& out, int n, const uint8_t* row_records, int groups, int super_bytes);

// Row n of a q6k (q3k) matrix: Kp codes q in [0, 63] ([0, 7]) and its portable records
// (kQ6kRowRecordBytes a super-block) into the panel and its blocks' records.
void put_q6k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records);
void put_q3k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records);

// Q6_K (levels 31, offset 32, scales to 127) or Q3_K (3, 4, 31) of one row (K a multiple of
// 256): codes into q, a portable record a super-block into records; false if w holds NaN or
// infinity.
bool quantize_q6k_row(const float* w, int K, uint8_t* q, uint8_t* records, int levels = 31, int offset = kQ6kOffset,
                      int scale_max = 127);

}  // namespace kt
