// CPU tests of optim/: AdamW against values computed by hand in double, AdamW over bf16 gradient
// terms, the LR schedule, the clipping scale, sum_squares, the bf16 and fp16 casts and the loss
// scaler.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/device_buffer.h"
#include "core/f16.h"
#include "optim/adamw.h"
#include "optim/cuda/adamw.cuh"
#include "optim/loss_scaler.h"
#include "optim/schedule.h"
#include "tests/catch.h"

using namespace trainer;

namespace {

BufferView cpu_view(std::vector<float>& v) {
  return BufferView{v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

std::vector<float> to_vector(BufferView v) {
  const float* p = v.as<const float>();
  return std::vector<float>(p, p + v.count);
}

}  // namespace

// Reference (python3, double), with b1=0.9, b2=0.95, eps=1e-8, wd=0.1, for t = 1, 2, 3:
//   p = p*(1 - lr*wd); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2
//   p = p - (lr/(1 - b1^t)) * m / (sqrt(v)/sqrt(1 - b2^t) + eps)
// p0 = [1, -0.5, 2, 0.25, 0], lr = 0.1, 0.05, 0.02 at t = 1, 2, 3, gradients (exact in fp32)
//   t=1: [0.125, -0.25, 0, 2^-30, 3]; t=2: [-0.375, 0.0625, 0.5, 2^-30, -1];
//   t=3: [0.25, 0.25, -0.25, -2^-29, 0.5].
// Element 2 has no gradient at t=1 (pure decay), element 3's gradients are so small that eps
// matters, element 4 starts at 0 (no decay, only the update).
TEST_CASE("AdamW matches torch.optim.AdamW computed by hand for 3 steps") {
  AdamWConfig cfg;  // defaults: betas (0.9, 0.95), eps 1e-8, wd 0.1
  AdamW opt(DeviceKind::kCpu, 5, cfg);
  REQUIRE(opt.state_bytes() == 60);
  const std::vector<float> p0 = {1.0f, -0.5f, 2.0f, 0.25f, 0.0f};
  std::memcpy(opt.master().data, p0.data(), 5 * sizeof(float));

  const float tiny = std::ldexp(1.0f, -30);
  const std::vector<std::vector<float>> grads = {{0.125f, -0.25f, 0.0f, tiny, 3.0f},
                                                 {-0.375f, 0.0625f, 0.5f, tiny, -1.0f},
                                                 {0.25f, 0.25f, -0.25f, -2 * tiny, 0.5f}};
  const double lrs[3] = {0.1, 0.05, 0.02};
  const std::vector<std::vector<double>> want_p = {
      {0.89000000799999934, -0.39500000399999979, 1.98, 0.2389802388433932, -0.099999999666666672},
      {0.91001479547092123, -0.3692867088125984, 1.9333520009111342, 0.23352545707087283,
       -0.11971533466899439},
      {0.90782094401473834, -0.37224119179814358, 1.9249339191155852, 0.23323426951707718,
       -0.12776301909991844}};
  const std::vector<double> want_m = {0.0013749999999999978, 0.010374999999999997,
                                      0.019999999999999997, -2.7008354663848875e-11,
                                      0.20299999999999999};
  const std::vector<double> want_v = {0.010509765625000009, 0.0061308593750000057,
                                      0.015000000000000013, 2.538117285788568e-19,
                                      0.4661250000000004};

  std::vector<float> out(5, -7.0f);
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g = grads[t - 1];
    opt.step(cpu_view(g), cpu_view(out), lrs[t - 1], t, 1.0f);
    const std::vector<float> master = to_vector(opt.master());
    for (int i = 0; i < 5; ++i) {
      INFO("t=" << t << " element " << i);
      CHECK_THAT(master[i], WithinAbs(want_p[t - 1][i], 1e-6));
      CHECK(out[i] == master[i]);  // fp32 params_out is the master, bit for bit
    }
  }
  const std::vector<float> m = to_vector(opt.exp_avg());
  const std::vector<float> v = to_vector(opt.exp_avg_sq());
  for (int i = 0; i < 5; ++i) {
    INFO("element " << i);
    CHECK_THAT(m[i], WithinRel(want_m[i], 1e-5));
    CHECK_THAT(v[i], WithinRel(want_v[i], 1e-5));
  }
}

// --adam-state bf16: the same fp32 arithmetic per step, with m and v rounded to bf16 (nearest
// even) as they are stored, so the next step starts from the rounded moments.
TEST_CASE("AdamW with bf16 moments: fp32 math, m and v stored rounded") {
  const int64_t n = 1003;
  AdamWConfig cfg;
  cfg.moments = DType::kBF16;
  AdamW opt(DeviceKind::kCpu, n, cfg), wide(DeviceKind::kCpu, n, AdamWConfig{});
  REQUIRE(opt.state_bytes() == 8 * n);
  REQUIRE(opt.exp_avg().dtype == DType::kBF16);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), out(n), out_wide(n);
  for (int64_t i = 0; i < n; ++i) p[i] = std::sin(0.37f * static_cast<float>(i));
  std::memcpy(opt.master().data, p.data(), n * sizeof(float));
  std::memcpy(wide.master().data, p.data(), n * sizeof(float));
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = 0.01f * std::cos(0.11f * static_cast<float>(i * t));
    const double lr = 1e-2 / t;
    opt.step(cpu_view(g), cpu_view(out), lr, t, 0.5f);
    wide.step(cpu_view(g), cpu_view(out_wide), lr, t, 0.5f);
    const AdamWStepArgs a = opt.step_args(lr, t, 0.5f);
    for (int64_t i = 0; i < n; ++i) {
      adamw_update(p[i], m[i], v[i], g[i], a);
      m[i] = bf16_bits_to_f32(f32_to_bf16_bits(m[i]));
      v[i] = bf16_bits_to_f32(f32_to_bf16_bits(v[i]));
    }
  }
  CHECK(to_vector(opt.master()) == p);
  CHECK(out == p);
  std::vector<float> got_m(n), got_v(n);
  copy_to_f32(got_m.data(), opt.exp_avg());
  copy_to_f32(got_v.data(), opt.exp_avg_sq());
  CHECK(got_m == m);
  CHECK(got_v == v);
  // Not the fp32 moments' result (the rounding does change the update), but close to it.
  CHECK(out != out_wide);
  for (int64_t i = 0; i < n; ++i) CHECK_THAT(out[i], WithinAbs(out_wide[i], 1e-3));
}

