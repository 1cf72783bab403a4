#include "core/cuda_check.h"

#include "core/log.h"

namespace trainer {

void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
  runtime_error("rank {}: CUDA call {} failed at {}:{}: {} ({})", log_rank(), call, file, line,
                cudaGetErrorString(err), static_cast<int>(err));
}

void cuda_check_launch(const char* kernel, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    runtime_error("rank {}: launch of kernel {} failed at {}:{}: {}", log_rank(), kernel, file,
                  line, cudaGetErrorString(err));
}

}  // namespace trainer
