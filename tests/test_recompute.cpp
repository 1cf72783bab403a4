// Activation recompute (model/recompute.h) in the CPU reference: every mode gives the losses,
// logits, gradients, ready() order and forward announcements of Recompute::kNone bit for bit,
// while activation_bytes() shrinks by exactly what the mode no longer keeps per block.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/cpu/transformer.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/recompute.h"
#include "tests/catch.h"
#include "tests/forward_announcements.h"

using namespace trainer;

namespace {

constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kFfn, Recompute::kBlock};
constexpr int64_t kBatch = 2;

ModelConfig test_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = 4;
  c.d_ff = 48;
  c.vocab = 50;
  c.ctx = 12;
  return c;
}

template <typename T>
std::vector<T> test_params(const ParamLayout& L) {
  std::vector<float> p(L.total());
  init_params(L, 21, p.data());
  return {p.begin(), p.end()};
}

std::vector<int32_t> tokens(int64_t n, int64_t mul, int64_t add, int64_t vocab) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * mul + add) % vocab);
  return ids;
}

// activation_bytes() from CpuTransformer's buffers, for max_batch rows of ctx (n = B * ctx).
int64_t expected_bytes(const ModelConfig& c, int64_t B, Recompute r, int64_t elem_bytes) {
  const int64_t n = B * c.ctx, d = c.d_model, f = c.d_ff, V = c.vocab;
  const int64_t x = n * d;
  // ln1, q, k, v, att, h; rstd1; probs.
  const int64_t attention_half = 6 * n * d + n + B * c.n_heads * c.ctx * c.ctx;
  const int64_t ffn_inputs = n * d + n + 3 * n * f;  // ln2; rstd2; a, b, g
  const int64_t per_block = r == Recompute::kNone  ? x + attention_half + ffn_inputs
                            : r == Recompute::kFfn ? x + attention_half
                                                   : x;
  const int64_t one_block = r == Recompute::kNone  ? 0
                            : r == Recompute::kFfn ? ffn_inputs
                                                   : attention_half + ffn_inputs;
  const int64_t head = n * d + n * d + n + n * V + n;     // xf, lnf, rstdf, logits, losses
  const int64_t scratch = 6 * n * d + 3 * n * f + n * V;  // dres..dv, dg, da, db, dlogits
  const int64_t ids = 2 * n * static_cast<int64_t>(sizeof(int32_t));  // inputs, targets
  return (c.n_layers * per_block + one_block + head + scratch) * elem_bytes + ids;
}

template <typename T>
struct Trace {
  std::vector<T> losses, logits, grads;
  std::vector<int> ready;
  std::vector<int64_t> announced;
};

// Two micro-batches (the second shorter, of one row) accumulated into one gradient with scales
// != 1, then a second backward of the last forward, whose recompute must also redo the last block.
template <typename T>
Trace<T> train(Recompute r) {
  const ModelConfig c = test_config();
  const ParamLayout L(c);
  const std::vector<T> p = test_params<T>(L);
  cpu::CpuTransformer<T> model(c, kBatch, r);
  REQUIRE(model.recompute() == r);
  Trace<T> t;
  t.grads.assign(L.total(), T(0));
  auto ready = [&](int i) { t.ready.push_back(i); };
  auto step = [&](int64_t B, int64_t seq, int64_t mul, int64_t add, T scale) {
    const std::vector<int32_t> in = tokens(B * seq, mul, add, c.vocab);
    const std::vector<int32_t> tg = tokens(B * seq, mul + 4, add + 1, c.vocab);
    std::vector<int64_t> announced;
    t.losses.push_back(model.forward(p.data(), in.data(), tg.data(), B, seq,
                                     [&](int64_t offset) { announced.push_back(offset); }));
    check_forward_announcements(L, c.n_layers, announced);
    t.announced.insert(t.announced.end(), announced.begin(), announced.end());
    t.logits.insert(t.logits.end(), model.logits(), model.logits() + B * seq * c.vocab);
    model.backward(p.data(), t.grads.data(), scale, ready);
  };
  step(kBatch, c.ctx, 13, 5, T(0.375));
  step(1, 9, 7, 3, T(1.25));
  model.backward(p.data(), t.grads.data(), T(0.625), ready);
  return t;
}

}  // namespace

