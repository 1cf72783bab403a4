// The CPU reference layers (see ops.h for the math of each). Written for clarity first; the loops
// that matter are shaped so that the compiler vectorises them (-O3 -mavx2 -mfma) and OpenMP splits
// them over rows, heads or tiles of the output. Every output element is computed by one thread in
// a fixed order, so results do not depend on the number of threads.
#include "model/cpu/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"

namespace trainer::cpu {
namespace {

// ------------------------------------------------------------------------------------------------
// Vectorised exp for float. glibc's expf is an opaque scalar call, and GCC will not vectorise a
// portable replacement written on scalars either (it turns the range clamp into branches), yet the
// softmax over the vocabulary (batch * ctx * vocab exps, twice per step) would dominate a step.
// So the float paths below work on 8-lane GCC/Clang vector types (one AVX register); double (used
// for gradient checks) keeps std::exp.
//   exp(x) = 2^k exp(r),  k = round(x / ln2),  r = x - k ln2 in [-ln2/2, ln2/2],
// ln2 split into a head (k * head exact for |k| < 2^12) and a tail; exp(r) by its Taylor series
// to r^7 (truncation < 0.3466^8 / 8! = 5e-9 relative, under float rounding; measured max error
// 1.3 ulp). Adding 1.5 * 2^23 rounds x / ln2 to an integer held in the low mantissa bits, from
// which 2^k is built in the exponent field. x is clamped to [-87, 88] so that 2^k stays a normal
// float: exp(x < -87) gives 1.6e-38 rather than 0 or a denormal, and exp(x > 88) gives 1.65e38
// rather than inf; no sum or sigmoid here can tell the difference. NaN propagates.
// ------------------------------------------------------------------------------------------------
using F8 [[gnu::vector_size(32)]] = float;
using U8 [[gnu::vector_size(32)]] = uint32_t;
using F8Unaligned [[gnu::vector_size(32), gnu::aligned(4)]] = float;

inline F8 load8(const float* p) { return *reinterpret_cast<const F8Unaligned*>(p); }
inline void store8(float* p, F8 v) { *reinterpret_cast<F8Unaligned*>(p) = v; }
// Lanes [0, n) from p, the rest `fill` (n < 8: the tail of an array).
inline F8 load_partial(const float* p, int64_t n, float fill) {
  F8 v = F8{} + fill;
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store_partial(float* p, F8 v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}
// Sum of the lanes in a fixed order.
inline float lane_sum(F8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

inline F8 exp8(F8 x) {
  x = x < -87.0f ? F8{} - 87.0f : x;
  x = x > 88.0f ? F8{} + 88.0f : x;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const F8 t = x * 1.44269504088896341f + kMagic;
  const F8 k = t - kMagic;
  const F8 r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
  F8 p = F8{} + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const U8 k_bits = std::bit_cast<U8>(t) - std::bit_cast<uint32_t>(kMagic);
  const U8 two_k = (k_bits + 127u) << 23;
  return p * std::bit_cast<F8>(two_k);
}

// out[j] = exp(x[j] - m) for j < n (out may be x; null to only sum); returns the sum.
inline float exp_shifted_sum(const float* x, float m, float* out, int64_t n) {
  F8 acc = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const F8 e = exp8(load8(x + j) - m);
    if (out) store8(out + j, e);
    acc += e;
  }
  if (j < n) {
    F8 e = exp8(load_partial(x + j, n - j, m) - m);
    for (int64_t i = n - j; i < 8; ++i) e[i] = 0.0f;
    if (out) store_partial(out + j, e, n - j);
    acc += e;
  }
  return lane_sum(acc);
}
inline double exp_shifted_sum(const double* x, double m, double* out, int64_t n) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double e = std::exp(x[j] - m);
    if (out) out[j] = e;
    sum += e;
  }
  return sum;
}

// s[j] = sigmoid(a[j]) = 1 / (1 + exp(-a[j])) for j < n.
inline void sigmoid_n(const float* a, float* s, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) store8(s + j, 1.0f / (1.0f + exp8(-load8(a + j))));
  if (j < n) store_partial(s + j, 1.0f / (1.0f + exp8(-load_partial(a + j, n - j, 0))), n - j);
}
inline void sigmoid_n(const double* a, double* s, int64_t n) {
  for (int64_t j = 0; j < n; ++j) s[j] = 1.0 / (1.0 + std::exp(-a[j]));
}

