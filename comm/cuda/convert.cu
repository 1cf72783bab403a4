#include <cuda_bf16.h>

#include "comm/cuda/convert.h"
#include "core/cuda_check.h"

namespace trainer::cuda {
namespace {

// y = bf16(x), round to nearest even; grid-stride.
__global__ void f32_to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

// y = float(x), exact.
__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ y,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

void f32_to_bf16(const float* src, void* dst, int64_t n, void* stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      src, static_cast<__nv_bfloat16*>(dst), n);
  CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

void bf16_to_f32(const void* src, float* dst, int64_t n, void* stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(src), dst, n);
  CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
}

}  // namespace trainer::cuda
