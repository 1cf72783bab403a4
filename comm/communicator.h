// Collectives on buffer views, each returning a handle to wait on.
//
// One Communicator per rank and device kind: MpiCommunicator moves host buffers with MPI's
// non-blocking collectives; the NCCL communicator (CUDA builds) moves device buffers on its own
// stream. The gradient synchronisers and ZeRO-1 only see this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"

namespace trainer {

// An in-flight collective. wait() returns once the result may be used (on CUDA: once the compute
// stream is ordered after it; the host does not block).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  // Non-blocking check that also drives progress; true once complete.
  virtual bool test() = 0;
};
using CommHandle = std::unique_ptr<CommRequest>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual DeviceKind device() const = 0;

  // In place: every rank ends with the element-wise sum over ranks.
  virtual CommHandle all_reduce_sum(BufferView buf) = 0;
  // `buf` is split into world consecutive segments of counts[r] elements (sum == buf.count). After
  // wait(), this rank's segment, at its own offset in buf, holds the sum over ranks of that
  // segment; the other segments are left unspecified.
  virtual CommHandle reduce_scatter_sum(BufferView buf, const std::vector<int64_t>& counts) = 0;
  // In place: rank r contributes the elements segments[r] of buf (world disjoint ranges, in any
  // order and not necessarily adjacent); every rank ends with all of them.
  virtual CommHandle all_gather(BufferView buf, const std::vector<Range>& segments) = 0;
  virtual CommHandle broadcast(BufferView buf, int root) = 0;
  // Every rank's `buf` is copied whole into every other rank's copy of that rank's buffer (no
  // sum: the consumer adds the copies). Only a communicator set up with copies of the buffer
  // `buf` lies in supports it (NCCL's, with --grad-transport ce --grad-reduce bf16).
  virtual CommHandle gather_copies(BufferView buf) {
    (void)buf;
    runtime_error("the {} communicator does not exchange whole copies", name());
  }
  virtual void barrier() = 0;
  // Lets outstanding non-blocking operations advance (MPI progresses only inside MPI calls).
  virtual void progress() {}
  virtual std::string name() const = 0;
};

// Waits for every handle in the list and clears it.
void wait_all(std::vector<CommHandle>& handles);

// Checks that all_gather's segments are `world` disjoint ranges inside a buffer of `count`.
void check_segments(const std::vector<Range>& segments, int world, int64_t count);

}  // namespace trainer