// max over x[0, n).
inline float max_n(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  if (n >= 8) {
    F8 acc = load8(x);
    for (j = 8; j + 8 <= n; j += 8) {
      const F8 v = load8(x + j);
      acc = acc > v ? acc : v;
    }
    for (int i = 0; i < 8; ++i) m = std::max(m, acc[i]);
  }
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}
inline double max_n(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

}  // namespace

// Row-wise layers go parallel only above this many elements: below it a parallel region costs
// more than the loop (and on a loaded machine a barrier can cost a whole scheduler slice).
constexpr int64_t kMinParallelElems = int64_t{1} << 17;

// ------------------------------------------------------------------------------------------------
// gemm: C = alpha * op(A) op(B) + beta * C
//
// The classic blocked scheme. C is cut into tiles of kMc x kNc that OpenMP hands to threads. For
// each slice of kKc along K a thread packs its rows of op(A) into micro-panels of kMr rows
// (ap[k*kMr + i]) and its columns of op(B) into micro-panels of kNr columns (bp[k*kNr + j]), so
// that the micro-kernel reads both contiguously whatever the transposes were. The micro-kernel
// keeps a kMr x kNr block of C in a local array (registers) and adds one outer product per k.
// Panels are zero-padded at the edges, so the kernel always runs full size and only the store
// is clipped.
// ------------------------------------------------------------------------------------------------
namespace {

template <typename T>
struct GemmShape;
// 6 x 16 floats = 12 AVX registers of accumulators; same register count for double at 6 x 8.
template <>
struct GemmShape<float> {
  static constexpr int kMr = 6, kNr = 16;
};
template <>
struct GemmShape<double> {
  static constexpr int kMr = 6, kNr = 8;
};

constexpr int64_t kMc = 96;   // rows of C per tile (multiple of kMr); A block ~96 KiB in L2
constexpr int64_t kNc = 256;  // columns of C per tile (multiple of kNr)
constexpr int64_t kKc = 256;  // depth of one packed slice; a B micro-panel is 16 KiB, in L1

// Packs op(A)[i0 : i0+mc, p0 : p0+kc] into ceil(mc/kMr) micro-panels of kMr rows.
template <typename T, int kMr>
void pack_a(bool trans, const T* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            T* ap) {
  for (int64_t ir = 0; ir < mc; ir += kMr) {
    T* panel = ap + ir * kc;
    const int64_t rows = std::min<int64_t>(kMr, mc - ir);
    for (int64_t k = 0; k < kc; ++k) {
      T* dst = panel + k * kMr;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = i0 + ir + i, c = p0 + k;
        dst[i] = trans ? A[c * lda + r] : A[r * lda + c];
      }
      for (int64_t i = rows; i < kMr; ++i) dst[i] = T(0);
    }
  }
}

// Packs op(B)[p0 : p0+kc, j0 : j0+nc] into ceil(nc/kNr) micro-panels of kNr columns.
template <typename T, int kNr>
void pack_b(bool trans, const T* B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            T* bp) {
  for (int64_t jr = 0; jr < nc; jr += kNr) {
    T* panel = bp + jr * kc;
    const int64_t cols = std::min<int64_t>(kNr, nc - jr);
    for (int64_t k = 0; k < kc; ++k) {
      T* dst = panel + k * kNr;
      const int64_t r = p0 + k;
      if (trans) {
        for (int64_t j = 0; j < cols; ++j) dst[j] = B[(j0 + jr + j) * ldb + r];
      } else {
        const T* src = B + r * ldb + j0 + jr;
        for (int64_t j = 0; j < cols; ++j) dst[j] = src[j];
      }
      for (int64_t j = cols; j < kNr; ++j) dst[j] = T(0);
    }
  }
}

