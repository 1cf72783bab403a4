#include "model/cpu/transformer.h"

#include <string>

#include "core/error.h"
#include "model/cpu/ops.h"

namespace trainer::cpu {
namespace {

constexpr double kRmsEps = 1e-5;
constexpr double kRopeTheta = 10000.0;

// dst += src over n elements (memory bound: parallel only when large).
template <typename T>
void add_into(T* dst, const T* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 18))
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

template <typename T>
CpuTransformer<T>::CpuTransformer(const ModelConfig& c, int64_t max_batch, Recompute recompute)
    : cfg_(c), layout_(c), max_batch_(max_batch), recompute_(recompute) {
  validate(c);
  if (max_batch <= 0) usage_error("--batch must be positive (got {})", max_batch);
  layout_.locate("token_embeddings.weight", off_emb_, i_emb_);
  layout_.locate("ln_final.weight", off_lnf_, i_lnf_);
  layout_.locate("lm_head.weight", off_head_, i_head_);
  blocks_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    BlockParams& bp = blocks_[l];
    layout_.locate(p + "ln1.weight", bp.ln1, bp.i_ln1);
    layout_.locate(p + "attn.q_proj.weight", bp.q, bp.i_q);
    layout_.locate(p + "attn.k_proj.weight", bp.k, bp.i_k);
    layout_.locate(p + "attn.v_proj.weight", bp.v, bp.i_v);
    layout_.locate(p + "attn.output_proj.weight", bp.o, bp.i_o);
    layout_.locate(p + "ln2.weight", bp.ln2, bp.i_ln2);
    layout_.locate(p + "ffn.w1.weight", bp.w1, bp.i_w1);
    layout_.locate(p + "ffn.w2.weight", bp.w2, bp.i_w2);
    layout_.locate(p + "ffn.w3.weight", bp.w3, bp.i_w3);
  }

  const int64_t n = max_batch * c.ctx, d = c.d_model, f = c.d_ff, V = c.vocab;
  inputs_.resize(n);
  targets_.resize(n);
  auto alloc_attention_half = [&](BlockActs& a) {
    for (auto* v : {&a.ln1, &a.q, &a.k, &a.v, &a.att, &a.h}) v->resize(n * d);
    a.rstd1.resize(n);
    a.probs.resize(max_batch * c.n_heads * c.ctx * c.ctx);
  };
  auto alloc_ffn_inputs = [&](BlockActs& a) {
    a.ln2.resize(n * d);
    a.rstd2.resize(n);
    for (auto* v : {&a.a, &a.b, &a.g}) v->resize(n * f);
  };
  acts_.resize(c.n_layers);
  for (BlockActs& a : acts_) {
    a.x.resize(n * d);
    if (recompute != Recompute::kBlock) alloc_attention_half(a);
    if (recompute == Recompute::kNone) alloc_ffn_inputs(a);
  }
  if (recompute == Recompute::kBlock) alloc_attention_half(recomputed_);
  if (recompute != Recompute::kNone) alloc_ffn_inputs(recomputed_);
  xf_.resize(n * d);
  lnf_.resize(n * d);
  rstdf_.resize(n);
  logits_.resize(n * V);
  losses_.resize(n);
  for (auto* v : {&dres_, &dln_, &datt_, &dq_, &dk_, &dv_}) v->resize(n * d);
  for (auto* v : {&dg_, &da_, &db_}) v->resize(n * f);
  dlogits_.resize(n * V);
}

template <typename T>
int64_t CpuTransformer<T>::activation_bytes() const {
  int64_t elems = 0;
  auto count = [&](const BlockActs& a) {
    for (const auto* v : {&a.x, &a.ln1, &a.rstd1, &a.q, &a.k, &a.v, &a.probs, &a.att, &a.h, &a.ln2,
                          &a.rstd2, &a.a, &a.b, &a.g})
      elems += static_cast<int64_t>(v->size());
  };
  for (const BlockActs& a : acts_) count(a);
  count(recomputed_);
  for (const auto* v : {&xf_, &lnf_, &rstdf_, &logits_, &losses_, &dres_, &dln_, &datt_, &dq_, &dk_,
                        &dv_, &dg_, &da_, &db_, &dlogits_})
    elems += static_cast<int64_t>(v->size());
  return elems * static_cast<int64_t>(sizeof(T)) +
         static_cast<int64_t>((inputs_.size() + targets_.size()) * sizeof(int32_t));
}

template <typename T>
typename CpuTransformer<T>::BlockView CpuTransformer<T>::view(size_t l) {
  BlockActs& kept = acts_[l];
  BlockActs& attn = recompute_ == Recompute::kBlock ? recomputed_ : kept;
  BlockActs& ffn = recompute_ == Recompute::kNone ? kept : recomputed_;
  return {kept.x.data(),    attn.ln1.data(),   attn.rstd1.data(), attn.q.data(), attn.k.data(),
          attn.v.data(),    attn.probs.data(), attn.att.data(),   attn.h.data(), ffn.ln2.data(),
          ffn.rstd2.data(), ffn.a.data(),      ffn.b.data(),      ffn.g.data()};
}

