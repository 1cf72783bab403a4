// Equivalence of every parallel mode with single-process training (SPEC.md): for the world size
// this program runs with (mpirun -np 1..4), each --ddp strategy, with and without --shard-optim
// and --grad-accum 2, must reach the parameters of a one-process run with the same global batch
// after 10 steps: max |Δ| / max |p| < 1e-5. Also: checkpoints written by N ranks resume on M
// (N sharded ranks on every M <= N, sharded or not; 2 unsharded ranks on 4 sharded ones); and
// --recompute ffn / block reach the very parameters of --recompute none; --memory-report's plan
// agrees with the allocator.
//
// Built twice: as test_distributed on the CPU backend (MPI), and with TEST_ON_GPU as
// test_distributed_gpu on one GPU per rank (NCCL): fp32 to 1e-5 after 20 steps, and bf16 losses
// within 1e-2 of the one-GPU run (also with whole bf16 gradients exchanged by copy engines, whose
// replicas must stay bit-identical); fp16 with loss scaling within 5e-3 of fp32, and what a tiny
// scale flushes to zero.
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/device_buffer.h"
#include "runtime/checkpoint.h"
#include "runtime/data.h"
#include "runtime/gpu_power.h"
#include "runtime/options.h"
#include "runtime/trainer.h"
#include "tests/catch.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGlobalBatch = 24;  // B = 24 / (world * accum) is whole for world 1..4
#ifdef TEST_ON_GPU
constexpr int kSteps = 20;
// fp32 unless a test asks for bf16 (a later flag wins).
const std::vector<std::string> kDevice = {"--device", "cuda", "--precision", "fp32"};
#else
constexpr int kSteps = 10;
const std::vector<std::string> kDevice = {"--device", "cpu"};
#endif

// A shared scratch directory with a token file, made by rank 0 and removed by it when the program
// exits (after main's MPI_Finalize, so every rank is done with it).
const std::string& scratch() {
  static struct Dir {
    std::string path;
    bool owner = false;
    ~Dir() {
      std::error_code ec;
      if (owner) fs::remove_all(path, ec);
    }
  } dir;
  if (!dir.path.empty()) return dir.path;
  MpiCommunicator w(MPI_COMM_WORLD);
  std::string d;
  if (w.rank() == 0) {
    char tmpl[] = "/tmp/trainer_dist_XXXXXX";
    d = mkdtemp(tmpl);
    dir.owner = true;
    std::vector<uint16_t> tokens(6000);
    uint64_t x = 42;
    for (auto& t : tokens) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      t = static_cast<uint16_t>((x >> 33) % 61);
    }
    write_npy_u16(d + "/tokens.npy", tokens.data(), static_cast<int64_t>(tokens.size()));
  }
  dir.path = w.broadcast_string(d, 0);
  return dir.path;
}

Options make_options(std::vector<std::string> args) {
  std::vector<std::string> base = {"trainer",
                                   "--d-model",
                                   "32",
                                   "--d-ff",
                                   "64",
                                   "--layers",
                                   "2",
                                   "--heads",
                                   "2",
                                   "--vocab",
                                   "61",
                                   "--ctx",
                                   "16",
                                   "--steps",
                                   std::to_string(kSteps),
                                   "--lr",
                                   "3e-3",
                                   "--warmup",
                                   "2",
                                   "--clip",
                                   "0.5",
                                   "--data",
                                   scratch() + "/tokens.npy",
                                   "--log-every",
                                   "100"};
  base.insert(base.end(), kDevice.begin(), kDevice.end());
  args.insert(args.begin(), base.begin(), base.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() >= b.size());
  double dmax = 0, pmax = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    dmax = std::max(dmax, std::fabs(static_cast<double>(a[i]) - b[i]));
    pmax = std::max(pmax, std::fabs(static_cast<double>(b[i])));
  }
  return dmax / pmax;
}

// The single-process reference (run on each rank alone, through MPI_COMM_SELF).
const TrainResult& reference(const std::string& precision = "fp32") {
  static std::map<std::string, TrainResult> refs;
  if (!refs.count(precision)) {
    MpiCommunicator self(MPI_COMM_SELF);
    refs[precision] =
        run_training(make_options({"--ddp", "none", "--batch", std::to_string(kGlobalBatch),
                                   "--precision", precision}),
                     self, /*keep_params=*/true);
  }
  return refs[precision];
}

#ifdef TEST_ON_GPU
// The runs the step-scheduling features (--cuda-graph, --overlap-update) are checked on, one GPU:
// gradient accumulation, recompute with validation passes between steps, fp32 with the simple
// attention, and fp16 whose loss scale changes after a skipped update.
std::vector<std::vector<std::string>> one_gpu_cases() {
  const std::string val = scratch() + "/tokens.npy";
  return {
      {"--precision", "bf16", "--batch", "12", "--grad-accum", "2"},
      {"--precision", "bf16", "--batch", "24", "--recompute", "block", "--eval-every", "5",
       "--val-data", val},
      {"--precision", "fp32", "--batch", "8", "--grad-accum", "3", "--attn", "simple"},
      {"--precision", "fp16", "--batch", "24", "--loss-scale-window", "3",
       "--debug-inf-grad-at-step", "4"},
  };
}

// `b` trained exactly as `a` did: the same losses, validation losses, loss scales, skipped
// updates and final parameters, bit for bit.
void check_identical(const TrainResult& b, const TrainResult& a) {
  REQUIRE(b.losses.size() == static_cast<size_t>(kSteps));
  CHECK(b.losses == a.losses);
  CHECK(b.val_losses == a.val_losses);
  CHECK(b.loss_scales == a.loss_scales);
  CHECK(b.skipped == a.skipped);
  size_t differ = 0;
  double worst = 0;
  for (size_t i = 0; i < std::min(b.params.size(), a.params.size()); ++i)
    if (b.params[i] != a.params[i]) {
      ++differ;
      worst = std::max(worst, std::abs(static_cast<double>(b.params[i]) - a.params[i]));
    }
  INFO(differ << " of " << a.params.size() << " parameters differ, by up to " << worst);
  REQUIRE(b.params == a.params);
}

