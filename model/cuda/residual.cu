// Residual add and casts (see residual.cuh). Element-wise, kV elements per thread; a scalar tail
// covers counts that are not a multiple of the vector width.
#include "model/cuda/common.cuh"
#include "model/cuda/residual.cuh"

namespace trainer::cuda {
namespace {

// out = a + b. Elements [0, n_vec) in packs of kV, then [n_vec, n) one per thread.
template <typename T, int kV>
__global__ void residual_forward_kernel(const T* a, const T* b, T* out, int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = n / kV * kV;
  const int64_t i = idx * kV;
  if (i < n_vec) {
    const Pack<T, kV> x = load_pack<kV>(a + i), y = load_pack<kV>(b + i);
    Pack<T, kV> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
    store_pack<kV>(out + i, o);
  } else {
    const int64_t j = n_vec + (idx - n_vec / kV);
    if (j < n) out[j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
  }
}

template <typename S, typename D, int kV>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = n / kV * kV;
  const int64_t i = idx * kV;
  if (i < n_vec) {
    const Pack<S, kV> x = load_pack<kV>(src + i);
    Pack<D, kV> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_float<D>(to_float(x.v[k]));
    store_pack<kV>(dst + i, o);
  } else {
    const int64_t j = n_vec + (idx - n_vec / kV);
    if (j < n) dst[j] = from_float<D>(to_float(src[j]));
  }
}

// Threads for n elements at kV per thread plus the scalar tail.
int64_t elementwise_blocks(int64_t n, int kV, int threads) {
  return ceil_div(n / kV + n % kV, threads);
}

template <typename T>
void residual_impl(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  TRAINER_CHECK(n >= 0, "residual_forward: n {}", n);
  TRAINER_CHECK(a && b && out, "residual_forward: null pointer");
  if (n == 0) return;
  const int vec = vector_width<T>({a, b, out}, {});
  const int threads = 256;
  if (vec == kPack<T>)
    residual_forward_kernel<T, kPack<T>>
        <<<elementwise_blocks(n, vec, threads), threads, 0, stream>>>(a, b, out, n);
  else
    residual_forward_kernel<T, 1>
        <<<elementwise_blocks(n, 1, threads), threads, 0, stream>>>(a, b, out, n);
  CUDA_CHECK_LAUNCH("residual_forward_kernel");
}

template <typename S, typename D>
void cast_impl(const S* src, D* dst, int64_t n, cudaStream_t stream) {
  TRAINER_CHECK(n >= 0, "cast: n {}", n);
  TRAINER_CHECK(src && dst, "cast: null pointer");
  if (n == 0) return;
  constexpr int kV = 4;  // 16 bytes of fp32, 8 of bf16
  const bool wide = reinterpret_cast<uintptr_t>(src) % (kV * sizeof(S)) == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % (kV * sizeof(D)) == 0;
  const int threads = 256;
  if (wide)
    cast_kernel<S, D, kV><<<elementwise_blocks(n, kV, threads), threads, 0, stream>>>(src, dst, n);
  else
    cast_kernel<S, D, 1><<<elementwise_blocks(n, 1, threads), threads, 0, stream>>>(src, dst, n);
  CUDA_CHECK_LAUNCH("cast_kernel");
}

}  // namespace

void residual_forward(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  residual_impl(a, b, out, n, stream);
}
void residual_forward(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, int64_t n,
                      cudaStream_t stream) {
  residual_impl(a, b, out, n, stream);
}
void residual_forward(const __half* a, const __half* b, __half* out, int64_t n,
                      cudaStream_t stream) {
  residual_impl(a, b, out, n, stream);
}
void cast(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream) {
  cast_impl(src, dst, n, stream);
}
void cast(const float* src, __half* dst, int64_t n, cudaStream_t stream) {
  cast_impl(src, dst, n, stream);
}
void cast(const __nv_bfloat16* src, float* dst, int64_t n, cudaStream_t stream) {
  cast_impl(src, dst, n, stream);
}
void cast(const __half* src, float* dst, int64_t n, cudaStream_t stream) {
  cast_impl(src, dst, n, stream);
}

}  // namespace trainer::cuda
