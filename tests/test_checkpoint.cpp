// Checkpoint files: what load_model and load_checkpoint accept and what they refuse by name
// (also Hugging Face Llama folders, made here by hand as launch/export_hf.py makes them); the
// signals that make a run stop with a checkpoint.
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/parse.h"
#include "model/config.h"
#include "model/layout.h"
#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "runtime/stop_signal.h"
#include "tests/catch.h"
#include "tests/scratch_files.h"

using namespace trainer;

namespace {

ModelConfig small_config() {
  return {.vocab = 32, .d_model = 16, .d_ff = 32, .n_layers = 2, .n_heads = 2, .ctx = 8};
}

std::vector<float> numbered(const ParamLayout& L) {
  std::vector<float> v(L.padded_total(1), 0.0f);
  for (const ParamTensor& t : L.tensors())
    for (int64_t i = 0; i < t.numel; ++i) v[t.offset + i] = static_cast<float>(t.offset + i);
  return v;
}

// A weights file as another writer makes it: SPEC names and shapes, no metadata of ours.
void write_foreign(const std::string& path, const ParamLayout& L, const std::vector<float>& flat) {
  SafetensorsWriter w;
  for (const ParamTensor* t : L.spec_order())
    w.add(t->name, "F32", t->shape, flat.data() + t->offset, t->numel * sizeof(float));
  w.write(path);
}

// The message of the UsageError that f throws ("" if none).
template <typename F>
std::string usage_message(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("load_model reads foreign weights and refuses another model's, naming what differs") {
  TempDir dir;
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> flat = numbered(L);
  write_foreign(dir.file("w.safetensors"), L, flat);

  std::vector<float> got(L.padded_total(1), -1.0f);
  load_model(dir.file("w.safetensors"), L, c, got.data());
  for (const ParamTensor& t : L.tensors())
    for (int64_t i = 0; i < t.numel; ++i) REQUIRE(got[t.offset + i] == flat[t.offset + i]);

  // Fewer layers: the file holds tensors this model lacks.
  ModelConfig one = c;
  one.n_layers = 1;
  const ParamLayout L1(one);
  std::vector<float> buf1(L1.padded_total(1));
  CHECK_THAT(usage_message([&] { load_model(dir.file("w.safetensors"), L1, one, buf1.data()); }),
             ContainsSubstring("layers.1.") && ContainsSubstring("which this model does not have"));
  // A wider model: shapes differ; the message names the tensor.
  ModelConfig wide = c;
  wide.d_model = 32;
  const ParamLayout Lw(wide);
  std::vector<float> bufw(Lw.padded_total(1));
  CHECK_THAT(usage_message([&] { load_model(dir.file("w.safetensors"), Lw, wide, bufw.data()); }),
             ContainsSubstring("token_embeddings.weight"));

  // Our files carry the config: other heads (same shapes) are refused too.
  save_model(dir.file("ours.safetensors"), L, flat.data(), {{"config", config_to_json(c).dump()}});
  ModelConfig heads = c;
  heads.n_heads = 4;
  CHECK_THAT(usage_message([&] { load_model(dir.file("ours.safetensors"), L, heads, got.data()); }),
             ContainsSubstring("has --heads 2 but this run has 4"));
  REQUIRE(
      usage_message([&] { load_model(dir.file("ours.safetensors"), L, c, got.data()); }).empty());
}

TEST_CASE("load_checkpoint refuses unreadable steps, configs and run settings, and mixed saves") {
  TempDir dir;
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> flat = numbered(L);
  CheckpointMeta meta;
  meta.step = 3;
  meta.config = config_to_json(c);
  meta.run = {{"global_batch", 4}};
  save_checkpoint(dir.file("step_3"), L, flat.data(), flat.data(), flat.data(), meta);
  save_checkpoint(dir.file("step_4"), L, flat.data(), flat.data(), flat.data(),
                  CheckpointMeta{4, meta.config, meta.run});
  std::vector<float> p(L.padded_total(1)), m(p.size()), v(p.size());
  REQUIRE(load_checkpoint(dir.file("step_3"), L, c, p.data(), m.data(), v.data()).step == 3);

  // Rewrites step_3's optimizer file with one metadata entry changed.
  auto with_metadata = [&](const std::string& key, const std::string& value) {
    const SafetensorsReader r = SafetensorsReader::open(dir.file("step_4/optimizer.safetensors"));
    SafetensorsWriter w;
    for (const std::string& name : r.names()) {
      const TensorInfo& t = r.info(name);
      w.add(name, t.dtype, t.shape, r.raw(name), t.end - t.begin);
    }
    for (const auto& [k, val] : r.metadata())
      if (k != "trainer.checksum") w.set_metadata(k, k == key ? value : val);
    w.write(dir.file("step_3/optimizer.safetensors"));
    return usage_message(
        [&] { load_checkpoint(dir.file("step_3"), L, c, p.data(), m.data(), v.data()); });
  };
  CHECK_THAT(with_metadata("step", "2abc"), ContainsSubstring("unreadable step '2abc'"));
  CHECK_THAT(with_metadata("step", "-1"), ContainsSubstring("unreadable step '-1'"));
  CHECK_THAT(with_metadata("config", R"({"vocab":32,"d_model":16.7,"d_ff":32,"n_layers":2,)"
                                     R"("n_heads":2,"ctx":8})"),
             ContainsSubstring("'d_model' is 16.7, not an integer"));
  CHECK_THAT(with_metadata("run", "[]"), ContainsSubstring("'run' is not a JSON object"));
  // step_4's optimizer file beside step_3's weights.
  CHECK_THAT(with_metadata("step", "4"), ContainsSubstring("mixes two saves"));
}

TEST_CASE("parse_decimal: digits only, within the bound") {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  CHECK(parse_decimal("0", 10) == 0u);
  CHECK(parse_decimal("10", 10) == 10u);
  CHECK(parse_decimal("18446744073709551615", kMax) == kMax);
  CHECK_FALSE(parse_decimal("18446744073709551616", kMax).has_value());
  for (const char* bad : {"", "11", "-1", "+1", " 1", "1 ", "1e3", "0x1"})
    CHECK_FALSE(parse_decimal(bad, 10).has_value());
}

namespace {
volatile std::sig_atomic_t g_outer = 0;
extern "C" void outer_handler(int sig) { g_outer = sig; }
}  // namespace

TEST_CASE("StopSignals records the first stop signal and restores the handlers before it") {
  std::signal(SIGUSR1, outer_handler);
  {
    const StopSignals signals;
    CHECK(signals.received() == 0);
    std::raise(SIGUSR1);
    CHECK(signals.received() == SIGUSR1);
    std::raise(SIGTERM);  // the first one is kept; the process goes on
    CHECK(signals.received() == SIGUSR1);
    CHECK(g_outer == 0);
  }
  {
    const StopSignals again;  // a new run starts with nothing received
    CHECK(again.received() == 0);
  }
  std::raise(SIGUSR1);
  CHECK(g_outer == SIGUSR1);
  std::signal(SIGUSR1, SIG_DFL);
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGUSR1) == "SIGUSR1");
}

