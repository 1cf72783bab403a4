// Parameter initialisation of SPEC.md, deterministic and independent of thread count.
#pragma once

#include <cstdint>

#include "model/layout.h"

namespace trainer {

// Fills the flat buffer `flat` (L.total() elements) with fresh parameters:
//   Linear (d_out, d_in) weights: truncated normal, std sqrt(2 / (d_in + d_out)), cut at +-3 std;
//   token_embeddings: truncated normal, std 1, cut at +-3;  RMSNorm gains: 1;  padding: 0.
// Element e of the tensor with SPEC.md index t (its position in ParamLayout::spec_order()) is a
// pure function of (seed, t, e): a counter-based hash feeds Box-Muller, and a draw beyond 3 std
// is rejected and redrawn with the next counter. The result therefore depends neither on the
// number of threads nor on how the layout orders tensors in memory.
void init_params(const ParamLayout& L, uint64_t seed, float* flat);

// One standard-normal sample truncated to [-3, 3] for (seed, stream, index); exposed for tests.
double truncated_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace trainer
