#include "comm/grad_sync.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace trainer {

SyncStrategy parse_sync_strategy(const std::string& s) {
  if (s == "none") return SyncStrategy::kNone;
  if (s == "naive") return SyncStrategy::kNaive;
  if (s == "flat") return SyncStrategy::kFlat;
  if (s == "overlap") return SyncStrategy::kOverlap;
  if (s == "bucketed") return SyncStrategy::kBucketed;
  usage_error("--ddp '{}' is not a strategy (none, naive, flat, overlap, bucketed)", s);
}

const char* sync_strategy_name(SyncStrategy s) {
  switch (s) {
    case SyncStrategy::kNone:
      return "none";
    case SyncStrategy::kNaive:
      return "naive";
    case SyncStrategy::kFlat:
      return "flat";
    case SyncStrategy::kOverlap:
      return "overlap";
    case SyncStrategy::kBucketed:
      return "bucketed";
  }
  return "?";
}

ShardPlan::ShardPlan(int w, int64_t flat, int64_t align) : world(w), flat_elems(flat) {
  TRAINER_CHECK(world >= 1 && flat_elems % (world * align) == 0,
                "flat buffer of {} elements cannot be cut into {} aligned shards", flat_elems,
                world);
}

std::vector<int64_t> ShardPlan::counts_in(Range unit) const {
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = unit.intersect(shard(r)).size();
  return counts;
}

namespace {

// Unit holding tensors [first, last]; it ends where the next tensor starts (or at flat_elems).
GradUnit make_unit(const TensorRanges& t, int64_t flat_elems, int first, int last,
                   int64_t elem_bytes) {
  GradUnit u;
  u.first_tensor = first;
  u.last_tensor = last;
  u.range.begin = first == 0 ? 0 : t[first].begin;
  u.range.end = last + 1 < static_cast<int>(t.size()) ? t[last + 1].begin : flat_elems;
  for (int i = first; i <= last; ++i) u.grad_bytes += t[i].size() * elem_bytes;
  return u;
}

}  // namespace

std::vector<GradUnit> plan_buckets(const TensorRanges& tensors, int64_t flat_elems,
                                   double bucket_bytes, int64_t elem_bytes) {
  const int n = static_cast<int>(tensors.size());
  std::vector<GradUnit> units;
  if (bucket_bytes <= 0) {
    units.push_back(make_unit(tensors, flat_elems, 0, n - 1, elem_bytes));
    return units;
  }
  int first = 0;
  double bytes = 0;
  for (int i = 0; i < n; ++i) {
    const double b = static_cast<double>(tensors[i].size() * elem_bytes);
    if (i > first && bytes + b > bucket_bytes) {
      units.push_back(make_unit(tensors, flat_elems, first, i - 1, elem_bytes));
      first = i;
      bytes = 0;
    }
    bytes += b;
  }
  units.push_back(make_unit(tensors, flat_elems, first, n - 1, elem_bytes));
  return units;
}

std::vector<GradUnit> plan_units(SyncStrategy s, const TensorRanges& tensors, int64_t flat_elems,
                                 double bucket_bytes, int64_t elem_bytes) {
  const int n = static_cast<int>(tensors.size());
  std::vector<GradUnit> units;
  switch (s) {
    case SyncStrategy::kNone:
      break;
    case SyncStrategy::kFlat:
      units.push_back(make_unit(tensors, flat_elems, 0, n - 1, elem_bytes));
      break;
    case SyncStrategy::kNaive:
    case SyncStrategy::kOverlap:
      for (int i = 0; i < n; ++i) units.push_back(make_unit(tensors, flat_elems, i, i, elem_bytes));
      break;
    case SyncStrategy::kBucketed:
      units = plan_buckets(tensors, flat_elems, bucket_bytes, elem_bytes);
      break;
  }
  return units;
}

