// Simple causal attention (see attention.cuh for the math): batched matmuls on head-major
// operands plus the causal softmax kernels below.
#include <cmath>

#include "model/cuda/attention.cuh"
#include "model/cuda/common.cuh"
#include "model/cuda/rope.cuh"

namespace trainer::cuda {
namespace {

// forward: P[i, j] = exp(S[i, j] - m_i) / sum_{j' <= i} exp(S[i, j'] - m_i) for j <= i, else 0;
// m_i = max_{j <= i} S[i, j]. One warp per row of the (B*H*T, T) score matrix; i = row % T.
template <typename T>
__global__ void causal_softmax_forward_kernel(const float* __restrict__ scores,
                                              T* __restrict__ probs, int64_t rows, int T_) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int i = static_cast<int>(row % T_);
  const float* s = scores + row * T_;
  T* p = probs + row * T_;
  float m = -INFINITY;
  for (int j = lane; j <= i; j += kWarp) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lane; j <= i; j += kWarp) sum += expf(s[j] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < T_; j += kWarp) p[j] = from_float<T>(j <= i ? expf(s[j] - m) * inv : 0.0f);
}

// backward: dS[i, j] = P[i, j] * (dP[i, j] - sum_{j' <= i} P[i, j'] dP[i, j']), written over P
// (each element is read before the same thread writes it). One warp per row.
template <typename T>
__global__ void causal_softmax_backward_kernel(T* __restrict__ probs,
                                               const float* __restrict__ dprobs, int64_t rows,
                                               int T_) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int i = static_cast<int>(row % T_);
  T* p = probs + row * T_;
  const float* dp = dprobs + row * T_;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += kWarp) dot += to_float(p[j]) * dp[j];
  dot = warp_sum(dot);
  for (int j = lane; j < T_; j += kWarp)
    p[j] = from_float<T>(j <= i ? to_float(p[j]) * (dp[j] - dot) : 0.0f);
}

void check_dims(const char* what, int64_t B, int64_t T_, int64_t H, int64_t dh) {
  TRAINER_CHECK(B > 0 && T_ > 0 && H > 0 && dh > 0 && T_ < (1 << 30),
                "{}: B {} T {} H {} head_dim {}", what, B, T_, H, dh);
}

// A batched (B*H entries) product between (T, T) and (T, dh) or (T, dh) matrices.
Gemm batched(int64_t BH, int64_t m, int64_t n, int64_t k, DType ab, DType cd, bool tf32) {
  Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = BH;
  g.ab_type = ab;
  g.cd_type = cd;
  g.tf32 = tf32;
  return g;
}

template <typename T>
void forward_impl(Matmul& mm, const T* q, const T* k, const T* v, T* probs, T* out, float* scores,
                  T* out_hm, int64_t B, int64_t T_, int64_t H, int64_t dh, bool tf32,
                  cudaStream_t stream) {
  check_dims("attention_forward", B, T_, H, dh);
  TRAINER_CHECK(q && k && v && probs && out && scores && out_hm, "attention_forward: null pointer");
  const int64_t BH = B * H, rows = BH * T_;
  const DType t = dtype_of<T>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  // S = scale * q k^T  (fp32 scores)
  Gemm s = batched(BH, T_, T_, dh, t, DType::kF32, tf32);
  s.trans_b = true;
  s.a = q, s.lda = dh, s.stride_a = T_ * dh;
  s.b = k, s.ldb = dh, s.stride_b = T_ * dh;
  s.d = scores, s.ldd = T_, s.stride_d = T_ * T_;
  s.alpha = scale;
  mm.run(s, stream);
  const int threads = 256;
  causal_softmax_forward_kernel<T><<<ceil_div(rows, threads / kWarp), threads, 0, stream>>>(
      scores, probs, rows, static_cast<int>(T_));
  CUDA_CHECK_LAUNCH("causal_softmax_forward_kernel");
  // O = P v
  Gemm o = batched(BH, T_, dh, T_, t, t, tf32);
  o.a = probs, o.lda = T_, o.stride_a = T_ * T_;
  o.b = v, o.ldb = dh, o.stride_b = T_ * dh;
  o.d = out_hm, o.ldd = dh, o.stride_d = T_ * dh;
  mm.run(o, stream);
  heads_to_token_major(out_hm, out, B, T_, H, dh, stream);
}

