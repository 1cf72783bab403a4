#include "runtime/step_timer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace trainer {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kComm: return "comm";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kStep: return "step";
  }
  return "?";
}

namespace {

class HostTimer : public StepTimer {
 public:
  void begin(Phase p) override { start_[idx(p)] = Clock::now(); }
  void end(Phase p) override {
    sums_[idx(p)] += std::chrono::duration<double, std::milli>(Clock::now() - start_[idx(p)]).count();
  }
  PhaseTimes collect() override {
    PhaseTimes t = sums_;
    sums_.fill(0);
    return t;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static int idx(Phase p) { return static_cast<int>(p); }
  std::array<Clock::time_point, kNumPhases> start_{};
  PhaseTimes sums_{};
};

}  // namespace

std::unique_ptr<StepTimer> make_host_timer() { return std::make_unique<HostTimer>(); }

std::unique_ptr<StepTimer> make_step_timer(DeviceKind device, void* stream) {
  if (device == DeviceKind::kCuda) return make_cuda_timer(stream);
  return make_host_timer();
}

#ifndef TRAINER_WITH_CUDA
std::unique_ptr<StepTimer> make_cuda_timer(void*) {
  runtime_error("CUDA step timer in a build without CUDA");
}
#endif

MeanStd mean_std(const std::vector<double>& xs) {
  MeanStd r;
  if (xs.empty()) return r;
  for (double x : xs) r.mean += x;
  r.mean /= static_cast<double>(xs.size());
  for (double x : xs) r.std += (x - r.mean) * (x - r.mean);
  r.std = xs.size() > 1 ? std::sqrt(r.std / static_cast<double>(xs.size() - 1)) : 0.0;
  return r;
}

double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

}  // namespace trainer
