#include "runtime/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "comm/grad_sync.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/parse.h"
#include "model/recompute.h"
#include "runtime/data.h"

namespace trainer {

DeviceKind Options::device_kind() const {
  if (device == "cpu") return DeviceKind::kCpu;
  if (device == "cuda") return DeviceKind::kCuda;
  return cuda_available() ? DeviceKind::kCuda : DeviceKind::kCpu;
}

Precision Options::precision_kind() const {
  if (precision == "fp32") return Precision::kFp32;
  if (precision == "tf32") return Precision::kTf32;
  if (precision == "bf16") return Precision::kBf16;
  if (precision == "fp16") return Precision::kFp16;
  return device_kind() == DeviceKind::kCuda ? Precision::kBf16 : Precision::kFp32;
}

namespace {

// --update-sms as a number of SMs, nullopt for auto; UsageError for anything else.
std::optional<int> parse_update_sms(const std::string& text) {
  if (text == "auto") return std::nullopt;
  const auto n = parse_decimal(text, 64);
  if (!n) usage_error("--update-sms must be auto or a number in [0, 64] (got '{}')", text);
  return static_cast<int>(*n);
}

// --wgrad-stream as -1 (off) or a number of SMs, nullopt for auto; UsageError for anything else.
std::optional<int> parse_wgrad_stream(const std::string& text) {
  if (text == "auto") return std::nullopt;
  if (text == "off") return -1;
  const auto n = parse_decimal(text, 64);
  if (!n) usage_error("--wgrad-stream must be auto, off or a number in [0, 64] (got '{}')", text);
  return static_cast<int>(*n);
}

}  // namespace

int Options::wgrad_sms_for(bool cuda) const {
  const std::optional<int> n = parse_wgrad_stream(wgrad_stream);
  if (!n) return cuda ? 24 : -1;
  if (*n >= 0 && !cuda)
    usage_error("--wgrad-stream {} needs --device cuda (the CPU backend has no streams)", *n);
  return *n;
}

bool Options::gemm_tune_for(bool cuda) const {
  if (gemm_tune == "on" && !cuda)
    usage_error("--gemm-tune on needs --device cuda (it picks among cuBLASLt's algorithms)");
  return gemm_tune == "on" || (gemm_tune == "auto" && cuda);
}

int Options::update_sms_for(bool update_beside_forward, int64_t parameters) const {
  const std::optional<int> n = parse_update_sms(update_sms);
  if (!n) {  // docs/performance.md#forwards-gemms-on-fewer-sms---update-sms
    if (!update_beside_forward) return 0;
    return parameters >= 3'000'000'000 ? 32 : parameters >= 1'500'000'000 ? 24 : 0;
  }
  if (*n > 0 && !update_beside_forward)
    usage_error(
        "--update-sms {} needs the update beside forward, which this run does not use (one GPU, "
        "no --cuda-graph, --overlap-update auto or on)",
        *n);
  return update_beside_forward ? *n : 0;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
  CLI::App app{
      "trainer: data-parallel training of the CS336 basics Transformer LM (CPU reference or CUDA; "
      "launch with mpirun for several ranks)"};
  app.option_defaults()->always_capture_default();
  // A flag given twice takes its last value, as argparse does (handy for scripts that append).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  auto* model = app.add_option("--model", o.model, "preset: tiny, small, medium, large, xl, 2.7B");
  int64_t d_model = 0, d_ff = 0, layers = 0, heads = 0, vocab = 0, ctx = 256;
  auto* o_dm = app.add_option("--d-model", d_model, "model width (overrides the preset)")
                   ->default_str("preset");
  auto* o_ff = app.add_option("--d-ff", d_ff, "SwiGLU hidden width (overrides the preset)")
                   ->default_str("preset");
  auto* o_l = app.add_option("--layers", layers, "number of blocks (overrides the preset)")
                  ->default_str("preset");
  auto* o_h = app.add_option("--heads", heads, "attention heads (overrides the preset)")
                  ->default_str("preset");
  auto* o_v = app.add_option("--vocab", vocab, "vocabulary size")->default_str("10000");
  app.add_option("--ctx", ctx, "context length T (tokens per sequence)");
  (void)model;

  app.add_option("--data", o.data,
                 "training tokens: uint16 or uint32 .npy, raw uint16 .bin or llm.c shard; a "
                 "comma-separated list or a glob pattern reads several files as one");
  app.add_option("--val-data", o.val_data, "validation tokens (same formats)");
  app.add_option("--sampler", o.sampler, "random | sequential");
  app.add_option("--batch", o.batch, "sequences per rank per micro-step (B)");
  app.add_option("--grad-accum", o.grad_accum, "micro-steps per optimizer step (K)");
  app.add_option("--steps", o.steps, "optimizer steps S (or timed steps with --benchmark)");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine")->default_str("lr/10");
  app.add_option("--warmup", o.warmup,
                 "linear warm-up steps (with --benchmark: untimed warm-up steps)");
  app.add_option("--wd", o.wd, "AdamW weight decay");
  app.add_option("--beta1", o.beta1, "AdamW beta1");
  app.add_option("--beta2", o.beta2, "AdamW beta2");
  app.add_option("--eps", o.eps, "AdamW epsilon");
  app.add_option("--adam-state", o.adam_state,
                 "fp32 | bf16: how AdamW stores its moments m and v (bf16: computed in fp32, "
                 "stored rounded; 8 bytes less per parameter to keep and to move each step; not "
                 "PyTorch's numbers)");
  app.add_option("--clip", o.clip, "global gradient-norm clip (0 = off)");
  app.add_option("--loss-scale", o.loss_scale,
                 "auto | none | dynamic | a fixed scale: backward on loss x scale, steps with "
                 "inf/NaN gradients skipped; dynamic starts at 65536, halves on such a step, "
                 "doubles after --loss-scale-window clean steps (auto: dynamic with --precision "
                 "fp16, else none)");
  app.add_option("--loss-scale-window", o.loss_scale_window,
                 "clean steps before a dynamic loss scale doubles");
  std::string seed = std::to_string(o.seed);  // parsed below: CLI11 wraps "-1" into a uint64
  app.add_option("--seed", seed, "seed of the initialisation and the random sampler (0 to 2^64-1)");
  app.add_option("--init-from", o.init_from,
                 "start from these weights (model.safetensors, or a Hugging Face Llama folder)");
  app.add_option("--time-limit", o.time_limit_min,
                 "minutes of wall clock after which training stops with a checkpoint, before a "
                 "step that would end past it (exit 124; 0: none)");
  app.add_option("--resume", o.resume,
                 "resume from a checkpoint directory (DIR/step_N); 'latest': the newest in --out, "
                 "or a fresh start when it has none yet (for jobs that are requeued)");
  app.add_option("--save-every", o.save_every,
                 "write a checkpoint every N steps (0 = only at end)");
  app.add_option("--keep-last", o.keep_last,
                 "keep only the newest N checkpoints in --out, deleting older ones after each save "
                 "(0 = keep all)");
  app.add_option("--out", o.out, "output directory: metrics.jsonl, checkpoints, model.safetensors");
  app.add_flag("--overwrite", o.overwrite,
               "start afresh in an --out that holds a run (its metrics.jsonl, model.safetensors "
               "and step_N directories are deleted first)");
  app.add_option("--log-every", o.log_every, "log every N steps");
  app.add_option("--eval-every", o.eval_every, "validation loss every N steps (0 = only at end)");
  app.add_option("--eval-batches", o.eval_batches, "global batches per validation pass");
  app.add_option("--device", o.device, "auto | cpu | cuda (auto: cuda when a GPU is visible)");
  app.add_option("--precision", o.precision,
                 "auto | fp32 | tf32 | bf16 | fp16 (auto: bf16 on cuda; bf16 and fp16: 16-bit "
                 "weights and activations, fp32 gradients, master weights and AdamW state; fp16 "
                 "only on cuda, with dynamic loss scaling unless --loss-scale says otherwise)");
  app.add_option("--attn", o.attention, "flash | simple (CUDA attention kernel)");
  app.add_option("--recompute", o.recompute,
                 "none | ffn | block: activation recompute in backward (ffn: each block's "
                 "feed-forward intermediates; block: everything but each block's input)");
  app.add_flag("--cuda-graph", o.cuda_graph,
               "record a step's forward and backward kernels once as a CUDA graph and replay it "
               "every step (fewer launch gaps for small models; one GPU; the same numbers)");
  app.add_option("--overlap-update", o.overlap_update,
                 "auto | on | off: AdamW on a side stream beside the next step's forward, which "
                 "waits for each part of the parameters only where it first reads it (one GPU "
                 "without --cuda-graph; the same numbers; auto: on where it applies)");
  app.add_option("--update-sms", o.update_sms,
                 "auto | N: with the update beside forward, forward's GEMMs are planned for N SMs "
                 "fewer than the GPU has while the update runs, leaving those SMs to it (0 = "
                 "every SM to the GEMMs; auto: 24 for models of 1.5 B parameters or more, 32 "
                 "from 3 B, else 0)");
  app.add_option("--wgrad-stream", o.wgrad_stream,
                 "auto | off | N: backward's weight-gradient GEMMs on a second stream beside the "
                 "chain of input gradients, planned for N SMs fewer than the GPU has, which that "
                 "chain keeps (0 = every SM, the very numbers of off; auto: 24 on cuda)");
  app.add_option("--gemm-tune", o.gemm_tune,
                 "auto | on | off: each matrix product takes the fastest of the algorithms "
                 "cuBLASLt's heuristic offers (up to 16) whose results equal its first choice's "
                 "bit for bit, timed alone when the product is first planned (the same numbers; "
                 "auto: on on cuda)");
  app.add_option("--ddp", o.ddp, "none | naive | flat | overlap | bucketed");
  app.add_option(
      "--bucket-mb", o.bucket_mb,
      "bucket size in MiB for --ddp bucketed (0 = one); with --shard-optim also the size of "
      "the update parts whose all-gathers overlap the update");
  app.add_flag("--shard-optim", o.shard_optim, "ZeRO-1: shard fp32 master weights and AdamW state");
  app.add_option("--grad-reduce", o.grad_reduce, "fp32 | bf16: precision of gradient collectives");
  app.add_option("--timing-warmup", o.timing_warmup, "steps left out of the final timing table");
  app.add_option("--grad-transport", o.grad_transport,
                 "nccl | ce: how GPU gradients move (ce: copy engines over NVLink, only the sums "
                 "use SMs; every rank on one host; with --grad-reduce bf16 the ranks exchange "
                 "whole bf16 gradients that the optimizer adds)");
  app.add_option(
      "--comm-sms", o.comm_sms,
      "GPU: NCCL (or the copy-engine path's sum kernel) runs on this many CTAs, and with "
      "overlap/bucketed on several ranks backward's GEMMs leave it that many SMs (0 = NCCL's "
      "default, GEMMs use every SM)");
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a rank may wait in a collective (NCCL or MPI) during training before "
                 "every rank is stopped (a peer dead, stuck or cut off)");
  app.add_option("--trace", o.trace,
                 "write a Chrome-trace JSON (Perfetto) of phases and collectives");
  app.add_option("--memory-report", o.memory_report,
                 "write the memory plan by category and the memory in use after the first step "
                 "as JSON (rank 0's; the same table is logged at start-up)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "dense peak TFLOP/s per device for MFU (known for H100, H200, A100)")
      ->default_str("by GPU and precision");
  app.add_flag("--benchmark", o.benchmark, "time steps on synthetic tokens instead of training");
  app.add_option("--mode", o.bench_mode, "benchmark: forward | forward-backward | train");
  app.add_option("--kernel-trace", o.kernel_trace,
                 "benchmark on a GPU: record every kernel of the timed steps as they ran (CUPTI) "
                 "into PREFIX.json (Perfetto) and PREFIX.csv, and log busy and idle time per step");
  app.add_flag("--floors-at-cap", o.floors_at_cap,
               "benchmark on a GPU: also run each part of the step (its GEMMs, attention, a copy) "
               "alone at the power limit for a second or more, and log the step's energy floor");
  app.add_option("--csv", o.csv, "benchmark: append a result row to this CSV file");
  app.add_option("--debug-die-at-step", o.debug_die_at_step)->group("");
  app.add_option("--debug-die-rank", o.debug_die_rank)->group("");
  app.add_option("--debug-stall-at-step", o.debug_stall_at_step)->group("");
  app.add_option("--debug-stall-rank", o.debug_stall_rank)->group("");
  app.add_option("--debug-step-ms", o.debug_step_ms)->group("");
  app.add_option("--debug-start-ms", o.debug_start_ms)->group("");
  app.add_option("--debug-inf-grad-at-step", o.debug_inf_grad_at_step)->group("");
  app.add_option("--debug-inf-grad-rank", o.debug_inf_grad_rank)->group("");
  app.add_option("--debug-update-delay-us", o.debug_update_delay_us)->group("");
  app.add_option("--debug-wgrad-delay-us", o.debug_wgrad_delay_us)->group("");
  app.add_option("--debug-norm-delay-us", o.debug_norm_delay_us)->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.help = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    usage_error("{} (see --help)", e.what());
  }

