#include "runtime/trainer.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "comm/grad_sync.h"
#ifdef TRAINER_WITH_CUDA
#include <nvtx3/nvToolsExt.h>

#include "comm/nccl_communicator.h"
#endif
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "model/init.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "runtime/checkpoint.h"
#include "runtime/csv.h"
#include "runtime/data.h"
#include "runtime/placement.h"
#include "runtime/safetensors.h"
#include "runtime/stop_signal.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer {
namespace {

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeLimitStop = 1000;  // beside signal numbers in the ranks' stop vote
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

BufferView host_view(std::vector<float>& v) {
  return BufferView{v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

// The file at `path` can be written: opened for appending (nothing is truncated); a file that
// the probe itself created is removed again.
void check_writable_file(const char* flag, const std::string& path) {
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) usage_error("{} {}: cannot write the file ({})", flag, path, std::strerror(errno));
  std::fclose(f);
  if (!existed) fs::remove(path, ec);
}

// Columns of a --csv benchmark row (one per run; launch/bench_table.py reads them by name).
constexpr const char* kCsvHeader =
    "time,model,d_model,d_ff,layers,heads,vocab,ctx,batch,grad_accum,world,device,precision,attn,"
    "ddp,bucket_mb,shard_optim,mode,warmup,steps,forward_ms,forward_std,backward_ms,backward_std,"
    "comm_ms,comm_std,optimizer_ms,optimizer_std,step_ms,step_std,step_median_ms,tokens_per_s,mfu,"
    "peak_mem_gib,grad_reduce,grad_transport,comm_sms,comm_total_ms,nccl_env,hosts";

// Where a resumed run sets aside the lines the interrupted run logged after its checkpoint.
constexpr const char* kSupersededMetrics = "metrics_superseded.jsonl";

// A run resumed at `step` into `out` continues its metrics.jsonl. Lines for later steps, logged
// by the interrupted run after its checkpoint (and a line torn by the interruption), are moved to
// metrics_superseded.jsonl, so that metrics.jsonl reads as one run with each step once.
void continue_metrics(const std::string& out, int64_t step) {
  const fs::path file = fs::path(out) / "metrics.jsonl";
  std::error_code ec;
  if (!fs::exists(file, ec)) return;
  std::ifstream in(file);
  if (!in) usage_error("--out {}: cannot read {}", out, file.string());
  std::string kept, superseded, line;
  int64_t moved = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                      j["step"].get<int64_t>() <= step;
    (keep ? kept : superseded) += line + "\n";
    moved += keep ? 0 : 1;
  }
  if (in.bad()) usage_error("--out {}: reading {} failed", out, file.string());
  if (moved == 0) return;
  const fs::path aside = fs::path(out) / kSupersededMetrics;
  std::ofstream side(aside, std::ios::app);
  side << superseded;
  side.close();
  if (!side)
    usage_error("--out {}: cannot write {} ({})", out, aside.string(), std::strerror(errno));
  write_file_atomic(file.string(), {{kept.data(), kept.size()}});
  spdlog::info(
      "{}: {} line(s) of metrics.jsonl written after step {} by the interrupted run moved to {}",
      step > 0 ? fmt::format("resuming at step {}", step)
               : std::string("starting afresh (no checkpoint yet)"),
      moved, step, aside.string());
}

// What a finished or interrupted run left in `out`: metrics.jsonl, model.safetensors, step_N/.
std::vector<fs::path> previous_run(const std::string& out) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "metrics.jsonl" || name == kSupersededMetrics || name == "model.safetensors" ||
        (name.rfind("step_", 0) == 0 && e.is_directory()))
      found.push_back(e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

void check_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    usage_error("--out {}: cannot create directory ({})", dir, ec.message());
  check_writable_file("--out",
                      (fs::path(dir) / (".write_test." + std::to_string(::getpid()))).string());
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

// mpirun binds each rank to one core when it starts at most 2 ranks; host-side work (initialising
// billions of parameters, checksums, the CPU backend) then runs on one core.
// Warns when the launcher left this rank few cores, and caps an OpenMP thread count far above the
// cores it may use (OMP_NUM_THREADS=100000 would crash the first parallel region).
void check_host_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  const int usable = CPU_COUNT(&set);
  if (omp_get_max_threads() > 8 * std::max(1, usable)) {
    spdlog::warn("OMP_NUM_THREADS asks for {} threads but this rank may use {} cores: using {}",
                 omp_get_max_threads(), usable, usable);
    omp_set_num_threads(std::max(1, usable));
  }
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  int local_ranks = 1;
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
    local_ranks = std::max(1, std::atoi(v));
  if (usable < online / local_ranks && usable < 4)
    spdlog::warn(
        "this rank may use only {} of {} cores (the launcher bound it); host-side work "
        "will be slow: launch with `mpirun --bind-to none` or give each rank more cores",
        usable, online);
}

// Everything one rank holds for a run.
class Run {
 public:
  Run(const Options& o, MpiCommunicator& world) : o_(o), world_(world), layout_(o.config) {}
  TrainResult execute(bool keep_params);

 private:
  void setup();
  void init_state();
  double train_step(int64_t s, PhaseTimes& times, double& grad_norm);
  // The step's phase times and collectives (for the report and --trace). After the last step it
  // first waits for the collectives still running, so that the trace has all of them.
  PhaseTimes collect_times(int64_t s, bool last);
  void write_trace();
  // Flushes metrics.jsonl; a failed write (a full disk) stops the run rather than lose metrics.
  void check_metrics_written();
  void forward_backward(int64_t step, bool backward, bool reduce);
  // Waits for the gradients (all of them) and applies AdamW to the owned range.
  void optimizer_step(int64_t s, double& grad_norm);
  // Waits, timed as exposed communication, for the gradient collectives of the units that begin
  // before flat element `end`; launches any that backward left.
  void await_grads(int64_t end);
  // Makes the parameters at offsets >= `from` current: waits for the ZeRO-1 all-gathers still
  // writing any of them. Inside forward the wait is timed as exposed communication.
  void await_params(int64_t from, bool in_forward);
  double evaluate();
  // A checkpoint source for a state of the owned range (gathered to rank 0 with ZeRO-1).
  TensorSource state_source(BufferView owned);
  void save(int64_t step_done, bool final);
  // The run's settings as a checkpoint records them (global batch, ctx, sampler, seed, ...).
  json run_settings() const;
  // `wall_ms`: rank 0's host time for the step, from its launch until every rank's times arrived
  // (the CUDA-event step time leaves out the host's work between steps).
  void log_step(int64_t s, double loss, double norm, const std::vector<PhaseTimes>& ranks,
                double wall_ms);
  void report_timing(const std::vector<std::vector<PhaseTimes>>& rank_times, int64_t skip);
  void benchmark(TrainResult& result);
  // The training loop, from start_step_ to --steps or an early stop.
  void train(TrainResult& result, Clock::time_point started);
  // Every rank's phase times of one step, on rank 0 (rows in rank order; empty elsewhere).
  std::vector<PhaseTimes> gather_times(const PhaseTimes& mine);
  // After a step: the ranks' vote to stop early, 0 to go on, else a signal number or
  // kTimeLimitStop; a collective. And rank 0's message once they have.
  int64_t vote_to_stop(const StopSignals& signals, Clock::time_point started,
                       Clock::time_point step_launched);
  void log_stop(int64_t stop, int64_t step_done, Clock::time_point started);

