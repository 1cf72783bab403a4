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
void load_model(const std::string& path, const ParamLayout& L, const ModelConfig& expected,
                float* flat);

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
