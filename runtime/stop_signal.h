// Graceful stop: SIGTERM, SIGINT or SIGUSR1 asks a training run to finish its current step, write
// a checkpoint and exit, instead of dying with everything since the last checkpoint lost.
//
// Slurm sends SIGTERM at the time limit (and, with `--signal=B:USR1@120`, SIGUSR1 ahead of it);
// Open MPI's mpirun forwards SIGUSR1 to every rank, and on SIGTERM or SIGINT sends the ranks
// SIGTERM. The handler only records the signal; the training loop polls it after each step, and
// the ranks agree on it, since a signal may reach them at different times.
#pragma once

#include <string>

namespace trainer {

// Installs the handlers while alive and restores the previous ones after. A second SIGINT (a
// user pressing Ctrl-C twice) ends the process at once with 130.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since construction, or 0.
  int received() const;
};

// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int sig);

}  // namespace trainer
