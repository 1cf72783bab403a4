// Error checks for the developer probes (overlap_probe, gemm_energy_probe, memory_energy_probe):
// they stand alone, outside the trainer's error handling, so a failed call prints where and exits.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                  \
  do {                                                                         \
    const cudaError_t err_ = (x);                                              \
    if (err_ != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define CB(x)                                                             \
  do {                                                                    \
    const cublasStatus_t st_ = (x);                                       \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                   \
      std::printf("%s:%d cuBLASLt status %d\n", __FILE__, __LINE__, st_); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)
