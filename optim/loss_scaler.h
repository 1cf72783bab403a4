// Loss scaling for gradients in low precision, with the rule of PyTorch's GradScaler.
//
// Backward runs on loss * S, so that small gradients survive fp16's narrow range; the optimizer
// divides by S again (as part of its gradient multiplier, so the gradients are not read an extra
// time). A step whose gradient holds an inf or NaN is skipped: no parameter, moment or step count
// changes. Dynamic scaling (--loss-scale dynamic, what "auto" means with --precision fp16) starts
// at S = 2^16, halves S on such a step and doubles it after `window` consecutive clean steps
// (--loss-scale-window, default 2000); a fixed scale (--loss-scale 1024) never changes, but still
// skips non-finite steps. Powers of two scale exactly: with finite gradients a scaled run computes
// the same updates as an unscaled one.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct LossScaleConfig {
  bool enabled = false;  // false: S = 1 and gradients are not checked
  bool dynamic = false;
  double initial = 65536.0;
  int64_t window = 2000;
};

// "auto", "none", "dynamic" or a fixed scale (a finite number > 0); window >= 1. UsageError
// naming the flag otherwise. "auto" is dynamic when the backward runs in fp16 (`fp16`), whose
// small gradients underflow unscaled, and none otherwise (bf16 has fp32's range).
LossScaleConfig parse_loss_scale(const std::string& spec, int64_t window, bool fp16 = false);

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& c = {});

  bool enabled() const { return c_.enabled; }
  bool dynamic() const { return c_.dynamic; }
  // The factor backward multiplies the loss by (1 when disabled).
  double scale() const { return scale_; }
  // Clean steps since the last change of the scale (dynamic) or the start.
  int64_t good_steps() const { return good_; }

  // After the step's gradients were checked (every rank passes the same `finite`): counts a clean
  // step, or halves the scale (dynamic). Returns true when the step's update must be skipped.
  // Throws RuntimeError when the dynamic scale has fallen below 2^-64: gradients that are not
  // finite at any scale mean the model diverged.
  bool update(bool finite);

  // Continues from a checkpoint's scale and count (dynamic scaling only; otherwise ignored). A
  // count past this run's window is cut to window - 1: the next clean step doubles the scale.
  void restore(double scale, int64_t good_steps);

 private:
  LossScaleConfig c_;
  double scale_;
  int64_t good_ = 0;
};

}  // namespace trainer
