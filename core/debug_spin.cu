#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/debug_spin.h"

namespace trainer {
namespace {

__global__ void spin_kernel(int64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<int64_t>(now - start) < ns);
}

}  // namespace

void debug_spin(void* stream, int64_t us) {
  if (us <= 0) return;
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(us * 1000);
  CUDA_CHECK_LAUNCH("spin_kernel");
}

}  // namespace trainer