// Every one-GPU case, alone on its rank, trains to the very same numbers with `flag` set to
// `value_b` (and `extra_b`) as with `value_a`.
void check_one_gpu_cases_identical(const std::string& flag, const std::string& value_a,
                                   const std::string& value_b,
                                   const std::vector<std::string>& extra_b = {}) {
  MpiCommunicator self(MPI_COMM_SELF);
  for (std::vector<std::string> args : one_gpu_cases()) {
    args.insert(args.end(), {"--ddp", "none"});
    std::vector<std::string> a = args, b = args;
    a.insert(a.end(), {flag, value_a});
    b.insert(b.end(), {flag, value_b});
    b.insert(b.end(), extra_b.begin(), extra_b.end());
    std::string what;
    for (const std::string& arg : args) what += arg + " ";
    for (const std::string& arg : extra_b) what += arg + " ";
    INFO(what << flag << " " << value_b << " vs " << value_a);
    const TrainResult ra = run_training(make_options(a), self, /*keep_params=*/true);
    check_identical(run_training(make_options(b), self, /*keep_params=*/true), ra);
  }
}

// GEMMs planned for fewer SMs (`reserved`, flags) against `reference`: cuBLASLt may pick other
// algorithms, so the same run up to rounding; recompute repeats each product as forward ran it,
// so with it the run ends on the very parameters of `reserved` keeping everything.
void check_sm_reservation(const std::vector<std::string>& reference,
                          const std::vector<std::string>& reserved) {
  MpiCommunicator self(MPI_COMM_SELF);
  auto with = [](const std::vector<std::string>& extra) {
    std::vector<std::string> v = {"--precision",  "bf16", "--batch", "12",
                                  "--grad-accum", "2",    "--ddp",   "none"};
    v.insert(v.end(), extra.begin(), extra.end());
    return make_options(v);
  };
  const TrainResult a = run_training(with(reference), self, true);
  const TrainResult b = run_training(with(reserved), self, true);
  std::string what;
  for (const std::string& arg : reserved) what += arg + " ";
  REQUIRE(b.losses.size() == a.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s)
    CHECK_THAT(b.losses[s], WithinRel(a.losses[s], 1e-2));
  WARN(what << "vs " << reference.back() << ": max|dp|/max|p| = " << rel_diff(b.params, a.params));
  CHECK(rel_diff(b.params, a.params) < 5e-2);
  std::vector<std::string> recompute = reserved;
  recompute.insert(recompute.end(), {"--recompute", "block"});
  const TrainResult c = run_training(with(recompute), self, true);
  CHECK(c.losses == b.losses);
  REQUIRE(c.params == b.params);
}
#endif

}  // namespace

