// The training loop: one Trainer per rank, all ranks in lock-step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "runtime/options.h"
#include "runtime/step_timer.h"

namespace trainer {

struct TrainResult {
  std::vector<double> losses;       // mean training loss of every step run (all ranks agree)
  std::vector<double> val_losses;   // validation losses, in order
  std::vector<float> params;        // final fp32 master parameters, whole flat buffer
  std::vector<double> loss_scales;  // the loss scale of every step run (1 without loss scaling)
  std::vector<bool> skipped;        // steps whose update loss scaling skipped
  int64_t first_step = 0;           // 0, or the step a resumed run started from
  std::vector<std::vector<PhaseTimes>> rank_times;  // rank 0 only: [step][rank]
  // Training stopped early, after a checkpoint: by this signal, or at --time-limit.
  int stop_signal = 0;
  bool stopped_at_time_limit = false;
};

// Sets up the replica, optimizer and gradient synchroniser from `o`, then trains (or, with
// --benchmark, times steps). Every rank of `world` must call it with matching options; a setting
// that differs, a bad file or a bad flag makes every rank throw the same UsageError. SIGTERM,
// SIGINT or SIGUSR1 during training, or reaching --time-limit, stops every rank after the current
// step, with a checkpoint.
TrainResult run_training(const Options& o, MpiCommunicator& world, bool keep_params = false);

}  // namespace trainer
