#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/mix64.h"

namespace trainer {

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    usage_error("--temperature must be a finite number >= 0 (0 is greedy), got {}", o.temperature);
  if (o.top_k < 0) usage_error("--top-k must be >= 0 (0 keeps every token), got {}", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1))
    usage_error("--top-p must be in (0, 1] (1 keeps every token), got {}", o.top_p);
}

TokenSampler::TokenSampler(const SamplingOptions& o, uint64_t seed) : o_(o), seed_(seed) {
  validate(o);
}

double TokenSampler::uniform() {
  const uint64_t bits = mix64(mix64(seed_ + kGolden) + (++draws_) * kGolden);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t TokenSampler::next(const float* logits, int64_t vocab) {
  TRAINER_CHECK(vocab > 0, "sampling from an empty vocabulary");
  // Greedy draws no random number, so switching it on does not shift a seed's later draws.
  if (o_.temperature == 0)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  // Candidates by logit, descending, ties by id: the top-k first, sorted.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = o_.top_k > 0 ? std::min(o_.top_k, vocab) : vocab;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), before);
  order_.resize(k);
  // Softmax of logits / temperature over the candidates, in double.
  const double inv_t = 1.0 / o_.temperature, top = logits[order_[0]];
  probs_.resize(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += probs_[i] = std::exp((logits[order_[i]] - top) * inv_t);
  // The nucleus: the shortest prefix holding top_p of the mass (at least one token).
  int64_t keep = k;
  if (o_.top_p < 1) {
    double mass = 0;
    for (keep = 0; keep < k;) {
      mass += probs_[keep++];
      if (mass >= o_.top_p * sum) break;
    }
    sum = std::accumulate(probs_.begin(), probs_.begin() + keep, 0.0);
  }
  const double u = uniform() * sum;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (u < cum) return order_[i];
  }
  return order_[keep - 1];  // u rounded up to the sum
}

GenerateResult generate(Decoder& decoder, const std::vector<int32_t>& prompt,
                        const GenerateOptions& o, TokenSampler& sampler,
                        const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) usage_error("generation needs a prompt of at least one token");
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  GenerateResult r;
  const int64_t V = decoder.config().vocab, ctx = decoder.config().ctx;
  decoder.reset();
  auto t0 = Clock::now();
  const float* logits = decoder.feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  auto t1 = Clock::now();
  r.prefill_seconds = seconds(t0, t1);
  while (static_cast<int64_t>(r.tokens.size()) < o.max_new_tokens) {
    const int32_t token = sampler.next(logits, V);
    r.tokens.push_back(token);
    if (on_token) on_token(token);
    if (o.stop_token && token == *o.stop_token) {
      r.stopped = true;
      break;
    }
    if (static_cast<int64_t>(r.tokens.size()) == o.max_new_tokens) break;
    if (decoder.position() == ctx) {
      r.context_full = true;
      break;
    }
    logits = decoder.feed(&token, 1);
  }
  r.decode_seconds = seconds(t1, Clock::now());
  return r;
}

}  // namespace trainer
