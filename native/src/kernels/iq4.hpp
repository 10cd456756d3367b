// iq4nl and iq4xs (GGUF's IQ4_NL and IQ4_XS, kernels/types.hpp): quantizing float rows to them for
// load_weights, and iq4xs's records into a packed matrix.
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// Row n's iq4xs records (kIq4xsRowRecordBytes a super-block: d, sc[8]) into its blocks' records.
void put_iq4xs_meta(PackedMatrix& out, int n, const uint8_t* row_records);

// IQ4_NL (xs false: a float16 scale per 32 into nl_scales) or IQ4_XS (xs: a record per 256 into
// xs_records) of one row (K a multiple of 32, or 256 for xs): codes into q; false if w holds NaN
// or infinity.
bool quantize_iq4_row(const float* w, int K, bool xs, int8_t* q, uint16_t* nl_scales, uint8_t* xs_records);

}  // namespace kt