  const auto parsed_seed = parse_decimal(seed, std::numeric_limits<uint64_t>::max());
  if (!parsed_seed) usage_error("--seed '{}' is not an integer from 0 to 2^64-1", seed);
  o.seed = *parsed_seed;
  o.config = preset(o.model);
  if (o_dm->count()) o.config.d_model = d_model;
  if (o_ff->count()) o.config.d_ff = d_ff;
  if (o_l->count()) o.config.n_layers = layers;
  if (o_h->count()) o.config.n_heads = heads;
  if (o_v->count()) o.config.vocab = vocab;
  o.config.ctx = ctx;
  if (o.min_lr < 0) o.min_lr = o.lr / 10;
  validate_options(o);
  return o;
}

void validate_options(const Options& o) {
  validate(o.config);
  if (o.steps <= 0) usage_error("--steps must be positive (got {})", o.steps);
  if (o.batch <= 0) usage_error("--batch must be positive (got {})", o.batch);
  if (o.grad_accum <= 0) usage_error("--grad-accum must be positive (got {})", o.grad_accum);
  // Token counts and row indices are int32 in the kernels and the samplers multiply B, ranks, K
  // and T: keep each factor and a micro-batch's tokens far from overflow.
  constexpr int64_t kMaxFactor = int64_t{1} << 24, kMaxTokens = int64_t{1} << 31;
  if (o.batch > kMaxFactor || o.grad_accum > kMaxFactor || o.config.ctx > kMaxFactor)
    usage_error("--batch {}, --grad-accum {} and --ctx {} must each be at most {}", o.batch,
                o.grad_accum, o.config.ctx, kMaxFactor);
  if (o.batch * o.config.ctx >= kMaxTokens)
    usage_error("a micro-batch of --batch {} x --ctx {} = {} tokens is too large (limit {})",
                o.batch, o.config.ctx, o.batch * o.config.ctx, kMaxTokens - 1);
  if (o.warmup < 0) usage_error("--warmup must not be negative (got {})", o.warmup);
  if (o.adam_state != "fp32" && o.adam_state != "bf16")
    usage_error("--adam-state '{}' is not fp32 or bf16", o.adam_state);
  validate(o.adamw());  // --lr, --beta1, --beta2, --eps, --wd
  if (!std::isfinite(o.min_lr) || o.min_lr < 0 || o.min_lr > o.lr)
    usage_error("--min-lr must be a finite number in [0, --lr = {}] (got {})", o.lr, o.min_lr);
  if (!std::isfinite(o.peak_tflops) || o.peak_tflops < 0)
    usage_error("--peak-tflops must be a finite number >= 0 (got {})", o.peak_tflops);
  if (!std::isfinite(o.clip) || o.clip < 0)
    usage_error("--clip must be a finite number >= 0 (got {})", o.clip);
  if (o.log_every <= 0) usage_error("--log-every must be positive (got {})", o.log_every);
  if (o.save_every < 0 || o.eval_every < 0 || o.keep_last < 0)
    usage_error("--save-every, --eval-every and --keep-last must not be negative");
  if (o.eval_batches <= 0) usage_error("--eval-batches must be positive");
  if (!std::isfinite(o.bucket_mb) || o.bucket_mb < 0)
    usage_error("--bucket-mb must be a finite number >= 0 (got {})", o.bucket_mb);
  if (o.timing_warmup < 0) usage_error("--timing-warmup must not be negative");
  if (o.grad_transport != "nccl" && o.grad_transport != "ce")
    usage_error("--grad-transport '{}' is not nccl or ce", o.grad_transport);
  if (o.grad_transport == "ce" && o.grad_reduce == "bf16" && o.shard_optim)
    usage_error(
        "--grad-transport ce --grad-reduce bf16 exchanges whole bf16 gradients and adds them in "
        "the optimizer: it cannot be combined with --shard-optim (use --grad-transport nccl, or "
        "fp32 sums by copy engines with --grad-reduce fp32)");
  if (o.comm_sms < 0 || o.comm_sms > 64)
    usage_error("--comm-sms must lie in [0, 64] (got {})", o.comm_sms);
  parse_update_sms(o.update_sms);      // throws UsageError naming --update-sms
  parse_wgrad_stream(o.wgrad_stream);  // throws UsageError naming --wgrad-stream
  if (o.gemm_tune != "auto" && o.gemm_tune != "on" && o.gemm_tune != "off")
    usage_error("--gemm-tune must be auto, on or off (got '{}')", o.gemm_tune);
  if (!(o.time_limit_min >= 0) || !std::isfinite(o.time_limit_min))
    usage_error("--time-limit must be a finite number of minutes >= 0 (got {})", o.time_limit_min);
  if (!(o.comm_timeout > 0))
    usage_error("--comm-timeout must be positive (got {})", o.comm_timeout);
  if (o.grad_reduce != "fp32" && o.grad_reduce != "bf16")
    usage_error("--grad-reduce '{}' is not fp32 or bf16", o.grad_reduce);
  parse_sampler(o.sampler);  // throws UsageError naming --sampler
  o.loss_scaling();          // throws UsageError naming --loss-scale or --loss-scale-window
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    usage_error("--device '{}' is not auto, cpu or cuda", o.device);
  if (o.cuda_graph && o.device == "cpu")
    usage_error("--cuda-graph needs --device cuda (the CPU backend launches no kernels)");
  if (o.overlap_update != "auto" && o.overlap_update != "on" && o.overlap_update != "off")
    usage_error("--overlap-update '{}' is not auto, on or off", o.overlap_update);
  if (o.precision != "auto" && o.precision != "fp32" && o.precision != "tf32" &&
      o.precision != "bf16" && o.precision != "fp16")
    usage_error("--precision '{}' is not auto, fp32, tf32, bf16 or fp16", o.precision);
  if (o.attention != "flash" && o.attention != "simple")
    usage_error("--attn '{}' is not flash or simple", o.attention);
  parse_recompute(o.recompute);  // throws UsageError naming --recompute
  parse_sync_strategy(o.ddp);    // throws UsageError naming --ddp
  if (!o.kernel_trace.empty() && !o.benchmark)
    usage_error("--kernel-trace records --benchmark's timed steps: add --benchmark");
  if (!o.kernel_trace.empty() && o.device == "cpu")
    usage_error("--kernel-trace records GPU kernels: it needs --device cuda (or auto on a GPU)");
  if (o.floors_at_cap && !o.benchmark)
    usage_error("--floors-at-cap measures --benchmark's step: add --benchmark");
  if (o.floors_at_cap && o.device == "cpu")
    usage_error("--floors-at-cap reads the GPU's power: it needs --device cuda (or auto on a GPU)");
  if (o.bench_mode != "forward" && o.bench_mode != "forward-backward" && o.bench_mode != "train")
    usage_error("--mode '{}' is not forward, forward-backward or train", o.bench_mode);
  if (!o.benchmark && o.data.empty())
    usage_error("--data is required (a .npy or .bin token file; see launch/prepare_text.py)");
  if (o.overwrite && !o.resume.empty())
    usage_error(
        "--overwrite and --resume exclude each other (--resume continues the run in --out)");
  if (o.resume == kResumeLatest && o.out.empty())
    usage_error("--resume latest needs --out (it continues the newest checkpoint there)");
  // With --resume latest, --init-from gives the weights of the first start (a requeued fine-tune).
  if (!o.init_from.empty() && !o.resume.empty() && o.resume != kResumeLatest)
    usage_error(
        "--init-from and --resume DIR exclude each other (--resume restores the weights too; "
        "--resume latest takes --init-from for a fresh start)");
}

