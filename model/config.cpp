#include "model/config.h"

#include <fmt/format.h>

#include <map>

#include "core/error.h"

namespace trainer {
namespace {

struct Preset {
  int64_t d_model, d_ff, n_layers, n_heads;
};

const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> table = {
      {"tiny", {128, 512, 2, 4}},       {"small", {768, 3072, 12, 12}},
      {"medium", {1024, 4096, 24, 16}}, {"large", {1280, 5120, 36, 20}},
      {"xl", {1600, 6400, 48, 25}},     {"2.7B", {2560, 10240, 32, 32}},
  };
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "small", "medium", "large", "xl", "2.7B"};
}

ModelConfig preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end())
    usage_error("unknown model preset '{}' (known: {})", name, fmt::join(preset_names(), ", "));
  ModelConfig c;
  c.d_model = it->second.d_model;
  c.d_ff = it->second.d_ff;
  c.n_layers = it->second.n_layers;
  c.n_heads = it->second.n_heads;
  return c;
}

void validate(const ModelConfig& c) {
  if (c.vocab <= 0) usage_error("--vocab must be positive (got {})", c.vocab);
  // Token ids travel as int32 and the CUDA loss kernel indexes a row of logits with int.
  if (c.vocab >= (int64_t{1} << 30))
    usage_error("--vocab {} is too large: at most 2^30 - 1 = {}", c.vocab, (int64_t{1} << 30) - 1);
  if (c.d_model <= 0) usage_error("--d-model must be positive (got {})", c.d_model);
  if (c.d_ff <= 0) usage_error("--d-ff must be positive (got {})", c.d_ff);
  if (c.n_layers <= 0) usage_error("--layers must be positive (got {})", c.n_layers);
  if (c.n_heads <= 0) usage_error("--heads must be positive (got {})", c.n_heads);
  if (c.ctx <= 0) usage_error("--ctx must be positive (got {})", c.ctx);
  // Far beyond any model this runtime trains, and small enough that the counts below cannot
  // overflow: 2^40 parameters is 4 TiB of fp32 weights.
  if (c.d_model > (1 << 20) || c.d_ff > (1 << 22) || c.n_layers > (1 << 14))
    usage_error("--d-model {} / --d-ff {} / --layers {} exceed the limits 2^20 / 2^22 / 2^14",
                c.d_model, c.d_ff, c.n_layers);
  if (param_count(c) > (int64_t{1} << 40))
    usage_error("the model would have {:.3g} parameters, more than 2^40", double(param_count(c)));
  if (c.d_model % c.n_heads != 0)
    usage_error("--heads {} does not divide --d-model {}", c.n_heads, c.d_model);
  if (c.head_dim() % 2 != 0)
    usage_error("head dimension {} (d_model {} / heads {}) is odd; RoPE rotates pairs",
                c.head_dim(), c.d_model, c.n_heads);
}

int64_t matmul_param_count(const ModelConfig& c) {
  const int64_t per_layer = 4 * c.d_model * c.d_model + 3 * c.d_model * c.d_ff;
  return c.n_layers * per_layer + c.vocab * c.d_model;  // + lm_head
}

int64_t param_count(const ModelConfig& c) {
  return matmul_param_count(c) + c.vocab * c.d_model  // token embeddings
         + c.n_layers * 2 * c.d_model + c.d_model;    // RMSNorm gains
}

double flops_per_token(const ModelConfig& c, int64_t ctx) {
  return 6.0 * static_cast<double>(matmul_param_count(c)) +
         6.0 * static_cast<double>(c.n_layers * c.d_model * ctx);
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

double peak_tflops(const std::string& gpu_name, Precision p) {
  struct Peak {
    const char* name_part;
    double bf16, tf32, fp32;  // the fp16 tensor-core peak equals bf16's
  };
  // Most specific names first: "H100 PCIe" and "H100 NVL" also contain "H100"; "H200" matches
  // the GH200 too.
  static const Peak kPeaks[] = {{"H100 PCIe", 756, 378, 51},
                                {"H100 NVL", 835, 418, 60},
                                {"H100", 989, 494, 67},
                                {"H200", 989, 494, 67},
                                {"A100", 312, 156, 19.5}};
  for (const Peak& k : kPeaks) {
    if (gpu_name.find(k.name_part) == std::string::npos) continue;
    switch (p) {
      case Precision::kBf16:
      case Precision::kFp16:
        return k.bf16;
      case Precision::kTf32:
        return k.tf32;
      case Precision::kFp32:
        return k.fp32;
    }
  }
  return 0;
}

std::string describe(const ModelConfig& c) {
  return fmt::format("vocab {} d_model {} d_ff {} layers {} heads {} (head dim {}) ctx {}", c.vocab,
                     c.d_model, c.d_ff, c.n_layers, c.n_heads, c.head_dim(), c.ctx);
}

}  // namespace trainer
