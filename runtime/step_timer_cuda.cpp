// CUDA-event implementation of StepTimer: events are recorded on the compute stream at phase
// boundaries and read in collect(), after the step's last event has completed.
#include <cuda_runtime.h>

#include <chrono>
#include <vector>

#include "core/cuda_check.h"
#include "runtime/step_timer.h"

namespace trainer {
namespace {

class CudaTimer : public StepTimer {
 public:
  explicit CudaTimer(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    CUDA_CHECK(cudaEventCreate(&origin_));
    CUDA_CHECK(cudaEventRecord(origin_, stream_));
  }
  ~CudaTimer() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    cudaEventDestroy(origin_);
  }
  void* origin_event() override { return origin_; }
  const std::vector<PhaseInterval>& intervals() const override { return last_; }
  void begin(Phase p) override {
    if (p == Phase::kData) return host_.begin(p);
    open_[static_cast<int>(p)] = record();
  }
  void end(Phase p) override {
    if (p == Phase::kData) return host_.end(p);
    intervals_.push_back({static_cast<int>(p), open_[static_cast<int>(p)], record()});
  }
  PhaseTimes collect() override {
    PhaseTimes t = host_.collect();
    if (!intervals_.empty()) CUDA_CHECK(cudaEventSynchronize(pool_[intervals_.back().stop]));
    last_.clear();
    for (const Interval& iv : intervals_) {
      float a = 0, b = 0;
      CUDA_CHECK(cudaEventElapsedTime(&a, origin_, pool_[iv.start]));
      CUDA_CHECK(cudaEventElapsedTime(&b, origin_, pool_[iv.stop]));
      t[iv.phase] += b - a;
      last_.push_back({static_cast<Phase>(iv.phase), a, b});
    }
    intervals_.clear();
    used_ = 0;
    return t;
  }

 private:
  struct Interval {
    int phase;
    size_t start, stop;
  };
  // Events come from a pool that grows only in the first step.
  size_t record() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(pool_[used_], stream_));
    return used_++;
  }
  struct HostPart {
    std::chrono::steady_clock::time_point start;
    double sum = 0;
    void begin(Phase) { start = std::chrono::steady_clock::now(); }
    void end(Phase) {
      sum += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count();
    }
    PhaseTimes collect() {
      PhaseTimes t{};
      t[static_cast<int>(Phase::kData)] = sum;
      sum = 0;
      return t;
    }
  } host_;
  cudaStream_t stream_;
  cudaEvent_t origin_ = nullptr;
  std::vector<PhaseInterval> last_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::array<size_t, kNumPhases> open_{};
  std::vector<Interval> intervals_;
};

}  // namespace

std::unique_ptr<StepTimer> make_cuda_timer(void* stream) {
  return std::make_unique<CudaTimer>(stream);
}

}  // namespace trainer
