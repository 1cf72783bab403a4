// Generation on the CPU: the key/value-cache decoder computes exactly the full forward's logits at
// every position, however the tokens are fed; greedy decoding is the argmax of a full forward at
// every position; the sampler is reproducible for a seed and draws from the distribution it
// claims (temperature, top-k, top-p).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/cpu/transformer.h"
#include "model/decoder.h"
#include "model/init.h"
#include "model/layout.h"
#include "runtime/generate.h"
#include "tests/catch.h"
#include "tests/decode_fixtures.h"

using namespace trainer;
using trainer::test::spread_params;
using trainer::test::token_ids;

namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.d_ff = 48;
  c.vocab = 61;
  c.ctx = 24;
  return c;
}

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

}  // namespace

TEST_CASE("the CPU decoder's logits equal the full forward's at every position") {
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 3, 8.0f, 8.0f);
  const int64_t T = c.ctx, V = c.vocab;
  const std::vector<int32_t> ids = token_ids(T, V, 1);
  cpu::CpuTransformer<float> full(c, 1);
  full.forward(p.data(), ids.data(), nullptr, 1, T);
  const std::vector<float> ref(full.logits(), full.logits() + T * V);

  const auto decoder = make_cpu_decoder(c, p.data());
  // Chunks of every shape: a prompt, single tokens, a longer chunk, up to the context's end.
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{T}, {5, 1, 1, 7, 1, 9}, {1, 1, 1, 1, 20}}) {
    decoder->reset();
    int64_t pos = 0;
    for (int64_t n : chunks) {
      const float* got = decoder->feed(ids.data() + pos, n, true);
      for (int64_t i = 0; i < n * V; ++i)
        if (got[i] != ref[pos * V + i]) {
          FAIL("position " << pos + i / V << " token " << i % V << ": decoder " << got[i]
                           << " full forward " << ref[pos * V + i]);
        }
      pos += n;
    }
    CHECK(decoder->position() == T);
    // Without all_positions only the last position's logits come back.
    decoder->reset();
    const float* last = decoder->feed(ids.data(), T - 1);
    CHECK(std::equal(last, last + V, ref.begin() + (T - 2) * V));
  }
}

TEST_CASE("the decoder refuses ids outside the vocabulary and positions past ctx") {
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 3, 8.0f, 8.0f);
  const auto decoder = make_cpu_decoder(c, p.data());
  const std::vector<int32_t> ids = token_ids(c.ctx + 1, c.vocab, 2);
  CHECK_THROWS_AS(decoder->feed(ids.data(), c.ctx + 1), UsageError);
  const int32_t bad[] = {5, static_cast<int32_t>(c.vocab)};
  CHECK_THROWS_AS(decoder->feed(bad, 2), UsageError);
  decoder->reset();
  decoder->feed(ids.data(), c.ctx);
  CHECK_THROWS_AS(decoder->feed(ids.data(), 1), UsageError);
}

TEST_CASE("greedy decoding: the full forward's argmax; stops at the stop token and the length") {
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 11, 8.0f, 8.0f);
  const auto decoder = make_cpu_decoder(c, p.data());
  const std::vector<int32_t> prompt = token_ids(4, c.vocab, 5);
  SamplingOptions greedy;
  greedy.temperature = 0;
  TokenSampler sampler(greedy, 1);
  GenerateOptions o;

  SECTION("every generated token is the argmax of a full forward over the sequence") {
    o.max_new_tokens = 100;  // more than fits: stops at the context
    const GenerateResult r = generate(*decoder, prompt, o, sampler);
    CHECK(r.context_full);
    CHECK(static_cast<int64_t>(prompt.size() + r.tokens.size()) == c.ctx + 1);
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);  // the last one is never fed
    REQUIRE(static_cast<int64_t>(seq.size()) == c.ctx);
    cpu::CpuTransformer<float> full(c, 1);
    full.forward(p.data(), seq.data(), nullptr, 1, c.ctx);
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      INFO("generated token " << i);
      CHECK(r.tokens[i] == argmax(full.logits() + (prompt.size() - 1 + i) * c.vocab, c.vocab));
    }
  }
  SECTION("max_new_tokens, then the stop token ends the output at its first occurrence") {
    o.max_new_tokens = 6;
    const GenerateResult all = generate(*decoder, prompt, o, sampler);
    REQUIRE(all.tokens.size() == 6);
    CHECK(!all.stopped);
    CHECK(!all.context_full);
    o.stop_token = all.tokens[2];
    const size_t first =
        std::find(all.tokens.begin(), all.tokens.end(), all.tokens[2]) - all.tokens.begin();
    std::vector<int32_t> streamed;
    const GenerateResult r =
        generate(*decoder, prompt, o, sampler, [&](int32_t t) { streamed.push_back(t); });
    CHECK(r.stopped);
    CHECK(r.tokens == std::vector<int32_t>(all.tokens.begin(), all.tokens.begin() + first + 1));
    CHECK(streamed == r.tokens);
  }
}

