// A rank's run from the top: execute() sets up, then trains (or benchmarks); the training loop and
// what happens between steps (validation, the stop vote, checkpoints) read here; the pieces they
// call are in run_setup.cpp, run_step.cpp, run_output.cpp and benchmark.cpp (see run.h).
#include "runtime/trainer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "runtime/run.h"

namespace fs = std::filesystem;

namespace trainer {

TrainResult Run::execute(bool keep_params) {
  const auto started = Clock::now();  // for --time-limit
  // Training takes stop signals from here on: one that comes while the run sets up (reads a
  // checkpoint, builds a large model) stops it before its first step instead of killing it.
  std::optional<StopSignals> signals;
  if (!o_.benchmark) signals.emplace();
  if (o_.debug_start_ms > 0) {
    spdlog::info("--debug-start-ms {}: waiting before set-up, stop signals handled",
                 o_.debug_start_ms);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o_.debug_start_ms));
  }
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
    train(result, started, *signals);
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

// The training loop: from start_step_ to --steps, or to a stop all ranks vote for after a step.
void Run::train(TrainResult& result, Clock::time_point started, const StopSignals& signals) {
  if (const int64_t stop = world_.max(int64_t{signals.received()})) {
    // Stopped during start-up: nothing trained, so nothing new to save.
    result.stop_signal = static_cast<int>(stop);
    if (rank_ == 0) {
      const std::string why = "by " + signal_name(static_cast<int>(stop));
      if (start_step_ > 0)
        spdlog::warn(
            "stopped {} after step {} of {}, during start-up, before training a step: continue "
            "with --resume {}",
            why, start_step_, o_.steps, resume_);
      else
        spdlog::warn("stopped {} during start-up, before the first step: nothing trained or saved",
                     why);
    }
    return;
  }
  on_rank0([&] { open_metrics(); });
  for (int64_t s = start_step_; s < o_.steps; ++s) {
    inject_failure(s);
    const auto launched = Clock::now();
    PhaseTimes times;
    double norm = 0;
    const double loss = train_step(s, times, norm);
    if (!std::isfinite(loss)) runtime_error("loss became {} at step {}", loss, s + 1);
    pace_step(launched);
    result.losses.push_back(loss);
    result.loss_scales.push_back(step_scale_);
    result.skipped.push_back(step_skipped_);
    if (s == start_step_) report_memory(s + 1);
    const std::vector<PhaseTimes> ranks = gather_times(times);
    on_rank0([&] {
      result.rank_times.push_back(ranks);
      log_step(s, loss, norm, ranks, ms_since(launched));
    });
    const bool last = s + 1 == o_.steps;
    if (val_ && ((o_.eval_every > 0 && (s + 1) % o_.eval_every == 0) || last))
      result.val_losses.push_back(validate(s));
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

void Run::inject_failure(int64_t s) {
  if (s == o_.debug_die_at_step && rank_ == o_.debug_die_rank) {
    spdlog::error("--debug-die-at-step {}: rank {} exits abruptly (failure test)", s, rank_);
    std::fflush(nullptr);
    std::_Exit(17);
  }
  if (s == o_.debug_stall_at_step && rank_ == o_.debug_stall_rank) {
    spdlog::error("--debug-stall-at-step {}: rank {} stops answering (failure test)", s, rank_);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void Run::pace_step(Clock::time_point launched) {
  if (o_.debug_step_ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(
        std::max(0.0, o_.debug_step_ms - ms_since(launched))));
}

double Run::validate(int64_t s) {
  const double vl = evaluate();
  on_rank0([&] {
    spdlog::info("step {:>5}/{} | validation loss {:.4f}", s + 1, o_.steps, vl);
    if (metrics_.is_open()) {
      metrics_ << json{{"step", s + 1}, {"val_loss", vl}}.dump() << "\n";
      check_metrics_written();
    }
  });
  return vl;
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

TrainResult run_training(const Options& o, MpiCommunicator& world, bool keep_params) {
  Run run(o, world);
  return run.execute(keep_params);
}

}  // namespace trainer