// --update-sms auto leaves SMs to the update only for models whose update stays exposed after
// forward (1.5 B parameters and more; 32 SMs from 3 B, where it stays exposed longest); a number
// is taken as given, and refused beside no update.
TEST_CASE("--update-sms: auto by model size, numbers as given") {
  const int64_t b27 = 3'407'000'000, xl = 1'998'000'000, large = 774'000'000;
  CHECK(make_options({}).update_sms == "auto");
  CHECK(make_options({}).update_sms_for(true, b27) == 32);
  CHECK(make_options({}).update_sms_for(true, 3'000'000'000) == 32);
  CHECK(make_options({}).update_sms_for(true, 2'999'999'999) == 24);
  CHECK(make_options({}).update_sms_for(false, b27) == 0);
  CHECK(make_options({}).update_sms_for(true, xl) == 24);
  CHECK(make_options({}).update_sms_for(true, 1'500'000'000) == 24);
  CHECK(make_options({}).update_sms_for(true, large) == 0);
  CHECK(make_options({}).update_sms_for(false, xl) == 0);
  CHECK(make_options({"--update-sms", "40"}).update_sms_for(true, large) == 40);
  CHECK(make_options({"--update-sms", "0"}).update_sms_for(true, xl) == 0);
  CHECK(make_options({"--update-sms", "0"}).update_sms_for(false, xl) == 0);
  REQUIRE_THROWS_WITH(make_options({"--update-sms", "8"}).update_sms_for(false, xl),
                      ContainsSubstring("--update-sms 8 needs the update beside forward"));
  REQUIRE_THROWS_WITH(make_options({"--update-sms", "65"}),
                      ContainsSubstring("--update-sms must be auto or a number in [0, 64]"));
  REQUIRE_THROWS_WITH(make_options({"--update-sms", "-1"}),
                      ContainsSubstring("--update-sms must be auto or a number in [0, 64]"));
}

// --wgrad-stream auto puts the weight gradients on a second stream on a GPU, leaving 24 SMs to
// the rest of backward; the CPU backend has no streams, so a number asks for a GPU.
TEST_CASE("--wgrad-stream: auto by device, off, numbers as given") {
  CHECK(make_options({}).wgrad_stream == "auto");
  CHECK(make_options({}).wgrad_sms_for(true) == 24);
  CHECK(make_options({}).wgrad_sms_for(false) == -1);
  CHECK(make_options({"--wgrad-stream", "off"}).wgrad_sms_for(true) == -1);
  CHECK(make_options({"--wgrad-stream", "off"}).wgrad_sms_for(false) == -1);
  CHECK(make_options({"--wgrad-stream", "0"}).wgrad_sms_for(true) == 0);
  CHECK(make_options({"--wgrad-stream", "40"}).wgrad_sms_for(true) == 40);
  REQUIRE_THROWS_WITH(make_options({"--wgrad-stream", "16"}).wgrad_sms_for(false),
                      ContainsSubstring("--wgrad-stream 16 needs --device cuda"));
  for (const char* bad : {"65", "-1", "on", ""})
    REQUIRE_THROWS_WITH(
        make_options({"--wgrad-stream", bad}),
        ContainsSubstring("--wgrad-stream must be auto, off or a number in [0, 64]"));
}

// --gemm-tune auto tunes the matrix products on a GPU; the CPU backend has no cuBLASLt.
TEST_CASE("--gemm-tune: auto by device, on, off") {
  CHECK(make_options({}).gemm_tune == "auto");
  CHECK(make_options({}).gemm_tune_for(true));
  CHECK_FALSE(make_options({}).gemm_tune_for(false));
  CHECK(make_options({"--gemm-tune", "on"}).gemm_tune_for(true));
  CHECK_FALSE(make_options({"--gemm-tune", "off"}).gemm_tune_for(true));
  CHECK_FALSE(make_options({"--gemm-tune", "off"}).gemm_tune_for(false));
  REQUIRE_THROWS_WITH(make_options({"--gemm-tune", "on"}).gemm_tune_for(false),
                      ContainsSubstring("--gemm-tune on needs --device cuda"));
  for (const char* bad : {"yes", "1", ""})
    REQUIRE_THROWS_WITH(make_options({"--gemm-tune", bad}),
                        ContainsSubstring("--gemm-tune must be auto, on or off"));
}

TEST_CASE("every strategy, sharded or not, with or without grad-accum, equals one process",
          "[equivalence]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const TrainResult& ref = reference();
  REQUIRE(ref.losses.size() == kSteps);
  REQUIRE(ref.losses.back() < ref.losses.front());  // it learns

  // On GPUs, gradients are also summed with copy engines (--grad-transport ce: ranks on one host).
  std::vector<std::string> transports = {"nccl"};
#ifdef TEST_ON_GPU
  if (w > 1) transports.push_back("ce");
#endif
  for (const std::string& transport : transports)
    for (const char* ddp : {"none", "naive", "flat", "overlap", "bucketed"}) {
      if (std::string(ddp) == "none" && w > 1) continue;
      for (bool shard : {false, true}) {
        for (int accum : {1, 2}) {
          const int64_t batch = kGlobalBatch / (w * accum);
          std::vector<std::string> args = {"--ddp", ddp, "--batch", std::to_string(batch),
                                           "--grad-accum", std::to_string(accum),
                                           // small buckets so several collectives are in flight
                                           "--bucket-mb", "0.01", "--grad-transport", transport};
          if (shard) args.push_back("--shard-optim");
          INFO("world " << w << " --ddp " << ddp << (shard ? " --shard-optim" : "")
                        << " --grad-accum " << accum << " --grad-transport " << transport);
          const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
          const double d = rel_diff(got.params, ref.params);
          INFO("max|dp|/max|p| = " << d);
          REQUIRE(d < 1e-5);
          REQUIRE(got.losses.size() == ref.losses.size());
          for (size_t s = 0; s < ref.losses.size(); ++s)
            REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s], 1e-5));
        }
      }
    }
#ifdef TEST_ON_GPU
  // NCCL on fewer CTAs and backward's GEMMs planned for the SMs left to them.
  {
    std::vector<std::string> args = {"--ddp",         "bucketed",   "--bucket-mb", "0.01",
                                     "--shard-optim", "--comm-sms", "4",           "--batch"};
    args.push_back(std::to_string(kGlobalBatch / w));
    INFO("world " << w << " --ddp bucketed --shard-optim --comm-sms 4");
    const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
    REQUIRE(rel_diff(got.params, ref.params) < 1e-5);
    for (size_t s = 0; s < ref.losses.size(); ++s)
      REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s], 1e-5));
  }
#endif
}

#ifdef TEST_ON_GPU
TEST_CASE("bf16: every strategy's losses stay within 1e-2 of one GPU", "[equivalence]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const TrainResult& ref = reference("bf16");
  for (const char* ddp : {"naive", "flat", "overlap", "bucketed"}) {
    for (bool shard : {false, true}) {
      for (const char* reduce : {"fp32", "bf16"}) {
        std::vector<std::string> args = {
            "--ddp",         ddp,    "--batch",     std::to_string(kGlobalBatch / w),
            "--bucket-mb",   "0.01", "--precision", "bf16",
            "--grad-reduce", reduce};
        if (shard) args.push_back("--shard-optim");
        INFO("world " << w << " --ddp " << ddp << (shard ? " --shard-optim" : "")
                      << " --grad-reduce " << reduce);
        const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
        for (size_t s = 0; s < ref.losses.size(); ++s)
          REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s], 1e-2));
      }
    }
  }
  if (w == 1) return;
  // Copy engines with bf16: the ranks exchange whole bf16 gradients (accumulated in bf16 over
  // micro-steps) and every rank adds all the copies in rank order, so the replicas stay
  // bit-identical.
  for (const char* ddp : {"flat", "bucketed"})
    for (int accum : {1, 2}) {
      std::vector<std::string> args = {"--ddp",
                                       ddp,
                                       "--batch",
                                       std::to_string(kGlobalBatch / (w * accum)),
                                       "--grad-accum",
                                       std::to_string(accum),
                                       "--bucket-mb",
                                       "0.01",
                                       "--precision",
                                       "bf16",
                                       "--grad-reduce",
                                       "bf16",
                                       "--grad-transport",
                                       "ce"};
      INFO("world " << w << " --ddp " << ddp << " --grad-accum " << accum
                    << " --grad-reduce bf16 --grad-transport ce");
      const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
      for (size_t s = 0; s < ref.losses.size(); ++s)
        REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s], 1e-2));
      // FNV-1a of the parameters' bits, the same on every rank.
      uint64_t h = 1469598103934665603ULL;
      for (float x : got.params) {
        uint32_t u;
        std::memcpy(&u, &x, sizeof(u));
        h = (h ^ u) * 1099511628211ULL;
      }
      unsigned long long lo = h, hi = h;
      MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
      REQUIRE(lo == hi);
      REQUIRE(rel_diff(got.params, reference("bf16").params) > 0);  // not the same run
    }
}
#endif

