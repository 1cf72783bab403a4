// --kernel-trace's arithmetic and files (runtime/kernel_trace.h), on kernels made up here: the
// recording itself needs a GPU and CUPTI (run it there: trainer --benchmark --kernel-trace OUT).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/kernel_trace.h"
#include "tests/catch.h"

using trainer::KernelTotal;
using trainer::StepTrace;
using trainer::TracedKernel;

namespace {

// Two steps. Step 0: A on stream 7 from 1000 to 3000 ns, B on stream 8 from 2000 to 5000 (they
// overlap), C from 6000 to 7000 after a 1000 ns gap, D inside B (2500-2600). Step 1: one kernel.
std::vector<TracedKernel> made_up() {
  return {{"A", 0, 7, 1000, 3000},
          {"B", 0, 8, 2000, 5000},
          {"C", 0, 7, 6000, 7000},
          {"D", 0, 8, 2500, 2600},
          {"A", 1, 7, 20000, 20500}};
}

}  // namespace

TEST_CASE("kernel trace: busy, idle and summed time per step", "[kernel_trace]") {
  const std::vector<StepTrace> s = trainer::summarize_steps(made_up(), 3);
  REQUIRE(s.size() == 3);
  CHECK(s[0].kernels == 4);
  CHECK_THAT(s[0].kernel_ms, WithinAbs((2000 + 3000 + 1000 + 100) * 1e-6, 1e-9));
  CHECK_THAT(s[0].busy_ms,
             WithinAbs((5000 - 1000 + 1000) * 1e-6, 1e-9));  // [1000, 5000) and [6000, 7000)
  CHECK_THAT(s[0].span_ms, WithinAbs(6000 * 1e-6, 1e-9));
  CHECK_THAT(s[0].idle_ms(), WithinAbs(1000 * 1e-6, 1e-9));
  CHECK(s[1].kernels == 1);
  CHECK_THAT(s[1].busy_ms, WithinAbs(500 * 1e-6, 1e-9));
  CHECK_THAT(s[1].idle_ms(), WithinAbs(0.0, 1e-12));
  CHECK(s[2].kernels == 0);  // a step without kernels is there, all zero
  CHECK(s[2].span_ms == 0);
  // Kernels of steps outside [0, steps) are not counted.
  CHECK(trainer::summarize_steps(made_up(), 1)[0].kernels == 4);
}

TEST_CASE("kernel trace: each kernel belongs to the step during which it ended", "[kernel_trace]") {
  // Steps end at 10000 and 20000 ns. The update started in step 0 and ending in step 1 belongs to
  // step 1; a kernel ending after the last step, and one handed out still running (zero
  // timestamps), are dropped.
  std::vector<TracedKernel> k = {{"fwd", -1, 7, 1000, 2000},
                                 {"upd", -1, 8, 9000, 12000},
                                 {"end", -1, 7, 19000, 20000},
                                 {"late", -1, 8, 19500, 20001},
                                 {"running", -1, 8, 0, 0}};
  trainer::assign_steps(k, {10000, 20000});
  REQUIRE(k.size() == 3);
  CHECK(k[0].name == "fwd");
  CHECK(k[0].step == 0);
  CHECK(k[1].name == "upd");
  CHECK(k[1].step == 1);
  CHECK(k[2].name == "end");
  CHECK(k[2].step == 1);  // ending exactly at the step's end
  std::vector<TracedKernel> none = {{"x", -1, 7, 5, 6}};
  trainer::assign_steps(none, {});
  CHECK(none.empty());
}

