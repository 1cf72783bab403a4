// What a run writes: metrics.jsonl and the step log, the per-rank timing report, checkpoints
// (gathered tensor by tensor to rank 0 under ZeRO-1) and the --trace file.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/device_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/run.h"

namespace fs = std::filesystem;

namespace trainer {

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

void Run::open_metrics() {
  if (o_.out.empty()) return;
  if (start_step_ > 0 || resume_latest_) continue_metrics(o_.out, start_step_);
  metrics_.open((fs::path(o_.out) / "metrics.jsonl").string(),
                start_step_ > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics_) usage_error("--out {}: cannot write metrics.jsonl", o_.out);
}

json Run::run_settings() const {
  json j = {{"global_batch", G_},
            {"ctx", o_.config.ctx},
            {"sampler", o_.sampler},
            {"seed", o_.seed},
            {"world", nranks_},
            {"shard_optim", o_.shard_optim},
            {"lr", o_.lr},
            {"min_lr", o_.min_lr},
            {"warmup", o_.warmup},
            {"steps", o_.steps},
            {"data", o_.data},
            {"adam_steps", adam_steps_},
            {"adam_state", o_.adam_state}};
  if (scaler_.enabled()) {  // a resumed run continues with the same scale and count
    j["loss_scale"] = scaler_.scale();
    j["loss_scale_good_steps"] = scaler_.good_steps();
  }
  return j;
}

void Run::check_metrics_written() {
  metrics_.flush();
  if (!metrics_)
    usage_error("{}: writing failed ({})", (fs::path(o_.out) / "metrics.jsonl").string(),
                std::strerror(errno));
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
    if (scaler_.enabled()) j["loss_scale"] = step_scale_;
    if (step_skipped_) j["skipped"] = true;
    json per_rank = json::array();
    for (size_t k = 0; k < ranks.size(); ++k) {
      const PhaseTimes& t = ranks[k];
      json r = {{"host", places_[k].host}};
      for (int p = 0; p <= kCommTotal; ++p) r[std::string(time_slot_name(p)) + "_ms"] = t[p];
      if (overlap_update_) r["optimizer_total_ms"] = t[kOptimizerTotal];
      per_rank.push_back(r);
    }
    j["ranks"] = per_rank;
    metrics_ << j.dump() << "\n";
    check_metrics_written();
  }
  if (step_skipped_)
    spdlog::info("step {:>5}/{} | gradient not finite at loss scale {:g}: update skipped{}", s + 1,
                 o_.steps, step_scale_,
                 scaler_.dynamic() ? fmt::format(", scale now {:g}", scaler_.scale()) : "");
  if ((s + 1) % o_.log_every != 0 && s + 1 != o_.steps && s != start_step_) return;
  std::string timing = fmt::format("step {:.1f} ms (wall {:.1f})", ms, wall_ms);
  if (nranks_ > 1)
    timing += fmt::format(" (ranks min {:.1f} / median {:.1f} / max {:.1f}, slowest rank {})",
                          *std::min_element(step_ms.begin(), step_ms.end()), median(step_ms), ms,
                          slowest);
  spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f}{} | {:.0f} tok/s{} | {}",
               s + 1, o_.steps, loss, lr, norm,
               scaler_.enabled() ? fmt::format(" | loss scale {:g}", step_scale_) : "", tok_s,
               peak > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", timing);
}

void Run::report_timing(const std::vector<std::vector<PhaseTimes>>& rank_times, int64_t skip) {
  if (rank_ != 0 || rank_times.empty()) return;
  const int64_t n = static_cast<int64_t>(rank_times.size());
  if (n <= skip) skip = 0;
  spdlog::info("per-rank step timings, ms, mean ± std over {} steps{}:", n - skip,
               o_.benchmark ? fmt::format(" (after {} warm-up steps)", o_.warmup)
                            : fmt::format(" (first {} left out, --timing-warmup)", skip));
  // Total collective time is measured on GPUs (CUDA events on the comm stream) only; the time of
  // updates beside forward, with --overlap-update.
  std::vector<int> slots;
  for (int p = 0; p < kNumPhases; ++p) slots.push_back(p);
  if (grad_comm_ != &world_) slots.push_back(kCommTotal);
  if (overlap_update_) slots.push_back(kOptimizerTotal);
  size_t host_width = 4;
  for (const RankPlace& p : places_) host_width = std::max(host_width, p.host.size());
  std::string head = fmt::format("{:>6} {:<{}}", "rank", "host", host_width);
  for (int p : slots) head += fmt::format(" {:>17}", time_slot_name(p));
  spdlog::info("{}", head);
  for (int r = 0; r < nranks_; ++r) {
    std::string row = fmt::format("{:>6} {:<{}}", r, places_[r].host, host_width);
    for (int p : slots) {
      std::vector<double> xs;
      for (int64_t s = skip; s < n; ++s) xs.push_back(rank_times[s][r][p]);
      const MeanStd ms = mean_std(xs);
      row += fmt::format(" {:>9.2f} ± {:<5.2f}", ms.mean, ms.std);
    }
    spdlog::info("{}", row);
  }
}