template <typename T>
void CpuTransformer<T>::attention_half_forward(const T* params, size_t l, const BlockView& a) {
  const BlockParams& p = blocks_[l];
  const int64_t n = B_ * seq_, d = cfg_.d_model, dh = cfg_.head_dim();
  const T theta = T(kRopeTheta);
  rmsnorm_forward(a.x, params + p.ln1, a.ln1, a.rstd1, n, d, T(kRmsEps));
  linear_forward(a.ln1, params + p.q, a.q, n, d, d);
  linear_forward(a.ln1, params + p.k, a.k, n, d, d);
  linear_forward(a.ln1, params + p.v, a.v, n, d, d);
  rope_forward(a.q, n, seq_, d, dh, theta);
  rope_forward(a.k, n, seq_, d, dh, theta);
  attention_forward(a.q, a.k, a.v, a.att, a.probs, B_, seq_, cfg_.n_heads, dh);
  linear_forward(a.att, params + p.o, a.h, n, d, d);
  add_into(a.h, a.x, n * d);  // h = x + attn
}

template <typename T>
void CpuTransformer<T>::ffn_inputs_forward(const T* params, size_t l, const BlockView& a) {
  const BlockParams& p = blocks_[l];
  const int64_t n = B_ * seq_, d = cfg_.d_model, f = cfg_.d_ff;
  rmsnorm_forward(a.h, params + p.ln2, a.ln2, a.rstd2, n, d, T(kRmsEps));
  linear_forward(a.ln2, params + p.w1, a.a, n, d, f);
  linear_forward(a.ln2, params + p.w3, a.b, n, d, f);
  swiglu_forward(a.a, a.b, a.g, n * f);
}

// ------------------------------------------------------------------------------------------------
// Forward (pre-norm):  x_0 = E[ids];  per block:  h = x + Wo attn(rope(Wq ln1(x)), rope(Wk ln1(x)),
// Wv ln1(x));  x' = h + W2 (silu(W1 ln2(h)) * W3 ln2(h));  logits = Whead lnf(x_L);
// loss = mean over positions of logsumexp(logits) - logits[target].
// ------------------------------------------------------------------------------------------------
template <typename T>
T CpuTransformer<T>::forward(const T* params, const int32_t* inputs, const int32_t* targets,
                             int64_t B, int64_t seq, const ParamsNeededFn& need) {
  if (B <= 0 || B > max_batch_)
    usage_error("micro-batch of {} sequences does not fit the model's buffers for 1..{} (--batch)",
                B, max_batch_);
  if (seq <= 0 || seq > cfg_.ctx)
    usage_error("sequence length {} is outside 1..{} (--ctx)", seq, cfg_.ctx);
  TRAINER_CHECK(params != nullptr && inputs != nullptr, "forward needs params and inputs");
  const int64_t n = B * seq, d = cfg_.d_model, f = cfg_.d_ff, V = cfg_.vocab;
  for (int64_t i = 0; i < n; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V)
      usage_error(
          "input token id {} at row {} position {} is outside the vocabulary 0..{} (--vocab)",
          inputs[i], i / seq, i % seq, V - 1);
    if (targets && (targets[i] < 0 || targets[i] >= V))
      usage_error(
          "target token id {} at row {} position {} is outside the vocabulary 0..{} (--vocab)",
          targets[i], i / seq, i % seq, V - 1);
  }
  B_ = B;
  seq_ = seq;
  have_targets_ = targets != nullptr;
  std::copy_n(inputs, n, inputs_.data());
  if (targets) std::copy_n(targets, n, targets_.data());

  announce(need, off_emb_);
  embedding_forward(inputs, params + off_emb_, acts_[0].x.data(), n, d);  // validate(): >= 1 block
  for (size_t l = 0; l < blocks_.size(); ++l) {
    announce(need, layout_.block_offset(static_cast<int>(l)));
    const BlockView a = view(l);
    T* x_out = l + 1 < blocks_.size() ? acts_[l + 1].x.data() : xf_.data();
    attention_half_forward(params, l, a);
    ffn_inputs_forward(params, l, a);
    linear_forward(a.g, params + blocks_[l].w2, x_out, n, f, d);
    add_into(x_out, a.h, n * d);  // x' = h + ffn
  }
  recomputed_block_ = blocks_.size() - 1;
  announce(need, layout_.head_offset());
  rmsnorm_forward(xf_.data(), params + off_lnf_, lnf_.data(), rstdf_.data(), n, d, T(kRmsEps));
  linear_forward(lnf_.data(), params + off_head_, logits_.data(), n, d, V);
  if (!targets) return T(0);
  cross_entropy_forward(logits_.data(), targets, losses_.data(), n, V);
  double sum = 0;  // in double so the mean does not depend on n's rounding
  for (int64_t i = 0; i < n; ++i) sum += losses_[i];
  return static_cast<T>(sum / static_cast<double>(n));
}

