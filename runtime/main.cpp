// trainer: one process per rank (mpirun -np N ./trainer ...), or a single process on its own.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <new>

#include "comm/mpi_communicator.h"
#include "comm/mpi_init.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/options.h"
#include "runtime/trainer.h"

int main(int argc, char** argv) {
  using namespace trainer;
  init_mpi(&argc, &argv);
  MpiCommunicator world(MPI_COMM_WORLD);
  init_logging(world.rank(), world.world());
  int code = 0;
  try {
    Options o;
    agree_on_usage_errors(world, [&] { o = parse_options(argc, argv); });
    // --help on any rank: the lowest such rank prints it, and every rank stops cleanly.
    const int helper = lowest_rank_where(world, !o.help.empty());
    if (helper < world.world()) {
      if (world.rank() == helper) std::fputs(o.help.c_str(), stdout);
      MPI_Finalize();
      return 0;
    }
    // Stopped early (after a checkpoint): by a signal, exit as a process ended by it would; at
    // --time-limit, as timeout(1) does.
    const TrainResult r = run_training(o, world);
    if (r.stop_signal) code = 128 + r.stop_signal;
    if (r.stopped_at_time_limit) code = 124;
  } catch (const AgreedUsageError& e) {
    // Every rank saw this error at the same point: stop cleanly with exit code 2.
    spdlog::error("{}", e.what());
    code = 2;
  } catch (const std::exception& e) {
    // An error on this rank alone (I/O, a device, a collective, memory): stop every rank.
    spdlog::critical("{}: {}", dynamic_cast<const UsageError*>(&e) ? "error" : "fatal",
                     dynamic_cast<const std::bad_alloc*>(&e)
                         ? fmt::format("out of host memory: {}", kOutOfMemoryAdvice)
                         : std::string(e.what()));
    code = dynamic_cast<const UsageError*>(&e) ? 2 : 1;
    if (world.world() > 1) MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
  return code;
}
