#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace trainer {

LossScaleConfig parse_loss_scale(const std::string& spec, int64_t window, bool fp16) {
  if (window < 1) usage_error("--loss-scale-window must be >= 1 (got {})", window);
  LossScaleConfig c;
  c.window = window;
  if (spec == "none" || (spec == "auto" && !fp16)) return c;
  c.enabled = true;
  if (spec == "dynamic" || spec == "auto") {
    c.dynamic = true;
    return c;
  }
  char* end = nullptr;
  const double v = std::strtod(spec.c_str(), &end);
  if (spec.empty() || *end != '\0' || !std::isfinite(v) || v <= 0)
    usage_error("--loss-scale must be auto, none, dynamic or a finite number > 0 (got '{}')", spec);
  c.initial = v;
  return c;
}

LossScaler::LossScaler(const LossScaleConfig& c) : c_(c), scale_(c.enabled ? c.initial : 1.0) {}

bool LossScaler::update(bool finite) {
  if (!c_.enabled) return false;
  if (finite) {
    if (c_.dynamic && ++good_ == c_.window) {
      scale_ *= 2;
      good_ = 0;
    } else if (!c_.dynamic) {
      ++good_;
    }
    return false;
  }
  good_ = 0;
  if (c_.dynamic) {
    scale_ *= 0.5;
    if (scale_ < std::ldexp(1.0, -64))
      runtime_error(
          "the gradient is not finite at any loss scale (now {:g}): the model diverged; lower "
          "--lr or check the data",
          scale_);
  }
  return true;
}

void LossScaler::restore(double scale, int64_t good_steps) {
  if (!c_.dynamic) return;
  TRAINER_CHECK(std::isfinite(scale) && scale > 0 && good_steps >= 0,
                "loss scale {} after {} clean steps", scale, good_steps);
  scale_ = scale;
  good_ = std::min(good_steps, c_.window - 1);  // a smaller window than the saved run's
}

}  // namespace trainer
