// Every trainer flag, parsed and validated in one place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/replica.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"

namespace trainer {

// --resume latest: the newest DIR/step_N in --out, or a fresh start when there is none yet.
inline constexpr const char* kResumeLatest = "latest";

struct Options {
  // Model
  std::string model = "tiny";
  ModelConfig config;  // preset + hand-set dimensions, ctx included
  // Data
  std::string data, val_data, sampler = "random";
  // Batch
  int64_t batch = 8, grad_accum = 1, steps = 1000;
  // Optimizer
  double lr = 3e-4, min_lr = -1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1, clip = 1.0;
  std::string adam_state = "fp32";  // fp32 | bf16: how AdamW stores m and v (opt-in bf16)
  int64_t warmup = 0;
  // auto | none | dynamic | a fixed scale (optim/loss_scaler.h); auto: dynamic with fp16, else none
  std::string loss_scale = "auto";
  int64_t loss_scale_window = 2000;
  uint64_t seed = 1337;
  // Checkpoints and output
  std::string init_from, resume, out;
  bool overwrite = false;  // a fresh run may replace the one already in --out
  int64_t save_every = 0, log_every = 10, eval_every = 0, eval_batches = 4;
  int64_t keep_last = 0;  // checkpoints kept in --out: the newest N (0: all)
  // Wall-clock minutes from start after which training stops with a checkpoint (0: no limit).
  double time_limit_min = 0;
  // Device and parallelism
  std::string device = "auto";  // auto | cpu | cuda
  std::string precision = "auto";
  std::string attention = "flash";
  std::string recompute = "none";  // none | ffn | block (model/recompute.h)
  // CUDA, one rank: each step's forwards and backwards recorded once as a CUDA graph and replayed.
  bool cuda_graph = false;
  // CUDA, one rank, kernels launched one by one: AdamW on a side stream beside the next step's
  // forward, which waits for each part of the update only where it first reads it. auto | on | off
  // (auto: on where it applies).
  std::string overlap_update = "auto";
  // SMs forward's GEMMs leave to the update beside them: auto | N in [0, 64] (0 = every SM theirs;
  // auto: update_sms_for(), below).
  std::string update_sms = "auto";
  // CUDA: backward's weight-gradient GEMMs on a second stream beside the chain of input
  // gradients: auto | off | N in [0, 64], the SMs those GEMMs leave to that chain (0 = every SM:
  // the very numbers of off; auto: wgrad_sms_for(), below).
  std::string wgrad_stream = "auto";
  // CUDA: cuBLASLt algorithms chosen per problem by timing those equal bit for bit to its first
  // choice (Matmul::set_tuning): auto | on | off (auto: on on a GPU).
  std::string gemm_tune = "auto";
  std::string ddp = "bucketed";
  double bucket_mb = 25;
  bool shard_optim = false;
  std::string grad_reduce = "fp32";  // fp32 | bf16 (CUDA gradient collectives)
  int64_t timing_warmup = 5;
  std::string grad_transport = "nccl";  // nccl | ce (copy engines, ranks of one host)
  int comm_sms = 0;           // SMs reserved for NCCL while backward runs (0 = NCCL decides)
  double comm_timeout = 300;  // seconds a collective may wait in training before all ranks stop
  std::string trace;          // Chrome-trace JSON of step phases and collectives
  std::string memory_report;  // JSON: the memory plan by category and what the first step used
  double peak_tflops = 0;     // 0: by device and precision
  // Benchmark mode
  bool benchmark = false;
  std::string kernel_trace;    // --benchmark: PREFIX of the timed steps' kernel trace (GPU only)
  bool floors_at_cap = false;  // --benchmark on a GPU: the step's parts held at the power cap
  std::string bench_mode = "train";
  std::string csv;
  // Testing hooks (hidden): make one rank die at a step, to test failure handling.
  int64_t debug_die_at_step = -1;
  int debug_die_rank = -1;
  // Testing hook (hidden): one rank stops answering at a step, to test the collective watchdog.
  int64_t debug_stall_at_step = -1;
  int debug_stall_rank = -1;
  // Testing hook (hidden): every training step lasts at least this many ms (the ranks sleep after
  // it), so that a tiny model runs for as long as a test of stopping and resuming jobs needs.
  double debug_step_ms = 0;
  // Testing hook (hidden): a training run waits this many ms before setting up (its stop signals
  // already handled), so that a test can signal it during start-up.
  double debug_start_ms = 0;
  // Testing hook (hidden): one rank's gradients at a step become non-finite (loss scaling tests).
  int64_t debug_inf_grad_at_step = -1;
  int debug_inf_grad_rank = 0;
  // Testing hook (hidden): the update beside forward (--overlap-update) starts this many
  // microseconds late on its stream, so that a test sees any work that does not wait for it.
  int64_t debug_update_delay_us = 0;
  // Testing hook (hidden): backward's weight-gradient stream (--wgrad-stream) idles this many
  // microseconds before each of its products.
  int64_t debug_wgrad_delay_us = 0;
  // Testing hook (hidden): the gradient norm's side stream (one GPU) idles this many microseconds
  // before each of its partial sums.
  int64_t debug_norm_delay_us = 0;

  std::vector<std::string> argv;  // the command line, for logs and checkpoints
  std::string help;               // set (and nothing validated) when --help was given

  // The resolved values (after device detection).
  DeviceKind device_kind() const;
  Precision precision_kind() const;
  AdamWConfig adamw() const {
    return {lr, beta1, beta2, eps, wd, adam_state == "bf16" ? DType::kBF16 : DType::kF32};
  }
  // --precision auto never means fp16, so "auto" resolves without looking for a device.
  LossScaleConfig loss_scaling() const {
    return parse_loss_scale(loss_scale, loss_scale_window, precision == "fp16");
  }
  // SMs forward's GEMMs leave to an update running beside them (0 where none does). auto: 24 for
  // models of at least 1.5 B parameters, whose update stays exposed after forward otherwise
  // (measured on H100 and H200: docs/performance.md), 0 for smaller ones, where the GEMMs lose
  // more than the update gains. Throws UsageError for a number beside no update.
  int update_sms_for(bool update_beside_forward, int64_t parameters) const;
  // --wgrad-stream resolved: -1 for off, else the SMs the weight-gradient GEMMs leave to the rest
  // of backward. auto: 24 on a GPU (docs/performance.md), off on the CPU backend, which has no
  // streams. Throws UsageError for a number without a GPU.
  int wgrad_sms_for(bool cuda) const;
  // --gemm-tune resolved: auto is on on a GPU. Throws UsageError for on without a GPU.
  bool gemm_tune_for(bool cuda) const;
};

// Parses argv; throws UsageError on any bad flag or value. With `--help` it returns at once with
// `help` holding the usage text.
Options parse_options(int argc, char** argv);

// Checks values that need no file access; throws UsageError naming the flag.
void validate_options(const Options& o);

// The settings every rank must agree on, as "key=value" lines (paths and per-run output excluded
// only where ranks may legitimately differ: none here).
std::string settings_fingerprint(const Options& o);
// Name of the first setting whose line differs between two fingerprints ("" if equal).
std::string first_difference(const std::string& a, const std::string& b);

}  // namespace trainer
