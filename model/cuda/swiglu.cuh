// SwiGLU gate of the feed-forward block (host-callable launchers; kernels in swiglu.cu).
// a = x W1^T and b = x W3^T come out of one fused matmul as two column blocks of one
// (rows, 2*d_ff) matrix, so both are addressed with a shared row stride.
//
//   forward:  out = silu(a) * b,  silu(a) = a * sigmoid(a)
//   backward: da = dout * b * silu'(a),  db = dout * silu(a),
//             silu'(a) = sigmoid(a) * (1 + a * (1 - sigmoid(a)))
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

// a, b: rows x cols at row stride ld_ab; out: rows x cols contiguous (row stride cols).
void swiglu_forward(const float* a, const float* b, int64_t ld_ab, float* out, int64_t rows,
                    int64_t cols, cudaStream_t stream);
void swiglu_forward(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t ld_ab,
                    __nv_bfloat16* out, int64_t rows, int64_t cols, cudaStream_t stream);
void swiglu_forward(const __half* a, const __half* b, int64_t ld_ab, __half* out, int64_t rows,
                    int64_t cols, cudaStream_t stream);

// dout: rows x cols contiguous; da, db at row stride ld_d (overwritten; may alias a and b, each
// element is read before it is written).
void swiglu_backward(const float* a, const float* b, int64_t ld_ab, const float* dout, float* da,
                     float* db, int64_t ld_d, int64_t rows, int64_t cols, cudaStream_t stream);
void swiglu_backward(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t ld_ab,
                     const __nv_bfloat16* dout, __nv_bfloat16* da, __nv_bfloat16* db, int64_t ld_d,
                     int64_t rows, int64_t cols, cudaStream_t stream);
void swiglu_backward(const __half* a, const __half* b, int64_t ld_ab, const __half* dout,
                     __half* da, __half* db, int64_t ld_d, int64_t rows, int64_t cols,
                     cudaStream_t stream);

}  // namespace trainer::cuda
