// Run set-up: every input is checked on all ranks before any compute (the lowest failing rank's
// message reaches every rank), then the replica, the communicators, the optimizer and the initial
// parameters.
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/device_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "model/init.h"
#include "runtime/csv.h"
#include "runtime/run.h"
#include "runtime/safetensors.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

// The file at `path` can be written. An existing file is opened for appending (nothing is
// written or truncated). A missing one is not created and removed again: a probe of its own name
// tests the directory instead, because the path may be shared (runs started together append to
// one --csv) and removing it could take away the file another run has just written its row into.
void check_writable_file(const char* flag, const std::string& path) {
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  const std::string probe = existed ? path : path + ".probe." + std::to_string(::getpid());
  FILE* f = std::fopen(probe.c_str(), "a");
  if (!f) usage_error("{} {}: cannot write the file ({})", flag, path, std::strerror(errno));
  std::fclose(f);
  if (!existed) fs::remove(probe, ec);
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

}  // namespace

void Run::setup() {
  rank_ = world_.rank();
  nranks_ = world_.world();
  check_host_threads();
  device_ = o_.device_kind();
  precision_ = o_.precision_kind();
  G_ = o_.batch * nranks_ * o_.grad_accum;
  const int gpu = check_inputs();
  prepare_out();
  build(gpu);
  log_run();
}

int Run::check_inputs() {
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
      usage_error("--precision {} needs --device cuda; the CPU backend (--device {}) is fp32",
                  precision_name(precision_),
                  o_.device == "cpu" ? "cpu" : "auto, which found no GPU");
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
    if (device_ == DeviceKind::kCpu && o_.cuda_graph)
      usage_error("--cuda-graph needs --device cuda (--device {})",
                  o_.device == "cpu" ? "cpu" : "auto, which found no GPU");
    if (o_.cuda_graph && nranks_ > 1)
      usage_error(
          "--cuda-graph runs on one rank so far (world is {}): the gradient collectives of "
          "several ranks are not recorded into the graph",
          nranks_);
    update_sms_ = o_.update_sms_for(update_beside_forward(), layout_.total());
    wgrad_sms_ = o_.wgrad_sms_for(device_ == DeviceKind::kCuda);
    gemm_tune_ = o_.gemm_tune_for(device_ == DeviceKind::kCuda);
    if (o_.overlap_update == "on") {
      if (device_ == DeviceKind::kCpu)
        usage_error("--overlap-update on needs --device cuda (the CPU backend has no streams)");
      if (nranks_ > 1)
        usage_error("--overlap-update on runs on one rank so far (world is {}); use auto or off",
                    nranks_);
      if (o_.cuda_graph)
        usage_error(
            "--overlap-update on and --cuda-graph exclude each other: the recorded step holds "
            "its update");
    }
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
    if (rank_ == 0 && !o_.memory_report.empty())
      check_writable_file("--memory-report", o_.memory_report);
    if (rank_ == 0 && o_.benchmark && !o_.csv.empty()) {
      check_writable_file("--csv", o_.csv);
      check_csv_header(o_.csv, kCsvHeader);
    }
    if (device_ == DeviceKind::kCpu) {
      // The CPU replica's flat buffers (weights and gradients, fp32) and the optimizer state
      // (12 B/param, 8 with bf16 moments, or its shard) alone, before activations: refuse what
      // cannot fit.
      const int local = std::max(1, node.size);
      const double state = static_cast<double>(AdamW::state_bytes_per_elem(o_.adamw().moments));
      const double need = static_cast<double>(layout_.param_count()) *
                          (8.0 + state / (o_.shard_optim ? nranks_ : 1)) * local;
      const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
      if (have > 0 && need > have)
        usage_error(
            "the model's {:.0f}M parameters need at least {:.1f} GiB of host memory for {} "
            "rank(s) on this host (weights, gradients, AdamW state); it has {:.1f} GiB",
            layout_.param_count() / 1e6, need / 1073741824.0, local, have / 1073741824.0);
    }
    schedule_ = LrSchedule{o_.lr, o_.min_lr, o_.warmup, o_.steps};
    scaler_ = LossScaler(o_.loss_scaling());
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
  if (rank_ == 0 && precision_ == Precision::kFp16 && !scaler_.enabled())
    spdlog::warn(
        "--precision fp16 with --loss-scale none: gradients below fp16's 6e-8 flush to zero and "
        "large ones overflow; --loss-scale dynamic (the default with fp16) guards against both");
  if (rank_ == 0 && !o_.benchmark && o_.warmup > o_.steps)
    spdlog::warn("--warmup {} > --steps {}: the learning rate never reaches --lr {}", o_.warmup,
                 o_.steps, o_.lr);
  return gpu;
}

void Run::prepare_out() {
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
  copy_tokenizer();
}

