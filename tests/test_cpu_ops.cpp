// The CPU reference layers on small cases whose answers are derived by hand (or with the python3
// one-liners quoted next to them), gemm against a naive triple loop, and linear_backward against
// finite differences.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/cpu/ops.h"
#include "model/embedding_buckets.h"
#include "tests/catch.h"

using namespace trainer::cpu;

namespace {

std::vector<double> random_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = u(g);
  return v;
}

void check_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK_THAT(got[i], WithinAbs(want[i], tol));
  }
}

// Central difference of f with respect to every element of x.
std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& f) {
  const double h = 1e-6;
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f();
    x[i] = x0 - h;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

TEST_CASE("rmsnorm forward and backward on a hand case") {
  // Row 0: mean(x^2) = (1+4+9+16)/4 = 7.5, r = 1/sqrt(7.5 + 1e-5).
  // Row 1: mean(x^2) = (4+0+0+4)/4 = 2,    r = 1/sqrt(2 + 1e-5).
  const std::vector<double> x = {1, 2, 3, 4, -2, 0, 0, 2};
  const std::vector<double> w = {1, 0.5, 2, -1};
  const double r0 = 1 / std::sqrt(7.5 + 1e-5), r1 = 1 / std::sqrt(2 + 1e-5);
  std::vector<double> y(8), rstd(2);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), 2, 4, 1e-5);
  CHECK_THAT(rstd[0], WithinRel(r0, 1e-14));
  CHECK_THAT(rstd[1], WithinRel(r1, 1e-14));
  check_all(y, {r0, r0, 6 * r0, -4 * r0, -2 * r1, 0, 0, -2 * r1}, 1e-14);

  // python3: finite differences of sum(dy * y) (and the closed form) give
  //   dx row 0 = [0.26777518044, -0.01217183148, 0.43817741308, -0.38949179119]
  //   dx row 1 = [0.17677890499, 0.35355250671, -1.41421002685, 0.17677360173]
  //   dw       = [-1.23163596273, -0.73029625648, 0.27386109618, 3.62829003933]
  const std::vector<double> dy = {0.5, -1, 0.25, 2, 1, 1, -1, 0.5};
  std::vector<double> dx(8, 1.0), dw(4, 1.0);  // start at 1: backward accumulates
  rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), 2, 4);
  check_all(dx,
            {1 + 0.2677751804397896, 1 - 0.012171831477580412, 1 + 0.43817741308126235,
             1 - 0.3894917911932672, 1 + 0.17677890498709803, 1 + 0.35355250671311184,
             1 - 1.4142100268524473, 1 + 0.1767736017260138},
            1e-12);
  check_all(dw,
            {1 - 1.2316359627333942, 1 - 0.7302962564762128, 1 + 0.2738610961785798,
             1 + 3.6282900393310746},
            1e-12);
}

TEST_CASE("rope rotates interleaved pairs by pos * theta^(-2j/dh)") {
  // One head of dh = 4, two positions. Position 0 is the identity. At position 1 pair 0 turns by
  // 1 rad and pair 1 by 10000^(-2/4) = 0.01 rad: (1, 0) -> (cos 1, sin 1), (0, 1) -> (-sin .01,
  // cos .01).
  std::vector<double> x = {1, 2, 3, 4, 1, 0, 0, 1};
  rope_forward(x.data(), 2, 2, 4, 4, 10000.0);
  check_all(x, {1, 2, 3, 4, std::cos(1.0), std::sin(1.0), -std::sin(0.01), std::cos(0.01)}, 1e-15);
  // Two heads of dh = 2, positions 0..2 (rows 3.. wrap to position 0 again: n = 4, seq = 3).
  // Each head's only pair turns by pos rad.
  std::vector<double> y = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 2, 3, 4, 5};
  rope_forward(y.data(), 4, 3, 4, 2, 10000.0);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(2.0), s2 = std::sin(2.0);
  check_all(y, {1, 0, 0, 1, c1, s1, -s1, c1, c2, s2, -s2, c2, 2, 3, 4, 5}, 1e-15);
  // Backward is the transpose of the rotation: <R x, g> = <x, R^T g>.
  const auto x0 = random_vec(16, 1), g = random_vec(16, 2);
  auto rx = x0, rtg = g;
  rope_forward(rx.data(), 4, 3, 4, 2, 10000.0);
  rope_backward(rtg.data(), 4, 3, 4, 2, 10000.0);
  CHECK_THAT(dot(rx, g), WithinAbs(dot(x0, rtg), 1e-14));
}

