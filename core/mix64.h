// splitmix64's finaliser: a bijection on 64 bits with full avalanche, the one source of
// counter-based randomness (initialisation, data sampling, token sampling): hashing a counter
// gives the same bits on every platform and thread count, unlike the standard distributions.
#pragma once

#include <cstdint>

namespace trainer {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio

// constexpr: device code calls it too (the CUDA build passes --expt-relaxed-constexpr).
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace trainer
