// trainer: one process per rank (mpirun -np N ./trainer ...), or a single process on its own.
#include <mpi.h>

#include <exception>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/options.h"
#include "runtime/trainer.h"

int main(int argc, char** argv) {
  using namespace trainer;
  MPI_Init(&argc, &argv);
  MpiCommunicator world(MPI_COMM_WORLD);
  init_logging(world.rank(), world.world());
  int code = 0;
  try {
    Options o;
    agree_on_usage_errors(world, [&] { o = parse_options(argc, argv); });
    run_training(o, world);
  } catch (const AgreedUsageError& e) {
    // Every rank saw this error at the same point: stop cleanly with exit code 2.
    spdlog::error("{}", e.what());
    code = 2;
  } catch (const std::exception& e) {
    // An error on this rank alone (I/O, a device, a collective): stop every rank.
    spdlog::critical("{}: {}", dynamic_cast<const UsageError*>(&e) ? "error" : "fatal", e.what());
    code = dynamic_cast<const UsageError*>(&e) ? 2 : 1;
    if (world.world() > 1) MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
  return code;
}
