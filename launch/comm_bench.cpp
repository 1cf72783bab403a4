// comm_bench: times the collectives the trainer's gradient sync uses, through the trainer's own
// communicators: MPI on host buffers, NCCL on device buffers. The all-reduce benchmark of the
// CS336 systems assignment, reported as nccl-tests reports it.
//
//   mpirun -np N build/comm_bench [--device cpu|cuda] [--ops all_reduce,...] [--dtypes fp32,bf16]
//                                 [--sizes 1M,25M,1G] [--warmup 5] [--iters 20] [--csv FILE]
//
// For each op × dtype × size: one checked run (every rank fills its buffer with small integers
// that depend on its rank and the index, and compares the result with the exact sum or copy),
// then `warmup` untimed and `iters` timed runs. Every timed run starts after a barrier; its time
// is the slowest rank's (host clock around the MPI call and its wait; on GPUs, CUDA events around
// the collective on NCCL's stream). Reported: median, mean, std, min and max over the timed runs;
// bandwidths from the median, as nccl-tests defines them, for S the size of the whole buffer on
// each rank (all-reduce: the buffer summed; reduce-scatter: its input; all-gather: its output;
// broadcast: the buffer) and n ranks:
//   algbw = S / t
//   busbw = algbw * 2(n-1)/n (all-reduce), * (n-1)/n (reduce-scatter, all-gather), * 1 (broadcast)
// busbw is what each rank's link carried per second, comparable across world sizes.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/mpi_init.h"
#include "core/bf16.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/csv.h"
#include "runtime/placement.h"
#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "comm/nccl_communicator.h"
#include "core/cuda_check.h"
#endif

namespace trainer {
namespace {

constexpr const char* kHeader =
    "time,backend,op,dtype,bytes,count,world,hosts,warmup,iters,median_us,mean_us,std_us,min_us,"
    "max_us,algbw_gbps,busbw_gbps,nccl_env";

#ifdef TRAINER_WITH_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

const std::vector<std::string> kOps = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};

struct Args {
  std::string device = "auto";
  std::vector<std::string> ops = kOps;
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  // 1 MiB to 1 GiB by powers of two, and the trainer's bucket sizes (25 and 100 MiB).
  std::vector<std::string> sizes = {"1M",  "2M",   "4M",   "8M",   "16M",  "25M", "32M",
                                    "64M", "100M", "128M", "256M", "512M", "1G"};
  int warmup = 5, iters = 20;
  std::string csv;
  int debug_corrupt_rank = -1;  // testing hook: this rank's checked result gets one wrong element
};

// "25M" -> 25 MiB; K, M, G are binary (KiB, MiB, GiB); no suffix: bytes.
int64_t parse_size(const std::string& s) {
  if (s.empty()) usage_error("--sizes: an empty size");
  int64_t mult = 1;
  std::string num = s;
  switch (s.back()) {
    case 'K':
    case 'k':
      mult = int64_t{1} << 10;
      break;
    case 'M':
    case 'm':
      mult = int64_t{1} << 20;
      break;
    case 'G':
    case 'g':
      mult = int64_t{1} << 30;
      break;
  }
  if (mult > 1) num.pop_back();
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (num.empty() || *end != '\0' || !(v > 0) || v * mult > 64.0 * (int64_t{1} << 30))
    usage_error("--sizes: '{}' is not a size from 1 byte to 64G (e.g. 4096, 512K, 25M, 1G)", s);
  return static_cast<int64_t>(v * mult);
}

std::string human(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", bytes / 1048576.0);
  return fmt::format("{:.2f} KiB", bytes / 1024.0);
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;  // reduce_scatter, all_gather
}

// The value rank r puts at element i in the checked run: small integers, exact in bf16 sums of
// up to 8 ranks (at most 8 * 31 = 248 < 256).
float fill_value(int r, int64_t i) { return static_cast<float>((r + 1) + (i % 7) * (r % 3 + 1)); }

struct Stats {
  double median, mean, std, min, max;
};
Stats stats_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  Stats s{};
  const size_t n = x.size();
  s.median = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  for (double v : x) s.mean += v / n;
  for (double v : x) s.std += (v - s.mean) * (v - s.mean) / n;
  s.std = std::sqrt(s.std);
  s.min = x.front();
  s.max = x.back();
  return s;
}

