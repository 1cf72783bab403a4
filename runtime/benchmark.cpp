// --benchmark: warm-up and timed steps on synthetic tokens (forward, forward+backward, or the whole
// training step), the summary of the slowest rank's phase times, and one --csv row per run.
#include <algorithm>
#include <ctime>
#include <numeric>

#include "core/log.h"
#include "runtime/csv.h"
#include "runtime/floors.h"
#include "runtime/gpu_power.h"
#include "runtime/kernel_trace.h"
#include "runtime/run.h"

namespace trainer {

namespace {
constexpr int kPowerPeriodMs = 20;  // NVML's clock and power sampling period
}  // namespace

const char* const kCsvHeader =
    "time,model,d_model,d_ff,layers,heads,vocab,ctx,batch,grad_accum,world,device,precision,attn,"
    "ddp,bucket_mb,shard_optim,mode,warmup,steps,forward_ms,forward_std,backward_ms,backward_std,"
    "comm_ms,comm_std,optimizer_ms,optimizer_std,step_ms,step_std,step_median_ms,tokens_per_s,mfu,"
    "peak_mem_gib,grad_reduce,grad_transport,comm_sms,comm_total_ms,nccl_env,hosts,recompute,"
    "forward_floor_ms,backward_floor_ms,optimizer_floor_ms,gemm_forward_ms,gemm_backward_ms,"
    "copy_gb_s,cuda_graph,adam_state,optimizer_total_ms,overlap_update,update_sms,sm_clock_mhz,"
    "power_w,power_capped,step_j,cap_limit_w,cap_gemm_j,cap_attention_j,cap_elementwise_j,"
    "cap_optimizer_j,cap_parts_j";

// --kernel-trace: the files (one pair per rank when there are several) and, per timed step on
// average, what the kernels did with the GPU's time.
void Run::report_kernel_trace(const std::vector<TracedKernel>& kernels, int64_t steps) const {
  const std::string prefix =
      nranks_ > 1 ? fmt::format("{}.rank{}", o_.kernel_trace, rank_) : o_.kernel_trace;
  write_kernel_trace(prefix, kernels);
  const std::vector<StepTrace> per_step = summarize_steps(kernels, steps);
  StepTrace mean;
  for (const StepTrace& s : per_step) {
    mean.kernels += s.kernels;
    mean.kernel_ms += s.kernel_ms;
    mean.busy_ms += s.busy_ms;
    mean.span_ms += s.span_ms;
  }
  const double k = 1.0 / static_cast<double>(std::max<int64_t>(steps, 1));
  spdlog::info(
      "kernel trace (rank {}): {}.json / .csv | per step: {:.1f} kernels, {:.3f} ms of kernel "
      "time, busy {:.3f} ms of {:.3f} ms from first to last kernel, idle {:.3f} ms",
      rank_, prefix, static_cast<double>(mean.kernels) * k, mean.kernel_ms * k, mean.busy_ms * k,
      mean.span_ms * k, (mean.span_ms - mean.busy_ms) * k);
  // The step with the median busy time: its longest idle gaps and the kernels around them.
  std::vector<int64_t> order(per_step.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return per_step[static_cast<size_t>(a)].busy_ms < per_step[static_cast<size_t>(b)].busy_ms;
  });
  if (!order.empty()) {
    const int64_t median = order[order.size() / 2];
    for (const IdleGap& g : longest_gaps(kernels, median, 5))
      spdlog::info("  idle {:.3f} ms in step {} after {} before {}", g.ms, median,
                   g.before.substr(0, 60), g.after.substr(0, 60));
  }
  const std::vector<KernelTotal> totals = totals_by_name(kernels);
  for (size_t i = 0; i < totals.size() && i < 12; ++i)
    spdlog::info("  {:8.3f} ms/step {:5.1f}/step  {}", totals[i].ms * k,
                 static_cast<double>(totals[i].count) * k, totals[i].name.substr(0, 90));
}

