// Communicator over NCCL for device buffers (the CUDA backend).
//
// NCCL is bootstrapped over MPI: rank 0 makes the unique id and MPI_Bcast sends it. Collectives
// run on one dedicated, high-priority communication stream per rank and are ordered with events
// only: each collective first waits for an event recorded on the compute stream at the moment it
// is launched (so it sees every gradient kernel queued before), and wait() makes the compute
// stream wait for the collective's completion event. The host never blocks inside a step.
//
// A watchdog thread checks the collectives in flight: one that has not finished after
// `timeout_s`, or an asynchronous NCCL error, ends every rank (ncclCommAbort, then MPI_Abort)
// with a message naming this rank and the collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace trainer {

// One collective as the trace and the per-rank report see it (times from the trace origin).
struct CollectiveRecord {
  std::string name;  // e.g. "all_reduce 1.25 MiB"
  double start_ms = 0, end_ms = 0;
};

struct NcclOptions {
  int device = 0;
  void* compute_stream = nullptr;  // cudaStream_t the collectives are ordered against
  bool reduce_in_bf16 = false;     // --grad-reduce bf16: fp32 sums travel as bf16
  int64_t staging_elems = 0;       // largest fp32 buffer reduced in bf16 (scratch size)
  BufferView peer_copy;            // --grad-transport ce: fp32 sums inside this buffer use PeerCopy
  BufferView peer_gather;          // and all-gathers inside this one (ZeRO-1's parameters)
  // --grad-transport ce --grad-reduce bf16: this bf16 gradient buffer is exchanged whole
  // (gather_copies); the communicator holds one copy of it per peer.
  BufferView peer_copies;
  // CTAs (channels) per collective, NCCL's minCTAs = maxCTAs, and the cap on the copy-engine
  // path's sum kernel; 0 = NCCL (the kernel) decides.
  int ctas = 0;
  double timeout_s = 300;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const MpiCommunicator& boot, const NcclOptions& o);
  ~NcclCommunicator() override;

  int rank() const override;
  int world() const override;
  DeviceKind device() const override { return DeviceKind::kCuda; }
  CommHandle all_reduce_sum(BufferView buf) override;
  CommHandle reduce_scatter_sum(BufferView buf, const std::vector<int64_t>& counts) override;
  CommHandle all_gather(BufferView buf, const std::vector<Range>& segments) override;
  CommHandle broadcast(BufferView buf, int root) override;
  CommHandle gather_copies(BufferView buf) override;
  // Rank r's whole peer_copies buffer as this rank holds it (this rank's: the buffer itself).
  BufferView copy_of(int r) const;
  void barrier() override;
  std::string name() const override { return "nccl"; }

  // Sets the event every time is measured from (recorded by the caller on the compute stream).
  void set_origin(void* cuda_event);
  // The collectives that finished since the last call, in launch order, with their times. Does
  // not wait: one still running (an all-gather overlapping forward) comes with a later call.
  std::vector<CollectiveRecord> take_records();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const MpiCommunicator& boot,
                                                         const NcclOptions& o);

}  // namespace trainer