// ---------------------------------------------------------------------------------------------
// Hugging Face folders

namespace {

// A tensor of a hand-made Hugging Face folder: its name, dtype, shape and bytes.
struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// fp32 -> binary16 bits for values binary16 holds exactly (normal numbers and zeros).
uint16_t f16_bits(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  if ((b & 0x7fffffff) == 0) return static_cast<uint16_t>(b >> 16);
  const int e = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  REQUIRE((e > 0 && e < 31 && (b & 0x1fff) == 0));
  return static_cast<uint16_t>((b >> 16 & 0x8000) | e << 10 | (b >> 13 & 0x3ff));
}

// One tensor's values in `dtype` (F32; BF16 and F16 for values they hold exactly).
std::vector<uint8_t> encode(const float* v, int64_t n, const std::string& dtype) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(v[i]);
    if (dtype == "F32") {
      for (int k = 0; k < 4; ++k) out.push_back(static_cast<uint8_t>(b >> 8 * k));
    } else {
      REQUIRE((dtype != "BF16" || (b & 0xffff) == 0));
      const uint16_t h = dtype == "BF16" ? static_cast<uint16_t>(b >> 16) : f16_bits(v[i]);
      out.push_back(static_cast<uint8_t>(h));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
  }
  return out;
}

// The weights under Hugging Face's names, the rows of q_proj and k_proj permuted by hand (not
// with the code under test): within each head, Hugging Face row p * dh/2 + j holds our row
// 2j + p, so that its rotate-half RoPE pairs (j, j + dh/2) are our interleaved (2j, 2j+1).
std::vector<HfTensor> hf_tensors(const ParamLayout& L, const ModelConfig& c,
                                 const std::vector<float>& flat, const std::string& dtype) {
  const std::map<std::string, std::string> parts = {
      {"attn.q_proj", "self_attn.q_proj"}, {"attn.k_proj", "self_attn.k_proj"},
      {"attn.v_proj", "self_attn.v_proj"}, {"attn.output_proj", "self_attn.o_proj"},
      {"ffn.w1", "mlp.gate_proj"},         {"ffn.w3", "mlp.up_proj"},
      {"ffn.w2", "mlp.down_proj"},         {"ln1", "input_layernorm"},
      {"ln2", "post_attention_layernorm"}};
  std::vector<HfTensor> out;
  out.push_back({"model.embed_tokens.weight", dtype, {}, {}});
  out.back().shape = L.find("token_embeddings.weight").shape;
  std::vector<std::string> ours = {"token_embeddings.weight"};
  for (int64_t i = 0; i < c.n_layers; ++i)
    for (const auto& [mine, theirs] : parts) {
      out.push_back({fmt::format("model.layers.{}.{}.weight", i, theirs), dtype, {}, {}});
      ours.push_back(fmt::format("layers.{}.{}.weight", i, mine));
    }
  out.push_back({"model.norm.weight", dtype, {}, {}});
  ours.push_back("ln_final.weight");
  out.push_back({"lm_head.weight", dtype, {}, {}});
  ours.push_back("lm_head.weight");
  const int64_t dh = c.head_dim(), d = c.d_model;
  for (size_t k = 0; k < out.size(); ++k) {
    const ParamTensor& t = L.find(ours[k]);
    out[k].shape = t.shape;
    std::vector<float> v(flat.begin() + t.offset, flat.begin() + t.offset + t.numel);
    if (ours[k].ends_with("q_proj.weight") || ours[k].ends_with("k_proj.weight"))
      for (int64_t h = 0; h < c.n_heads; ++h)
        for (int64_t j = 0; j < dh / 2; ++j)
          for (int64_t p = 0; p < 2; ++p)
            for (int64_t col = 0; col < d; ++col)
              v[(h * dh + p * dh / 2 + j) * d + col] =
                  flat[t.offset + (h * dh + 2 * j + p) * d + col];
    out[k].bytes = encode(v.data(), t.numel, dtype);
  }
  return out;
}

