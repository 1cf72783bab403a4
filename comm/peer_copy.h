// Gradient sums (and ZeRO-1's parameter all-gather) between the two GPUs of a 2-rank job on one
// host, moved by the GPUs' copy engines over NVLink instead of by NCCL's kernels
// (--grad-transport ce).
//
// Why: NCCL's collectives run as kernels, and during backward their CTAs hold SMs that the
// gradient GEMMs need (docs/performance.md measures the cost). A copy engine moves memory
// without any SM; the only kernel left is the sum itself, which is bound by memory.
//
// Each rank maps the peer's gradient buffer and a block of three counters (CUDA IPC). For the
// n-th collective, with segment `mine` owned by this rank and `theirs` by the peer:
//   compute stream:  posted := n                        (after the bucket's gradient kernels)
//   comm stream:     wait peer.posted >= n
//                    copy peer's `mine` -> staging; mine += staging   (chunks of the staging size)
//                    reduced := n
//                    [all-reduce only] wait peer.reduced >= n; copy peer's `theirs` -> theirs
//                    consumed := n;  wait peer.consumed >= n
// An all-gather is the same without the sum: wait peer.posted >= n; copy peer's `theirs` -> theirs;
// consumed := n; wait peer.consumed >= n.
// The counters are written and waited on with stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32), so neither host blocks. The final wait means that when the collective's
// completion event fires, the peer has also finished reading this rank's buffer, so the
// optimizer and the next zero_grads may overwrite it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "comm/mpi_communicator.h"
#include "core/buffer.h"

namespace trainer {

class PeerCopy {
 public:
  // Collective over `boot`. `buf` (on `device`; fp32 for sums) must start a cudaMalloc allocation,
  // as DeviceBuffer's views do. sum_ctas caps the CTAs of the sum kernel (0: the kernel's default).
  // Throws UsageError on every rank when the job is not two ranks on one host, or when the GPUs
  // cannot map each other's memory.
  PeerCopy(const MpiCommunicator& boot, BufferView buf, int device, int sum_ctas = 0);
  ~PeerCopy();
  PeerCopy(const PeerCopy&) = delete;
  PeerCopy& operator=(const PeerCopy&) = delete;

  // True for a view inside the registered buffer, of its dtype.
  bool covers(const BufferView& v) const;

  // v is split at element `split`: rank 0 owns [0, split), rank 1 [split, count). Sums this rank's
  // segment over both ranks into this rank's v; with `gather`, also copies the peer's summed
  // segment into this rank's v (an all-reduce; without, a reduce-scatter). Work is queued on
  // `compute` (one counter write) and on `comm`; completion is whatever `comm` records next.
  void reduce(const BufferView& v, int64_t split, bool gather, cudaStream_t compute,
              cudaStream_t comm);
  // All-gather of two segments of buf: this rank's is already in place; copies the peer's
  // elements `theirs` into this rank's buf. Queued like reduce().
  void gather(const BufferView& buf, Range theirs, cudaStream_t compute, cudaStream_t comm);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
