// --kernel-trace's summaries and files (kernel_trace.h); the recording itself is in
// kernel_trace_cuda.cpp.
#include "runtime/kernel_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace trainer {

std::string kernel_display_name(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return mangled;
  std::string name(d);
  std::free(d);
  const std::string anon = "(anonymous namespace)::";
  for (size_t at; (at = name.find(anon)) != std::string::npos;) name.erase(at, anon.size());
  // The parameter list starts at the first '(' outside template arguments.
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0) {
      name.resize(i);
      break;
    }
  }
  // A function template's demangled name begins with its return type.
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  return name;
}

void assign_steps(std::vector<TracedKernel>& kernels, const std::vector<uint64_t>& ends_ns) {
  std::vector<TracedKernel> kept;
  kept.reserve(kernels.size());
  for (TracedKernel& k : kernels) {
    if (k.start_ns == 0 || k.end_ns < k.start_ns) continue;
    const auto it = std::lower_bound(ends_ns.begin(), ends_ns.end(), k.end_ns);
    if (it == ends_ns.end()) continue;
    k.step = it - ends_ns.begin();
    kept.push_back(std::move(k));
  }
  kernels = std::move(kept);
}

std::vector<StepTrace> summarize_steps(const std::vector<TracedKernel>& kernels, int64_t steps) {
  std::vector<StepTrace> out(static_cast<size_t>(std::max<int64_t>(steps, 0)));
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(out.size());
  for (const TracedKernel& k : kernels) {
    if (k.step < 0 || k.step >= steps || k.end_ns < k.start_ns) continue;
    StepTrace& s = out[static_cast<size_t>(k.step)];
    ++s.kernels;
    s.kernel_ms += static_cast<double>(k.end_ns - k.start_ns) * 1e-6;
    spans[static_cast<size_t>(k.step)].push_back({k.start_ns, k.end_ns});
  }
  for (size_t i = 0; i < out.size(); ++i) {
    auto& sp = spans[i];
    if (sp.empty()) continue;
    std::sort(sp.begin(), sp.end());
    // The union of the intervals: merge each into the run before it while they touch.
    uint64_t busy = 0, run_start = sp[0].first, run_end = sp[0].second, last = sp[0].second;
    for (size_t j = 1; j < sp.size(); ++j) {
      last = std::max(last, sp[j].second);
      if (sp[j].first <= run_end) {
        run_end = std::max(run_end, sp[j].second);
      } else {
        busy += run_end - run_start;
        run_start = sp[j].first;
        run_end = sp[j].second;
      }
    }
    busy += run_end - run_start;
    out[i].busy_ms = static_cast<double>(busy) * 1e-6;
    out[i].span_ms = static_cast<double>(last - sp[0].first) * 1e-6;
  }
  return out;
}

std::vector<IdleGap> longest_gaps(const std::vector<TracedKernel>& kernels, int64_t step,
                                  size_t count) {
  std::vector<const TracedKernel*> ks;
  for (const TracedKernel& k : kernels)
    if (k.step == step && k.end_ns >= k.start_ns) ks.push_back(&k);
  std::sort(ks.begin(), ks.end(),
            [](const TracedKernel* a, const TracedKernel* b) { return a->start_ns < b->start_ns; });
  std::vector<IdleGap> gaps;
  const TracedKernel* last = nullptr;  // the kernel with the latest end so far
  for (const TracedKernel* k : ks) {
    if (last && k->start_ns > last->end_ns)
      gaps.push_back({static_cast<double>(k->start_ns - last->end_ns) * 1e-6, last->name, k->name});
    if (!last || k->end_ns > last->end_ns) last = k;
  }
  std::stable_sort(gaps.begin(), gaps.end(),
                   [](const IdleGap& a, const IdleGap& b) { return a.ms > b.ms; });
  if (gaps.size() > count) gaps.resize(count);
  return gaps;
}

std::vector<KernelTotal> totals_by_name(const std::vector<TracedKernel>& kernels) {
  std::map<std::string, KernelTotal> by;
  for (const TracedKernel& k : kernels) {
    KernelTotal& t = by[k.name];
    t.name = k.name;
    ++t.count;
    t.ms += static_cast<double>(k.end_ns - k.start_ns) * 1e-6;
  }
  std::vector<KernelTotal> out;
  for (auto& [name, t] : by) out.push_back(std::move(t));
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelTotal& a, const KernelTotal& b) { return a.ms > b.ms; });
  return out;
}

void write_kernel_trace(const std::string& prefix, const std::vector<TracedKernel>& kernels) {
  std::vector<const TracedKernel*> order;
  for (const TracedKernel& k : kernels) order.push_back(&k);
  std::sort(order.begin(), order.end(),
            [](const TracedKernel* a, const TracedKernel* b) { return a->start_ns < b->start_ns; });
  const uint64_t t0 = order.empty() ? 0 : order.front()->start_ns;
  auto us = [&](uint64_t ns) { return static_cast<double>(ns - t0) * 1e-3; };

  nlohmann::json events = nlohmann::json::array();
  for (const TracedKernel* k : order)
    events.push_back({{"name", k->name},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", k->stream},
                      {"ts", us(k->start_ns)},
                      {"dur", static_cast<double>(k->end_ns - k->start_ns) * 1e-3},
                      {"args", {{"step", k->step}}}});
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  const std::string json_path = prefix + ".json", csv_path = prefix + ".csv";
  std::ofstream js(json_path);
  if (!js) usage_error("--kernel-trace: cannot write {}", json_path);
  js << doc.dump() << "\n";
  std::ofstream csv(csv_path);
  if (!csv) usage_error("--kernel-trace: cannot write {}", csv_path);
  csv << "step,stream,start_us,duration_us,kernel\n" << std::fixed << std::setprecision(3);
  for (const TracedKernel* k : order) {
    std::string name = k->name;
    std::replace(name.begin(), name.end(), '"', '\'');
    csv << k->step << "," << k->stream << "," << us(k->start_ns) << ","
        << static_cast<double>(k->end_ns - k->start_ns) * 1e-3 << ",\"" << name << "\"\n";
  }
  if (!js.good() || !csv.good()) usage_error("--kernel-trace: writing {}.* failed", prefix);
}

#ifndef TRAINER_WITH_CUDA
std::unique_ptr<KernelTrace> make_kernel_trace() {
  usage_error("--kernel-trace needs a build with CUDA (it records the GPU's kernels)");
}
#endif

}  // namespace trainer
