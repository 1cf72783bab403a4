// Testing hook for the runtime's side streams: a kernel that keeps `stream` busy, so that a test
// sees any work on another stream that does not wait for what this stream queues next.
#pragma once

#include <cstdint>

namespace trainer {

// A one-thread kernel on `stream` (a cudaStream_t) that idles `us` microseconds of the GPU's
// global timer; nothing for us <= 0.
void debug_spin(void* stream, int64_t us);

}  // namespace trainer
