// GPU tests of model/cuda's kernels and matmul wrapper against the CPU reference ops (float) on
// random inputs of awkward sizes: head dim 80, vocabularies 37 / 10000 / 50257, sequence lengths
// 17 and 100, widths that defeat the vector paths. Outputs are poisoned with NaN (all bits set)
// first, so an element a kernel forgets to write fails the comparison. Errors are relative
// L2 norms, ||out - ref|| / ||ref||: below 1e-5 in fp32, 2e-2 in bf16 and 5e-3 in fp16 (3 more
// fraction bits than bf16; the 16-bit references run on the rounded inputs). Skipped (exit 77)
// without a GPU.
#ifdef TRAINER_WITH_CUDA

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/cuda/convert.h"
#include "core/cuda_check.h"
#include "core/device_buffer.h"
#include "model/cpu/ops.h"
#include "model/cuda/attention.cuh"
#include "model/cuda/cross_entropy.cuh"
#include "model/cuda/embedding.cuh"
#include "model/cuda/matmul.h"
#include "model/cuda/residual.cuh"
#include "model/cuda/rmsnorm.cuh"
#include "model/cuda/rope.cuh"
#include "model/cuda/swiglu.cuh"
#include "model/embedding_buckets.h"
#include "model/layout.h"
#include "tests/catch.h"

using namespace trainer;
using bf16 = __nv_bfloat16;
using f16 = __half;

namespace {

// Storage type of a device array: only the element size matters to DeviceBuffer.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return DType::kBF16;
  else if constexpr (std::is_same_v<T, f16>)
    return DType::kF16;
  else if constexpr (sizeof(T) == 8)
    return DType::kF64;
  else
    return DType::kF32;  // float, int32_t, unsigned
}

template <typename T>
double tol() {
  if constexpr (std::is_same_v<T, f16>) return 5e-3;
  return std::is_same_v<T, float> ? 1e-5 : 2e-2;
}

// The value x takes once stored as T.
template <typename T>
float stored(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, f16>)
    return __half2float(__float2half_rn(x));
  else
    return __bfloat162float(__float2bfloat16_rn(x));
}

template <typename T>
std::vector<float> quantized(std::vector<float> v) {
  for (float& x : v) x = stored<T>(x);
  return v;
}

