// The CPU reference Transformer LM of SPEC.md: forward, loss and backward over a flat parameter
// buffer laid out by ParamLayout. Templated on the scalar: float is the training reference, double
// is for gradient checks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layout.h"
#include "model/recompute.h"
#include "model/replica.h"

namespace trainer::cpu {

template <typename T>
class CpuTransformer {
 public:
  // Allocates every activation and backward scratch buffer once, for max_batch rows of c.ctx.
  // With recompute kFfn or kBlock, what backward recomputes (model/recompute.h) has one buffer for
  // a single block, shared by all blocks, instead of one per block.
  CpuTransformer(const ModelConfig& c, int64_t max_batch, Recompute recompute = Recompute::kNone);

  // Runs the model on B rows of `seq` token ids (row-major (B, seq)); `params` is a flat buffer of
  // ParamLayout(c). Keeps what backward needs and copies the ids. Returns the mean token loss over
  // the B*seq positions; with targets == nullptr only the logits are computed and 0 is returned.
  // Throws UsageError for seq > ctx, B > max_batch or a token id outside the vocabulary. `need` is
  // told before each part of `params` is first read (see ParamsNeededFn).
  T forward(const T* params, const int32_t* inputs, const int32_t* targets, int64_t B, int64_t seq,
            const ParamsNeededFn& need = {});

  // (B, seq, vocab) logits of the last forward.
  const T* logits() const { return logits_.data(); }

  // grads += scale * d(sum of the token losses of the last forward) / d params, accumulated into
  // the flat buffer `grads` (same layout as params). Tensor i of layout().tensors() is final when
  // ready(i) is called; calls come once per tensor in increasing i, which is the order backward
  // computes them: lm_head, ln_final, each block from the last, token_embeddings.
  // `params` must be the buffer the last forward used, still holding the values it read: the
  // recomputation of model/recompute.h rereads them. Recomputing announces nothing and gives the
  // same gradients, bit for bit, as Recompute::kNone.
  void backward(const T* params, T* grads, T scale, const GradReadyFn& ready);

  // Bytes of everything this object allocated: activations kept for backward, the recompute
  // buffer of one block, and backward scratch.
  int64_t activation_bytes() const;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t max_batch() const { return max_batch_; }
  Recompute recompute() const { return recompute_; }

 private:
  // Offsets (into the flat buffers) and indices (into layout().tensors()) of one block's tensors.
  struct BlockParams {
    int64_t ln1, q, k, v, o, ln2, w1, w2, w3;
    int i_ln1, i_q, i_k, i_v, i_o, i_ln2, i_w1, i_w2, i_w3;
  };
  // What a block's backward needs, all for the rows of the last forward. A per-block BlockActs
  // holds only what the recompute mode keeps; the other vectors are left empty.
  struct BlockActs {
    std::vector<T> x;           // (n, d)  block input (residual stream)
    std::vector<T> ln1, rstd1;  // (n, d), (n)
    std::vector<T> q, k, v;     // (n, d)  q and k after RoPE
    std::vector<T> probs;       // (B, H, seq, seq)
    std::vector<T> att;         // (n, d)  attention output before output_proj
    std::vector<T> h;           // (n, d)  x + attention
    std::vector<T> ln2, rstd2;  // (n, d), (n)
    std::vector<T> a, b, g;     // (n, f)  w1 x, w3 x, silu(a) * b
  };
  // Where block l's activations are: in acts_[l] for what the mode keeps, in recomputed_ for the
  // rest.
  struct BlockView {
    T *x, *ln1, *rstd1, *q, *k, *v, *probs, *att, *h, *ln2, *rstd2, *a, *b, *g;
  };
  BlockView view(size_t l);

  // Block l's forward on the rows of the last forward, in two parts that backward reruns: ln1 to h,
  // then ln2 to g. Announces nothing.
  void attention_half_forward(const T* params, size_t l, const BlockView& a);
  void ffn_inputs_forward(const T* params, size_t l, const BlockView& a);

  ModelConfig cfg_;
  ParamLayout layout_;
  int64_t max_batch_;
  Recompute recompute_;
  std::vector<BlockParams> blocks_;
  int64_t off_emb_, off_lnf_, off_head_;
  int i_emb_, i_lnf_, i_head_;

  // The last forward.
  int64_t B_ = 0, seq_ = 0;
  bool have_targets_ = false;
  std::vector<int32_t> inputs_, targets_;
  std::vector<BlockActs> acts_;
  BlockActs recomputed_;            // kFfn, kBlock: what is not kept, for one block at a time
  size_t recomputed_block_ = 0;     // the block recomputed_ holds (the last one after forward)
  std::vector<T> xf_;               // (n, d) output of the last block
  std::vector<T> lnf_, rstdf_;      // (n, d), (n)
  std::vector<T> logits_, losses_;  // (n, V), (n)

  // Backward scratch.
  std::vector<T> dres_;          // (n, d) gradient of the residual stream
  std::vector<T> dln_, datt_;    // (n, d)
  std::vector<T> dq_, dk_, dv_;  // (n, d)
  std::vector<T> dg_, da_, db_;  // (n, f)
  std::vector<T> dlogits_;       // (n, V)
};

}  // namespace trainer::cpu
