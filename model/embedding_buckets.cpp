#include "model/embedding_buckets.h"

#include <algorithm>

#include "core/error.h"

namespace trainer {

int64_t build_embedding_buckets(const int32_t* ids, int64_t n, std::vector<int32_t>& scratch,
                                int32_t* ids_out, int32_t* start_out, int32_t* positions_out) {
  TRAINER_CHECK(n >= 0 && n < (int64_t{1} << 31), "build_embedding_buckets: n {}", n);
  int32_t top = -1;
  for (int64_t i = 0; i < n; ++i) {
    TRAINER_CHECK(ids[i] >= 0, "negative token id {} at position {}", ids[i], i);
    top = std::max(top, ids[i]);
  }
  // scratch[v]: first sorted slot of id v (counts, then their prefix sums).
  scratch.assign(static_cast<size_t>(top) + 2, 0);
  for (int64_t i = 0; i < n; ++i) ++scratch[static_cast<size_t>(ids[i]) + 1];
  for (size_t v = 1; v < scratch.size(); ++v) scratch[v] += scratch[v - 1];
  int64_t groups = 0;
  for (int32_t v = 0; v <= top; ++v)
    if (scratch[v + 1] > scratch[v]) {
      ids_out[groups] = v;
      start_out[groups] = scratch[v];
      ++groups;
    }
  start_out[groups] = static_cast<int32_t>(n);
  // Positions in ascending order within each group: a stable scatter (scratch[v] is v's cursor).
  for (int64_t i = 0; i < n; ++i) positions_out[scratch[ids[i]]++] = static_cast<int32_t>(i);
  return groups;
}

}  // namespace trainer