class Bench {
 public:
  Bench(MpiCommunicator& world, const Args& a) : world_(world), a_(a) {}
  int run();

 private:
  // One op x dtype x size: checked, then timed. Returns the time of each timed run, in us, on
  // this rank.
  std::vector<double> measure(const std::string& op, DType dtype, int64_t count);
  CommHandle launch(const std::string& op, BufferView buf);
  void fill(BufferView buf, bool pattern);
  void check(const std::string& op, BufferView buf);
  void corrupt(const std::string& op, BufferView buf);

  MpiCommunicator& world_;
  Args a_;
  DeviceKind device_ = DeviceKind::kCpu;
  Communicator* comm_ = &world_;
#ifdef TRAINER_WITH_CUDA
  std::unique_ptr<NcclCommunicator> nccl_;
  cudaStream_t stream_ = nullptr;
#endif
};

void Bench::fill(BufferView buf, bool pattern) {
  // The pattern for the checked run; zeros for the timed runs, whose repeated in-place sums would
  // otherwise grow without bound (the values do not change how long a collective takes).
  const int r = world_.rank();
  if (buf.dtype == DType::kF32) {
    std::vector<float> h(buf.count, 0.0f);
    if (pattern)
      for (int64_t i = 0; i < buf.count; ++i) h[i] = fill_value(r, i);
    copy(buf, {h.data(), buf.count, DType::kF32, DeviceKind::kCpu});
  } else {
    std::vector<uint16_t> h(buf.count, 0);
    if (pattern)
      for (int64_t i = 0; i < buf.count; ++i) h[i] = f32_to_bf16_bits(fill_value(r, i));
    copy(buf, {h.data(), buf.count, DType::kBF16, DeviceKind::kCpu});
  }
}

// Adds 1 to an element of this rank's result (the tests' proof that check() can fail).
void Bench::corrupt(const std::string& op, BufferView buf) {
  const int64_t i = op == "reduce_scatter" ? world_.rank() * (buf.count / world_.world()) : 0;
  const BufferView one = buf.slice(i, 1);
  if (buf.dtype == DType::kF32) {
    float v;
    copy({&v, 1, DType::kF32, DeviceKind::kCpu}, one);
    v += 1;
    copy(one, {&v, 1, DType::kF32, DeviceKind::kCpu});
  } else {
    uint16_t v;
    copy({&v, 1, DType::kBF16, DeviceKind::kCpu}, one);
    v = f32_to_bf16_bits(bf16_bits_to_f32(v) + 1);
    copy(one, {&v, 1, DType::kBF16, DeviceKind::kCpu});
  }
}

// Segments of `count` elements split equally over the ranks, side by side in rank order.
std::vector<Range> equal_segments(int64_t count, int n) {
  std::vector<Range> s;
  for (int r = 0; r < n; ++r) s.push_back({r * (count / n), (r + 1) * (count / n)});
  return s;
}

CommHandle Bench::launch(const std::string& op, BufferView buf) {
  const int n = world_.world();
  if (op == "all_reduce") return comm_->all_reduce_sum(buf);
  if (op == "reduce_scatter")
    return comm_->reduce_scatter_sum(buf, std::vector<int64_t>(n, buf.count / n));
  if (op == "all_gather") return comm_->all_gather(buf, equal_segments(buf.count, n));
  return comm_->broadcast(buf, 0);
}

void Bench::check(const std::string& op, BufferView buf) {
  const int r = world_.rank(), n = world_.world();
  std::vector<float> got(buf.count);
  if (buf.dtype == DType::kF32) {
    copy({got.data(), buf.count, DType::kF32, DeviceKind::kCpu}, buf);
  } else {
    std::vector<uint16_t> h(buf.count);
    copy({h.data(), buf.count, DType::kBF16, DeviceKind::kCpu}, buf);
    for (int64_t i = 0; i < buf.count; ++i) got[i] = bf16_bits_to_f32(h[i]);
  }
  const int64_t per = buf.count / n;
  int64_t lo = 0, hi = buf.count;  // the elements the op defines on this rank
  if (op == "reduce_scatter") lo = r * per, hi = lo + per;
  int64_t bad = -1;
  float want = 0;
  for (int64_t i = lo; i < hi && bad < 0; ++i) {
    if (op == "all_reduce" || op == "reduce_scatter") {
      want = 0;
      for (int k = 0; k < n; ++k) want += fill_value(k, i);
    } else if (op == "all_gather") {
      want = fill_value(static_cast<int>(i / per), i);  // rank k's segment holds k's values
    } else {
      want = fill_value(0, i);  // broadcast from rank 0
    }
    if (got[i] != want) bad = i;
  }
  // Every rank stops with the lowest failing rank's line.
  const int first = lowest_rank_where(world_, bad >= 0);
  if (first < n)
    throw std::runtime_error(world_.broadcast_string(
        bad < 0 ? ""
                : fmt::format("rank {}: {} of {} {} elements: element {} is {}, expected {}", r, op,
                              buf.count, dtype_name(buf.dtype), bad, got[bad], want),
        first));
}