std::vector<float> randn(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// A device array of n elements of T.
template <typename T>
struct Dev {
  DeviceBuffer buf;
  int64_t n = 0;
  explicit Dev(int64_t count) : buf(DeviceKind::kCuda, dtype_of<T>(), count), n(count) {}
  T* p() const { return buf.as<T>(); }
};

template <typename T>
Dev<T> upload(const std::vector<float>& h) {
  Dev<T> d(static_cast<int64_t>(h.size()));
  std::vector<T> t(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      t[i] = h[i];
    else if constexpr (std::is_same_v<T, f16>)
      t[i] = __float2half_rn(h[i]);
    else
      t[i] = __float2bfloat16_rn(h[i]);
  }
  CUDA_CHECK(cudaMemcpy(d.p(), t.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// All bits set: NaN in fp32, bf16 and fp16.
template <typename T>
Dev<T> poisoned(int64_t n) {
  Dev<T> d(n);
  CUDA_CHECK(cudaMemset(d.p(), 0xFF, n * sizeof(T)));
  return d;
}

template <typename T>
std::vector<float> download(const Dev<T>& d) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> t(static_cast<size_t>(d.n));
  CUDA_CHECK(cudaMemcpy(t.data(), d.p(), t.size() * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> h(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      h[i] = t[i];
    else if constexpr (std::is_same_v<T, f16>)
      h[i] = __half2float(t[i]);
    else
      h[i] = __bfloat162float(t[i]);
  }
  return h;
}

struct IntDev {
  DeviceBuffer buf;
  explicit IntDev(const std::vector<int32_t>& h)
      : buf(DeviceKind::kCuda, DType::kF32, static_cast<int64_t>(h.size())) {
    CUDA_CHECK(cudaMemcpy(p(), h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  int32_t* p() const { return static_cast<int32_t*>(buf.view().data); }
};

// ||out - ref|| / ||ref|| over the first n elements (all when n < 0); NaN anywhere gives NaN,
// which fails every `<` comparison.
double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  REQUIRE(out.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Token-major (B, T, H*dh) <-> head-major (B, H, T, dh) on the host.
std::vector<float> to_head_major(const std::vector<float>& x, int64_t B, int64_t T, int64_t H,
                                 int64_t dh) {
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < dh; ++e)
          y[((b * H + h) * T + t) * dh + e] = x[(b * T + t) * H * dh + h * dh + e];
  return y;
}
std::vector<float> to_token_major(const std::vector<float>& x, int64_t B, int64_t T, int64_t H,
                                  int64_t dh) {
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < dh; ++e)
          y[(b * T + t) * H * dh + h * dh + e] = x[((b * H + h) * T + t) * dh + e];
  return y;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// matmul
// ------------------------------------------------------------------------------------------------

namespace {

enum class Mode { kFp32, kTf32, kBf16ToBf16, kBf16ToF32, kF16ToF16, kF16ToF32 };

// One row-major problem D = alpha op(A) op(B) + beta C of sizes that fit no tile, with padded
// row strides, checked against cpu::gemm on the values as stored.
void check_gemm(Mode mode, bool ta, bool tb, bool separate_c, int64_t batch) {
  const int64_t M = 37, N = 50, K = 80;
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
  const int64_t rows_a = ta ? K : M, rows_b = tb ? N : K;
  const int64_t sa = rows_a * lda + 7, sb = rows_b * ldb + 1, sc = M * ldc + 3;
  const bool bf16_in = mode == Mode::kBf16ToBf16 || mode == Mode::kBf16ToF32;
  const bool bf16_out = mode == Mode::kBf16ToBf16;
  const bool f16_in = mode == Mode::kF16ToF16 || mode == Mode::kF16ToF32;
  const bool f16_out = mode == Mode::kF16ToF16;
  auto q_in = [&](std::vector<float> v) {
    return bf16_in ? quantized<bf16>(v) : (f16_in ? quantized<f16>(v) : v);
  };
  auto q_out = [&](std::vector<float> v) {
    return bf16_out ? quantized<bf16>(v) : (f16_out ? quantized<f16>(v) : v);
  };
  const std::vector<float> A = q_in(randn(sa * batch, 1.0f, 1));
  const std::vector<float> B = q_in(randn(sb * batch, 1.0f, 2));
  const std::vector<float> C = q_out(randn(sc * batch, 1.0f, 3));
  const float alpha = 0.75f, beta = 0.5f;

  std::vector<float> ref = C;
  for (int64_t i = 0; i < batch; ++i)
    cpu::gemm<float>(ta, tb, M, N, K, alpha, A.data() + i * sa, lda, B.data() + i * sb, ldb, beta,
                     ref.data() + i * sc, ldc);

  cuda::Matmul mm;
  cuda::Gemm g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = M, g.n = N, g.k = K;
  g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.ldd = ldc;
  g.alpha = alpha, g.beta = beta;
  g.batch = batch;
  g.stride_a = sa, g.stride_b = sb, g.stride_c = sc, g.stride_d = sc;
  g.ab_type = bf16_in ? DType::kBF16 : (f16_in ? DType::kF16 : DType::kF32);
  g.cd_type = bf16_out ? DType::kBF16 : (f16_out ? DType::kF16 : DType::kF32);
  g.tf32 = mode == Mode::kTf32;

  auto run = [&](auto in_tag, auto out_tag) {
    using TI = decltype(in_tag);
    using TO = decltype(out_tag);
    Dev<TI> a = upload<TI>(A), b = upload<TI>(B);
    Dev<TO> c = upload<TO>(C);
    g.a = a.p();
    g.b = b.p();
    std::vector<float> out;
    if (separate_c) {
      // D starts as NaN except between rows (padding), which must stay untouched.
      Dev<TO> d = poisoned<TO>(sc * batch);
      g.c = c.p();
      g.d = d.p();
      mm.run(g, nullptr);
      out = download(d);
    } else {
      g.c = nullptr;  // accumulate into D
      g.d = c.p();
      mm.run(g, nullptr);
      out = download(c);
    }
    // Compare only the M x N window of each batch entry.
    std::vector<float> o, r;
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          o.push_back(out[i * sc + m * ldc + n]);
          r.push_back(ref[i * sc + m * ldc + n]);
        }
    return rel_err(o, r);
  };
  double err = 0;
  if (mode == Mode::kFp32 || mode == Mode::kTf32)
    err = run(float{}, float{});
  else if (mode == Mode::kBf16ToBf16)
    err = run(bf16{}, bf16{});
  else if (mode == Mode::kBf16ToF32)
    err = run(bf16{}, float{});
  else if (mode == Mode::kF16ToF16)
    err = run(f16{}, f16{});
  else
    err = run(f16{}, float{});
  const double limit = mode == Mode::kFp32 ? 1e-5 : mode == Mode::kTf32 || f16_in ? 5e-3 : 2e-2;
  INFO("mode " << static_cast<int>(mode) << " trans " << ta << tb << " separate C " << separate_c
               << " batch " << batch << " rel err " << err);
  CHECK(err < limit);
  // Same problem again: the cached plan is reused, no new one appears.
  const size_t plans = mm.plans();
  if (mode == Mode::kFp32) {
    run(float{}, float{});
    CHECK(mm.plans() == plans);
  }
}

}  // namespace

TEST_CASE("matmul: every mode and transpose matches cpu::gemm", "[cuda][matmul]") {
  for (Mode mode : {Mode::kFp32, Mode::kTf32, Mode::kBf16ToBf16, Mode::kBf16ToF32, Mode::kF16ToF16,
                    Mode::kF16ToF32})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm(mode, ta, tb, /*separate_c=*/false, /*batch=*/1);
        check_gemm(mode, ta, tb, /*separate_c=*/true, /*batch=*/1);
      }
}

TEST_CASE("matmul: strided batches match cpu::gemm per entry", "[cuda][matmul]") {
  for (Mode mode : {Mode::kFp32, Mode::kBf16ToBf16, Mode::kBf16ToF32, Mode::kF16ToF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) check_gemm(mode, ta, tb, true, 3);
}

// Matmul::set_tuning picks among cuBLASLt's algorithms only those whose products equal its first
// choice's bit for bit: a step's kinds of product (a Linear with the residual added, the input
// gradient, the weight gradient into fp32, written and then accumulated in place as over
// micro-batches, the logits of a vocabulary narrower than their row stride), on operands aligned
// to 256 bytes and to fewer, with data after them, give the very outputs of an untuned Matmul,
// whatever the timings chose.
TEST_CASE("matmul: tuned products equal the first choice's bit for bit", "[cuda][matmul]") {
  struct Shape {
    bool ta, tb, separate_c, f32_out;
    int64_t m, n, k;
    float beta;     // of the second call (the first has beta 0)
    int64_t shift;  // elements every operand starts after a 256-byte boundary
    int64_t pad;    // elements every row stride exceeds its row by
  };
  const Shape shapes[] = {
      {false, true, true, false, 2048, 768, 768, 1.0f, 0, 0},     // x W^T + residual
      {false, false, false, false, 2048, 3072, 768, 0.0f, 0, 0},  // dy W
      {true, false, false, true, 768, 3072, 2048, 1.0f, 0, 0},    // dy^T x into fp32, accumulated
      {true, false, false, true, 768, 768, 2048, 1.0f, 1, 0},     // the same, 4-byte aligned
      {true, false, false, true, 32, 64, 192, 1.0f, 3, 0},        // a tiny one, 4- and 2-byte
      {false, true, false, false, 1000, 250, 130, 0.0f, 1, 0},    // sizes that fit no tile
      {false, true, false, false, 192, 61, 32, 0.0f, 0, 3},       // logits, vocabulary 61 of 64
      {false, false, false, false, 192, 32, 61, 0.0f, 0, 3},      // their input gradient
  };
  cuda::Matmul plain, tuned, again;  // `again` plans each problem after `tuned` did
  tuned.set_tuning(true);
  again.set_tuning(true);
  int problems = 0;
  for (const Shape& sh : shapes) {
    const int64_t rows_a = sh.ta ? sh.k : sh.m, lda = (sh.ta ? sh.m : sh.k) + sh.pad;
    const int64_t rows_b = sh.tb ? sh.n : sh.k, ldb = (sh.tb ? sh.k : sh.n) + sh.pad;
    const int64_t ldd = sh.n + sh.pad;
    // Gaussian values with one in 8 subnormal (products and sums near the underflow, where
    // kernels could flush differently); NaN in the `shift` elements before the matrix, its rows'
    // padding and 128 rows after it: memory around a matrix must not change its product, not
    // even through 0 x NaN.
    auto values = [&](int64_t rows, int64_t cols, int64_t ld, uint32_t seed) {
      std::vector<float> v = randn(sh.shift + (rows + 128) * ld, 1.0f, seed);
      for (size_t i = 3; i < v.size(); i += 8) v[i] *= 1e-38f;
      for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
        const int64_t j = i - sh.shift;
        if (j < 0 || j >= rows * ld || j % ld >= cols) v[i] = std::nanf("");
      }
      return quantized<bf16>(v);
    };
    const std::vector<float> A = values(rows_a, lda - sh.pad, lda, 11);
    const std::vector<float> B = values(rows_b, ldb - sh.pad, ldb, 12);
    const std::vector<float> C = values(sh.m, sh.n, ldd, 13);
    auto product = [&](cuda::Matmul& mm, auto out_tag) {
      using TO = decltype(out_tag);
      Dev<bf16> a = upload<bf16>(A), b = upload<bf16>(B);
      Dev<TO> c = upload<TO>(C), d = upload<TO>(C);
      cuda::Gemm g;
      g.trans_a = sh.ta;
      g.trans_b = sh.tb;
      g.m = sh.m, g.n = sh.n, g.k = sh.k;
      g.a = a.p() + sh.shift, g.lda = lda;
      g.b = b.p() + sh.shift, g.ldb = ldb;
      g.c = sh.separate_c ? c.p() + sh.shift : nullptr, g.ldc = ldd;
      g.d = d.p() + sh.shift, g.ldd = ldd;
      g.ab_type = DType::kBF16;
      g.cd_type = sh.f32_out ? DType::kF32 : DType::kBF16;
      mm.run(g, nullptr);
      g.beta = sh.beta;
      mm.run(g, nullptr);
      return download(d);
    };
    INFO("m " << sh.m << " n " << sh.n << " k " << sh.k << " trans " << sh.ta << sh.tb << " shift "
              << sh.shift << " pad " << sh.pad);
    const std::vector<float> want = sh.f32_out ? product(plain, float{}) : product(plain, bf16{});
    const std::vector<float> got = sh.f32_out ? product(tuned, float{}) : product(tuned, bf16{});
    REQUIRE(got.size() == want.size());  // compared bit for bit: NaN stays where it was
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    const std::vector<float> reused = sh.f32_out ? product(again, float{}) : product(again, bf16{});
    CHECK(std::memcmp(reused.data(), want.data(), reused.size() * sizeof(float)) == 0);
    ++problems;
  }
  const cuda::Matmul::TuneStats t = tuned.tune_stats();
  INFO("offered " << t.offered << " identical " << t.identical << " tuned " << t.tuned
                  << " switched " << t.switched);
  CHECK(t.problems == problems);
  CHECK(plain.tune_stats().problems == problems);
  CHECK(plain.tune_stats().offered == 0);  // untuned: the first choice, nothing else asked for
  CHECK(t.offered > 0);                    // cuBLASLt offers alternatives for these shapes
  CHECK(t.identical <= t.offered);
  CHECK(t.tuned <= t.problems);
  CHECK(t.switched <= t.tuned);
  // The second tuned Matmul takes the first one's picks: nothing offered or timed again.
  const cuda::Matmul::TuneStats r = again.tune_stats();
  CHECK(t.reused == 0);
  CHECK(r.problems == problems);
  CHECK(r.reused > 0);
  CHECK(r.offered == 0);
  CHECK(r.tuned == 0);
}

TEST_CASE("matmul: bad arguments are refused with the shape in the message", "[cuda][matmul]") {
  cuda::Matmul mm;
  Dev<float> a(64), b(64), d(64);
  cuda::Gemm g;
  g.m = 8, g.n = 8, g.k = 8;
  g.a = a.p(), g.b = b.p(), g.d = d.p();
  g.lda = 8, g.ldb = 4, g.ldd = 8;  // ldb < n
  try {
    mm.run(g, nullptr);
    FAIL("a row stride below the row length was accepted");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()).find("m=8 n=8 k=8") != std::string::npos);
  }
  g.ldb = 8;
  g.cd_type = DType::kBF16;  // bf16 output needs bf16 inputs
  CHECK_THROWS_AS(mm.run(g, nullptr), RuntimeError);
  g.ab_type = DType::kF16;  // nor fp16 ones
  CHECK_THROWS_AS(mm.run(g, nullptr), RuntimeError);
}

// ------------------------------------------------------------------------------------------------
// embedding
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("embedding forward and deterministic backward match the CPU", "[cuda]", float,
                   bf16, f16) {
  using T = TestType;
  for (int64_t V : {int64_t{37}, int64_t{10000}})
    for (int64_t d : {int64_t{80}, int64_t{128}, int64_t{6}}) {
      const int64_t n = 3 * 17;
      const std::vector<int32_t> ids = random_ids(n, V, 7);
      const std::vector<float> table = quantized<T>(randn(V * d, 1.0f, 8));
      IntDev ids_d(ids);
      Dev<T> table_d = upload<T>(table);
      Dev<T> out = poisoned<T>(n * d);
      cuda::embedding_forward(ids_d.p(), table_d.p(), out.p(), n, d, nullptr);
      std::vector<float> ref(n * d);
      cpu::embedding_forward(ids.data(), table.data(), ref.data(), n, d);
      INFO("V " << V << " d " << d);
      CHECK(rel_err(download(out), ref) < tol<T>());

      // Backward accumulates into an fp32 table that already holds values.
      const std::vector<float> dout = quantized<T>(randn(n * d, 1.0f, 9));
      std::vector<float> dtable = randn(V * d, 1.0f, 10);
      std::vector<int32_t> b_ids(n), b_start(n + 1), b_pos(n);
      std::vector<int32_t> scratch;
      const int64_t groups = build_embedding_buckets(ids.data(), n, scratch, b_ids.data(),
                                                     b_start.data(), b_pos.data());
      CHECK(groups <= n);
      CHECK(b_start[groups] == n);
      IntDev bi(b_ids), bs(b_start), bp(b_pos);
      Dev<T> dout_d = upload<T>(dout);
      Dev<float> dtable_d = upload<float>(dtable);
      cuda::embedding_backward(dout_d.p(), bi.p(), bs.p(), bp.p(), groups, dtable_d.p(), d,
                               nullptr);
      cpu::embedding_backward(ids.data(), dout.data(), dtable.data(), n, d);
      CHECK(rel_err(download(dtable_d), dtable) < 1e-6);
    }
}

// ------------------------------------------------------------------------------------------------
// RMSNorm
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("rmsnorm forward and backward match the CPU", "[cuda]", float, bf16, f16) {
  using T = TestType;
  // 2000 rows: the gain gradient's row groups reach their cap; 5000: the fused backward's blocks
  // take several batches of rows. Widths 128 to 1000 with vector access run the fused backward
  // (rows of 1 to 8 warp-wide chunks, some partial); 3000 is too wide for its shared memory and 6
  // (and 100 in 16 bits) too narrow for vectors, so they run the separate dx and dw kernels.
  // Forward keeps rows of up to 12 vectors per lane in registers: 3000 does in 16 bits, not in
  // fp32; 3100 does in neither.
  for (int64_t n : {int64_t{34}, int64_t{300}, int64_t{2000}, int64_t{5000}})
    for (int64_t d : {int64_t{128}, int64_t{80}, int64_t{100}, int64_t{6}, int64_t{768},
                      int64_t{1000}, int64_t{3000}, int64_t{3100}}) {
      if (n == 5000 && d >= 3000) continue;  // keeps the test short; 2000 x 3000 runs that path
      if (n == 2000 && d == 3100) continue;
      INFO("n " << n << " d " << d);
      const std::vector<float> x = quantized<T>(randn(n * d, 1.5f, 11));
      std::vector<float> w = randn(d, 0.3f, 12);
      for (float& v : w) v = stored<T>(v + 1.0f);
      Dev<T> x_d = upload<T>(x), w_d = upload<T>(w);
      Dev<T> y_d = poisoned<T>(n * d);
      Dev<float> rstd_d = poisoned<float>(n);
      cuda::rmsnorm_forward(x_d.p(), w_d.p(), y_d.p(), rstd_d.p(), n, d, 1e-5f, nullptr);
      std::vector<float> y(n * d), rstd(n);
      cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, d, 1e-5f);
      CHECK(rel_err(download(y_d), y) < tol<T>());
      CHECK(rel_err(download(rstd_d), rstd) < 1e-5);

      // Backward twice in a row into values already there: checks accumulation, the partial-sum
      // scratch and that the tile counters come back to zero.
      const std::vector<float> dy = quantized<T>(randn(n * d, 1.0f, 13));
      std::vector<float> dx = quantized<T>(randn(n * d, 1.0f, 14));
      std::vector<float> dw = randn(d, 1.0f, 15);
      Dev<T> dy_d = upload<T>(dy), dx_d = upload<T>(dx);
      Dev<float> dw_d = upload<float>(dw);
      // The fp32 rstd the device computed is what its backward uses; the CPU gets its own.
      Dev<float> partial(cuda::rmsnorm_backward_partial_floats(d));
      Dev<unsigned> counters(cuda::rmsnorm_backward_counters(d));
      const cuda::RmsnormScratch scratch{partial.p(), counters.p()};
      for (int rep = 0; rep < 2; ++rep) {
        cuda::rmsnorm_backward(x_d.p(), w_d.p(), rstd_d.p(), dy_d.p(), dx_d.p(), true, dw_d.p(),
                               true, n, d, scratch, nullptr);
        cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), n,
                              d);
      }
      CHECK(rel_err(download(dx_d), dx) < tol<T>());
      CHECK(rel_err(download(dw_d), dw) < (std::is_same_v<T, float> ? 1e-5 : 1e-3));

      // Overwrite mode ignores what dx and dw held.
      Dev<T> dx2 = poisoned<T>(n * d);
      std::vector<float> dx_ref(n * d, 0.0f), dw_ref(d, 0.0f);
      Dev<float> dw2 = poisoned<float>(d);
      cuda::rmsnorm_backward(x_d.p(), w_d.p(), rstd_d.p(), dy_d.p(), dx2.p(), false, dw2.p(), false,
                             n, d, scratch, nullptr);
      cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx_ref.data(),
                            dw_ref.data(), n, d);
      CHECK(rel_err(download(dx2), dx_ref) < tol<T>());
      CHECK(rel_err(download(dw2), dw_ref) < (std::is_same_v<T, float> ? 1e-5 : 1e-3));

      // Deterministic: the same inputs give the same bits.
      Dev<T> dx3 = poisoned<T>(n * d);
      Dev<float> dw3 = poisoned<float>(d);
      cuda::rmsnorm_backward(x_d.p(), w_d.p(), rstd_d.p(), dy_d.p(), dx3.p(), false, dw3.p(), false,
                             n, d, scratch, nullptr);
      const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() &&
               std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      CHECK(same_bits(download(dx3), download(dx2)));
      CHECK(same_bits(download(dw3), download(dw2)));
    }
}