#ifdef TEST_ON_GPU
// fp16 computes with 16-bit activations like bf16 but has 3 more fraction bits and a narrow range:
// with the default dynamic loss scaling every strategy tracks the fp32 run closely and no step
// overflows on this model. A tiny fixed scale (1e-6) shows what underflow does: the loss gradient
// enters backward as the alpha of the lm_head GEMMs, whose weight gradient accumulates in fp32 and
// survives, but the fp16 gradient they pass down (about 1e-6 / 384 tokens per element) is below
// fp16's smallest subnormal, so every other tensor's gradient is zero and, with weight decay off,
// every other parameter keeps its initial value bit for bit.
TEST_CASE("fp16 with dynamic loss scaling tracks fp32; a tiny scale underflows", "[fp16]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const TrainResult& ref = reference();
  const std::string b = std::to_string(kGlobalBatch / w);
  double scaled_err = 0;
  for (const char* ddp : {"naive", "bucketed"})
    for (bool shard : {false, true}) {
      std::vector<std::string> args = {"--ddp",       ddp,    "--batch",     b,
                                       "--bucket-mb", "0.01", "--precision", "fp16"};
      if (shard) args.push_back("--shard-optim");
      INFO("world " << w << " --ddp " << ddp << (shard ? " --shard-optim" : ""));
      const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
      REQUIRE(got.losses.size() == ref.losses.size());
      for (size_t s = 0; s < ref.losses.size(); ++s) {
        REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s], 5e-3));
        CHECK(got.loss_scales[s] == 65536.0);  // auto = dynamic with fp16
        CHECK(!got.skipped[s]);
      }
      scaled_err = std::max(scaled_err, rel_diff(got.params, ref.params));
    }
  const std::vector<std::string> common = {"--ddp", "bucketed",    "--batch",
                                           b,       "--precision", "fp16"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return make_options(more);
  };
  const TrainResult init = run_training(with({"--lr", "0", "--wd", "0"}), world, true);
  const TrainResult flushed =
      run_training(with({"--loss-scale", "1e-6", "--wd", "0"}), world, true);
  const ParamLayout L(make_options({}).config);
  for (const ParamTensor& t : L.tensors()) {
    INFO(t.name);
    const auto begin = [&](const TrainResult& r) { return r.params.begin() + t.offset; };
    const bool same = std::equal(begin(flushed), begin(flushed) + t.numel, begin(init));
    CHECK(same == (t.name != "lm_head.weight"));
  }
  CHECK(rel_diff(init.params, ref.params) > 1e-3);  // fp32 did learn (init may hold padding)
  WARN("fp16 parameters vs fp32 after " << kSteps << " steps: " << scaled_err);
}
#endif

// --adam-state bf16 rounds the moments every rank computes from the same reduced gradient, so
// the strategies and ZeRO-1's shards agree with one process, to the rounding of gradients summed
// in another order, which can move a moment by one bf16 step (as large, after 10 steps, as the
// difference between bf16 and fp32 moments themselves); and a checkpoint keeps the moments
// exactly (widened to fp32 in the file): one process resumed at step 5 ends on the very
// parameters of the run that went on.
TEST_CASE("bf16 moments: strategies and ZeRO-1 equal one process; resume is exact",
          "[adam-state]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  MpiCommunicator self(MPI_COMM_SELF);
  const int w = world.world();
  const std::string G = std::to_string(kGlobalBatch);
  const TrainResult one = run_training(
      make_options({"--ddp", "none", "--batch", G, "--adam-state", "bf16"}), self, true);
  const double vs_fp32 = rel_diff(one.params, reference().params);
  WARN("bf16 moments vs fp32 moments after " << kSteps << " steps: " << vs_fp32);
  CHECK(vs_fp32 > 1e-6);  // the rounding does show
  CHECK(vs_fp32 < 1e-2);
  for (bool shard : {false, true}) {
    std::vector<std::string> args = {"--ddp",        "bucketed", "--bucket-mb",
                                     "0.01",         "--batch",  std::to_string(kGlobalBatch / w),
                                     "--adam-state", "bf16"};
    if (shard) args.push_back("--shard-optim");
    INFO("world " << w << (shard ? " --shard-optim" : ""));
    const TrainResult got = run_training(make_options(args), world, true);
    const double d = rel_diff(got.params, one.params);
    INFO("max|dp|/max|p| = " << d);
    CHECK(d < 1e-4);  // measured on the CPU: 1.9e-5 on 2 to 4 ranks, 0 on one
    for (size_t s = 0; s < one.losses.size(); ++s)
      CHECK_THAT(got.losses[s], WithinRel(one.losses[s], 1e-5));
  }
  if (world.rank() == 0) {
    const std::string out = scratch() + "/bf16_moments";
    run_training(make_options({"--ddp", "none", "--batch", G, "--adam-state", "bf16", "--out", out,
                               "--save-every", "5"}),
                 self);
    const TrainResult resumed =
        run_training(make_options({"--ddp", "none", "--batch", G, "--adam-state", "bf16",
                                   "--resume", out + "/step_5"}),
                     self, true);
    REQUIRE(resumed.first_step == 5);
    for (size_t s = 0; s < resumed.losses.size(); ++s)
      CHECK(resumed.losses[s] == one.losses[s + 5]);
    CHECK(resumed.params == one.params);
  }
  world.barrier();
}

