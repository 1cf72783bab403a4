#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "optim/cuda/adamw.cuh"

namespace trainer {

void LrSchedule::validate() const {
  if (!std::isfinite(lr) || lr < 0) usage_error("--lr must be a finite number >= 0, got {}", lr);
  if (!std::isfinite(min_lr) || min_lr < 0)
    usage_error("--min-lr must be a finite number >= 0, got {}", min_lr);
  if (warmup < 0) usage_error("--warmup must be >= 0, got {}", warmup);
  if (steps < 1) usage_error("--steps must be >= 1, got {}", steps);
}

double LrSchedule::at(int64_t s) const {
  validate();
  TRAINER_CHECK(s >= 0 && s < steps, "learning rate asked for step {} of a {}-step schedule", s,
                steps);
  if (s < warmup) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(steps - warmup > 1 ? steps - warmup : 1);
  const double progress = static_cast<double>(s - warmup) / span;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

float clip_scale(double global_norm, double clip) {
  if (!std::isfinite(clip) || clip < 0)
    usage_error("--clip must be a finite number >= 0 (0 = off), got {}", clip);
  return clip_factor(global_norm, clip);
}

}  // namespace trainer