TEST_CASE("causal attention on a 2-token hand case") {
  // B = 1, T = 2, one head of dh = 2, scale 1/sqrt(2).
  // Query 0 sees key 0 only: P[0] = [1, 0], out0 = v0.
  // q1 = (sqrt(2) ln 2, 0), k0 = (1, 0), k1 = (0, 2): S[1] = (ln 2, 0), P[1] = (2/3, 1/3),
  // out1 = 2/3 (3, 0) + 1/3 (0, 3) = (2, 1).
  const double ln2 = std::log(2.0), rt2 = std::sqrt(2.0);
  const std::vector<double> q = {5, -7, rt2 * ln2, 0}, k = {1, 0, 0, 2}, v = {3, 0, 0, 3};
  std::vector<double> out(4), probs(4);
  attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), 1, 2, 1, 2);
  check_all(probs, {1, 0, 2.0 / 3, 1.0 / 3}, 1e-15);
  check_all(out, {3, 0, 2, 1}, 1e-14);

  // dout = [[0, 0], [1, 0]]:  dv = P^T dout: dv0 = (2/3, 0), dv1 = (1/3, 0).
  // dP[1] = (dout1.v0, dout1.v1) = (3, 0); rowsum(P dP) = 2; dS[1] = P (dP - 2) = (2/3, -2/3).
  // dq1 = (2/3 k0 - 2/3 k1)/sqrt2 = (2/3, -4/3)/sqrt2; dk0 = 2/3 q1/sqrt2 = (2/3 ln2, 0),
  // dk1 = (-2/3 ln2, 0); row 0 has dout 0 and dS 0, so dq0 = 0.
  const std::vector<double> dout = {0, 0, 1, 0};
  std::vector<double> dq(4, 9), dk(4, 9), dv(4, 9);  // garbage: backward overwrites
  attention_backward(q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(),
                     dv.data(), 1, 2, 1, 2);
  check_all(dv, {2.0 / 3, 0, 1.0 / 3, 0}, 1e-15);
  check_all(dq, {0, 0, 2.0 / 3 / rt2, -4.0 / 3 / rt2}, 1e-14);
  check_all(dk, {2.0 / 3 * ln2, 0, -2.0 / 3 * ln2, 0}, 1e-14);
}

TEST_CASE("attention backward matches finite differences with batches and heads") {
  const int64_t B = 2, T = 3, H = 2, dh = 4, n = B * T * H * dh;
  auto q = random_vec(n, 3), k = random_vec(n, 4), v = random_vec(n, 5);
  const auto g = random_vec(n, 6);
  std::vector<double> out(n), probs(B * H * T * T);
  auto loss = [&] {
    attention_forward(q.data(), k.data(), v.data(), out.data(), probs.data(), B, T, H, dh);
    return dot(out, g);
  };
  loss();
  // Causality of the saved probabilities: zero above the diagonal, rows sum to 1.
  for (int64_t r = 0; r < B * H * T; ++r) {
    const int64_t i = r % T;
    double s = 0;
    for (int64_t j = 0; j < T; ++j) {
      if (j > i) CHECK(probs[r * T + j] == 0.0);
      s += probs[r * T + j];
    }
    CHECK_THAT(s, WithinAbs(1.0, 1e-15));
  }
  std::vector<double> dq(n), dk(n), dv(n);
  attention_backward(q.data(), k.data(), v.data(), probs.data(), g.data(), dq.data(), dk.data(),
                     dv.data(), B, T, H, dh);
  check_all(dq, numeric_grad(q, loss), 1e-8);
  check_all(dk, numeric_grad(k, loss), 1e-8);
  check_all(dv, numeric_grad(v, loss), 1e-8);
}

