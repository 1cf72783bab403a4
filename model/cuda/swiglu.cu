// SwiGLU kernels (see swiglu.cuh for the math). Element-wise, kV channels per thread.
#include "model/cuda/common.cuh"
#include "model/cuda/swiglu.cuh"

namespace trainer::cuda {
namespace {

// 1 / (1 + e^-a) with e^-a on the special-function unit and an approximate division (about 2 ulp
// each): with expf and an IEEE division the kernels were instruction-bound rather than
// memory-bound. For a below about -88, e^-a is +inf and the result 0.
__device__ __forceinline__ float sigmoid(float a) {
  return __fdividef(1.0f, 1.0f + fast_exp2(-kLog2e * a));
}

// forward: out = a * sigmoid(a) * b
template <typename T, int kV>
__global__ void swiglu_forward_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                      int64_t ld_ab, T* __restrict__ out, int64_t rows,
                                      int64_t cols) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  const int64_t chunks = cols / kV;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  int64_t r, c;
  chunk_position(idx, chunks, kV, r, c);
  const Pack<T, kV> ap = load_pack<kV>(a + r * ld_ab + c);
  const Pack<T, kV> bp = load_pack<kV>(b + r * ld_ab + c);
  Pack<T, kV> o;
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const float x = to_float(ap.v[k]);
    o.v[k] = from_float<T>(x * sigmoid(x) * to_float(bp.v[k]));
  }
  store_pack<kV>(out + r * cols + c, o);
}

// backward: da = g * b * sig * (1 + a (1 - sig)),  db = g * a * sig
// (no __restrict__ on a/b/da/db: the caller may write the gradients over the inputs)
template <typename T, int kV>
__global__ void swiglu_backward_kernel(const T* a, const T* b, int64_t ld_ab,
                                       const T* __restrict__ dout, T* da, T* db, int64_t ld_d,
                                       int64_t rows, int64_t cols) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  const int64_t chunks = cols / kV;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  int64_t r, c;
  chunk_position(idx, chunks, kV, r, c);
  const Pack<T, kV> ap = load_pack<kV>(a + r * ld_ab + c);
  const Pack<T, kV> bp = load_pack<kV>(b + r * ld_ab + c);
  const Pack<T, kV> gp = load_pack<kV>(dout + r * cols + c);
  Pack<T, kV> da_p, db_p;
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const float x = to_float(ap.v[k]), y = to_float(bp.v[k]), g = to_float(gp.v[k]);
    const float sig = sigmoid(x);
    const float dsilu = sig * (1.0f + x * (1.0f - sig));
    da_p.v[k] = from_float<T>(g * y * dsilu);
    db_p.v[k] = from_float<T>(g * x * sig);
  }
  store_pack<kV>(da + r * ld_d + c, da_p);
  store_pack<kV>(db + r * ld_d + c, db_p);
}

template <typename T>
void forward_impl(const T* a, const T* b, int64_t ld_ab, T* out, int64_t rows, int64_t cols,
                  cudaStream_t stream) {
  TRAINER_CHECK(rows >= 0 && cols > 0 && ld_ab >= cols, "swiglu_forward: rows {} cols {} ld {}",
                rows, cols, ld_ab);
  TRAINER_CHECK(a && b && out, "swiglu_forward: null pointer");
  if (rows == 0) return;
  const int vec = vector_width<T>({a, b, out}, {cols, ld_ab});
  const int threads = 256;
  const int64_t blocks = ceil_div(rows * (cols / vec), threads);
  if (vec == kPack<T>)
    launch_dependent(swiglu_forward_kernel<T, kPack<T>>, dim3(blocks), dim3(threads), 0, stream, a,
                     b, ld_ab, out, rows, cols);
  else
    launch_dependent(swiglu_forward_kernel<T, 1>, dim3(blocks), dim3(threads), 0, stream, a, b,
                     ld_ab, out, rows, cols);
}

template <typename T>
void backward_impl(const T* a, const T* b, int64_t ld_ab, const T* dout, T* da, T* db, int64_t ld_d,
                   int64_t rows, int64_t cols, cudaStream_t stream) {
  TRAINER_CHECK(rows >= 0 && cols > 0 && ld_ab >= cols && ld_d >= cols,
                "swiglu_backward: rows {} cols {} ld {} / {}", rows, cols, ld_ab, ld_d);
  TRAINER_CHECK(a && b && dout && da && db, "swiglu_backward: null pointer");
  if (rows == 0) return;
  const int vec = vector_width<T>({a, b, dout, da, db}, {cols, ld_ab, ld_d});
  const int threads = 256;
  const int64_t blocks = ceil_div(rows * (cols / vec), threads);
  if (vec == kPack<T>)
    launch_dependent(swiglu_backward_kernel<T, kPack<T>>, dim3(blocks), dim3(threads), 0, stream, a,
                     b, ld_ab, dout, da, db, ld_d, rows, cols);
  else
    launch_dependent(swiglu_backward_kernel<T, 1>, dim3(blocks), dim3(threads), 0, stream, a, b,
                     ld_ab, dout, da, db, ld_d, rows, cols);
}

}  // namespace

void swiglu_forward(const float* a, const float* b, int64_t ld_ab, float* out, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  forward_impl(a, b, ld_ab, out, rows, cols, stream);
}
void swiglu_forward(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t ld_ab,
                    __nv_bfloat16* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  forward_impl(a, b, ld_ab, out, rows, cols, stream);
}
void swiglu_forward(const __half* a, const __half* b, int64_t ld_ab, __half* out, int64_t rows,
                    int64_t cols, cudaStream_t stream) {
  forward_impl(a, b, ld_ab, out, rows, cols, stream);
}
void swiglu_backward(const float* a, const float* b, int64_t ld_ab, const float* dout, float* da,
                     float* db, int64_t ld_d, int64_t rows, int64_t cols, cudaStream_t stream) {
  backward_impl(a, b, ld_ab, dout, da, db, ld_d, rows, cols, stream);
}
void swiglu_backward(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t ld_ab,
                     const __nv_bfloat16* dout, __nv_bfloat16* da, __nv_bfloat16* db, int64_t ld_d,
                     int64_t rows, int64_t cols, cudaStream_t stream) {
  backward_impl(a, b, ld_ab, dout, da, db, ld_d, rows, cols, stream);
}
void swiglu_backward(const __half* a, const __half* b, int64_t ld_ab, const __half* dout,
                     __half* da, __half* db, int64_t ld_d, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  backward_impl(a, b, ld_ab, dout, da, db, ld_d, rows, cols, stream);
}

}  // namespace trainer::cuda
