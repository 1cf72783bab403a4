// A second CUDA stream for work that may run beside the compute stream -- the unsharded AdamW
// update beside the next forward -- and the events the compute stream waits on for it.
#pragma once

#include <memory>

namespace trainer {

class SideStream {
 public:
  virtual ~SideStream() = default;
  virtual void* stream() = 0;  // cudaStream_t
  // The side stream waits for everything queued on the main stream so far. Marks made before are
  // forgotten: every one of them must have been waited for.
  virtual void fork() = 0;
  // An event recorded on the side stream now (a cudaEvent_t), for wait().
  virtual void* mark() = 0;
  // The main stream waits for the event; the host does not.
  virtual void wait(void* mark) = 0;
};

// For the main stream `main` (a cudaStream_t) of the current device; throws without CUDA.
std::unique_ptr<SideStream> make_side_stream(void* main);

}  // namespace trainer
