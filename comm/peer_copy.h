// Gradient sums (and ZeRO-1's parameter all-gather) between the GPUs of a job whose ranks are all
// on one host, moved by the GPUs' copy engines over NVLink instead of by NCCL's kernels
// (--grad-transport ce).
//
// Why: NCCL's collectives run as kernels, and during backward their CTAs hold SMs that the
// gradient GEMMs need (docs/performance.md measures the cost). A copy engine moves memory
// without any SM; the only kernel left is the sum itself, which is bound by memory.
//
// Each rank maps every peer's buffer and block of three counters (CUDA IPC). For the n-th
// collective, with a view split into one segment per rank (rank r owns segment r):
//   compute stream:  posted := n                        (after the bucket's gradient kernels)
//   comm stream:     wait every peer's posted >= n
//                    copy every peer's `mine` -> staging; mine += their sum   (in pieces)
//                    reduced := n
//                    [all-reduce only] wait every peer's reduced >= n; copy each peer's own
//                    segment from it
//                    consumed := n;  wait every peer's consumed >= n
// An all-gather is the same without the sum: wait for each peer's posted >= n, copy its segment;
// consumed := n; wait for every peer's consumed >= n. gather_copies() is that all-gather with
// every peer's whole view copied into a local copy of that peer's buffer instead of in place:
// the ranks exchange bf16 gradients whole and the optimizer adds the copies (no sum kernel, so
// backward shares the GPU with copy engines only).
// The counters are written and waited on with stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32), so no host blocks. The final wait means that when the collective's
// completion event fires, every peer has also finished reading this rank's buffer, so the
// optimizer and the next backward may overwrite it. A segment is summed by its owner alone, in
// rank order, so after an all-reduce every rank holds the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/buffer.h"

namespace trainer {

class PeerCopy {
 public:
  // Collective over `boot`. `buf` (on `device`; fp32 for sums) must start a cudaMalloc allocation,
  // as DeviceBuffer's views do. sum_ctas caps the CTAs of the sum kernel (0: the kernel's default).
  // With `hold_copies`, allocates one buffer like `buf` per peer for gather_copies(). Throws
  // UsageError on every rank when the ranks are not all on one host (or are more than 8), or when
  // the GPUs cannot map each other's memory.
  PeerCopy(const MpiCommunicator& boot, BufferView buf, int device, int sum_ctas = 0,
           bool hold_copies = false);
  ~PeerCopy();
  PeerCopy(const PeerCopy&) = delete;
  PeerCopy& operator=(const PeerCopy&) = delete;

  // True for a view inside the registered buffer, of its dtype.
  bool covers(const BufferView& v) const;

  // v is split into consecutive segments of counts[r] elements, one per rank. Sums this rank's
  // segment over all ranks into this rank's v; with `gather`, also copies every peer's summed
  // segment into this rank's v (an all-reduce; without, a reduce-scatter). Work is queued on
  // `compute` (one counter write) and on `comm`; completion is whatever `comm` records next.
  void reduce(const BufferView& v, const std::vector<int64_t>& counts, bool gather,
              cudaStream_t compute, cudaStream_t comm);
  // All-gather: segments[r] of buf (rank r's elements) are in place on rank r; copies every
  // peer's segment into this rank's buf. Queued like reduce().
  void gather(const BufferView& buf, const std::vector<Range>& segments, cudaStream_t compute,
              cudaStream_t comm);
  // v (inside the registered buffer) of every peer p is copied to the same elements of copy(p).
  // Needs hold_copies. Queued like reduce().
  void gather_copies(const BufferView& v, cudaStream_t compute, cudaStream_t comm);
  // Rank r's buffer as this rank holds it: the registered buffer itself for this rank, the copy
  // gather_copies() fills for a peer.
  BufferView copy(int r) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