// ------------------------------------------------------------------------------------------------
// RoPE and layouts
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("rope forward and backward match the CPU", "[cuda]", float, bf16, f16) {
  using T = TestType;
  const int64_t B = 2, seq = 17;
  // 27 heads of 80: more heads than one block holds, so the heads split over blocks.
  for (auto [H, dh] :
       std::vector<std::pair<int64_t, int64_t>>{{2, 80}, {2, 16}, {2, 6}, {27, 80}}) {
    INFO("heads " << H << " head_dim " << dh);
    const int64_t d = H * dh, n = B * seq;
    const std::vector<float> table = cuda::rope_table(seq, dh, 10000.0);
    Dev<float> table_d = upload<float>(table);
    const std::vector<float> x = quantized<T>(randn(n * d, 1.0f, 21));
    Dev<T> x_d = upload<T>(x);
    for (bool inverse : {false, true}) {
      Dev<T> y_d = poisoned<T>(n * d);
      cuda::RopeJobs<T> jobs;
      jobs.add(x_d.p(), y_d.p(), true);
      cuda::rope(jobs, cuda::QkvLayout::kTokenMajor, d, cuda::QkvLayout::kTokenMajor, d, B, seq, H,
                 dh, table_d.p(), inverse, nullptr);
      std::vector<float> ref = x;
      if (inverse)
        cpu::rope_backward(ref.data(), n, seq, d, dh, 10000.0f);
      else
        cpu::rope_forward(ref.data(), n, seq, d, dh, 10000.0f);
      CHECK(rel_err(download(y_d), ref) < tol<T>());
    }

    // The flash path's use: q and k rotated in place in the [v | k | q] columns of one (n, 3d)
    // matrix; v is left alone.
    {
      const std::vector<float> m = quantized<T>(randn(n * 3 * d, 1.0f, 23));
      Dev<T> m_d = upload<T>(m);
      cuda::RopeJobs<T> jobs;
      jobs.add(m_d.p() + 2 * d, m_d.p() + 2 * d, true);
      jobs.add(m_d.p() + d, m_d.p() + d, true);
      cuda::rope(jobs, cuda::QkvLayout::kTokenMajor, 3 * d, cuda::QkvLayout::kTokenMajor, 3 * d, B,
                 seq, H, dh, table_d.p(), false, nullptr);
      std::vector<float> q(n * d), k(n * d);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; ++c) {
          k[i * d + c] = m[i * 3 * d + d + c];
          q[i * d + c] = m[i * 3 * d + 2 * d + c];
        }
      cpu::rope_forward(q.data(), n, seq, d, dh, 10000.0f);
      cpu::rope_forward(k.data(), n, seq, d, dh, 10000.0f);
      const std::vector<float> got = download(m_d);
      std::vector<float> got_q(n * d), got_k(n * d);
      bool v_kept = true;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; ++c) {
          v_kept = v_kept && got[i * 3 * d + c] == m[i * 3 * d + c];
          got_k[i * d + c] = got[i * 3 * d + d + c];
          got_q[i * d + c] = got[i * 3 * d + 2 * d + c];
        }
      CHECK(v_kept);
      CHECK(rel_err(got_q, q) < tol<T>());
      CHECK(rel_err(got_k, k) < tol<T>());
    }

    // The replica's use: [v | k | q] columns of one (n, 3d) matrix to head-major q, k (rotated)
    // and v (copied), then back with the inverse into the (n, 3d) matrix.
    const std::vector<float> vkq = quantized<T>(randn(n * 3 * d, 1.0f, 22));
    Dev<T> vkq_d = upload<T>(vkq);
    Dev<T> q = poisoned<T>(n * d), k = poisoned<T>(n * d), v = poisoned<T>(n * d);
    cuda::RopeJobs<T> fwd;
    fwd.add(vkq_d.p() + 2 * d, q.p(), true);
    fwd.add(vkq_d.p() + d, k.p(), true);
    fwd.add(vkq_d.p(), v.p(), false);
    cuda::rope(fwd, cuda::QkvLayout::kTokenMajor, 3 * d, cuda::QkvLayout::kHeadMajor, 0, B, seq, H,
               dh, table_d.p(), false, nullptr);
    std::vector<float> rq(n * d), rk(n * d), rv(n * d);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < d; ++c) {
        rv[i * d + c] = vkq[i * 3 * d + c];
        rk[i * d + c] = vkq[i * 3 * d + d + c];
        rq[i * d + c] = vkq[i * 3 * d + 2 * d + c];
      }
    cpu::rope_forward(rq.data(), n, seq, d, dh, 10000.0f);
    cpu::rope_forward(rk.data(), n, seq, d, dh, 10000.0f);
    CHECK(rel_err(download(q), to_head_major(rq, B, seq, H, dh)) < tol<T>());
    CHECK(rel_err(download(k), to_head_major(rk, B, seq, H, dh)) < tol<T>());
    CHECK(rel_err(download(v), to_head_major(rv, B, seq, H, dh)) == 0.0);

    Dev<T> back = poisoned<T>(n * 3 * d);
    cuda::RopeJobs<T> bwd;
    bwd.add(q.p(), back.p() + 2 * d, true);
    bwd.add(k.p(), back.p() + d, true);
    bwd.add(v.p(), back.p(), false);
    cuda::rope(bwd, cuda::QkvLayout::kHeadMajor, 0, cuda::QkvLayout::kTokenMajor, 3 * d, B, seq, H,
               dh, table_d.p(), true, nullptr);
    // The inverse rotation undoes the forward (up to rounding in bf16 or fp16).
    CHECK(rel_err(download(back), vkq) < (std::is_same_v<T, float> ? 1e-6 : tol<T>()));

    // The flash path's use: q and k rotated in place inside the (n, 3d) matrix, v untouched; the
    // inverse in place undoes it.
    Dev<T> inplace = upload<T>(vkq);
    cuda::RopeJobs<T> qk;
    qk.add(inplace.p() + 2 * d, inplace.p() + 2 * d, true);
    qk.add(inplace.p() + d, inplace.p() + d, true);
    cuda::rope(qk, cuda::QkvLayout::kTokenMajor, 3 * d, cuda::QkvLayout::kTokenMajor, 3 * d, B, seq,
               H, dh, table_d.p(), false, nullptr);
    std::vector<float> rvkq(vkq);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < d; ++c) {
        rvkq[i * 3 * d + d + c] = rk[i * d + c];
        rvkq[i * 3 * d + 2 * d + c] = rq[i * d + c];
      }
    const std::vector<float> rotated = download(inplace);
    CHECK(rel_err(rotated, rvkq) < tol<T>());
    bool v_kept = true;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < d; ++c) v_kept &= rotated[i * 3 * d + c] == vkq[i * 3 * d + c];
    CHECK(v_kept);
    cuda::rope(qk, cuda::QkvLayout::kTokenMajor, 3 * d, cuda::QkvLayout::kTokenMajor, 3 * d, B, seq,
               H, dh, table_d.p(), true, nullptr);
    CHECK(rel_err(download(inplace), vkq) < (std::is_same_v<T, float> ? 1e-6 : tol<T>()));

    // Plain layout changes round-trip exactly.
    Dev<T> hm = poisoned<T>(n * d), tm = poisoned<T>(n * d);
    cuda::heads_to_head_major(x_d.p(), hm.p(), B, seq, H, dh, nullptr);
    cuda::heads_to_token_major(hm.p(), tm.p(), B, seq, H, dh, nullptr);
    CHECK(download(hm) == to_head_major(x, B, seq, H, dh));
    CHECK(download(tm) == x);
  }
}

