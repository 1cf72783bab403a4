// Timing and pricing in joules of work queued on a CUDA stream: the floors' measurements
// (runtime/floors.cpp) and the developer probes share them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "runtime/gpu_power.h"

namespace trainer {

// Mean ms of `reps` calls of `run` on `s` after `warm` untimed ones.
template <class F>
double time_ms(cudaStream_t s, int warm, int reps, F&& run) {
  for (int i = 0; i < warm; ++i) run();
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) run();
  CUDA_CHECK(cudaEventRecord(b, s));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

// One call's time and the power it ran at.
struct CallEnergy {
  double ms = 0;     // per call
  double watts = 0;  // NVML's reading after the window
  int calls = 0;     // of `run` in all, the ones that sized the window included
  double joules() const { return watts * ms * 1e-3; }
};

// `run` back to back for `window_ms` on `s`: its time per call and NVML's power reading right after
// (its average over the last second: this work's alone, for windows longer than that).
template <class F>
CallEnergy energy_per_call(cudaStream_t s, PowerSampler& power, double window_ms, F&& run) {
  constexpr int kWarm = 1, kProbe = 3;
  const double probe_ms = std::max(time_ms(s, kWarm, kProbe, run), 1e-3);
  const int calls = static_cast<int>(std::clamp(std::ceil(window_ms / probe_ms), 3.0, 1e6));
  CallEnergy e;
  e.ms = time_ms(s, 0, calls, run);
  e.watts = power.watts_now();
  e.calls = kWarm + kProbe + calls;
  return e;
}

}  // namespace trainer
