// GPU clock and power sampling (gpu_power.h). NVML's few entry points are declared here rather
// than taken from nvml.h, which CUDA toolkits do not always install; their signatures and the
// constants below are part of NVML's stable ABI.
#include "runtime/gpu_power.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/step_timer.h"

namespace trainer {
namespace {

using NvmlReturn = int;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;                        // NVML_CLOCK_SM
constexpr unsigned long long kReasonSwPowerCap = 0x4;  // nvmlClocksEventReasonSwPowerCap
constexpr unsigned kFieldPowerInstant = 186;           // NVML_FI_DEV_POWER_INSTANT, milliwatts

// nvmlFieldValue_t: one field of nvmlDeviceGetFieldValues, its value a union read by value_type.
struct NvmlFieldValue {
  unsigned field_id = 0;
  unsigned scope_id = 0;
  long long timestamp = 0;
  long long latency_us = 0;
  int value_type = 0;  // nvmlValueType_t
  NvmlReturn nvml_return = 0;
  union {
    double d;
    int si;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    unsigned short us;
  } value{};
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t's layout");

// The field's value as a double, by its nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0, UNSIGNED_INT,
// UNSIGNED_LONG, UNSIGNED_LONG_LONG, SIGNED_LONG_LONG, SIGNED_INT, UNSIGNED_SHORT = 6); false for
// a type this code does not know.
bool field_as_double(const NvmlFieldValue& f, double* out) {
  switch (f.value_type) {
    case 0:
      *out = f.value.d;
      return true;
    case 1:
      *out = f.value.ui;
      return true;
    case 2:
      *out = static_cast<double>(f.value.ul);
      return true;
    case 3:
      *out = static_cast<double>(f.value.ull);
      return true;
    case 4:
      *out = static_cast<double>(f.value.sll);
      return true;
    case 5:
      *out = f.value.si;
      return true;
    case 6:
      *out = f.value.us;
      return true;
    default:
      return false;
  }
}

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;              // milliwatts
  NvmlReturn (*power_limit)(NvmlDevice, unsigned*) = nullptr;              // milliwatts
  NvmlReturn (*reasons)(NvmlDevice, unsigned long long*) = nullptr;        // optional
  NvmlReturn (*energy)(NvmlDevice, unsigned long long*) = nullptr;         // optional; millijoules
  NvmlReturn (*field_values)(NvmlDevice, int, NvmlFieldValue*) = nullptr;  // optional

  std::string error(NvmlReturn r) const {
    return fmt::format("{} ({})", error_string ? error_string(r) : "error", r);
  }

  // The board's power right now (NVML_FI_DEV_POWER_INSTANT), W; false where the driver does not
  // offer it.
  bool instant_watts(NvmlDevice device, double* watts) const {
    NvmlFieldValue f;
    f.field_id = kFieldPowerInstant;
    double mw = 0;
    if (!field_values || field_values(device, 1, &f) != kNvmlSuccess ||
        f.nvml_return != kNvmlSuccess || !field_as_double(f, &mw) || mw <= 0)
      return false;
    *watts = mw / 1000.0;
    return true;
  }
};

template <typename F>
bool bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

class NvmlSampler final : public PowerSampler {
 public:
  NvmlSampler(Nvml api, NvmlDevice device, int period_ms, double limit_watts, bool instant)
      : api_(api),
        device_(device),
        period_(period_ms),
        limit_watts_(limit_watts),
        instant_(instant) {}
  ~NvmlSampler() override {
    stop();
    api_.shutdown();
  }

  void begin() override {
    stop();
    samples_.clear();
    stopping_ = false;
    thread_ = std::thread([this] { run(); });
  }

  PowerSummary end() override {
    stop();
    PowerSummary s = summarize_power(samples_, limit_watts_);
    s.instant_watts = instant_;
    return s;
  }

  double watts_now() override {
    unsigned mw = 0;
    return api_.power_usage(device_, &mw) == kNvmlSuccess ? mw / 1000.0 : 0.0;
  }

  double limit_watts() const override { return limit_watts_; }

  double energy_joules() override {
    unsigned long long mj = 0;
    return api_.energy && api_.energy(device_, &mj) == kNvmlSuccess ? mj / 1000.0 : 0.0;
  }

 private:
  // Samples at once, then every period until stopped: even a window shorter than the period
  // has its sample.
  void run() {
    auto next = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    do {
      PowerSample s;
      unsigned mhz = 0;
      unsigned long long why = 0;
      if (api_.clock_info(device_, kNvmlClockSm, &mhz) == kNvmlSuccess && read_watts(&s.watts)) {
        s.sm_mhz = mhz;
        s.power_capped = api_.reasons && api_.reasons(device_, &why) == kNvmlSuccess &&
                         (why & kReasonSwPowerCap) != 0;
        samples_.push_back(s);
      }
      next += period_;
      wake_.wait_until(lock, next, [this] { return stopping_; });
    } while (!stopping_);
  }