// ------------------------------------------------------------------------------------------------
// simple attention
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("simple attention forward and backward match the CPU", "[cuda]", float, bf16,
                   f16) {
  using T = TestType;
  const int64_t B = 2, H = 2;
  cuda::Matmul mm;
  for (int64_t seq : {int64_t{17}, int64_t{100}})
    for (int64_t dh : {int64_t{80}, int64_t{16}}) {
      INFO("seq " << seq << " head_dim " << dh);
      const int64_t d = H * dh, n = B * seq;
      const std::vector<float> q = quantized<T>(randn(n * d, 1.0f, 31));
      const std::vector<float> k = quantized<T>(randn(n * d, 1.0f, 32));
      const std::vector<float> v = quantized<T>(randn(n * d, 1.0f, 33));
      const std::vector<float> dout = quantized<T>(randn(n * d, 1.0f, 34));
      Dev<T> q_d = upload<T>(to_head_major(q, B, seq, H, dh));
      Dev<T> k_d = upload<T>(to_head_major(k, B, seq, H, dh));
      Dev<T> v_d = upload<T>(to_head_major(v, B, seq, H, dh));
      Dev<T> dout_d = upload<T>(dout);
      Dev<T> probs = poisoned<T>(B * H * seq * seq), out = poisoned<T>(n * d);
      Dev<T> hm_scratch = poisoned<T>(n * d);
      Dev<float> scores = poisoned<float>(B * H * seq * seq);
      cuda::attention_forward(mm, q_d.p(), k_d.p(), v_d.p(), probs.p(), out.p(), scores.p(),
                              hm_scratch.p(), B, seq, H, dh, false, nullptr);
      std::vector<float> out_ref(n * d), probs_ref(B * H * seq * seq);
      cpu::attention_forward(q.data(), k.data(), v.data(), out_ref.data(), probs_ref.data(), B, seq,
                             H, dh);
      CHECK(rel_err(download(out), out_ref) < tol<T>());
      CHECK(rel_err(download(probs), probs_ref) < tol<T>());

      Dev<T> dq = poisoned<T>(n * d), dk = poisoned<T>(n * d), dv = poisoned<T>(n * d);
      cuda::attention_backward(mm, q_d.p(), k_d.p(), v_d.p(), probs.p(), dout_d.p(), dq.p(), dk.p(),
                               dv.p(), scores.p(), hm_scratch.p(), B, seq, H, dh, false, nullptr);
      std::vector<float> dq_ref(n * d), dk_ref(n * d), dv_ref(n * d);
      cpu::attention_backward(q.data(), k.data(), v.data(), probs_ref.data(), dout.data(),
                              dq_ref.data(), dk_ref.data(), dv_ref.data(), B, seq, H, dh);
      CHECK(rel_err(to_token_major(download(dq), B, seq, H, dh), dq_ref) < tol<T>());
      CHECK(rel_err(to_token_major(download(dk), B, seq, H, dh), dk_ref) < tol<T>());
      CHECK(rel_err(to_token_major(download(dv), B, seq, H, dh), dv_ref) < tol<T>());
    }
}

