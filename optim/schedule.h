// The learning-rate schedule (linear warmup, then cosine decay to min_lr) and the gradient-clipping
// scale, both exactly as SPEC.md defines them. Host-only arithmetic in double.
#pragma once

#include <cstdint>

namespace trainer {

// lr(s) for the update of step s = 0 .. steps-1 (W = warmup, S = steps):
//   s < W:  lr * (s + 1) / W
//   else:   min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * (s - W) / max(1, S - W)))
// With warmup = 0 and min_lr = lr the rate is constant.
struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 0, steps = 1;

  // The rate of step s; s must lie in [0, steps). Validates the fields first (see validate()).
  double at(int64_t s) const;
  // Throws UsageError naming the flag (--lr, --min-lr, --warmup, --steps) of a field that is out
  // of range: rates must be finite and >= 0, warmup >= 0, steps >= 1.
  void validate() const;
};

// The factor every gradient is multiplied by before the optimizer step:
//   clip == 0 (off): 1;  else min(1, clip / (global_norm + 1e-6)).
// A NaN norm gives a NaN scale (as torch's clamp does), so a broken gradient is not hidden.
// Throws UsageError when clip is negative or not finite (--clip).
float clip_scale(double global_norm, double clip);

}  // namespace trainer