nlohmann::json hf_config(const ModelConfig& c) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocab},
          {"hidden_size", c.d_model},
          {"intermediate_size", c.d_ff},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_heads},
          {"hidden_act", "silu"},
          {"max_position_embeddings", c.ctx},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  REQUIRE(f.good());
}

void write_safetensors(const std::string& path, const std::vector<HfTensor>& ts) {
  SafetensorsWriter w;
  for (const HfTensor& t : ts) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.set_metadata("format", "pt");
  w.write(path);
}

// A fresh folder `dir` with config.json and model.safetensors.
void write_hf(const std::string& dir, const nlohmann::json& config,
              const std::vector<HfTensor>& ts) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  write_safetensors(dir + "/model.safetensors", ts);
}

// Values that BF16 and F16 hold exactly, distinct within each row of 16.
std::vector<float> halves(const ParamLayout& L) {
  std::vector<float> v(L.padded_total(1), 0.0f);
  for (const ParamTensor& t : L.tensors())
    for (int64_t i = 0; i < t.numel; ++i)
      v[t.offset + i] = static_cast<float>((t.offset + i) % 241) * 0.5f - 60.0f;
  return v;
}

void require_same(const ParamLayout& L, const std::vector<float>& got,
                  const std::vector<float>& want) {
  for (const ParamTensor& t : L.tensors())
    for (int64_t i = 0; i < t.numel; ++i) {
      INFO(t.name << "[" << i << "]");
      REQUIRE(got[t.offset + i] == want[t.offset + i]);
    }
}

}  // namespace