TEST_CASE("AdamW grad_scale multiplies the gradients before the update") {
  const std::vector<float> p0 = {0.5f, -1.5f, 0.75f, 3.0f};
  std::vector<float> g = {0.3f, -0.7f, 1e-3f, 2.5f};
  const float scale = 0.37f;
  std::vector<float> g_scaled(g.size());
  for (size_t i = 0; i < g.size(); ++i) g_scaled[i] = g[i] * scale;

  AdamW a(DeviceKind::kCpu, 4, {}), b(DeviceKind::kCpu, 4, {}), c(DeviceKind::kCpu, 4, {});
  for (AdamW* o : {&a, &b, &c}) std::memcpy(o->master().data, p0.data(), 16);
  std::vector<float> out(4);
  for (int t = 1; t <= 2; ++t) {
    a.step(cpu_view(g), cpu_view(out), 1e-2, t, scale);
    b.step(cpu_view(g_scaled), cpu_view(out), 1e-2, t, 1.0f);
    c.step(cpu_view(g), cpu_view(out), 1e-2, t, 1.0f);
  }
  // Scaling inside the step is the same fp32 multiply as scaling beforehand: bit-identical state.
  REQUIRE(to_vector(a.master()) == to_vector(b.master()));
  REQUIRE(to_vector(a.exp_avg()) == to_vector(b.exp_avg()));
  REQUIRE(to_vector(a.exp_avg_sq()) == to_vector(b.exp_avg_sq()));
  // And the scale does change the moments: m and v scale by s and s^2 exactly in exact math.
  const std::vector<float> ma = to_vector(a.exp_avg()), mc = to_vector(c.exp_avg());
  const std::vector<float> va = to_vector(a.exp_avg_sq()), vc = to_vector(c.exp_avg_sq());
  for (int i = 0; i < 4; ++i) {
    CHECK_THAT(ma[i], WithinRel(static_cast<double>(mc[i]) * scale, 1e-5));
    CHECK_THAT(va[i], WithinRel(static_cast<double>(vc[i]) * scale * scale, 1e-5));
  }
}

