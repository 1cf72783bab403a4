#include "runtime/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/parse.h"
#include "runtime/safetensors.h"

namespace fs = std::filesystem;

namespace trainer {
namespace {

constexpr const char* kFormat = "trainer-checkpoint-v1";

// A file the tensors stream into, with its metadata.
struct Output {
  std::string path;
  std::map<std::string, std::string> metadata;
};

// Streams the named tensors of each state into every output, tensor by tensor in SPEC order (with
// the state's prefix before the names). Runs the sources on every rank; writes only with `write`.
// The sources may be collectives, so a failed write stops the writing but not the sources: every
// rank gets through them. The writer's first I/O error lands in `failure`; a call that starts with
// a failure writes nothing but still runs the sources.
void stream_tensors(const std::vector<Output>& outputs, const ParamLayout& L,
                    const std::vector<std::pair<std::string, const TensorSource*>>& states,
                    bool write, std::string& failure) {
  std::vector<TensorDecl> decls;
  int64_t largest = 0;
  for (const auto& [prefix, source] : states)
    for (const ParamTensor* t : L.spec_order()) {
      decls.push_back({prefix + t->name, "F32", t->shape});
      largest = std::max(largest, t->numel);
    }
  std::deque<SafetensorsStream> files;  // not movable: a deque builds them in place
  std::vector<float> buf;
  auto attempt = [&](const auto& io) {
    if (!failure.empty()) return;
    try {
      io();
    } catch (const std::exception& e) {
      failure = e.what();
      files.clear();  // abandons the temporary files
    }
  };
  if (write) {
    buf.resize(largest);
    attempt([&] {
      for (const Output& o : outputs) files.emplace_back(o.path, decls, o.metadata);
    });
  }
  for (const auto& [prefix, source] : states)
    for (const ParamTensor* t : L.spec_order()) {
      (*source)(*t, write ? buf.data() : nullptr);
      attempt([&] {
        for (SafetensorsStream& f : files) f.append(buf.data(), t->numel * sizeof(float));
      });
    }
  attempt([&] {
    for (SafetensorsStream& f : files) f.commit();
  });
}

// model.safetensors' metadata: "format": "pt" is what safetensors.torch writes (harmless for other
// readers), then the caller's entries.
std::map<std::string, std::string> model_metadata(const nlohmann::json& meta) {
  std::map<std::string, std::string> md = {{"format", "pt"}};
  for (auto it = meta.begin(); it != meta.end(); ++it)
    md[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
  return md;
}

TensorSource flat_source(const float* flat) {
  return [flat](const ParamTensor& t, float* out) {
    if (out) std::copy(flat + t.offset, flat + t.offset + t.numel, out);
  };
}

// Fills out[range.size()] with elements [range.begin, range.end) of the flat layout; every
// tensor is checked (present, F32, its shape), also those outside the range.
void read_tensors(const SafetensorsReader& r, const ParamLayout& L, const std::string& prefix,
                  float* out, Range range) {
  for (const ParamTensor* t : L.spec_order()) {
    const Range part = t->range().intersect(range);
    r.read_f32(prefix + t->name, t->shape,
               part.empty() ? nullptr : out + (part.begin - range.begin),
               part.empty() ? 0 : part.begin - t->offset, part.size());
  }
}

}  // namespace

nlohmann::json config_to_json(const ModelConfig& c) {
  return {{"vocab", c.vocab},       {"d_model", c.d_model}, {"d_ff", c.d_ff},
          {"n_layers", c.n_layers}, {"n_heads", c.n_heads}, {"ctx", c.ctx}};
}

ModelConfig config_from_json(const nlohmann::json& j) {
  auto dim = [&](const char* key) -> int64_t {
    const nlohmann::json& v = j.at(key);
    if (!v.is_number_integer())
      throw std::invalid_argument(fmt::format("config '{}' is {}, not an integer", key, v.dump()));
    return v.get<int64_t>();
  };
  ModelConfig c;
  c.vocab = dim("vocab");
  c.d_model = dim("d_model");
  c.d_ff = dim("d_ff");
  c.n_layers = dim("n_layers");
  c.n_heads = dim("n_heads");
  c.ctx = dim("ctx");
  return c;
}

namespace {

// Throws UsageError naming `what` and the first model dimension in which `saved_json` (a config
// as config_to_json writes it) differs from `expected`; returns the parsed config.
nlohmann::json check_config(const std::string& what, const std::string& saved_json,
                            const ModelConfig& expected) {
  nlohmann::json parsed;
  ModelConfig saved;
  try {
    parsed = nlohmann::json::parse(saved_json);
    saved = config_from_json(parsed);
  } catch (const std::exception& e) {
    usage_error("{}: unreadable model config in the metadata: {}", what, e.what());
  }
  const std::pair<const char*, std::pair<int64_t, int64_t>> dims[] = {
      {"--vocab", {saved.vocab, expected.vocab}},
      {"--d-model", {saved.d_model, expected.d_model}},
      {"--d-ff", {saved.d_ff, expected.d_ff}},
      {"--layers", {saved.n_layers, expected.n_layers}},
      {"--heads", {saved.n_heads, expected.n_heads}}};
  for (const auto& [flag, v] : dims)
    if (v.first != v.second)
      usage_error("{} has {} {} but this run has {}", what, flag, v.first, v.second);
  return parsed;
}

constexpr uint64_t kMaxStep = uint64_t{1} << 40;

// The step in a file's metadata: digits only, from 0 to 2^40.
int64_t parse_step(const std::string& path, const std::string& text) {
  const auto step = parse_decimal(text, kMaxStep);
  if (!step) usage_error("{}: unreadable step '{}' in the metadata", path, text);
  return static_cast<int64_t>(*step);
}

}  // namespace

void save_model(const std::string& path, const ParamLayout& L, const float* flat,
                const nlohmann::json& meta) {
  const TensorSource params = flat_source(flat);
  std::string failure;
  stream_tensors({{path, model_metadata(meta)}}, L, {{"", &params}}, true, failure);
  if (!failure.empty()) usage_error("{}", failure);
}

namespace {

// load_model's checks and read on an open file (a checkpoint opens its model file once: opening
// verifies the checksum of every byte).
void load_model_from(const SafetensorsReader& r, const ParamLayout& L, const ModelConfig& expected,
                     float* flat) {
  // Our files say which model they hold; a file from elsewhere is checked by names and shapes.
  const auto& md = r.metadata();
  if (auto it = md.find("config"); it != md.end()) check_config(r.path(), it->second, expected);
  std::set<std::string_view> known;
  for (const ParamTensor& t : L.tensors()) known.insert(t.name);
  for (const std::string& name : r.names())
    if (!known.count(name))
      usage_error("{} holds tensor '{}', which this model does not have (a different model?)",
                  r.path(), name);
  read_tensors(r, L, "", flat, {0, L.padded_total(1)});
}

}  // namespace

std::string hf_tensor_name(const std::string& name) {
  static const std::map<std::string, std::string, std::less<>> kTop = {
      {"token_embeddings.weight", "model.embed_tokens.weight"},
      {"ln_final.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string, std::less<>> kLayer = {
      {"attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"attn.output_proj.weight", "self_attn.o_proj.weight"},
      {"ffn.w1.weight", "mlp.gate_proj.weight"},
      {"ffn.w3.weight", "mlp.up_proj.weight"},
      {"ffn.w2.weight", "mlp.down_proj.weight"},
      {"ln1.weight", "input_layernorm.weight"},
      {"ln2.weight", "post_attention_layernorm.weight"}};
  if (auto it = kTop.find(name); it != kTop.end()) return it->second;
  if (name.starts_with("layers.")) {  // layers.<i>.<part>
    const std::string_view rest = std::string_view(name).substr(7);
    const size_t dot = rest.find('.');
    if (dot != std::string_view::npos && parse_decimal(rest.substr(0, dot), uint64_t{1} << 31))
      if (auto it = kLayer.find(rest.substr(dot + 1)); it != kLayer.end())
        return fmt::format("model.layers.{}.{}", rest.substr(0, dot), it->second);
  }
  runtime_error("no Hugging Face name for tensor '{}'", name);
}

void rope_rows_from_hf(const float* hf, float* ours, int64_t rows, int64_t cols, int64_t heads) {
  const int64_t dh = rows / heads, half = dh / 2;
  TRAINER_CHECK(dh * heads == rows && dh % 2 == 0, "{} rows in {} heads", rows, heads);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t p = 0; p < 2; ++p)
        std::copy_n(hf + (h * dh + p * half + j) * cols, cols, ours + (h * dh + 2 * j + p) * cols);
}

namespace {

// Checks a Hugging Face config.json against this model (see load_model); returns
// tie_word_embeddings.
bool check_hf_config(const std::string& path, const ModelConfig& expected) {
  std::ifstream in(path);
  if (!in) usage_error("cannot read {}: {}", path, std::strerror(errno));
  const nlohmann::json c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (c.is_discarded() || !c.is_object()) usage_error("{} is not a JSON object", path);
  auto has = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  auto integer = [&](const char* key) -> int64_t {
    if (!has(key)) usage_error("{} has no '{}'", path, key);
    if (!c[key].is_number_integer())
      usage_error("{}: '{}' is {}, not an integer", path, key, c[key].dump());
    return c[key].get<int64_t>();
  };
  auto number = [&](const nlohmann::json& v, const char* key, double fallback) -> double {
    if (v.is_null()) return fallback;
    if (!v.is_number()) usage_error("{}: '{}' is {}, not a number", path, key, v.dump());
    return v.get<double>();
  };

  const nlohmann::json arch = c.value("architectures", nlohmann::json());
  const bool llama_arch =
      arch.is_array() && std::find(arch.begin(), arch.end(), "LlamaForCausalLM") != arch.end();
  if (!arch.is_null() && !llama_arch)
    usage_error("{}: architectures {} is not LlamaForCausalLM (only Llama models load)", path,
                arch.dump());
  if (arch.is_null() && c.value("model_type", nlohmann::json()) != "llama")
    usage_error("{} names neither architectures [\"LlamaForCausalLM\"] nor model_type \"llama\"",
                path);

  const std::pair<const char*, std::pair<const char*, int64_t>> dims[] = {
      {"vocab_size", {"--vocab", expected.vocab}},
      {"hidden_size", {"--d-model", expected.d_model}},
      {"intermediate_size", {"--d-ff", expected.d_ff}},
      {"num_hidden_layers", {"--layers", expected.n_layers}},
      {"num_attention_heads", {"--heads", expected.n_heads}}};
  for (const auto& [key, flag] : dims)
    if (const int64_t v = integer(key); v != flag.second)
      usage_error("{} has {} {} but this run has {} {}", path, key, v, flag.first, flag.second);
  if (has("num_key_value_heads") && integer("num_key_value_heads") != expected.n_heads)
    usage_error(
        "{} has num_key_value_heads {} but num_attention_heads {}: grouped-query attention is "
        "not supported (this model has a key/value head per query head)",
        path, integer("num_key_value_heads"), expected.n_heads);
  if (has("head_dim") && integer("head_dim") != expected.head_dim())
    usage_error("{} has head_dim {} but hidden_size / num_attention_heads is {}", path,
                integer("head_dim"), expected.head_dim());
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (has(key) && c[key] != false)
      usage_error("{} has {} {}: this model has no biases", path, key, c[key].dump());
  for (const char* key : {"hidden_act", "hidden_activation"})
    if (has(key) && c[key] != "silu" && c[key] != "swish")
      usage_error("{} has {} {}: this model's SwiGLU uses silu", path, key, c[key].dump());
  // Absent values mean Hugging Face's defaults (LlamaConfig: eps 1e-6, theta 10000).
  const double eps = number(c.value("rms_norm_eps", nlohmann::json()), "rms_norm_eps", 1e-6);
  if (std::fabs(eps - 1e-5) > 1e-5 * 1e-6)
    usage_error("{} has rms_norm_eps {} but this model's RMSNorm uses eps 1e-5", path, eps);
  // RoPE: rope_parameters (transformers 5) or rope_scaling (4.x) with the type, rope_theta in it
  // or at the top level.
  double theta = number(c.value("rope_theta", nlohmann::json()), "rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!has(key)) continue;
    const nlohmann::json& r = c[key];
    if (!r.is_object()) usage_error("{}: '{}' is {}, not an object", path, key, r.dump());
    const nlohmann::json type = r.value("rope_type", r.value("type", nlohmann::json("default")));
    if (type != "default")
      usage_error("{} has {} of type {}: this model uses plain RoPE", path, key, type.dump());
    if (r.contains("rope_theta")) theta = number(r["rope_theta"], "rope_theta", theta);
  }
  if (theta != 10000.0)
    usage_error("{} has rope_theta {} but this model's RoPE uses theta 10000", path, theta);
  const nlohmann::json tie = c.value("tie_word_embeddings", nlohmann::json(false));
  if (!tie.is_boolean())
    usage_error("{}: 'tie_word_embeddings' is {}, not a boolean", path, tie.dump());
  return tie.get<bool>();
}

// The weights of a Hugging Face folder: model.safetensors, or the shards of
// model.safetensors.index.json; each tensor name with the file that holds it.
struct HfWeights {
  std::deque<SafetensorsReader> files;  // SafetensorsReader is not copyable; a deque keeps refs
  std::map<std::string, const SafetensorsReader*> where;
};

HfWeights open_hf_weights(const fs::path& dir) {
  HfWeights w;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::vector<std::string> paths;
  if (fs::exists(single)) {
    paths.push_back(single.string());
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      usage_error("{}: not a safetensors index (no 'weight_map' object)", index.string());
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        usage_error("{}: tensor '{}' maps to {}, not a file name", index.string(), name,
                    file.dump());
      if (shards.insert(file.get<std::string>()).second)
        paths.push_back((dir / file.get<std::string>()).string());
    }
  } else {
    const bool bin =
        fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json");
    usage_error("{} has no model.safetensors{}", dir.string(),
                bin ? " (only PyTorch .bin weights, which are not read: save them with "
                      "safe_serialization=True)"
                    : " or model.safetensors.index.json");
  }
  for (const std::string& p : paths) {
    w.files.push_back(SafetensorsReader::open(p));
    for (const std::string& name : w.files.back().names())
      if (!w.where.emplace(name, &w.files.back()).second)
        usage_error("{}: tensor '{}' is in two files ({} and {})", dir.string(), name,
                    w.where[name]->path(), p);
  }
  return w;
}

void load_hf_model(const fs::path& dir, const ParamLayout& L, const ModelConfig& expected,
                   float* flat) {
  const fs::path config = dir / "config.json";
  if (!fs::exists(config))
    usage_error(
        "{} is a directory without config.json: not a Hugging Face model folder (for the "
        "trainer's own weights pass the model.safetensors file)",
        dir.string());
  const bool tied = check_hf_config(config.string(), expected);
  const HfWeights w = open_hf_weights(dir);

  std::map<std::string, const ParamTensor*> ours;  // by Hugging Face name
  for (const ParamTensor& t : L.tensors()) ours[hf_tensor_name(t.name)] = &t;
  for (const auto& [name, file] : w.where) {
    if (ours.count(name)) continue;
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer older versions saved
    if (name.ends_with(".bias"))
      usage_error("{} holds the bias '{}': this model has no biases", file->path(), name);
    usage_error("{} holds tensor '{}', which this model does not have (a different model?)",
                file->path(), name);
  }
  std::vector<float> buf;
  for (const ParamTensor* t : L.spec_order()) {
    const std::string name = hf_tensor_name(t->name);
    const auto it = w.where.find(name);
    if (it == w.where.end()) {
      if (t->name == "lm_head.weight" && tied)
        usage_error(
            "{} ties lm_head to the embeddings (tie_word_embeddings) and has no lm_head.weight: "
            "this model's head is untied",
            dir.string());
      usage_error("{} has no tensor '{}' (this model's {})", dir.string(), name, t->name);
    }
    const SafetensorsReader& r = *it->second;
    if (r.info(name).shape != t->shape)
      usage_error("{}: tensor '{}' has shape {} but this model's {} is {}", r.path(), name,
                  shape_string(r.info(name).shape), t->name, shape_string(t->shape));
    const bool rope =
        t->name.ends_with("attn.q_proj.weight") || t->name.ends_with("attn.k_proj.weight");
    if (!rope) {
      r.read_as_f32(name, t->shape, flat + t->offset);
      continue;
    }
    buf.resize(t->numel);
    r.read_as_f32(name, t->shape, buf.data());
    rope_rows_from_hf(buf.data(), flat + t->offset, t->shape[0], t->shape[1], expected.n_heads);
  }
}

}  // namespace

ModelConfig read_model_config(const std::string& path) {
  ModelConfig c;
  if (fs::is_directory(path)) {
    const std::string file = (fs::path(path) / "config.json").string();
    std::ifstream in(file);
    if (!in) usage_error("{} has no readable config.json: not a Hugging Face model folder", path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) usage_error("{} is not a JSON object", file);
    try {
      c = config_from_json({{"vocab", j.at("vocab_size")},
                            {"d_model", j.at("hidden_size")},
                            {"d_ff", j.at("intermediate_size")},
                            {"n_layers", j.at("num_hidden_layers")},
                            {"n_heads", j.at("num_attention_heads")},
                            {"ctx", j.at("max_position_embeddings")}});
    } catch (const std::exception& e) {
      usage_error("{}: unreadable Llama dimensions: {}", file, e.what());
    }
  } else {
    const SafetensorsReader r = SafetensorsReader::open(path);
    const auto it = r.metadata().find("config");
    if (it == r.metadata().end())
      usage_error(
          "{} carries no model config in its metadata (not written by this trainer): pass the "
          "trainer's model.safetensors, a step_N checkpoint or a Hugging Face folder",
          path);
    try {
      c = config_from_json(nlohmann::json::parse(it->second));
    } catch (const std::exception& e) {
      usage_error("{}: unreadable model config in the metadata: {}", path, e.what());
    }
  }
  validate(c);
  return c;
}

void load_model(const std::string& path, const ParamLayout& L, const ModelConfig& expected,
                float* flat) {
  if (fs::is_directory(path)) return load_hf_model(path, L, expected, flat);
  load_model_from(SafetensorsReader::open(path), L, expected, flat);
}

void save_checkpoint(const std::string& dir, const ParamLayout& L, const TensorSource& params,
                     const TensorSource& exp_avg, const TensorSource& exp_avg_sq,
                     const CheckpointMeta& meta, bool write, const std::string& final_weights) {
  const fs::path final_dir(dir);
  const fs::path tmp_dir = final_dir.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  if (write) {
    fs::remove_all(tmp_dir, ec);
    if (!fs::create_directories(tmp_dir, ec) && ec)
      usage_error("cannot create checkpoint directory {}: {}", tmp_dir.string(), ec.message());
  }
  const nlohmann::json model_meta = {{"step", std::to_string(meta.step)},
                                     {"config", meta.config.dump()}};
  std::vector<Output> weights = {
      {(tmp_dir / "model.safetensors").string(), model_metadata(model_meta)}};
  if (!final_weights.empty()) weights.push_back({final_weights, model_metadata(model_meta)});
  // Both passes run on every rank even after a failed write: their sources may be collectives.
  std::string failure;
  stream_tensors(weights, L, {{"", &params}}, write, failure);
  stream_tensors({{(tmp_dir / "optimizer.safetensors").string(),
                   {{"format", kFormat},
                    {"step", std::to_string(meta.step)},
                    {"config", meta.config.dump()},
                    {"run", meta.run.dump()}}}},
                 L, {{"exp_avg.", &exp_avg}, {"exp_avg_sq.", &exp_avg_sq}}, write, failure);
  if (!failure.empty()) {
    fs::remove_all(tmp_dir, ec);  // no half-written directory left behind
    usage_error("{}", failure);
  }
  if (!write) return;

  // Swap the complete directory into place; an older one of the same name is removed after.
  const fs::path old_dir = final_dir.string() + ".old-" + std::to_string(::getpid());
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) usage_error("cannot move checkpoint into {}: {}", final_dir.string(), ec.message());
  fs::remove_all(old_dir, ec);
}

void save_checkpoint(const std::string& dir, const ParamLayout& L, const float* params,
                     const float* exp_avg, const float* exp_avg_sq, const CheckpointMeta& meta) {
  save_checkpoint(dir, L, flat_source(params), flat_source(exp_avg), flat_source(exp_avg_sq), meta);
}

CheckpointMeta load_checkpoint(const std::string& dir, const ParamLayout& L,
                               const ModelConfig& expected, float* params, float* exp_avg,
                               float* exp_avg_sq, std::optional<Range> moments) {
  if (!fs::is_directory(dir))
    usage_error(
        "--resume {}: not a checkpoint directory (expected DIR/step_N with "
        "model.safetensors and optimizer.safetensors)",
        dir);
  const std::string opt_path = (fs::path(dir) / "optimizer.safetensors").string();
  const std::string model_path = (fs::path(dir) / "model.safetensors").string();
  for (const auto& p : {model_path, opt_path})
    if (!fs::exists(p)) usage_error("checkpoint {} is incomplete: {} is missing", dir, p);

  SafetensorsReader opt = SafetensorsReader::open(opt_path);
  const auto& md = opt.metadata();
  auto field = [&](const char* key) -> const std::string& {
    auto it = md.find(key);
    if (it == md.end())
      usage_error("{}: metadata has no '{}' (not a trainer checkpoint?)", opt_path, key);
    return it->second;
  };
  if (field("format") != kFormat)
    usage_error("{}: format '{}' is not {}", opt_path, field("format"), kFormat);
  CheckpointMeta meta;
  meta.step = parse_step(opt_path, field("step"));
  meta.config = check_config(opt_path, field("config"), expected);
  try {
    meta.run = nlohmann::json::parse(field("run"));
  } catch (const nlohmann::json::exception& e) {
    usage_error("{}: unreadable metadata: {}", opt_path, e.what());
  }
  if (!meta.run.is_object()) usage_error("{}: metadata 'run' is not a JSON object", opt_path);
  // Both files of one save carry its step: a model file from another save is refused.
  const SafetensorsReader model = SafetensorsReader::open(model_path);
  if (auto it = model.metadata().find("step"); it != model.metadata().end()) {
    const int64_t model_step = parse_step(model_path, it->second);
    if (model_step != meta.step)
      usage_error("checkpoint {} mixes two saves: {} is from step {}, {} from step {}", dir,
                  model_path, model_step, opt_path, meta.step);
  }
  if (params) load_model_from(model, L, expected, params);
  const Range range = moments.value_or(Range{0, L.padded_total(1)});
  if (exp_avg) read_tensors(opt, L, "exp_avg.", exp_avg, range);
  if (exp_avg_sq) read_tensors(opt, L, "exp_avg_sq.", exp_avg_sq, range);
  return meta;
}

std::vector<CheckpointDir> list_checkpoints(const std::string& out) {
  std::vector<CheckpointDir> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step_", 0) != 0) continue;
    if (const auto s = parse_decimal(std::string_view(name).substr(5), kMaxStep))
      found.push_back({static_cast<int64_t>(*s), e.path().string()});
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointDir& a, const CheckpointDir& b) { return a.step < b.step; });
  return found;
}

std::string latest_checkpoint(const std::string& out) {
  const auto all = list_checkpoints(out);
  return all.empty() ? "" : all.back().path;
}

}  // namespace trainer
