// CUDA-event implementation of StepTimer: events are recorded on the compute stream at phase
// boundaries and read in collect(), after the step's last event has completed. Inside a CUDA
// graph's recording the events become the graph's own event nodes, from a pool of their own.
#include <cuda_runtime.h>

#include <chrono>
#include <vector>

#include "core/cuda_check.h"
#include "runtime/step_timer.h"

namespace trainer {
namespace {

// Events created on demand and handed out again after reset().
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  cudaEvent_t next() {
    if (used_ == events_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return events_[used_++];
  }
  void reset() { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

class CudaTimer : public StepTimer {
 public:
  explicit CudaTimer(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    CUDA_CHECK(cudaEventCreate(&origin_));
    CUDA_CHECK(cudaEventRecord(origin_, stream_));
  }
  ~CudaTimer() override { cudaEventDestroy(origin_); }
  void* origin_event() override { return origin_; }
  const std::vector<PhaseInterval>& intervals() const override { return last_; }
  void begin(Phase p) override {
    if (p == Phase::kData) return host_.begin(p);
    open_[static_cast<int>(p)] = record();
  }
  void end(Phase p) override {
    if (p == Phase::kData) return host_.end(p);
    close(p, record());
  }
  // One event closes `from` and opens `to`: a forward that waits for the update beside it does so
  // at every block, and each timed event recorded between two kernels widens the gap between them
  // (small 16 x 1024 on one H200: 8.1 -> 5.2 us before each block's first kernel with two events
  // instead of four).
  void switch_phase(Phase from, Phase to) override {
    if (from == Phase::kData || to == Phase::kData) return StepTimer::switch_phase(from, to);
    const cudaEvent_t e = record();
    close(from, e);
    open_[static_cast<int>(to)] = e;
  }
  void begin_capture() override {
    capturing_ = true;
    captured_.clear();
    graph_pool_.reset();  // the previous recording, if any, is no longer replayed
  }
  void end_capture() override { capturing_ = false; }
  void replayed() override {
    intervals_.insert(intervals_.end(), captured_.begin(), captured_.end());
  }
  PhaseTimes collect() override {
    PhaseTimes t = host_.collect();
    if (!intervals_.empty()) CUDA_CHECK(cudaEventSynchronize(intervals_.back().stop));
    last_.clear();
    for (const Interval& iv : intervals_) {
      float a = 0, b = 0;
      CUDA_CHECK(cudaEventElapsedTime(&a, origin_, iv.start));
      CUDA_CHECK(cudaEventElapsedTime(&b, origin_, iv.stop));
      t[iv.phase] += b - a;
      last_.push_back({static_cast<Phase>(iv.phase), a, b});
    }
    intervals_.clear();
    pool_.reset();
    return t;
  }

 private:
  struct Interval {
    int phase;
    cudaEvent_t start, stop;
  };
  void close(Phase p, cudaEvent_t stop) {
    (capturing_ ? captured_ : intervals_)
        .push_back({static_cast<int>(p), open_[static_cast<int>(p)], stop});
  }
  // Eager events come from a pool that grows only in the first step.
  cudaEvent_t record() {
    if (capturing_) {
      // An event node of the graph: it records each time the graph runs.
      cudaEvent_t e = graph_pool_.next();
      CUDA_CHECK(cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal));
      return e;
    }
    cudaEvent_t e = pool_.next();
    CUDA_CHECK(cudaEventRecord(e, stream_));
    return e;
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
  EventPool pool_, graph_pool_;
  std::array<cudaEvent_t, kNumPhases> open_{};
  std::vector<Interval> intervals_;
  bool capturing_ = false;
  std::vector<Interval> captured_;  // the recording's intervals, in the order they run
};

}  // namespace

std::unique_ptr<StepTimer> make_cuda_timer(void* stream) {
  return std::make_unique<CudaTimer>(stream);
}

}  // namespace trainer