std::vector<double> Bench::measure(const std::string& op, DType dtype, int64_t count) {
  DeviceBuffer buf(device_, dtype, count);
  fill(buf.view(), true);  // (all_gather: each rank's own segment counts, the rest is overwritten)
  launch(op, buf.view())->wait();
#ifdef TRAINER_WITH_CUDA
  if (stream_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    nccl_->take_records();  // the checked run's, not timed
  }
#endif
  if (world_.rank() == a_.debug_corrupt_rank) corrupt(op, buf.view());
  check(op, buf.view());
  fill(buf.view(), false);
  std::vector<double> times;
  for (int it = 0; it < a_.warmup + a_.iters; ++it) {
    world_.barrier();
    double us = 0;
    if (device_ == DeviceKind::kCpu) {
      const double t0 = MPI_Wtime();
      launch(op, buf.view())->wait();
      us = (MPI_Wtime() - t0) * 1e6;
    }
#ifdef TRAINER_WITH_CUDA
    else {
      launch(op, buf.view())->wait();
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      // The collective's own start and end events on NCCL's stream.
      const std::vector<CollectiveRecord> rec = nccl_->take_records();
      TRAINER_CHECK(rec.size() == 1, "{} collective records for one {}", rec.size(), op);
      us = (rec[0].end_ms - rec[0].start_ms) * 1e3;
    }
#endif
    if (it >= a_.warmup) times.push_back(world_.max(us));  // the slowest rank's
  }
  return times;
}