std::vector<Range> plan_update_parts(int64_t shard_elems, double bucket_bytes, int64_t align) {
  int64_t part = shard_elems;
  if (bucket_bytes > 0) {
    const int64_t want = std::max(static_cast<int64_t>(bucket_bytes / 4),
                                  (shard_elems + kMaxUpdateParts - 1) / kMaxUpdateParts);
    part = std::max<int64_t>(align, (want + align - 1) / align * align);
  }
  std::vector<Range> parts;
  for (int64_t at = 0; at < shard_elems; at += part)
    parts.push_back({at, std::min(shard_elems, at + part)});
  if (parts.empty()) parts.push_back({0, 0});
  return parts;
}

std::string describe_units(const std::vector<GradUnit>& units) {
  if (units.empty()) return "no collectives";
  double total = 0, largest = 0, smallest = 1e300;
  for (const auto& u : units) {
    const double mib = u.grad_bytes / 1048576.0;
    total += mib;
    largest = std::max(largest, mib);
    smallest = std::min(smallest, mib);
  }
  std::string sizes;
  for (size_t i = 0; i < units.size() && i < 12; ++i)
    sizes += fmt::format("{}{:.2f}", i ? " " : "", units[i].grad_bytes / 1048576.0);
  if (units.size() > 12) sizes += " ...";
  return fmt::format("{} units, {:.2f} MiB in all (smallest {:.2f}, largest {:.2f}); MiB each: {}",
                     units.size(), total, smallest, largest, sizes);
}

GradSync::GradSync(Communicator& comm, const TensorRanges& tensors, BufferView grads,
                   SyncStrategy strategy, double bucket_bytes, const ShardPlan* shards, bool copies)
    : comm_(comm), grads_(grads), strategy_(strategy), shards_(shards), copies_(copies) {
  TRAINER_CHECK(!(copies && shards), "whole gradient copies with ZeRO-1 shards");
  if (strategy == SyncStrategy::kNone && comm.world() > 1)
    usage_error(
        "--ddp none needs a single rank (world is {}); pick naive, flat, overlap or "
        "bucketed",
        comm.world());
  units_ = plan_units(strategy, tensors, grads.count, bucket_bytes,
                      static_cast<int64_t>(dtype_size(grads.dtype)));
  unit_of_last_tensor_.assign(tensors.size(), -1);
  for (size_t u = 0; u < units_.size(); ++u) unit_of_last_tensor_[units_[u].last_tensor] = u;
  eager_ = strategy == SyncStrategy::kOverlap || strategy == SyncStrategy::kBucketed;
  if (shards_)
    TRAINER_CHECK(shards_->flat_elems == grads.count, "shards cover {} elements, grads {}",
                  shards_->flat_elems, grads.count);
}

void GradSync::begin_backward(bool reduce) {
  TRAINER_CHECK(in_flight_.empty() && next_unit_ == 0, "previous step's gradients not finished");
  reduce_ = reduce && comm_.world() > 1 && !units_.empty();
}

void GradSync::launch(size_t u) {
  const Range r = units_[u].range;
  BufferView view = grads_.slice(r.begin, r.size());
  in_flight_.push_back(shards_   ? comm_.reduce_scatter_sum(view, shards_->counts_in(r))
                       : copies_ ? comm_.gather_copies(view)
                                 : comm_.all_reduce_sum(view));
}

void GradSync::on_ready(int index) {
  if (!reduce_ || !eager_) return;
  const int u = unit_of_last_tensor_[index];
  if (u >= 0) {
    TRAINER_CHECK(static_cast<size_t>(u) == next_unit_, "gradient unit {} final before unit {}", u,
                  next_unit_);
    launch(next_unit_++);
  }
  comm_.progress();
}

void GradSync::finish_before(int64_t end) {
  if (reduce_) {
    while (next_unit_ < units_.size()) launch(next_unit_++);
    while (waited_ < units_.size() && units_[waited_].range.begin < end)
      in_flight_[waited_++]->wait();
    if (waited_ < units_.size()) return;
    in_flight_.clear();
  }
  waited_ = 0;
  next_unit_ = 0;
  reduce_ = false;
}

}  // namespace trainer