TEMPLATE_TEST_CASE("every recompute mode gives kNone's results bit for bit", "", float, double) {
  const Trace<TestType> ref = train<TestType>(Recompute::kNone);
  const int64_t n_tensors = static_cast<int64_t>(ParamLayout(test_config()).tensors().size());
  REQUIRE(static_cast<int64_t>(ref.ready.size()) == 3 * n_tensors);
  bool nonzero = false;
  for (TestType g : ref.grads) nonzero = nonzero || g != TestType(0);
  REQUIRE(nonzero);
  for (Recompute r : {Recompute::kFfn, Recompute::kBlock}) {
    INFO("--recompute " << recompute_name(r));
    const Trace<TestType> got = train<TestType>(r);
    REQUIRE(got.losses == ref.losses);
    REQUIRE(got.logits == ref.logits);
    REQUIRE(got.ready == ref.ready);
    REQUIRE(got.announced == ref.announced);
    REQUIRE(got.grads.size() == ref.grads.size());
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      INFO("gradient element " << i);
      REQUIRE(got.grads[i] == ref.grads[i]);
    }
  }
}

TEMPLATE_TEST_CASE("activation_bytes() counts what each recompute mode allocates", "", float,
                   double) {
  const ModelConfig c = test_config();
  int64_t bytes[3];
  for (int m = 0; m < 3; ++m) {
    const cpu::CpuTransformer<TestType> model(c, kBatch, kModes[m]);
    bytes[m] = model.activation_bytes();
    CHECK(bytes[m] == expected_bytes(c, kBatch, kModes[m], sizeof(TestType)));
  }
  // n = 24 rows: per block x 768, attention half 5784, ffn inputs 4248 elements; head 2784,
  // backward scratch 9264; 192 bytes of ids.
  const int64_t elems[3] = {3 * (768 + 5784 + 4248) + 2784 + 9264,
                            3 * (768 + 5784) + 4248 + 2784 + 9264,
                            3 * 768 + 5784 + 4248 + 2784 + 9264};
  for (int m = 0; m < 3; ++m) CHECK(bytes[m] == elems[m] * int64_t{sizeof(TestType)} + 192);
  CHECK(bytes[1] < bytes[0]);
  CHECK(bytes[2] < bytes[1]);
}

TEMPLATE_TEST_CASE("evaluate-style forward (no targets) works in every recompute mode", "", float,
                   double) {
  const ModelConfig c = test_config();
  const ParamLayout L(c);
  const std::vector<TestType> p = test_params<TestType>(L);
  const std::vector<int32_t> in = tokens(kBatch * c.ctx, 11, 2, c.vocab);
  const std::vector<int32_t> tg = tokens(kBatch * c.ctx, 3, 1, c.vocab);
  const int64_t n_logits = kBatch * c.ctx * c.vocab;
  std::vector<TestType> ref, ref_grads;
  for (Recompute r : kModes) {
    INFO("--recompute " << recompute_name(r));
    cpu::CpuTransformer<TestType> model(c, kBatch, r);
    // A training forward first, so that evaluation overwrites what it kept.
    model.forward(p.data(), tg.data(), in.data(), kBatch, c.ctx);
    REQUIRE(model.forward(p.data(), in.data(), nullptr, kBatch, c.ctx) == TestType(0));
    const std::vector<TestType> logits(model.logits(), model.logits() + n_logits);
    if (ref.empty()) ref = logits;
    REQUIRE(logits == ref);
    std::vector<TestType> g(L.total(), TestType(0));
    REQUIRE_THROWS_AS(model.backward(p.data(), g.data(), TestType(1), {}), RuntimeError);
    // Training after evaluation is unaffected by it.
    model.forward(p.data(), in.data(), tg.data(), kBatch, c.ctx);
    REQUIRE(std::vector<TestType>(model.logits(), model.logits() + n_logits) == ref);
    model.backward(p.data(), g.data(), TestType(1), {});
    if (ref_grads.empty()) ref_grads = g;
    REQUIRE(g == ref_grads);
  }
}

TEST_CASE("parse_recompute knows none, ffn and block and lists them otherwise") {
  for (Recompute r : kModes) REQUIRE(parse_recompute(recompute_name(r)) == r);
  REQUIRE(std::string(recompute_name(Recompute::kNone)) == "none");
  REQUIRE(std::string(recompute_name(Recompute::kFfn)) == "ffn");
  REQUIRE(std::string(recompute_name(Recompute::kBlock)) == "block");
  for (const char* bad : {"", "full", "Block", "attention"}) {
    INFO("'" << bad << "'");
    REQUIRE_THROWS_AS(parse_recompute(bad), UsageError);
  }
  REQUIRE_THROWS_WITH(parse_recompute("full"),
                      ContainsSubstring("--recompute") && ContainsSubstring("'none'") &&
                          ContainsSubstring("'ffn'") && ContainsSubstring("'block'"));
}