// acc = sum over k of ap[k] (column of kMr) x bp[k] (row of kNr); then the valid mr x nr corner
// is stored: C = (first ? beta*C : C) + alpha*acc. With beta == 0 C is not read (may hold NaN).
// The accumulators are GCC/Clang vector types of one AVX register each, so the whole kMr x kNr
// block lives in registers (plain arrays of T get spilled to the stack by GCC); each k is kMr
// broadcasts of a times kNr/lanes vectors of b, fused multiply-adds.
template <typename T, int kMr, int kNr>
inline void micro_kernel(int64_t kc, const T* __restrict ap, const T* __restrict bp, T alpha,
                         T beta, bool first, T* C, int64_t ldc, int64_t mr, int64_t nr) {
  using V [[gnu::vector_size(32)]] = T;
  using VUnaligned [[gnu::vector_size(32), gnu::aligned(alignof(T))]] = T;
  constexpr int kLanes = 32 / sizeof(T), kNv = kNr / kLanes;
  static_assert(kNr % kLanes == 0);
  V acc[kMr][kNv] = {};
  for (int64_t k = 0; k < kc; ++k) {
    V b[kNv];
    for (int v = 0; v < kNv; ++v) b[v] = reinterpret_cast<const VUnaligned*>(bp + k * kNr)[v];
    for (int i = 0; i < kMr; ++i) {
      const T a = ap[k * kMr + i];
      for (int v = 0; v < kNv; ++v) acc[i][v] += a * b[v];
    }
  }
  T out[kMr][kNr];
  std::memcpy(out, acc, sizeof(out));
  for (int64_t i = 0; i < mr; ++i) {
    T* c = C + i * ldc;
    for (int64_t j = 0; j < nr; ++j) {
      const T prev = !first ? c[j] : (beta == T(0) ? T(0) : beta * c[j]);
      c[j] = prev + alpha * out[i][j];
    }
  }
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  constexpr int kMr = GemmShape<T>::kMr, kNr = GemmShape<T>::kNr;
  TRAINER_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm sizes M {} N {} K {}", M, N, K);
  TRAINER_CHECK(ldc >= N && lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N),
                "gemm strides lda {} ldb {} ldc {} too small for M {} N {} K {} (trans {} {})", lda,
                ldb, ldc, M, N, K, trans_a, trans_b);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // op(A) op(B) is all zeros
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  const int64_t mc_max = std::min(kMc, (M + kMr - 1) / kMr * kMr);
  const int64_t nc_max = std::min(kNc, (N + kNr - 1) / kNr * kNr);
  const int64_t kc_max = std::min(kKc, K);
  const int64_t tiles_m = (M + kMc - 1) / kMc, tiles_n = (N + kNc - 1) / kNc;

