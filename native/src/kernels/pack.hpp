// Packing weights and converting activations into the layouts of kernels/types.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/types.hpp"
#include "runtime/thread_pool.hpp"

namespace kt {

enum class DType { f32, bf16 };

// Packs a weight matrix given as one pointer per output row (K values of dtype each;
// nullptr: a zero row). Rows can come from different tensors: gate and up are packed
// as one matrix whose 16-column blocks alternate gate, up, gate, up, ...
void pack_rows(PackedMatrix& out, Element method, int group, const std::vector<const void*>& rows, DType dtype, int K);

// The weight quantization, defined once: symmetric, per row (int8) or per group of `group`
// values (int8g, int4). int8: scale = max|w| / 127, q in [-127, 127]. int8g: the same per
// group (llama.cpp's Q8_0 at group 32), the scale rounded to bf16. int4: scale = -m / 8 for
// the group's first w of the largest magnitude m, rounded to bf16, q in [-8, 7] (m's own code
// is -8). Scale 1 for all zeros; q = round-to-even of w * (1 / scale), clamped. K must be a
// multiple of the group for grouped elements. Writes K values to q and one scale (int8) or
// K / group scales (each exact in bf16); false if w holds NaN or inf. fp4 (MXFP4): q an E2M1
// code in [0, 15], the nearest to w / scale (ties to even), and per group the scale 2^s, the
// least power of two (an E8M0 value) with max|w| / 2^s <= 6.
bool quantize_weight_row(Element method, int group, const float* w, int K, int8_t* q, float* scales);

// A row of K FP8 E4M3 codes (the "fn" variant: no infinities, 0x7F/0xFF are NaN), decoded
// exactly and multiplied by its block scale (one per bk values) into out; false if a code is NaN.
bool decode_fp8_row(const uint8_t* codes, int64_t K, const float* block_scales, int64_t bk, float* out);

// One already-quantized weight row in the portable layout of `kt convert` (values nullptr:
// a zero row). int8: K int8 values and one scale. int8g: K int8 values and one bf16 scale per
// group of round_up(K, group) (as its bits). int4: round_up(K, group) / 2 bytes, two values
// per byte (even k in the low nibble), each stored as q + 8 with q in [-8, 7], and one bf16
// scale per group. fp4: int4's bytes holding E2M1 codes, and one E8M0 code (uint8) per group.
// int4z: int4's bytes holding unsigned codes q in [0, 15], a float32 scale and a uint8 zero point
// per group: w = (q - zero) * scale. nvfp4: fp4's bytes, a UE4M3 code per 16 values and the
// tensor's float32 scale.
struct QuantizedRow {
  const void* values = nullptr;
  const void* scales = nullptr;  // int8: a float; int8g, int4: uint16_t bf16 bits; fp4: uint8 E8M0; nvfp4: uint8
                                 // UE4M3; int4z: floats
  const void* zeros = nullptr;   // int4z: uint8 zero points, one a group
  const float* global_scale = nullptr;  // nvfp4: the tensor's scale (w = code * group scale * it)
};

// NVFP4 of one row of K values (K a multiple of 16), ModelOpt's way with the row as its tensor:
// the global scale max|w| / (6 * 448), per 16 values a UE4M3 scale code, E2M1 codes (fp4's) in q.
// False if the row holds NaN or infinity.
bool quantize_nvfp4_row(const float* w, int K, int8_t* q, uint8_t* scale_codes, float* global);

// Packs quantized rows into the same layout pack_rows produces from the float weights they
// were quantized from (so both give identical results).
void pack_quantized_rows(PackedMatrix& out, Element method, int group, const std::vector<QuantizedRow>& rows, int K);

// Converts rows of x (row-major, ld elements apart) for a method, with the backend's row
// operations. Throws std::invalid_argument naming the first row holding NaN or infinity.
void prepare_activations(const KernelTable& ops, Activations& act, Element method, int group, int Kp, const void* x,
                         DType dtype, int64_t rows, int K, int64_t ld, ThreadPool* pool, const char* what,
                         bool token_scales = false);

}  // namespace kt