  const Options& o_;
  MpiCommunicator& world_;
  ParamLayout layout_;
  int rank_ = 0, nranks_ = 1;
  DeviceKind device_ = DeviceKind::kCpu;
  Precision precision_ = Precision::kFp32;
  std::string gpu_name_;           // this rank's GPU ("" on the CPU)
  std::vector<RankPlace> places_;  // every rank's host, local rank and GPU (rank 0 only)
  double peak_tflops_ = 0;         // per device, for MFU (0: not reported)
  int64_t flat_ = 0, G_ = 0;
  std::unique_ptr<Replica> replica_;
#ifdef TRAINER_WITH_CUDA
  std::unique_ptr<NcclCommunicator> nccl_;
#endif
  Communicator* grad_comm_ = nullptr;
  std::optional<ShardPlan> shards_;
  Range owned_;
  std::vector<Range> update_parts_;  // of owned_, relative to its start
  // --grad-transport ce --grad-reduce bf16 on several GPUs: the ranks exchange their bf16
  // gradients whole and the update adds every rank's copy (GradTerms) instead of an all-reduce.
  bool grad_copies_ = false;
  // ZeRO-1 all-gathers launched by the last update and not yet waited for, with the end of the
  // highest range each writes: the next forward waits for each only when it gets there.
  struct PendingGather {
    int64_t end;
    CommHandle handle;
  };
  std::vector<PendingGather> gathers_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<StepTimer> timer_;
  std::optional<TokenStream> train_, val_;
  Sampler sampler_;
  LrSchedule schedule_;
  std::vector<int32_t> inputs_, targets_;
  int64_t start_step_ = 0;
  // The checkpoint to resume from: --resume, or with --resume latest the newest in --out ("" when
  // there is none yet: a fresh start).
  std::string resume_;
  bool resume_latest_ = false;
  bool already_done_ = false;  // --resume latest found a checkpoint at --steps or later
  std::ofstream metrics_;
  std::vector<std::string> trace_;  // Chrome-trace events of this rank (JSON objects)
};

