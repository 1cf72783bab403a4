// The grouping behind the deterministic embedding backward: token positions grouped by token id,
// built on the host while the GPU runs the forward.
#pragma once

#include <cstdint>
#include <vector>

namespace trainer {

// Groups the n ids (each >= 0) by value, a counting sort in O(n + largest id): group g holds token
// ids_out[g] at positions positions_out[start_out[g] .. start_out[g+1]) in ascending order, and
// the groups come in ascending id order. ids_out and positions_out hold n entries, start_out
// n + 1; `scratch` is reused between calls so that no step allocates. Returns the number of groups.
int64_t build_embedding_buckets(const int32_t* ids, int64_t n, std::vector<int32_t>& scratch,
                                int32_t* ids_out, int32_t* start_out, int32_t* positions_out);

}  // namespace trainer
