// The CPU reference of every layer, forward and backward side by side, templated on the scalar
// (float for training, double for gradient checks). Row-major throughout; activations are
// (rows, features) with rows = B*T; attention tensors keep the (B, T, d) layout and head h owns
// columns [h*dh, (h+1)*dh). Backward functions document whether they overwrite or accumulate.
// Every output element is computed by one thread in a fixed order, so results do not depend on
// the number of OpenMP threads. The float softmax / sigmoid use a vectorised exp accurate to
// ~1.3 ulp (ops.cpp); double uses std::exp.
#pragma once

#include <cstdint>

namespace trainer::cpu {

// C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when trans_x. Blocked and OpenMP-parallel.
// lda/ldb/ldc are the row strides of A, B, C as stored.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Linear, W of shape (d_out, d_in):  y = x W^T.
//   forward:  y (n, d_out) = x (n, d_in) @ W^T                          (overwrites y)
//   backward: dx = dy @ W (overwrites dx; skipped when dx is null); dW += dy^T @ x (accumulates)
template <typename T>
void linear_forward(const T* x, const T* W, T* y, int64_t n, int64_t d_in, int64_t d_out);
template <typename T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, T* dW, int64_t n, int64_t d_in,
                     int64_t d_out);

// Embedding: out[i] = table[ids[i]]; backward: dtable[ids[i]] += dout[i] (accumulates).
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t d);
template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, int64_t n, int64_t d);

// RMSNorm: r = rsqrt(mean(x^2) + eps), y = x * r * w. rstd (n) saves r for backward.
//   backward: dx += r * (w*dy - x * r^2 * mean(x * w * dy))   (accumulates into dx)
//             dw += sum over rows of dy * x * r                 (accumulates)
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t d, T eps);
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t n,
                      int64_t d);

// RoPE in place on (B*T, d) rows, row i at position i % seq, each head's interleaved pairs
// (x[2j], x[2j+1]) rotated by angle pos * theta^(-2j/dh):
//   x'[2j] = x[2j] cos - x[2j+1] sin,  x'[2j+1] = x[2j] sin + x[2j+1] cos.
// Backward applies the inverse rotation (angle negated) to the gradient in place.
template <typename T>
void rope_forward(T* x, int64_t n, int64_t seq, int64_t d, int64_t head_dim, T theta);
template <typename T>
void rope_backward(T* dx, int64_t n, int64_t seq, int64_t d, int64_t head_dim, T theta);
// RoPE forward on n rows of one sequence at positions pos0 .. pos0 + n - 1 (decoding).
template <typename T>
void rope_forward_at(T* x, int64_t n, int64_t pos0, int64_t d, int64_t head_dim, T theta);

// Causal attention per (batch b, head h) on q, k, v of layout (B, T, d):
//   S = q k^T / sqrt(dh), S[i][j] = -inf for j > i, P = softmax(S) row-wise, out = P v.
// probs (B, H, T, T) saves P for backward (entries above the diagonal are written as 0).
//   backward: dv = P^T dout, dP = dout v^T, dS = P * (dP - rowsum(dP * P)),
//             dq = dS k / sqrt(dh), dk = dS^T q / sqrt(dh)     (all three overwrite)
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t seq,
                       int64_t H, int64_t head_dim);
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, int64_t B, int64_t seq, int64_t H, int64_t head_dim);

// Decoding: n new query rows q (n, d) at positions pos0 .. pos0 + n - 1 attend causally over the
// key/value cache rows (pos0 + n, d), which already hold the new rows' keys and values. Row i
// computes exactly what attention_forward computes at position pos0 + i.
template <typename T>
void attention_decode(const T* q, const T* k_cache, const T* v_cache, T* out, int64_t n,
                      int64_t pos0, int64_t H, int64_t head_dim);

// SwiGLU gate on the two projections a = x W1^T, b = x W3^T: out = silu(a) * b,
// silu(a) = a * sigmoid(a), silu'(a) = sigmoid(a) * (1 + a * (1 - sigmoid(a))).
//   backward: da = dout * b * silu'(a), db = dout * silu(a)    (overwrite)
template <typename T>
void swiglu_forward(const T* a, const T* b, T* out, int64_t n);
template <typename T>
void swiglu_backward(const T* a, const T* b, const T* dout, T* da, T* db, int64_t n);

// Cross-entropy over the vocabulary, one row per position:
//   loss[i] = logsumexp(logits[i]) - logits[i][target[i]]      (losses overwrite, length n)
//   backward: dlogits[i] = scale * (softmax(logits[i]) - onehot(target[i]))  (overwrites; dlogits
//   may alias logits)
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t n,
                           int64_t V);
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, T* dlogits, int64_t n,
                            int64_t V, T scale);

}  // namespace trainer::cpu