// ------------------------------------------------------------------------------------------------
// SwiGLU, residual, casts
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("swiglu forward and in-place backward match the CPU", "[cuda]", float, bf16,
                   f16) {
  using T = TestType;
  const int64_t rows = 34;
  // 4096: a row longer than one block of 256 threads covers (bf16 and fp16: 512 packs of 8).
  for (int64_t f : {int64_t{512}, int64_t{100}, int64_t{7}, int64_t{4096}}) {
    INFO("d_ff " << f);
    // One (rows, 2f) matrix [b | a], as the fused w3/w1 matmul writes it.
    const std::vector<float> ba = quantized<T>(randn(rows * 2 * f, 2.0f, 41));
    std::vector<float> a(rows * f), b(rows * f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        b[r * f + c] = ba[r * 2 * f + c];
        a[r * f + c] = ba[r * 2 * f + f + c];
      }
    Dev<T> ba_d = upload<T>(ba);
    Dev<T> out = poisoned<T>(rows * f);
    cuda::swiglu_forward(ba_d.p() + f, ba_d.p(), 2 * f, out.p(), rows, f, nullptr);
    std::vector<float> ref(rows * f);
    cpu::swiglu_forward(a.data(), b.data(), ref.data(), rows * f);
    CHECK(rel_err(download(out), ref) < tol<T>());

    const std::vector<float> dout = quantized<T>(randn(rows * f, 1.0f, 42));
    Dev<T> dout_d = upload<T>(dout);
    cuda::swiglu_backward(ba_d.p() + f, ba_d.p(), 2 * f, dout_d.p(), ba_d.p() + f, ba_d.p(), 2 * f,
                          rows, f, nullptr);
    std::vector<float> da(rows * f), db(rows * f);
    cpu::swiglu_backward(a.data(), b.data(), dout.data(), da.data(), db.data(), rows * f);
    const std::vector<float> got = download(ba_d);
    std::vector<float> got_da(rows * f), got_db(rows * f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        got_db[r * f + c] = got[r * 2 * f + c];
        got_da[r * f + c] = got[r * 2 * f + f + c];
      }
    CHECK(rel_err(got_da, da) < tol<T>());
    CHECK(rel_err(got_db, db) < tol<T>());
  }
}