void Run::benchmark(TrainResult& result) {
  const bool backward = o_.bench_mode != "forward";
  const bool step = o_.bench_mode == "train";
  const int64_t warm = o_.warmup, n = o_.steps;
  norm_overlap_wanted_ = step;  // only a step with an update uses the norm
  std::vector<PhaseTimes> mine;
  std::vector<double> wall;  // host ms from one step's launch to the next's (timed steps)
  auto launched = Clock::now();
  // The update lane's time over the timed steps (--overlap-update): per update, since a step's
  // times hold the updates that finished during it (normally the previous step's).
  double lane_ms0 = 0;
  int64_t lane_updates0 = 0;
  std::unique_ptr<KernelTrace> trace;
  if (!o_.kernel_trace.empty()) {
    if (device_ != DeviceKind::kCuda)
      usage_error("--kernel-trace records GPU kernels, and this run is on the CPU");
    trace = make_kernel_trace();
  }
  if (o_.floors_at_cap && device_ != DeviceKind::kCuda)
    usage_error("--floors-at-cap reads the GPU's power, and this run is on the CPU");
  // The GPU's clock and power over the timed steps (rank 0 reports its own GPU's).
  std::unique_ptr<PowerSampler> power;
  if (device_ == DeviceKind::kCuda) {
    std::string why;
    power = make_power_sampler(gpu_pci_bus_, kPowerPeriodMs, &why);
    if (!power) spdlog::debug("the GPU's clock and power are not sampled: {}", why);
  }
  PowerSummary pw;
  for (int64_t s = 0; s < warm + n; ++s) {
    if (trace && s == warm) trace->begin();
    if (power && s == warm) power->begin();
    if (s > warm) wall.push_back(ms_since(launched));
    launched = Clock::now();
    timer_->begin(Phase::kStep);
    if (step) {
      step_with_update(s, s % o_.steps);
    } else {
      forward_backward(s, backward, /*reduce=*/backward);
      if (backward) await_grads(flat_);
    }
    timer_->end(Phase::kStep);
    if (step) take_grad_norm();
    replica_->take_loss();
    if (s == warm) {
      lane_ms0 = lane_ms_;
      lane_updates0 = lane_updates_;
    }
    PhaseTimes t = collect_times(s, s + 1 == warm + n);
    if (s >= warm) mine.push_back(t);
    if (trace && s >= warm) trace->end_step(s - warm);
    if (s == 0) report_memory(1);
  }
  wall.push_back(ms_since(launched));
  if (power) pw = power->end();
  if (trace) {
    const std::vector<TracedKernel> kernels = trace->finish();
    trace.reset();
    report_kernel_trace(kernels, n);
  }
  const int64_t mem = memory_in_use(device_);
  // Rank 0 measures its GPU's floors while the others wait in the gather below.
  PhaseFloors floors;
  if (rank_ == 0 && device_ == DeviceKind::kCuda)
    floors = measure_floors(
        *replica_, o_.config, MicroBatch{inputs_.data(), targets_.data(), o_.batch, o_.config.ctx},
        owned_.size(), static_cast<int>(dtype_size(o_.adamw().moments)), backward,
        /*norm_beside_backward=*/has_norm_overlap() && step,
        o_.floors_at_cap ? power.get() : nullptr, gemm_tune_);
  if (rank_ == 0 && o_.floors_at_cap && !power)
    floors.note += std::string(floors.note.empty() ? "" : "; ") +
                   "no floors at the power cap: NVML cannot read this GPU's power";
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
  const int64_t lane_updates = lane_updates_ - lane_updates0;
  const double lane_ms =
      lane_updates > 0 ? (lane_ms_ - lane_ms0) / static_cast<double>(lane_updates) : 0.0;
  const double med = median(steps_ms);
  const double tokens = static_cast<double>(G_ * o_.config.ctx);
  const double tok_s = tokens / (med / 1e3);
  const double peak = peak_tflops_;
  const double flops_factor = o_.bench_mode == "forward" ? 1.0 / 3.0 : 1.0;
  const double mfu = peak > 0 ? tok_s * flops_factor * flops_per_token(o_.config, o_.config.ctx) /
                                    (nranks_ * peak * 1e12)
                              : 0;
  spdlog::info("benchmark --mode {} | {} warm-up + {} timed steps | {} rank(s){}", o_.bench_mode,
               warm, n, nranks_, o_.cuda_graph ? " | CUDA graph" : "");
  spdlog::info("  forward   {:8.3f} ± {:.3f} ms", fw.mean, fw.std);
  if (backward) spdlog::info("  backward  {:8.3f} ± {:.3f} ms", bw.mean, bw.std);
  if (backward && nranks_ > 1) {
    spdlog::info(
        "  comm      {:8.3f} ± {:.3f} ms exposed (rank 0's collectives ran {:.3f} ms in all)",
        cm.mean, cm.std, tc.mean);
  }
  if (step && lane_updates > 0)
    spdlog::info(
        "  optimizer {:8.3f} ± {:.3f} ms exposed (each update ran {:.3f} ms beside the next "
        "forward, --overlap-update)",
        op.mean, op.std, lane_ms);
  else if (step)
    spdlog::info("  optimizer {:8.3f} ± {:.3f} ms", op.mean, op.std);
  spdlog::info(
      "  step      {:8.3f} ± {:.3f} ms (median {:.3f}) | {:.0f} tok/s{} | peak memory {:.2f} GiB",
      st.mean, st.std, med, tok_s, peak > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "",
      max_mem / 1073741824.0);
  // The step above is CUDA events from the step's first to its last kernel; between steps the
  // host reads the loss and the timings. Wall clock per step counts that too.
  const double wall_med = median(wall);
  spdlog::info("  wall      {:8.3f} ms per step, median (rank 0's host clock, launch to launch)",
               wall_med);
  if (pw.samples > 0)
    spdlog::info("  GPU       {} (rank 0's GPU over the timed steps, NVML every {} ms, {})",
                 describe_power(pw), kPowerPeriodMs,
                 pw.instant_watts ? "instantaneous power" : "power averaged over a second");
  const double window_ms = std::accumulate(wall.begin(), wall.end(), 0.0);
  if (const int64_t hold = sustained_steps(pw, window_ms * 1e-3, wall_med))
    spdlog::warn(
        "these {} steps ({:.2f} s) ran with the GPU at its power limit, whose first second runs "
        "above the limit and the next few swing around it: faster than training held there. For "
        "the sustained step, time {:.0f} s of steps: --steps {}",
        n, window_ms * 1e-3, kPowerHoldSeconds, hold);
  if (floors.measured) {
    spdlog::info(
        "floors on this GPU (copy {:.0f} GB/s; flash attention at T 4096: forward {:.0f}, backward "
        "{:.0f} TFLOP/s; the step's GEMMs timed alone):",
        floors.copy_gb_s, floors.attention_forward_tflops, floors.attention_backward_tflops);
    auto line = [](const char* phase, double ms, double gemm, int64_t calls, double attn,
                   double elem) {
      const double floor = gemm + attn + elem;
      spdlog::info(
          "  {:<9} {:8.3f} ms | floor {:.3f} = GEMMs {:.3f} ({} calls) + attention {:.3f} + "
          "elementwise {:.3f} | {:.2f}x the floor",
          phase, ms, floor, gemm, calls, attn, elem, floor > 0 ? ms / floor : 0.0);
    };
    line("forward", fw.mean, floors.gemm_forward_ms, floors.gemm_forward_calls,
         floors.attention_forward_ms, floors.elementwise_forward_ms);
    if (backward)
      line("backward", bw.mean, floors.gemm_backward_ms, floors.gemm_backward_calls,
           floors.attention_backward_ms, floors.elementwise_backward_ms);
    // Beside forward, the update's own time is what compares with its floor.
    const double opt_ms = lane_updates > 0 ? lane_ms : op.mean;
    if (step && floors.optimizer_ms > 0)
      spdlog::info(
          "  optimizer {:8.3f} ms{} | floor {:.3f} = {:.2f} GB at the copy bandwidth | "
          "{:.2f}x the floor",
          opt_ms, lane_updates > 0 ? " (beside forward)" : "", floors.optimizer_ms,
          floors.optimizer_bytes / 1e9, opt_ms / floors.optimizer_ms);
  }
  // The timed steps' energy: their median time at their mean power (0 where not sampled).
  const double step_j = pw.samples > 0 ? pw.watts_mean * med * 1e-3 : 0.0;
  const double parts_j = floors.at_cap ? floors.step_j(backward, step) : 0.0;
  if (floors.at_cap) {
    const double limit = floors.limit_watts;
    spdlog::info(
        "at the power cap ({:.0f} W), joules per step, each part alone for {:.1f} s (the step's "
        "GEMMs; attention at this shape on random inputs; bytes at the copy's {:.3f} J/GB, "
        "paid at {:.0f} MHz):",
        limit, floors.cap_window_s, floors.copy_j_per_gb, floors.copy_sm_mhz);
    spdlog::info("  forward   GEMMs {:.3f} + attention {:.3f} + elementwise {:.3f} J",
                 floors.gemm_forward_j, floors.attention_forward_j, floors.elementwise_forward_j());
    if (backward)
      spdlog::info("  backward  GEMMs {:.3f} + attention {:.3f} + elementwise {:.3f} J",
                   floors.gemm_backward_j, floors.attention_backward_j,
                   floors.elementwise_backward_j());
    if (step) spdlog::info("  optimizer {:.3f} J", floors.optimizer_j());
    spdlog::info(
        "  the parts  {:.3f} J = {:.3f} ms at {:.0f} W | the timed steps {:.3f} ms at {:.0f} W = "
        "{:.3f} J, {:.2f}x the parts",
        parts_j, limit > 0 ? 1e3 * parts_j / limit : 0.0, limit, med, pw.watts_mean, step_j,
        parts_j > 0 ? step_j / parts_j : 0.0);
  }
  if (!floors.note.empty()) spdlog::info("floors: {}", floors.note);
  report_timing(all, 0);
  if (!o_.csv.empty()) {
    const ModelConfig& c = o_.config;
    const std::string row = fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},"
        "{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f},{:.4f},{:.3f},{},{},{},{:.4f},{},"
        "{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f},{},{},{:.4f},{},{},{:.0f},{:.1f},{:.3f},"
        "{:.4f},{:.0f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n",
        std::time(nullptr), o_.model, c.d_model, c.d_ff, c.n_layers, c.n_heads, c.vocab, c.ctx,
        o_.batch, o_.grad_accum, nranks_, device_ == DeviceKind::kCuda ? "cuda" : "cpu",
        precision_name(precision_), o_.attention, o_.ddp, o_.bucket_mb, o_.shard_optim ? 1 : 0,
        o_.bench_mode, warm, n, fw.mean, fw.std, bw.mean, bw.std, cm.mean, cm.std, op.mean, op.std,
        st.mean, st.std, med, tok_s, mfu, max_mem / 1073741824.0, o_.grad_reduce, o_.grad_transport,
        o_.comm_sms, tc.mean, nccl_env_field(), host_count(places_), o_.recompute,
        floors.forward_ms(), floors.backward_ms(), floors.optimizer_ms, floors.gemm_forward_ms,
        floors.gemm_backward_ms, floors.copy_gb_s, o_.cuda_graph ? 1 : 0, o_.adam_state, lane_ms,
        overlap_update_ ? 1 : 0, update_sms_, pw.sm_mhz_median, pw.watts_mean, pw.capped_fraction,
        step_j, floors.limit_watts, floors.gemm_forward_j + floors.gemm_backward_j,
        floors.attention_forward_j + floors.attention_backward_j,
        floors.elementwise_forward_j() + floors.elementwise_backward_j(),
        step ? floors.optimizer_j() : 0.0, parts_j);
    append_csv_row(o_.csv, kCsvHeader, row);
  }
}

}  // namespace trainer
