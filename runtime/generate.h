// Text generation on a Decoder: token sampling (temperature, top-k, top-p) and the decode loop.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/decoder.h"

namespace trainer {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the most likely token, the lowest id on a tie)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // then the fewest most likely whose probabilities sum to >= top_p
};

// UsageError naming the flag when a value is out of range.
void validate(const SamplingOptions& o);

// Draws tokens from logits. The n-th draw of a sampler depends only on (seed, n) and the logits,
// so a fixed seed reproduces a generation on any machine and thread count (given equal logits).
class TokenSampler {
 public:
  TokenSampler(const SamplingOptions& o, uint64_t seed);

  // The next token for `logits` (vocab values): softmax(logits / temperature) restricted to the
  // top-k, then to the top-p nucleus, renormalised, and sampled; ties in probability are ordered
  // by id.
  int32_t next(const float* logits, int64_t vocab);

 private:
  double uniform();  // in [0, 1), 53 random bits

  SamplingOptions o_;
  uint64_t seed_;
  uint64_t draws_ = 0;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  std::optional<int32_t> stop_token;  // end-of-text: generation stops after sampling it
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens (the stop token included when it came)
  bool stopped = false;         // sampled the stop token
  bool context_full = false;    // stopped at the model's context length
  double prefill_seconds = 0;   // feeding the prompt
  double decode_seconds = 0;    // every later step
};

// Feeds `prompt` (at least one token) from position 0 and samples up to max_new_tokens, calling
// `on_token` with each as it is drawn. Stops early at the stop token or when the cache reaches
// the model's context.
GenerateResult generate(Decoder& decoder, const std::vector<int32_t>& prompt,
                        const GenerateOptions& o, TokenSampler& sampler,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace trainer