TEST_CASE("AdamW writes bf16 parameters rounded from the master, and may update in place") {
  AdamW opt(DeviceKind::kCpu, 3, {});
  const std::vector<float> p0 = {1.0f, -2.0f, 0.1f};
  std::memcpy(opt.master().data, p0.data(), 12);
  std::vector<float> g = {0.5f, 0.5f, -0.5f};
  std::vector<uint16_t> out16(3);
  BufferView out{out16.data(), 3, DType::kBF16, DeviceKind::kCpu};
  opt.step(cpu_view(g), out, 0.01, 1, 1.0f);
  // t=1: p*(1-0.001) - 0.01*sign(g) (|g| >> eps); bf16 of that, round to nearest even:
  //   1*0.999 - 0.01 = 0.989 -> 0x3F7D (0.98828125);  -2*0.999 - 0.01 = -2.008 -> 0xC001
  //   (-2.015625, past the tie -2.0078125); 0.1*0.999 + 0.01 = 0.1099 -> 0x3DE1 (0.10986328125).
  const std::vector<float> master = to_vector(opt.master());
  CHECK_THAT(master[0], WithinAbs(0.989, 1e-6));
  CHECK_THAT(master[1], WithinAbs(-2.008, 1e-6));
  CHECK_THAT(master[2], WithinAbs(0.1099, 1e-6));
  CHECK(out16[0] == 0x3F7D);
  CHECK(out16[1] == 0xC001);
  CHECK(out16[2] == 0x3DE1);

  // params_out may be the master itself (fp32 training without a separate working copy).
  std::vector<float> before = to_vector(opt.master());
  opt.step(cpu_view(g), opt.master(), 0.01, 2, 1.0f);
  const std::vector<float> after = to_vector(opt.master());
  for (int i = 0; i < 3; ++i) CHECK(after[i] != before[i]);
}

TEST_CASE("AdamW writes fp16 parameters rounded from the master") {
  AdamW opt(DeviceKind::kCpu, 3, {});
  const std::vector<float> p0 = {1.0f, -2.0f, 0.1f};
  std::memcpy(opt.master().data, p0.data(), 12);
  std::vector<float> g = {0.5f, 0.5f, -0.5f};
  std::vector<uint16_t> out16(3);
  opt.step(cpu_view(g), BufferView{out16.data(), 3, DType::kF16, DeviceKind::kCpu}, 0.01, 1, 1.0f);
  // The masters of the bf16 case above, in fp16 (10 fraction bits, round to nearest even):
  //   0.989 -> 0x3BE9 (0.98876953125);  -2.008 -> 0xC004 (-2.0078125);  0.1099 -> 0x2F09
  //   (0.10992431640625).
  CHECK(out16[0] == 0x3BE9);
  CHECK(out16[1] == 0xC004);
  CHECK(out16[2] == 0x2F09);
}

TEST_CASE("AdamW updated part by part equals one step over the whole range") {
  const int n = 103;
  AdamW whole(DeviceKind::kCpu, n, {}), parts(DeviceKind::kCpu, n, {});
  std::vector<float> p0(n), g(n), out_whole(n), out_parts(n, -7.0f);
  for (int i = 0; i < n; ++i) {
    p0[i] = std::sin(0.3f * i);
    g[i] = std::cos(0.7f * i) - 0.2f;
  }
  std::memcpy(whole.master().data, p0.data(), n * 4);
  std::memcpy(parts.master().data, p0.data(), n * 4);
  for (int t = 1; t <= 3; ++t) {
    whole.step(cpu_view(g), cpu_view(out_whole), 1e-2, t, 0.5f);
    // Uneven parts, out of order, one empty.
    for (Range r : {Range{40, 103}, Range{0, 17}, Range{17, 17}, Range{17, 40}})
      parts.step_part(r, cpu_view(g).slice(r.begin, r.size()),
                      cpu_view(out_parts).slice(r.begin, r.size()), 1e-2, t, 0.5f);
  }
  REQUIRE(out_parts == out_whole);
  REQUIRE(to_vector(parts.exp_avg()) == to_vector(whole.exp_avg()));
  REQUIRE(to_vector(parts.exp_avg_sq()) == to_vector(whole.exp_avg_sq()));
  REQUIRE_THROWS_AS(parts.step_part({90, 104}, cpu_view(g).slice(0, 14),
                                    cpu_view(out_parts).slice(0, 14), 1e-2, 4, 1.0f),
                    RuntimeError);
}