#pragma omp parallel if (tiles_m * tiles_n > 1)
  {
    // Per-thread packing scratch, sized to what this call needs (left uninitialised: every
    // element read is written by pack_a / pack_b first).
    auto ap = std::make_unique_for_overwrite<T[]>(mc_max * kc_max);
    auto bp = std::make_unique_for_overwrite<T[]>(nc_max * kc_max);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t tm = 0; tm < tiles_m; ++tm) {
      for (int64_t tn = 0; tn < tiles_n; ++tn) {
        const int64_t i0 = tm * kMc, mc = std::min(kMc, M - i0);
        const int64_t j0 = tn * kNc, nc = std::min(kNc, N - j0);
        for (int64_t p0 = 0; p0 < K; p0 += kKc) {
          const int64_t kc = std::min(kKc, K - p0);
          pack_a<T, kMr>(trans_a, A, lda, i0, mc, p0, kc, ap.get());
          pack_b<T, kNr>(trans_b, B, ldb, p0, kc, j0, nc, bp.get());
          // Column panels outside so one B micro-panel stays in L1 while A streams from L2.
          for (int64_t jr = 0; jr < nc; jr += kNr) {
            for (int64_t ir = 0; ir < mc; ir += kMr) {
              micro_kernel<T, kMr, kNr>(kc, ap.get() + ir * kc, bp.get() + jr * kc, alpha, beta,
                                        p0 == 0, C + (i0 + ir) * ldc + j0 + jr, ldc,
                                        std::min<int64_t>(kMr, mc - ir),
                                        std::min<int64_t>(kNr, nc - jr));
            }
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Linear: y = x W^T with W (d_out, d_in).
//   dx = dy W            (n, d_in)      overwrites
//   dW += dy^T x         (d_out, d_in)  accumulates
// ------------------------------------------------------------------------------------------------
template <typename T>
void linear_forward(const T* x, const T* W, T* y, int64_t n, int64_t d_in, int64_t d_out) {
  gemm<T>(false, true, n, d_out, d_in, T(1), x, d_in, W, d_in, T(0), y, d_out);
}

template <typename T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, T* dW, int64_t n, int64_t d_in,
                     int64_t d_out) {
  if (dx) gemm<T>(false, false, n, d_in, d_out, T(1), dy, d_out, W, d_in, T(0), dx, d_in);
  gemm<T>(true, false, d_out, d_in, n, T(1), dy, d_out, x, d_in, T(1), dW, d_in);
}

// ------------------------------------------------------------------------------------------------
// Embedding: out[i] = table[ids[i]];  dtable[ids[i]] += dout[i].
// ------------------------------------------------------------------------------------------------
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t n, int64_t d) {
#pragma omp parallel for schedule(static) if (n * d >= kMinParallelElems)
  for (int64_t i = 0; i < n; ++i) std::copy_n(table + int64_t{ids[i]} * d, d, out + i * d);
}

template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, int64_t n, int64_t d) {
  // Serial: rows with the same id add into the same table row, and n*d is small next to the
  // matmuls. Rows are added in position order, so the result is deterministic.
  for (int64_t i = 0; i < n; ++i) {
    T* dst = dtable + int64_t{ids[i]} * d;
    const T* src = dout + i * d;
    for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
  }
}

// ------------------------------------------------------------------------------------------------
// RMSNorm: r = (mean(x^2) + eps)^(-1/2), y = x r w.
//   dr/dx_k = -r^3 x_k / d, so dx_k = r (w_k dy_k - x_k r^2 mean_j(x_j w_j dy_j))
//   dw_k   = sum over rows of dy_k x_k r
// ------------------------------------------------------------------------------------------------
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t d, T eps) {
#pragma omp parallel for schedule(static) if (n * d >= kMinParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    T* yi = y + i * d;
    T ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += xi[c] * xi[c];
    const T r = T(1) / std::sqrt(ss / T(d) + eps);
    rstd[i] = r;
    for (int64_t c = 0; c < d; ++c) yi[c] = xi[c] * r * w[c];
  }
}

