// Inference with a key/value cache: the model of SPEC.md run one sequence at a time for text
// generation. Feeding tokens appends their keys and values to the cache, so each new token costs
// one position's work instead of a forward over the whole prefix.
//
// A decoder computes, at every position, what the training forward computes there: the CPU
// decoder shares the reference's row kernels (its logits equal CpuTransformer's bit for bit), the
// CUDA decoder runs the replica's kernels and precision (bf16 or fp16 weights and activations, fp32
// statistics and logits) with an attention kernel for a few queries over a long cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"

namespace trainer {

class Decoder {
 public:
  virtual ~Decoder() = default;

  virtual const ModelConfig& config() const = 0;
  // Positions already in the cache; the next token fed goes to this position.
  virtual int64_t position() const = 0;
  // Empties the cache: the next feed starts a new sequence at position 0.
  virtual void reset() = 0;

  // Appends `count` >= 1 tokens at positions position() .. position() + count - 1 and returns
  // fp32 logits in host memory: those predicting the token after the last one (vocab values), or
  // with all_positions those after each fed token ((count, vocab) row-major). Valid until the
  // next call. Throws UsageError when a token id is outside the vocabulary or the sequence would
  // pass config().ctx positions (RoPE was trained on positions below ctx only).
  virtual const float* feed(const int32_t* ids, int64_t count, bool all_positions = false) = 0;

  // One line for the start-up log: device, precision, cache size.
  virtual std::string describe() const = 0;
};

// What every feed() checks first: count >= 1, ids inside the vocabulary, and positions below ctx
// (UsageError naming the problem).
void check_feed(const ModelConfig& c, int64_t position, const int32_t* ids, int64_t count);

// The CPU decoder (fp32) over a flat fp32 parameter buffer of ParamLayout(c), which is copied.
std::unique_ptr<Decoder> make_cpu_decoder(const ModelConfig& c, const float* params);

// The CUDA decoder on GPU `device`: parameters rounded to bf16 (Precision::kBf16) or fp16
// (kFp16), or kept fp32 (kFp32; kTf32 is refused). Throws UsageError in a build without CUDA, or
// when the weights and the cache do not fit in the GPU's free memory.
std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig& c, const float* params,
                                           Precision precision, int device);

}  // namespace trainer
