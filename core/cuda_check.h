// Checking of CUDA runtime calls: a failure names the call, the error and the rank, then throws
// RuntimeError (the runtime turns that into an abort of every rank).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace trainer {
[[noreturn]] void cuda_fail(cudaError_t err, const char* call, const char* file, int line);
// Checks the last launch error (call after every kernel launch).
void cuda_check_launch(const char* kernel, const char* file, int line);
}  // namespace trainer

#define CUDA_CHECK(call)                                                            \
  do {                                                                              \
    cudaError_t err_ = (call);                                                      \
    if (err_ != cudaSuccess) ::trainer::cuda_fail(err_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK_LAUNCH(kernel) ::trainer::cuda_check_launch(kernel, __FILE__, __LINE__)
