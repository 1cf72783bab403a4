// The GPU's SM clock and power while --benchmark's timed steps run, from NVML (the driver's
// management library, loaded at run time with dlopen, so that the trainer runs where it is absent).
//
// An H100 or H200 reaches its power limit within a second of a training load and then lowers its
// SM clock: the steps of a short benchmark window see the onset, those of a long run the cap
// itself, and two programs held at the same cap run at the clocks their work per microsecond
// allows. The summary says which state a run's steps saw.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

struct PowerSample {
  double sm_mhz = 0;
  double watts = 0;           // board power: NVML's instantaneous reading, or its 1 s average
  bool power_capped = false;  // the software power cap is lowering the clocks
};

struct PowerSummary {
  int64_t samples = 0;
  double sm_mhz_median = 0, sm_mhz_min = 0, sm_mhz_max = 0;
  double watts_mean = 0;       // the mean, so that power x time is the window's energy
  double limit_watts = 0;      // the enforced power limit (0: unknown)
  double capped_fraction = 0;  // of the samples, those with the power cap lowering the clocks
  // Whether the watts are NVML's instantaneous readings (NVML_FI_DEV_POWER_INSTANT) or, where the
  // driver does not offer them, its power usage: an average over about the last second, which
  // trails the load through a window of a few tenths of a second.
  bool instant_watts = false;
};

// The clock's median and range, the power's mean, over the samples (0 samples: an empty summary
// with the limit).
PowerSummary summarize_power(const std::vector<PowerSample>& samples, double limit_watts);

class PowerSampler {
 public:
  virtual ~PowerSampler() = default;
  // Starts sampling on a thread of its own (earlier samples are dropped).
  virtual void begin() = 0;
  // Stops sampling; the summary of the samples since begin().
  virtual PowerSummary end() = 0;
  // NVML's power reading now (its average over about the last second), W; 0 when unread.
  virtual double watts_now() = 0;
  // The enforced power limit, W (0: unknown).
  virtual double limit_watts() const = 0;
  // NVML's energy counter (joules since the driver loaded; 0 when unread). It moves in coarse
  // steps: difference it over windows of a second or more.
  virtual double energy_joules() = 0;
};

// NVML on the GPU with this PCI bus id (as cudaDeviceGetPCIBusId writes it), every `period_ms`.
// Null, with the reason in *why, where NVML or the GPU cannot be opened.
std::unique_ptr<PowerSampler> make_power_sampler(const std::string& pci_bus_id, int period_ms,
                                                 std::string* why);

// How long a window of timed steps must be to give the step as training held at the power limit
// runs it. The limiter holds the board's power to the limit as an average over about a second:
// the first second of a power-bound load runs above the limit, the next few swing around it, half
// a second above and half below, and the chip warms for longer. On H200s (three leases,
// 2026-11-27) small 16 x 1024's 20 steps after 5 drew 729-777 W and ran 2.9-3.4% faster than 300
// steps (8 s) at 689-696 W; 20 steps after 2 s of warm-up 0.8-1.5% faster, 3 s after 1 s 0.8-1.1%
// (an H100: 2.9-3.0% and 0.7%).
constexpr double kPowerHoldSeconds = 8.0;
// For a window `window_s` long with the GPU power-bound (the cap on in at least half of the
// samples, or the mean power at 97% of the limit or more), shorter than kPowerHoldSeconds: the
// steps of `step_ms` that cover that time. 0 where the window is long enough, not power-bound or
// its power unknown.
int64_t sustained_steps(const PowerSummary& s, double window_s, double step_ms);

// One line for the benchmark's report: "SM clock 1605 MHz (1410-1980), 692 W of 700 W, power cap
// in 87% of 520 samples" (median clock and its range, mean power).
std::string describe_power(const PowerSummary& s);

}  // namespace trainer