TEMPLATE_TEST_CASE("residual add and casts", "[cuda]", float, bf16, f16) {
  using T = TestType;
  for (int64_t n : {int64_t{1003}, int64_t{4096}}) {
    const std::vector<float> a = quantized<T>(randn(n, 1.0f, 51));
    const std::vector<float> b = quantized<T>(randn(n, 1.0f, 52));
    Dev<T> a_d = upload<T>(a), b_d = upload<T>(b);
    Dev<T> out = poisoned<T>(n);
    cuda::residual_forward(a_d.p(), b_d.p(), out.p(), n, nullptr);
    std::vector<float> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = stored<T>(a[i] + b[i]);
    CHECK(rel_err(download(out), ref) < 1e-7);
    // Misaligned start (one element in) takes the scalar path.
    Dev<T> out2 = poisoned<T>(n);
    cuda::residual_forward(a_d.p() + 1, b_d.p() + 1, out2.p() + 1, n - 1, nullptr);
    const std::vector<float> got = download(out2);
    CHECK(std::isnan(got[0]));
    CHECK(rel_err(std::vector<float>(got.begin() + 1, got.end()),
                  std::vector<float>(ref.begin() + 1, ref.end())) < 1e-7);
  }
  // Casts between fp32 and a 16-bit type: the activation type, bf16 in the fp32 instance.
  using H = std::conditional_t<std::is_same_v<T, float>, bf16, T>;
  const int64_t n = 1001;
  const std::vector<float> x = randn(n, 3.0f, 53);
  Dev<float> x_d = upload<float>(x);
  Dev<H> y = poisoned<H>(n);
  cuda::cast(x_d.p(), y.p(), n, nullptr);
  CHECK(download(y) == quantized<H>(x));
  Dev<float> z = poisoned<float>(n);
  cuda::cast(y.p(), z.p(), n, nullptr);
  CHECK(download(z) == quantized<H>(x));
}