void Run::setup() {
  rank_ = world_.rank();
  nranks_ = world_.world();
  check_host_threads();
  device_ = o_.device_kind();
  precision_ = o_.precision_kind();
  G_ = o_.batch * nranks_ * o_.grad_accum;

  // Every check that can fail on bad input runs on all ranks before any compute; the lowest failing
  // rank's message reaches every rank.
  const std::string fingerprint = settings_fingerprint(o_);
  const std::string root_fingerprint = world_.broadcast_string(fingerprint, 0);
  // Collectives stay outside the checks below. Each rank takes GPU (local rank mod visible GPUs);
  // NCCL refuses two ranks on one GPU, so compare the GPUs' UUIDs first and say so plainly.
  const NodeRanks node = node_ranks_of(world_.comm());
  const int gpus = cuda_device_count();
  const int gpu = node.rank % std::max(1, gpus);  // this rank's device index
  std::string shared_gpu;
  if (nranks_ > 1) {  // the same on every rank: a collective
    const bool on_gpu = device_ == DeviceKind::kCuda && gpus > 0;
    const auto uuids = world_.gather_strings_to_root(on_gpu ? cuda_device_uuid(gpu) : "");
    for (size_t i = 0; i < uuids.size() && shared_gpu.empty(); ++i)
      for (size_t j = i + 1; j < uuids.size() && shared_gpu.empty(); ++j)
        if (!uuids[i].empty() && uuids[i] == uuids[j])
          shared_gpu = fmt::format(
              "ranks {} and {} would share one GPU (rank 0's host runs {} ranks and has {} visible "
              "GPU(s)); start at most one rank per GPU (mpirun -np / --map-by ppr:N:node) or make "
              "more GPUs visible (CUDA_VISIBLE_DEVICES)",
              i, j, node.size, gpus);
    shared_gpu = world_.broadcast_string(shared_gpu, 0);
  }
  places_ = gather_places(world_, this_place(node.rank, device_ == DeviceKind::kCuda ? gpu : -1));
  // --resume latest: rank 0 looks, so that every rank resumes from the same checkpoint.
  resume_latest_ = o_.resume == kResumeLatest && !o_.out.empty();
  resume_ = o_.resume;
  if (resume_latest_) {
    CheckpointDir latest{-1, ""};
    if (rank_ == 0)
      if (const auto all = list_checkpoints(o_.out); !all.empty()) latest = all.back();
    resume_ = world_.broadcast_string(latest.path, 0);
    already_done_ = world_.max(latest.step) >= o_.steps;  // rank 0's step; -1 elsewhere
    if (rank_ == 0 && resume_.empty())
      spdlog::info("--resume latest: no checkpoint in {} yet, starting afresh", o_.out);
  }
  agree_on_usage_errors(world_, [&] {
    const std::string diff = first_difference(root_fingerprint, fingerprint);
    if (!diff.empty())
      usage_error("rank {}'s settings differ from rank 0's: first difference {}", rank_, diff);
    if (o_.ddp == "none" && nranks_ > 1)
      usage_error(
          "--ddp none needs a single rank (world is {}); use naive, flat, overlap or "
          "bucketed",
          nranks_);
    if (device_ == DeviceKind::kCpu && precision_ != Precision::kFp32)
      usage_error("--precision {} needs --device cuda; the CPU backend is fp32",
                  precision_name(precision_));
    if (device_ == DeviceKind::kCuda && !cuda_available())
      usage_error("--device cuda: no CUDA device is visible{}",
#ifdef TRAINER_WITH_CUDA
                  ""
#else
                  " (this binary was built without the CUDA backend)"
#endif
      );
    if (!shared_gpu.empty()) usage_error("{}", shared_gpu);
    if (device_ == DeviceKind::kCpu && o_.grad_reduce != "fp32")
      usage_error("--grad-reduce {} needs --device cuda; the CPU backend reduces in fp32",
                  o_.grad_reduce);
    if (device_ == DeviceKind::kCpu && o_.grad_transport != "nccl")
      usage_error("--grad-transport {} needs --device cuda", o_.grad_transport);
    if (device_ == DeviceKind::kCpu && o_.comm_sms != 0)
      usage_error("--comm-sms {} needs --device cuda", o_.comm_sms);
    if (o_.grad_transport == "ce" && o_.grad_reduce == "bf16" && precision_ != Precision::kBf16)
      usage_error(
          "--grad-transport ce --grad-reduce bf16 keeps bf16 gradients, which needs --precision "
          "bf16 (this run: {})",
          precision_name(precision_));
    if (!o_.benchmark) {
      train_.emplace(TokenStream::open(o_.data));
      train_->check_length(o_.config.ctx);
      train_->check_vocab(o_.config.vocab);
      if (!o_.val_data.empty()) {
        val_.emplace(TokenStream::open(o_.val_data));
        val_->check_length(o_.config.ctx);
        val_->check_vocab(o_.config.vocab);
      }
    }
    if (!o_.init_from.empty() && !fs::exists(o_.init_from))
      usage_error("--init-from {}: no such file", o_.init_from);
    if (!resume_.empty() && !fs::is_directory(resume_))
      usage_error("--resume {}: no such checkpoint directory", resume_);
    if (rank_ == 0 && !o_.out.empty()) {
      check_writable_dir(o_.out);
      const auto prev = previous_run(o_.out);
      // --resume latest before the first checkpoint: a run that logged metrics only starts again.
      const bool only_metrics = std::all_of(prev.begin(), prev.end(), [](const fs::path& p) {
        return p.filename() == "metrics.jsonl" || p.filename() == kSupersededMetrics;
      });
      if (!prev.empty() && resume_.empty() && !o_.overwrite && !o_.benchmark &&
          !(resume_latest_ && only_metrics)) {
        const std::string latest = latest_checkpoint(o_.out);
        usage_error(
            "--out {} already holds a run ({}{}): continue it with --resume {}, pick another "
            "--out, or pass --overwrite to replace it",
            o_.out, prev.front().filename().string(),
            prev.size() > 1 ? fmt::format(" and {} more", prev.size() - 1) : "",
            latest.empty() ? "DIR/step_N" : latest);
      }
    }
    if (rank_ == 0 && !o_.trace.empty()) check_writable_file("--trace", o_.trace);
    if (rank_ == 0 && o_.benchmark && !o_.csv.empty()) {
      check_writable_file("--csv", o_.csv);
      check_csv_header(o_.csv, kCsvHeader);
    }
    if (device_ == DeviceKind::kCpu) {
      // The CPU replica's flat buffers (weights and gradients, fp32) and the optimizer state
      // (12 B/param, or its shard) alone, before activations: refuse what cannot fit.
      const int local = std::max(1, node.size);
      const double need = static_cast<double>(layout_.param_count()) *
                          (8.0 + 12.0 / (o_.shard_optim ? nranks_ : 1)) * local;
      const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
      if (have > 0 && need > have)
        usage_error(
            "the model's {:.0f}M parameters need at least {:.1f} GiB of host memory for {} "
            "rank(s) on this host (weights, gradients, AdamW state); it has {:.1f} GiB",
            layout_.param_count() / 1e6, need / 1073741824.0, local, have / 1073741824.0);
    }
    schedule_ = LrSchedule{o_.lr, o_.min_lr, o_.warmup, o_.steps};
    if (!o_.benchmark) schedule_.validate();
  });
  // Every rank must read the same tokens (a shared file system): compare the counts.
  for (const auto* data : {&train_, &val_}) {
    const int64_t n = *data ? (*data)->size() : 0;
    const int64_t most = world_.max(n), least = -world_.max(-n);
    agree_on_usage_errors(world_, [&] {
      if (most != least && n != least)
        usage_error(
            "'{}' holds {} tokens on rank {} but {} on another rank: every rank must read "
            "the same files (a shared file system)",
            (*data)->spec(), n, rank_, least);
    });
  }
  if (rank_ == 0 && !o_.benchmark && o_.warmup > o_.steps)
    spdlog::warn("--warmup {} > --steps {}: the learning rate never reaches --lr {}", o_.warmup,
                 o_.steps, o_.lr);
  if (rank_ == 0 && !o_.out.empty() && !o_.overwrite) {
    // A save killed mid-write leaves its step_N.tmp-PID (or, mid-swap, step_N.old-PID) behind.
    std::string partial;
    for (const fs::path& p : previous_run(o_.out))
      if (const std::string n = p.filename().string();
          n.find(".tmp-") != std::string::npos || n.find(".old-") != std::string::npos)
        partial += (partial.empty() ? "" : ", ") + n;
    if (!partial.empty())
      spdlog::warn(
          "--out {} holds what interrupted saves left ({}): not checkpoints, safe to delete",
          o_.out, partial);
  }
  agree_on_usage_errors(world_, [&] {
    if (rank_ != 0 || !o_.overwrite || o_.out.empty() || o_.benchmark) return;
    const auto prev = previous_run(o_.out);
    if (!prev.empty()) spdlog::warn("--overwrite: deleting the run in {}", o_.out);
    for (const fs::path& p : prev) {
      std::error_code ec;
      fs::remove_all(p, ec);
      if (ec) usage_error("--overwrite: cannot delete {}: {}", p.string(), ec.message());
    }
  });

  if (device_ == DeviceKind::kCuda) gpu_name_ = cuda_device_name(gpu);
  peak_tflops_ = o_.peak_tflops > 0 ? o_.peak_tflops : peak_tflops(gpu_name_, precision_);
  if (rank_ == 0 && device_ == DeviceKind::kCuda && peak_tflops_ <= 0)
    spdlog::warn("MFU not reported: no known peak TFLOP/s of a {} at {}; pass --peak-tflops",
                 gpu_name_, precision_name(precision_));

  // Flat buffers are padded so that `world` equal aligned shards cover them.
  flat_ = layout_.padded_total(nranks_);
  if (o_.shard_optim) shards_.emplace(nranks_, flat_, ParamLayout::kAlignElems);
  owned_ = shards_ ? shards_->shard(rank_) : Range{0, flat_};

  TensorRanges tensors;
  for (const auto& t : layout_.tensors()) tensors.push_back(t.range());
  const SyncStrategy strategy = parse_sync_strategy(o_.ddp);
  const double bucket_bytes = o_.bucket_mb * 1048576.0;
  // ZeRO-1 with an overlapping strategy also overlaps its parameter all-gather, with the update.
  const bool pipelined_gather =
      shards_ && nranks_ > 1 &&
      (strategy == SyncStrategy::kBucketed || strategy == SyncStrategy::kOverlap);
  update_parts_ = plan_update_parts(owned_.size(), pipelined_gather ? bucket_bytes : 0,
                                    ParamLayout::kAlignElems);

  ReplicaOptions ro;
  ro.max_batch = o_.batch;
  ro.flat_elems = flat_;
  ro.precision = precision_;
  ro.attention = o_.attention;
  ro.optimizer_elems = owned_.size();
  grad_copies_ = device_ == DeviceKind::kCuda && nranks_ > 1 && o_.grad_transport == "ce" &&
                 o_.grad_reduce == "bf16";
  if (grad_copies_) {
    ro.grad_dtype = DType::kBF16;
    ro.grad_copies = nranks_ - 1;
  }
  if (device_ == DeviceKind::kCuda) {
    ro.device_index = gpu;
    // Only strategies that run collectives during backward share the SMs with it.
    if (nranks_ > 1 && (strategy == SyncStrategy::kBucketed || strategy == SyncStrategy::kOverlap))
      ro.comm_sms = o_.comm_sms;
  }
  agree_on_usage_errors(world_, [&] {
    replica_ = device_ == DeviceKind::kCpu ? make_cpu_replica(o_.config, ro)
                                           : make_cuda_replica(o_.config, ro);
  });
  // Collectives on host buffers go through MPI, on device buffers through NCCL.
  grad_comm_ = &world_;
#ifdef TRAINER_WITH_CUDA
  if (device_ == DeviceKind::kCuda && nranks_ > 1) {
    NcclOptions no;
    no.device = ro.device_index;
    no.compute_stream = replica_->stream();
    no.reduce_in_bf16 = o_.grad_reduce == "bf16" && !grad_copies_;
    // bf16 scratch for the largest unit that is reduced at once.
    if (no.reduce_in_bf16)
      for (const GradUnit& u : plan_units(strategy, tensors, flat_, bucket_bytes))
        no.staging_elems = std::max(no.staging_elems, u.range.size());
    no.timeout_s = o_.comm_timeout;
    no.ctas = o_.comm_sms;
    if (o_.grad_transport == "ce") {
      if (rank_ == 0 && nranks_ > 2 && grad_copies_)
        spdlog::warn(
            "--grad-transport ce --grad-reduce bf16 on {} ranks: each rank receives the whole "
            "gradient of each of {} peers, which measured 1.48x the ZeRO-1 step on 4 H200s "
            "(docs/performance.md); it pays off on 2 GPUs",
            nranks_, nranks_ - 1);
      else if (rank_ == 0 && nranks_ > 2)
        spdlog::warn(
            "--grad-transport ce on {} ranks: each rank sums its segment of every bucket from {} "
            "peers' copies, which measured 1.3-1.8x slower steps than nccl on 4 H200s "
            "(docs/performance.md); it pays off on 2 GPUs",
            nranks_, nranks_ - 1);
      if (grad_copies_)
        no.peer_copies = replica_->grads();
      else
        no.peer_copy = replica_->grads();
      if (shards_) no.peer_gather = replica_->params();  // ZeRO-1's all-gather too
    }
    nccl_ = make_nccl_communicator(world_, no);
    grad_comm_ = nccl_.get();
  }
#endif

  agree_on_usage_errors(
      world_, [&] { opt_ = std::make_unique<AdamW>(device_, owned_.size(), o_.adamw()); });

  sync_ = std::make_unique<GradSync>(*grad_comm_, tensors, replica_->grads(), strategy,
                                     bucket_bytes, shards_ ? &*shards_ : nullptr, grad_copies_);
  timer_ = make_step_timer(device_, replica_->stream());
#ifdef TRAINER_WITH_CUDA
  if (nccl_) nccl_->set_origin(timer_->origin_event());
#endif
  inputs_.resize(o_.batch * o_.config.ctx);
  targets_.resize(o_.batch * o_.config.ctx);
  if (train_) {
    sampler_ = Sampler{parse_sampler(o_.sampler), o_.seed, train_->size(), o_.config.ctx, G_};
  }

  // What this run holds, printed once.
  const std::vector<double> opt_bytes = [&] {
    auto rows =
        world_.gather_to_root(std::vector<double>{static_cast<double>(opt_->state_bytes())});
    std::vector<double> v;
    for (auto& r : rows) v.push_back(r[0]);
    return v;
  }();
  if (rank_ == 0) {
    const ModelConfig& c = o_.config;
    spdlog::info("model {}: {} | {:.2f}M parameters", o_.model, describe(c),
                 layout_.param_count() / 1e6);
    spdlog::info(
        "run: {} rank(s) on {} | precision {} | batch {} x ctx {} per rank, grad-accum {}, "
        "global batch {} sequences = {} tokens/step",
        nranks_, device_ == DeviceKind::kCuda ? fmt::format("cuda ({})", gpu_name_) : "cpu",
        precision_name(precision_), o_.batch, c.ctx, o_.grad_accum, G_, G_ * c.ctx);
    const int hosts = host_count(places_);
    for (const std::string& line : describe_places(places_))
      spdlog::info("placement: {} host{} | {}", hosts, hosts > 1 ? "s" : "", line);
    const std::string attention = replica_->attention_kernel();
    if (device_ == DeviceKind::kCuda && o_.attention == "flash" && attention.rfind("flash", 0) != 0)
      spdlog::warn("attention: {}", attention);
    else
      spdlog::info("attention: {}", attention);
    const double pbytes = static_cast<double>(replica_->params().bytes());
    const double gbytes = static_cast<double>(replica_->grads().bytes());
    const double grad_buffers = grad_copies_ ? nranks_ : 1;  // own, and one per peer
    const double abytes = static_cast<double>(replica_->activation_bytes());
    spdlog::info(
        "memory per rank: params {} ({}) | grads {} ({}{}) | optimizer state {} | "
        "activations {} | total {}",
        mib(pbytes), dtype_name(replica_->params().dtype), mib(gbytes * grad_buffers),
        dtype_name(replica_->grads().dtype),
        grad_copies_ ? fmt::format(": this rank's and {} peer cop{}", nranks_ - 1,
                                   nranks_ == 2 ? "y" : "ies")
                     : "",
        mib(opt_bytes[0]), mib(abytes),
        mib(pbytes + gbytes * grad_buffers + opt_bytes[0] + abytes));
    std::string per_rank;
    for (size_t r = 0; r < opt_bytes.size(); ++r)
      per_rank += fmt::format("{}rank {}: {}", r ? ", " : "", r, mib(opt_bytes[r]));
    spdlog::info("optimizer state (fp32 master + m + v = 12 B/param{}): {}",
                 shards_ ? fmt::format(" / {} ranks, ZeRO-1", nranks_) : std::string(", unsharded"),
                 per_rank);
    spdlog::info("gradient sync: --ddp {}{} | {}", sync_strategy_name(strategy),
                 shards_        ? " + reduce-scatter (ZeRO-1)"
                 : grad_copies_ ? " + whole bf16 copies by copy engines, added in the update"
                                : "",
                 describe_units(sync_->units()));
    if (shards_ && nranks_ > 1)
      spdlog::info(
          "ZeRO-1 parameter all-gather: {} part(s) of up to {:.2f} MiB of parameters "
          "per rank{}",
          update_parts_.size(),
          update_parts_[0].size() * dtype_size(replica_->params().dtype) / 1048576.0,
          update_parts_.size() > 1 ? ", each sent while the next is updated" : "");
    if (o_.out.empty() && !o_.benchmark)
      spdlog::warn("no --out directory: no metrics, checkpoints or final weights will be written");
  }
}

