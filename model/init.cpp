#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/mix64.h"

namespace trainer {
namespace {

// 64 random bits for (seed, stream, index, draw); each argument goes through its own mixing round
// so nearby counters give unrelated outputs.
uint64_t hash_bits(uint64_t seed, uint64_t stream, uint64_t index, uint64_t draw) {
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h ^ (stream + kGolden));
  h = mix64(h ^ (index + kGolden));
  return mix64(h ^ (draw + kGolden));
}

// Uniform in (0, 1] (never 0, so log() is finite) from the top 53 bits.
double uniform_open0(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1p-53; }

}  // namespace

double truncated_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  // Box-Muller, cosine branch only, so each element is one independent draw. About 0.27% of draws
  // fall beyond 3 std and are redrawn with the next pair of counters.
  for (uint64_t draw = 0;; draw += 2) {
    const double u1 = uniform_open0(hash_bits(seed, stream, index, draw));
    const double u2 = uniform_open0(hash_bits(seed, stream, index, draw + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    if (std::abs(z) <= 3.0) return z;
  }
}

void init_params(const ParamLayout& L, uint64_t seed, float* flat) {
  TRAINER_CHECK(flat != nullptr, "init_params: null buffer");
  std::fill_n(flat, L.total(), 0.0f);  // padding stays 0
  const auto spec = L.spec_order();
  for (size_t t = 0; t < spec.size(); ++t) {
    const ParamTensor& p = *spec[t];
    float* dst = flat + p.offset;
    if (p.shape.size() == 1) {  // RMSNorm gain
      std::fill_n(dst, p.numel, 1.0f);
      continue;
    }
    TRAINER_CHECK(p.shape.size() == 2, "tensor {} has {} dims", p.name, p.shape.size());
    const bool embedding = p.name == "token_embeddings.weight";
    const double std =
        embedding ? 1.0 : std::sqrt(2.0 / static_cast<double>(p.shape[0] + p.shape[1]));
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < p.numel; ++e)
      dst[e] = static_cast<float>(std * truncated_normal(seed, t, static_cast<uint64_t>(e)));
  }
}

}  // namespace trainer