template <typename T>
void backward_impl(Matmul& mm, const T* q, const T* k, const T* v, T* probs, const T* dout, T* dq,
                   T* dk, T* dv, float* scores, T* dout_hm, int64_t B, int64_t T_, int64_t H,
                   int64_t dh, bool tf32, cudaStream_t stream) {
  check_dims("attention_backward", B, T_, H, dh);
  TRAINER_CHECK(q && k && v && probs && dout && dq && dk && dv && scores && dout_hm,
                "attention_backward: null pointer");
  const int64_t BH = B * H, rows = BH * T_;
  const DType t = dtype_of<T>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  heads_to_head_major(dout, dout_hm, B, T_, H, dh, stream);
  // dv = P^T dO
  Gemm gv = batched(BH, T_, dh, T_, t, t, tf32);
  gv.trans_a = true;
  gv.a = probs, gv.lda = T_, gv.stride_a = T_ * T_;
  gv.b = dout_hm, gv.ldb = dh, gv.stride_b = T_ * dh;
  gv.d = dv, gv.ldd = dh, gv.stride_d = T_ * dh;
  mm.run(gv, stream);
  // dP = dO v^T  (fp32, into the score scratch)
  Gemm gp = batched(BH, T_, T_, dh, t, DType::kF32, tf32);
  gp.trans_b = true;
  gp.a = dout_hm, gp.lda = dh, gp.stride_a = T_ * dh;
  gp.b = v, gp.ldb = dh, gp.stride_b = T_ * dh;
  gp.d = scores, gp.ldd = T_, gp.stride_d = T_ * T_;
  mm.run(gp, stream);
  // dS over P
  const int threads = 256;
  causal_softmax_backward_kernel<T><<<ceil_div(rows, threads / kWarp), threads, 0, stream>>>(
      probs, scores, rows, static_cast<int>(T_));
  CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
  // dq = scale * dS k
  Gemm gq = batched(BH, T_, dh, T_, t, t, tf32);
  gq.a = probs, gq.lda = T_, gq.stride_a = T_ * T_;
  gq.b = k, gq.ldb = dh, gq.stride_b = T_ * dh;
  gq.d = dq, gq.ldd = dh, gq.stride_d = T_ * dh;
  gq.alpha = scale;
  mm.run(gq, stream);
  // dk = scale * dS^T q
  Gemm gk = gq;
  gk.trans_a = true;
  gk.b = q;
  gk.d = dk;
  mm.run(gk, stream);
}

}  // namespace

void attention_forward(Matmul& mm, const float* q, const float* k, const float* v, float* probs,
                       float* out, float* scores, float* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream) {
  forward_impl(mm, q, k, v, probs, out, scores, out_hm, B, T, H, head_dim, tf32, stream);
}
void attention_forward(Matmul& mm, const __nv_bfloat16* q, const __nv_bfloat16* k,
                       const __nv_bfloat16* v, __nv_bfloat16* probs, __nv_bfloat16* out,
                       float* scores, __nv_bfloat16* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream) {
  forward_impl(mm, q, k, v, probs, out, scores, out_hm, B, T, H, head_dim, tf32, stream);
}
void attention_forward(Matmul& mm, const __half* q, const __half* k, const __half* v, __half* probs,
                       __half* out, float* scores, __half* out_hm, int64_t B, int64_t T, int64_t H,
                       int64_t head_dim, bool tf32, cudaStream_t stream) {
  forward_impl(mm, q, k, v, probs, out, scores, out_hm, B, T, H, head_dim, tf32, stream);
}
void attention_backward(Matmul& mm, const float* q, const float* k, const float* v, float* probs,
                        const float* dout, float* dq, float* dk, float* dv, float* scores,
                        float* dout_hm, int64_t B, int64_t T, int64_t H, int64_t head_dim,
                        bool tf32, cudaStream_t stream) {
  backward_impl(mm, q, k, v, probs, dout, dq, dk, dv, scores, dout_hm, B, T, H, head_dim, tf32,
                stream);
}
void attention_backward(Matmul& mm, const __nv_bfloat16* q, const __nv_bfloat16* k,
                        const __nv_bfloat16* v, __nv_bfloat16* probs, const __nv_bfloat16* dout,
                        __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* scores,
                        __nv_bfloat16* dout_hm, int64_t B, int64_t T, int64_t H, int64_t head_dim,
                        bool tf32, cudaStream_t stream) {
  backward_impl(mm, q, k, v, probs, dout, dq, dk, dv, scores, dout_hm, B, T, H, head_dim, tf32,
                stream);
}
void attention_backward(Matmul& mm, const __half* q, const __half* k, const __half* v,
                        __half* probs, const __half* dout, __half* dq, __half* dk, __half* dv,
                        float* scores, __half* dout_hm, int64_t B, int64_t T, int64_t H,
                        int64_t head_dim, bool tf32, cudaStream_t stream) {
  backward_impl(mm, q, k, v, probs, dout, dq, dk, dv, scores, dout_hm, B, T, H, head_dim, tf32,
                stream);
}

}  // namespace trainer::cuda
