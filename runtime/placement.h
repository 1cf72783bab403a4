// Where each rank runs: its host, its place among that host's ranks (which picks its GPU), and
// its device. Rank 0 prints it at start-up and names each rank's host in the per-rank reports, so
// a multi-node launch that mapped ranks wrongly is visible at once.
#pragma once

#include <string>
#include <vector>

#include "comm/mpi_communicator.h"

namespace trainer {

struct RankPlace {
  std::string host;       // the machine's hostname
  std::string nccl_host;  // NCCL_HOSTID, where set (launch/as_hosts.sh: hosts on one machine)
  int local_rank = 0;     // among the ranks of this host (an MPI shared-memory split)
  int gpu = -1;           // CUDA device index; -1 on the CPU
};

// Every rank's place, on rank 0 in rank order (empty elsewhere). A collective.
std::vector<RankPlace> gather_places(const MpiCommunicator& world, const RankPlace& mine);

// This rank's host, local rank and GPU (-1: none).
RankPlace this_place(int local_rank, int gpu);

// How many distinct hosts the ranks run on (as NCCL sees them: NCCL_HOSTID where set).
int host_count(const std::vector<RankPlace>& places);

// One line per host, hosts in the order of their lowest rank:
// "node1: ranks 0 (local 0, GPU 0), 2 (local 1, GPU 1)", with ", NCCL host X" per rank where
// NCCL_HOSTID is set.
std::vector<std::string> describe_places(const std::vector<RankPlace>& places);

}  // namespace trainer
