// generate: text from a trained model. Loads the weights (the trainer's model.safetensors, a
// step_N checkpoint, a run's --out directory or a Hugging Face folder) and the tokenizer, encodes
// the prompt, and prints each sample as its tokens are drawn (on the GPU when there is one).
//
//   build/generate --model runs/demo --prompt "The meaning of life" --samples 3
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_buffer.h"
#include "core/error.h"
#include "launch/tool_main.h"
#include "model/decoder.h"
#include "model/layout.h"
#include "runtime/checkpoint.h"
#include "runtime/generate.h"
#include "runtime/tokenizer.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// What --model names, as the path load_model reads: a file, a Hugging Face folder (config.json),
// a directory holding model.safetensors (a checkpoint, a finished run), or a run directory whose
// newest step_N checkpoint is taken (a run stopped before writing its final weights).
std::string resolve_model(const std::string& path) {
  if (!fs::exists(path)) usage_error("--model {}: no such file or directory", path);
  if (!fs::is_directory(path)) return path;
  if (fs::exists(fs::path(path) / "config.json")) return path;
  if (fs::exists(fs::path(path) / "model.safetensors"))
    return (fs::path(path) / "model.safetensors").string();
  const std::string step = latest_checkpoint(path);
  if (!step.empty()) return (fs::path(step) / "model.safetensors").string();
  usage_error(
      "--model {}: a directory with neither model.safetensors, config.json nor a step_N "
      "checkpoint",
      path);
}

// The tokenizer: --tokenizer FILE, or "bytes" (byte-level models: id = byte), or the
// tokenizer.json beside the weights: in a Hugging Face folder, in a run's --out (the trainer
// copies the data's tokenizer there), or in the run above a step_N checkpoint.
struct TextCodec {
  std::optional<BpeTokenizer> bpe;  // empty: bytes
  std::string source;

  std::vector<int32_t> encode(const std::string& text) const {
    if (bpe) return bpe->encode(text);
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data() + text.size()));
  }
  std::string decode_one(int32_t id) const {
    if (bpe) return bpe->decode_one(id);
    return id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
};

