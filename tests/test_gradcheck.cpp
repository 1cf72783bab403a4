// Backward of the whole CPU model against central finite differences, in double, on a tiny model:
// every element of every parameter tensor is checked.
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/cpu/transformer.h"
#include "model/init.h"
#include "model/layout.h"
#include "tests/catch.h"

using namespace trainer;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 24;
  c.vocab = 37;
  c.ctx = 8;
  return c;
}

std::vector<double> init_double(const ParamLayout& L, uint64_t seed) {
  std::vector<float> f(L.total());
  init_params(L, seed, f.data());
  std::vector<double> p(f.begin(), f.end());
  // Gains of exactly 1 would hide a gain gradient that is, say, transposed; perturb them.
  for (const auto& t : L.tensors())
    if (t.shape.size() == 1)
      for (int64_t e = 0; e < t.numel; ++e) p[t.offset + e] += 0.1 * std::sin(1.0 + e + t.offset);
  return p;
}

// Checks backward against central differences of the summed token loss for every parameter.
void gradcheck(int64_t B, int64_t seq, const std::vector<int32_t>& in,
               const std::vector<int32_t>& tg) {
  const ModelConfig c = tiny_config();
  const ParamLayout L(c);
  cpu::CpuTransformer<double> model(c, /*max_batch=*/2);
  std::vector<double> p = init_double(L, 1234);
  const double n = static_cast<double>(B * seq);

  model.forward(p.data(), in.data(), tg.data(), B, seq);
  std::vector<double> g(L.total(), 0.0);
  model.backward(p.data(), g.data(), 1.0, {});

  const double h = 1e-5;
  auto sum_loss = [&] { return n * model.forward(p.data(), in.data(), tg.data(), B, seq); };
  for (const auto& t : L.tensors()) {
    double worst = 0;
    for (int64_t e = 0; e < t.numel; ++e) {
      double& x = p[t.offset + e];
      const double x0 = x;
      x = x0 + h;
      const double fp = sum_loss();
      x = x0 - h;
      const double fm = sum_loss();
      x = x0;
      const double num = (fp - fm) / (2 * h), ana = g[t.offset + e];
      // Relative error, with a floor of 1e-9 absolute for gradients that are (nearly) zero, such
      // as embedding rows of tokens that do not occur.
      const double err = std::abs(num - ana) / std::max({std::abs(num), std::abs(ana), 1e-3});
      worst = std::max(worst, err);
      if (std::abs(num - ana) > 1e-9) {
        INFO(t.name << "[" << e << "] backward " << ana << " finite difference " << num);
        CHECK(err < 1e-6);
      }
    }
    INFO(t.name << " worst relative error " << worst);
    CHECK(worst < 1e-6);
  }
  // Padding between tensors gets no gradient.
  std::vector<bool> used(L.total(), false);
  for (const auto& t : L.tensors())
    for (int64_t e = 0; e < t.numel; ++e) used[t.offset + e] = true;
  for (int64_t i = 0; i < L.total(); ++i)
    if (!used[i]) REQUIRE(g[i] == 0.0);
}

}  // namespace

TEST_CASE("backward matches finite differences for every parameter (batch 2, full ctx)") {
  // Repeated tokens (3, 5, 36) so the embedding gradient must add rows; 36 = vocab - 1.
  const std::vector<int32_t> in = {3, 5, 3, 36, 0, 17, 5, 9, 36, 1, 2, 3, 30, 3, 11, 36};
  const std::vector<int32_t> tg = {5, 3, 36, 0, 17, 5, 9, 36, 1, 2, 3, 30, 3, 11, 36, 22};
  gradcheck(2, 8, in, tg);
}

TEST_CASE("backward matches finite differences for a shorter, smaller batch") {
  const std::vector<int32_t> in = {7, 7, 20, 1, 33};
  const std::vector<int32_t> tg = {7, 20, 1, 33, 7};
  gradcheck(1, 5, in, tg);
}

TEST_CASE("ready() comes once per tensor in increasing order and backward accumulates") {
  const ModelConfig c = tiny_config();
  const ParamLayout L(c);
  cpu::CpuTransformer<double> model(c, 2);
  const std::vector<double> p = init_double(L, 99);
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) {
    in[i] = (i * 7 + 3) % 37;
    tg[i] = (i * 11 + 5) % 37;
  }
  const double loss = model.forward(p.data(), in.data(), tg.data(), 2, 8);
  // An untrained model predicts roughly uniformly: loss near ln(37) = 3.61.
  CHECK(loss > 2.0);
  CHECK(loss < 6.0);

  std::vector<double> g1(L.total(), 0.0), g2(L.total(), 0.0);
  std::vector<int> order;
  model.backward(p.data(), g1.data(), 1.0, [&](int i) { order.push_back(i); });
  REQUIRE(order.size() == L.tensors().size());
  for (size_t i = 0; i < order.size(); ++i) REQUIRE(order[i] == static_cast<int>(i));
  // When ready(i) fires, tensor i's gradient is final: the next tensor backward computes must
  // not touch it. Record a snapshot at each call and compare with the end result.
  std::vector<std::vector<double>> at_ready(L.tensors().size());
  model.backward(p.data(), g2.data(), 1.0, [&](int i) {
    const auto& t = L.tensors()[i];
    at_ready[i].assign(g2.begin() + t.offset, g2.begin() + t.offset + t.numel);
  });
  for (size_t i = 0; i < L.tensors().size(); ++i) {
    const auto& t = L.tensors()[i];
    for (int64_t e = 0; e < t.numel; ++e) REQUIRE(at_ready[i][e] == g2[t.offset + e]);
  }
  // Two more backward calls with scale 0.5 each accumulate to 2 * g1 in total.
  model.backward(p.data(), g2.data(), 0.5, {});
  model.backward(p.data(), g2.data(), 0.5, {});
  double max_abs = 0;
  for (int64_t i = 0; i < L.total(); ++i) {
    REQUIRE_THAT(g2[i], WithinAbs(2 * g1[i], 1e-12 * (1 + std::abs(g1[i]))));
    max_abs = std::max(max_abs, std::abs(g1[i]));
  }
  CHECK(max_abs > 1e-3);  // the gradient is not trivially zero
}

TEST_CASE("forward rejects bad shapes and token ids") {
  const ModelConfig c = tiny_config();
  const ParamLayout L(c);
  cpu::CpuTransformer<float> model(c, 2);
  std::vector<float> p(L.total());
  init_params(L, 1, p.data());
  std::vector<int32_t> in(24, 1), tg(24, 2);
  REQUIRE_THROWS_AS(model.forward(p.data(), in.data(), tg.data(), 3, 8), UsageError);  // batch
  REQUIRE_THROWS_AS(model.forward(p.data(), in.data(), tg.data(), 1, 9), UsageError);  // ctx
  in[3] = 37;
  REQUIRE_THROWS_AS(model.forward(p.data(), in.data(), tg.data(), 1, 8), UsageError);
  in[3] = 1;
  tg[0] = -1;
  REQUIRE_THROWS_AS(model.forward(p.data(), in.data(), tg.data(), 1, 8), UsageError);
  tg[0] = 2;
  REQUIRE_NOTHROW(model.forward(p.data(), in.data(), tg.data(), 1, 8));
}
