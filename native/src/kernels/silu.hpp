// The constants of the SIMD backends' silu: exp(-g) from a degree-6 polynomial on
// [-ln2/2, ln2/2] after range reduction with ln2 split in two (Cody-Waite), inputs clamped
// where exp overflows. One place, so the AVX2 and AVX-512 versions cannot drift apart.
#pragma once

namespace kt::silu_poly {

constexpr float kLog2e = 1.44269504f;
constexpr float kLn2Hi = 0.693359375f;     // ln 2, high part (exact in a few bits)
constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
constexpr float kC2 = 1.f / 2, kC3 = 1.f / 6, kC4 = 1.f / 24, kC5 = 1.f / 120, kC6 = 1.f / 720;
constexpr float kMinArg = -87.f, kMaxArg = 88.f;  // exp stays finite and normal in between

}  // namespace kt::silu_poly
