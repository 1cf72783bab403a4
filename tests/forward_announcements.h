// What forward must announce through ParamsNeededFn (model/replica.h), checked the same way for
// the CPU and the CUDA replica: the embedding first, one offset per block, the head last at
// offset 0, strictly decreasing; the begins of ParamLayout::forward_parts(), last first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/layout.h"
#include "tests/catch.h"

inline void check_forward_announcements(const trainer::ParamLayout& L, int64_t n_layers,
                                        const std::vector<int64_t>& offsets) {
  REQUIRE(offsets.size() == static_cast<size_t>(n_layers + 2));
  CHECK(offsets.front() == L.find("token_embeddings.weight").offset);
  CHECK(offsets.back() == 0);
  CHECK(std::adjacent_find(offsets.begin(), offsets.end(), std::less_equal<int64_t>()) ==
        offsets.end());  // strictly decreasing
  // The parts an update beside forward is split into begin where forward announces.
  std::vector<int64_t> begins;
  for (const trainer::Range& r : L.forward_parts()) begins.insert(begins.begin(), r.begin);
  CHECK(begins == offsets);
}
