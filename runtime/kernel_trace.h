// --kernel-trace PREFIX: every kernel the GPU ran during --benchmark's timed steps, as the step ran
// it (not alone, as Nsight Compute times kernels), from CUPTI's activity records. Writes
// PREFIX.json (Chrome trace format: open it in Perfetto or chrome://tracing; one row per stream)
// and PREFIX.csv (one kernel per line), and logs per step: kernels, their summed time, the time at
// least one kernel ran (busy), and the idle time between the step's first kernel and its last.
//
// Nsight Systems answers the same question where it runs; on machines without it this needs only
// libcupti, which ships with the CUDA toolkit and is loaded at run time (dlopen), so that the
// trainer does not depend on it unless the flag is given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

struct TracedKernel {
  std::string name;
  int64_t step = 0;     // the timed step during which it finished (0-based; assign_steps)
  uint32_t stream = 0;  // CUDA stream id
  uint64_t start_ns = 0, end_ns = 0;
};

class KernelTrace {
 public:
  virtual ~KernelTrace() = default;
  // Starts recording.
  virtual void begin() = 0;
  // After timed step `step` synchronized: the kernels finished by now belong to it.
  virtual void end_step(int64_t step) = 0;
  // Stops recording; the kernels that finished during the timed steps, tagged by assign_steps, in
  // no particular order.
  virtual std::vector<TracedKernel> finish() = 0;
};

// CUPTI's activity API on the current CUDA device. Throws UsageError naming the reason where that
// is not possible (a build without CUDA, libcupti not found, CUPTI refusing).
std::unique_ptr<KernelTrace> make_kernel_trace();

// A kernel's name as logs show it: demangled, without anonymous namespaces, its return type and
// its parameter list ("trainer::cuda::rope_kernel<__nv_bfloat16, 8, 4>"); names that are not
// mangled (cuBLASLt's) as they are.
std::string kernel_display_name(const std::string& mangled);

// Tags each kernel with the step during which it ended: step s ends at ends_ns[s] (the clock of
// the kernels' timestamps, read after the step's events completed), so the update running beside
// the next forward belongs to the next step, as the step timer counts it. Drops the kernels that
// ended after the last step, and those without timestamps (CUPTI hands out kernels still running
// at a flush with zeros).
void assign_steps(std::vector<TracedKernel>& kernels, const std::vector<uint64_t>& ends_ns);

struct StepTrace {
  int64_t kernels = 0;
  double kernel_ms = 0;  // sum of the kernels' durations (overlapping kernels count twice)
  double busy_ms = 0;    // time at least one kernel ran
  double span_ms = 0;    // first kernel's start to last kernel's end
  double idle_ms() const { return span_ms - busy_ms; }
};

// Per step, in step order (steps without kernels included, all zero).
std::vector<StepTrace> summarize_steps(const std::vector<TracedKernel>& kernels, int64_t steps);

struct KernelTotal {
  std::string name;
  int64_t count = 0;
  double ms = 0;
};
// Kernels grouped by name over all steps, the largest total first.
std::vector<KernelTotal> totals_by_name(const std::vector<TracedKernel>& kernels);

struct IdleGap {
  double ms = 0;       // no kernel ran on any stream for this long
  std::string before;  // the kernel that ended last before the gap
  std::string after;   // the kernel that started the next run of kernels
};
// The `count` longest idle gaps of one step (between its first kernel's start and its last
// kernel's end), longest first.
std::vector<IdleGap> longest_gaps(const std::vector<TracedKernel>& kernels, int64_t step,
                                  size_t count);

// PREFIX.json and PREFIX.csv (above); times relative to the first kernel's start.
void write_kernel_trace(const std::string& prefix, const std::vector<TracedKernel>& kernels);

}  // namespace trainer