TextCodec load_codec(const std::string& flag, const std::string& model_path, const ModelConfig& c) {
  TextCodec t;
  std::string file = flag;
  if (file.empty()) {
    const fs::path dir =
        fs::is_directory(model_path) ? fs::path(model_path) : fs::path(model_path).parent_path();
    std::vector<fs::path> places = {dir};
    if (dir.filename().string().starts_with("step_")) places.push_back(dir.parent_path());
    for (const fs::path& p : places)
      if (file.empty() && fs::exists(p / "tokenizer.json")) file = (p / "tokenizer.json").string();
    if (file.empty())
      usage_error(
          "no tokenizer.json beside {}: pass --tokenizer FILE (launch/prepare_text.py writes one "
          "next to the token files) or --tokenizer bytes for a byte-level model",
          model_path);
  }
  if (file == "bytes") {
    if (c.vocab < 256)
      usage_error("--tokenizer bytes needs a vocabulary of at least 256 ids (the model has {})",
                  c.vocab);
    t.source = "bytes (id = byte)";
    return t;
  }
  t.bpe.emplace(BpeTokenizer::load(file));
  t.source = file;
  if (t.bpe->vocab_size() > c.vocab)
    usage_error("{} has {} token ids but the model's vocabulary has {}: not this model's tokenizer",
                file, t.bpe->vocab_size(), c.vocab);
  return t;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage_error("--prompt-file {}: cannot read it", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void print_bytes(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"generate: sample text from a trained model"};
  std::string model, tokenizer, prompt, prompt_file, device = "auto", precision = "auto";
  std::string eot = "<|endoftext|>";
  SamplingOptions sampling;
  sampling.top_k = 50;
  int64_t max_new = 200, samples = 1;
  uint64_t seed = 1234;
  int gpu = 0;
  bool no_stop = false, quiet = false;
  app.add_option("--model", model,
                 "model.safetensors, a step_N checkpoint, a run's --out directory or a Hugging "
                 "Face folder")
      ->required();
  app.add_option("--tokenizer", tokenizer,
                 "tokenizer.json, or 'bytes' for a byte-level model [default: the tokenizer.json "
                 "beside the model]");
  app.add_option("--prompt", prompt, "text the samples continue [default: none: start a document]");
  app.add_option("--prompt-file", prompt_file, "read the prompt from this file")
      ->excludes("--prompt");
  app.add_option("--max-new-tokens", max_new, "tokens to generate per sample")
      ->capture_default_str();
  app.add_option("--temperature", sampling.temperature, "softmax temperature; 0 is greedy")
      ->capture_default_str();
  app.add_option("--top-k", sampling.top_k, "sample from the k most likely tokens; 0: all")
      ->capture_default_str();
  app.add_option("--top-p", sampling.top_p, "nucleus: the most likely tokens holding this mass")
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed: the same seed gives the same samples")
      ->capture_default_str();
  app.add_option("--samples", samples, "number of samples")->capture_default_str();
  app.add_option("--device", device, "auto (a GPU when there is one), cpu or cuda")
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "auto (bf16 on a GPU, fp32 on the CPU), bf16, fp16 or fp32")
      ->capture_default_str();
  app.add_option("--gpu", gpu, "GPU index")->capture_default_str();
  app.add_option("--eot", eot, "end-of-text token: a sample stops after it")->capture_default_str();
  app.add_flag("--no-stop", no_stop, "do not stop at the end-of-text token");
  app.add_flag("--quiet", quiet, "print the samples only (no statistics on stderr)");

  return tool_main("generate", app, argc, argv, [&]() -> int {
    validate(sampling);
    if (max_new < 1) usage_error("--max-new-tokens must be >= 1 (got {})", max_new);
    if (samples < 1) usage_error("--samples must be >= 1 (got {})", samples);
    if (device == "auto") device = cuda_available() ? "cuda" : "cpu";
    if (device != "cpu" && device != "cuda")
      usage_error("--device must be auto, cpu or cuda (got '{}')", device);
    if (precision == "auto") precision = device == "cuda" ? "bf16" : "fp32";
    if (precision != "bf16" && precision != "fp16" && precision != "fp32")
      usage_error("--precision must be auto, bf16, fp16 or fp32 (got '{}')", precision);
    if (device == "cpu" && precision != "fp32")
      usage_error("--precision {}: the CPU decoder computes in fp32", precision);

    const std::string path = resolve_model(model);
    const ModelConfig c = read_model_config(path);
    const TextCodec codec = load_codec(tokenizer, path, c);
    std::optional<int32_t> eot_id;
    if (codec.bpe) eot_id = codec.bpe->token_id(eot);
    if (!prompt_file.empty()) prompt = read_text(prompt_file);
    std::vector<int32_t> ids = codec.encode(prompt);
    if (ids.empty()) {
      // An empty prompt starts a new document, as the end-of-text token does in the training data.
      if (!eot_id)
        usage_error("an empty prompt needs an end-of-text token to start from, and {} has no '{}'",
                    codec.source, eot);
      ids.push_back(*eot_id);
    }
    if (static_cast<int64_t>(ids.size()) >= c.ctx)
      usage_error("the prompt is {} tokens; the model's context is {}: shorten it", ids.size(),
                  c.ctx);

    const ParamLayout layout(c);
    std::vector<float> params(layout.total(), 0.0f);
    load_model(path, layout, c, params.data());
    const std::unique_ptr<Decoder> decoder =
        device == "cuda" ? make_cuda_decoder(c, params.data(),
                                             precision == "bf16"   ? Precision::kBf16
                                             : precision == "fp16" ? Precision::kFp16
                                                                   : Precision::kFp32,
                                             gpu)
                         : make_cpu_decoder(c, params.data());
    params = {};
    if (!quiet)
      std::fprintf(stderr, "generate: %s, %s; tokenizer %s; prompt %zu tokens\n",
                   describe(c).c_str(), decoder->describe().c_str(), codec.source.c_str(),
                   ids.size());

    GenerateOptions go;
    go.max_new_tokens = max_new;
    if (!no_stop) go.stop_token = eot_id;
    for (int64_t s = 0; s < samples; ++s) {
      if (samples > 1) print_bytes(fmt::format("{}--- sample {} ---\n", s ? "\n" : "", s + 1));
      print_bytes(prompt);
      TokenSampler sampler(sampling, seed + static_cast<uint64_t>(s));
      const GenerateResult r = generate(*decoder, ids, go, sampler, [&](int32_t id) {
        if (!(go.stop_token && id == *go.stop_token)) print_bytes(codec.decode_one(id));
      });
      print_bytes("\n");
      if (!quiet) {
        const int64_t n = static_cast<int64_t>(r.tokens.size());
        std::fprintf(stderr, "generate: %lld tokens, %.1f tokens/s (prompt %.3f s)%s\n",
                     static_cast<long long>(n),
                     n > 1 ? (n - 1) / std::max(r.decode_seconds, 1e-9) : 0.0, r.prefill_seconds,
                     r.stopped        ? ", ended at end-of-text"
                     : r.context_full ? ", stopped at the model's context length"
                                      : "");
      }
    }
    return 0;
  });
}
