// Model configuration: the presets of SPEC.md and hand-set dimensions, with validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct ModelConfig {
  int64_t vocab = 10000;
  int64_t d_model = 128;
  int64_t d_ff = 512;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t ctx = 256;  // the longest sequence the model is trained on (RoPE positions 0..ctx-1)

  int64_t head_dim() const { return d_model / n_heads; }
  bool operator==(const ModelConfig&) const = default;
};

// The preset of that name ("tiny", "small", "medium", "large", "xl", "2.7B"); throws UsageError
// listing the known names when there is none.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// Throws UsageError naming the first bad dimension.
void validate(const ModelConfig& c);

// Number of trainable parameters (no padding).
int64_t param_count(const ModelConfig& c);

// Parameters that take part in matmuls (every Linear incl. lm_head; not the embedding or norms).
int64_t matmul_param_count(const ModelConfig& c);

// Training FLOPs per token as ANCHORS.md counts them: 6 * matmul params + 6 * layers * d * ctx.
double flops_per_token(const ModelConfig& c, int64_t ctx);

// kBf16 and kFp16 (CUDA only): 16-bit weights and activations on the tensor cores with fp32
// accumulation, fp32 gradients (bf16 ones only for --grad-transport ce --grad-reduce bf16), fp32
// master weights and AdamW state.
enum class Precision { kFp32, kTf32, kBf16, kFp16 };

// "fp32", "tf32", "bf16" or "fp16", as --precision spells it.
const char* precision_name(Precision p);

// Dense peak TFLOP/s of one GPU at this precision (the datasheet's figure without sparsity), for
// MFU: found by the CUDA device name for the H100 / H200 / GH200 (SXM), H100 PCIe and NVL, and
// A100; 0 for any other name. fp16 and bf16 share a peak on these GPUs.
double peak_tflops(const std::string& gpu_name, Precision p);

std::string describe(const ModelConfig& c);

}  // namespace trainer