void Run::init_state() {
  // Rank 0's parameters are everyone's: fresh init, --init-from, or --resume. Every rank makes or
  // reads them itself (the init is a pure function of the seed; files are on a shared file
  // system), then a checksum shows they agree with rank 0's; only if one differs are rank 0's
  // broadcast -- through MPI, which moves gigabytes slowly.
  std::vector<float> params(flat_, 0.0f);
  std::optional<CheckpointMeta> meta;
  agree_on_usage_errors(world_, [&] {
    if (!resume_.empty()) {
      // The moments of this rank's range only (a quarter of them on 4 ZeRO-1 ranks).
      std::vector<float> m(owned_.size(), 0.0f), v(owned_.size(), 0.0f);
      meta =
          load_checkpoint(resume_, layout_, o_.config, params.data(), m.data(), v.data(), owned_);
      if (meta->step >= o_.steps)
        usage_error("checkpoint {} is at step {} but --steps is {}: nothing left to train", resume_,
                    meta->step, o_.steps);
      copy(opt_->exp_avg(), host_view(m));
      copy(opt_->exp_avg_sq(), host_view(v));
      start_step_ = meta->step;
      // What decides the data stream (SPEC: the batches are a function of these and the step).
      const json now = run_settings();
      std::string differ;
      for (const char* key : {"global_batch", "ctx", "sampler", "seed", "data"}) {
        const json saved = meta->run.contains(key) ? meta->run[key] : json();
        if (saved != now[key])
          differ += fmt::format("{}{} {} (now {})", differ.empty() ? "" : ", ", key, saved.dump(),
                                now[key].dump());
      }
      if (rank_ == 0 && !differ.empty())
        spdlog::warn(
            "the checkpoint was written with other data settings: {}; training continues, but "
            "not on the batches the uninterrupted run would have seen",
            differ);
    } else if (!o_.init_from.empty()) {
      load_model(o_.init_from, layout_, o_.config, params.data());
    } else {
      init_params(layout_, o_.seed, params.data());
    }
  });
  const double sum =
      static_cast<double>(checksum64(params.data(), params.size() * sizeof(float)) >> 11);
  const double root_sum = world_.max(rank_ == 0 ? sum : -1.0);
  if (world_.max(sum != root_sum ? 1.0 : 0.0) > 0) {
    if (rank_ == 0) spdlog::warn("initial parameters differ between ranks: broadcasting rank 0's");
    world_.broadcast(host_view(params), 0)->wait();
  }
  replica_->set_params(params.data());
  copy(opt_->master(), host_view(params).slice(owned_.begin, owned_.size()));
  if (rank_ == 0 && !meta && !o_.init_from.empty())
    spdlog::info("initial weights from {}", o_.init_from);
  if (rank_ == 0 && meta && !o_.out.empty()) {
    std::string newer;
    for (const CheckpointDir& c : list_checkpoints(o_.out))
      if (c.step > start_step_) newer += (newer.empty() ? "" : ", ") + c.path;
    if (!newer.empty())
      spdlog::warn(
          "--out {} holds checkpoints newer than the one resumed from ({}); this run writes over "
          "those of the steps it saves, and --resume latest would pick the newest",
          o_.out, newer);
  }
  if (rank_ == 0 && meta)
    spdlog::info("resumed from {} at step {} (written by {} rank(s))", resume_, start_step_,
                 meta->run.contains("world") ? meta->run["world"].dump() : "?");
}

