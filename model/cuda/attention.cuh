// The "simple" causal attention: materialised scores through cuBLASLt strided-batched matmuls
// and an fp32 softmax (host-callable launchers; kernels in attention.cu). It works for every
// head dimension, sequence length and precision; FlashAttention (flash_attention.h) replaces it
// for bf16 where its kernels exist.
//
// Per (batch b, head h), with s = 1/sqrt(dh), on head-major operands (each (b, h) a (T, dh)
// matrix, see rope.cuh):
//   forward:  S = s q k^T (fp32),  P = softmax over j <= i of S[i, j] (fp32 math; 0 above the
//             diagonal; stored in the activation type), O = P v
//   backward: dv = P^T dO,  dP = dO v^T (fp32),  dS = P * (dP - rowsum(P * dP)),
//             dq = s dS k,  dk = s dS^T q
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/matmul.h"

namespace trainer::cuda {

// q, k, v: head-major (B, H, T, dh). probs: (B, H, T, T), written (kept for backward).
// scores: fp32 scratch of B*H*T*T. out: token-major (B, T, H*dh). out_hm: scratch of B*T*H*dh
// (the head-major product before it is laid out token-major).
void attention_forward(Matmul& mm, const float* q, const float* k, const float* v, float* probs,
                       float* out, float* scores, float* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream);
void attention_forward(Matmul& mm, const __nv_bfloat16* q, const __nv_bfloat16* k,
                       const __nv_bfloat16* v, __nv_bfloat16* probs, __nv_bfloat16* out,
                       float* scores, __nv_bfloat16* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream);
void attention_forward(Matmul& mm, const __half* q, const __half* k, const __half* v, __half* probs,
                       __half* out, float* scores, __half* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream);

// dout: token-major (B, T, H*dh). dq, dk, dv: head-major, overwritten. probs is overwritten with
// dS (it is not needed afterwards). scores: fp32 scratch of B*H*T*T; dout_hm: scratch of
// B*T*H*dh.
void attention_backward(Matmul& mm, const float* q, const float* k, const float* v, float* probs,
                        const float* dout, float* dq, float* dk, float* dv, float* scores,
                        float* dout_hm, int64_t B, int64_t T, int64_t H, int64_t head_dim,
                        bool tf32, cudaStream_t stream);
void attention_backward(Matmul& mm, const __nv_bfloat16* q, const __nv_bfloat16* k,
                        const __nv_bfloat16* v, __nv_bfloat16* probs, const __nv_bfloat16* dout,
                        __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* scores,
                        __nv_bfloat16* dout_hm, int64_t B, int64_t T, int64_t H, int64_t head_dim,
                        bool tf32, cudaStream_t stream);
void attention_backward(Matmul& mm, const __half* q, const __half* k, const __half* v,
                        __half* probs, const __half* dout, __half* dq, __half* dk, __half* dv,
                        float* scores, __half* dout_hm, int64_t B, int64_t T, int64_t H,
                        int64_t head_dim, bool tf32, cudaStream_t stream);

}  // namespace trainer::cuda