// The copy-engine path's sum (--grad-transport ce): dst += src[0] + ... + src[k-1], left to
// right, bit for bit, for every number of peers; the misaligned start takes the scalar path.
TEST_CASE("peer sum adds its sources left to right", "[cuda]") {
  const int64_t n = 1027;
  const std::vector<float> dst = randn(n, 1.0f, 61);
  std::vector<std::vector<float>> src;
  std::vector<Dev<float>> src_d;
  for (int k = 0; k < cuda::kMaxAddSources; ++k) {
    src.push_back(randn(n, 1.0f, 62 + k));
    src_d.push_back(upload<float>(src.back()));
  }
  for (int count : {1, 3, cuda::kMaxAddSources})
    for (int64_t skip : {0, 1}) {
      Dev<float> d = upload<float>(dst);
      const float* ptr[cuda::kMaxAddSources];
      for (int k = 0; k < count; ++k) ptr[k] = src_d[k].p() + skip;
      cuda::add_f32(d.p() + skip, ptr, count, n - skip, nullptr);
      std::vector<float> ref = dst;
      for (int64_t i = skip; i < n; ++i)
        for (int k = 0; k < count; ++k) ref[i] += src[k][i];
      INFO(count << " sources, first element " << skip);
      CHECK(download(d) == ref);
    }
}

