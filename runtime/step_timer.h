// Per-rank step timing: data, forward, backward, exposed communication, optimizer, whole step.
//
// On the CPU the phases are host-clock intervals; on CUDA they are CUDA events recorded on the
// compute stream, read once per step after the step's work has finished, so timing never adds a
// synchronisation inside the step. A phase entered several times in one step (micro-steps of
// gradient accumulation) sums its intervals.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"

namespace trainer {

enum class Phase { kData, kForward, kBackward, kComm, kOptimizer, kStep };
constexpr int kNumPhases = 6;
const char* phase_name(Phase p);
// Milliseconds per phase, plus two more slots: the total time collectives ran on the comm stream
// (hidden or not; measured on GPUs), so exposed and total communication can be compared; and the
// time updates ran beside forward (--overlap-update), whose exposed part the optimizer phase is.
constexpr int kCommTotal = kNumPhases;
constexpr int kOptimizerTotal = kNumPhases + 1;
using PhaseTimes = std::array<double, kNumPhases + 2>;
const char* time_slot_name(int slot);  // phase names, then "comm_total", "optimizer_total"

// One interval of the last collected step, in milliseconds since the timer's origin.
struct PhaseInterval {
  Phase phase;
  double start_ms, end_ms;
};

class StepTimer {
 public:
  virtual ~StepTimer() = default;
  virtual void begin(Phase p) = 0;
  virtual void end(Phase p) = 0;
  // end(from) and begin(to) at one instant (the CUDA timer records one event for both).
  virtual void switch_phase(Phase from, Phase to) {
    end(from);
    begin(to);
  }
  // Ends the step: waits for its recorded intervals and returns their sums in milliseconds.
  virtual PhaseTimes collect() = 0;
  // The intervals of the step last collected (for --trace).
  virtual const std::vector<PhaseInterval>& intervals() const = 0;
  // The CUDA event times are measured from (nullptr on the CPU).
  virtual void* origin_event() { return nullptr; }
  // CUDA graphs: phases entered between begin_capture() and end_capture() are recorded into the
  // step's graph (their events fire when it runs), and replayed() adds them to the step, once per
  // replay. The host timer never records.
  virtual void begin_capture() {}
  virtual void end_capture() {}
  virtual void replayed() {}
};

// Host clocks (CPU backend); the data phase always uses host clocks, since it is host work.
std::unique_ptr<StepTimer> make_host_timer();
// CUDA events on `stream` (a cudaStream_t); throws in a build without CUDA.
std::unique_ptr<StepTimer> make_cuda_timer(void* stream);
std::unique_ptr<StepTimer> make_step_timer(DeviceKind device, void* stream);

// RAII phase.
class PhaseScope {
 public:
  PhaseScope(StepTimer& t, Phase p) : t_(t), p_(p) { t_.begin(p_); }
  ~PhaseScope() { t_.end(p_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  StepTimer& t_;
  Phase p_;
};

// Mean and standard deviation of a sample.
struct MeanStd {
  double mean = 0, std = 0;
};
MeanStd mean_std(const std::vector<double>& xs);
double median(std::vector<double> xs);

}  // namespace trainer