// ------------------------------------------------------------------------------------------------
// Backward, in the reverse order of forward. dres carries d(loss)/d(residual stream); a block's
// two RMSNorm backwards add their input gradient into it, which together with the identity of the
// skip connection gives d/dx of the block input. What the recompute mode did not keep is recomputed
// just before the block's backward, unless recomputed_ still holds that block.
// ------------------------------------------------------------------------------------------------
template <typename T>
void CpuTransformer<T>::backward(const T* params, T* grads, T scale, const GradReadyFn& ready) {
  TRAINER_CHECK(B_ > 0, "backward called before forward");
  TRAINER_CHECK(have_targets_, "backward needs a forward with targets");
  TRAINER_CHECK(params != nullptr && grads != nullptr, "backward needs params and grads");
  const int64_t n = B_ * seq_, d = cfg_.d_model, f = cfg_.d_ff, V = cfg_.vocab, H = cfg_.n_heads,
                dh = cfg_.head_dim();
  const T theta = T(kRopeTheta);
  int next_ready = 0;  // tensors [0, next_ready) have been reported
  auto done = [&](int index) {
    TRAINER_CHECK(index == next_ready, "gradient of tensor {} finished out of order (expected {})",
                  index, next_ready);
    ++next_ready;
    if (ready) ready(index);
  };

  // Loss and head: dlogits = scale (softmax - onehot); dlnf = dlogits Whead; dWhead += dlogits^T
  // lnf.
  cross_entropy_backward(logits_.data(), targets_.data(), dlogits_.data(), n, V, scale);
  linear_backward(lnf_.data(), params + off_head_, dlogits_.data(), dln_.data(), grads + off_head_,
                  n, d, V);
  done(i_head_);
  std::fill_n(dres_.data(), n * d, T(0));
  rmsnorm_backward(xf_.data(), params + off_lnf_, rstdf_.data(), dln_.data(), dres_.data(),
                   grads + off_lnf_, n, d);
  done(i_lnf_);

  for (size_t l = blocks_.size(); l-- > 0;) {
    const BlockParams& p = blocks_[l];
    const BlockView a = view(l);
    if (recompute_ != Recompute::kNone && recomputed_block_ != l) {
      if (recompute_ == Recompute::kBlock) attention_half_forward(params, l, a);
      ffn_inputs_forward(params, l, a);
      recomputed_block_ = l;
    }
    // Feed-forward half: dg = dx' W2; (da, db) from the gate; dln2 = da W1 + db W3.
    linear_backward(a.g, params + p.w2, dres_.data(), dg_.data(), grads + p.w2, n, f, d);
    done(p.i_w2);
    swiglu_backward(a.a, a.b, dg_.data(), da_.data(), db_.data(), n * f);
    linear_backward(a.ln2, params + p.w3, db_.data(), dln_.data(), grads + p.w3, n, d, f);
    done(p.i_w3);
    linear_backward(a.ln2, params + p.w1, da_.data(), static_cast<T*>(nullptr), grads + p.w1, n, d,
                    f);
    gemm<T>(false, false, n, d, f, T(1), da_.data(), f, params + p.w1, d, T(1), dln_.data(), d);
    done(p.i_w1);
    // dres becomes dL/dh.
    rmsnorm_backward(a.h, params + p.ln2, a.rstd2, dln_.data(), dres_.data(), grads + p.ln2, n, d);
    done(p.i_ln2);
    // Attention half: datt = dh Wo; attention and RoPE backward; dln1 = dq Wq + dk Wk + dv Wv.
    linear_backward(a.att, params + p.o, dres_.data(), datt_.data(), grads + p.o, n, d, d);
    done(p.i_o);
    attention_backward(a.q, a.k, a.v, a.probs, datt_.data(), dq_.data(), dk_.data(), dv_.data(), B_,
                       seq_, H, dh);
    rope_backward(dq_.data(), n, seq_, d, dh, theta);
    rope_backward(dk_.data(), n, seq_, d, dh, theta);
    linear_backward(a.ln1, params + p.v, dv_.data(), dln_.data(), grads + p.v, n, d, d);
    done(p.i_v);
    linear_backward(a.ln1, params + p.k, dk_.data(), static_cast<T*>(nullptr), grads + p.k, n, d,
                    d);
    gemm<T>(false, false, n, d, d, T(1), dk_.data(), d, params + p.k, d, T(1), dln_.data(), d);
    done(p.i_k);
    linear_backward(a.ln1, params + p.q, dq_.data(), static_cast<T*>(nullptr), grads + p.q, n, d,
                    d);
    gemm<T>(false, false, n, d, d, T(1), dq_.data(), d, params + p.q, d, T(1), dln_.data(), d);
    done(p.i_q);
    // dres becomes dL/dx of this block's input.
    rmsnorm_backward(a.x, params + p.ln1, a.rstd1, dln_.data(), dres_.data(), grads + p.ln1, n, d);
    done(p.i_ln1);
  }
  embedding_backward(inputs_.data(), dres_.data(), grads + off_emb_, n, d);
  done(i_emb_);
  TRAINER_CHECK(next_ready == static_cast<int>(layout_.tensors().size()),
                "backward reported {} of {} tensors", next_ready, layout_.tensors().size());
}

template class CpuTransformer<float>;
template class CpuTransformer<double>;

}  // namespace trainer::cpu