TEST_CASE("AdamW rejects bad hyper-parameters and mismatched buffers") {
  AdamWConfig bad;
  bad.beta1 = 1.0;
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);
  bad = {};
  bad.beta2 = -0.1;
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);
  bad = {};
  bad.eps = -1;
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);
  bad.eps = 0;  // 0 / 0 for parameters that have had no gradient yet
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);
  bad = {};
  bad.weight_decay = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);
  bad = {};
  bad.lr = -3e-4;
  REQUIRE_THROWS_AS(AdamW(DeviceKind::kCpu, 4, bad), UsageError);

  AdamW opt(DeviceKind::kCpu, 4, {});
  std::vector<float> g(4, 1.0f), out(4), short_out(3);
  REQUIRE_THROWS_AS(opt.step(cpu_view(g), cpu_view(out), 1e-3, 0, 1.0f), RuntimeError);
  REQUIRE_THROWS_AS(opt.step(cpu_view(g), cpu_view(short_out), 1e-3, 1, 1.0f), RuntimeError);
  BufferView g64{g.data(), 2, DType::kF64, DeviceKind::kCpu};
  REQUIRE_THROWS_AS(opt.step(g64, cpu_view(out), 1e-3, 1, 1.0f), RuntimeError);
  // A refused step leaves the state untouched.
  for (float x : to_vector(opt.exp_avg())) REQUIRE(x == 0.0f);
}

// --grad-transport ce --grad-reduce bf16: each rank holds every rank's bf16 gradient, and the
// update reads their sum. The terms must give exactly the update (and the norm) of the fp32
// gradient 0 + t0 + t1 + t2 added in that order.
TEST_CASE("AdamW and sum_squares over bf16 gradient terms equal the fp32 sum of the terms") {
  const int64_t n = 1000;
  std::vector<std::vector<uint16_t>> terms(3, std::vector<uint16_t>(n));
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int j = 0; j < 3; ++j) {
      // Values whose sum rounds in fp32: large and small magnitudes mixed, both signs.
      const float x = std::ldexp(static_cast<float>((i * 7 + j * 13) % 97) - 48.0f,
                                 static_cast<int>((i + 5 * j) % 40) - 30);
      terms[j][i] = f32_to_bf16_bits(x);
      s += bf16_bits_to_f32(terms[j][i]);
    }
    sum[i] = s;
  }
  GradTerms views;
  for (auto& t : terms) views.push_back(BufferView{t.data(), n, DType::kBF16, DeviceKind::kCpu});
  REQUIRE(sum_squares(views) == sum_squares(cpu_view(sum)));
  REQUIRE(sum_squares(cpu_view(sum)) > 0);

  AdamW by_terms(DeviceKind::kCpu, n, {}), by_sum(DeviceKind::kCpu, n, {});
  std::vector<float> out_terms(n), out_sum(n);
  for (int t = 1; t <= 2; ++t) {
    by_terms.step_part({0, n}, views, cpu_view(out_terms), 1e-3, t, 0.5f);
    by_sum.step(cpu_view(sum), cpu_view(out_sum), 1e-3, t, 0.5f);
  }
  REQUIRE(std::memcmp(out_terms.data(), out_sum.data(), n * sizeof(float)) == 0);
  REQUIRE(to_vector(by_terms.exp_avg_sq()) == to_vector(by_sum.exp_avg_sq()));

  // Refused: no terms, two fp32 terms, mixed types, more than 8, a short term.
  std::vector<float> out(n);
  REQUIRE_THROWS_AS(by_terms.step_part({0, n}, GradTerms{}, cpu_view(out), 1e-3, 3, 1.0f),
                    RuntimeError);
  REQUIRE_THROWS_AS(by_terms.step_part({0, n}, GradTerms{cpu_view(sum), cpu_view(sum)},
                                       cpu_view(out), 1e-3, 3, 1.0f),
                    RuntimeError);
  REQUIRE_THROWS_AS(
      by_terms.step_part({0, n}, GradTerms{views[0], cpu_view(sum)}, cpu_view(out), 1e-3, 3, 1.0f),
      RuntimeError);
  REQUIRE_THROWS_AS(
      by_terms.step_part({0, n}, GradTerms(9, views[0]), cpu_view(out), 1e-3, 3, 1.0f),
      RuntimeError);
  REQUIRE_THROWS_AS(by_terms.step_part({0, n}, GradTerms{views[0], views[1].slice(0, n - 1)},
                                       cpu_view(out), 1e-3, 3, 1.0f),
                    RuntimeError);
  REQUIRE_THROWS_AS(sum_squares(GradTerms{}), RuntimeError);
}