// ------------------------------------------------------------------------------------------------
// cross-entropy
// ------------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("fused softmax cross-entropy matches the CPU", "[cuda]", float, bf16, f16) {
  using T = TestType;
  const int64_t n = 34;
  for (int64_t V : {int64_t{37}, int64_t{10000}, int64_t{50257}}) {
    INFO("vocab " << V);
    const int64_t ld = align_up(V, 8);
    const std::vector<float> logits = quantized<T>(randn(n * ld, 2.0f, 61));
    const std::vector<int32_t> targets = random_ids(n, V, 62);
    std::vector<float> dense(n * V);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < V; ++c) dense[i * V + c] = logits[i * ld + c];
    std::vector<float> loss_ref(n), dl_ref(n * V);
    cpu::cross_entropy_forward(dense.data(), targets.data(), loss_ref.data(), n, V);
    const float scale = 0.37f;
    cpu::cross_entropy_backward(dense.data(), targets.data(), dl_ref.data(), n, V, scale);
    double sum_ref = 0;
    for (float l : loss_ref) sum_ref += l;

    IntDev t_d(targets);
    Dev<T> l_d = upload<T>(logits);
    Dev<float> losses = poisoned<float>(n);
    Dev<double> sum(1);  // zeroed
    Dev<unsigned> counter(1);
    // Forward only, twice: the sum accumulates, the counter resets.
    for (int rep = 0; rep < 2; ++rep)
      cuda::cross_entropy_forward(l_d.p(), ld, t_d.p(), losses.p(), sum.p(), counter.p(), n, V,
                                  nullptr);
    CHECK(rel_err(download(losses), loss_ref) < (std::is_same_v<T, float> ? 1e-6 : 1e-5));
    double got_sum = 0;
    CUDA_CHECK(cudaMemcpy(&got_sum, sum.p(), sizeof(double), cudaMemcpyDeviceToHost));
    CHECK_THAT(got_sum, WithinRel(2 * sum_ref, 1e-6));
    CHECK(download(l_d) == logits);  // forward-only leaves the logits alone

    Dev<float> losses2 = poisoned<float>(n);
    cuda::cross_entropy_forward_backward(l_d.p(), ld, t_d.p(), losses2.p(), nullptr, nullptr, n, V,
                                         scale, nullptr);
    CHECK(rel_err(download(losses2), loss_ref) < (std::is_same_v<T, float> ? 1e-6 : 1e-5));
    const std::vector<float> got = download(l_d);
    std::vector<float> got_dense(n * V);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < V; ++c) got_dense[i * V + c] = got[i * ld + c];
      for (int64_t c = V; c < ld; ++c) CHECK(got[i * ld + c] == logits[i * ld + c]);  // padding
    }
    CHECK(rel_err(got_dense, dl_ref) < tol<T>());
  }
}

#endif  // TRAINER_WITH_CUDA
