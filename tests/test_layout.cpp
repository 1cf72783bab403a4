#include <set>

#include "model/config.h"
#include "model/layout.h"
#include "tests/catch.h"

using namespace trainer;

TEST_CASE("layout covers every SPEC tensor once, aligned, in backward order") {
  ModelConfig c = preset("tiny");
  c.vocab = 37;
  ParamLayout L(c);
  REQUIRE(L.tensors().size() == 2 + 9 * 2 + 1);
  REQUIRE(L.param_count() == param_count(c));
  REQUIRE(L.tensors().front().name == "lm_head.weight");
  REQUIRE(L.tensors()[1].name == "ln_final.weight");
  REQUIRE(L.tensors()[2].name == "layers.1.ffn.w2.weight");
  REQUIRE(L.tensors().back().name == "token_embeddings.weight");
  int64_t prev_end = 0;
  std::set<std::string> names;
  for (const auto& t : L.tensors()) {
    REQUIRE(t.offset % ParamLayout::kAlignElems == 0);
    REQUIRE(t.offset >= prev_end);
    prev_end = t.offset + t.numel;
    names.insert(t.name);
  }
  REQUIRE(names.size() == L.tensors().size());
  REQUIRE(L.total() >= prev_end);
  REQUIRE(L.find("layers.0.ffn.w1.weight").shape == std::vector<int64_t>{512, 128});
  REQUIRE(L.find("layers.0.ffn.w2.weight").shape == std::vector<int64_t>{128, 512});
  REQUIRE(L.find("lm_head.weight").shape == std::vector<int64_t>{37, 128});
  auto spec = L.spec_order();
  REQUIRE(spec.front()->name == "token_embeddings.weight");
  REQUIRE(spec[1]->name == "layers.0.attn.q_proj.weight");
  REQUIRE(spec.back()->name == "lm_head.weight");
  REQUIRE_THROWS_AS(L.find("layers.9.ffn.w1.weight"), UsageError);
}

TEST_CASE("preset parameter counts match SPEC.md") {
  REQUIRE(param_count(preset("small")) == 128625408);
  REQUIRE(param_count(preset("medium")) == 423183360);
  REQUIRE(param_count(preset("large")) == 969411840);
  REQUIRE(param_count(preset("xl")) == 1998235200);
  REQUIRE(param_count(preset("2.7B")) == 3406809600);
  REQUIRE_THROWS_AS(preset("huge"), UsageError);
}

TEST_CASE("MFU's peak comes from the GPU's name and the precision") {
  REQUIRE(peak_tflops("NVIDIA H200", Precision::kBf16) == 989);
  REQUIRE(peak_tflops("NVIDIA H100 80GB HBM3", Precision::kTf32) == 494);
  REQUIRE(peak_tflops("NVIDIA GH200 480GB", Precision::kFp32) == 67);
  REQUIRE(peak_tflops("NVIDIA H100 PCIe", Precision::kBf16) == 756);  // not the SXM figure
  REQUIRE(peak_tflops("NVIDIA H100 NVL", Precision::kBf16) == 835);
  REQUIRE(peak_tflops("NVIDIA A100-SXM4-80GB", Precision::kBf16) == 312);
  REQUIRE(peak_tflops("NVIDIA GeForce RTX 4090", Precision::kBf16) == 0);  // unknown: no MFU
  REQUIRE(peak_tflops("", Precision::kFp32) == 0);                         // the CPU
}

TEST_CASE("padded_total gives equal aligned shards") {
  ParamLayout L(preset("tiny"));
  for (int w : {1, 2, 3, 4, 5}) {
    int64_t p = L.padded_total(w);
    REQUIRE(p >= L.total());
    REQUIRE(p % (ParamLayout::kAlignElems * w) == 0);
  }
}

TEST_CASE("forward_parts tile the buffer: the head, each block, the embedding") {
  for (const std::string name : {"tiny", "small", "2.7B"}) {
    INFO(name);
    const ModelConfig c = preset(name);
    ParamLayout L(c);
    const std::vector<Range> parts = L.forward_parts();
    REQUIRE(parts.size() == static_cast<size_t>(c.n_layers + 2));
    CHECK(parts.front().begin == 0);
    CHECK(parts.back().end == L.total());
    CHECK(parts.back().begin == L.find("token_embeddings.weight").offset);
    for (size_t i = 1; i < parts.size(); ++i) CHECK(parts[i].begin == parts[i - 1].end);
    for (int l = 0; l < c.n_layers; ++l)
      CHECK(parts[static_cast<size_t>(c.n_layers - l)].begin == L.block_offset(l));
  }
}
