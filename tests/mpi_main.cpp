// main() for tests that run under mpirun: MPI is initialised around the Catch2 session, and the
// exit code is the worst over all ranks, so a failure on any rank fails the test.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include "tests/catch.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
