// Communicator over MPI for host buffers (the CPU backend), plus the small host-side helpers the
// runtime needs whatever the device: scalar reductions, string broadcast, local rank.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace trainer {

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  CommHandle all_reduce_sum(BufferView buf) override;
  CommHandle reduce_scatter_sum(BufferView buf, const std::vector<int64_t>& counts) override;
  CommHandle all_gather(BufferView buf, const std::vector<Range>& segments) override;
  CommHandle broadcast(BufferView buf, int root) override;
  void barrier() override;
  void progress() override;
  std::string name() const override { return "mpi"; }

  MPI_Comm comm() const { return comm_; }
  // From now on a blocking MPI call or wait of this rank that lasts longer than `seconds` stops
  // every rank (abort_all_ranks): a peer host that died or was cut off would otherwise leave the
  // collective waiting forever. 0 turns the limit off (the default).
  void set_wait_limit(double seconds);

  // Blocking host-side helpers.
  double sum(double x) const;
  double max(double x) const;
  int64_t max(int64_t x) const;
  std::string broadcast_string(const std::string& s, int root) const;
  // Rank 0 receives every rank's `n` floats (n may differ between ranks), back to back in rank
  // order, into root_out (ignored elsewhere). The total must fit MPI's int counts.
  void gather_to_root(const float* mine, int64_t n, float* root_out) const;
  // Rank 0 receives every rank's string, in rank order.
  std::vector<std::string> gather_strings_to_root(const std::string& mine) const;
  // Rank 0 receives every rank's values (rows in rank order); others get an empty vector.
  std::vector<std::vector<double>> gather_to_root(const std::vector<double>& mine) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  std::vector<CommRequest*> live_;  // requests not yet complete, for progress()
  struct Watchdog;
  std::shared_ptr<Watchdog> watchdog_;
  // Runs `call`, a blocking MPI call named `what`, under the watchdog.
  template <typename F>
  void blocking(const char* what, F&& call) const;
  friend class MpiRequest;
};

// This machine's hostname (as the launcher and the per-rank report name it).
std::string host_name();

// Stops every rank at once, from any thread: logs `why` (critical, naming this host), runs
// `before_abort` (e.g. ncclCommAbort), then MPI_Abort; exits with code 3 after a few seconds should
// MPI_Abort itself not get through to the others (a dead host).
[[noreturn]] void abort_all_ranks(const std::string& why,
                                  const std::function<void()>& before_abort = {});

// This rank's place among the ranks of `comm` on its node (a shared-memory split of `comm`).
struct NodeRanks {
  int rank = 0;  // local rank
  int size = 1;  // ranks on this node
};
NodeRanks node_ranks_of(MPI_Comm comm);
// Rank within this node.
inline int local_rank_of(MPI_Comm comm) { return node_ranks_of(comm).rank; }

// Runs `check` on every rank; if it throws UsageError on any rank, every rank throws a UsageError
// carrying the message of the lowest failing rank, so all ranks stop with the same clear error.
template <typename F>
void agree_on_usage_errors(const MpiCommunicator& comm, F&& check);
void agree_on_error_message(const MpiCommunicator& comm, const std::string& my_error);
// The lowest rank for which `mine` is true, or comm.world() when it is true nowhere (a collective).
int lowest_rank_where(const MpiCommunicator& comm, bool mine);

template <typename F>
void agree_on_usage_errors(const MpiCommunicator& comm, F&& check) {
  std::string err;
  try {
    check();
  } catch (const UsageError& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  agree_on_error_message(comm, err);
}

}  // namespace trainer