void Run::forward_backward(int64_t step, bool backward, bool reduce) {
  const int64_t T = o_.config.ctx;
  const int64_t rows_per_rank = o_.batch * o_.grad_accum;
  const float scale = 1.0f / static_cast<float>(G_ * T);  // d(mean over G*T tokens)/d(token loss)
  for (int64_t k = 0; k < o_.grad_accum; ++k) {
    {
      PhaseScope p(*timer_, Phase::kData);
      if (train_) {
        fill_rows(*train_, sampler_, step, rank_ * rows_per_rank + k * o_.batch, o_.batch,
                  inputs_.data(), targets_.data());
      } else {  // --benchmark: synthetic tokens, a pure function of (seed, step, rank, k)
        uint64_t x = o_.seed ^ (static_cast<uint64_t>(step) << 20) ^ (rank_ * 7919 + k);
        for (size_t i = 0; i < inputs_.size(); ++i) {
          x = x * 6364136223846793005ULL + 1442695040888963407ULL;
          inputs_[i] = static_cast<int32_t>((x >> 33) % o_.config.vocab);
          targets_[i] = static_cast<int32_t>((x >> 13) % o_.config.vocab);
        }
      }
    }
    const MicroBatch mb{inputs_.data(), targets_.data(), o_.batch, T};
    {
      PhaseScope p(*timer_, Phase::kForward);
      replica_->forward(mb, [this](int64_t offset) { await_params(offset, true); });
    }
    if (!backward) continue;
    PhaseScope p(*timer_, Phase::kBackward);
    sync_->begin_backward(reduce && k == o_.grad_accum - 1);
    replica_->backward(scale, [this](int i) { sync_->on_ready(i); });
  }
}

void Run::await_params(int64_t from, bool in_forward) {
  std::vector<CommHandle> due;
  for (auto it = gathers_.begin(); it != gathers_.end();) {
    if (it->end > from) {
      due.push_back(std::move(it->handle));
      it = gathers_.erase(it);
    } else {
      ++it;
    }
  }
  if (!due.empty()) {
    if (!in_forward) return wait_all(due);
    timer_->end(Phase::kForward);
    {
      PhaseScope p(*timer_, Phase::kComm);
      wait_all(due);
    }
    timer_->begin(Phase::kForward);
  }
  if (!gathers_.empty()) grad_comm_->progress();  // MPI moves data only inside MPI calls
}

void Run::optimizer_step(int64_t s, double& grad_norm) {
  await_params(0, false);  // normally done: forward reads every parameter
  // The averaged gradient of the owned range: the reduced buffer, or every rank's bf16 copy.
  GradTerms grads{replica_->grads().slice(owned_.begin, owned_.size())};
#ifdef TRAINER_WITH_CUDA
  if (grad_copies_) {
    grads.clear();
    for (int r = 0; r < nranks_; ++r)
      grads.push_back(nccl_->copy_of(r).slice(owned_.begin, owned_.size()));
  }
#endif
  auto part_of = [&](const Range& part) {
    GradTerms t;
    for (const BufferView& g : grads) t.push_back(g.slice(part.begin, part.size()));
    return t;
  };
  BufferView params = replica_->params().slice(owned_.begin, owned_.size());
  const bool gather = shards_ && nranks_ > 1;
  // The last unit's collective (the embedding's, which backward finalises last) still runs while
  // the norm of everything before it is computed.
  const int64_t last = sync_->units().empty() ? flat_ : sync_->units().back().range.begin;
  const int64_t split = std::clamp(last, owned_.begin, owned_.end) - owned_.begin;
  await_grads(last);
  {
    PhaseScope p(*timer_, Phase::kOptimizer);
#ifdef TRAINER_WITH_CUDA
    nvtxRangePushA("optimizer");  // so nsys timelines show the step like the code reads
#endif
    // Global norm of the averaged gradient: each rank holds the whole of it, or (ZeRO-1) its shard.
    double sq = sum_squares(part_of({0, split}), replica_->stream());
    timer_->end(Phase::kOptimizer);
    await_grads(flat_);
    timer_->begin(Phase::kOptimizer);
    sq += sum_squares(part_of({split, owned_.size()}), replica_->stream());
    if (gather) sq = world_.sum(sq);
    grad_norm = std::sqrt(sq);
    const float clip = clip_scale(grad_norm, o_.clip);
    // ZeRO-1: part k of every rank's slice is all-gathered while part k+1 is updated, and the
    // next forward waits for a part only when it reaches it. Parts run from the end of the slices
    // to their start, the order forward reads the buffer (the embedding is last in it).
    for (auto part = update_parts_.rbegin(); part != update_parts_.rend(); ++part) {
      opt_->step_part(*part, part_of(*part), params.slice(part->begin, part->size()),
                      schedule_.at(s), s + 1, clip, replica_->stream());
      if (!gather) continue;
      std::vector<Range> segments;
      int64_t end = 0;
      for (int r = 0; r < nranks_; ++r) {
        segments.push_back(
            {shards_->shard(r).begin + part->begin, shards_->shard(r).begin + part->end});
        end = std::max(end, segments.back().end);
      }
      gathers_.push_back({end, grad_comm_->all_gather(replica_->params(), segments)});
    }
#ifdef TRAINER_WITH_CUDA
    nvtxRangePop();
#endif
  }
}

void Run::await_grads(int64_t end) {
  PhaseScope p(*timer_, Phase::kComm);
  sync_->finish_before(end);
}

double Run::train_step(int64_t s, PhaseTimes& times, double& grad_norm) {
  timer_->begin(Phase::kStep);
  replica_->zero_grads();
  forward_backward(s, /*backward=*/true, /*reduce=*/true);
  optimizer_step(s, grad_norm);
  timer_->end(Phase::kStep);
  const double loss = world_.sum(replica_->take_loss()) / nranks_;
  times = collect_times(s, s + 1 == o_.steps);
  return loss;
}

