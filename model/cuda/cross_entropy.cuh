// Softmax + cross-entropy over the vocabulary, fused with its backward (host-callable launchers;
// kernels in cross_entropy.cu). All math in fp32 whatever the logits' type; each exp is taken as
// 2^(x log2 e) on the special-function unit (common.cuh's fast_exp2).
//
//   forward:  lse_i = m_i + log(sum_c exp(l[i,c] - m_i)),  m_i = max_c l[i,c]
//             loss_i = lse_i - l[i, t_i]
//   backward: dl[i,c] = scale * (exp(l[i,c] - lse_i) - [c == t_i])
//
// The backward needs nothing but lse_i and the logits, so the fused version writes dl over the
// logits in the same kernel that found lse_i (the row comes from memory once: staged in shared
// memory, or read again from L1/L2). The replica runs it in forward with scale 1 and applies the
// backward's scale as the alpha of the two lm_head matmuls that consume dl.
//
// The token losses are also summed on the device: when `loss_sum` is given, the last block to
// finish adds sum_i loss_i (in a fixed order, so deterministically) to *loss_sum (fp64).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

// logits: n rows of V at row stride ld (>= V). losses: n fp32 (written). loss_sum and counter
// (one zero-initialised unsigned, left at zero) may both be null to skip the sum. Targets must lie
// in [0, V) (the caller checks them on the host).
void cross_entropy_forward(const float* logits, int64_t ld, const int32_t* targets, float* losses,
                           double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream);
void cross_entropy_forward(const __nv_bfloat16* logits, int64_t ld, const int32_t* targets,
                           float* losses, double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream);
void cross_entropy_forward(const __half* logits, int64_t ld, const int32_t* targets, float* losses,
                           double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream);

// The same, then logits[i, c] = scale * (softmax - onehot) in place (columns >= V untouched).
void cross_entropy_forward_backward(float* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream);
void cross_entropy_forward_backward(__nv_bfloat16* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream);
void cross_entropy_forward_backward(__half* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream);

}  // namespace trainer::cuda
