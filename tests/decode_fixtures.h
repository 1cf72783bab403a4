// Models and token sequences for the decoding tests (CPU and GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/init.h"
#include "model/layout.h"

namespace trainer::test {

// Initialised weights spread by `scale` (norm gains left at 1), so the logits are far from
// uniform; q and k by `qk_scale`: spread as much, attention turns nearly one-hot and bf16's
// rounding of the scores decides between near-ties.
inline std::vector<float> spread_params(const ParamLayout& L, uint64_t seed, float scale,
                                        float qk_scale) {
  std::vector<float> p(L.total());
  init_params(L, seed, p.data());
  for (const ParamTensor& t : L.tensors()) {
    if (t.name.find("ln") != std::string::npos) continue;
    const bool qk =
        t.name.find("q_proj") != std::string::npos || t.name.find("k_proj") != std::string::npos;
    for (int64_t i = 0; i < t.numel; ++i) p[t.offset + i] *= qk ? qk_scale : scale;
  }
  return p;
}

// n token ids in [0, vocab), a different sequence per salt.
inline std::vector<int32_t> token_ids(int64_t n, int64_t vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 131 + salt * 17 + 3) % vocab);
  return t;
}

}  // namespace trainer::test