// Reference values (python3, double) for lr=1e-3, min_lr=1e-4, W=10, S=110:
//   s < W: lr*(s+1)/W;  else min_lr + 0.5*(lr-min_lr)*(1 + cos(pi*(s-W)/(S-W)))
TEST_CASE("LR schedule: warmup, cosine, end points, constant") {
  LrSchedule s{1e-3, 1e-4, 10, 110};
  CHECK_THAT(s.at(0), WithinRel(1e-4, 1e-12));
  CHECK_THAT(s.at(4), WithinRel(5e-4, 1e-12));
  CHECK_THAT(s.at(9), WithinRel(1e-3, 1e-12));   // last warmup step reaches lr
  CHECK_THAT(s.at(10), WithinRel(1e-3, 1e-12));  // cosine starts at lr
  CHECK_THAT(s.at(35), WithinRel(0.00086819805153394642, 1e-12));
  CHECK_THAT(s.at(60), WithinRel(0.00055000000000000003, 1e-12));  // half way: the mean
  CHECK_THAT(s.at(109), WithinRel(0.00010022204783542078, 1e-12));
  REQUIRE_THROWS_AS(s.at(110), RuntimeError);
  REQUIRE_THROWS_AS(s.at(-1), RuntimeError);

  // W = 0 and min_lr = lr: constant.
  LrSchedule c{3e-4, 3e-4, 0, 50};
  for (int64_t i = 0; i < 50; ++i) REQUIRE(c.at(i) == 3e-4);
  // W = 0, one step: cos(0) = 1 gives lr.
  LrSchedule one{2e-3, 0.0, 0, 1};
  CHECK_THAT(one.at(0), WithinRel(2e-3, 1e-15));
  // Warmup longer than the run stays in warmup.
  LrSchedule w{1e-3, 1e-4, 100, 10};
  CHECK_THAT(w.at(9), WithinRel(1e-4, 1e-12));

  REQUIRE_THROWS_AS((LrSchedule{1e-3, 1e-4, -1, 10}.at(0)), UsageError);
  REQUIRE_THROWS_AS((LrSchedule{1e-3, 1e-4, 0, 0}.validate()), UsageError);
  REQUIRE_THROWS_AS((LrSchedule{-1e-3, 1e-4, 0, 10}.validate()), UsageError);
  REQUIRE_THROWS_AS((LrSchedule{1e-3, -1.0, 0, 10}.validate()), UsageError);
}