TEST_CASE("sampling with a seed is reproducible and seeds differ") {
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 2, 8.0f, 8.0f);
  const auto decoder = make_cpu_decoder(c, p.data());
  const std::vector<int32_t> prompt = token_ids(3, c.vocab, 9);
  SamplingOptions s;
  s.temperature = 1.5;  // flatter: many tokens are likely, so different seeds diverge
  GenerateOptions o;
  o.max_new_tokens = 16;
  auto run = [&](uint64_t seed) {
    TokenSampler sampler(s, seed);
    return generate(*decoder, prompt, o, sampler).tokens;
  };
  const std::vector<int32_t> a = run(42);
  CHECK(run(42) == a);
  CHECK(run(43) != a);
}

TEST_CASE("the sampler draws softmax(logits / temperature) within top-k and top-p") {
  // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1 for ids 3, 0, 2, 1.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.2f),
                                     std::log(0.4f)};
  auto frequencies = [&](const SamplingOptions& o, uint64_t seed) {
    TokenSampler s(o, seed);
    std::vector<int> count(4, 0);
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) ++count[s.next(logits.data(), 4)];
    std::vector<double> f(4);
    for (int i = 0; i < 4; ++i) f[i] = static_cast<double>(count[i]) / draws;
    return f;
  };
  SECTION("temperature 1: the softmax") {
    const std::vector<double> f = frequencies({1.0, 0, 1.0}, 7);
    const double want[] = {0.3, 0.1, 0.2, 0.4};
    for (int i = 0; i < 4; ++i) CHECK(std::fabs(f[i] - want[i]) < 0.01);
  }
  SECTION("temperature 0.5 squares the odds") {
    const std::vector<double> f = frequencies({0.5, 0, 1.0}, 8);
    const double z = 0.09 + 0.01 + 0.04 + 0.16;
    const double want[] = {0.09 / z, 0.01 / z, 0.04 / z, 0.16 / z};
    for (int i = 0; i < 4; ++i) CHECK(std::fabs(f[i] - want[i]) < 0.01);
  }
  SECTION("top-k 2 renormalises over the two most likely") {
    const std::vector<double> f = frequencies({1.0, 2, 1.0}, 9);
    CHECK(f[1] == 0.0);
    CHECK(f[2] == 0.0);
    CHECK(std::fabs(f[3] - 0.4 / 0.7) < 0.01);
  }
  SECTION("top-p 0.75 keeps the fewest tokens holding 75%: ids 3, 0, 2") {
    const std::vector<double> f = frequencies({1.0, 0, 0.75}, 10);
    CHECK(f[1] == 0.0);
    CHECK(std::fabs(f[2] - 0.2 / 0.9) < 0.01);
  }
  SECTION("temperature 0, top-k 1 and a tiny top-p are all greedy") {
    for (const SamplingOptions& o : {SamplingOptions{0.0, 0, 1.0}, SamplingOptions{1.0, 1, 1.0},
                                     SamplingOptions{1.0, 0, 1e-6}})
      CHECK(frequencies(o, 11)[3] == 1.0);
  }
  SECTION("ties go to the lowest id") {
    const float flat[] = {1.0f, 2.0f, 2.0f, 0.5f};
    TokenSampler g({0.0, 0, 1.0}, 1);
    CHECK(g.next(flat, 4) == 1);
    TokenSampler k1({1.0, 1, 1.0}, 1);
    CHECK(k1.next(flat, 4) == 1);
  }
  SECTION("out-of-range settings are refused") {
    CHECK_THROWS_AS(TokenSampler({-1.0, 0, 1.0}, 1), UsageError);
    CHECK_THROWS_AS(TokenSampler({1.0, -2, 1.0}, 1), UsageError);
    CHECK_THROWS_AS(TokenSampler({1.0, 0, 0.0}, 1), UsageError);
    CHECK_THROWS_AS(TokenSampler({1.0, 0, 1.5}, 1), UsageError);
    CHECK_THROWS_AS(TokenSampler({NAN, 0, 1.0}, 1), UsageError);
  }
}
