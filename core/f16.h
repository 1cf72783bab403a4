// IEEE binary16 (fp16) as 16-bit patterns on the host and the device: the conversions the CPU
// optimizer uses, written to round exactly as the hardware conversion (cvt.rn.f16.f32) does, so
// that host and device results can be compared bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/bf16.h"  // TRAINER_HD

namespace trainer {

// fp32 -> fp16 bits, round to nearest even, subnormals included; values that round beyond 65504
// become inf, and any NaN becomes the canonical quiet NaN 0x7FFF, as on the device.
TRAINER_HD inline uint16_t f32_to_f16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;
  // 65520 = 0x477FF000 is the tie between 65504 (odd significand) and 65536: it rounds up.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // at least 2^-14: a normal fp16; rebias the exponent (127 -> 15)
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);  // a carry into the exponent is the correct rounding
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal fp16: the significand (with its implicit bit) in units of 2^-24. Below 2^-25
  // everything rounds to zero (f32 subnormals included).
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);
  const uint32_t shift = 126 - e;  // 14 .. 24
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (m & 1u))) ++m;  // 0x400 is 2^-14, the smallest normal
  return static_cast<uint16_t>(sign | m);
}

// fp16 bits -> fp32 (exact).
TRAINER_HD inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else {
    // Subnormal or zero: man * 2^-24, exact in fp32.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace trainer
