// Bucket plans and shard plans, checked exactly on the tiny preset.
#include <numeric>

#include "comm/grad_sync.h"
#include "model/layout.h"
#include "tests/catch.h"

using namespace trainer;

namespace {

TensorRanges ranges_of(const ParamLayout& L) {
  TensorRanges r;
  for (const auto& t : L.tensors()) r.push_back(t.range());
  return r;
}

// Units must tile [0, flat) in order, each covering whole tensors.
void require_tiling(const std::vector<GradUnit>& units, int64_t flat, int n_tensors) {
  REQUIRE_FALSE(units.empty());
  REQUIRE(units.front().range.begin == 0);
  REQUIRE(units.back().range.end == flat);
  REQUIRE(units.front().first_tensor == 0);
  REQUIRE(units.back().last_tensor == n_tensors - 1);
  for (size_t i = 1; i < units.size(); ++i) {
    REQUIRE(units[i].range.begin == units[i - 1].range.end);
    REQUIRE(units[i].first_tensor == units[i - 1].last_tensor + 1);
  }
}

}  // namespace

TEST_CASE("bucket plans of the tiny preset") {
  const ModelConfig c = preset("tiny");  // d 128, d_ff 512, 2 layers, vocab 10000
  const ParamLayout L(c);
  const TensorRanges t = ranges_of(L);
  const int n = static_cast<int>(t.size());
  const int64_t flat = L.padded_total(1);

  SECTION("0.0001 MiB: every tensor is larger than a bucket, so each gets its own") {
    auto units = plan_buckets(t, flat, 0.0001 * 1048576, 4);
    REQUIRE(units.size() == static_cast<size_t>(n));
    require_tiling(units, flat, n);
    for (int i = 0; i < n; ++i) REQUIRE(units[i].grad_bytes == L.tensors()[i].numel * 4);
  }
  SECTION("unbounded: one bucket holding everything") {
    auto units = plan_buckets(t, flat, 0, 4);
    REQUIRE(units.size() == 1);
    require_tiling(units, flat, n);
    REQUIRE(units[0].grad_bytes == L.param_count() * 4);
  }
  SECTION("1 MiB: greedy packing in backward order") {
    // Tensor bytes (f32) in buffer order: 0 lm_head 5,120,000; 1 ln_final 512; 2..10 layer 1 =
    // w2, w3, w1 262,144 each, ln2 512, output/v/k/q 65,536 each, ln1 512; 11..19 layer 0 alike;
    // 20 token_embeddings 5,120,000. Greedy at 1,048,576 B:
    //   {0}                    5,120,000 (larger than a bucket: alone)
    //   {1..8}   ln_final..k     984,064 (+ q would make 1,049,600)
    //   {9..16}  q, ln1, L0 w2..k 984,064 (+ L0.q would make 1,049,600)
    //   {17..19} L0 q..ln1       131,584 (+ embeddings would overflow)
    //   {20}                   5,120,000
    auto units = plan_buckets(t, flat, 1048576, 4);
    require_tiling(units, flat, n);
    std::vector<std::pair<int, int>> got;
    for (const auto& u : units) got.push_back({u.first_tensor, u.last_tensor});
    const std::vector<std::pair<int, int>> want = {{0, 0}, {1, 8}, {9, 16}, {17, 19}, {20, 20}};
    REQUIRE(got == want);
    REQUIRE(units[1].grad_bytes == 984064);
    REQUIRE(units[3].grad_bytes == 131584);
    for (const auto& u : units)
      REQUIRE((u.grad_bytes <= 1048576 || u.first_tensor == u.last_tensor));
  }
}

TEST_CASE("strategy units") {
  const ParamLayout L(preset("tiny"));
  const TensorRanges t = ranges_of(L);
  const int64_t flat = L.padded_total(3);
  REQUIRE(plan_units(SyncStrategy::kNone, t, flat, 0).empty());
  REQUIRE(plan_units(SyncStrategy::kFlat, t, flat, 0).size() == 1);
  REQUIRE(plan_units(SyncStrategy::kNaive, t, flat, 0).size() == t.size());
  REQUIRE(plan_units(SyncStrategy::kOverlap, t, flat, 0).size() == t.size());
  require_tiling(plan_units(SyncStrategy::kOverlap, t, flat, 0), flat, static_cast<int>(t.size()));
  REQUIRE(plan_units(SyncStrategy::kBucketed, t, flat, 25 * 1048576.0).size() == 1);
  REQUIRE_THROWS_AS(parse_sync_strategy("ring"), UsageError);
}

TEST_CASE("shard plans are equal, aligned and split units by owner") {
  const ParamLayout L(preset("tiny"));
  for (int world : {1, 2, 3, 4, 5}) {
    const int64_t flat = L.padded_total(world);
    ShardPlan s(world, flat, ParamLayout::kAlignElems);
    int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      REQUIRE(s.shard(r).begin % ParamLayout::kAlignElems == 0);
      REQUIRE(s.shard(r).size() == s.shard_elems());
      covered += s.shard(r).size();
    }
    REQUIRE(covered == flat);
    // Shards differ from an exact 1/world split by less than one alignment unit per rank.
    REQUIRE(s.shard_elems() * world - L.total() < ParamLayout::kAlignElems * world);
    for (const auto& u : plan_buckets(ranges_of(L), flat, 1048576, 4)) {
      auto counts = s.counts_in(u.range);
      REQUIRE(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == u.range.size());
    }
  }
  ShardPlan s(2, 256, 64);
  REQUIRE(s.counts_in({100, 200}) == std::vector<int64_t>{28, 72});
}

TEST_CASE("ZeRO-1 update parts tile the slice in aligned pieces of the bucket size") {
  // 1 MiB of fp32 = 262144 elements, a multiple of 64.
  auto parts = plan_update_parts(1000000, 1048576.0, 64);
  REQUIRE(parts.size() == 4);
  REQUIRE(parts[0] == Range{0, 262144});
  REQUIRE(parts[3] == Range{786432, 1000000});
  // Odd sizes round up to the alignment; tiny buckets still give one aligned unit.
  REQUIRE(plan_update_parts(200, 100.0, 64)[0] == Range{0, 64});
  REQUIRE(plan_update_parts(200, 100.0, 64).size() == 4);
  REQUIRE(plan_update_parts(200, 4 * 65.0, 64)[0] == Range{0, 128});
  // Never more than 16 parts: small buckets on a large slice give sixteenths.
  parts = plan_update_parts(16 * 6400 + 1, 4.0, 64);
  REQUIRE(parts.size() == 16);
  REQUIRE(parts[0] == Range{0, 6464});
  REQUIRE(parts[15].end == 16 * 6400 + 1);
  // No bucket size: one part; an empty slice: one empty part.
  REQUIRE(plan_update_parts(1000, 0, 64) == std::vector<Range>{Range{0, 1000}});
  REQUIRE(plan_update_parts(0, 1048576.0, 64) == std::vector<Range>{Range{0, 0}});
}