// --recompute reruns forward's kernels on forward's inputs in backward: every strategy, with
// ZeRO-1 and gradient accumulation, ends on the very parameters of the run that keeps everything.
TEST_CASE("recompute ffn and block train to the same parameters as none", "[recompute]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  for (const char* ddp : {"flat", "bucketed"}) {
    std::vector<std::string> args = {
        "--ddp",        ddp, "--batch",     std::to_string(kGlobalBatch / (2 * w)),
        "--grad-accum", "2", "--bucket-mb", "0.01",
        "--shard-optim"};
    const TrainResult none = run_training(make_options(args), world, /*keep_params=*/true);
    for (const char* rc : {"ffn", "block"}) {
      std::vector<std::string> more = args;
      more.insert(more.end(), {"--recompute", rc});
      INFO("world " << w << " --ddp " << ddp << " --recompute " << rc);
      const TrainResult got = run_training(make_options(more), world, /*keep_params=*/true);
      CHECK(got.losses == none.losses);
      REQUIRE(got.params == none.params);
    }
  }
}

// --memory-report: rank 0's plan lists the weights, gradients, activations and optimizer state
// of its range; every line but the CPU's activations (vectors of the reference model) and NCCL's
// (measured, not allocated by us) is an allocation of this process's allocator, so the two
// counts must agree to the byte.
TEST_CASE("--memory-report: the plan adds up to what the allocator holds", "[memory-report]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const std::string path = scratch() + "/memory_w" + std::to_string(w) + ".json";
  // Unsharded, sharded, and sharded with bf16 moments (--adam-state bf16).
  for (const auto& [shard, bf16_moments] : {std::pair{false, false}, {true, false}, {true, true}}) {
    std::vector<std::string> args = {"--ddp",           w == 1 ? "none" : "bucketed",
                                     "--batch",         std::to_string(kGlobalBatch / w),
                                     "--steps",         "2",
                                     "--memory-report", path};
    if (shard) args.push_back("--shard-optim");
    if (bf16_moments) args.insert(args.end(), {"--adam-state", "bf16"});
    const Options o = make_options(args);
    run_training(o, world);
    world.barrier();
    if (world.rank() != 0) continue;
    INFO("world " << w << (shard ? " --shard-optim" : "") << (bf16_moments ? " bf16 moments" : ""));
    std::ifstream f(path);
    const nlohmann::json j = nlohmann::json::parse(f);
    const int64_t flat = ParamLayout(o.config).padded_total(w);
    const int64_t owned = shard ? flat / w : flat;
    int64_t sum = 0, outside = 0;
    std::map<std::string, int64_t> lines;
    for (const auto& m : j.at("plan")) {
      const std::string what = m.at("category");
      const int64_t bytes = m.at("bytes");
      CHECK(bytes > 0);
      sum += bytes;
      lines[what] += bytes;
      if (what.rfind("activations and backward scratch", 0) == 0 ||
          what.rfind("NCCL communicator", 0) == 0)
        outside += bytes;
    }
    CHECK(sum == j.at("plan_total_bytes").get<int64_t>());
    CHECK(j.at("measured").at("allocator_bytes").get<int64_t>() == sum - outside);
    CHECK(j.at("measured").at("in_use_bytes").get<int64_t>() > 0);
    CHECK(j.at("measured").at("after_step").get<int64_t>() == 1);
    CHECK(lines.at("fp32 master weights (this rank's range)") == 4 * owned);
    if (bf16_moments)
      CHECK(lines.at("AdamW moments m and v (bf16, this rank's range)") == 4 * owned);
    else
      CHECK(lines.at("AdamW moments m and v (fp32, this rank's range)") == 8 * owned);
    CHECK(lines.at("working weights (fp32)") == 4 * flat);
    CHECK(lines.at("gradients (fp32)") == 4 * flat);
#ifdef TEST_ON_GPU
    CHECK(lines.count("cuBLASLt workspace") == 1);
#endif
  }
}

TEST_CASE("a resumed run continues exactly as the uninterrupted one", "[resume]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const TrainResult& ref = reference();
  const std::string out = scratch() + "/resume_w" + std::to_string(w);
  const std::string batch = std::to_string(kGlobalBatch / w);

  // First half on all ranks, sharded, saving at step 5 (the run stops at 10; only step_5 is used).
  run_training(make_options({"--batch", batch, "--shard-optim", "--out", out, "--save-every", "5"}),
               world);
  world.barrier();
  REQUIRE(fs::exists(out + "/step_5/model.safetensors"));
  REQUIRE(fs::exists(out + "/step_5/optimizer.safetensors"));
  REQUIRE(fs::exists(out + "/model.safetensors"));

  // Resume on every sub-world size m that divides the global batch: ranks [0, m) take part.
  for (int m = 1; m <= w; ++m) {
    for (bool shard : {false, true}) {
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, world.rank() < m ? 0 : MPI_UNDEFINED, world.rank(), &sub);
      if (world.rank() < m) {
        MpiCommunicator subw(sub);
        std::vector<std::string> args = {"--batch",  std::to_string(kGlobalBatch / m),
                                         "--resume", out + "/step_5",
                                         "--ddp",    m == 1 ? "none" : "bucketed"};
        if (shard) args.push_back("--shard-optim");
        INFO("written by " << w << " sharded ranks, resumed on " << m
                           << (shard ? " sharded" : " unsharded"));
        const TrainResult got = run_training(make_options(args), subw, /*keep_params=*/true);
        REQUIRE(got.first_step == 5);
        REQUIRE(got.losses.size() == kSteps - 5);
        for (size_t s = 0; s < got.losses.size(); ++s) {
          if (w == 1 && m == 1)  // same arithmetic in the same order: bit-identical
            REQUIRE(got.losses[s] == ref.losses[s + 5]);
          else
            REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s + 5], 1e-5));
        }
        REQUIRE(rel_diff(got.params, ref.params) < 1e-5);
        MPI_Comm_free(&sub);
      }
      world.barrier();
    }
  }
}