// The tokenizer that launch/prepare_text.py wrote beside the token files goes into --out too, so
// that a run directory is all `generate` needs.
void Run::copy_tokenizer() const {
  if (rank_ != 0 || o_.out.empty() || o_.benchmark) return;
  const fs::path from = fs::path(o_.data).parent_path() / "tokenizer.json";
  const fs::path to = fs::path(o_.out) / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(from, ec)) {
    if (!fs::equivalent(from, to, ec))
      fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) spdlog::warn("could not copy {} into --out: {}", from.string(), ec.message());
  } else if (fs::exists(to, ec)) {
    spdlog::warn("{} is not from this run's data ({} has no tokenizer.json beside it)", to.string(),
                 o_.data);
  }
}

void Run::build(int gpu) {
  if (device_ == DeviceKind::kCuda) {
    gpu_name_ = cuda_device_name(gpu);
    gpu_pci_bus_ = cuda_device_pci_bus_id(gpu);
  }
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
  // One GPU, kernels launched one by one: the update beside the next forward, in the parts forward
  // announces (its last part also holds the padding up to flat_).
  overlap_update_ = update_beside_forward();
  if (overlap_update_) {
    update_parts_ = layout_.forward_parts();
    update_parts_.back().end = flat_;
  }

  ReplicaOptions ro;
  ro.max_batch = o_.batch;
  ro.flat_elems = flat_;
  ro.precision = precision_;
  ro.attention = o_.attention;
  ro.recompute = parse_recompute(o_.recompute);
  if (o_.cuda_graph) ro.graph_slots = static_cast<int>(o_.grad_accum);
  ro.urgent_stream = overlap_update_;
  ro.update_sms = update_sms_;  // resolved in check_inputs()
  ro.debug_wgrad_delay_us = o_.debug_wgrad_delay_us;
  ro.wgrad_sms = wgrad_sms_;
  ro.gemm_tune = gemm_tune_;
  ro.optimizer_elems = owned_.size();
  ro.optimizer_bytes_per_elem = AdamW::state_bytes_per_elem(o_.adamw().moments);
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
  int64_t nccl_bytes = 0;
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
    const int64_t before_nccl = memory_in_use(DeviceKind::kCuda);
    nccl_ = make_nccl_communicator(world_, no);
    grad_comm_ = nccl_.get();
    nccl_bytes = memory_in_use(DeviceKind::kCuda) - before_nccl;
  }
#endif

  agree_on_usage_errors(
      world_, [&] { opt_ = std::make_unique<AdamW>(device_, owned_.size(), o_.adamw()); });
#ifdef TRAINER_WITH_CUDA
  // One GPU holds the final gradient as soon as backward writes it: the norm's pass can run then.
  if (device_ == DeviceKind::kCuda && nranks_ == 1 && replica_->grads().dtype == DType::kF32) {
    std::vector<int64_t> ends;
    for (const auto& t : layout_.tensors()) ends.push_back(t.offset + t.numel);
    ends.back() = flat_;  // the padding after the last tensor is zero
    norm_overlap_ = std::make_unique<cuda::OverlappedSumSquares>(
        replica_->grads().as<const float>(), flat_, std::move(ends), replica_->stream());
    norm_overlap_->set_debug_delay(o_.debug_norm_delay_us);
    if (o_.cuda_graph || overlap_update_) step_args_ = std::make_unique<cuda::DeviceStepArgs>();
  }
  if (overlap_update_)
    update_lane_ = std::make_unique<cuda::UpdateLane>(replica_->stream(),
                                                      static_cast<int>(update_parts_.size()));
  if (update_lane_) update_lane_->set_debug_delay(o_.debug_update_delay_us);
#endif

  sync_ = std::make_unique<GradSync>(*grad_comm_, tensors, replica_->grads(), strategy,
                                     bucket_bytes, shards_ ? &*shards_ : nullptr, grad_copies_);

  // The memory plan: the replica's lines, the optimizer's, and what else the allocator holds now
  // (the communicators' staging buffers); NCCL's own memory as measured around its creation.
  memory_plan_ = replica_->memory_plan();
  memory_plan_.push_back({"fp32 master weights (this rank's range)", 4 * owned_.size()});
  const DType moments = o_.adamw().moments;
  memory_plan_.push_back({fmt::format("AdamW moments m and v ({}, this rank's range)",
                                      moments == DType::kBF16 ? "bf16" : "fp32"),
                          2 * static_cast<int64_t>(dtype_size(moments)) * owned_.size()});
  const int64_t other = device_buffer_bytes(device_) - total_bytes(memory_plan_);
  if (other > 0)
    memory_plan_.push_back({"other buffers (the allocator's count beyond these)", other});
  if (nccl_bytes > 0)
    memory_plan_.push_back(
        {"NCCL communicator and collective staging (measured around their creation)", nccl_bytes});
  timer_ = make_step_timer(device_, replica_->stream());
