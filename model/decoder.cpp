#include "model/decoder.h"

#include "core/error.h"

namespace trainer {

void check_feed(const ModelConfig& c, int64_t position, const int32_t* ids, int64_t count) {
  TRAINER_CHECK(ids != nullptr && count >= 1, "feed needs at least one token");
  if (position + count > c.ctx)
    usage_error(
        "the sequence would reach {} tokens, past the model's context of {} (positions beyond "
        "ctx were never trained)",
        position + count, c.ctx);
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab)
      usage_error("token id {} is outside the model's vocabulary 0..{}", ids[i], c.vocab - 1);
}

}  // namespace trainer
