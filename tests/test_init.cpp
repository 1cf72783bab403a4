// init_params: the distributions of SPEC.md, deterministic in the seed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "model/config.h"
#include "model/init.h"
#include "model/layout.h"
#include "tests/catch.h"

using namespace trainer;

namespace {

// Standard deviation of a standard normal truncated to [-3, 3]:
// sqrt(1 - 2*3*phi(3) / (Phi(3) - Phi(-3))), python3: 0.98658...
double truncated_std() {
  const double phi3 = std::exp(-4.5) / std::sqrt(2 * std::numbers::pi);
  const double mass = std::erf(3 / std::sqrt(2.0));
  return std::sqrt(1 - 6 * phi3 / mass);
}

struct Stats {
  double mean = 0, std = 0, max_abs = 0;
};

Stats stats(const float* x, int64_t n) {
  Stats s;
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sq += double(x[i]) * x[i];
    s.max_abs = std::max(s.max_abs, std::abs(double(x[i])));
  }
  s.mean = sum / n;
  s.std = std::sqrt(sq / n - s.mean * s.mean);
  return s;
}

}  // namespace

TEST_CASE("init follows SPEC.md: truncated normals, unit gains, zero padding") {
  ModelConfig c = preset("tiny");  // vocab 10000, d 128, d_ff 512
  const ParamLayout L(c);
  std::vector<float> p(L.total(), 42.0f);  // garbage that init must overwrite
  init_params(L, 2024, p.data());
  const double tstd = truncated_std();
  CHECK_THAT(tstd, WithinAbs(0.98658, 1e-5));

  std::vector<bool> used(L.total(), false);
  for (const auto& t : L.tensors()) {
    INFO(t.name);
    for (int64_t e = 0; e < t.numel; ++e) used[t.offset + e] = true;
    const float* x = p.data() + t.offset;
    if (t.shape.size() == 1) {
      for (int64_t e = 0; e < t.numel; ++e) REQUIRE(x[e] == 1.0f);
      continue;
    }
    const double target = t.name == "token_embeddings.weight"
                              ? 1.0
                              : std::sqrt(2.0 / double(t.shape[0] + t.shape[1]));
    const Stats s = stats(x, t.numel);
    CHECK(s.max_abs <= 3 * target * (1 + 1e-6));  // nothing beyond 3 std
    CHECK(s.max_abs > 2.5 * target);              // but the tails are there
    // The sample std is within 5 standard errors of the truncated normal's exact std (the
    // standard error of a sample std is std * sqrt((kurtosis - 1) / (4 n)), kurtosis 2.68 /
    // tstd^4).
    const double kurt = 2.680043 / std::pow(tstd, 4);
    const double se = std::sqrt((kurt - 1) / (4.0 * double(t.numel)));
    CHECK(std::abs(s.std / (target * tstd) - 1) < 5 * se);
    // On the big tensors (embedding, lm_head) also within 2% of the nominal std (the truncated
    // normal's is 1.3% below it).
    if (t.numel >= (1 << 20)) CHECK(std::abs(s.std / target - 1) < 0.02);
    CHECK(std::abs(s.mean) < 5 * target / std::sqrt(double(t.numel)));
  }
  for (int64_t i = 0; i < L.total(); ++i)
    if (!used[i]) REQUIRE(p[i] == 0.0f);
}

TEST_CASE("init is a pure function of the seed") {
  ModelConfig c = preset("tiny");
  c.vocab = 300;
  const ParamLayout L(c);
  std::vector<float> a(L.total()), b(L.total()), d(L.total());
  init_params(L, 5, a.data());
  init_params(L, 5, b.data());
  init_params(L, 6, d.data());
  REQUIRE(a == b);
  int64_t differ = 0, weights = 0;
  for (const auto& t : L.tensors()) {
    if (t.shape.size() == 1) continue;
    for (int64_t e = 0; e < t.numel; ++e) {
      ++weights;
      differ += a[t.offset + e] != d[t.offset + e];
    }
  }
  CHECK(differ > weights * 99 / 100);
  // Tensors of equal shape get different values (the tensor index is part of the counter).
  const auto& q0 = L.find("layers.0.attn.q_proj.weight");
  const auto& k0 = L.find("layers.0.attn.k_proj.weight");
  CHECK(a[q0.offset] != a[k0.offset]);
  // A known value, so a change of generator is noticed: element 0 of SPEC tensor 0 (the
  // embedding, std 1) for seed 5 is truncated_normal(5, 0, 0).
  CHECK(a[L.find("token_embeddings.weight").offset] == float(truncated_normal(5, 0, 0)));
}

TEST_CASE("truncated_normal draws are standard normal within [-3, 3]") {
  const int n = 400000;
  double sum = 0, sq = 0, fourth = 0, max_abs = 0;
  int64_t beyond1 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = truncated_normal(77, 3, i);
    sum += z;
    sq += z * z;
    fourth += z * z * z * z;
    max_abs = std::max(max_abs, std::abs(z));
    beyond1 += std::abs(z) > 1;
  }
  CHECK(max_abs <= 3.0);
  CHECK(std::abs(sum / n) < 0.01);
  CHECK_THAT(std::sqrt(sq / n), WithinAbs(truncated_std(), 0.005));
  // P(|z| > 1 | |z| <= 3) = (erfc(1/sqrt2) - erfc(3/sqrt2)) / erf(3/sqrt2) = 0.315462
  CHECK_THAT(double(beyond1) / n, WithinAbs(0.315462, 0.003));
  // Fourth moment of the truncated normal (python3, midpoint integration of z^4 phi(z) over
  // [-3, 3] divided by erf(3/sqrt2)): 2.680043
  CHECK_THAT(fourth / n, WithinAbs(2.680043, 0.04));
}
