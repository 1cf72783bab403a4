// What forward keeps for backward (--recompute): activation recompute (gradient checkpointing)
// trades a second forward of part of each block, run in backward, for activation memory. Backward
// recomputes with the same kernels, in the same order, on the same inputs as forward, so loss and
// gradients are bit-identical in every mode. The final norm, the logits and the token losses are
// kept in every mode.
#pragma once

#include <string>

namespace trainer {

enum class Recompute {
  // Every activation backward needs is kept, for every block.
  kNone,
  // The feed-forward half's intermediates (ln2 and its rstd, a = W1 ln2, b = W3 ln2,
  // g = silu(a) * b) are not kept; backward recomputes them from h (the block's residual stream
  // after attention), which is kept.
  kFfn,
  // Only each block's input x (the residual stream) is kept; just before a block's backward, the
  // whole block's forward (ln1, q, k, v with RoPE, attention probs, att, h, ln2, a, b, g) is
  // recomputed from x.
  kBlock,
};

// "none", "ffn" or "block"; anything else throws UsageError naming --recompute and the choices.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute r);

}  // namespace trainer