TEST_CASE("a checkpoint written by 2 unsharded ranks resumes on 4 sharded ranks", "[resume]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  if (world.world() != 4) return;  // the np4 run covers it
  const TrainResult& ref = reference();
  const std::string out = scratch() + "/resume_from_2";
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world.rank() < 2 ? 0 : MPI_UNDEFINED, world.rank(), &sub);
  if (world.rank() < 2) {
    MpiCommunicator two(sub);
    run_training(make_options({"--batch", std::to_string(kGlobalBatch / 2), "--out", out,
                               "--save-every", "5"}),
                 two);
    MPI_Comm_free(&sub);
  }
  world.barrier();
  const TrainResult got = run_training(make_options({"--batch", std::to_string(kGlobalBatch / 4),
                                                     "--resume", out + "/step_5", "--shard-optim"}),
                                       world, /*keep_params=*/true);
  REQUIRE(got.first_step == 5);
  for (size_t s = 0; s < got.losses.size(); ++s)
    REQUIRE_THAT(got.losses[s], WithinRel(ref.losses[s + 5], 1e-5));
  REQUIRE(rel_diff(got.params, ref.params) < 1e-5);
}

TEST_CASE(
    "loss scaling: the same updates with finite gradients; a non-finite one skips the step "
    "on every rank",
    "[loss-scale]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  const int w = world.world();
  const TrainResult& ref = reference();
  const std::string ddp = w == 1 ? "none" : "bucketed";
#ifdef TEST_ON_GPU
  const bool exact = false;  // GPU kernels may order sums differently between runs
#else
  const bool exact = true;  // powers of two scale exactly: the very same arithmetic
#endif

  // Dynamic scaling with finite gradients, window 3: 2^16, doubled after every 3 clean steps.
  for (bool shard : {false, true}) {
    for (int accum : {1, 2}) {
      std::vector<std::string> args = {"--ddp",
                                       ddp,
                                       "--batch",
                                       std::to_string(kGlobalBatch / (w * accum)),
                                       "--grad-accum",
                                       std::to_string(accum),
                                       "--loss-scale",
                                       "dynamic",
                                       "--loss-scale-window",
                                       "3",
                                       "--bucket-mb",
                                       "0.01"};
      if (shard) args.push_back("--shard-optim");
      INFO("world " << w << (shard ? " --shard-optim" : "") << " --grad-accum " << accum);
      const TrainResult got = run_training(make_options(args), world, /*keep_params=*/true);
      REQUIRE(got.loss_scales.size() == kSteps);
      for (int s = 0; s < kSteps; ++s) {
        CHECK(got.loss_scales[s] == 65536.0 * (1 << (s / 3)));
        CHECK(!got.skipped[s]);
      }
      if (exact && w == 1 && !shard && accum == 1)
        REQUIRE(got.params == ref.params);
      else
        REQUIRE(rel_diff(got.params, ref.params) < 1e-5);
    }
  }

  // The last rank's gradients at step 4 (0-based) are made non-finite. With loss scaling every
  // rank skips that update: 5 steps end where 4 steps end (a constant learning rate after the
  // warm-up, so the schedules agree), moments and the AdamW step count included, and the scale
  // halves. Without it the run fails with a non-finite loss.
  const std::string out = scratch() + "/skip_w" + std::to_string(w);
  for (bool shard : {false, true}) {
    std::vector<std::string> common = {
        "--ddp",    ddp,    "--batch",      std::to_string(kGlobalBatch / w),
        "--min-lr", "3e-3", "--loss-scale", "dynamic"};
    if (shard) common.push_back("--shard-optim");
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), common.begin(), common.end());
      return make_options(more);
    };
    INFO("world " << w << (shard ? " --shard-optim" : ""));
    const TrainResult four =
        run_training(with({"--steps", "4", "--out", out + "_4", "--overwrite"}), world, true);
    const TrainResult five = run_training(
        with({"--steps", "5", "--out", out + "_5", "--overwrite", "--debug-inf-grad-at-step", "4",
              "--debug-inf-grad-rank", std::to_string(w - 1)}),
        world, true);
    REQUIRE(five.skipped == std::vector<bool>{false, false, false, false, true});
    CHECK(five.loss_scales.back() == 65536.0);
    if (exact)
      REQUIRE(five.params == four.params);
    else
      REQUIRE(rel_diff(five.params, four.params) < 1e-6);
    world.barrier();
    const Options o = with({});
    const ParamLayout L(o.config);
    std::vector<float> p4(L.total()), m4(L.total()), v4(L.total());
    std::vector<float> p5(L.total()), m5(L.total()), v5(L.total());
    const CheckpointMeta meta4 =
        load_checkpoint(out + "_4/step_4", L, o.config, p4.data(), m4.data(), v4.data());
    const CheckpointMeta meta5 =
        load_checkpoint(out + "_5/step_5", L, o.config, p5.data(), m5.data(), v5.data());
    CHECK(meta4.run["adam_steps"] == 4);
    CHECK(meta5.run["adam_steps"] == 4);
    CHECK(meta4.run["loss_scale"] == 65536.0);
    CHECK(meta5.run["loss_scale"] == 32768.0);
    if (exact) {
      CHECK(p5 == p4);
      CHECK(m5 == m4);
      CHECK(v5 == v4);
    }
    // A resumed run continues from the halved scale and the checkpoint's AdamW step count.
    const TrainResult resumed =
        run_training(with({"--steps", "6", "--resume", out + "_5/step_5"}), world, true);
    REQUIRE(resumed.loss_scales.size() == 1);
    CHECK(resumed.loss_scales[0] == 32768.0);
    world.barrier();
  }
  REQUIRE_THROWS_WITH(
      run_training(make_options({"--ddp", ddp, "--batch", std::to_string(kGlobalBatch / w),
                                 "--debug-inf-grad-at-step", "2", "--debug-inf-grad-rank",
                                 std::to_string(w - 1)}),
                   world),
      Catch::Matchers::Contains("loss became"));
}

