// Attention for decoding: a few new query rows over a long key/value cache (host-callable
// launchers; kernel in decode_attention.cu). Query i, at position pos0 + i, attends causally to
// cache rows 0 .. pos0 + i:
//
//   s_j = q_i . k_j / sqrt(dh),  p = softmax(s),  out_i = sum_j p_j v_j      (fp32 arithmetic)
//
// One thread block per (head, query): the scores of the row live in shared memory, warps take
// the keys in turn (lanes split the channels), and groups of threads split the positions of the
// weighted sum of values. The training kernels are built for many queries; with one query per
// sequence they would leave the GPU idle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

// q: n rows (row stride ldq), head h at columns [h*dh, (h+1)*dh); k_cache, v_cache: rows of d =
// H*dh holding positions 0 .. pos0 + n - 1 (the new rows' keys and values included); out: n rows
// of d. Returns false (launching nothing) when a row's scores do not fit in shared memory, which
// decode_attention_max_len() bounds.
void decode_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache,
                      float* out, int64_t n, int64_t pos0, int64_t H, int64_t head_dim,
                      cudaStream_t stream);
void decode_attention(const __nv_bfloat16* q, int64_t ldq, const __nv_bfloat16* k_cache,
                      const __nv_bfloat16* v_cache, __nv_bfloat16* out, int64_t n, int64_t pos0,
                      int64_t H, int64_t head_dim, cudaStream_t stream);
void decode_attention(const __half* q, int64_t ldq, const __half* k_cache, const __half* v_cache,
                      __half* out, int64_t n, int64_t pos0, int64_t H, int64_t head_dim,
                      cudaStream_t stream);

// The longest cache (positions) decode_attention handles on the current device.
int64_t decode_attention_max_len(int64_t head_dim);

}  // namespace trainer::cuda
