// Checkpoints: weights in model.safetensors under SPEC.md's names (loadable with
// safetensors.torch.load_file), AdamW state in optimizer.safetensors ("exp_avg.<name>",
// "exp_avg_sq.<name>") whose __metadata__ holds the step, the model config and the run settings.
//
// Everything is stored per named tensor, independent of the world size, the flat layout and
// ZeRO-1 sharding, so a checkpoint written by N ranks resumes on any M. A checkpoint directory
// is written under a temporary name and renamed into place, so it is either whole or absent.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/layout.h"

namespace trainer {

// One fp32 state of the model (the weights, or an AdamW moment) as the writers read it: fills
// out[t.numel] with tensor t. The writers call it for every tensor in SPEC order, one tensor at a
// time, so a file never needs the whole state in memory. With several ranks it may be a
// collective: every rank runs the writer, and only the one that writes (`write`) passes a
// buffer (the others get out == nullptr and touch no file).
using TensorSource = std::function<void(const ParamTensor& t, float* out)>;

// Writes model.safetensors at `path` (atomic) from a flat fp32 buffer.
void save_model(const std::string& path, const ParamLayout& L, const float* flat,
                const nlohmann::json& meta = {});
// Reads model.safetensors into a flat fp32 buffer (padding left untouched). Missing or unknown
// tensors, wrong shapes or dtypes, and a model config in the metadata that differs from
// `expected` (our files carry one; PyTorch's do not) throw UsageError naming the file and tensor.
//
// A directory `path` is read as a Hugging Face LlamaForCausalLM folder (what
// launch/export_hf.py writes): config.json, and model.safetensors or the shards that
// model.safetensors.index.json lists, with F32, BF16, F16 or F64 tensors under the Hugging Face
// names (hf_tensor_name). The config must describe this model: the dimensions of `expected`
// (else the first differing field is named with both values), one key/value head per query
// head, no biases, SiLU, untied embeddings (or an lm_head.weight), RMSNorm eps 1e-5 and plain
// RoPE with theta 10000. The rows of q_proj and k_proj are permuted back from Hugging Face's
// rotate-half RoPE pairs to SPEC.md's interleaved ones (see rope_rows_from_hf).
void load_model(const std::string& path, const ParamLayout& L, const ModelConfig& expected,
                float* flat);

// The model configuration of what load_model reads at `path`: the "config" entry of our
// model.safetensors' metadata, or a Hugging Face folder's config.json (ctx from
// max_position_embeddings). UsageError when there is none (a file written by PyTorch carries no
// config: give its dimensions by hand) or it is unreadable.
ModelConfig read_model_config(const std::string& path);

// The Hugging Face Llama name of a SPEC.md tensor: "token_embeddings.weight" ->
// "model.embed_tokens.weight", "layers.3.ffn.w1.weight" -> "model.layers.3.mlp.gate_proj.weight"
// (w1 = gate, w3 = up, w2 = down: SwiGLU's w2(silu(w1 x) * w3 x) is Llama's
// down(silu(gate x) * up x)), "layers.3.ln1.weight" -> "model.layers.3.input_layernorm.weight",
// "ln_final.weight" -> "model.norm.weight", "lm_head.weight" unchanged.
std::string hf_tensor_name(const std::string& name);

// Undoes launch/export_hf.py's permutation of q_proj / k_proj rows: SPEC.md's RoPE rotates the
// pairs (x[2j], x[2j+1]) of each head, Hugging Face's rotate_half the pairs (x[j], x[j + dh/2]),
// so the exporter stores our row h*dh + 2j + p at h*dh + p*dh/2 + j (p = 0, 1; j < dh/2). Here
// ours[h*dh + 2j + p] = hf[h*dh + p*dh/2 + j], rows of `cols` elements, `heads` heads of
// `rows / heads` rows.
void rope_rows_from_hf(const float* hf, float* ours, int64_t rows, int64_t cols, int64_t heads);

struct CheckpointMeta {
  int64_t step = 0;       // optimizer steps completed
  nlohmann::json config;  // model dimensions
  nlohmann::json run;     // global batch, ctx, sampler, seed, world, lr settings, ...
};

nlohmann::json config_to_json(const ModelConfig& c);
ModelConfig config_from_json(const nlohmann::json& j);

// Writes DIR (e.g. out/step_100) with model.safetensors and optimizer.safetensors, atomically
// (see TensorSource for `write`; a failed write throws UsageError on the writer once every rank
// has been through the sources, and leaves no partial directory). With `final_weights`, the
// weights also go to that path, from the same pass over the tensors. Both model files' metadata
// hold the step and the model config.
void save_checkpoint(const std::string& dir, const ParamLayout& L, const TensorSource& params,
                     const TensorSource& exp_avg, const TensorSource& exp_avg_sq,
                     const CheckpointMeta& meta, bool write = true,
                     const std::string& final_weights = "");
// The same from flat fp32 buffers.
void save_checkpoint(const std::string& dir, const ParamLayout& L, const float* params,
                     const float* exp_avg, const float* exp_avg_sq, const CheckpointMeta& meta);

// Reads a checkpoint directory: metadata, and the flat fp32 params / AdamW moments (each may be
// null to skip). Checks the model dimensions against `expected` and names the first mismatch.
// With `moments`, exp_avg / exp_avg_sq receive only those elements of the flat layout (a ZeRO-1
// rank's shard: out[moments.size()]).
CheckpointMeta load_checkpoint(const std::string& dir, const ParamLayout& L,
                               const ModelConfig& expected, float* params, float* exp_avg,
                               float* exp_avg_sq, std::optional<Range> moments = std::nullopt);

// The step_N directories under `out`, by step, oldest first (a step_N.tmp-* being written is not
// one).
struct CheckpointDir {
  int64_t step;
  std::string path;
};
std::vector<CheckpointDir> list_checkpoints(const std::string& out);

// The newest step_N directory under `out` ("" if none).
std::string latest_checkpoint(const std::string& out);

}  // namespace trainer