TEST_CASE("hf_tensor_name gives Llama's names; fp16 and bf16 convert exactly") {
  CHECK(hf_tensor_name("token_embeddings.weight") == "model.embed_tokens.weight");
  CHECK(hf_tensor_name("layers.11.attn.output_proj.weight") ==
        "model.layers.11.self_attn.o_proj.weight");
  CHECK(hf_tensor_name("layers.0.ffn.w1.weight") == "model.layers.0.mlp.gate_proj.weight");
  CHECK(hf_tensor_name("layers.0.ffn.w3.weight") == "model.layers.0.mlp.up_proj.weight");
  CHECK(hf_tensor_name("layers.0.ffn.w2.weight") == "model.layers.0.mlp.down_proj.weight");
  CHECK(hf_tensor_name("layers.2.ln2.weight") == "model.layers.2.post_attention_layernorm.weight");
  CHECK(hf_tensor_name("ln_final.weight") == "model.norm.weight");
  CHECK(hf_tensor_name("lm_head.weight") == "lm_head.weight");

  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // the smallest subnormal
  CHECK(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));
  CHECK(std::bit_cast<uint32_t>(f16_to_f32(0x8000)) == 0x80000000u);
  CHECK(f16_to_f32(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_f32(0x7e00)));
  CHECK(bf16_bits_to_f32(0x3f80) == 1.0f);
  CHECK(bf16_bits_to_f32(0xc0a0) == -5.0f);
  CHECK(std::isnan(bf16_bits_to_f32(0x7fc0)));
}

TEST_CASE("load_model reads a Hugging Face Llama folder in fp32, bf16, fp16 and shards") {
  TempDir dir;
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::string hf = dir.file("hf");

  const std::vector<float> flat = numbered(L);
  write_hf(hf, hf_config(c), hf_tensors(L, c, flat, "F32"));
  std::vector<float> got(L.padded_total(1), -1.0f);
  load_model(hf, L, c, got.data());
  require_same(L, got, flat);
  // Exactly what the trainer would write and read back for these weights.
  save_model(dir.file("ours.safetensors"), L, got.data());
  std::vector<float> again(got.size(), -1.0f);
  load_model(dir.file("ours.safetensors"), L, c, again.data());
  require_same(L, again, flat);

  const std::vector<float> h = halves(L);
  for (const char* dtype : {"BF16", "F16"}) {
    INFO(dtype);
    write_hf(hf, hf_config(c), hf_tensors(L, c, h, dtype));
    std::fill(got.begin(), got.end(), -1.0f);
    load_model(hf, L, c, got.data());
    require_same(L, got, h);
  }

  // transformers 4.x's keys (rope_theta at the top, rope_scaling null, no rope_parameters), an
  // inv_freq buffer as older versions saved it, tie_word_embeddings absent, and the weights in
  // two shards listed by model.safetensors.index.json.
  nlohmann::json old = hf_config(c);
  old.erase("rope_parameters");
  old.erase("tie_word_embeddings");
  old["rope_scaling"] = nullptr;
  std::vector<HfTensor> ts = hf_tensors(L, c, flat, "F32");
  ts.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4}, encode(flat.data(), 4, "F32")});
  std::filesystem::remove_all(hf);
  std::filesystem::create_directories(hf);
  write_text(hf + "/config.json", old.dump());
  const size_t half = ts.size() / 2;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t k = 0; k < ts.size(); ++k)
    index["weight_map"][ts[k].name] =
        k < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  write_safetensors(hf + "/model-00001-of-00002.safetensors", {ts.begin(), ts.begin() + half});
  write_safetensors(hf + "/model-00002-of-00002.safetensors", {ts.begin() + half, ts.end()});
  write_text(hf + "/model.safetensors.index.json", index.dump());
  std::fill(got.begin(), got.end(), -1.0f);
  load_model(hf, L, c, got.data());
  require_same(L, got, flat);
}