#ifdef TRAINER_WITH_CUDA
  if (nccl_) nccl_->set_origin(timer_->origin_event());
#endif
  inputs_.resize(o_.batch * o_.config.ctx);
  targets_.resize(o_.batch * o_.config.ctx);
  next_inputs_.resize(inputs_.size());
  next_targets_.resize(targets_.size());
  if (train_) {
    sampler_ = Sampler{parse_sampler(o_.sampler), o_.seed, train_->size(), o_.config.ctx, G_};
  }
}

void Run::log_run() {
  const SyncStrategy strategy = parse_sync_strategy(o_.ddp);
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
    if (device_ == DeviceKind::kCuda && o_.attention == "flash" &&
        !replica_->uses_flash_attention())
      spdlog::warn("attention: {}", attention);
    else
      spdlog::info("attention: {}", attention);
    const double pbytes = static_cast<double>(replica_->params().bytes());
    const double gbytes = static_cast<double>(replica_->grads().bytes());
    const double grad_buffers = grad_copies_ ? nranks_ : 1;  // own, and one per peer
    const double abytes = static_cast<double>(replica_->activation_bytes());
    spdlog::info(
        "memory per rank: params {} ({}) | grads {} ({}{}) | optimizer state {} | "
        "activations {} (--recompute {}) | total {}",
        mib(pbytes), dtype_name(replica_->params().dtype), mib(gbytes * grad_buffers),
        dtype_name(replica_->grads().dtype),
        grad_copies_ ? fmt::format(": this rank's and {} peer cop{}", nranks_ - 1,
                                   nranks_ == 2 ? "y" : "ies")
                     : "",
        mib(opt_bytes[0]), mib(abytes), o_.recompute,
        mib(pbytes + gbytes * grad_buffers + opt_bytes[0] + abytes));
    spdlog::info("memory plan of rank 0 ({} in all):",
                 mib(static_cast<double>(total_bytes(memory_plan_))));
    for (const MemoryItem& m : memory_plan_)
      spdlog::info("  {:>10}  {}", mib(static_cast<double>(m.bytes)), m.category);
    std::string per_rank;
    for (size_t r = 0; r < opt_bytes.size(); ++r)
      per_rank += fmt::format("{}rank {}: {}", r ? ", " : "", r, mib(opt_bytes[r]));
    spdlog::info(
        "optimizer state (fp32 master + {}m + v = {} B/param{}): {}{}",
        o_.adamw().moments == DType::kBF16 ? "bf16 " : "",
        AdamW::state_bytes_per_elem(o_.adamw().moments),
        shards_ ? fmt::format(" / {} ranks, ZeRO-1", nranks_) : std::string(", unsharded"),
        per_rank,
        overlap_update_
            ? fmt::format(" | update beside the next forward in {} parts{}", update_parts_.size(),
                          update_sms_ > 0 ? fmt::format(", its GEMMs leaving {} SMs to it "
                                                        "(--update-sms)",
                                                        update_sms_)
                                          : std::string())
            : "");
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
      // Into bf16 moments (--adam-state bf16) rounded: exact for a checkpoint of such a run.
      copy_from_f32(opt_->exp_avg(), m.data());
      copy_from_f32(opt_->exp_avg_sq(), v.data());
      start_step_ = meta->step;
      adam_steps_ = meta->step;  // files from before loss scaling: every step was applied
      const json& run = meta->run;
      if (run.contains("adam_steps") && run["adam_steps"].is_number_integer())
        adam_steps_ = run["adam_steps"].get<int64_t>();
      if (run.contains("loss_scale") && run["loss_scale"].is_number() &&
          run.contains("loss_scale_good_steps") &&
          run["loss_scale_good_steps"].is_number_integer()) {
        const double scale = run["loss_scale"].get<double>();
        const int64_t good = run["loss_scale_good_steps"].get<int64_t>();
        if (!(std::isfinite(scale) && scale > 0) || good < 0)
          usage_error("{}: unreadable loss scale {} after {} clean steps in the metadata", resume_,
                      run["loss_scale"].dump(), good);
        scaler_.restore(scale, good);
      }
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
      // Checkpoints before --adam-state existed kept fp32 moments.
      const std::string saved_state =
          run.contains("adam_state") && run["adam_state"].is_string() ? run["adam_state"] : "fp32";
      if (rank_ == 0 && saved_state != o_.adam_state)
        spdlog::warn(
            "the checkpoint's AdamW moments were kept in {}, this run keeps them in {} "
            "(--adam-state)"
            "{}",
            saved_state, o_.adam_state,
            o_.adam_state == "bf16" ? ": they are rounded to bf16 once, now" : ": exactly");
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

}  // namespace trainer
