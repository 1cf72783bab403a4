// Gradient synchronisation: the five --ddp strategies of SPEC.md behind one mechanism.
//
// Every strategy splits the flat gradient buffer into contiguous "units" and decides when each
// unit's collective starts:
//   none      no units (world 1 only)
//   naive     one unit per tensor, all launched after backward
//   flat      one unit covering the whole buffer, launched after backward
//   overlap   one unit per tensor, launched as soon as that tensor's gradient is final
//   bucketed  tensors grouped into buckets of at most --bucket-mb in backward order; a bucket is
//             launched as soon as its last tensor is final
// Without ZeRO-1 a unit's collective is an all-reduce; with --shard-optim it is a reduce-scatter
// in which each rank receives the part of the unit that falls in its shard; with whole copies
// (--grad-transport ce --grad-reduce bf16) it is gather_copies, after which every rank holds
// every rank's bf16 gradient of the unit and the optimizer adds them. Gradients are pre-scaled by
// 1/(global tokens), so the sum over ranks is the mean gradient.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace trainer {

enum class SyncStrategy { kNone, kNaive, kFlat, kOverlap, kBucketed };
SyncStrategy parse_sync_strategy(const std::string& s);  // UsageError for unknown names
const char* sync_strategy_name(SyncStrategy s);

// The tensors of the flat buffer, in buffer order (= the order backward finalises them): tensor i
// occupies elements tensors[i]; gaps between tensors are alignment padding.
using TensorRanges = std::vector<Range>;

// ZeRO-1 shards: `world` equal contiguous slices of the (padded) flat buffer; flat_elems is a
// multiple of world * align so every shard starts on an aligned element.
struct ShardPlan {
  int world = 1;
  int64_t flat_elems = 0;
  ShardPlan() = default;
  ShardPlan(int world, int64_t flat_elems, int64_t align);
  int64_t shard_elems() const { return flat_elems / world; }
  Range shard(int rank) const { return {rank * shard_elems(), (rank + 1) * shard_elems()}; }
  // Elements of `unit` that fall in each rank's shard, in rank order (sums to unit.size()).
  std::vector<int64_t> counts_in(Range unit) const;
};

// A contiguous range of the flat buffer holding tensors [first_tensor, last_tensor].
struct GradUnit {
  Range range;
  int first_tensor = 0;
  int last_tensor = 0;
  int64_t grad_bytes = 0;  // bytes of gradient it carries (sum of its tensors, without padding)
};

// ZeRO-1 updates its slice in parts, so that each part's all-gather runs while the next part is
// updated: parts of `bucket_bytes` of fp32 parameters but at least 1/kMaxUpdateParts of the slice
// (each collective costs a launch and a sync), whole multiples of `align` elements, the last part
// shorter; bucket_bytes <= 0 gives one part.
constexpr int kMaxUpdateParts = 16;
std::vector<Range> plan_update_parts(int64_t shard_elems, double bucket_bytes, int64_t align);

// Greedy buckets in backward order: a bucket takes tensors while their gradient bytes stay within
// `bucket_bytes`; a tensor larger than that gets a bucket of its own. bucket_bytes <= 0 means one
// unbounded bucket. Units cover [0, flat_elems) without gaps (padding belongs to the unit before).
std::vector<GradUnit> plan_buckets(const TensorRanges& tensors, int64_t flat_elems,
                                   double bucket_bytes, int64_t elem_bytes = 4);
// The units of a strategy (bucket_bytes only matters for kBucketed).
std::vector<GradUnit> plan_units(SyncStrategy s, const TensorRanges& tensors, int64_t flat_elems,
                                 double bucket_bytes, int64_t elem_bytes = 4);
std::string describe_units(const std::vector<GradUnit>& units);

class GradSync {
 public:
  // `shards` null: all-reduce (every rank gets the whole averaged gradient); else reduce-scatter.
  // `copies`: gather_copies instead of an all-reduce (no shards).
  GradSync(Communicator& comm, const TensorRanges& tensors, BufferView grads, SyncStrategy strategy,
           double bucket_bytes, const ShardPlan* shards, bool copies = false);

  const std::vector<GradUnit>& units() const { return units_; }
  SyncStrategy strategy() const { return strategy_; }

  // Called before each micro-step's backward; `reduce` is true only on the last micro-step of a
  // step, so gradients are reduced once per step.
  void begin_backward(bool reduce);
  // Backward's GradReadyFn: tensor `index` (and every tensor before it) is final.
  void on_ready(int index);
  // After backward: launches whatever has not started, then waits for the collectives of the
  // units that begin before element `end` (those before it, in launch order, are waited for
  // too); finish() waits for every one. The optimizer reads the gradients up to the last unit
  // while that unit's collective still runs.
  void finish_before(int64_t end);
  void finish() { finish_before(grads_.count); }

 private:
  void launch(size_t unit);

  Communicator& comm_;
  BufferView grads_;
  SyncStrategy strategy_;
  const ShardPlan* shards_;
  bool copies_;
  std::vector<GradUnit> units_;
  std::vector<int> unit_of_last_tensor_;  // tensor index -> unit it completes, or -1
  bool reduce_ = false;
  bool eager_ = false;  // launch during backward (overlap, bucketed)
  size_t next_unit_ = 0;
  std::vector<CommHandle> in_flight_;  // of units [waited_, next_unit_), in unit order
  size_t waited_ = 0;
};

}  // namespace trainer
