#include <cfloat>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/common.cuh"
#include "model/cuda/decode_attention.cuh"

namespace trainer::cuda {
namespace {

constexpr int kThreads = 256;

// Shared memory: the row's scores (len floats), q (dh), the partial value sums (kThreads), and
// 32 floats of reduction scratch.
int64_t smem_floats(int64_t len, int64_t dh) { return len + dh + kThreads + 32; }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k,
                            const T* __restrict__ v, T* __restrict__ out, int pos0, int d, int dh,
                            float scale) {
  extern __shared__ float smem[];
  const int h = blockIdx.x, i = blockIdx.y, len = pos0 + i + 1;
  float* s = smem;
  float* sq = s + len;
  float* partial = sq + dh;
  float* scratch = partial + kThreads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = kThreads / kWarp;
  const T* qi = q + i * ldq + h * dh;
  for (int c = threadIdx.x; c < dh; c += kThreads) sq[c] = to_float(qi[c]) * scale;
  __syncthreads();

  // Scores: warp w takes keys w, w + warps, ...; lanes split the channels.
  float m = -FLT_MAX;
  for (int j = warp; j < len; j += warps) {
    const T* kj = k + static_cast<int64_t>(j) * d + h * dh;
    float dot = 0.0f;
    for (int c = lane; c < dh; c += kWarp) dot += sq[c] * to_float(kj[c]);
    dot = warp_sum(dot);
    if (lane == 0) s[j] = dot;
    m = fmaxf(m, dot);
  }
  // Row max: each warp's lanes agree; take the max over warps.
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  float l = 0.0f;
  for (int j = threadIdx.x; j < len; j += kThreads) {
    const float e = __expf(s[j] - m);
    s[j] = e;
    l += e;
  }
  l = block_sum(l, scratch);  // synchronises: every s[j] is written

  // out = sum_j p_j v_j: thread t owns channel t % dh for positions j = g, g + groups, ...
  const int groups = dh <= kThreads ? kThreads / dh : 1;
  const int g = threadIdx.x / dh;
  for (int c0 = 0; c0 < dh; c0 += kThreads) {
    const int c = c0 + threadIdx.x % dh;
    float acc = 0.0f;
    if (g < groups && c < dh)
      for (int j = g; j < len; j += groups)
        acc += s[j] * to_float(v[static_cast<int64_t>(j) * d + h * dh + c]);
    if (g < groups) partial[threadIdx.x] = acc;
    __syncthreads();
    if (g == 0 && c < dh) {
      float sum = 0.0f;
      for (int gg = 0; gg < groups; ++gg) sum += partial[gg * dh + threadIdx.x % dh];
      out[static_cast<int64_t>(i) * d + h * dh + c] = from_float<T>(sum / l);
    }
    __syncthreads();
  }
}

template <typename T>
void launch(const T* q, int64_t ldq, const T* k, const T* v, T* out, int64_t n, int64_t pos0,
            int64_t H, int64_t dh, cudaStream_t stream) {
  const int64_t len = pos0 + n;
  TRAINER_CHECK(len <= decode_attention_max_len(dh),
                "decode attention over {} positions: more than shared memory holds ({})", len,
                decode_attention_max_len(dh));
  TRAINER_CHECK(dh <= kThreads || dh % kThreads == 0, "decode attention: head dim {}", dh);
  const size_t bytes = static_cast<size_t>(smem_floats(len, dh)) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(decode_attention_kernel<T>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>(n));
  decode_attention_kernel<T><<<grid, kThreads, bytes, stream>>>(
      q, ldq, k, v, out, static_cast<int>(pos0), static_cast<int>(H * dh), static_cast<int>(dh),
      1.0f / sqrtf(static_cast<float>(dh)));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t decode_attention_max_len(int64_t head_dim) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin / static_cast<int64_t>(sizeof(float)) - smem_floats(0, head_dim);
}

void decode_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache,
                      float* out, int64_t n, int64_t pos0, int64_t H, int64_t head_dim,
                      cudaStream_t stream) {
  launch(q, ldq, k_cache, v_cache, out, n, pos0, H, head_dim, stream);
}
void decode_attention(const __nv_bfloat16* q, int64_t ldq, const __nv_bfloat16* k_cache,
                      const __nv_bfloat16* v_cache, __nv_bfloat16* out, int64_t n, int64_t pos0,
                      int64_t H, int64_t head_dim, cudaStream_t stream) {
  launch(q, ldq, k_cache, v_cache, out, n, pos0, H, head_dim, stream);
}
void decode_attention(const __half* q, int64_t ldq, const __half* k_cache, const __half* v_cache,
                      __half* out, int64_t n, int64_t pos0, int64_t H, int64_t head_dim,
                      cudaStream_t stream) {
  launch(q, ldq, k_cache, v_cache, out, n, pos0, H, head_dim, stream);
}

}  // namespace trainer::cuda
