// The CPU decoder: CpuTransformer's forward, restricted to the new rows, with each block's keys
// and values kept for the positions already fed. The same row kernels run in the same order
// (model/cpu/ops.h), so the logits at every position equal the full forward's exactly.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/cpu/ops.h"
#include "model/decoder.h"
#include "model/layout.h"

namespace trainer::cpu {
namespace {

constexpr float kRmsEps = 1e-5f;
constexpr float kRopeTheta = 10000.0f;

class CpuDecoder final : public Decoder {
 public:
  CpuDecoder(const ModelConfig& c, const float* params)
      : cfg_(c), layout_(c), params_(params, params + layout_.total()) {
    validate(c);
    const int64_t n = c.ctx, d = c.d_model, f = c.d_ff;
    k_cache_.assign(c.n_layers, std::vector<float>(n * d));
    v_cache_.assign(c.n_layers, std::vector<float>(n * d));
    for (auto* v : {&x_, &ln_, &q_, &att_, &h_}) v->resize(n * d);
    rstd_.resize(n);
    for (auto* v : {&a_, &b_, &g_}) v->resize(n * f);
    for (int l = 0; l < c.n_layers; ++l) blocks_.push_back(layout_.block_offsets(l));
  }

  const ModelConfig& config() const override { return cfg_; }
  int64_t position() const override { return pos_; }
  void reset() override { pos_ = 0; }
  std::string describe() const override {
    return fmt::format("CPU decoder (fp32), key/value cache for {} positions", cfg_.ctx);
  }

  const float* feed(const int32_t* ids, int64_t count, bool all_positions) override {
    check_feed(cfg_, pos_, ids, count);
    const int64_t n = count, d = cfg_.d_model, f = cfg_.d_ff, V = cfg_.vocab, H = cfg_.n_heads,
                  dh = cfg_.head_dim(), p0 = pos_;
    const float* P = params_.data();
    embedding_forward(ids, P + layout_.find("token_embeddings.weight").offset, x_.data(), n, d);
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const BlockOffsets& b = blocks_[l];
      float* k = k_cache_[l].data() + p0 * d;
      float* v = v_cache_[l].data() + p0 * d;
      rmsnorm_forward(x_.data(), P + b.ln1, ln_.data(), rstd_.data(), n, d, kRmsEps);
      linear_forward(ln_.data(), P + b.q, q_.data(), n, d, d);
      linear_forward(ln_.data(), P + b.k, k, n, d, d);
      linear_forward(ln_.data(), P + b.v, v, n, d, d);
      rope_forward_at(q_.data(), n, p0, d, dh, kRopeTheta);
      rope_forward_at(k, n, p0, d, dh, kRopeTheta);
      attention_decode(q_.data(), k_cache_[l].data(), v_cache_[l].data(), att_.data(), n, p0, H,
                       dh);
      linear_forward(att_.data(), P + b.o, h_.data(), n, d, d);
      add_into(h_.data(), x_.data(), n * d);  // h = x + attn
      rmsnorm_forward(h_.data(), P + b.ln2, ln_.data(), rstd_.data(), n, d, kRmsEps);
      linear_forward(ln_.data(), P + b.w1, a_.data(), n, d, f);
      linear_forward(ln_.data(), P + b.w3, b_.data(), n, d, f);
      swiglu_forward(a_.data(), b_.data(), g_.data(), n * f);
      linear_forward(g_.data(), P + b.w2, x_.data(), n, f, d);
      add_into(x_.data(), h_.data(), n * d);  // x' = h + ffn
    }
    // The head only on the rows whose logits are wanted.
    const int64_t first = all_positions ? 0 : n - 1, rows = n - first;
    logits_.resize(rows * V);
    rmsnorm_forward(x_.data() + first * d, P + layout_.find("ln_final.weight").offset, ln_.data(),
                    rstd_.data(), rows, d, kRmsEps);
    linear_forward(ln_.data(), P + layout_.find("lm_head.weight").offset, logits_.data(), rows, d,
                   V);
    pos_ += n;
    return logits_.data();
  }

 private:
  static void add_into(float* dst, const float* src, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  ModelConfig cfg_;
  ParamLayout layout_;
  std::vector<float> params_;
  std::vector<BlockOffsets> blocks_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per block, (ctx, d) after RoPE (k)
  std::vector<float> x_, ln_, q_, att_, h_, rstd_, a_, b_, g_, logits_;
  int64_t pos_ = 0;
};

}  // namespace
}  // namespace trainer::cpu

namespace trainer {

std::unique_ptr<Decoder> make_cpu_decoder(const ModelConfig& c, const float* params) {
  TRAINER_CHECK(params != nullptr, "make_cpu_decoder: null parameters");
  return std::make_unique<cpu::CpuDecoder>(c, params);
}

}  // namespace trainer