int Bench::run() {
  const int n = world_.world(), r = world_.rank();
  std::vector<int64_t> sizes;
  std::vector<DType> dtypes;
  int gpu = -1;
  agree_on_usage_errors(world_, [&] {
    for (const std::string& s : a_.sizes) sizes.push_back(parse_size(s));
    for (const std::string& op : a_.ops)
      if (std::find(kOps.begin(), kOps.end(), op) == kOps.end())
        usage_error(
            "--ops: unknown collective '{}' (all_reduce, reduce_scatter, all_gather, "
            "broadcast)",
            op);
    for (const std::string& d : a_.dtypes) {
      if (d == "fp32")
        dtypes.push_back(DType::kF32);
      else if (d == "bf16")
        dtypes.push_back(DType::kBF16);
      else
        usage_error("--dtypes: '{}' is not fp32 or bf16", d);
    }
    if (a_.iters < 1 || a_.warmup < 0)
      usage_error("--iters must be at least 1 and --warmup at least 0");
    if (a_.device == "auto") a_.device = cuda_available() ? "cuda" : "cpu";
    if (a_.device == "cuda" && !cuda_available())
      usage_error("--device cuda: {}",
                  kCudaBuilt ? "no CUDA device is visible" : "this build has no CUDA backend");
    if (a_.device != "cpu" && a_.device != "cuda")
      usage_error("--device must be auto, cpu or cuda (got '{}')", a_.device);
    if (!a_.csv.empty()) check_csv_header(a_.csv, kHeader);
  });
  const NodeRanks node = node_ranks_of(world_.comm());
  if (a_.device == "cuda") {
    device_ = DeviceKind::kCuda;
    agree_on_usage_errors(world_, [&] {
      if (node.rank >= cuda_device_count())
        usage_error(
            "rank {} is local rank {} of {} on its host, which has {} GPU(s): run at most "
            "one rank per GPU",
            r, node.rank, node.size, cuda_device_count());
    });
    gpu = node.rank;
  }
  const std::vector<RankPlace> places = gather_places(world_, this_place(node.rank, gpu));
  const int hosts = r == 0 ? host_count(places) : 0;  // rank 0 reports
#ifdef TRAINER_WITH_CUDA
  if (device_ == DeviceKind::kCuda) {
    CUDA_CHECK(cudaSetDevice(gpu));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    NcclOptions no;
    no.device = gpu;
    no.compute_stream = stream_;
    nccl_ = make_nccl_communicator(world_, no);
    comm_ = nccl_.get();
  }
#endif
  const std::string backend = device_ == DeviceKind::kCuda ? "nccl" : "mpi";
  if (r == 0) {
    std::printf(
        "comm_bench: %d rank(s) on %d host(s), %s on %s buffers; %d timed runs after %d "
        "warm-up; time = the slowest rank's, us\n",
        n, hosts, backend.c_str(), device_ == DeviceKind::kCuda ? "GPU" : "host", a_.iters,
        a_.warmup);
    for (const std::string& line : describe_places(places)) std::printf("  %s\n", line.c_str());
    std::printf("%-15s %-5s %12s %12s %10s %10s %10s %10s %11s %11s\n", "op", "dtype", "size",
                "count", "median", "mean", "min", "max", "algbw GB/s", "busbw GB/s");
  }
  for (const std::string& op : a_.ops)
    for (DType dtype : dtypes)
      for (int64_t bytes : sizes) {
        const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
        // Whole elements, rounded up to a multiple of the world size (equal segments).
        const int64_t count = (bytes / esize + n - 1) / n * n;
        const Stats s = stats_of(measure(op, dtype, count));
        const double b = static_cast<double>(count * esize);
        const double algbw = b / (s.median * 1e-6) / 1e9;
        const double busbw = algbw * bus_factor(op, n);
        if (r != 0) continue;
        std::printf("%-15s %-5s %12s %12lld %10.1f %10.1f %10.1f %10.1f %11.2f %11.2f\n",
                    op.c_str(), dtype == DType::kF32 ? "fp32" : "bf16",
                    human(count * esize).c_str(), static_cast<long long>(count), s.median, s.mean,
                    s.min, s.max, algbw, busbw);
        std::fflush(stdout);
        if (!a_.csv.empty())
          append_csv_row(
              a_.csv, kHeader,
              fmt::format("{},{},{},{},{},{},{},{},{},{},{:.2f},{:.2f},{:.2f},{:.2f},"
                          "{:.2f},{:.6g},{:.6g},{}\n",
                          std::time(nullptr), backend, op, dtype == DType::kF32 ? "fp32" : "bf16",
                          count * esize, count, n, hosts, a_.warmup, a_.iters, s.median, s.mean,
                          s.std, s.min, s.max, algbw, busbw, nccl_env_field()));
      }
#ifdef TRAINER_WITH_CUDA
  nccl_.reset();
  if (stream_) cudaStreamDestroy(stream_);
#endif
  return 0;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  using namespace trainer;
  init_mpi(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  init_logging(rank, world);
  CLI::App app{"Times the trainer's collectives (MPI on host buffers, NCCL on GPU buffers)."};
  Args a;
  app.add_option("--device", a.device, "auto (cuda when a GPU is visible), cpu or cuda")
      ->capture_default_str();
  app.add_option("--ops", a.ops, "all_reduce, reduce_scatter, all_gather, broadcast")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--dtypes", a.dtypes, "fp32, bf16")->delimiter(',')->capture_default_str();
  app.add_option("--sizes", a.sizes, "bytes per rank's whole buffer (K, M, G: binary)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed runs per size")->capture_default_str();
  app.add_option("--iters", a.iters, "timed runs per size")->capture_default_str();
  app.add_option("--csv", a.csv, "append one row per op, dtype and size");
  app.add_option("--debug-corrupt-rank", a.debug_corrupt_rank)->group("");
  int rc = 0;
  try {
    app.parse(argc, argv);
    MpiCommunicator comm(MPI_COMM_WORLD);
    rc = Bench(comm, a).run();
  } catch (const CLI::Success& e) {
    if (rank == 0) rc = app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) app.exit(e);
    rc = 2;
  } catch (const UsageError& e) {
    spdlog::error("{}", e.what());
    rc = 2;
  } catch (const std::exception& e) {  // a wrong result, a failed collective
    spdlog::error("{}", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