PhaseTimes Run::collect_times(int64_t s, bool last) {
  PhaseTimes times = timer_->collect();
  if (last) {
    await_params(0, false);
    replica_->synchronize();
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> collectives;
#ifdef TRAINER_WITH_CUDA
  if (nccl_)
    for (const CollectiveRecord& r : nccl_->take_records()) {
      times[kCommTotal] += r.end_ms - r.start_ms;
      collectives.push_back({r.name, {r.start_ms, r.end_ms}});
    }
#endif
  if (!o_.trace.empty()) {
    // One process per rank, one track per stream (tid 0 compute, 1 communication).
    auto event = [&](const std::string& name, int tid, double a, double b) {
      trace_.push_back(json{{"name", name},
                            {"ph", "X"},
                            {"pid", rank_},
                            {"tid", tid},
                            {"ts", a * 1e3},
                            {"dur", (b - a) * 1e3},
                            {"args", {{"step", s + 1}}}}
                           .dump());
    };
    for (const PhaseInterval& iv : timer_->intervals())
      if (iv.phase != Phase::kStep) event(phase_name(iv.phase), 0, iv.start_ms, iv.end_ms);
    for (const auto& [name, t] : collectives) event(name, 1, t.first, t.second);
  }
  return times;
}

json Run::run_settings() const {
  return {{"global_batch", G_}, {"ctx", o_.config.ctx}, {"sampler", o_.sampler},
          {"seed", o_.seed},    {"world", nranks_},     {"shard_optim", o_.shard_optim},
          {"lr", o_.lr},        {"min_lr", o_.min_lr},  {"warmup", o_.warmup},
          {"steps", o_.steps},  {"data", o_.data}};
}

void Run::check_metrics_written() {
  metrics_.flush();
  if (!metrics_)
    usage_error("{}: writing failed ({})", (fs::path(o_.out) / "metrics.jsonl").string(),
                std::strerror(errno));
}

void Run::write_trace() {
  if (o_.trace.empty()) return;
  std::string mine;
  for (size_t i = 0; i < trace_.size(); ++i) mine += (i ? ",\n" : "") + trace_[i];
  const auto all = world_.gather_strings_to_root(mine);
  if (rank_ != 0) return;
  std::ofstream f(o_.trace);
  if (!f) usage_error("--trace {}: cannot open the file for writing", o_.trace);
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (int r = 0; r < nranks_; ++r) {
    for (const auto& [tid, label] : {std::pair{0, "compute stream"}, std::pair{1, "comm stream"}}) {
      f << (first ? "" : ",\n")
        << json{{"name", "thread_name"},
                {"ph", "M"},
                {"pid", r},
                {"tid", tid},
                {"args", {{"name", label}}}}
               .dump();
      first = false;
    }
    f << ",\n"
      << json{{"name", "process_name"},
              {"ph", "M"},
              {"pid", r},
              {"args", {{"name", fmt::format("rank {}", r)}}}}
             .dump();
    if (!all[r].empty()) f << ",\n" << all[r];
  }
  f << "\n]}\n";
  f.close();
  if (!f) usage_error("--trace {}: writing failed ({})", o_.trace, std::strerror(errno));
  spdlog::info("trace written: {} (open in https://ui.perfetto.dev)", o_.trace);
}

double Run::evaluate() {
  await_params(0, false);
  const int64_t T = o_.config.ctx;
  const Sampler vs{SamplerKind::kSequential, o_.seed, val_->size(), T, G_};
  const int64_t rows_per_rank = o_.batch * o_.grad_accum;
  double sum = 0;
  for (int64_t e = 0; e < o_.eval_batches; ++e) {
    for (int64_t k = 0; k < o_.grad_accum; ++k) {
      fill_rows(*val_, vs, e, rank_ * rows_per_rank + k * o_.batch, o_.batch, inputs_.data(),
                targets_.data());
      sum += replica_->evaluate({inputs_.data(), targets_.data(), o_.batch, T});
    }
  }
  return world_.sum(sum) / static_cast<double>(nranks_ * o_.eval_batches * o_.grad_accum);
}

TensorSource Run::state_source(BufferView owned) {
  return [this, owned](const ParamTensor& t, float* out) {
    // This rank's part of the tensor (all of it unless sharded), from device or host memory.
    const Range mine = t.range().intersect(owned_);
    if (!shards_ || nranks_ == 1) {
      if (out)
        copy(BufferView{out, t.numel, DType::kF32, DeviceKind::kCpu},
             owned.slice(mine.begin - owned_.begin, mine.size()));
      return;
    }
    std::vector<float> piece(mine.size());
    if (!mine.empty()) copy(host_view(piece), owned.slice(mine.begin - owned_.begin, mine.size()));
    // Shards are consecutive in rank order, so the parts arrive in the tensor's order.
    world_.gather_to_root(piece.data(), mine.size(), out);
  };
}

void Run::save(int64_t step_done, bool final) {
  if (o_.out.empty()) return;
  // Tensor by tensor: rank 0 holds one tensor of one state at a time, never the whole model.
  const TensorSource params = state_source(opt_->master());
  const TensorSource exp_avg = state_source(opt_->exp_avg());
  const TensorSource exp_avg_sq = state_source(opt_->exp_avg_sq());
  const bool write = rank_ == 0;
  CheckpointMeta meta;
  meta.step = step_done;
  meta.config = config_to_json(o_.config);
  meta.run = run_settings();
  const std::string dir = (fs::path(o_.out) / fmt::format("step_{}", step_done)).string();
  const std::string weights = final ? (fs::path(o_.out) / "model.safetensors").string() : "";
  std::string failure;
  try {
    save_checkpoint(dir, layout_, params, exp_avg, exp_avg_sq, meta, write, weights);
  } catch (const UsageError& e) {  // the writer's I/O; the collectives ran to the end
    failure = e.what();
  }
  agree_on_error_message(world_, failure);  // every rank stops with the writer's message
  if (!write) return;
  spdlog::info("checkpoint written: {}", dir);
  if (final) spdlog::info("final weights: {}", weights);
  // --keep-last K: the K-1 newest checkpoints before this one stay. Newer ones (left by a run
  // that went further before this one resumed from an older checkpoint) are not touched.
  if (o_.keep_last <= 0) return;
  std::vector<CheckpointDir> older;
  for (const CheckpointDir& c : list_checkpoints(o_.out))
    if (c.step < step_done) older.push_back(c);
  const size_t keep_older = static_cast<size_t>(o_.keep_last - 1);
  for (size_t i = 0; i + keep_older < older.size(); ++i) {
    std::error_code ec;
    fs::remove_all(older[i].path, ec);
    if (ec)
      spdlog::warn("--keep-last {}: cannot delete {}: {}", o_.keep_last, older[i].path,
                   ec.message());
    else
      spdlog::info("--keep-last {}: deleted {}", o_.keep_last, older[i].path);
  }
}

void Run::log_step(int64_t s, double loss, double norm, const std::vector<PhaseTimes>& ranks,
                   double wall_ms) {
  const auto step_idx = static_cast<int>(Phase::kStep);
  std::vector<double> step_ms;
  size_t slowest = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    step_ms.push_back(ranks[r][step_idx]);
    if (ranks[r][step_idx] > ranks[slowest][step_idx]) slowest = r;
  }
  const double ms = step_ms[slowest];  // the step is as slow as its slowest rank
  const double tokens = static_cast<double>(G_ * o_.config.ctx);
  const double tok_s = tokens / (ms / 1e3);
  const double peak = peak_tflops_;
  const double mfu =
      peak > 0 ? tok_s * flops_per_token(o_.config, o_.config.ctx) / (nranks_ * peak * 1e12) : 0;
  const double lr = schedule_.at(s);
  if (metrics_.is_open()) {
    json j = {{"step", s + 1},         {"loss", loss},  {"lr", lr},          {"grad_norm", norm},
              {"tokens_per_s", tok_s}, {"step_ms", ms}, {"wall_ms", wall_ms}};
    if (peak > 0) j["mfu"] = mfu;
    json per_rank = json::array();
    for (size_t k = 0; k < ranks.size(); ++k) {
      const PhaseTimes& t = ranks[k];
      json r = {{"host", places_[k].host}};
      for (int p = 0; p <= kCommTotal; ++p) r[std::string(time_slot_name(p)) + "_ms"] = t[p];
      per_rank.push_back(r);
    }
    j["ranks"] = per_rank;
    metrics_ << j.dump() << "\n";
    check_metrics_written();
  }
  if ((s + 1) % o_.log_every != 0 && s + 1 != o_.steps && s != start_step_) return;
  std::string timing = fmt::format("step {:.1f} ms (wall {:.1f})", ms, wall_ms);
  if (nranks_ > 1)
    timing += fmt::format(" (ranks min {:.1f} / median {:.1f} / max {:.1f}, slowest rank {})",
                          *std::min_element(step_ms.begin(), step_ms.end()), median(step_ms), ms,
                          slowest);
  spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s{} | {}",
               s + 1, o_.steps, loss, lr, norm, tok_s,
               peak > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", timing);
}