TEST_CASE("swiglu on hand values") {
  // a = 0: silu = 0, silu' = 1/2.  a = ln 3: sigmoid = 3/4, silu = 0.75 ln 3 = 0.82395921650,
  // silu' = 0.75 (1 + ln3 / 4) = 0.95598980413.  a = -ln 3: sigmoid = 1/4, silu = -ln3/4,
  // silu' = 0.25 (1 - ln3 * 3/4).
  const double l3 = std::log(3.0);
  const std::vector<double> a = {0, l3, -l3}, b = {2, -1, 4}, dout = {3, 2, 0.5};
  std::vector<double> out(3), da(3), db(3);
  swiglu_forward(a.data(), b.data(), out.data(), 3);
  check_all(out, {0, -0.75 * l3, -l3}, 1e-15);
  swiglu_backward(a.data(), b.data(), dout.data(), da.data(), db.data(), 3);
  check_all(da, {3 * 2 * 0.5, 2 * -1 * 0.75 * (1 + l3 / 4), 0.5 * 4 * 0.25 * (1 - l3 * 0.75)},
            1e-15);
  check_all(db, {0, 2 * 0.75 * l3, 0.5 * -0.25 * l3}, 1e-15);
}

TEST_CASE("cross-entropy on hand values, stable for large logits") {
  // Row 0: logits ln(1..4) -> softmax (1, 2, 3, 4)/10; target 2: loss = ln 10 - ln 3 = ln(10/3).
  // Row 1: (1000, 1000, 1000, 1000) target 0: loss = ln 4 (no overflow).
  const std::vector<double> logits = {0,    std::log(2.0), std::log(3.0), std::log(4.0),
                                      1000, 1000,          1000,          1000};
  const std::vector<int32_t> t = {2, 0};
  std::vector<double> loss(2);
  cross_entropy_forward(logits.data(), t.data(), loss.data(), 2, 4);
  CHECK_THAT(loss[0], WithinAbs(std::log(10.0 / 3.0), 1e-14));
  CHECK_THAT(loss[1], WithinAbs(std::log(4.0), 1e-12));
  std::vector<double> d(8);
  cross_entropy_backward(logits.data(), t.data(), d.data(), 2, 4, 0.5);
  check_all(d, {0.05, 0.1, -0.35, 0.2, 0.5 * -0.75, 0.125, 0.125, 0.125}, 1e-14);
  // In place (dlogits aliasing logits) gives the same.
  auto inplace = logits;
  cross_entropy_backward(inplace.data(), t.data(), inplace.data(), 2, 4, 0.5);
  check_all(inplace, d, 0);
  // float too.
  std::vector<float> lf(logits.begin(), logits.end()), lossf(2);
  cross_entropy_forward(lf.data(), t.data(), lossf.data(), 2, 4);
  CHECK_THAT(lossf[0], WithinRel(static_cast<float>(std::log(10.0 / 3.0)), 1e-6f));
  CHECK_THAT(lossf[1], WithinRel(static_cast<float>(std::log(4.0)), 1e-6f));
}

TEST_CASE("embedding gathers rows and scatters gradients, adding repeats") {
  const std::vector<double> table = {1, 2, 3, 4, 5, 6};  // 3 rows of d = 2
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<double> out(6);
  embedding_forward(ids.data(), table.data(), out.data(), 3, 2);
  check_all(out, {5, 6, 1, 2, 5, 6}, 0);
  std::vector<double> dtable(6, 1.0);
  const std::vector<double> dout = {1, 2, 3, 4, 5, 6};
  embedding_backward(ids.data(), dout.data(), dtable.data(), 3, 2);
  check_all(dtable, {1 + 3, 1 + 4, 1, 1, 1 + 1 + 5, 1 + 2 + 6}, 0);
}

