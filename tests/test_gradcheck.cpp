// Backward of the whole CPU model against central finite differences, in double, on a tiny model:
// every element of every parameter tensor is checked. Also the order of ready() calls, gradient
// accumulation, thread-count independence and the CpuReplica wrapper.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/cpu/transformer.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/replica.h"
#include "tests/catch.h"
#include "tests/forward_announcements.h"

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

  // Fourth-order central differences, (-f(2h) + 8 f(h) - 8 f(-h) + f(-2h)) / 12h: truncation
  // error h^4 f^(5) / 30 and rounding error ~1e-14 * |sum loss| / h are both ~1e-11 at h = 1e-3,
  // well below the 1e-6 relative error asked of backward.
  const double h = 1e-3;
  auto sum_loss = [&] { return n * model.forward(p.data(), in.data(), tg.data(), B, seq); };
  for (const auto& t : L.tensors()) {
    double worst = 0;
    for (int64_t e = 0; e < t.numel; ++e) {
      double& x = p[t.offset + e];
      const double x0 = x;
      auto f_at = [&](double dx) {
        x = x0 + dx;
        return sum_loss();
      };
      const double num = (-f_at(2 * h) + 8 * f_at(h) - 8 * f_at(-h) + f_at(-2 * h)) / (12 * h);
      x = x0;
      const double ana = g[t.offset + e];
      // Relative error; gradients below 1e-4 (embedding rows of tokens that do not occur are
      // exactly 0) are measured relative to 1e-4.
      const double err = std::abs(num - ana) / std::max({std::abs(num), std::abs(ana), 1e-4});
      worst = std::max(worst, err);
      if (err >= 1e-6) {
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

TEST_CASE("results do not depend on the number of OpenMP threads") {
  ModelConfig c = tiny_config();
  c.d_model = 64;  // big enough that gemm uses several tiles
  c.n_heads = 4;
  c.d_ff = 200;
  c.vocab = 300;
  c.ctx = 32;
  const ParamLayout L(c);
  std::vector<float> p(L.total());
  init_params(L, 11, p.data());
  std::vector<int32_t> in(4 * 32), tg(4 * 32);
  for (int i = 0; i < 4 * 32; ++i) {
    in[i] = (i * 37 + 1) % 300;
    tg[i] = (i * 53 + 2) % 300;
  }
  auto run = [&](int threads, std::vector<float>& g) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::CpuTransformer<float> model(c, 4);
    const float loss = model.forward(p.data(), in.data(), tg.data(), 4, 32);
    g.assign(L.total(), 0.0f);
    model.backward(p.data(), g.data(), 1.0f, {});
    omp_set_num_threads(saved);
    return loss;
  };
  std::vector<float> g1, g3;
  const float l1 = run(1, g1), l3 = run(3, g3);
  REQUIRE(l1 == l3);
  REQUIRE(g1 == g3);
}

TEST_CASE("forward announces each part of the parameters before reading it") {
  // As under ZeRO-1, whose all-gathers may still be running, parameters arrive only when forward
  // asks for them; until then they are NaN, so an earlier read changes the loss.
  const ModelConfig c = tiny_config();
  const ParamLayout L(c);
  const int64_t n = L.total();
  ReplicaOptions o;
  o.max_batch = 2;
  o.flat_elems = n;
  auto r = make_cpu_replica(c, o);
  std::vector<float> p(n, 0.0f);
  init_params(L, 9, p.data());
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) {
    in[i] = (i * 7 + 2) % 37;
    tg[i] = (i * 5 + 3) % 37;
  }
  r->set_params(p.data());
  r->forward({in.data(), tg.data(), 2, 8});
  const float expected = r->take_loss();
  REQUIRE(std::isfinite(expected));

  const std::vector<float> nan(n, std::nanf(""));
  r->set_params(nan.data());
  std::vector<int64_t> offsets;
  r->forward({in.data(), tg.data(), 2, 8}, [&](int64_t offset) {
    offsets.push_back(offset);
    std::copy(p.begin() + offset, p.end(), r->params().as<float>() + offset);
  });
  CHECK(r->take_loss() == expected);
  check_forward_announcements(L, c.n_layers, offsets);
}

TEST_CASE("CpuReplica wraps the float model: loss averaging, evaluate, accumulation") {
  const ModelConfig c = tiny_config();
  const ParamLayout L(c);
  ReplicaOptions o;
  o.max_batch = 2;
  o.flat_elems = L.padded_total(3);  // padding beyond the layout, as under ZeRO-1
  auto r = make_cpu_replica(c, o);
  REQUIRE(r->device() == DeviceKind::kCpu);
  REQUIRE(r->params().count == o.flat_elems);
  REQUIRE(r->grads().count == o.flat_elems);
  std::vector<float> p(o.flat_elems, 0.0f);
  init_params(L, 21, p.data());
  r->set_params(p.data());
  REQUIRE(std::equal(p.begin(), p.end(), r->params().as<float>()));

  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) {
    in[i] = (i * 5 + 1) % 37;
    tg[i] = (i * 3 + 4) % 37;
  }
  cpu::CpuTransformer<float> ref(c, 2);
  const float loss_a = ref.forward(p.data(), in.data(), tg.data(), 2, 8);  // 16 tokens
  std::vector<float> g_ref(L.total(), 0.0f);
  ref.backward(p.data(), g_ref.data(), 0.25f, {});
  const float loss_b = ref.forward(p.data(), in.data() + 3, tg.data() + 3, 1, 4);  // 4 tokens

  // Two micro-batches: take_loss is the mean over all 20 tokens.
  r->forward({in.data(), tg.data(), 2, 8});
  REQUIRE(r->activation_bytes() == ref.activation_bytes());
  int calls = 0;
  r->backward(0.25f, [&](int) { ++calls; });
  REQUIRE(calls == static_cast<int>(L.tensors().size()));
  for (int64_t i = 0; i < L.total(); ++i) REQUIRE(r->grads().as<float>()[i] == g_ref[i]);
  r->forward({in.data() + 3, tg.data() + 3, 1, 4});
  // evaluate neither counts towards take_loss nor may be followed by backward.
  CHECK(r->evaluate({in.data(), tg.data(), 2, 8}) == loss_a);
  CHECK_THROWS_AS(r->backward(1.0f, {}), RuntimeError);
  CHECK_THAT(r->take_loss(), WithinRel((16.0f * loss_a + 4.0f * loss_b) / 20.0f, 1e-6f));
  CHECK_THROWS_AS(r->take_loss(), RuntimeError);  // nothing forwarded since

  r->zero_grads();
  for (int64_t i = 0; i < o.flat_elems; ++i) REQUIRE(r->grads().as<float>()[i] == 0.0f);

  ReplicaOptions bf16 = o;
  bf16.precision = Precision::kBf16;
  CHECK_THROWS_AS(make_cpu_replica(c, bf16), UsageError);
}