std::string settings_fingerprint(const Options& o) {
  std::ostringstream s;
  const ModelConfig& c = o.config;
  s << "model=" << describe(c) << "\n";
  s << "data=" << o.data << "\nval-data=" << o.val_data << "\nsampler=" << o.sampler << "\n";
  s << "batch=" << o.batch << "\ngrad-accum=" << o.grad_accum << "\nsteps=" << o.steps << "\n";
  s << fmt::format("lr={}\nmin-lr={}\nwarmup={}\nwd={}\nbeta1={}\nbeta2={}\neps={}\nclip={}\n",
                   o.lr, o.min_lr, o.warmup, o.wd, o.beta1, o.beta2, o.eps, o.clip);
  s << "adam-state=" << o.adam_state << "\n";
  s << "loss-scale=" << o.loss_scale << "\nloss-scale-window=" << o.loss_scale_window << "\n";
  s << "seed=" << o.seed << "\ninit-from=" << o.init_from << "\nresume=" << o.resume << "\n";
  s << "save-every=" << o.save_every << "\nout=" << o.out << "\noverwrite=" << o.overwrite
    << "\neval-every=" << o.eval_every << "\neval-batches=" << o.eval_batches << "\n";
  s << "device=" << o.device << "\nprecision=" << o.precision << "\nattn=" << o.attention
    << "\nrecompute=" << o.recompute << "\ncuda-graph=" << o.cuda_graph
    << "\noverlap-update=" << o.overlap_update << "\nupdate-sms=" << o.update_sms
    << "\nwgrad-stream=" << o.wgrad_stream << "\ngemm-tune=" << o.gemm_tune << "\n";
  s << "ddp=" << o.ddp << "\nbucket-mb=" << o.bucket_mb << "\nshard-optim=" << o.shard_optim
    << "\ngrad-reduce=" << o.grad_reduce << "\ncomm-sms=" << o.comm_sms
    << "\ngrad-transport=" << o.grad_transport << "\n";
  s << "benchmark=" << o.benchmark << "\nmode=" << o.bench_mode
    << "\nkernel-trace=" << o.kernel_trace << "\nfloors-at-cap=" << o.floors_at_cap << "\n";
  return s.str();
}

std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(sa, la));
    const bool gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return "";
    if (la != lb || ga != gb) {
      const std::string& l = ga ? la : lb;
      const std::string key = l.substr(0, l.find('='));
      return fmt::format("--{} (rank 0: '{}', here: '{}')", key,
                         ga ? la.substr(la.find('=') + 1) : "",
                         gb ? lb.substr(lb.find('=') + 1) : "");
    }
  }
}

}  // namespace trainer
