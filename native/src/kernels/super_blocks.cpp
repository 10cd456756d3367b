#include "kernels/super_blocks.hpp"

#include <vector>

#include "kernels/q4k.hpp"
#include "kernels/q6k.hpp"

namespace kt {
namespace {

std::size_t record_bytes(Element m) {
  return q4k_records(m) ? kQ4kRowRecordBytes : m == Element::q2k ? kQ2kRowRecordBytes : kQ6kRowRecordBytes;
}

void put_codes_and_records(PackedMatrix& out, int n, const int8_t* q, const uint8_t* records) {
  const auto* codes = reinterpret_cast<const uint8_t*>(q);
  switch (out.element) {
    case Element::q6k: return put_q6k_row(out, n, codes, records);
    case Element::q3k: return put_q3k_row(out, n, codes, records);
    case Element::q2k: return put_q2k_row(out, n, codes, records);
    case Element::q5k: return put_q4k_meta(out, n, records), put_q5k_codes(out, n, q);
    default: return put_q4k_meta(out, n, records), put_nibbles(out, n, q, 0);  // q4k
  }
}

}  // namespace

bool pack_super_block_floats(PackedMatrix& out, int n, const float* row) {
  std::vector<int8_t> q(out.Kp);
  std::vector<uint8_t> records(static_cast<std::size_t>(out.Kp / kQ4kSuperBlock) * record_bytes(out.element));
  auto* codes = reinterpret_cast<uint8_t*>(q.data());
  const bool finite = out.element == Element::q6k   ? quantize_q6k_row(row, out.Kp, codes, records.data())
                      : out.element == Element::q3k ? quantize_q6k_row(row, out.Kp, codes, records.data(), 3, kQ3kOffset, 31)
                      : out.element == Element::q2k ? quantize_q2k_row(row, out.Kp, q.data(), records.data())
                                                    : quantize_q4k_row(row, out.Kp, q.data(), records.data(),
                                                                       out.element == Element::q5k ? 31 : 15);
  put_codes_and_records(out, n, q.data(), records.data());
  return finite;
}

void put_super_block_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* records) {
  std::vector<int8_t> q(out.Kp);
  for (int k = 0; k < out.Kp; ++k)  // q4k's two a byte (byte j: k = 2j low, 2j + 1 high)
    q[k] = static_cast<int8_t>(out.element == Element::q4k ? (codes[k / 2] >> (4 * (k % 2))) & 0x0F : codes[k]);
  put_codes_and_records(out, n, q.data(), records);
}

}  // namespace kt
