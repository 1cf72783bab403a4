// Residual connection and precision casts (host-callable launchers; kernels in residual.cu).
//
//   residual forward:  out = a + b        backward: da = db = dout (the gradient passes through)
//
// The replica does not launch residual_forward: both residual adds of a block are fused into
// the matmuls that produce the branch (D = branch W^T + 1 * residual, see matmul.h), which saves
// a full read and write of the stream. It remains for code that adds two stored tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

// out = a + b over n elements (out may alias a or b).
void residual_forward(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
void residual_forward(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, int64_t n,
                      cudaStream_t stream);
void residual_forward(const __half* a, const __half* b, __half* out, int64_t n,
                      cudaStream_t stream);

// dst = src rounded to the destination type (round to nearest even for bf16).
void cast(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream);
void cast(const float* src, __half* dst, int64_t n, cudaStream_t stream);
void cast(const __nv_bfloat16* src, float* dst, int64_t n, cudaStream_t stream);
void cast(const __half* src, float* dst, int64_t n, cudaStream_t stream);

}  // namespace trainer::cuda