#ifdef TEST_ON_GPU
// --cuda-graph replays one recording of the step's forwards and backwards instead of launching
// their kernels one by one: the same kernels on the same buffers, so the very losses and
// parameters. Covered: gradient accumulation (a slot per micro-batch), recompute, validation
// passes between steps (they overwrite the recording's activations and tokens), the simple
// attention, and fp16's loss scaling, whose every change of scale makes a new recording. On one
// rank (each rank alone); on several it is refused on every rank.
TEST_CASE("--cuda-graph trains to the very parameters of launching each kernel", "[cuda-graph]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  MpiCommunicator self(MPI_COMM_SELF);
  for (std::vector<std::string> args : one_gpu_cases()) {
    args.insert(args.end(), {"--ddp", "none"});
    const TrainResult eager = run_training(make_options(args), self, /*keep_params=*/true);
    args.push_back("--cuda-graph");
    std::string what;
    for (const std::string& a : args) what += a + " ";
    INFO(what);
    const TrainResult graph = run_training(make_options(args), self, /*keep_params=*/true);
    check_identical(graph, eager);
    if (args[1] == "fp16") {  // the scale changed: the step was recorded more than once
      CHECK(std::count(graph.skipped.begin(), graph.skipped.end(), true) == 1);
      CHECK(graph.loss_scales.front() != graph.loss_scales.back());
    }
  }
  const int w = world.world();
  if (w > 1)
    REQUIRE_THROWS_WITH(
        run_training(make_options({"--batch", std::to_string(kGlobalBatch / w), "--cuda-graph"}),
                     world),
        ContainsSubstring("--cuda-graph runs on one rank so far"));
}

// --overlap-update runs each AdamW update on a stream of its own beside the next forward, which
// waits for each part where it first reads it: the same kernels in an order that respects every
// dependency, so the very losses and parameters of the serial update. Covered: gradient
// accumulation, validation between steps (its forward reads every part), recompute, fp32 with
// the simple attention, fp16 with a skipped update, and a checkpoint saved while an update may
// still be running, resumed without the overlap.
TEST_CASE("--overlap-update trains to the very parameters of the serial update",
          "[overlap-update]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  MpiCommunicator self(MPI_COMM_SELF);
  check_one_gpu_cases_identical("--overlap-update", "off", "on");
  // The same with the update 3 ms late (its stream idles before each): the host queues the next
  // step at once, and nothing it queues before forward's waits may touch what the update reads
  // or writes (the next step's gradients are cleared only after its first forward; validation
  // and checkpoints wait for the whole update).
  const std::vector<std::string> late = {"--debug-update-delay-us", "3000"};
  check_one_gpu_cases_identical("--overlap-update", "off", "on", late);
  // And with the norm's partial sums late (its side stream idles 0.5 ms before each): the
  // clipping factor, computed on the GPU when the update is queued at once, waits for them.
  check_one_gpu_cases_identical("--overlap-update", "off", "on", {"--debug-norm-delay-us", "500"});
  // A checkpoint of the overlapped run holds the finished update: resumed serially, it ends where
  // the serial run does, also when the update is late.
  if (world.rank() == 0) {
    const std::string out = scratch() + "/overlap_ckpt";
    const std::vector<std::string> base = {"--precision", "bf16", "--batch", "24", "--ddp", "none"};
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> v = base;
      v.insert(v.end(), extra.begin(), extra.end());
      return make_options(v);
    };
    const TrainResult whole =
        run_training(with({"--overlap-update", "off"}), self, /*keep_params=*/true);
    for (const std::string delay : {"0", "3000"}) {
      INFO("--debug-update-delay-us " << delay);
      run_training(with({"--overlap-update", "on", "--debug-update-delay-us", delay, "--out", out,
                         "--save-every", "5"}),
                   self);
      const TrainResult resumed =
          run_training(with({"--overlap-update", "off", "--resume", out + "/step_5"}), self,
                       /*keep_params=*/true);
      REQUIRE(resumed.params == whole.params);
      fs::remove_all(out);
    }
  }
  // Where it cannot apply, asking for it is refused on every rank.
  const int w = world.world();
  REQUIRE_THROWS_WITH(run_training(make_options({"--batch", std::to_string(kGlobalBatch / w),
                                                 "--overlap-update", "on", "--cuda-graph"}),
                                   world),
                      ContainsSubstring(w > 1 ? "--cuda-graph runs on one rank so far"
                                              : "--overlap-update on and --cuda-graph"));
  if (w > 1)
    REQUIRE_THROWS_WITH(run_training(make_options({"--batch", std::to_string(kGlobalBatch / w),
                                                   "--overlap-update", "on"}),
                                     world),
                        ContainsSubstring("--overlap-update on runs on one rank so far"));
}

