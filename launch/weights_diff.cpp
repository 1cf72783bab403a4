// weights_diff: how far apart two sets of weights are, in SPEC.md's measure of equivalence.
//
//   weights_diff A B [--tol 1e-5]
//
// A and B are model.safetensors files or checkpoint directories (DIR/model.safetensors). Both
// must hold the same F32 tensors under the same names and shapes. Prints max |A - B| / max |A|
// over all tensors and the tensor where |A - B| is largest; with --tol, exits 1 when the relative
// difference exceeds it. Exit codes: 0 within tolerance, 1 beyond it, 2 unreadable or mismatched
// files.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/tool_main.h"
#include "runtime/safetensors.h"

namespace {

std::string weights_file(const std::string& path) {
  namespace fs = std::filesystem;
  return fs::is_directory(path) ? (fs::path(path) / "model.safetensors").string() : path;
}

int run(const std::string& path_a, const std::string& path_b, double tol) {
  using namespace trainer;
  const auto a = SafetensorsReader::open(weights_file(path_a));
  const auto b = SafetensorsReader::open(weights_file(path_b));
  if (a.names().size() != b.names().size())
    usage_error("{} holds {} tensors, {} holds {}", a.path(), a.names().size(), b.path(),
                b.names().size());
  double max_a = 0, max_diff = 0;
  std::string worst;
  std::vector<float> xa, xb;
  for (const std::string& name : a.names()) {
    const std::vector<int64_t>& shape = a.info(name).shape;
    xa.resize(a.info(name).numel());
    xb.resize(xa.size());
    a.read_f32(name, shape, xa.data());
    b.read_f32(name, shape, xb.data());  // names b's file and tensor if missing or misshapen
    for (size_t i = 0; i < xa.size(); ++i) {
      max_a = std::max(max_a, std::fabs(static_cast<double>(xa[i])));
      const double d = std::fabs(static_cast<double>(xa[i]) - xb[i]);
      if (!(d <= max_diff)) {  // NaN counts as the largest difference
        max_diff = std::isnan(d) ? INFINITY : d;
        worst = name;
      }
    }
  }
  const double rel = max_a > 0 ? max_diff / max_a : max_diff;
  std::printf("max |A - B| / max |A| = %.3g over %zu tensors (max |A - B| %.3g%s%s)\n", rel,
              a.names().size(), max_diff, worst.empty() ? "" : " in ", worst.c_str());
  if (tol > 0 && !(rel <= tol)) {
    std::printf("beyond --tol %g\n", tol);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Compares two sets of weights: max |A - B| / max |A| over every tensor."};
  std::string a, b;
  double tol = 0;
  app.add_option("A", a, "model.safetensors or a checkpoint directory (the reference)")->required();
  app.add_option("B", b, "model.safetensors or a checkpoint directory")->required();
  app.add_option("--tol", tol, "exit 1 when the relative difference exceeds this (0: report only)");
  return trainer::tool_main("weights_diff", app, argc, argv, [&] { return run(a, b, tol); });
}
