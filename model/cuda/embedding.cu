// Token embedding: forward gather and deterministic bucketed backward (see embedding.cuh).
#include <algorithm>

#include "model/cuda/common.cuh"
#include "model/cuda/embedding.cuh"

namespace trainer::cuda {
namespace {

// forward: out[i, c] = table[ids[i], c]. One thread moves kV consecutive channels of one row.
template <typename T, int kV>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ ids,
                                         const T* __restrict__ table, T* __restrict__ out,
                                         int64_t n, int64_t d) {
  const int64_t chunks = d / kV;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * chunks) return;
  int64_t row, c;
  chunk_position(idx, chunks, kV, row, c);
  const int64_t token = ids[row];
  store_pack<kV>(out + row * d + c, load_pack<kV>(table + token * d + c));
}

// backward: dtable[v, c] += sum_{i in group(v)} dout[i, c]. Block x = one token group (empty
// groups do nothing), threads over channel chunks; the sum runs over the group's positions in
// ascending order, so the result does not depend on scheduling.
template <typename T, int kV>
__global__ void embedding_backward_kernel(const T* __restrict__ dout,
                                          const int32_t* __restrict__ bucket_ids,
                                          const int32_t* __restrict__ bucket_start,
                                          const int32_t* __restrict__ positions,
                                          float* __restrict__ dtable, int64_t d) {
  const int64_t g = blockIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kV;
  if (c >= d) return;
  float acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.0f;
  const int begin = bucket_start[g], end = bucket_start[g + 1];
  if (begin == end) return;  // padding of a recorded step's grouping (CudaReplica::stage)
  for (int p = begin; p < end; ++p) {
    const Pack<T, kV> v = load_pack<kV>(dout + static_cast<int64_t>(positions[p]) * d + c);
#pragma unroll
    for (int k = 0; k < kV; ++k) acc[k] += to_float(v.v[k]);
  }
  float* dst = dtable + static_cast<int64_t>(bucket_ids[g]) * d + c;
  constexpr int kF = kV < 4 ? kV : 4;  // fp32 elements per 16-byte access
#pragma unroll
  for (int k = 0; k < kV; k += kF) {
    Pack<float, kF> w = load_pack<kF>(dst + k);
#pragma unroll
    for (int j = 0; j < kF; ++j) w.v[j] += acc[k + j];
    store_pack<kF>(dst + k, w);
  }
}

template <typename T>
void forward_impl(const int32_t* ids, const T* table, T* out, int64_t n, int64_t d,
                  cudaStream_t stream) {
  TRAINER_CHECK(n >= 0 && d > 0, "embedding_forward: n {} d {}", n, d);
  TRAINER_CHECK(ids && table && out, "embedding_forward: null pointer");
  if (n == 0) return;
  const int vec = vector_width<T>({table, out}, {d});
  const int threads = 256;
  const int64_t blocks = ceil_div(n * (d / vec), threads);
  if (vec == kPack<T>)
    embedding_forward_kernel<T, kPack<T>><<<blocks, threads, 0, stream>>>(ids, table, out, n, d);
  else
    embedding_forward_kernel<T, 1><<<blocks, threads, 0, stream>>>(ids, table, out, n, d);
  CUDA_CHECK_LAUNCH("embedding_forward_kernel");
}

template <typename T>
void backward_impl(const T* dout, const int32_t* bucket_ids, const int32_t* bucket_start,
                   const int32_t* positions, int64_t num_buckets, float* dtable, int64_t d,
                   cudaStream_t stream) {
  TRAINER_CHECK(num_buckets >= 0 && d > 0, "embedding_backward: {} groups, d {}", num_buckets, d);
  TRAINER_CHECK(dout && bucket_ids && bucket_start && positions && dtable,
                "embedding_backward: null pointer");
  TRAINER_CHECK(num_buckets < (1LL << 31), "embedding_backward: {} groups", num_buckets);
  if (num_buckets == 0) return;
  // The fp32 table is also accessed in 16-byte packs, so it joins the alignment test.
  const int vec = vector_width<T>({dout, dtable}, {d});
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>(num_buckets),
                  static_cast<unsigned>(ceil_div(d / vec, threads)));
  if (vec == kPack<T>)
    embedding_backward_kernel<T, kPack<T>>
        <<<grid, threads, 0, stream>>>(dout, bucket_ids, bucket_start, positions, dtable, d);
  else
    embedding_backward_kernel<T, 1>
        <<<grid, threads, 0, stream>>>(dout, bucket_ids, bucket_start, positions, dtable, d);
  CUDA_CHECK_LAUNCH("embedding_backward_kernel");
}

}  // namespace

void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t d,
                       cudaStream_t stream) {
  forward_impl(ids, table, out, n, d, stream);
}
void embedding_forward(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out,
                       int64_t n, int64_t d, cudaStream_t stream) {
  forward_impl(ids, table, out, n, d, stream);
}
void embedding_forward(const int32_t* ids, const __half* table, __half* out, int64_t n, int64_t d,
                       cudaStream_t stream) {
  forward_impl(ids, table, out, n, d, stream);
}
void embedding_backward(const float* dout, const int32_t* bucket_ids, const int32_t* bucket_start,
                        const int32_t* positions, int64_t num_buckets, float* dtable, int64_t d,
                        cudaStream_t stream) {
  backward_impl(dout, bucket_ids, bucket_start, positions, num_buckets, dtable, d, stream);
}
void embedding_backward(const __nv_bfloat16* dout, const int32_t* bucket_ids,
                        const int32_t* bucket_start, const int32_t* positions, int64_t num_buckets,
                        float* dtable, int64_t d, cudaStream_t stream) {
  backward_impl(dout, bucket_ids, bucket_start, positions, num_buckets, dtable, d, stream);
}
void embedding_backward(const __half* dout, const int32_t* bucket_ids, const int32_t* bucket_start,
                        const int32_t* positions, int64_t num_buckets, float* dtable, int64_t d,
                        cudaStream_t stream) {
  backward_impl(dout, bucket_ids, bucket_start, positions, num_buckets, dtable, d, stream);
}

}  // namespace trainer::cuda