template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t n,
                      int64_t d) {
#pragma omp parallel for schedule(static) if (n * d >= kMinParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    const T* dyi = dy + i * d;
    T* dxi = dx + i * d;
    const T r = rstd[i];
    T dot = 0;  // sum_j x_j w_j dy_j
    for (int64_t c = 0; c < d; ++c) dot += xi[c] * w[c] * dyi[c];
    const T coef = r * r * dot / T(d);
    for (int64_t c = 0; c < d; ++c) dxi[c] += r * (w[c] * dyi[c] - xi[c] * coef);
  }
  // dw sums over rows: split the columns between threads so no two threads write one element.
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (n * d >= kMinParallelElems)
  for (int64_t c0 = 0; c0 < d; c0 += kCols) {
    const int64_t c1 = std::min(d, c0 + kCols);
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = x + i * d;
      const T* dyi = dy + i * d;
      const T r = rstd[i];
      for (int64_t c = c0; c < c1; ++c) dw[c] += dyi[c] * xi[c] * r;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// RoPE, interleaved pairs: (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), angle = pos * theta^(-2j/dh).
// The rotation is orthogonal, so backward applies its transpose: (g0 c + g1 s, -g0 s + g1 c).
// ------------------------------------------------------------------------------------------------
namespace {

// cos/sin of every (position, pair), computed in double and rounded once to T.
// Rows of positions [pos0, pos0 + seq): entry (p - pos0) * half + j. Each value depends only on
// (p, j), so any window of positions rounds exactly as the whole table would.
template <typename T>
void rope_table(int64_t pos0, int64_t seq, int64_t head_dim, T theta, std::vector<T>& cs,
                std::vector<T>& sn) {
  const int64_t half = head_dim / 2;
  cs.resize(seq * half);
  sn.resize(seq * half);
  for (int64_t j = 0; j < half; ++j) {
    const double freq = std::pow(static_cast<double>(theta), -2.0 * j / head_dim);
    for (int64_t i = 0; i < seq; ++i) {
      const int64_t p = pos0 + i;
      cs[i * half + j] = static_cast<T>(std::cos(p * freq));
      sn[i * half + j] = static_cast<T>(std::sin(p * freq));
    }
  }
}

// Row i is at position pos0 + i % seq.
template <typename T>
void rope_apply(T* x, int64_t n, int64_t pos0, int64_t seq, int64_t d, int64_t head_dim, T theta,
                T sign) {
  TRAINER_CHECK(head_dim % 2 == 0 && d % head_dim == 0, "rope: head_dim {} with d {}", head_dim, d);
  std::vector<T> cs, sn;
  rope_table(pos0, seq, head_dim, theta, cs, sn);
  const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (n * d >= kMinParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const T* c = cs.data() + (i % seq) * half;
    const T* s = sn.data() + (i % seq) * half;
    for (int64_t h0 = 0; h0 < d; h0 += head_dim) {
      T* xh = x + i * d + h0;
      for (int64_t j = 0; j < half; ++j) {
        const T x0 = xh[2 * j], x1 = xh[2 * j + 1], sj = sign * s[j];
        xh[2 * j] = x0 * c[j] - x1 * sj;
        xh[2 * j + 1] = x0 * sj + x1 * c[j];
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(T* x, int64_t n, int64_t seq, int64_t d, int64_t head_dim, T theta) {
  rope_apply(x, n, int64_t{0}, seq, d, head_dim, theta, T(1));
}

template <typename T>
void rope_forward_at(T* x, int64_t n, int64_t pos0, int64_t d, int64_t head_dim, T theta) {
  rope_apply(x, n, pos0, n, d, head_dim, theta, T(1));
}

template <typename T>
void rope_backward(T* dx, int64_t n, int64_t seq, int64_t d, int64_t head_dim, T theta) {
  rope_apply(dx, n, int64_t{0}, seq, d, head_dim, theta, T(-1));
}

// ------------------------------------------------------------------------------------------------
// Causal attention, per (b, h), with s = 1/sqrt(dh):
//   S_ij = s q_i.k_j (j <= i),  P_i = softmax(S_i),  out_i = sum_j P_ij v_j
// Backward, from dout:
//   dv_j = sum_i P_ij dout_i,  dP_ij = dout_i.v_j,  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
//   dq_i = s sum_j dS_ij k_j,  dk_j = s sum_i dS_ij q_i
// ------------------------------------------------------------------------------------------------
namespace {

// One query row of one head over keys/values 0..len-1 (rows of stride d, this head's columns):
// p[0, len) = softmax(scale q.k_j), o = sum_j p[j] v_j. Training and decoding share it, so a
// decoded position computes exactly what the full forward computes there.
template <typename T>
void attend_row(const T* qi, const T* k, const T* v, int64_t len, int64_t d, int64_t head_dim,
                T scale, T* p, T* oi) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < len; ++j) {
    const T* kj = k + j * d;
    T dot = 0;
    for (int64_t c = 0; c < head_dim; ++c) dot += qi[c] * kj[c];
    p[j] = dot * scale;
    m = std::max(m, p[j]);
  }
  const T inv = T(1) / exp_shifted_sum(p, m, p, len);
  for (int64_t j = 0; j < len; ++j) p[j] *= inv;
  std::fill_n(oi, head_dim, T(0));
  for (int64_t j = 0; j < len; ++j) {
    const T* vj = v + j * d;
    for (int64_t c = 0; c < head_dim; ++c) oi[c] += p[j] * vj[c];
  }
}

}  // namespace

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t seq,
                       int64_t H, int64_t head_dim) {
  const int64_t d = H * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = b * seq * d + h * head_dim;  // row 0 of this (b, h)
      for (int64_t i = 0; i < seq; ++i) {
        T* p = probs + ((b * H + h) * seq + i) * seq;
        attend_row(q + base + i * d, k + base, v + base, i + 1, d, head_dim, scale, p,
                   out + base + i * d);
        for (int64_t j = i + 1; j < seq; ++j) p[j] = T(0);
      }
    }
  }
}

template <typename T>
void attention_decode(const T* q, const T* k_cache, const T* v_cache, T* out, int64_t n,
                      int64_t pos0, int64_t H, int64_t head_dim) {
  const int64_t d = H * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
#pragma omp parallel
  {
    std::vector<T> p(pos0 + n);
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h)
        attend_row(q + i * d + h * head_dim, k_cache + h * head_dim, v_cache + h * head_dim,
                   pos0 + i + 1, d, head_dim, scale, p.data(), out + i * d + h * head_dim);
  }
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, int64_t B, int64_t seq, int64_t H, int64_t head_dim) {
  const int64_t d = H * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
#pragma omp parallel
  {
    std::vector<T> ds(seq);  // one row of dP, then dS
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = b * seq * d + h * head_dim;
        for (int64_t i = 0; i < seq; ++i) {
          std::fill_n(dq + base + i * d, head_dim, T(0));
          std::fill_n(dk + base + i * d, head_dim, T(0));
          std::fill_n(dv + base + i * d, head_dim, T(0));
        }
        for (int64_t i = 0; i < seq; ++i) {
          const T* p = probs + ((b * H + h) * seq + i) * seq;
          const T* qi = q + base + i * d;
          const T* doi = dout + base + i * d;
          T rowdot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const T* vj = v + base + j * d;
            T* dvj = dv + base + j * d;
            T dp = 0;
            for (int64_t c = 0; c < head_dim; ++c) {
              dp += doi[c] * vj[c];
              dvj[c] += p[j] * doi[c];
            }
            ds[j] = dp;
            rowdot += dp * p[j];
          }
          T* dqi = dq + base + i * d;
          for (int64_t j = 0; j <= i; ++j) {
            const T g = p[j] * (ds[j] - rowdot) * scale;
            const T* kj = k + base + j * d;
            T* dkj = dk + base + j * d;
            for (int64_t c = 0; c < head_dim; ++c) {
              dqi[c] += g * kj[c];
              dkj[c] += g * qi[c];
            }
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// SwiGLU gate: out = silu(a) b, silu(a) = a sig(a), silu'(a) = sig(a) (1 + a (1 - sig(a))).
//   da = dout b silu'(a),  db = dout silu(a)
// ------------------------------------------------------------------------------------------------
// Both work in chunks: the sigmoids of a chunk go to a small local buffer, then a plain loop.
constexpr int64_t kGateChunk = 1024;

template <typename T>
void swiglu_forward(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElems)
  for (int64_t c0 = 0; c0 < n; c0 += kGateChunk) {
    const int64_t m = std::min(kGateChunk, n - c0);
    T sig[kGateChunk];
    sigmoid_n(a + c0, sig, m);
    for (int64_t i = 0; i < m; ++i) out[c0 + i] = a[c0 + i] * sig[i] * b[c0 + i];
  }
}

template <typename T>
void swiglu_backward(const T* a, const T* b, const T* dout, T* da, T* db, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElems)
  for (int64_t c0 = 0; c0 < n; c0 += kGateChunk) {
    const int64_t m = std::min(kGateChunk, n - c0);
    T sig[kGateChunk];
    sigmoid_n(a + c0, sig, m);
    for (int64_t i = 0; i < m; ++i) {
      const T ai = a[c0 + i], bi = b[c0 + i], g = dout[c0 + i], s = sig[i];
      // a, b and dout are read before da and db are written, so the caller may alias them.
      da[c0 + i] = g * bi * s * (T(1) + ai * (T(1) - s));
      db[c0 + i] = g * ai * s;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Cross-entropy: loss_i = logsumexp(l_i) - l_i[t_i];  dl_i = scale (softmax(l_i) - onehot(t_i)).
// The max is subtracted before exp so nothing overflows.
// ------------------------------------------------------------------------------------------------
namespace {

template <typename T>
void check_targets(const int32_t* targets, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i)
    TRAINER_CHECK(targets[i] >= 0 && targets[i] < V, "target {} at row {} outside vocab {}",
                  targets[i], i, V);
}

}  // namespace

template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t n,
                           int64_t V) {
  check_targets<T>(targets, n, V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * V;
    const T m = max_n(l, V);
    const T sum = exp_shifted_sum(l, m, static_cast<T*>(nullptr), V);
    losses[i] = (m - l[targets[i]]) + std::log(sum);  // m - l[t] first: exact for large logits
  }
}

template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, T* dlogits, int64_t n,
                            int64_t V, T scale) {
  check_targets<T>(targets, n, V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * V;
    T* dl = dlogits + i * V;  // may be l itself: each element is read before it is written
    const T m = max_n(l, V);
    const T f = scale / exp_shifted_sum(l, m, dl, V);  // dl = exp(l - m) for now
    for (int64_t j = 0; j < V; ++j) dl[j] *= f;
    dl[targets[i]] -= scale;
  }
}

// ------------------------------------------------------------------------------------------------
#define TRAINER_INSTANTIATE_CPU_OPS(T)                                                           \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,   \
                        int64_t, T, T*, int64_t);                                                \
  template void linear_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);            \
  template void linear_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t,       \
                                   int64_t);                                                     \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t);            \
  template void embedding_backward<T>(const int32_t*, const T*, T*, int64_t, int64_t);           \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, T);             \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t,     \
                                    int64_t);                                                    \
  template void rope_forward<T>(T*, int64_t, int64_t, int64_t, int64_t, T);                      \
  template void rope_backward<T>(T*, int64_t, int64_t, int64_t, int64_t, T);                     \
  template void rope_forward_at<T>(T*, int64_t, int64_t, int64_t, int64_t, T);                   \
  template void attention_decode<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, \
                                    int64_t);                                                    \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t,     \
                                     int64_t, int64_t);                                          \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,  \
                                      T*, int64_t, int64_t, int64_t, int64_t);                   \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                              \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);               \
  template void cross_entropy_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t);        \
  template void cross_entropy_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t, T);

TRAINER_INSTANTIATE_CPU_OPS(float)
TRAINER_INSTANTIATE_CPU_OPS(double)
#undef TRAINER_INSTANTIATE_CPU_OPS

}  // namespace trainer::cpu