void Run::report_timing(const std::vector<std::vector<PhaseTimes>>& rank_times, int64_t skip) {
  if (rank_ != 0 || rank_times.empty()) return;
  const int64_t n = static_cast<int64_t>(rank_times.size());
  if (n <= skip) skip = 0;
  spdlog::info("per-rank step timings, ms, mean ± std over {} steps{}:", n - skip,
               o_.benchmark ? fmt::format(" (after {} warm-up steps)", o_.warmup)
                            : fmt::format(" (first {} left out, --timing-warmup)", skip));
  // Total collective time is measured on GPUs (CUDA events on the comm stream) only.
  const int slots = grad_comm_ != &world_ ? kCommTotal + 1 : kNumPhases;
  size_t host_width = 4;
  for (const RankPlace& p : places_) host_width = std::max(host_width, p.host.size());
  std::string head = fmt::format("{:>6} {:<{}}", "rank", "host", host_width);
  for (int p = 0; p < slots; ++p) head += fmt::format(" {:>17}", time_slot_name(p));
  spdlog::info("{}", head);
  for (int r = 0; r < nranks_; ++r) {
    std::string row = fmt::format("{:>6} {:<{}}", r, places_[r].host, host_width);
    for (int p = 0; p < slots; ++p) {
      std::vector<double> xs;
      for (int64_t s = skip; s < n; ++s) xs.push_back(rank_times[s][r][p]);
      const MeanStd ms = mean_std(xs);
      row += fmt::format(" {:>9.2f} ± {:<5.2f}", ms.mean, ms.std);
    }
    spdlog::info("{}", row);
  }
}

TrainResult Run::execute(bool keep_params) {
  const auto started = Clock::now();  // for --time-limit
  setup();
  TrainResult result;
  if (already_done_) {  // --resume latest of a run that has finished: nothing to do, exit 0
    if (rank_ == 0)
      spdlog::info("--resume latest: {} is at --steps {} already; nothing left to train", resume_,
                   o_.steps);
    return result;
  }
  init_state();
  // From here on every rank waits in MPI only for the others' steps: a wait longer than
  // --comm-timeout means a peer is gone (on GPUs NCCL's collectives are watched as well).
  world_.set_wait_limit(o_.comm_timeout);
  struct Disarm {
    MpiCommunicator& world;
    ~Disarm() { world.set_wait_limit(0); }
  } disarm{world_};
  result.first_step = start_step_;
  if (o_.benchmark)
    benchmark(result);
  else
    train(result, started);
  write_trace();
  if (keep_params) {
    result.params.assign(flat_, 0.0f);  // padding stays zero, as in the master weights
    const TensorSource master = state_source(opt_->master());
    for (const ParamTensor& t : layout_.tensors())
      master(t, rank_ == 0 ? result.params.data() + t.offset : nullptr);
    world_.broadcast(host_view(result.params), 0)->wait();
  }
  return result;
}

std::vector<PhaseTimes> Run::gather_times(const PhaseTimes& mine) {
  std::vector<PhaseTimes> ranks;
  for (const auto& row : world_.gather_to_root(std::vector<double>(mine.begin(), mine.end()))) {
    PhaseTimes t;
    std::copy(row.begin(), row.end(), t.begin());
    ranks.push_back(t);
  }
  return ranks;
}

int64_t Run::vote_to_stop(const StopSignals& signals, Clock::time_point started,
                          Clock::time_point step_launched) {
  // A signal may reach the ranks at different times: any rank's stops them all. Rank 0's clock
  // decides the time limit: stop when one more step like this one would end past it.
  const double minutes = (ms_since(started) + ms_since(step_launched)) / 60e3;
  const bool out_of_time = rank_ == 0 && o_.time_limit_min > 0 && minutes >= o_.time_limit_min;
  return world_.max(out_of_time ? kTimeLimitStop : int64_t{signals.received()});
}

void Run::log_stop(int64_t stop, int64_t step_done, Clock::time_point started) {
  if (rank_ != 0) return;
  const std::string why = stop == kTimeLimitStop
                              ? fmt::format("at --time-limit {} min ({:.2f} min since start)",
                                            o_.time_limit_min, ms_since(started) / 60e3)
                              : "by " + signal_name(static_cast<int>(stop));
  const std::string next =
      o_.out.empty() ? std::string("no --out, nothing saved")
                     : fmt::format("continue with --resume {}",
                                   (fs::path(o_.out) / fmt::format("step_{}", step_done)).string());
  spdlog::warn("stopped {} after step {} of {}: {}", why, step_done, o_.steps, next);
}

