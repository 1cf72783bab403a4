// --kernel-trace's recording (kernel_trace.h): CUPTI's activity API, loaded with dlopen so that the
// trainer runs where libcupti is absent unless the flag is given.
//
// CUPTI hands out buffers of activity records through two callbacks: one asks us for an empty
// buffer, the other returns a filled one (on CUPTI's own thread, or on ours inside a flush). The
// kernels of a completed buffer are copied out under a mutex. end_step() only reads CUPTI's clock
// (the clock of the records' timestamps): a flush there would hand out the update still running
// beside the next forward with zero timestamps. finish() flushes once and tags each kernel with
// the step during which it ended (assign_steps).
#include <cupti_activity.h>
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "runtime/kernel_trace.h"

namespace trainer {
namespace {

struct Cupti {
  void* lib = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;

  void check(CUptiResult r, const char* what) const {
    if (r == CUPTI_SUCCESS) return;
    const char* s = "unknown error";
    if (result_string) result_string(r, &s);
    usage_error("--kernel-trace: CUPTI's {} failed: {} ({})", what, s, static_cast<int>(r));
  }
};

// The one recording of the process (CUPTI's callbacks are plain functions).
std::mutex g_mutex;
std::vector<TracedKernel>* g_sink = nullptr;
const Cupti* g_api = nullptr;

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // Activity records must be 8-byte aligned.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (g_api && g_sink && g_api->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
        continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      g_sink->push_back({k->name ? k->name : "?", -1, k->streamId, k->start, k->end});
    }
  }
  std::free(buffer);
}

class CuptiTrace final : public KernelTrace {
 public:
  CuptiTrace() {
    // The toolkit's library by its soname, then the unversioned name (LD_LIBRARY_PATH decides).
    for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
      api_.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (api_.lib) break;
    }
    if (!api_.lib)
      usage_error(
          "--kernel-trace needs CUPTI (libcupti.so from the CUDA toolkit: add its directory, "
          "e.g. /usr/local/cuda/lib64 or /usr/local/cuda/extras/CUPTI/lib64, to "
          "LD_LIBRARY_PATH): {}",
          dlerror());
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api_.lib, name));
      if (!fn) usage_error("--kernel-trace: {} not found in libcupti", name);
    };
    sym(api_.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(api_.enable, "cuptiActivityEnable");
    sym(api_.disable, "cuptiActivityDisable");
    sym(api_.flush_all, "cuptiActivityFlushAll");
    sym(api_.next_record, "cuptiActivityGetNextRecord");
    sym(api_.result_string, "cuptiGetResultString");
    sym(api_.timestamp, "cuptiGetTimestamp");
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_sink) usage_error("--kernel-trace: one recording at a time");
    g_api = &api_;
    g_sink = &kernels_;
  }
  ~CuptiTrace() override {
    if (on_) {
      api_.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      api_.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_sink = nullptr;
    g_api = nullptr;
    // The library stays loaded: CUPTI may still hold callbacks into it.
  }

  void begin() override {
    api_.check(api_.register_callbacks(buffer_requested, buffer_completed),
               "cuptiActivityRegisterCallbacks");
    ends_ns_.clear();
    api_.check(api_.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
    on_ = true;
  }
  void end_step(int64_t step) override {
    TRAINER_CHECK(step == static_cast<int64_t>(ends_ns_.size()), "end_step({}) after {} steps",
                  step, ends_ns_.size());
    uint64_t now = 0;
    api_.check(api_.timestamp(&now), "cuptiGetTimestamp");
    ends_ns_.push_back(now);
  }
  std::vector<TracedKernel> finish() override {
    if (on_) {
      api_.check(api_.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
      api_.check(api_.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      on_ = false;
    }
    std::vector<TracedKernel> out;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      out = std::move(kernels_);
    }
    assign_steps(out, ends_ns_);
    std::map<std::string, std::string> shown;
    for (TracedKernel& k : out) {
      auto it = shown.find(k.name);
      if (it == shown.end()) it = shown.emplace(k.name, kernel_display_name(k.name)).first;
      k.name = it->second;
    }
    return out;
  }

 private:
  Cupti api_;
  std::vector<TracedKernel> kernels_;
  std::vector<uint64_t> ends_ns_;  // CUPTI's clock at each timed step's end
  bool on_ = false;
};

}  // namespace

std::unique_ptr<KernelTrace> make_kernel_trace() { return std::make_unique<CuptiTrace>(); }

}  // namespace trainer
