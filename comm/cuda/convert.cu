#include <cuda_bf16.h>

#include "comm/cuda/convert.h"
#include "core/cuda_check.h"
#include "core/error.h"

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

// y += x[0] + x[1] + ... (left to right, so every rank that sums the same inputs gets the same
// bits); float4 where all are 16-byte aligned (the flat gradient buffer's tensors start on
// 256-byte boundaries), scalars otherwise.
struct Sources {
  const float* x[kMaxAddSources];
  int count;
};

__global__ void add_f32_kernel(float* __restrict__ y, const Sources src, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  uintptr_t address = reinterpret_cast<uintptr_t>(y);
  for (int k = 0; k < src.count; ++k) address |= reinterpret_cast<uintptr_t>(src.x[k]);
  if ((address & 15) == 0) {
    const int64_t n4 = n / 4;
    for (int64_t j = i; j < n4; j += stride) {
      float4 a = reinterpret_cast<float4*>(y)[j];
      for (int k = 0; k < src.count; ++k) {
        const float4 b = reinterpret_cast<const float4*>(src.x[k])[j];
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      }
      reinterpret_cast<float4*>(y)[j] = a;
    }
    i += n4 * 4;  // the < 4 tail elements go to the first threads
  }
  for (; i < n; i += stride) {
    float a = y[i];
    for (int k = 0; k < src.count; ++k) a += src.x[k][i];
    y[i] = a;
  }
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

void add_f32(float* dst, const float* const* src, int count, int64_t n, void* stream,
             int max_ctas) {
  if (n == 0 || count == 0) return;
  TRAINER_CHECK(count <= kMaxAddSources, "add_f32: {} sources, at most {}", count, kMaxAddSources);
  Sources s{};
  for (int k = 0; k < count; ++k) s.x[k] = src[k];
  s.count = count;
  const int64_t cap = max_ctas > 0 ? max_ctas : 264;
  const int64_t b = (n / 4 + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(b < cap ? (b > 0 ? b : 1) : cap);
  add_f32_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, s, n);
  CUDA_CHECK_LAUNCH("add_f32_kernel");
}

}  // namespace trainer::cuda
