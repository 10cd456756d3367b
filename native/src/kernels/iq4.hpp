// iq4nl and iq4xs (GGUF's IQ4_NL and IQ4_XS, kernels/types.hpp): quantizing float rows to them for
// load_weights (iq4xs's records go in with kernels/q6k.hpp's put_signed_records).
#pragma once

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {

// IQ4_NL (xs false: a float16 scale per 32 into nl_scales) or IQ4_XS (xs: a record per 256 into
// xs_records) of one row (K a multiple of 32, or 256 for xs): codes into q; false if w holds NaN
// or infinity.
bool quantize_iq4_row(const float* w, int K, bool xs, int8_t* q, uint16_t* nl_scales, uint8_t* xs_records);

}  // namespace kt
