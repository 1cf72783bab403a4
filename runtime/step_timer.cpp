#include "runtime/step_timer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace trainer {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kData:
      return "data";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kComm:
      return "comm";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kStep:
      return "step";
  }
  return "?";
}

const char* time_slot_name(int slot) {
  if (slot == kCommTotal) return "comm_total";
  if (slot == kOptimizerTotal) return "optimizer_total";
  return phase_name(static_cast<Phase>(slot));
}

namespace {

class HostTimer : public StepTimer {
 public:
  void begin(Phase p) override { start_[idx(p)] = ms_since_origin(); }
  void end(Phase p) override {
    const double now = ms_since_origin();
    sums_[idx(p)] += now - start_[idx(p)];
    pending_.push_back({p, start_[idx(p)], now});
  }
  PhaseTimes collect() override {
    PhaseTimes t = sums_;
    sums_.fill(0);
    last_.swap(pending_);
    pending_.clear();
    return t;
  }
  const std::vector<PhaseInterval>& intervals() const override { return last_; }

 private:
  using Clock = std::chrono::steady_clock;
  static int idx(Phase p) { return static_cast<int>(p); }
  double ms_since_origin() const {
    return std::chrono::duration<double, std::milli>(Clock::now() - origin_).count();
  }
  Clock::time_point origin_ = Clock::now();
  std::array<double, kNumPhases> start_{};
  PhaseTimes sums_{};
  std::vector<PhaseInterval> pending_, last_;
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
