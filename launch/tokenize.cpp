// tokenize: byte-level tokenizer (vocab 256, token id = byte value).
//
//   tokenize --out-train train.npy --out-val val.npy [--val-fraction 0.05] FILE...
//
// Concatenates the bytes of FILE... in the order given, writes the last val-fraction of them as
// the validation set and the rest as the training set. Outputs ending in .npy are NumPy uint16
// arrays, anything else raw little-endian uint16 (.bin); both are what the trainer's --data reads.
// Exit codes: 0 success, 2 bad usage or unreadable/unwritable files.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/tool_main.h"
#include "runtime/data.h"

namespace {

int run(const std::string& out_train, const std::string& out_val, double val_fraction,
        const std::vector<std::string>& inputs) {
  using namespace trainer;
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    usage_error("--val-fraction {} must be in [0, 1)", val_fraction);
  if (out_train == out_val) usage_error("--out-train and --out-val are both '{}'", out_train);

  // Map every input first so an unreadable file is reported before anything is written.
  std::vector<MappedFile> files;
  size_t total = 0;
  for (const std::string& path : inputs) {
    files.push_back(MappedFile::open(path, "input file"));
    total += files.back().size();
  }
  if (total == 0) usage_error("the input files hold no bytes");

  std::vector<uint16_t> tokens;
  tokens.reserve(total);
  for (const MappedFile& f : files) tokens.insert(tokens.end(), f.bytes(), f.bytes() + f.size());

  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_val = std::min<int64_t>(n, std::llround(double(n) * val_fraction));
  const int64_t n_train = n - n_val;
  write_token_file(out_train, tokens.data(), n_train);
  write_token_file(out_val, tokens.data() + n_train, n_val);
  std::printf("tokenize: %zu file(s), %lld bytes, byte-level vocab 256\n", inputs.size(),
              static_cast<long long>(n));
  std::printf("  train: %lld tokens -> %s\n", static_cast<long long>(n_train), out_train.c_str());
  std::printf("  val:   %lld tokens -> %s\n", static_cast<long long>(n_val), out_val.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Byte-level tokenizer: concatenates FILE... into uint16 token files (vocab 256)."};
  std::string out_train, out_val;
  double val_fraction = 0.05;
  std::vector<std::string> inputs;
  app.add_option("--out-train", out_train, "training tokens (.npy, or raw uint16 otherwise)")
      ->required();
  app.add_option("--out-val", out_val, "validation tokens (.npy, or raw uint16 otherwise)")
      ->required();
  app.add_option("--val-fraction", val_fraction,
                 "fraction of the bytes, taken from the end, "
                 "that go to validation, in [0, 1)")
      ->capture_default_str();
  app.add_option("FILE", inputs, "text files, concatenated in the order given")->required();
  return trainer::tool_main("tokenize", app, argc, argv,
                            [&] { return run(out_train, out_val, val_fraction, inputs); });
}
