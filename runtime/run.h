// One rank's training run: what it holds, and the phases of its steps. Internal to runtime/; the
// member functions live by topic:
//   run_setup.cpp   checks of every input on all ranks, buffers, communicators, initial state
//   run_step.cpp    one step: forward/backward with the gradient collectives, the waits, AdamW
//   run_output.cpp  metrics.jsonl, the per-rank report, checkpoints, the --trace file
//   benchmark.cpp   --benchmark: timed steps, the summary and its --csv row
//   trainer.cpp     the training loop and the early-stop vote
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/grad_sync.h"
#ifdef TRAINER_WITH_CUDA
#include "comm/nccl_communicator.h"
#include "optim/cuda/adamw.cuh"
#endif
#include "model/replica.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/schedule.h"
#include "runtime/checkpoint.h"
#include "runtime/data.h"
#include "runtime/kernel_trace.h"
#include "runtime/placement.h"
#include "runtime/stop_signal.h"
#include "runtime/trainer.h"

namespace trainer {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

inline BufferView host_view(std::vector<float>& v) {
  return BufferView{v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

// "12.3 MiB", for the log.
inline std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

// Beside signal numbers in the ranks' stop vote.
constexpr int64_t kTimeLimitStop = 1000;

// Columns of a --csv benchmark row (one per run; launch/bench_table.py reads them by name).
extern const char* const kCsvHeader;

// Where a resumed run sets aside the lines the interrupted run logged after its checkpoint.
constexpr const char* kSupersededMetrics = "metrics_superseded.jsonl";

// A run resumed at `step` into `out` continues its metrics.jsonl (run_output.cpp).
void continue_metrics(const std::string& out, int64_t step);

// Everything one rank holds for a run.
class Run {
 public:
  Run(const Options& o, MpiCommunicator& world) : o_(o), world_(world), layout_(o.config) {}
  TrainResult execute(bool keep_params);

 private:
  // run_setup.cpp
  // Checks every input on all ranks, then builds the buffers, communicators and optimizer.
  void setup();
  // The checks that can fail on bad input, on every rank, before any compute (and where every
  // rank runs, and which checkpoint --resume latest means); returns this rank's GPU index.
  int check_inputs();
  // --out: warns of what interrupted saves left; --overwrite deletes the previous run.
  void prepare_out();
  // Copies the data's tokenizer.json into --out (rank 0).
  void copy_tokenizer() const;
  // The replica, the communicator of the gradients, the optimizer and the gradient synchroniser.
  void build(int gpu);
  // What this run holds, printed once by rank 0 (a collective: every rank calls it).
  void log_run();
  // The initial parameters (fresh, --init-from or --resume), the same on every rank.
  void init_state();

  // run_step.cpp
  double train_step(int64_t s, PhaseTimes& times, double& grad_norm);
  // Forward (and backward, on zeroed gradients) of every micro-batch of step `step`, with
  // --cuda-graph as a replay; `update`: the recording also holds the update (record_update),
  // which needs --cuda-graph.
  void forward_backward(int64_t step, bool backward, bool reduce, bool update = false);
  // A training step's work: forward_backward(), then the norm and AdamW at the schedule's step
  // lr_step (optimizer_step), or with --cuda-graph, when the update needs no host decision (no
  // loss scaling), all of it as one replay. take_grad_norm() then gives the step's gradient norm
  // (after a replay it waits for the step: call it after the step's last timer event).
  void step_with_update(int64_t s, int64_t lr_step);
  double take_grad_norm();
  bool update_recordable() const;
  // One GPU, kernels launched one by one, --overlap-update not off: the update runs beside the
  // next forward (needs device_, nranks_ and the options).
  bool update_beside_forward() const;
  // The update's device work, recorded: AdamW's scalars uploaded, the clipping factor from the
  // norm's partial sums, the update kernels reading both from device memory.
  void record_update();
  // The update's parts, reading AdamW's scalars and the clipping factor from step_args_'s device
  // copy: on the compute stream (recorded), or on the update lane, each part marked there for the
  // next forward's waits (updating_).
  void update_parts_from_device_args(bool on_lane);
  // Micro-batch k of step `step` into inputs_ and targets_ (timed as the data phase), or the one
  // prefetch_micro_batch made for it.
  MicroBatch fill_micro_batch(int64_t step, int64_t k);
  // Makes micro-batch 0 of `step` into next_inputs_ and next_targets_ ahead of time: called once a
  // step's device work is queued, so that the host builds the next step's first micro-batch while
  // the GPU computes instead of between the update and the next forward.
  void prefetch_micro_batch(int64_t step);
  // The tokens of micro-batch k of `step` (a pure function of the two, the seed and the rank).
  void make_micro_batch(int64_t step, int64_t k, int32_t* inputs, int32_t* targets);
  // Forward of micro-batch k (`mb`, or the one staged in the replica's slot k when null), then
  // backward, scaled by `scale`, with the gradient collectives when `reduce`.
  void micro_step(int64_t k, const MicroBatch* mb, float scale, bool backward, bool reduce);
  // Makes the parameters at offsets >= `from` current: waits for the ZeRO-1 all-gathers still
  // writing any of them (inside forward timed as exposed communication), and makes the compute
  // stream wait for the parts of an update still running beside it (inside forward timed as the
  // optimizer's exposed time).
  void await_params(int64_t from, bool in_forward);
  // Waits, timed as exposed communication, for the gradient collectives of the units that begin
  // before flat element `end`; launches any that backward left.
  void await_grads(int64_t end);
  // Waits for the gradients (all of them) and applies AdamW to the owned range.
  void optimizer_step(int64_t s, double& grad_norm);
#ifdef TRAINER_WITH_CUDA
  // optimizer_step where the update runs beside the next forward with no host decision to make
  // (one GPU, the norm beside backward, no loss scaling): the clipping factor is computed on the
  // GPU from the norm's partial sums and the update is queued behind it at once, so the host
  // does not wait for backward to end before it queues the update. The same numbers, bit for
  // bit; take_grad_norm() reads the norm after the step. False (nothing done) elsewhere.
  bool queue_update_on_device(int64_t s);
#endif
  // The step's phase times and collectives (for the report and --trace). After the last step it
  // first waits for the collectives still running, so that the trace has all of them.
  PhaseTimes collect_times(int64_t s, bool last);
  double evaluate();

  // run_output.cpp
  // Opens --out's metrics.jsonl (continued after a resume); rank 0 only.
  void open_metrics();
  // Flushes metrics.jsonl; a failed write (a full disk) stops the run rather than lose metrics.
  void check_metrics_written();
  // `wall_ms`: rank 0's host time for the step, from its launch until every rank's times arrived
  // (the CUDA-event step time leaves out the host's work between steps).
  void log_step(int64_t s, double loss, double norm, const std::vector<PhaseTimes>& ranks,
                double wall_ms);
  void report_timing(const std::vector<std::vector<PhaseTimes>>& rank_times, int64_t skip);
  // The run's settings as a checkpoint records them (global batch, ctx, sampler, seed, ...).
  json run_settings() const;
  // A checkpoint source for a state of the owned range (gathered to rank 0 with ZeRO-1).
  TensorSource state_source(BufferView owned);
  void save(int64_t step_done, bool final);
  void write_trace();
  // After the first step: the device memory in use and the allocator's count against the plan,
  // logged by rank 0 and written to --memory-report (a collective: every rank calls it).
  void report_memory(int64_t steps_done);
  void write_memory_report(int64_t steps_done, int64_t in_use, int64_t allocator,
                           double max_in_use);

  // benchmark.cpp
  void benchmark(TrainResult& result);
  void report_kernel_trace(const std::vector<TracedKernel>& kernels, int64_t steps) const;

  // trainer.cpp
  // The training loop, from start_step_ to --steps or an early stop (also before its first step,
  // for a signal that came during start-up).
  void train(TrainResult& result, Clock::time_point started, const StopSignals& signals);
  // --debug-die-at-step / --debug-stall-at-step: this rank fails before step `s` (failure tests).
  void inject_failure(int64_t s);
  // --debug-step-ms: the step lasts at least that long (tests of --time-limit and signals).
  void pace_step(Clock::time_point launched);
  // The validation loss after step `s`, logged and written to metrics.jsonl.
  double validate(int64_t s);
  // Runs `write` on rank 0. With --out, every rank learns of a failure there (a full disk) and
  // stops with rank 0's message.
  template <class F>
  void on_rank0(F&& write) {
    if (!o_.out.empty())
      agree_on_usage_errors(world_, [&] {
        if (rank_ == 0) write();
      });
    else if (rank_ == 0)
      write();
  }
  // Every rank's phase times of one step, on rank 0 (rows in rank order; empty elsewhere).
  std::vector<PhaseTimes> gather_times(const PhaseTimes& mine);
  // After a step: the ranks' vote to stop early, 0 to go on, else a signal number or
  // kTimeLimitStop; a collective. And rank 0's message once they have.
  int64_t vote_to_stop(const StopSignals& signals, Clock::time_point started,
                       Clock::time_point step_launched);
  void log_stop(int64_t stop, int64_t step_done, Clock::time_point started);

  const Options& o_;
  MpiCommunicator& world_;
  ParamLayout layout_;
  int rank_ = 0, nranks_ = 1;
  DeviceKind device_ = DeviceKind::kCpu;
  Precision precision_ = Precision::kFp32;
  std::string gpu_name_;           // this rank's GPU ("" on the CPU)
  std::string gpu_pci_bus_;        // and its PCI bus id, for NVML (gpu_power.h)
  std::vector<RankPlace> places_;  // every rank's host, local rank and GPU (rank 0 only)
  double peak_tflops_ = 0;         // per device, for MFU (0: not reported)
  int64_t flat_ = 0, G_ = 0;
  std::unique_ptr<Replica> replica_;
#ifdef TRAINER_WITH_CUDA
  std::unique_ptr<NcclCommunicator> nccl_;
#endif
  Communicator* grad_comm_ = nullptr;
  std::optional<ShardPlan> shards_;
  Range owned_;
  std::vector<Range> update_parts_;  // of owned_, relative to its start
  // --grad-transport ce --grad-reduce bf16 on several GPUs: the ranks exchange their bf16
  // gradients whole and the update adds every rank's copy (GradTerms) instead of an all-reduce.
  bool grad_copies_ = false;
  // ZeRO-1 all-gathers launched by the last update and not yet waited for, with the end of the
  // highest range each writes: the next forward waits for each only when it gets there.
  struct PendingGather {
    int64_t end;
    CommHandle handle;
  };
  std::vector<PendingGather> gathers_;
  // --overlap-update: the last update's parts still to be waited for by the next forward (the end
  // of each part's range, and its mark on the update lane).
  bool overlap_update_ = false;
  int update_sms_ = 0;      // SMs forward's GEMMs leave to the update beside them (--update-sms)
  int wgrad_sms_ = -1;      // --wgrad-stream resolved: -1 off, else the SMs its GEMMs leave
  bool gemm_tune_ = false;  // --gemm-tune resolved
  struct PendingPart {
    int64_t end;
    int mark;
  };
  std::vector<PendingPart> updating_;
  // The update lane's busy time and the updates it covers, summed over the steps collected.
  double lane_ms_ = 0;
  int64_t lane_updates_ = 0;
  std::unique_ptr<AdamW> opt_;
#ifdef TRAINER_WITH_CUDA
  // One GPU: the gradient norm's pass runs beside backward (optim/cuda/adamw.cuh), for backwards
  // that the optimizer follows (norm_overlap_wanted_).
  std::unique_ptr<cuda::OverlappedSumSquares> norm_overlap_;
  // AdamW's scalars in device memory: a recorded update's (--cuda-graph), or those of an update
  // queued beside the next forward before backward has run (queue_update_on_device).
  std::unique_ptr<cuda::DeviceStepArgs> step_args_;
  // --overlap-update: the stream the update runs on beside the next forward.
  std::unique_ptr<cuda::UpdateLane> update_lane_;
#endif
  bool norm_overlap_wanted_ = false;
  double grad_norm_ = 0;       // of the last step
  bool norm_pending_ = false;  // the last update's norm is still on the device
  // --cuda-graph: what the replica's recording of forward_backward() was made for.
  struct GraphKey {
    float scale;
    bool backward, reduce, norm, update;
    bool operator==(const GraphKey&) const = default;
  };
  std::optional<GraphKey> graph_key_;
  bool has_norm_overlap() const {
#ifdef TRAINER_WITH_CUDA
    return norm_overlap_ != nullptr;
#else
    return false;
#endif
  }
  // This rank's allocations by category (the replica's, the optimizer's, the communicators'), and
  // whether report_memory() has run.
  std::vector<MemoryItem> memory_plan_;
  bool memory_reported_ = false;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<StepTimer> timer_;
  std::optional<TokenStream> train_, val_;
  Sampler sampler_;
  LrSchedule schedule_;
  LossScaler scaler_;
  int64_t adam_steps_ = 0;     // updates applied (a step skipped by loss scaling applies none)
  double step_scale_ = 1;      // the loss scale of the last step's backward
  bool step_skipped_ = false;  // the last step's update was skipped (non-finite gradient)
  std::vector<int32_t> inputs_, targets_;
  std::vector<int32_t> next_inputs_, next_targets_;  // prefetch_micro_batch's
  int64_t prefetched_step_ = -1;                     // the step they hold micro-batch 0 of, or -1
  int64_t start_step_ = 0;
  // The checkpoint to resume from: --resume, or with --resume latest the newest in --out ("" when
  // there is none yet: a fresh start).
  std::string resume_;
  bool resume_latest_ = false;
  bool already_done_ = false;  // --resume latest found a checkpoint at --steps or later
  std::ofstream metrics_;
  std::vector<std::string> trace_;  // Chrome-trace events of this rank (JSON objects)
};

}  // namespace trainer