  // The instantaneous reading where the driver has it (a one-second average would trail the load
  // through a short window's steps), else NVML's power usage (that average).
  bool read_watts(double* watts) const {
    if (instant_ && api_.instant_watts(device_, watts)) return true;
    unsigned mw = 0;
    if (api_.power_usage(device_, &mw) != kNvmlSuccess) return false;
    *watts = mw / 1000.0;
    return true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  Nvml api_;
  NvmlDevice device_;
  std::chrono::milliseconds period_;
  double limit_watts_;
  bool instant_;                      // the samples read NVML_FI_DEV_POWER_INSTANT
  std::vector<PowerSample> samples_;  // the thread's until it is joined
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = true;
  std::thread thread_;
};

}  // namespace

PowerSummary summarize_power(const std::vector<PowerSample>& samples, double limit_watts) {
  PowerSummary s;
  s.limit_watts = limit_watts;
  s.samples = static_cast<int64_t>(samples.size());
  if (samples.empty()) return s;
  std::vector<double> mhz;
  double watts = 0;
  int64_t capped = 0;
  for (const PowerSample& p : samples) {
    mhz.push_back(p.sm_mhz);
    watts += p.watts;
    capped += p.power_capped ? 1 : 0;
  }
  s.sm_mhz_min = *std::min_element(mhz.begin(), mhz.end());
  s.sm_mhz_max = *std::max_element(mhz.begin(), mhz.end());
  s.sm_mhz_median = median(mhz);
  s.watts_mean = watts / static_cast<double>(s.samples);
  s.capped_fraction = static_cast<double>(capped) / static_cast<double>(s.samples);
  return s;
}

int64_t sustained_steps(const PowerSummary& s, double window_s, double step_ms) {
  if (s.samples == 0 || step_ms <= 0 || window_s <= 0 || window_s >= kPowerHoldSeconds) return 0;
  const bool power_bound =
      s.capped_fraction >= 0.5 || (s.limit_watts > 0 && s.watts_mean >= 0.97 * s.limit_watts);
  return power_bound ? static_cast<int64_t>(std::ceil(kPowerHoldSeconds * 1e3 / step_ms)) : 0;
}

std::string describe_power(const PowerSummary& s) {
  if (s.samples == 0) return "no samples";
  return fmt::format(
      "SM clock {:.0f} MHz ({:.0f}-{:.0f}), {:.0f} W{}, power cap in {:.0f}% of {} samples",
      s.sm_mhz_median, s.sm_mhz_min, s.sm_mhz_max, s.watts_mean,
      s.limit_watts > 0 ? fmt::format(" of {:.0f} W", s.limit_watts) : "", 100 * s.capped_fraction,
      s.samples);
}

std::unique_ptr<PowerSampler> make_power_sampler(const std::string& pci_bus_id, int period_ms,
                                                 std::string* why) {
  Nvml api;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);  // kept open for the process
  if (!lib) {
    *why = "NVML (libnvidia-ml.so.1) not found";
    return nullptr;
  }
  const bool bound = bind(lib, api.init, "nvmlInit_v2") &&
                     bind(lib, api.shutdown, "nvmlShutdown") &&
                     bind(lib, api.error_string, "nvmlErrorString") &&
                     bind(lib, api.by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                     bind(lib, api.clock_info, "nvmlDeviceGetClockInfo") &&
                     bind(lib, api.power_usage, "nvmlDeviceGetPowerUsage") &&
                     bind(lib, api.power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  if (!bound) {
    *why = "NVML lacks an entry point this build uses";
    return nullptr;
  }
  // The reasons' newer name first (drivers from 535), then the older one.
  if (!bind(lib, api.reasons, "nvmlDeviceGetCurrentClocksEventReasons"))
    bind(lib, api.reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  bind(lib, api.energy, "nvmlDeviceGetTotalEnergyConsumption");
  bind(lib, api.field_values, "nvmlDeviceGetFieldValues");
  if (const NvmlReturn r = api.init(); r != kNvmlSuccess) {
    *why = "nvmlInit failed: " + api.error(r);
    return nullptr;
  }
  NvmlDevice device = nullptr;
  if (const NvmlReturn r = api.by_pci_bus_id(pci_bus_id.c_str(), &device); r != kNvmlSuccess) {
    *why = fmt::format("NVML does not find the GPU at {}: {}", pci_bus_id, api.error(r));
    api.shutdown();
    return nullptr;
  }
  unsigned limit_mw = 0;
  if (api.power_limit(device, &limit_mw) != kNvmlSuccess) limit_mw = 0;
  double probe = 0;
  const bool instant = api.instant_watts(device, &probe);
  return std::make_unique<NvmlSampler>(api, device, period_ms, limit_mw / 1000.0, instant);
}

}  // namespace trainer