TEST_CASE("load_model refuses Hugging Face folders that are not this model, naming why") {
  TempDir dir;
  const ModelConfig c = small_config();
  const ParamLayout L(c);
  const std::vector<float> flat = numbered(L);
  const std::vector<HfTensor> ts = hf_tensors(L, c, flat, "F32");
  const std::string hf = dir.file("hf");
  std::vector<float> got(L.padded_total(1));
  auto load = [&] { return usage_message([&] { load_model(hf, L, c, got.data()); }); };
  // The message of loading a folder with config.json changed by `edit` (and the right tensors).
  auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = hf_config(c);
    edit(j);
    write_hf(hf, j, ts);
    return load();
  };
  // The message of loading a folder whose tensors `edit` changed (and the right config).
  auto with_tensors = [&](const std::function<void(std::vector<HfTensor>&)>& edit,
                          const nlohmann::json& config) {
    std::vector<HfTensor> t = ts;
    edit(t);
    write_hf(hf, config, t);
    return load();
  };
  auto drop = [](const std::string& name) {
    return [name](std::vector<HfTensor>& t) {
      std::erase_if(t, [&](const HfTensor& x) { return x.name == name; });
    };
  };

  REQUIRE(with_config([](nlohmann::json&) {}).empty());

  std::filesystem::remove(hf + "/config.json");
  CHECK_THAT(load(), ContainsSubstring(hf + " is a directory without config.json"));
  write_text(hf + "/config.json", "{\"hidden_size\": ");
  CHECK_THAT(load(), ContainsSubstring("config.json is not a JSON object"));

  // Dimensions: the first that differs, with both values.
  CHECK_THAT(with_config([](auto& j) { j["hidden_size"] = 32; }),
             ContainsSubstring("config.json has hidden_size 32 but this run has --d-model 16"));
  CHECK_THAT(with_config([](auto& j) { j["vocab_size"] = 50257; }),
             ContainsSubstring("has vocab_size 50257 but this run has --vocab 32"));
  CHECK_THAT(with_config([](auto& j) { j["intermediate_size"] = 64; }),
             ContainsSubstring("has intermediate_size 64 but this run has --d-ff 32"));
  CHECK_THAT(with_config([](auto& j) { j["num_hidden_layers"] = 3; }),
             ContainsSubstring("has num_hidden_layers 3 but this run has --layers 2"));
  CHECK_THAT(with_config([](auto& j) { j["num_attention_heads"] = 4; }),
             ContainsSubstring("has num_attention_heads 4 but this run has --heads 2"));
  CHECK_THAT(with_config([](auto& j) { j.erase("hidden_size"); }),
             ContainsSubstring("config.json has no 'hidden_size'"));
  CHECK_THAT(with_config([](auto& j) { j["hidden_size"] = "16"; }),
             ContainsSubstring("'hidden_size' is \"16\", not an integer"));

  // Not Llama-like.
  CHECK_THAT(with_config([](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; }),
             ContainsSubstring("architectures [\"GPT2LMHeadModel\"] is not LlamaForCausalLM"));
  CHECK_THAT(with_config([](auto& j) {
               j.erase("architectures");
               j["model_type"] = "mistral";
             }),
             ContainsSubstring("names neither architectures"));
  CHECK_THAT(with_config([](auto& j) { j["num_key_value_heads"] = 1; }),
             ContainsSubstring("num_key_value_heads 1 but num_attention_heads 2: grouped-query"));
  CHECK_THAT(with_config([](auto& j) { j["head_dim"] = 4; }),
             ContainsSubstring("head_dim 4 but hidden_size / num_attention_heads is 8"));
  CHECK_THAT(with_config([](auto& j) { j["attention_bias"] = true; }),
             ContainsSubstring("attention_bias true: this model has no biases"));
  CHECK_THAT(with_config([](auto& j) { j["mlp_bias"] = true; }),
             ContainsSubstring("mlp_bias true: this model has no biases"));
  CHECK_THAT(with_config([](auto& j) { j["hidden_act"] = "gelu"; }),
             ContainsSubstring("hidden_act \"gelu\""));
  CHECK_THAT(with_config([](auto& j) { j["rms_norm_eps"] = 1e-6; }),
             ContainsSubstring("rms_norm_eps 1e-06 but this model's RMSNorm uses eps 1e-5"));
  CHECK_THAT(with_config([](auto& j) { j.erase("rms_norm_eps"); }),  // Llama's default: 1e-6
             ContainsSubstring("rms_norm_eps 1e-06"));
  CHECK_THAT(with_config([](auto& j) {
               j["rope_theta"] = 500000.0;
               j.erase("rope_parameters");
             }),
             ContainsSubstring("rope_theta 500000 but this model's RoPE uses theta 10000"));
  CHECK_THAT(with_config([](auto& j) { j["rope_parameters"]["rope_theta"] = 1e6; }),
             ContainsSubstring("rope_theta 1000000"));
  CHECK_THAT(with_config([](auto& j) {
               j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
             }),
             ContainsSubstring("rope_scaling of type \"llama3\": this model uses plain RoPE"));

  // Tensors.
  nlohmann::json tied = hf_config(c);
  tied["tie_word_embeddings"] = true;
  CHECK_THAT(with_tensors(drop("lm_head.weight"), tied),
             ContainsSubstring("ties lm_head to the embeddings (tie_word_embeddings) and has no "
                               "lm_head.weight"));
  CHECK_THAT(with_tensors(drop("model.layers.1.mlp.up_proj.weight"), hf_config(c)),
             ContainsSubstring("has no tensor 'model.layers.1.mlp.up_proj.weight' (this model's "
                               "layers.1.ffn.w3.weight)"));
  CHECK_THAT(with_tensors(
                 [&](auto& t) {
                   t.push_back({"model.layers.0.self_attn.q_proj.bias",
                                "F32",
                                {16},
                                encode(flat.data(), 16, "F32")});
                 },
                 hf_config(c)),
             ContainsSubstring("holds the bias 'model.layers.0.self_attn.q_proj.bias': this model "
                               "has no biases"));
  CHECK_THAT(
      with_tensors(
          [&](auto& t) {
            t.push_back({"model.extra.weight", "F32", {1}, encode(flat.data(), 1, "F32")});
          },
          hf_config(c)),
      ContainsSubstring("holds tensor 'model.extra.weight', which this model does not have"));
  CHECK_THAT(with_tensors(
                 [](auto& t) {
                   for (auto& x : t)
                     if (x.name == "model.layers.0.mlp.gate_proj.weight") x.shape = {16, 32};
                 },
                 hf_config(c)),
             ContainsSubstring("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [16, 32] "
                               "but this model's layers.0.ffn.w1.weight is [32, 16]"));
  CHECK_THAT(with_tensors([](auto& t) { t[0].dtype = "I32"; }, hf_config(c)),
             ContainsSubstring("tensor 'model.embed_tokens.weight' has dtype I32 (need F32, BF16, "
                               "F16 or F64)"));

  // Weight files: none, PyTorch's only, a broken index.
  write_hf(hf, hf_config(c), ts);
  std::filesystem::remove(hf + "/model.safetensors");
  CHECK_THAT(load(), ContainsSubstring("has no model.safetensors or model.safetensors.index.json"));
  write_text(hf + "/pytorch_model.bin", "x");
  CHECK_THAT(load(), ContainsSubstring("only PyTorch .bin weights"));
  write_text(hf + "/model.safetensors.index.json", "{\"weight_map\": []}");
  CHECK_THAT(load(), ContainsSubstring("not a safetensors index"));
  write_text(hf + "/model.safetensors.index.json",
             R"({"weight_map": {"lm_head.weight": "missing.safetensors"}})");
  CHECK_THAT(load(), ContainsSubstring("missing.safetensors"));
}