// min(1, clip/(norm + 1e-6)); 1/(4+1e-6) = 0.24999993750001562, 2/(2+1e-6) = 0.99999950000024995.
TEST_CASE("clip_scale") {
  CHECK(clip_scale(123.0, 0.0) == 1.0f);  // off
  CHECK(clip_scale(0.5, 1.0) == 1.0f);    // norm below the threshold
  CHECK(clip_scale(0.0, 1.0) == 1.0f);
  CHECK(clip_scale(4.0, 1.0) == static_cast<float>(0.24999993750001562));
  CHECK(clip_scale(2.0, 2.0) == static_cast<float>(0.99999950000024995));
  CHECK(clip_scale(2.0, 2.0) < 1.0f);
  CHECK(std::isnan(clip_scale(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  REQUIRE_THROWS_AS(clip_scale(1.0, -1.0), UsageError);
}

TEST_CASE("sum_squares is exact on integers and independent of chunking") {
  // x_i = (i mod 7) - 3 over 300001 elements (crosses several 65536-element chunks); every
  // partial sum is an integer below 2^53, so the double result is exact.
  const int64_t n = 300001;
  std::vector<float> x(n);
  int64_t want = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t xi = i % 7 - 3;
    x[i] = static_cast<float>(xi);
    want += xi * xi;
  }
  REQUIRE(sum_squares(cpu_view(x)) == static_cast<double>(want));
  REQUIRE(sum_squares(cpu_view(x).slice(1, 5)) == 4.0 + 1.0 + 0.0 + 1.0 + 4.0);
  REQUIRE(sum_squares(cpu_view(x).slice(0, 0)) == 0.0);
  // Non-integers: 0.1f^2 * 10 in double, from the fp32 value of 0.1.
  std::vector<float> tenth(10, 0.1f);
  const double t = static_cast<double>(0.1f);
  CHECK_THAT(sum_squares(cpu_view(tenth)), WithinRel(10 * t * t, 1e-15));
}

TEST_CASE("cast_f32_to_params rounds to nearest even and copies fp32") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> src = {
      1.0f + std::ldexp(1.0f, -8),                          // tie -> even 0x3F80
      1.0f + 3 * std::ldexp(1.0f, -8),                      // tie -> even 0x3F82
      1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20),  // above the tie -> 0x3F81
      -2.0f,                                                // exact 0xC000
      std::numeric_limits<float>::max(),                    // rounds up to +inf 0x7F80
      -inf,                                                 // 0xFF80
      std::numeric_limits<float>::quiet_NaN(),              // canonical NaN 0x7FFF
      0.1f};                                                // 0x3DCD (0x3DCCCCCD rounds up)
  const std::vector<uint16_t> want = {0x3F80, 0x3F82, 0x3F81, 0xC000,
                                      0x7F80, 0xFF80, 0x7FFF, 0x3DCD};
  std::vector<uint16_t> out(src.size());
  cast_f32_to_params(cpu_view(src), BufferView{out.data(), static_cast<int64_t>(out.size()),
                                               DType::kBF16, DeviceKind::kCpu});
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(out[i] == want[i]);
  }
  std::vector<float> f32(src.size());
  cast_f32_to_params(cpu_view(src), cpu_view(f32));
  CHECK(std::memcmp(f32.data(), src.data(), src.size() * sizeof(float)) == 0);
  REQUIRE_THROWS_AS(cast_f32_to_params(cpu_view(src), cpu_view(f32).slice(0, 3)), RuntimeError);
}

TEST_CASE("cast_f32_to_params rounds to fp16 as the GPU does, subnormals included") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> src = {
      1.0f + std::ldexp(1.0f, -11),                          // tie -> even 0x3C00
      1.0f + 3 * std::ldexp(1.0f, -11),                      // tie -> even 0x3C02
      1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20),  // above the tie -> 0x3C01
      -2.0f,                                                 // exact 0xC000
      0.1f,                                                  // 0x2E66
      65519.0f,                                              // below the tie: 65504 0x7BFF
      65520.0f,                                              // the tie rounds up to inf 0x7C00
      std::numeric_limits<float>::max(),                     // inf 0x7C00
      -inf,                                                  // 0xFC00
      std::numeric_limits<float>::quiet_NaN(),               // canonical NaN 0x7FFF
      std::ldexp(1.0f, -24),                                 // the smallest subnormal 0x0001
      std::ldexp(1.0f, -25),                                 // tie -> even 0x0000
      -3 * std::ldexp(1.0f, -26),                            // above the tie -> 0x8001
      std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25),         // tie -> the smallest normal 0x0400
      std::numeric_limits<float>::denorm_min()};             // 0x0000
  const std::vector<uint16_t> want = {0x3C00, 0x3C02, 0x3C01, 0xC000, 0x2E66,
                                      0x7BFF, 0x7C00, 0x7C00, 0xFC00, 0x7FFF,
                                      0x0001, 0x0000, 0x8001, 0x0400, 0x0000};
  std::vector<uint16_t> out(src.size());
  cast_f32_to_params(cpu_view(src), BufferView{out.data(), static_cast<int64_t>(out.size()),
                                               DType::kF16, DeviceKind::kCpu});
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(out[i] == want[i]);
  }
  // Widening is exact: every fp16 value other than NaN converts back to its own bits.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<uint16_t>(b);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;
    INFO("bits " << b);
    REQUIRE(f32_to_f16_bits(f16_bits_to_f32(h)) == h);
  }
  CHECK(f16_bits_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isnan(f16_bits_to_f32(0x7FFF)));
}