TEMPLATE_TEST_CASE("gemm matches a naive triple loop in every transpose mode", "", float, double) {
  using T = TestType;
  struct Case {
    int64_t M, N, K;
  };
  // Awkward sizes, and sizes crossing the tile edges (96 rows, 256 columns, 256 deep).
  const Case cases[] = {{37, 53, 19}, {1, 1, 1}, {5, 3, 300}, {200, 300, 270}, {97, 17, 513}};
  const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-12;
  for (const Case& c : cases) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool ta = mode & 1, tb = mode & 2;
      // Stored shapes with padded row strides, to exercise lda/ldb/ldc.
      const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K;
      const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N;
      const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = c.N + 2;
      const auto a = random_vec(a_rows * lda, 10 + mode), b = random_vec(b_rows * ldb, 20 + mode);
      const auto c0 = random_vec(c.M * ldc, 30 + mode);
      std::vector<T> A(a.begin(), a.end()), Bm(b.begin(), b.end()), C(c0.begin(), c0.end());
      const T alpha = T(0.75), beta = T(-0.5);
      gemm<T>(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
      double max_err = 0;
      for (int64_t i = 0; i < c.M; ++i) {
        for (int64_t j = 0; j < c.N; ++j) {
          double s = 0;
          for (int64_t p = 0; p < c.K; ++p) {
            const double av = ta ? A[p * lda + i] : A[i * lda + p];
            const double bv = tb ? Bm[j * ldb + p] : Bm[p * ldb + j];
            s += av * bv;
          }
          const double want = double(alpha) * s + double(beta) * double(T(c0[i * ldc + j]));
          max_err = std::max(max_err, std::abs(double(C[i * ldc + j]) - want));
        }
        // Padding columns of C are untouched.
        for (int64_t j = c.N; j < ldc; ++j) REQUIRE(C[i * ldc + j] == T(c0[i * ldc + j]));
      }
      INFO("M " << c.M << " N " << c.N << " K " << c.K << " trans_a " << ta << " trans_b " << tb);
      CHECK(max_err < tol * std::sqrt(double(c.K)));
    }
  }
}

TEST_CASE("gemm with beta = 0 ignores NaN in C") {
  const std::vector<double> A = {1, 2, 3, 4}, B = {1, 0, 0, 1};
  std::vector<double> C(4, std::nan(""));
  gemm<double>(false, false, 2, 2, 2, 1.0, A.data(), 2, B.data(), 2, 0.0, C.data(), 2);
  check_all(C, {1, 2, 3, 4}, 0);
}

TEST_CASE("linear forward and backward match finite differences") {
  const int64_t n = 5, d_in = 7, d_out = 3;
  auto x = random_vec(n * d_in, 40), W = random_vec(d_out * d_in, 41);
  const auto g = random_vec(n * d_out, 42);
  std::vector<double> y(n * d_out);
  auto loss = [&] {
    linear_forward(x.data(), W.data(), y.data(), n, d_in, d_out);
    return dot(y, g);
  };
  loss();
  // y[0][0] = x[0] . W[0] by hand.
  double y00 = 0;
  for (int64_t c = 0; c < d_in; ++c) y00 += x[c] * W[c];
  CHECK_THAT(y[0], WithinAbs(y00, 1e-14));
  std::vector<double> dx(n * d_in, 5.0), dW(d_out * d_in, 0.25);  // dx overwritten, dW += ...
  linear_backward(x.data(), W.data(), g.data(), dx.data(), dW.data(), n, d_in, d_out);
  check_all(dx, numeric_grad(x, loss), 1e-8);
  auto num_dW = numeric_grad(W, loss);
  for (double& v : num_dW) v += 0.25;
  check_all(dW, num_dW, 1e-8);
  // dx == nullptr only accumulates dW.
  std::vector<double> dW2(d_out * d_in, 0.0);
  linear_backward(x.data(), W.data(), g.data(), static_cast<double*>(nullptr), dW2.data(), n, d_in,
                  d_out);
  for (double& v : dW2) v += 0.25;
  check_all(dW2, dW, 1e-14);
}

