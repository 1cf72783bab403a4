#include "model/layout.h"

#include <algorithm>

#include "core/error.h"

namespace trainer {

std::vector<std::string> layer_tensor_names_backward_order(int layer) {
  const std::string p = "layers." + std::to_string(layer) + ".";
  // Backward of a block runs the FFN first (w2, then w1 and w3 from the same hidden gradient, then
  // the ln2 gain), then attention (output_proj, then v, k, q, then the ln1 gain).
  return {p + "ffn.w2.weight",      p + "ffn.w3.weight",           p + "ffn.w1.weight",
          p + "ln2.weight",         p + "attn.output_proj.weight", p + "attn.v_proj.weight",
          p + "attn.k_proj.weight", p + "attn.q_proj.weight",      p + "ln1.weight"};
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.d_ff, v = c.vocab;
  auto add = [&](std::string name, std::vector<int64_t> shape, int layer) {
    ParamTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.numel = 1;
    for (int64_t s : t.shape) t.numel *= s;
    t.offset = total_;
    t.layer = layer;
    total_ = align_up(total_ + t.numel, kAlignElems);
    param_count_ += t.numel;
    tensors_.push_back(std::move(t));
  };
  add("lm_head.weight", {v, d}, -1);
  add("ln_final.weight", {d}, -1);
  for (int i = static_cast<int>(c.n_layers) - 1; i >= 0; --i) {
    for (const std::string& name : layer_tensor_names_backward_order(i)) {
      const std::string_view suffix = std::string_view(name).substr(name.find('.', 7) + 1);
      std::vector<int64_t> shape;
      if (suffix == "ffn.w2.weight")
        shape = {d, f};
      else if (suffix == "ffn.w1.weight" || suffix == "ffn.w3.weight")
        shape = {f, d};
      else if (suffix == "ln1.weight" || suffix == "ln2.weight")
        shape = {d};
      else
        shape = {d, d};
      add(name, std::move(shape), i);
    }
  }
  add("token_embeddings.weight", {v, d}, -1);
}

std::vector<const ParamTensor*> ParamLayout::spec_order() const {
  std::vector<const ParamTensor*> out;
  auto push = [&](const std::string& name) { out.push_back(&tensors_[index_of(name)]); };
  push("token_embeddings.weight");
  int n_layers = 0;
  for (const auto& t : tensors_) n_layers = std::max(n_layers, t.layer + 1);
  for (int i = 0; i < n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* s : {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                          "attn.output_proj.weight", "ffn.w1.weight", "ffn.w2.weight",
                          "ffn.w3.weight", "ln1.weight", "ln2.weight"})
      push(p + s);
  }
  push("ln_final.weight");
  push("lm_head.weight");
  return out;
}

int ParamLayout::index_of(std::string_view name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  usage_error("no parameter named '{}' in this model", name);
}

BlockOffsets ParamLayout::block_offsets(int layer) const {
  const std::string p = "layers." + std::to_string(layer) + ".";
  auto at = [&](const char* name) { return find(p + name).offset; };
  return {at("ln1.weight"),         at("attn.q_proj.weight"),      at("attn.k_proj.weight"),
          at("attn.v_proj.weight"), at("attn.output_proj.weight"), at("ln2.weight"),
          at("ffn.w1.weight"),      at("ffn.w2.weight"),           at("ffn.w3.weight")};
}

int64_t ParamLayout::block_offset(int layer) const {
  int64_t lowest = -1;
  for (const ParamTensor& t : tensors_)
    if (t.layer == layer && (lowest < 0 || t.offset < lowest)) lowest = t.offset;
  TRAINER_CHECK(lowest >= 0, "no block {} in the layout", layer);
  return lowest;
}

int64_t ParamLayout::head_offset() const {
  return std::min(find("ln_final.weight").offset, find("lm_head.weight").offset);
}

std::vector<Range> ParamLayout::forward_parts() const {
  std::vector<int64_t> starts = {head_offset(), find("token_embeddings.weight").offset};
  for (const ParamTensor& t : tensors_)
    if (t.layer >= 0) starts.push_back(block_offset(t.layer));
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<Range> parts;
  for (size_t i = 0; i < starts.size(); ++i)
    parts.push_back({starts[i], i + 1 < starts.size() ? starts[i + 1] : total_});
  return parts;
}

int64_t ParamLayout::padded_total(int world) const {
  TRAINER_CHECK(world >= 1, "world {}", world);
  return align_up(total_, kAlignElems * world);
}

}  // namespace trainer
