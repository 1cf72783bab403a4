// main() for tests that run under mpirun: MPI is initialised around the Catch2 session, and the
// exit code is the worst over all ranks, so a failure on any rank fails the test.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <cstdio>

#include "comm/mpi_init.h"
#include "core/device_buffer.h"
#include "tests/catch.h"

int main(int argc, char** argv) {
  trainer::init_mpi(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
#ifdef TEST_ON_GPU
  // One GPU per rank; with fewer GPUs the test is skipped (CTest SKIP_RETURN_CODE 77).
  if (trainer::cuda_device_count() < world) {
    if (rank == 0)
      std::printf("%d rank(s) but %d GPU(s) visible: GPU test skipped\n", world,
                  trainer::cuda_device_count());
    MPI_Finalize();
    return 77;
  }
#endif
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