// The benchmark of a step with the update beside forward reports the update's own time besides
// its exposed part (the optimizer phase), in the step's times, its --csv row and its --trace.
TEST_CASE("--overlap-update benchmarks report the update's time beside forward",
          "[overlap-update]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator self(MPI_COMM_SELF);
  const std::string csv = scratch() + "/overlap_bench.csv";
  const std::string trace = scratch() + "/overlap_trace.json";
  const TrainResult r =
      run_training(make_options({"--benchmark", "--mode", "train", "--ddp", "none", "--batch", "8",
                                 "--precision", "bf16", "--warmup", "2", "--steps", "4", "--csv",
                                 csv, "--trace", trace}),
                   self);
  REQUIRE(r.rank_times.size() == 4);
  double lane = 0;
  for (const std::vector<PhaseTimes>& step : r.rank_times) {
    const PhaseTimes& t = step.at(0);
    CHECK(t[static_cast<int>(Phase::kOptimizer)] >= 0);
    lane += t[kOptimizerTotal];
  }
  CHECK(lane > 0);
  std::ifstream in(csv);
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  const std::string last_columns =
      ",optimizer_total_ms,overlap_update,update_sms,sm_clock_mhz,power_w,power_capped,step_j,"
      "cap_limit_w,cap_gemm_j,cap_attention_j,cap_elementwise_j,cap_optimizer_j,cap_parts_j";
  CHECK(header.substr(header.size() - last_columns.size()) == last_columns);
  // The overlap on, no SMs reserved; then the GPU's clock, power, capped share and the steps'
  // joules, sampled where NVML is found; no parts at the cap without --floors-at-cap.
  std::vector<std::string> fields;
  for (size_t a = 0, b; a <= row.size(); a = b + 1) {
    b = std::min(row.find(',', a), row.size());
    fields.push_back(row.substr(a, b - a));
  }
  REQUIRE(fields.size() >= 12);
  const auto tail = fields.end() - 12;
  CHECK(tail[0] == "1");
  CHECK(tail[1] == "0");
  std::string why;
  if (make_power_sampler(cuda_device_pci_bus_id(0), 20, &why)) {
    CHECK(std::stod(tail[2]) > 0);
    CHECK(std::stod(tail[3]) > 0);
    CHECK(std::stod(tail[4]) >= 0);
    CHECK(std::stod(tail[5]) > 0);  // the steps' joules
  }
  for (int i = 6; i < 12; ++i) CHECK(std::stod(tail[i]) == 0);
  fs::remove(csv);
  // Every update, warm-up steps' included, is a slice on its own track of the trace.
  std::ifstream t(trace);
  const nlohmann::json events = nlohmann::json::parse(t)["traceEvents"];
  int updates = 0;
  for (const auto& e : events)
    if (e.value("tid", -1) == 2 && e.value("ph", "") == "X") {
      CHECK(e["name"] == "AdamW update");
      CHECK(e["dur"].get<double>() > 0);
      ++updates;
    }
  CHECK(updates == 6);
  fs::remove(trace);
}

// --update-sms plans forward's GEMMs beside the update for fewer SMs: the serial update's run up
// to rounding (check_sm_reservation). Where the update does not run beside forward, asking for it
// is refused.
TEST_CASE("--update-sms: forward's GEMMs on fewer SMs beside the update", "[overlap-update]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  check_sm_reservation({"--overlap-update", "off"}, {"--update-sms", "32"});
  const std::string b = std::to_string(kGlobalBatch / world.world());
  REQUIRE_THROWS_WITH(
      run_training(make_options({"--batch", b, "--overlap-update", "off", "--update-sms", "16"}),
                   world),
      ContainsSubstring("--update-sms 16 needs the update beside forward"));
}

// --wgrad-stream runs backward's weight-gradient GEMMs on a stream of their own. With 0 they are
// planned for every SM, as on the compute stream: the same kernels on the same inputs, so the very
// losses and parameters of off (every one-GPU case, and the ranks' buckets, which are reported
// ready only once the compute stream has waited for their gradients). With SMs left to the rest
// of backward, the run is off's up to rounding (check_sm_reservation).
TEST_CASE("--wgrad-stream trains to the parameters of the weight gradients in order",
          "[wgrad-stream]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  check_one_gpu_cases_identical("--wgrad-stream", "off", "0");
  // With the weight-gradient stream 0.5 ms late before each product: every write of the compute
  // stream that one of them reads waits for it.
  check_one_gpu_cases_identical("--wgrad-stream", "off", "0", {"--debug-wgrad-delay-us", "500"});
  const std::string b = std::to_string(kGlobalBatch / world.world());
  for (const char* ddp : {"bucketed", "overlap"}) {
    INFO("--ddp " << ddp);
    auto with = [&](const char* wgrad) {
      return make_options({"--precision", "bf16", "--batch", b, "--ddp", ddp, "--bucket-mb", "0.01",
                           "--wgrad-stream", wgrad});
    };
    const TrainResult a = run_training(with("off"), world, true);
    check_identical(run_training(with("0"), world, true), a);
  }
  check_sm_reservation({"--wgrad-stream", "off"}, {"--wgrad-stream", "24"});
}

// --gemm-tune picks, per product, among cuBLASLt's algorithms whose results equal its first
// choice's bit for bit: the very losses and parameters of off, on every one-GPU case and with
// the ranks' gradient buckets.
TEST_CASE("--gemm-tune trains to the very parameters of cuBLASLt's first choices", "[gemm-tune]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator world(MPI_COMM_WORLD);
  check_one_gpu_cases_identical("--gemm-tune", "off", "on");
  const std::string b = std::to_string(kGlobalBatch / world.world());
  auto with = [&](const char* tune) {
    return make_options({"--precision", "bf16", "--batch", b, "--ddp", "bucketed", "--bucket-mb",
                         "0.01", "--gemm-tune", tune});
  };
  const TrainResult off = run_training(with("off"), world, true);
  check_identical(run_training(with("on"), world, true), off);
}

// --benchmark records each mode's work (forward only, forward and backward, the whole training
// step) and still reports every phase: the step timer's events are event nodes of the recording.
TEST_CASE("--cuda-graph benchmarks every mode, with its phase times", "[cuda-graph]") {
  spdlog::set_level(spdlog::level::err);
  MpiCommunicator self(MPI_COMM_SELF);
  for (const std::string mode : {"forward", "forward-backward", "train"}) {
    INFO("--mode " << mode);
    const TrainResult r = run_training(
        make_options({"--benchmark", "--mode", mode, "--cuda-graph", "--ddp", "none", "--batch",
                      "8", "--precision", "bf16", "--warmup", "2", "--steps", "4"}),
        self);
    REQUIRE(r.rank_times.size() == 4);
    for (const std::vector<PhaseTimes>& step : r.rank_times) {
      const PhaseTimes& t = step.at(0);
      const double fwd = t[static_cast<int>(Phase::kForward)],
                   bwd = t[static_cast<int>(Phase::kBackward)],
                   opt = t[static_cast<int>(Phase::kOptimizer)];
      CHECK(fwd > 0);
      CHECK((bwd > 0) == (mode != "forward"));
      CHECK((opt > 0) == (mode == "train"));
      CHECK(t[static_cast<int>(Phase::kStep)] >= fwd + bwd + opt);
    }
  }
}
#endif
