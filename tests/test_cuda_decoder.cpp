// GPU tests of the CUDA decoder against the CPU reference: in fp32 its logits match the CPU
// decoder's at every position however the tokens are fed (chunks, single tokens), and greedy
// decoding is the CPU full forward's argmax at every position; in bf16 and fp16 the logits stay
// within 6% of their scale of the CPU's (same rounded weights) and greedy decoding picks the CPU's
// argmax wherever that error cannot flip it; feeding a prompt at once or token by token gives the
// same logits; a missing GPU, tf32 and bad ids are refused. Skipped (exit 77) without a GPU.
#ifdef TRAINER_WITH_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/f16.h"
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

// Heads of 32 and 64 channels (the second like the presets'), a vocabulary that is not a
// multiple of 8 (padded logits rows).
ModelConfig config(int64_t d_model, int64_t heads) {
  ModelConfig c = preset("tiny");
  c.d_model = d_model;
  c.n_heads = heads;
  c.d_ff = 3 * d_model;
  c.vocab = 997;
  c.ctx = 96;
  return c;
}

double max_abs(const float* x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// Greedy generation on the GPU, then the CPU full forward over the generated sequence: the GPU
// logits at each step, the CPU's logits at the same position, and the GPU's pick.
struct GreedyRun {
  std::vector<int32_t> picks;
  std::vector<std::vector<float>> gpu, cpu;
};

GreedyRun greedy_run(const ModelConfig& c, const std::vector<float>& p, Precision precision,
                     const std::vector<int32_t>& prompt) {
  GreedyRun r;
  const auto gpu = make_cuda_decoder(c, p.data(), precision, 0);
  const float* logits = gpu->feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> seq = prompt;
  while (true) {
    r.gpu.emplace_back(logits, logits + c.vocab);
    r.picks.push_back(static_cast<int32_t>(std::max_element(logits, logits + c.vocab) - logits));
    if (gpu->position() == c.ctx) break;
    seq.push_back(r.picks.back());
    logits = gpu->feed(&r.picks.back(), 1);
  }
  cpu::CpuTransformer<float> full(c, 1);
  full.forward(p.data(), seq.data(), nullptr, 1, c.ctx);
  for (size_t i = 0; i < r.picks.size(); ++i) {
    const float* row = full.logits() + (prompt.size() - 1 + i) * c.vocab;
    r.cpu.emplace_back(row, row + c.vocab);
  }
  return r;
}

}  // namespace

TEST_CASE("fp32 CUDA decoder matches the CPU decoder at every position") {
  for (const ModelConfig& c : {config(128, 4), config(256, 4)}) {
    const ParamLayout L(c);
    const std::vector<float> p = spread_params(L, 5, 6.0f, 2.0f);
    const int64_t T = c.ctx, V = c.vocab;
    const std::vector<int32_t> ids = token_ids(T, V, 1);
    const auto cpu = make_cpu_decoder(c, p.data());
    const float* all = cpu->feed(ids.data(), T, true);
    const std::vector<float> want(all, all + T * V);
    const auto gpu = make_cuda_decoder(c, p.data(), Precision::kFp32, 0);
    int64_t pos = 0;
    for (int64_t n : {7, 1, 1, 30, 1, 56}) {
      const float* got = gpu->feed(ids.data() + pos, n, true);
      for (int64_t r = 0; r < n; ++r) {
        const float* w = want.data() + (pos + r) * V;
        const double scale = max_abs(w, V);
        double err = 0;
        for (int64_t v = 0; v < V; ++v)
          err = std::max(err, std::fabs(double(got[r * V + v]) - w[v]));
        INFO("d_model " << c.d_model << " position " << pos + r << " max error " << err
                        << " of logit scale " << scale);
        CHECK(err <= 2e-4 * scale);
      }
      pos += n;
    }
    CHECK(gpu->position() == T);
    CHECK_THROWS_AS(gpu->feed(ids.data(), 1), UsageError);
  }
}

TEST_CASE("fp32 greedy decoding on the GPU is the CPU full forward's argmax at every position") {
  const ModelConfig c = config(256, 4);
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 9, 6.0f, 2.0f);
  const GreedyRun r = greedy_run(c, p, Precision::kFp32, token_ids(8, c.vocab, 2));
  REQUIRE(r.picks.size() == static_cast<size_t>(c.ctx - 8 + 1));
  for (size_t i = 0; i < r.picks.size(); ++i) {
    const std::vector<float>& row = r.cpu[i];
    INFO("generated token " << i);
    CHECK(r.picks[i] == std::max_element(row.begin(), row.end()) - row.begin());
  }
}

