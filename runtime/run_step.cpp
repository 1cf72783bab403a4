// One training step on one rank: forward and backward over the micro-batches, with the gradient
// collectives launched as buckets become ready; the waits for them (timed as exposed
// communication); the gradient norm and AdamW on the owned range, with ZeRO-1's parameter
// all-gathers sent part by part and awaited by the next forward.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#ifdef TRAINER_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include "runtime/run.h"

namespace trainer {

double Run::train_step(int64_t s, PhaseTimes& times, double& grad_norm) {
  timer_->begin(Phase::kStep);
  norm_overlap_wanted_ = true;
  step_with_update(s, s);
  timer_->end(Phase::kStep);
  grad_norm = take_grad_norm();
  const double loss = world_.sum(replica_->take_loss()) / nranks_;
  times = collect_times(s, s + 1 == o_.steps);
  return loss;
}

bool Run::update_beside_forward() const {
  return device_ == DeviceKind::kCuda && nranks_ == 1 && !o_.cuda_graph &&
         o_.overlap_update != "off";
}

bool Run::update_recordable() const {
#ifdef TRAINER_WITH_CUDA
  // step_args_ exists with --cuda-graph where the norm runs beside backward (run_setup.cpp).
  return o_.cuda_graph && step_args_ && !scaler_.enabled();
#else
  return false;
#endif
}

void Run::step_with_update(int64_t s, int64_t lr_step) {
  if (!update_recordable()) {
    forward_backward(s, /*backward=*/true, /*reduce=*/true);
    optimizer_step(lr_step, grad_norm_);
    return;
  }
#ifdef TRAINER_WITH_CUDA
  // The recording reads these when replayed; the clipping factor it computes itself.
  step_args_->set(opt_->step_args(schedule_.at(lr_step), adam_steps_ + 1, 1.0f));
  forward_backward(s, /*backward=*/true, /*reduce=*/true, /*update=*/true);
  // What optimizer_step decides on the host; the norm is read after the step (take_grad_norm).
  step_scale_ = 1;
  step_skipped_ = false;
  ++adam_steps_;
  norm_pending_ = true;
#endif
}

double Run::take_grad_norm() {
#ifdef TRAINER_WITH_CUDA
  if (norm_pending_) grad_norm_ = std::sqrt(norm_overlap_->total());
#endif
  norm_pending_ = false;
  return grad_norm_;
}

#ifdef TRAINER_WITH_CUDA
void Run::record_update() {
  PhaseScope p(*timer_, Phase::kOptimizer);
  nvtxRangePushA("optimizer");
  step_args_->upload(replica_->stream());
  norm_overlap_->clip_into(step_args_->device(), o_.clip, /*loss_scale=*/1.0);
  update_parts_from_device_args(/*on_lane=*/false);
  nvtxRangePop();
}

void Run::update_parts_from_device_args(bool on_lane) {
  const BufferView grads = replica_->grads().slice(owned_.begin, owned_.size());
  const BufferView params = replica_->params().slice(owned_.begin, owned_.size());
  void* stream = on_lane ? update_lane_->stream() : replica_->stream();
  // From the end of the buffer to its start, the order forward reads it (the embedding is last).
  for (auto part = update_parts_.rbegin(); part != update_parts_.rend(); ++part) {
    opt_->step_part_recorded(*part, GradTerms{grads.slice(part->begin, part->size())},
                             params.slice(part->begin, part->size()), step_args_->device(), stream);
    if (on_lane) updating_.push_back({owned_.begin + part->end, update_lane_->mark()});
  }
}
#endif

void Run::forward_backward(int64_t step, bool backward, bool reduce, bool update) {
  // d(mean over G*T tokens)/d(token loss), times the loss scale (1 without loss scaling).
  double loss_scale = scaler_.scale();
  if (step == o_.debug_inf_grad_at_step && rank_ == o_.debug_inf_grad_rank)
    loss_scale = std::numeric_limits<double>::infinity();  // every gradient becomes inf or NaN
  const float scale = static_cast<float>(loss_scale / static_cast<double>(G_ * o_.config.ctx));
  if (!o_.cuda_graph) {
    for (int64_t k = 0; k < o_.grad_accum; ++k) {
      const MicroBatch mb = fill_micro_batch(step, k);
      micro_step(k, &mb, scale, backward, reduce);
    }
    prefetch_micro_batch(step + 1);
    return;
  }
  // --cuda-graph: the host stages every micro-batch, then replays the recording of the device
  // work, made again whenever what it bakes in changes (the loss scale, the kind of step).
  for (int64_t k = 0; k < o_.grad_accum; ++k)
    replica_->stage(fill_micro_batch(step, k), static_cast<int>(k));
  const GraphKey key{scale, backward, reduce, norm_overlap_wanted_, update};
  if (graph_key_ != key) {
    spdlog::debug("recording the step as a CUDA graph");
    replica_->begin_capture();
    timer_->begin_capture();
    for (int64_t k = 0; k < o_.grad_accum; ++k) micro_step(k, nullptr, scale, backward, reduce);
#ifdef TRAINER_WITH_CUDA
    if (norm_overlap_) norm_overlap_->join();
    if (update) record_update();
#endif
    timer_->end_capture();
    replica_->end_capture();
    graph_key_ = key;
  }
  replica_->replay();
  timer_->replayed();
#ifdef TRAINER_WITH_CUDA
  if (norm_overlap_) norm_overlap_->replayed();
#endif
}

MicroBatch Run::fill_micro_batch(int64_t step, int64_t k) {
  PhaseScope p(*timer_, Phase::kData);
  if (k == 0 && step == prefetched_step_) {
    inputs_.swap(next_inputs_);
    targets_.swap(next_targets_);
  } else {
    make_micro_batch(step, k, inputs_.data(), targets_.data());
  }
  prefetched_step_ = -1;
  return MicroBatch{inputs_.data(), targets_.data(), o_.batch, o_.config.ctx};
}

void Run::prefetch_micro_batch(int64_t step) {
  PhaseScope p(*timer_, Phase::kData);
  make_micro_batch(step, 0, next_inputs_.data(), next_targets_.data());
  prefetched_step_ = step;
}

void Run::make_micro_batch(int64_t step, int64_t k, int32_t* inputs, int32_t* targets) {
  const int64_t rows_per_rank = o_.batch * o_.grad_accum;
  if (train_) {
    fill_rows(*train_, sampler_, step, rank_ * rows_per_rank + k * o_.batch, o_.batch, inputs,
              targets);
  } else {  // --benchmark: synthetic tokens, a pure function of (seed, step, rank, k)
    uint64_t x = o_.seed ^ (static_cast<uint64_t>(step) << 20) ^ (rank_ * 7919 + k);
    for (int64_t i = 0; i < o_.batch * o_.config.ctx; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      inputs[i] = static_cast<int32_t>((x >> 33) % o_.config.vocab);
      targets[i] = static_cast<int32_t>((x >> 13) % o_.config.vocab);
    }
  }
}

void Run::micro_step(int64_t k, const MicroBatch* mb, float scale, bool backward, bool reduce) {
  {
    PhaseScope p(*timer_, Phase::kForward);
    const auto need = [this](int64_t offset) { await_params(offset, true); };
    replica_->set_update_in_flight(!updating_.empty());
    if (mb)
      replica_->forward(*mb, need);
    else
      replica_->forward_staged(static_cast<int>(k), need);
  }
  if (!backward) return;
  PhaseScope p(*timer_, Phase::kBackward);
  // The step's gradients are cleared after its first forward, not before: with the update beside
  // forward that forward has waited for every part of the update, which reads the gradients
  // (the CUDA replica clears the embedding's on the GPU, which raced with the update before it).
  if (k == 0) replica_->zero_grads();
  const bool last_micro = reduce && k == o_.grad_accum - 1;
  sync_->begin_backward(last_micro);
#ifdef TRAINER_WITH_CUDA
  if (norm_overlap_ && last_micro && norm_overlap_wanted_) norm_overlap_->begin();
#endif
  replica_->backward(scale, [this](int i) {
    sync_->on_ready(i);
#ifdef TRAINER_WITH_CUDA
    if (norm_overlap_) norm_overlap_->on_ready(i);
#endif
  });
}

void Run::await_params(int64_t from, bool in_forward) {
#ifdef TRAINER_WITH_CUDA
  // Parts of the update beside forward: the compute stream waits on the GPU, the host goes on.
  bool waits = false;
  for (auto it = updating_.begin(); it != updating_.end();) {
    if (it->end <= from) {
      ++it;
      continue;
    }
    if (!waits && in_forward) timer_->switch_phase(Phase::kForward, Phase::kOptimizer);
    waits = true;
    update_lane_->wait(it->mark);
    it = updating_.erase(it);
  }
  if (waits && in_forward) timer_->switch_phase(Phase::kOptimizer, Phase::kForward);
#endif
  std::vector<CommHandle> due;
  for (auto it = gathers_.begin(); it != gathers_.end();) {
    if (it->end > from) {
      due.push_back(std::move(it->handle));
      it = gathers_.erase(it);
    } else {
      ++it;
    }
  }
  if (!due.empty()) {
    if (!in_forward) return wait_all(due);
    timer_->end(Phase::kForward);
    {
      PhaseScope p(*timer_, Phase::kComm);
      wait_all(due);
    }
    timer_->begin(Phase::kForward);
  }
  if (!gathers_.empty()) grad_comm_->progress();  // MPI moves data only inside MPI calls
}

void Run::await_grads(int64_t end) {
  PhaseScope p(*timer_, Phase::kComm);
  sync_->finish_before(end);
}

void Run::optimizer_step(int64_t s, double& grad_norm) {
  await_params(0, false);  // normally done: forward reads every parameter
#ifdef TRAINER_WITH_CUDA
  if (queue_update_on_device(s)) return;
#endif
  // The averaged gradient of the owned range: the reduced buffer, or every rank's bf16 copy.
  GradTerms grads{replica_->grads().slice(owned_.begin, owned_.size())};
#ifdef TRAINER_WITH_CUDA
  if (grad_copies_) {
    grads.clear();
    for (int r = 0; r < nranks_; ++r)
      grads.push_back(nccl_->copy_of(r).slice(owned_.begin, owned_.size()));
  }
#endif
  auto part_of = [&](const Range& part) {
    GradTerms t;
    for (const BufferView& g : grads) t.push_back(g.slice(part.begin, part.size()));
    return t;
  };
  BufferView params = replica_->params().slice(owned_.begin, owned_.size());
  const bool gather = shards_ && nranks_ > 1;
  // The last unit's collective (the embedding's, which backward finalises last) still runs while
  // the norm of everything before it is computed.
  const int64_t last = sync_->units().empty() ? flat_ : sync_->units().back().range.begin;
  const int64_t split = std::clamp(last, owned_.begin, owned_.end) - owned_.begin;
  await_grads(last);
  {
    PhaseScope p(*timer_, Phase::kOptimizer);
#ifdef TRAINER_WITH_CUDA
    nvtxRangePushA("optimizer");  // so nsys timelines show the step like the code reads
#endif
    // Global norm of the averaged gradient: each rank holds the whole of it, or (ZeRO-1) its shard.
    // On one GPU its pass ran beside backward.
    bool overlapped = false;
#ifdef TRAINER_WITH_CUDA
    overlapped = norm_overlap_ && norm_overlap_->active();
#endif
    double sq = overlapped ? 0.0 : sum_squares(part_of({0, split}), replica_->stream());
    timer_->end(Phase::kOptimizer);
    await_grads(flat_);
    timer_->begin(Phase::kOptimizer);
#ifdef TRAINER_WITH_CUDA
    if (overlapped) sq = norm_overlap_->total();
#endif
    if (!overlapped) sq += sum_squares(part_of({split, owned_.size()}), replica_->stream());
    if (gather) sq = world_.sum(sq);
    // Loss scaling: the gradients are scaled by S; a non-finite one skips the update on every
    // rank (the reduced gradient is the same on all, and they agree on it besides).
    step_scale_ = scaler_.scale();
    step_skipped_ = false;
    if (scaler_.enabled()) {
      bool finite = std::isfinite(sq);
      if (nranks_ > 1 && !gather) finite = world_.max(finite ? 0.0 : 1.0) == 0.0;
      step_skipped_ = scaler_.update(finite);
    }
    grad_norm = std::sqrt(sq) / step_scale_;
    // The optimizer multiplies the gradients by clip / S: unscaling costs no extra pass.
    const float multiplier = static_cast<float>(clip_scale(grad_norm, o_.clip) / step_scale_);
    if (!step_skipped_) ++adam_steps_;
    // ZeRO-1: part k of every rank's slice is all-gathered while part k+1 is updated, and the
    // next forward waits for a part only when it reaches it. Parts run from the end of the slices
    // to their start, the order forward reads the buffer (the embedding is last in it). With
    // --overlap-update the parts run on the update lane, beside the next forward, which waits for
    // each where it first reads it.
    void* stream = replica_->stream();
#ifdef TRAINER_WITH_CUDA
    if (update_lane_ && !step_skipped_) {
      update_lane_->begin();
      stream = update_lane_->stream();
    }
#endif
    for (auto part = update_parts_.rbegin(); part != update_parts_.rend() && !step_skipped_;
         ++part) {
      opt_->step_part(*part, part_of(*part), params.slice(part->begin, part->size()),
                      schedule_.at(s), adam_steps_, multiplier, stream);
#ifdef TRAINER_WITH_CUDA
      if (update_lane_) updating_.push_back({owned_.begin + part->end, update_lane_->mark()});
#endif
      if (!gather) continue;
      std::vector<Range> segments;
      int64_t end = 0;
      for (int r = 0; r < nranks_; ++r) {
        segments.push_back(
            {shards_->shard(r).begin + part->begin, shards_->shard(r).begin + part->end});
        end = std::max(end, segments.back().end);
      }
      gathers_.push_back({end, grad_comm_->all_gather(replica_->params(), segments)});
    }
#ifdef TRAINER_WITH_CUDA
    if (update_lane_ && !step_skipped_) update_lane_->end();
    nvtxRangePop();
#endif
  }
}

#ifdef TRAINER_WITH_CUDA
bool Run::queue_update_on_device(int64_t s) {
  if (!update_lane_ || !step_args_ || !norm_overlap_ || !norm_overlap_->active() ||
      scaler_.enabled())
    return false;
  await_grads(flat_);
  PhaseScope p(*timer_, Phase::kOptimizer);
  nvtxRangePushA("optimizer");
  // What optimizer_step's host path decides without loss scaling; the norm itself is read after
  // the step (take_grad_norm), and the clipping factor is the GPU's, from the same partial sums
  // in the same order.
  step_scale_ = 1;
  step_skipped_ = false;
  ++adam_steps_;
  const AdamWStepArgs args = opt_->step_args(schedule_.at(s), adam_steps_, 1.0f);
  norm_overlap_->join();  // the clipping kernel reads the side stream's partial sums too
  norm_overlap_->clip_into(step_args_->device(), o_.clip, /*loss_scale=*/1.0, &args);
  norm_pending_ = true;
  update_lane_->begin();  // after the clipping factor's kernel
  update_parts_from_device_args(/*on_lane=*/true);
  update_lane_->end();
  nvtxRangePop();
  return true;
}
#endif

PhaseTimes Run::collect_times(int64_t s, bool last) {
  PhaseTimes times = timer_->collect();
  if (last) {
    await_params(0, false);
    replica_->synchronize();
  }
#ifdef TRAINER_WITH_CUDA
  // The updates that ran beside forward and have finished (the previous step's, normally).
  std::vector<std::pair<double, double>> updates;
  if (update_lane_) updates = update_lane_->take_spans(last, timer_->origin_event());
  for (const auto& [a, b] : updates) {
    times[kOptimizerTotal] += b - a;
    lane_ms_ += b - a;
    ++lane_updates_;
  }
#endif
  std::vector<std::pair<std::string, std::pair<double, double>>> collectives;
#ifdef TRAINER_WITH_CUDA
  if (nccl_)
    for (const CollectiveRecord& r : nccl_->take_records()) {
      times[kCommTotal] += r.end_ms - r.start_ms;
      collectives.push_back({r.name, {r.start_ms, r.end_ms}});
    }
#endif
  if (!o_.trace.empty()) {
    // One process per rank, one track per stream (tid 0 compute, 1 communication, 2 the update
    // beside forward).
    auto event = [&](const std::string& name, int tid, double a, double b) {
      trace_.push_back(json{{"name", name},
                            {"ph", "X"},
                            {"pid", rank_},
                            {"tid", tid},
                            {"ts", a * 1e3},
                            {"dur", (b - a) * 1e3},
                            {"args", {{"step", s + 1}}}}
                           .dump());
    };
    for (const PhaseInterval& iv : timer_->intervals())
      if (iv.phase != Phase::kStep) event(phase_name(iv.phase), 0, iv.start_ms, iv.end_ms);
    for (const auto& [name, t] : collectives) event(name, 1, t.first, t.second);
#ifdef TRAINER_WITH_CUDA
    for (const auto& [a, b] : updates) event("AdamW update", 2, a, b);
#endif
  }
  return times;
}

double Run::evaluate() {
  await_params(0, false);
  const int64_t T = o_.config.ctx;
  const Sampler vs{SamplerKind::kSequential, o_.seed, val_->size(), T, G_};
  const int64_t rows_per_rank = o_.batch * o_.grad_accum;
  double sum = 0;
  for (int64_t e = 0; e < o_.eval_batches; ++e) {
    for (int64_t k = 0; k < o_.grad_accum; ++k) {
      fill_rows(*val_, vs, e, rank_ * rows_per_rank + k * o_.batch, o_.batch, inputs_.data(),
                targets_.data());
      sum += replica_->evaluate({inputs_.data(), targets_.data(), o_.batch, T});
    }
  }
  return world_.sum(sum) / static_cast<double>(nranks_ * o_.eval_batches * o_.grad_accum);
}

}  // namespace trainer
