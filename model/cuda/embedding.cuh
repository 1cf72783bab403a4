// Token embedding, forward and backward (host-callable launchers; kernels in embedding.cu).
//
//   forward:  out[i, :] = table[ids[i], :]                         (overwrites out)
//   backward: dtable[v, :] += sum over {i : ids[i] == v} of dout[i, :]   (accumulates, fp32)
//
// The backward is deterministic without atomics: the host groups the positions of the
// micro-batch by token id (model/embedding_buckets.h; it has the ids anyway), and one thread
// block column sums each group in increasing position order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t d,
                       cudaStream_t stream);
void embedding_forward(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out,
                       int64_t n, int64_t d, cudaStream_t stream);
void embedding_forward(const int32_t* ids, const __half* table, __half* out, int64_t n, int64_t d,
                       cudaStream_t stream);

// bucket_ids / bucket_start / positions: device copies of build_embedding_buckets' output with
// num_buckets groups; dout (n, d); dtable (vocab, d) fp32.
void embedding_backward(const float* dout, const int32_t* bucket_ids, const int32_t* bucket_start,
                        const int32_t* positions, int64_t num_buckets, float* dtable, int64_t d,
                        cudaStream_t stream);
void embedding_backward(const __nv_bfloat16* dout, const int32_t* bucket_ids,
                        const int32_t* bucket_start, const int32_t* positions, int64_t num_buckets,
                        float* dtable, int64_t d, cudaStream_t stream);
void embedding_backward(const __half* dout, const int32_t* bucket_ids, const int32_t* bucket_start,
                        const int32_t* positions, int64_t num_buckets, float* dtable, int64_t d,
                        cudaStream_t stream);

}  // namespace trainer::cuda