namespace {

// The CPU runs the GPU's 16-bit-rounded weights in fp32; what differs is the 16-bit activations.
// At each position e = max |GPU logit - CPU logit|; where the CPU's top-2 gap exceeds 2e the pick
// must be the CPU's argmax, and e must stay a small part of the logits' scale.
void check_greedy_16bit(Precision precision) {
  const bool fp16 = precision == Precision::kFp16;
  const ModelConfig c = config(256, 4);
  const ParamLayout L(c);
  std::vector<float> p = spread_params(L, 9, 6.0f, 2.0f);
  for (float& x : p)
    x = fp16 ? f16_bits_to_f32(f32_to_f16_bits(x)) : bf16_bits_to_f32(f32_to_bf16_bits(x));
  const GreedyRun r = greedy_run(c, p, precision, token_ids(8, c.vocab, 2));
  int decisive = 0, exact = 0;
  double worst = 0;
  for (size_t i = 0; i < r.picks.size(); ++i) {
    const std::vector<float>& row = r.cpu[i];
    double e = 0;
    for (int64_t v = 0; v < c.vocab; ++v) e = std::max(e, std::fabs(double(r.gpu[i][v]) - row[v]));
    const double scale = max_abs(row.data(), c.vocab);
    worst = std::max(worst, e / scale);
    std::vector<float> top(row);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
    const auto best = std::max_element(row.begin(), row.end()) - row.begin();
    INFO("generated token " << i << ": GPU " << r.picks[i] << " CPU argmax " << best
                            << ", 16-bit error " << e << " of scale " << scale << ", CPU top-2 gap "
                            << top[0] - top[1]);
    CHECK(e <= 0.06 * scale);
    if (top[0] - top[1] > 2 * e) {
      ++decisive;
      CHECK(r.picks[i] == best);
    }
    exact += r.picks[i] == best;
  }
  const char* name = fp16 ? "fp16" : "bf16";
  INFO(exact << " of " << r.picks.size() << " picks are the CPU argmax; " << decisive
             << " positions decisive; worst " << name << " error " << worst
             << " of the logit scale");
  CHECK(decisive >= static_cast<int>(r.picks.size()) / 2);  // the check above has teeth
  WARN(name << " greedy: " << exact << "/" << r.picks.size() << " = CPU argmax, " << decisive
            << " decisive, worst error " << worst);
}

}  // namespace

TEST_CASE("bf16 greedy decoding picks the CPU's argmax wherever bf16 error cannot flip it") {
  check_greedy_16bit(Precision::kBf16);
}

TEST_CASE("fp16 greedy decoding picks the CPU's argmax wherever fp16 error cannot flip it") {
  check_greedy_16bit(Precision::kFp16);
}

TEST_CASE("bf16 decoder: a prompt fed at once or token by token gives the same logits") {
  const ModelConfig c = config(256, 4);
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 4, 6.0f, 2.0f);
  const std::vector<int32_t> ids = token_ids(40, c.vocab, 3);
  const auto gpu = make_cuda_decoder(c, p.data(), Precision::kBf16, 0);
  const float* at_once = gpu->feed(ids.data(), 40, true);
  const std::vector<float> want(at_once, at_once + 40 * c.vocab);
  gpu->reset();
  for (int64_t i = 0; i < 40; ++i) {
    const float* got = gpu->feed(ids.data() + i, 1);
    const float* w = want.data() + i * c.vocab;
    double err = 0;
    for (int64_t v = 0; v < c.vocab; ++v) err = std::max(err, std::fabs(double(got[v]) - w[v]));
    INFO("position " << i << " max difference " << err);
    CHECK(err <= 0.03 * max_abs(w, c.vocab));
  }
}

TEST_CASE("CUDA decoder refuses a missing GPU and bad token ids") {
  const ModelConfig c = config(128, 4);
  const ParamLayout L(c);
  const std::vector<float> p = spread_params(L, 1, 6.0f, 2.0f);
  CHECK_THROWS_AS(make_cuda_decoder(c, p.data(), Precision::kBf16, 99), UsageError);
  CHECK_THROWS_AS(make_cuda_decoder(c, p.data(), Precision::kTf32, 0), UsageError);
  const auto gpu = make_cuda_decoder(c, p.data(), Precision::kBf16, 0);
  const int32_t bad[] = {1, -1};
  CHECK_THROWS_AS(gpu->feed(bad, 2), UsageError);
  CHECK(gpu->position() == 0);
}

#endif  // TRAINER_WITH_CUDA