TEST_CASE("float layers agree with double across the range of exp") {
  // The float paths use their own vectorised exp; compare with the double paths (std::exp) on
  // rows long enough to use full vectors and a tail (V = 1003), logits spread over +-60 (and one
  // row of extremes), gate inputs over +-100 (sigmoid saturates both ways).
  const int64_t n = 4, V = 1003;
  auto ld = random_vec(n * V, 50);
  for (int64_t i = 0; i < n * V; ++i) ld[i] *= i < 3 * V ? 60.0 : 1000.0;
  const std::vector<int32_t> t = {0, 500, 1002, 7};
  std::vector<float> lf(ld.begin(), ld.end());
  std::vector<double> lossd(n), dd(n * V), ldr(lf.begin(), lf.end());  // same inputs as float
  std::vector<float> lossf(n), df(n * V);
  cross_entropy_forward(ldr.data(), t.data(), lossd.data(), n, V);
  cross_entropy_forward(lf.data(), t.data(), lossf.data(), n, V);
  cross_entropy_backward(ldr.data(), t.data(), dd.data(), n, V, 1.0);
  cross_entropy_backward(lf.data(), t.data(), df.data(), n, V, 1.0f);
  for (int64_t i = 0; i < n; ++i) CHECK_THAT(lossf[i], WithinAbs(lossd[i], 1e-6 * (1 + lossd[i])));
  // Float itself limits the softmax: x - max rounds to ~6e-8 |x - max|, which exp turns into a
  // relative error of that size; so the tolerance grows with the distance from the row max.
  for (int64_t r = 0; r < n; ++r) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, ldr[r * V + j]);
    for (int64_t j = 0; j < V; ++j) {
      const int64_t i = r * V + j;
      INFO("dlogit " << i << " = " << dd[i] << " float " << df[i]);
      const double tol = 1.2e-7 * (8 + (m - ldr[i])) * std::abs(dd[i]) + 1e-37;
      CHECK_THAT(double(df[i]), WithinAbs(dd[i], tol));
    }
  }

  const auto ad = random_vec(3000, 51), bd = random_vec(3000, 52), gd = random_vec(3000, 53);
  std::vector<double> a(3000);
  for (int i = 0; i < 3000; ++i) a[i] = double(float(100 * ad[i]));
  std::vector<float> af(a.begin(), a.end()), bf(bd.begin(), bd.end()), gf(gd.begin(), gd.end());
  std::vector<double> b(bf.begin(), bf.end()), g(gf.begin(), gf.end());
  std::vector<double> od(3000), dad(3000), dbd(3000);
  std::vector<float> of(3000), daf(3000), dbf(3000);
  swiglu_forward(a.data(), b.data(), od.data(), 3000);
  swiglu_forward(af.data(), bf.data(), of.data(), 3000);
  swiglu_backward(a.data(), b.data(), g.data(), dad.data(), dbd.data(), 3000);
  swiglu_backward(af.data(), bf.data(), gf.data(), daf.data(), dbf.data(), 3000);
  for (int i = 0; i < 3000; ++i) {
    INFO("gate " << i << " a = " << a[i]);
    CHECK_THAT(double(of[i]), WithinAbs(od[i], 1e-6 * std::abs(od[i]) + 1e-30));
    CHECK_THAT(double(daf[i]), WithinAbs(dad[i], 1e-6 * std::abs(dad[i]) + 1e-30));
    CHECK_THAT(double(dbf[i]), WithinAbs(dbd[i], 1e-6 * std::abs(dbd[i]) + 1e-30));
  }
}

TEST_CASE("embedding buckets: ids ascending, positions ascending within each id", "[cpu]") {
  std::vector<int32_t> scratch;
  std::mt19937 rng(71);
  for (int32_t vocab : {1, 7, 10000, 50257})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{33}, int64_t{4096}}) {
      INFO("vocab " << vocab << " n " << n);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      std::vector<int32_t> ids(n);
      for (int32_t& v : ids) v = pick(rng);
      std::vector<int32_t> b_ids(n), b_start(n + 1), b_pos(n);
      const int64_t groups = trainer::build_embedding_buckets(ids.data(), n, scratch, b_ids.data(),
                                                              b_start.data(), b_pos.data());
      // The reference: (id, position) pairs sorted, then split where the id changes.
      std::vector<std::pair<int32_t, int32_t>> ref;
      for (int64_t i = 0; i < n; ++i) ref.push_back({ids[i], static_cast<int32_t>(i)});
      std::sort(ref.begin(), ref.end());
      std::vector<int32_t> ref_ids, ref_start;
      for (int64_t i = 0; i < n; ++i)
        if (i == 0 || ref[i].first != ref[i - 1].first) {
          ref_ids.push_back(ref[i].first);
          ref_start.push_back(static_cast<int32_t>(i));
        }
      REQUIRE(groups == static_cast<int64_t>(ref_ids.size()));
      CHECK(std::vector<int32_t>(b_ids.begin(), b_ids.begin() + groups) == ref_ids);
      CHECK(std::vector<int32_t>(b_start.begin(), b_start.begin() + groups) == ref_start);
      CHECK(b_start[groups] == n);
      for (int64_t i = 0; i < n; ++i) CHECK(b_pos[i] == ref[i].second);
    }
  const int32_t bad[] = {3, -1};
  std::vector<int32_t> o(2), st(3), pos(2);
  CHECK_THROWS_WITH(
      trainer::build_embedding_buckets(bad, 2, scratch, o.data(), st.data(), pos.data()),
      ContainsSubstring("negative token id -1 at position 1"));
}