TEST_CASE("kernel trace: names as logs show them", "[kernel_trace]") {
  CHECK(trainer::kernel_display_name("_ZN7trainer4cuda12_GLOBAL__N_111rope_kernelIfLi8EEEvPT_i") ==
        "trainer::cuda::rope_kernel<float, 8>");
  CHECK(trainer::kernel_display_name("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") ==
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT");
}

TEST_CASE("kernel trace: the longest idle gaps and the kernels around them", "[kernel_trace]") {
  std::vector<TracedKernel> k = made_up();
  k.push_back({"E", 0, 7, 9000, 9500});  // a 2000 ns gap after C
  const std::vector<trainer::IdleGap> g = trainer::longest_gaps(k, 0, 5);
  REQUIRE(g.size() == 2);  // B overlapping A and D inside B leave no gap between them
  CHECK_THAT(g[0].ms, WithinAbs(2000 * 1e-6, 1e-9));
  CHECK(g[0].before == "C");
  CHECK(g[0].after == "E");
  CHECK_THAT(g[1].ms, WithinAbs(1000 * 1e-6, 1e-9));
  CHECK(g[1].before == "B");  // B ends last (5000), not D (2600)
  CHECK(g[1].after == "C");
  CHECK(trainer::longest_gaps(k, 0, 1).size() == 1);
  CHECK(trainer::longest_gaps(k, 1, 5).empty());
}

TEST_CASE("kernel trace: totals by name, largest first", "[kernel_trace]") {
  const std::vector<KernelTotal> t = trainer::totals_by_name(made_up());
  REQUIRE(t.size() == 4);
  CHECK(t[0].name == "B");
  CHECK_THAT(t[0].ms, WithinAbs(3000 * 1e-6, 1e-9));
  CHECK(t[1].name == "A");
  CHECK(t[1].count == 2);
  CHECK_THAT(t[1].ms, WithinAbs(2500 * 1e-6, 1e-9));
  CHECK(t[3].name == "D");
}

TEST_CASE("kernel trace: the Chrome trace and the CSV", "[kernel_trace]") {
  const std::string prefix =
      (std::filesystem::temp_directory_path() / ("kernel_trace_test_" + std::to_string(::getpid())))
          .string();
  std::vector<TracedKernel> k = made_up();
  k[2].name = "name \"with\" quotes, and a comma";
  for (TracedKernel& x : k) {  // CUPTI's clock: nanoseconds since 1970
    x.start_ns += 1795651637297170000ull;
    x.end_ns += 1795651637297170000ull;
  }
  trainer::write_kernel_trace(prefix, k);
  std::ifstream js(prefix + ".json");
  REQUIRE(js);
  const nlohmann::json doc = nlohmann::json::parse(js);
  const auto& ev = doc.at("traceEvents");
  REQUIRE(ev.size() == k.size());
  CHECK(ev[0].at("name") == "A");  // in start order, times in microseconds from the first
  CHECK_THAT(ev[0].at("ts").get<double>(), WithinAbs(0.0, 1e-9));
  CHECK_THAT(ev[0].at("dur").get<double>(), WithinAbs(2.0, 1e-9));
  CHECK(ev[1].at("name") == "B");
  CHECK(ev[1].at("tid") == 8);
  CHECK_THAT(ev[1].at("ts").get<double>(), WithinAbs(1.0, 1e-9));
  CHECK(ev[4].at("args").at("step") == 1);
  CHECK_THAT(ev[4].at("ts").get<double>(), WithinAbs(19.0, 1e-9));
  std::ifstream csv(prefix + ".csv");
  REQUIRE(csv);
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  REQUIRE(lines.size() == k.size() + 1);
  CHECK(lines[0] == "step,stream,start_us,duration_us,kernel");
  CHECK(lines[1] == "0,7,0.000,2.000,\"A\"");
  CHECK(lines[4] == "0,7,5.000,1.000,\"name 'with' quotes, and a comma\"");
  CHECK(lines[5] == "1,7,19.000,0.500,\"A\"");
  // An unwritable prefix is a usage error naming the file.
  CHECK_THROWS_AS(trainer::write_kernel_trace("/nonexistent-dir/x", k), trainer::UsageError);
  std::filesystem::remove(prefix + ".json");
  std::filesystem::remove(prefix + ".csv");
}