TensorSource Run::state_source(BufferView owned) {
  return [this, owned](const ParamTensor& t, float* out) {
    // This rank's part of the tensor (all of it unless sharded), from device or host memory.
    const Range mine = t.range().intersect(owned_);
    // bf16 moments (--adam-state bf16) are written as fp32, exactly.
    if (!shards_ || nranks_ == 1) {
      if (out) copy_to_f32(out, owned.slice(mine.begin - owned_.begin, mine.size()));
      return;
    }
    std::vector<float> piece(mine.size());
    if (!mine.empty())
      copy_to_f32(piece.data(), owned.slice(mine.begin - owned_.begin, mine.size()));
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

void Run::report_memory(int64_t steps_done) {
  if (memory_reported_) return;
  memory_reported_ = true;
  // On a GPU: the device's used bytes (cudaMemGetInfo); on the CPU: the process's peak RSS.
  const int64_t in_use = memory_in_use(device_);
  const int64_t allocator = device_buffer_bytes(device_);
  const double max_in_use = world_.max(static_cast<double>(in_use));
  // A failed write stops every rank with rank 0's message.
  agree_on_usage_errors(world_, [&] {
    if (rank_ == 0) write_memory_report(steps_done, in_use, allocator, max_in_use);
  });
}

void Run::write_memory_report(int64_t steps_done, int64_t in_use, int64_t allocator,
                              double max_in_use) {
  const int64_t planned = total_bytes(memory_plan_);
  const char* what = device_ == DeviceKind::kCuda ? "in use on the GPU (cudaMemGetInfo)"
                                                  : "peak resident set of the process";
  spdlog::info(
      "memory after step {}: {} {} | the allocator holds {} | planned {} | outside the allocator "
      "{}{}",
      steps_done, mib(static_cast<double>(in_use)), what, mib(static_cast<double>(allocator)),
      mib(static_cast<double>(planned)), mib(static_cast<double>(in_use - allocator)),
      nranks_ > 1 ? fmt::format(" | most in use on any rank {}", mib(max_in_use)) : "");
  if (const std::string tuning = replica_->gemm_tuning(); !tuning.empty())
    spdlog::info("matrix products: {}", tuning);
  if (o_.memory_report.empty()) return;
  json plan = json::array();
  for (const MemoryItem& m : memory_plan_)
    plan.push_back({{"category", m.category}, {"bytes", m.bytes}});
  const ModelConfig& c = o_.config;
  const json j = {{"model", o_.model},
                  {"config",
                   {{"d_model", c.d_model},
                    {"d_ff", c.d_ff},
                    {"layers", c.n_layers},
                    {"heads", c.n_heads},
                    {"vocab", c.vocab},
                    {"ctx", c.ctx}}},
                  {"batch", o_.batch},
                  {"ranks", nranks_},
                  {"device", device_ == DeviceKind::kCuda ? "cuda" : "cpu"},
                  {"gpu", gpu_name_},
                  {"precision", precision_name(precision_)},
                  {"recompute", o_.recompute},
                  {"shard_optim", o_.shard_optim},
                  {"plan", plan},
                  {"plan_total_bytes", planned},
                  {"measured",
                   {{"after_step", steps_done},
                    {"what", what},
                    {"in_use_bytes", in_use},
                    {"allocator_bytes", allocator},
                    {"outside_allocator_bytes", in_use - allocator},
                    {"max_in_use_bytes_any_rank", static_cast<int64_t>(max_in_use)}}}};
  std::ofstream f(o_.memory_report);
  f << j.dump(2) << "\n";
  if (!f.flush()) usage_error("--memory-report {}: writing failed", o_.memory_report);
  spdlog::info("memory report written to {}", o_.memory_report);
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
    std::vector<std::pair<int, const char*>> tracks = {{0, "compute stream"}, {1, "comm stream"}};
    if (overlap_update_) tracks.emplace_back(2, "update beside forward");
    for (const auto& [tid, label] : tracks) {
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

}  // namespace trainer
