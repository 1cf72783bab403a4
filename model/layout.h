// Where every named parameter lives in the flat buffers.
//
// Parameters, gradients and optimizer state are each one flat buffer; a named tensor is the view
// [offset, offset + numel) of it. Tensors are laid out in the order their gradients become final
// during backward (lm_head first, token_embeddings last), so a bucket of gradients, or a ZeRO-1
// shard, is a contiguous range. Every offset is a multiple of `kAlignElems` so that vectorised
// kernels and collectives can start at any tensor.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "model/config.h"

namespace trainer {

// Flat-buffer offsets of one block's tensors.
struct BlockOffsets {
  int64_t ln1, q, k, v, o, ln2, w1, w2, w3;
};

struct ParamTensor {
  std::string name;            // SPEC.md checkpoint key, e.g. "layers.3.ffn.w1.weight"
  std::vector<int64_t> shape;  // e.g. {d_ff, d_model}
  int64_t offset = 0;          // first element in the flat buffer
  int64_t numel = 0;
  int layer = -1;  // transformer block index, -1 for embedding / final norm / head
  Range range() const { return {offset, offset + numel}; }
};

class ParamLayout {
 public:
  static constexpr int64_t kAlignElems = 64;  // 256 bytes of fp32

  explicit ParamLayout(const ModelConfig& c);

  // Tensors in buffer order, which is the order their gradients become final in backward.
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // Tensors in SPEC.md's name order (the order of checkpoint keys).
  std::vector<const ParamTensor*> spec_order() const;
  // Index into tensors() of the tensor with this name; throws UsageError if there is none.
  int index_of(std::string_view name) const;
  const ParamTensor& find(std::string_view name) const { return tensors_[index_of(name)]; }
  // Both at once, as the backends keep them: the flat-buffer offset and the index that backward
  // reports as ready. Throws UsageError if there is no such tensor.
  void locate(std::string_view name, int64_t& offset, int& index) const {
    index = index_of(name);
    offset = tensors_[index].offset;
  }

  // Where each of block `layer`'s tensors starts.
  BlockOffsets block_offsets(int layer) const;
  // The lowest offset of block `layer`'s tensors: what forward announces before the block.
  int64_t block_offset(int layer) const;
  // The lowest offset of ln_final and lm_head: what forward announces before the head.
  int64_t head_offset() const;
  // The ranges of the buffer that forward announces before it reads them, in buffer order: the
  // head from 0, each block from its block_offset(), the embedding up to total().
  std::vector<Range> forward_parts() const;

  // Elements including alignment padding; multiples of kAlignElems.
  int64_t total() const { return total_; }
  // Total rounded up so that `world` equal shards of whole alignment units cover it.
  int64_t padded_total(int world) const;
  int64_t param_count() const { return param_count_; }

 private:
  std::vector<ParamTensor> tensors_;
  int64_t total_ = 0;
  int64_t param_count_ = 0;
};

// The names of one block's tensors, in the order backward finalises their gradients.
std::vector<std::string> layer_tensor_names_backward_order(int layer);

inline int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace trainer
