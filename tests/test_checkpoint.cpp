// Checkpoint files: what load_model and load_checkpoint accept and what they refuse by name; the
// signals that make a run stop with a checkpoint.
#include <csignal>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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