TEST_CASE("loss scaler: PyTorch GradScaler's dynamic rule, fixed scales, refusals") {
  SECTION(
      "dynamic: 2^16, doubled after `window` clean steps, halved and the step skipped on a "
      "non-finite one") {
    LossScaler s(parse_loss_scale("dynamic", 3));
    CHECK(s.enabled());
    CHECK(s.scale() == 65536.0);
    CHECK(!s.update(true));
    CHECK(!s.update(true));
    CHECK(s.scale() == 65536.0);
    CHECK(!s.update(true));  // the third clean step in a row
    CHECK(s.scale() == 131072.0);
    CHECK(s.good_steps() == 0);
    CHECK(!s.update(true));
    CHECK(s.update(false));  // skipped; the count starts again
    CHECK(s.scale() == 65536.0);
    CHECK(s.good_steps() == 0);
    CHECK(!s.update(true));
    CHECK(!s.update(true));
    CHECK(s.scale() == 65536.0);
    CHECK(!s.update(true));
    CHECK(s.scale() == 131072.0);
  }
  SECTION("a dynamic scale that keeps falling stops the run") {
    LossScaler s(parse_loss_scale("dynamic", 2000));
    int skipped = 0;
    CHECK_THROWS_AS(
        [&] {
          while (s.update(false)) ++skipped;
        }(),
        RuntimeError);
    CHECK(skipped == 16 + 64);  // halvings from 2^16 down to 2^-64, the smallest scale kept
  }
  SECTION("restore continues a checkpoint's scale and count, cut to this run's window") {
    LossScaler s(parse_loss_scale("dynamic", 4));
    s.restore(1024.0, 2);
    CHECK(s.scale() == 1024.0);
    CHECK(!s.update(true));
    CHECK(!s.update(true));
    CHECK(s.scale() == 2048.0);
    s.restore(8.0, 1999);  // written with window 2000
    CHECK(s.good_steps() == 3);
    CHECK(!s.update(true));
    CHECK(s.scale() == 16.0);
  }
  SECTION("a fixed scale never changes but still skips non-finite steps") {
    LossScaler s(parse_loss_scale("1024", 2000));
    CHECK(!s.dynamic());
    CHECK(s.scale() == 1024.0);
    CHECK(s.update(false));
    for (int i = 0; i < 5000; ++i) s.update(true);
    CHECK(s.scale() == 1024.0);
    s.restore(2.0, 0);  // ignored: the user's scale
    CHECK(s.scale() == 1024.0);
  }
  SECTION("none: scale 1, nothing checked or skipped") {
    LossScaler s(parse_loss_scale("none", 2000));
    CHECK(!s.enabled());
    CHECK(s.scale() == 1.0);
    CHECK(!s.update(false));
  }
  SECTION("auto: dynamic for fp16 gradients, none otherwise") {
    const LossScaleConfig fp16 = parse_loss_scale("auto", 100, /*fp16=*/true);
    CHECK(fp16.enabled);
    CHECK(fp16.dynamic);
    CHECK(fp16.initial == 65536.0);
    CHECK(fp16.window == 100);
    CHECK(!parse_loss_scale("auto", 100, /*fp16=*/false).enabled);
    CHECK(!parse_loss_scale("auto", 100).enabled);
    // An explicit choice wins over auto's, fp16 or not.
    CHECK(!parse_loss_scale("none", 100, /*fp16=*/true).enabled);
    CHECK(parse_loss_scale("512", 100, /*fp16=*/true).initial == 512.0);
    CHECK(!parse_loss_scale("512", 100, /*fp16=*/true).dynamic);
  }
  SECTION("bad values are refused by flag") {
    for (const char* bad : {"", "0", "-4", "inf", "nan", "dynamc", "12x"})
      CHECK_THROWS_WITH(parse_loss_scale(bad, 2000), Catch::Matchers::Contains("--loss-scale"));
    CHECK_THROWS_WITH(parse_loss_scale("dynamic", 0),
                      Catch::Matchers::Contains("--loss-scale-window"));
  }
}
