// bf16 as 16-bit patterns on the host and the device: the conversions every backend, the CPU
// optimizer and MPI's bf16 sums share, so all round the same way.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TRAINER_HD __host__ __device__
#else
#define TRAINER_HD
#endif

namespace trainer {

// fp32 -> bf16 bits, round to nearest even (overflow goes to inf); any NaN becomes the canonical
// quiet NaN 0x7FFF, which is what the hardware conversion (cvt.rn.bf16.f32) produces.
TRAINER_HD inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// bf16 bits -> fp32 (exact).
TRAINER_HD inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace trainer