void Run::train(TrainResult& result, Clock::time_point started) {
  const StopSignals signals;
  // Rank 0 writes the metrics; every rank learns of a failure (a full disk) and stops with it.
  const bool writes_metrics = !o_.out.empty();
  auto on_rank0 = [&](auto&& write) {
    if (writes_metrics)
      agree_on_usage_errors(world_, [&] {
        if (rank_ == 0) write();
      });
    else if (rank_ == 0)
      write();
  };
  on_rank0([&] {
    if (o_.out.empty()) return;
    if (start_step_ > 0 || resume_latest_) continue_metrics(o_.out, start_step_);
    metrics_.open((fs::path(o_.out) / "metrics.jsonl").string(),
                  start_step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics_) usage_error("--out {}: cannot write metrics.jsonl", o_.out);
  });
  for (int64_t s = start_step_; s < o_.steps; ++s) {
    if (s == o_.debug_die_at_step && rank_ == o_.debug_die_rank) {
      spdlog::error("--debug-die-at-step {}: rank {} exits abruptly (failure test)", s, rank_);
      std::fflush(nullptr);
      std::_Exit(17);
    }
    if (s == o_.debug_stall_at_step && rank_ == o_.debug_stall_rank) {
      spdlog::error("--debug-stall-at-step {}: rank {} stops answering (failure test)", s, rank_);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    const auto launched = Clock::now();
    PhaseTimes times;
    double norm = 0;
    const double loss = train_step(s, times, norm);
    if (!std::isfinite(loss)) runtime_error("loss became {} at step {}", loss, s + 1);
    if (o_.debug_step_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(
          std::max(0.0, o_.debug_step_ms - ms_since(launched))));
    result.losses.push_back(loss);
    const std::vector<PhaseTimes> ranks = gather_times(times);
    on_rank0([&] {
      result.rank_times.push_back(ranks);
      log_step(s, loss, norm, ranks, ms_since(launched));
    });
    const bool last = s + 1 == o_.steps;
    if (val_ && ((o_.eval_every > 0 && (s + 1) % o_.eval_every == 0) || last)) {
      const double vl = evaluate();
      result.val_losses.push_back(vl);
      on_rank0([&] {
        spdlog::info("step {:>5}/{} | validation loss {:.4f}", s + 1, o_.steps, vl);
        if (metrics_.is_open()) {
          metrics_ << json{{"step", s + 1}, {"val_loss", vl}}.dump() << "\n";
          check_metrics_written();
        }
      });
    }
    const int64_t stop = last ? 0 : vote_to_stop(signals, started, launched);
    if (last || stop || (o_.save_every > 0 && (s + 1) % o_.save_every == 0)) save(s + 1, last);
    if (stop) {
      if (stop == kTimeLimitStop)
        result.stopped_at_time_limit = true;
      else
        result.stop_signal = static_cast<int>(stop);
      log_stop(stop, s + 1, started);
      break;
    }
  }
  report_timing(result.rank_times, o_.timing_warmup);
}

void Run::benchmark(TrainResult& result) {
  const bool backward = o_.bench_mode != "forward";
  const bool step = o_.bench_mode == "train";
  const int64_t warm = o_.warmup, n = o_.steps;
  std::vector<PhaseTimes> mine;
  std::vector<double> wall;  // host ms from one step's launch to the next's (timed steps)
  auto launched = Clock::now();
  for (int64_t s = 0; s < warm + n; ++s) {
    if (s > warm) wall.push_back(ms_since(launched));
    launched = Clock::now();
    timer_->begin(Phase::kStep);
    if (backward) replica_->zero_grads();
    forward_backward(s, backward, /*reduce=*/backward);
    double norm = 0;
    if (step)
      optimizer_step(s % o_.steps, norm);
    else if (backward)
      await_grads(flat_);
    timer_->end(Phase::kStep);
    replica_->take_loss();
    PhaseTimes t = collect_times(s, s + 1 == warm + n);
    if (s >= warm) mine.push_back(t);
  }
  wall.push_back(ms_since(launched));
  const int64_t mem = memory_in_use(device_);
  // Per-rank times to rank 0.
  std::vector<std::vector<PhaseTimes>> all(n);
  for (int64_t s = 0; s < n; ++s) all[s] = gather_times(mine[s]);
  const double max_mem = world_.max(static_cast<double>(mem));
  if (rank_ != 0) return;
  result.rank_times = all;
  auto stat = [&](Phase p) {
    std::vector<double> xs;
    for (const auto& ranks : all) {
      double worst = 0;
      for (const auto& t : ranks) worst = std::max(worst, t[static_cast<int>(p)]);
      xs.push_back(worst);
    }
    return xs;
  };
  const auto steps_ms = stat(Phase::kStep);
  const MeanStd st = mean_std(steps_ms), fw = mean_std(stat(Phase::kForward)),
                bw = mean_std(stat(Phase::kBackward)), cm = mean_std(stat(Phase::kComm)),
                op = mean_std(stat(Phase::kOptimizer));
  // Rank 0's collectives on its comm stream, hidden or not.
  std::vector<double> comm_total;
  for (const auto& ranks : all) comm_total.push_back(ranks[0][kCommTotal]);
  const MeanStd tc = mean_std(comm_total);
  const double med = median(steps_ms);
  const double tokens = static_cast<double>(G_ * o_.config.ctx);
  const double tok_s = tokens / (med / 1e3);
  const double peak = peak_tflops_;
  const double flops_factor = o_.bench_mode == "forward" ? 1.0 / 3.0 : 1.0;
  const double mfu = peak > 0 ? tok_s * flops_factor * flops_per_token(o_.config, o_.config.ctx) /
                                    (nranks_ * peak * 1e12)
                              : 0;
  spdlog::info("benchmark --mode {} | {} warm-up + {} timed steps | {} rank(s)", o_.bench_mode,
               warm, n, nranks_);
  spdlog::info("  forward   {:8.3f} ± {:.3f} ms", fw.mean, fw.std);
  if (backward) spdlog::info("  backward  {:8.3f} ± {:.3f} ms", bw.mean, bw.std);
  if (backward && nranks_ > 1) {
    spdlog::info(
        "  comm      {:8.3f} ± {:.3f} ms exposed (rank 0's collectives ran {:.3f} ms in all)",
        cm.mean, cm.std, tc.mean);
  }
  if (step) spdlog::info("  optimizer {:8.3f} ± {:.3f} ms", op.mean, op.std);
  spdlog::info(
      "  step      {:8.3f} ± {:.3f} ms (median {:.3f}) | {:.0f} tok/s{} | peak memory {:.2f} GiB",
      st.mean, st.std, med, tok_s, peak > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "",
      max_mem / 1073741824.0);
  // The step above is CUDA events from the step's first to its last kernel; between steps the
  // host reads the loss and the timings. Wall clock per step counts that too.
  spdlog::info("  wall      {:8.3f} ms per step, median (rank 0's host clock, launch to launch)",
               median(wall));
  report_timing(all, 0);
  if (!o_.csv.empty()) {
    const ModelConfig& c = o_.config;
    const std::string row = fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},"
        "{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f},{:.4f},{:.3f},{},{},{},{:.4f},{},"
        "{}\n",
        std::time(nullptr), o_.model, c.d_model, c.d_ff, c.n_layers, c.n_heads, c.vocab, c.ctx,
        o_.batch, o_.grad_accum, nranks_, device_ == DeviceKind::kCuda ? "cuda" : "cpu",
        precision_name(precision_), o_.attention, o_.ddp, o_.bucket_mb, o_.shard_optim ? 1 : 0,
        o_.bench_mode, warm, n, fw.mean, fw.std, bw.mean, bw.std, cm.mean, cm.std, op.mean, op.std,
        st.mean, st.std, med, tok_s, mfu, max_mem / 1073741824.0, o_.grad_reduce, o_.grad_transport,
        o_.comm_sms, tc.mean, nccl_env_field(), host_count(places_));
    append_csv_row(o_.csv, kCsvHeader, row);
  }
}

}  // namespace

TrainResult run_training(const Options& o, MpiCommunicator& world, bool keep_params) {
  Run run(o, world);
  return run.execute(keep_params);
}

}  // namespace trainer
