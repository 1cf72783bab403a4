// runtime/gpu_power.h: the summary's arithmetic and its line on samples made up here, and the
// sampler's refusal of a GPU that does not exist. With a GPU (built with CUDA, a device visible
// and NVML loadable), the sampler also reads the real device while it spins.
#include <string>
#include <vector>

#include "core/device_buffer.h"
#include "runtime/gpu_power.h"
#include "tests/catch.h"

using trainer::PowerSample;
using trainer::PowerSummary;

TEST_CASE("summarize_power: the clock's median and range, the mean power, the capped share",
          "[power]") {
  const std::vector<PowerSample> odd = {{1605, 692, true},
                                        {1980, 120, false},
                                        {1500, 695, true},
                                        {1560, 690, true},
                                        {1700, 600, false}};
  const PowerSummary s = trainer::summarize_power(odd, 700);
  CHECK(s.samples == 5);
  CHECK(s.sm_mhz_median == 1605);
  CHECK(s.sm_mhz_min == 1500);
  CHECK(s.sm_mhz_max == 1980);
  CHECK_THAT(s.watts_mean, WithinAbs(559.4, 1e-9));  // (692 + 120 + 695 + 690 + 600) / 5
  CHECK(s.limit_watts == 700);
  CHECK_THAT(s.capped_fraction, WithinAbs(0.6, 1e-12));
  CHECK(trainer::describe_power(s) ==
        "SM clock 1605 MHz (1500-1980), 559 W of 700 W, power cap in 60% of 5 samples");

  // The clock's median of an even count is the mean of the middle two; an unknown limit is left
  // out of the line.
  const PowerSummary e = trainer::summarize_power({{1500, 600, false}, {1600, 700, true}}, 0);
  CHECK(e.sm_mhz_median == 1550);
  CHECK(e.watts_mean == 650);
  CHECK(trainer::describe_power(e) ==
        "SM clock 1550 MHz (1500-1600), 650 W, power cap in 50% of 2 samples");

  const PowerSummary none = trainer::summarize_power({}, 700);
  CHECK(none.samples == 0);
  CHECK(none.sm_mhz_median == 0);
  CHECK(none.limit_watts == 700);
  CHECK(trainer::describe_power(none) == "no samples");
}

TEST_CASE("sustained_steps: the steps that give the step held at the power limit", "[power]") {
  using trainer::sustained_steps;
  PowerSummary capped;  // small 16 x 1024's 20 steps after 5 on an H200
  capped.samples = 28;
  capped.watts_mean = 743;
  capped.limit_watts = 700;
  capped.capped_fraction = 1.0;
  // 20 steps of 26.9 ms: time 8 s of them, 298 steps.
  CHECK(sustained_steps(capped, 0.54, 26.9) == 298);
  // 112 steps (3 s) are still short; 300 (8.1 s) are not.
  CHECK(sustained_steps(capped, 3.0, 26.8) == 299);
  CHECK(sustained_steps(capped, 8.1, 27.0) == 0);
  // 2.7B: 20 steps of 93.5 ms; the cap on although the mean is under the limit.
  PowerSummary big = capped;
  big.watts_mean = 690;
  CHECK(sustained_steps(big, 1.87, 93.5) == 86);
  // Power-bound by its mean alone (the cap flag on in few samples).
  PowerSummary near = capped;
  near.capped_fraction = 0.2;
  near.watts_mean = 690;
  CHECK(sustained_steps(near, 0.5, 25.0) == 320);
  // Not power-bound: small 4 x 512 at 514 W, the cap on in a few samples.
  PowerSummary light = capped;
  light.watts_mean = 514;
  light.capped_fraction = 0.1;
  CHECK(sustained_steps(light, 0.1, 4.7) == 0);
  // Unknown power, window or step.
  CHECK(sustained_steps(PowerSummary{}, 0.5, 25.0) == 0);
  CHECK(sustained_steps(capped, 0, 25.0) == 0);
  CHECK(sustained_steps(capped, 0.5, 0) == 0);
}

TEST_CASE("make_power_sampler refuses a GPU that is not there, saying why", "[power]") {
  std::string why;
  CHECK(trainer::make_power_sampler("ffff:ff:1f.7", 20, &why) == nullptr);
  CHECK_FALSE(why.empty());  // NVML absent (no driver), or no GPU at that address
}

TEST_CASE("the sampler reads the GPU's clock and power", "[power][gpu]") {
  if (trainer::cuda_device_count() == 0) {
    SUCCEED("no CUDA device: nothing to sample");
    return;
  }
  std::string why;
  const std::string bus = trainer::cuda_device_pci_bus_id(0);
  REQUIRE_FALSE(bus.empty());
  auto sampler = trainer::make_power_sampler(bus, 5, &why);
  if (!sampler) {
    SUCCEED("NVML unavailable here: " + why);
    return;
  }
  sampler->begin();
  std::vector<double> busy(1 << 20, 1.0);  // some host work while the thread samples
  double sum = 0;
  for (int r = 0; r < 200; ++r)
    for (double& v : busy) sum += v *= 1.0000001;
  const PowerSummary s = sampler->end();
  INFO("instantaneous power readings: " << s.instant_watts);
  CHECK(sum > 0);
  CHECK(s.samples > 0);
  CHECK(s.sm_mhz_min > 0);
  CHECK(s.sm_mhz_max >= s.sm_mhz_median);
  CHECK(s.watts_mean > 0);
  CHECK(s.limit_watts > 0);
  // Sampling again starts afresh; stopped at once, it still has its first sample.
  sampler->begin();
  const int64_t again = sampler->end().samples;
  CHECK(again >= 1);
  CHECK(again < s.samples);
  // The reading now and the limit, as --floors-at-cap uses them.
  CHECK(sampler->watts_now() > 0);
  CHECK(sampler->limit_watts() == s.limit_watts);
  // The energy counter only grows (gemm_energy_probe reads it as a cross-check).
  const double joules = sampler->energy_joules();
  CHECK(joules >= 0);
  CHECK(sampler->energy_joules() >= joules);
}
