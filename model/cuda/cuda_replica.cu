// The CUDA replica: the Transformer of SPEC.md on one GPU, over the flat parameter and gradient
// buffers of ParamLayout (see model/replica.h for the contract).
//
// Memory: parameters (bf16, fp16 or fp32) and gradients (fp32, or bf16 when the ranks exchange
// them whole) are two flat buffers; every activation and scratch buffer is carved once, in the
// constructor, out of one allocation sized for (max_batch, ctx). Nothing is allocated afterwards,
// and nothing in forward or backward waits for the device: token ids travel through pinned staging
// buffers with cudaMemcpyAsync, losses are summed on the device, and take_loss() / evaluate() are
// the only synchronising calls (and stage(), which waits until the last replay has read its slot).
//
// --cuda-graph records the forwards and backwards of a step once (begin_capture .. end_capture)
// and replays the recording: the host stages each micro-batch into a pinned slot of its own
// first, the recording uploads from those slots, and backward launches one embedding-gradient
// block row per token of the micro-batch, the rows past its last group empty.
//
// Forward of block l (n = B*T rows, d model width, f = d_ff):
//   ln1  = rmsnorm(x_l)                       [rstd1 kept]
//   vkq  = ln1 [Wv; Wk; Wq]^T                 one matmul when the three weights are adjacent
//   q, k = rope(...)                          one kernel; flash: in place in the block's vkq,
//                                             attention reads row stride 3d; simple: q, k and
//                                             a copy of v head-major
//   att  = attention(q, k, v)                 simple (cuBLASLt + fp32 softmax) or flash
//   h    = att Wo^T + x_l                     residual add fused into the matmul (beta = 1)
//   ln2  = rmsnorm(h)
//   ba   = ln2 [W3; W1]^T                     one matmul; columns [b | a]
//   g    = silu(a) * b
//   x_l+1 = g W2^T + h                        residual add fused into the matmul
// then logits = rmsnorm(x_L) Whead^T and the fused softmax/cross-entropy, which in a training
// forward also writes dlogits = softmax - onehot over the logits; backward's `scale` becomes the
// alpha of the two lm_head matmuls.
//
// Gradients: the first backward after zero_grads() overwrites them (matmul beta 0, RMSNorm gains
// written, not added) instead of clearing 8 GB for xl first; only the embedding's rows, which
// backward adds into for the tokens present, are cleared. Later backwards accumulate.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/debug_spin.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "model/cuda/attention.cuh"
#include "model/cuda/common.cuh"
#include "model/cuda/cross_entropy.cuh"
#include "model/cuda/embedding.cuh"
#include "model/cuda/flash_attention.h"
#include "model/cuda/handles.h"
#include "model/cuda/matmul.h"
#include "model/cuda/residual.cuh"
#include "model/cuda/rmsnorm.cuh"
#include "model/cuda/rope.cuh"
#include "model/cuda/swiglu.cuh"
#include "model/embedding_buckets.h"
#include "model/replica.h"

namespace trainer {
namespace cuda {
namespace {

constexpr float kRmsEps = 1e-5f;
constexpr double kRopeTheta = 10000.0;
constexpr int64_t kStagingFloats = int64_t{2} << 20;  // 8 MiB: set_params' fp32 -> 16-bit chunks
constexpr int64_t kAlignBytes = 256;

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024)); }

// Puts the GEMMs back on every SM when a pass that set an SM target ends, however it ends.
struct SmTargetReset {
  Matmul& mm;
  ~SmTargetReset() { mm.set_sm_target(0); }
};

// Hands out 256-byte aligned pieces of one allocation. Run once with base 0 to measure, then again
// over the real allocation: both runs see the same sequence of requests.
class Carver {
 public:
  explicit Carver(uintptr_t base) : base_(base) {}
  template <typename U>
  U* take(int64_t count) {
    const int64_t off = align_up(used_, kAlignBytes);
    used_ = off + count * static_cast<int64_t>(sizeof(U));
    return reinterpret_cast<U*>(base_ + static_cast<uintptr_t>(off));
  }
  int64_t used() const { return align_up(used_, kAlignBytes); }

 private:
  uintptr_t base_;
  int64_t used_ = 0;
};

// Linear layers that read the same input, with outputs side by side as column blocks of one
// matrix (q/k/v: [v | k | q]; w3/w1: [b | a]), in flat-buffer order. When the weights are
// adjacent in the flat buffer they form one (count*d_out, d_in) matrix and take one matmul.
struct LinearGroup {
  int count = 0;
  int64_t d_in = 0, d_out = 0;  // per member
  std::array<int64_t, 3> offset{};
  std::array<int, 3> index{};
  bool fused = false;
};

template <typename T>
class CudaReplica final : public Replica {
 public:
  CudaReplica(const ModelConfig& c, const ReplicaOptions& o);
  ~CudaReplica() override;

  DeviceKind device() const override { return DeviceKind::kCuda; }
  const ModelConfig& config() const override { return config_; }
  const ParamLayout& layout() const override { return layout_; }
  BufferView params() override { return params_.view(); }
  BufferView grads() override { return grads_.view(); }

  void forward(const MicroBatch& mb, const ParamsNeededFn& need) override;
  float take_loss() override;
  void backward(float scale, const GradReadyFn& ready) override;
  float evaluate(const MicroBatch& mb) override;
  void zero_grads() override;
  void set_params(const float* host) override;
  void stage(const MicroBatch& mb, int slot) override;
  void forward_staged(int slot, const ParamsNeededFn& need) override;
  void begin_capture() override;
  void end_capture() override;
  void replay() override;
  int64_t activation_bytes() const override { return arena_bytes_; }
  std::vector<MemoryItem> memory_plan() const override {
    const auto bytes = [](const DeviceBuffer& b) { return static_cast<int64_t>(b.bytes()); };
    std::vector<MemoryItem> v = {
        {fmt::format("working weights ({})", tf32_ ? "fp32" : precision_name(options_.precision)),
         bytes(params_)},
        {grad_dtype_ == DType::kF32 ? "gradients (fp32)" : "gradients (bf16)", bytes(grads_)}};
    if (emb_scratch_.bytes()) v.push_back({"embedding gradient sum (fp32)", bytes(emb_scratch_)});
    v.insert(v.end(), carve_items_.begin(), carve_items_.end());
    if (staging_.bytes()) v.push_back({"parameter upload staging (fp32)", bytes(staging_)});
    v.push_back({"cuBLASLt workspace", static_cast<int64_t>(Matmul::kWorkspaceBytes)});
    if (lane_.mm)
      v.push_back({"cuBLASLt workspace (weight gradients' stream)",
                   static_cast<int64_t>(Matmul::kWorkspaceBytes)});
    return v;
  }
  std::string attention_kernel() const override {
    if (flash_) return "flash (fused, FlashAttention-2 style)";
    if (options_.attention == "simple") return "simple (materialised scores; --attn simple)";
    if constexpr (std::is_same_v<T, __half>) {
      return "simple (materialised scores): the flash kernels are bf16 only: fp16 uses the simple "
             "path";
    } else {
      return fmt::format(
          "simple (materialised scores): the flash kernels need bf16 and head dim 16, 32, 64, 80 "
          "or 128 (here {}, head dim {})",
          precision_name(options_.precision), dh_);
    }
  }
  std::string gemm_tuning() const override {
    if (!options_.gemm_tune) return "";
    Matmul::TuneStats t = mm_->tune_stats();
    if (lane_.mm) t += lane_.mm->tune_stats();
    return fmt::format(
        "{} planned{}; of cuBLASLt's {} alternatives to its first choices, {} give the same "
        "results bit for bit; {} products timed them, {} took a faster one{}",
        t.problems,
        t.reused ? fmt::format(" ({} with the pick made earlier in this process)", t.reused) : "",
        t.offered, t.identical, t.tuned, t.switched,
        t.switched
            ? fmt::format(" ({:.1f}% faster alone)", 100.0 * (1.0 - t.picked_ms / t.first_ms))
            : "");
  }
  void synchronize() override {
    use_device();
    CUDA_CHECK(cudaStreamSynchronize(stream_.s));
  }
  void* stream() override { return stream_.s; }
  void set_update_in_flight(bool on) override { update_in_flight_ = on; }

 private:
  struct BlockParams {
    int64_t first;  // lowest offset of the block's tensors (ParamsNeededFn)
    int64_t ln1, o, ln2, w2;
    int i_ln1, i_o, i_ln2, i_w2;
    LinearGroup vkq, w31;
  };
  // What one block keeps from forward for backward.
  struct BlockActs {
    T* ln1;
    float* rstd1;
    // After RoPE. simple: three head-major tensors; flash: the columns of one (n, 3d) buffer
    // [v | k | q] with row stride 3d, the fused projection's output rotated in place.
    T *q, *k, *v;
    T* probs;    // simple: (B, H, T, T) softmax; backward overwrites it with dS
    float* lse;  // flash: (B, H, T)
    T* att;      // (n, d) attention output before output_proj
    T* h;        // (n, d) x + attention
    T* ln2;
    float* rstd2;
    T* ba;  // (n, 2f) columns [b | a]; backward overwrites it with [db | da]
    T* g;   // (n, f) silu(a) * b
  };

  void use_device() const { CUDA_CHECK(cudaSetDevice(device_index_)); }
  void carve(Carver& cv);
  void check_batch(const MicroBatch& mb) const;
  // A staging slot holds, for n tokens, what tokens_ holds on the device: ids and targets
  // (put_tokens), then backward's grouping of the positions by id (put_buckets: ids, n + 1
  // starts, positions), 5n + 1 int32 in all. put_buckets returns the number of groups.
  static void put_tokens(const MicroBatch& mb, int32_t* slot);
  int64_t put_buckets(const MicroBatch& mb, int32_t* slot);
  // Copies ids and targets into the next pinned slot and uploads them on the stream.
  void stage_tokens(const MicroBatch& mb);
  // Then (training, once forward is queued) the embedding-gradient buckets into the same slot.
  void stage_buckets(const MicroBatch& mb);
  void run_forward(int64_t B, int64_t seq, bool training, const ParamsNeededFn& need);
  // The host state a training forward of (batch, seq) leaves for backward and take_loss().
  void forwarded(int64_t batch, int64_t seq);

  const T* P(int64_t offset) const { return params_.as<T>() + offset; }
  // Gradient of the tensor at `offset`, of grad_dtype_.
  void* G(int64_t offset) const {
    return static_cast<char*>(grads_.view().data) + offset * dtype_size(grad_dtype_);
  }
  // RMSNorm backward with its gain gradient at flat offset `dw` (fp32 or bf16 gradients).
  void norm_backward(const T* x, const T* w, const float* rstd, const T* dy, T* dx,
                     bool accumulate_dx, int64_t dw, int64_t n, RmsnormScratch rms);

  // y[n, d_out] (row stride ldy) = x W^T (+ resid when given, same row stride as y)
  void linear_forward(const T* x, const T* W, T* y, int64_t ldy, int64_t n, int64_t d_in,
                      int64_t d_out, const T* resid = nullptr);
  // dx[n, d_in] (+)= alpha * dy W   (dy row stride ldy)
  void linear_backward_data(const T* dy, int64_t ldy, const T* W, T* dx, int64_t n, int64_t d_in,
                            int64_t d_out, float alpha, bool accumulate);
  // dW[d_out, d_in] += alpha * dy^T x   (gradient of grad_dtype_), on the weight-gradient lane
  // when it is on, after everything the compute stream has queued so far. Returns the lane's count
  // of products once this one is queued (0: none).
  int64_t linear_backward_weight(const T* dy, int64_t ldy, const T* x, void* dW, int64_t n,
                                 int64_t d_in, int64_t d_out, float alpha);
  // With the lane on and flash attention: zeroes the attention backward's dq accumulator on the
  // lane, after everything the compute stream has queued so far, and returns the lane's count of
  // products with it (the next attention backward waits for that many). Otherwise 0: the attention
  // backward zeroes it itself.
  int64_t clear_attention_workspace(int64_t B, int64_t seq);
  // The lane's next products start after what the compute stream has queued so far (lane on).
  void fork_lane();
  // Marks the end of the product just queued on the lane; returns the lane's count of products.
  int64_t lane_issued();
  // The compute stream waits for the lane's first `count` products; then reports the gradients
  // that became final.
  void await_lane(int64_t count);
  // Reports tensor `index` ready (in call order) once the compute stream has waited for the
  // lane's first `needs` products.
  void report(int index, int64_t needs);
  // att = attention(q, k, v) and its backward into dq_, dk_, dv_, by the chosen path.
  void attention_layer_forward(BlockActs& a, int64_t B, int64_t seq);
  void attention_layer_backward(BlockActs& a, const T* datt, int64_t B, int64_t seq);
  void group_forward(const LinearGroup& gr, const T* x, T* y, int64_t n);
  // The parts of block l's forward that recompute reruns in backward (into acts_[l]).
  void attention_half_forward(int64_t l, int64_t B, int64_t seq);
  void ffn_gate_forward(int64_t l, int64_t n);
  void group_backward(const LinearGroup& gr, const T* x, const T* dy, T* dx, int64_t n);

  ModelConfig config_;
  ParamLayout layout_;
  ReplicaOptions options_;
  int device_index_ = 0;
  int backward_sms_ = 0;  // cuBLASLt SM target during backward (0: every SM)
  int forward_sms_ = 0;   // the same for forward's blocks beside an update (0: every SM)
  bool update_in_flight_ = false;
  int blocks_sms_ = 0;  // the target the last forward's blocks ran with (recompute repeats it)
  int64_t flat_ = 0;
  int64_t n_max_ = 0;  // max_batch * ctx rows
  int64_t d_, f_, V_, Vp_, H_, dh_, L_;
  bool tf32_ = false;
  bool flash_ = false;
  DType grad_dtype_ = DType::kF32;

  // Parameter offsets and tensor indices.
  std::vector<BlockParams> blocks_;
  int64_t off_emb_, off_lnf_, off_head_;
  int i_emb_, i_lnf_, i_head_;

  StreamHandle stream_;
  std::unique_ptr<Matmul> mm_;
  // --wgrad-stream: backward's weight-gradient GEMMs on a stream of their own. Each starts once
  // its inputs exist and runs beside the chain of input gradients, the critical path; the compute
  // stream waits for a product only before it overwrites one of that product's inputs. A gradient
  // is reported ready only after the compute stream has waited for it, so the caller's events on
  // stream() still follow every write to it.
  struct WgradLane {
    static constexpr int kRing = 16;  // products not yet waited for, at most (a block has 2-5)
    StreamHandle stream;
    std::unique_ptr<Matmul> mm;  // its own workspace: its products run beside the compute stream's
    EventHandle fork;
    std::array<EventHandle, kRing> done;  // product i (from 1) ends at done[(i - 1) % kRing]
    int64_t issued = 0, waited = 0;
    int sm_target = 0;  // cuBLASLt SM target of its products (0: every SM)
  } lane_;
  std::deque<std::pair<int, int64_t>> pending_;  // (tensor, lane products it needs), in order
  const GradReadyFn* ready_ = nullptr;           // during backward()
  DeviceBuffer params_, grads_, arena_, staging_, emb_scratch_;
  int64_t arena_bytes_ = 0;
  std::vector<MemoryItem> carve_items_;  // the arena by category, from carve()

  // Activations and scratch, carved from arena_.
  std::vector<T*> resid_;  // L + 1 residual stream tensors (n, d); resid_[l] is block l's input
  std::vector<BlockActs> acts_;
  T *lnf_, *logits_;  // (n, d), (n, Vp): dlogits after a training forward
  float *rstdf_, *losses_;
  T* vkq_;                // (n, 3d) fused projection output (simple), its gradient (both)
  T* attn_hm_;            // (n, d) simple attention: head-major product / output gradient
  T *dq_, *dk_, *dv_;     // simple: (n, d) each, attention input gradients before RoPE backward
  float* scores_;         // simple: (B, H, T, T) fp32 scores, then dP
  void* flash_ws_;        // flash backward workspace
  T *dres_, *dln_, *dg_;  // (n, d) residual-stream gradient, (n, d) norm-output gradient, (n, f)
  float* emb_grad_;  // the embedding's fp32 gradient: in grads_, or a scratch for bf16 gradients
  float* rms_partial_;
  unsigned* rms_counters_;
  unsigned* ce_counter_;
  double* loss_sum_;  // [0] training, [1] evaluation
  int32_t* tokens_;   // ids, targets, bucket ids, bucket starts, bucket positions
  float* rope_table_;

  // Host side.
  static constexpr int kSlots = 2;  // pinned staging slots, so one upload may still be in flight
  std::array<PinnedHandle, kSlots> pinned_;
  std::array<EventHandle, kSlots> uploaded_;
  int slot_ = 0;
  PinnedHandle loss_host_;
  std::vector<int32_t> bucket_scratch_;
  // Host state that forward and backward change, which replay() re-applies.
  struct HostState {
    int64_t groups = 0;      // embedding-gradient groups the next backward launches
    int64_t B = 0, seq = 0;  // shape of the last forward
    bool backward_ready = false;
    // False from zero_grads() to the end of the next backward, which then overwrites the
    // gradients.
    bool accumulate_grads = true;
    int64_t train_tokens = 0;  // since the last take_loss()
  } host_;
  // --cuda-graph: one pinned slot per micro-batch of the captured step, with the shape staged in
  // it; the recording and the host state at its start and end.
  struct StagedSlot {
    PinnedHandle pinned;
    int64_t batch = 0, seq = 0;
  };
  std::vector<std::unique_ptr<StagedSlot>> staged_;
  EventHandle staged_read_;  // after the last replay (or uncaptured forward_staged's upload)
  cudaGraphExec_t graph_ = nullptr;
  bool capturing_ = false;
  HostState captured_begin_, captured_end_;
  std::vector<std::string> fwd_names_, bwd_names_;
};

template <typename T>
CudaReplica<T>::CudaReplica(const ModelConfig& c, const ReplicaOptions& o)
    : config_(c), layout_(c), options_(o), device_index_(o.device_index) {
  validate(c);
  if (o.max_batch <= 0) usage_error("--batch must be positive (got {})", o.max_batch);
  if (o.attention != "flash" && o.attention != "simple")
    usage_error("--attn must be 'flash' or 'simple' (got '{}')", o.attention);
  // 0 when the driver is missing or too old for this runtime: a user error, not a crash.
  const int devices = cuda_device_count();
  if (o.device_index < 0 || o.device_index >= devices)
    usage_error("GPU {} does not exist: {} CUDA device(s) visible", o.device_index, devices);
  TRAINER_CHECK(o.flat_elems >= layout_.total(), "flat buffers of {} elements < layout total {}",
                o.flat_elems, layout_.total());
  use_device();
  {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o.device_index));
    // The GEMMs' SM target while `reserved` SMs go to work beside them (0: none reserved).
    const auto target = [&](int reserved, const char* flag, const char* whose) {
      if (reserved >= sms)
        usage_error("{} {} leaves no SM for {}: GPU {} has {} SMs", flag, reserved, whose,
                    o.device_index, sms);
      return reserved > 0 ? sms - reserved : 0;
    };
    backward_sms_ = target(o.comm_sms, "--comm-sms", "compute");
    forward_sms_ = target(o.update_sms, "--update-sms", "forward");
    // The weight-gradient stream's GEMMs leave o.wgrad_sms of the SMs backward's GEMMs use.
    const int base = backward_sms_ ? backward_sms_ : sms;
    if (o.wgrad_sms > 0 && base - o.wgrad_sms < 8)
      usage_error(
          "--wgrad-stream {} leaves the weight-gradient GEMMs {} of the {} SMs backward's GEMMs "
          "use on this GPU (at least 8)",
          o.wgrad_sms, base - o.wgrad_sms, base);
    lane_.sm_target = o.wgrad_sms > 0 ? base - o.wgrad_sms : backward_sms_;
  }

  if (o.grad_dtype != DType::kF32 &&
      !(o.grad_dtype == DType::kBF16 && std::is_same_v<T, __nv_bfloat16>))
    usage_error("{} gradients need --precision bf16", dtype_name(o.grad_dtype));
  grad_dtype_ = o.grad_dtype;
  flat_ = o.flat_elems;
  d_ = c.d_model;
  f_ = c.d_ff;
  V_ = c.vocab;
  Vp_ = align_up(c.vocab, 8);  // logits rows start 16-byte aligned
  H_ = c.n_heads;
  dh_ = c.head_dim();
  L_ = c.n_layers;
  n_max_ = o.max_batch * c.ctx;
  tf32_ = o.precision == Precision::kTf32;
  // Flash kernels are bf16 only; fp32, tf32 and fp16 always use the simple path.
  flash_ = o.attention == "flash" && std::is_same_v<T, __nv_bfloat16> &&
           flash_attention_supports(static_cast<int>(dh_));
  TRAINER_CHECK(n_max_ < (int64_t{1} << 31) && c.ctx < (int64_t{1} << 31),
                "{} rows per micro-batch", n_max_);

  layout_.locate("token_embeddings.weight", off_emb_, i_emb_);
  layout_.locate("ln_final.weight", off_lnf_, i_lnf_);
  layout_.locate("lm_head.weight", off_head_, i_head_);
  blocks_.resize(L_);
  for (int64_t l = 0; l < L_; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    BlockParams& bp = blocks_[l];
    bp.first = layout_.block_offset(static_cast<int>(l));
    layout_.locate(p + "ln1.weight", bp.ln1, bp.i_ln1);
    layout_.locate(p + "attn.output_proj.weight", bp.o, bp.i_o);
    layout_.locate(p + "ln2.weight", bp.ln2, bp.i_ln2);
    layout_.locate(p + "ffn.w2.weight", bp.w2, bp.i_w2);
    auto group = [&](LinearGroup& gr, std::initializer_list<const char*> names, int64_t d_in,
                     int64_t d_out) {
      gr.d_in = d_in;
      gr.d_out = d_out;
      for (const char* nm : names) {
        layout_.locate(p + nm, gr.offset[gr.count], gr.index[gr.count]);
        ++gr.count;
      }
      gr.fused = true;
      for (int j = 1; j < gr.count; ++j)
        gr.fused = gr.fused && gr.offset[j] == gr.offset[j - 1] + d_in * d_out;
    };
    // Flat-buffer order (ParamLayout): v, k, q and w3, w1.
    group(bp.vkq, {"attn.v_proj.weight", "attn.k_proj.weight", "attn.q_proj.weight"}, d_, d_);
    group(bp.w31, {"ffn.w3.weight", "ffn.w1.weight"}, d_, f_);
  }
  for (int64_t l = 0; l < L_; ++l) {
    fwd_names_.push_back(fmt::format("layer {} fwd", l));
    bwd_names_.push_back(fmt::format("layer {} bwd", l));
  }

  // Measure, check that everything fits, then allocate.
  Carver measure(0);
  carve(measure);
  arena_bytes_ = measure.used();
  const int64_t param_bytes = flat_ * static_cast<int64_t>(sizeof(T));
  const int64_t emb_elems = layout_.tensors()[i_emb_].numel;
  const bool emb_scratch = grad_dtype_ != DType::kF32;
  // Gradients, the embedding's fp32 scratch and the peers' copies the communicator will hold.
  const int64_t grad_bytes = flat_ * static_cast<int64_t>(dtype_size(grad_dtype_)) +
                             (emb_scratch ? emb_elems * 4 : 0) + o.grad_copies * flat_ * 2;
  // The optimizer state is allocated by the optimizer (fp32 master, m, v: 12 bytes per element of
  // this rank's shard, 8 with bf16 moments); it is counted here so that a model that cannot train
  // is refused before any work.
  const int64_t optim_bytes =
      (o.optimizer_elems >= 0 ? o.optimizer_elems : flat_) * o.optimizer_bytes_per_elem;
  const int64_t work_bytes =
      static_cast<int64_t>(Matmul::kWorkspaceBytes) * (o.wgrad_sms >= 0 ? 2 : 1) +
      kStagingFloats * 4;
  const int64_t need = param_bytes + grad_bytes + arena_bytes_ + optim_bytes + work_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > static_cast<int64_t>(free_bytes))
    usage_error(
        "model does not fit: needs {} (params {}, grads {}, activations {}, optimizer {}, "
        "workspace {}), {} free on GPU {}: {}",
        gib(need), gib(param_bytes), gib(grad_bytes), gib(arena_bytes_), gib(optim_bytes),
        gib(work_bytes), gib(static_cast<double>(free_bytes)), device_index_, kOutOfMemoryAdvice);

  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_.s, cudaStreamNonBlocking,
                                          o.urgent_stream ? greatest : least));
  mm_ = std::make_unique<Matmul>();
  mm_->set_tuning(o.gemm_tune);
  if (o.wgrad_sms >= 0) {
    // Lowest priority: where both streams have blocks waiting, the input gradients' go first.
    CUDA_CHECK(cudaStreamCreateWithPriority(&lane_.stream.s, cudaStreamNonBlocking, least));
    lane_.mm = std::make_unique<Matmul>();
    lane_.mm->set_tuning(o.gemm_tune);
    CUDA_CHECK(cudaEventCreateWithFlags(&lane_.fork.e, cudaEventDisableTiming));
    for (EventHandle& ev : lane_.done)
      CUDA_CHECK(cudaEventCreateWithFlags(&ev.e, cudaEventDisableTiming));
  }
  params_ = DeviceBuffer(DeviceKind::kCuda, dtype_of<T>(), flat_);
  grads_ = DeviceBuffer(DeviceKind::kCuda, grad_dtype_, flat_);
  if (emb_scratch) emb_scratch_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, emb_elems);
  emb_grad_ = emb_scratch ? emb_scratch_.as<float>() : static_cast<float*>(G(off_emb_));
  arena_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, arena_bytes_ / 4);  // zero-filled
  if (!std::is_same_v<T, float>)
    staging_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, kStagingFloats);
  Carver real(reinterpret_cast<uintptr_t>(arena_.view().data));
  carve(real);
  TRAINER_CHECK(real.used() == arena_bytes_, "arena carve changed: {} vs {}", real.used(),
                arena_bytes_);

  const std::vector<float> table = rope_table(c.ctx, dh_, kRopeTheta);
  CUDA_CHECK(
      cudaMemcpy(rope_table_, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
  const size_t slot_bytes = static_cast<size_t>(5 * n_max_ + 1) * sizeof(int32_t);
  for (int s = 0; s < kSlots; ++s) {
    CUDA_CHECK(cudaHostAlloc(&pinned_[s].p, slot_bytes, cudaHostAllocDefault));
    CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_[s].e, cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaHostAlloc(&loss_host_.p, 2 * sizeof(double), cudaHostAllocDefault));
  for (int s = 0; s < o.graph_slots; ++s) {
    staged_.push_back(std::make_unique<StagedSlot>());
    CUDA_CHECK(cudaHostAlloc(&staged_.back()->pinned.p, slot_bytes, cudaHostAllocDefault));
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&staged_read_.e, cudaEventDisableTiming));
  // The zero fills and the table upload above ran on the legacy default stream, which the
  // non-blocking compute stream does not wait for.
  CUDA_CHECK(cudaDeviceSynchronize());

  spdlog::info(
      "CUDA replica on GPU {}: {} weights, {} attention, activations {} for {} x {}{}{}{}",
      device_index_, tf32_ ? "fp32 (tf32 matmuls)" : precision_name(o.precision),
      flash_ ? "flash" : "simple", gib(static_cast<double>(arena_bytes_)), o.max_batch, c.ctx,
      backward_sms_ ? fmt::format(", backward GEMMs on {} SMs", backward_sms_) : std::string(),
      forward_sms_ ? fmt::format(", forward GEMMs on {} SMs beside the update", forward_sms_)
                   : std::string(),
      !lane_.mm ? std::string()
      : lane_.sm_target
          ? fmt::format(", weight gradients on a second stream ({} SMs)", lane_.sm_target)
          : std::string(", weight gradients on a second stream"));
}

template <typename T>
CudaReplica<T>::~CudaReplica() {
  // Finish queued work before buffers go away; errors cannot be reported from here.
  if (stream_.s) cudaStreamSynchronize(stream_.s);
  if (lane_.stream.s) cudaStreamSynchronize(lane_.stream.s);
  if (graph_) cudaGraphExecDestroy(graph_);
}

template <typename T>
void CudaReplica<T>::carve(Carver& cv) {
  const int64_t n = n_max_, d = d_, f = f_;
  const int64_t bht = options_.max_batch * H_ * config_.ctx;  // rows of attention scores
  // The memory report's lines: the bytes taken since the previous mark, added to `what`'s line.
  carve_items_.clear();
  int64_t marked = 0;
  auto mark = [&](const std::string& what) {
    const int64_t bytes = cv.used() - marked;
    marked = cv.used();
    for (MemoryItem& m : carve_items_)
      if (m.category == what) {
        m.bytes += bytes;
        return;
      }
    if (bytes > 0) carve_items_.push_back({what, bytes});
  };
  resid_.assign(L_ + 1, nullptr);
  for (auto& r : resid_) r = cv.take<T>(n * d);
  mark("activations: residual stream (every block's input and the output)");
  auto take_attention = [&](BlockActs& a) {
    a.ln1 = cv.take<T>(n * d);
    a.rstd1 = cv.take<float>(n);
    if (flash_) {
      a.v = cv.take<T>(n * 3 * d);
      a.k = a.v + d;
      a.q = a.v + 2 * d;
    } else {
      a.q = cv.take<T>(n * d);
      a.k = cv.take<T>(n * d);
      a.v = cv.take<T>(n * d);
    }
    a.probs = flash_ ? nullptr : cv.take<T>(bht * config_.ctx);
    a.lse = flash_ ? cv.take<float>(bht) : nullptr;
    a.att = cv.take<T>(n * d);
    a.h = cv.take<T>(n * d);
  };
  auto take_ffn = [&](BlockActs& a) {
    a.ln2 = cv.take<T>(n * d);
    a.rstd2 = cv.take<float>(n);
    a.ba = cv.take<T>(n * 2 * f);
    a.g = cv.take<T>(n * f);
  };
  // What backward recomputes lives in one set of buffers that every block's forward overwrites.
  const Recompute rc = options_.recompute;
  BlockActs shared{};
  if (rc == Recompute::kBlock) take_attention(shared);
  if (rc != Recompute::kNone) take_ffn(shared);
  mark(fmt::format("activations: recomputed in backward (--recompute {}; one set for all blocks)",
                   recompute_name(rc)));
  acts_.assign(L_, shared);
  for (BlockActs& a : acts_) {
    if (rc != Recompute::kBlock) take_attention(a);
    if (rc == Recompute::kNone) take_ffn(a);
  }
  if (rc != Recompute::kBlock)
    mark(fmt::format("activations: kept for backward ({:.1f} MiB per block x {})",
                     static_cast<double>(cv.used() - marked) / L_ / 1048576.0, L_));
  lnf_ = cv.take<T>(n * d);
  rstdf_ = cv.take<float>(n);
  logits_ = cv.take<T>(n * Vp_);
  losses_ = cv.take<float>(n);
  mark("final norm, logits and per-token loss");
  vkq_ = cv.take<T>(n * 3 * d);
  dq_ = flash_ ? nullptr : cv.take<T>(n * d);
  dk_ = flash_ ? nullptr : cv.take<T>(n * d);
  dv_ = flash_ ? nullptr : cv.take<T>(n * d);
  mark("backward scratch (gradients of activations, token ids, tables)");
  if (flash_) {
    attn_hm_ = nullptr;
    scores_ = nullptr;
    flash_ws_ = cv.take<char>(static_cast<int64_t>(flash_attention_backward_workspace_bytes(
        static_cast<int>(options_.max_batch), static_cast<int>(config_.ctx), static_cast<int>(H_),
        static_cast<int>(dh_))));
  } else {
    attn_hm_ = cv.take<T>(n * d);
    scores_ = cv.take<float>(bht * config_.ctx);
    flash_ws_ = nullptr;
  }
  mark(flash_ ? "attention workspace (flash backward)"
              : "attention workspace (simple: fp32 scores of one block)");
  dres_ = cv.take<T>(n * d);
  dln_ = cv.take<T>(n * d);
  dg_ = cv.take<T>(n * f);
  rms_partial_ = cv.take<float>(rmsnorm_backward_partial_floats(d));
  rms_counters_ = cv.take<unsigned>(rmsnorm_backward_counters(d));
  ce_counter_ = cv.take<unsigned>(1);
  loss_sum_ = cv.take<double>(2);
  tokens_ = cv.take<int32_t>(5 * n + 1);
  rope_table_ = cv.take<float>(config_.ctx * dh_);
  mark("backward scratch (gradients of activations, token ids, tables)");
}

template <typename T>
void CudaReplica<T>::check_batch(const MicroBatch& mb) const {
  TRAINER_CHECK(mb.inputs != nullptr && mb.targets != nullptr, "forward needs inputs and targets");
  if (mb.batch <= 0 || mb.batch > options_.max_batch)
    usage_error("micro-batch of {} sequences does not fit the model's buffers for 1..{} (--batch)",
                mb.batch, options_.max_batch);
  if (mb.seq <= 0 || mb.seq > config_.ctx)
    usage_error("sequence length {} is outside 1..{} (--ctx)", mb.seq, config_.ctx);
  const int64_t n = mb.batch * mb.seq;
  for (int64_t i = 0; i < n; ++i) {
    if (mb.inputs[i] < 0 || mb.inputs[i] >= V_)
      usage_error(
          "input token id {} at row {} position {} is outside the vocabulary 0..{} (--vocab)",
          mb.inputs[i], i / mb.seq, i % mb.seq, V_ - 1);
    if (mb.targets[i] < 0 || mb.targets[i] >= V_)
      usage_error(
          "target token id {} at row {} position {} is outside the vocabulary 0..{} (--vocab)",
          mb.targets[i], i / mb.seq, i % mb.seq, V_ - 1);
  }
}

template <typename T>
void CudaReplica<T>::put_tokens(const MicroBatch& mb, int32_t* slot) {
  const int64_t n = mb.batch * mb.seq;
  std::memcpy(slot, mb.inputs, n * sizeof(int32_t));
  std::memcpy(slot + n, mb.targets, n * sizeof(int32_t));
}

template <typename T>
int64_t CudaReplica<T>::put_buckets(const MicroBatch& mb, int32_t* slot) {
  const int64_t n = mb.batch * mb.seq;
  return build_embedding_buckets(mb.inputs, n, bucket_scratch_, slot + 2 * n, slot + 3 * n,
                                 slot + 4 * n + 1);
}

// The slot's previous upload must have finished before the host overwrites it; with two slots
// that wait is almost always already over.
template <typename T>
void CudaReplica<T>::stage_tokens(const MicroBatch& mb) {
  const int64_t n = mb.batch * mb.seq;
  slot_ = (slot_ + 1) % kSlots;
  CUDA_CHECK(cudaEventSynchronize(uploaded_[slot_].e));
  auto* host = static_cast<int32_t*>(pinned_[slot_].p);
  put_tokens(mb, host);
  CUDA_CHECK(
      cudaMemcpyAsync(tokens_, host, 2 * n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.s));
  CUDA_CHECK(cudaEventRecord(uploaded_[slot_].e, stream_.s));
}

// The grouping is host work (a counting sort over the micro-batch): done after forward's kernels
// are queued, it runs while the GPU computes instead of before. Backward, later on the same
// stream, is the first reader of the buckets.
template <typename T>
void CudaReplica<T>::stage_buckets(const MicroBatch& mb) {
  const int64_t n = mb.batch * mb.seq;
  auto* host = static_cast<int32_t*>(pinned_[slot_].p);  // stage_tokens' slot, already free
  host_.groups = put_buckets(mb, host);
  CUDA_CHECK(cudaMemcpyAsync(tokens_ + 2 * n, host + 2 * n, (3 * n + 1) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_.s));
  CUDA_CHECK(cudaEventRecord(uploaded_[slot_].e, stream_.s));
}

template <typename T>
void CudaReplica<T>::linear_forward(const T* x, const T* W, T* y, int64_t ldy, int64_t n,
                                    int64_t d_in, int64_t d_out, const T* resid) {
  Gemm g = linear_gemm(x, W, y, ldy, n, d_in, d_out, dtype_of<T>(), dtype_of<T>(), resid);
  g.tf32 = tf32_;
  mm_->run(g, stream_.s);
}

template <typename T>
void CudaReplica<T>::linear_backward_data(const T* dy, int64_t ldy, const T* W, T* dx, int64_t n,
                                          int64_t d_in, int64_t d_out, float alpha,
                                          bool accumulate) {
  Gemm g;
  g.m = n;
  g.n = d_in;
  g.k = d_out;
  g.a = dy;
  g.lda = ldy;
  g.b = W;
  g.ldb = d_in;
  g.d = dx;
  g.ldd = d_in;
  g.alpha = alpha;
  g.beta = accumulate ? 1.0f : 0.0f;
  g.ab_type = g.cd_type = dtype_of<T>();
  g.tf32 = tf32_;
  mm_->run(g, stream_.s);
}

template <typename T>
int64_t CudaReplica<T>::linear_backward_weight(const T* dy, int64_t ldy, const T* x, void* dW,
                                               int64_t n, int64_t d_in, int64_t d_out,
                                               float alpha) {
  Gemm g;
  g.trans_a = true;
  g.m = d_out;
  g.n = d_in;
  g.k = n;
  g.a = dy;
  g.lda = ldy;
  g.b = x;
  g.ldb = d_in;
  g.d = dW;
  g.ldd = d_in;
  g.alpha = alpha;
  g.beta = host_.accumulate_grads ? 1.0f : 0.0f;  // accumulate over micro-batches after the first
  g.ab_type = dtype_of<T>();
  g.cd_type = grad_dtype_;
  g.tf32 = tf32_;
  if (!lane_.mm) {
    mm_->run(g, stream_.s);
    return 0;
  }
  fork_lane();
  lane_.mm->run(g, lane_.stream.s);
  return lane_issued();
}

template <typename T>
int64_t CudaReplica<T>::clear_attention_workspace(int64_t B, int64_t seq) {
  if (!lane_.mm || !flash_) return 0;
  fork_lane();
  flash_attention_backward_clear(flash_ws_, static_cast<int>(B), static_cast<int>(seq),
                                 static_cast<int>(H_), static_cast<int>(dh_), lane_.stream.s);
  return lane_issued();
}

template <typename T>
int64_t CudaReplica<T>::lane_issued() {
  const size_t slot = static_cast<size_t>(lane_.issued++) % WgradLane::kRing;
  CUDA_CHECK(cudaEventRecord(lane_.done[slot].e, lane_.stream.s));
  return lane_.issued;
}

template <typename T>
void CudaReplica<T>::fork_lane() {
  CUDA_CHECK(cudaEventRecord(lane_.fork.e, stream_.s));
  CUDA_CHECK(cudaStreamWaitEvent(lane_.stream.s, lane_.fork.e, 0));
  debug_spin(lane_.stream.s, options_.debug_wgrad_delay_us);
}

template <typename T>
void CudaReplica<T>::await_lane(int64_t count) {
  if (count > lane_.waited) {
    TRAINER_CHECK(lane_.issued - count < WgradLane::kRing,
                  "weight-gradient stream: product {} of {} waited for too late", count,
                  lane_.issued);
    const size_t slot = static_cast<size_t>(count - 1) % WgradLane::kRing;
    CUDA_CHECK(cudaStreamWaitEvent(stream_.s, lane_.done[slot].e, 0));
    lane_.waited = count;
  }
  while (!pending_.empty() && pending_.front().second <= lane_.waited) {
    if (*ready_) (*ready_)(pending_.front().first);
    pending_.pop_front();
  }
}

template <typename T>
void CudaReplica<T>::report(int index, int64_t needs) {
  pending_.emplace_back(index, needs);
  await_lane(0);
}

template <typename T>
void CudaReplica<T>::norm_backward(const T* x, const T* w, const float* rstd, const T* dy, T* dx,
                                   bool accumulate_dx, int64_t dw, int64_t n, RmsnormScratch rms) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (grad_dtype_ == DType::kBF16) {
      rmsnorm_backward(x, w, rstd, dy, dx, accumulate_dx, static_cast<T*>(G(dw)),
                       host_.accumulate_grads, n, d_, rms, stream_.s);
      return;
    }
  }
  rmsnorm_backward(x, w, rstd, dy, dx, accumulate_dx, static_cast<float*>(G(dw)),
                   host_.accumulate_grads, n, d_, rms, stream_.s);
}

template <typename T>
void CudaReplica<T>::group_forward(const LinearGroup& gr, const T* x, T* y, int64_t n) {
  const int64_t ldy = gr.count * gr.d_out;
  if (gr.fused) {
    linear_forward(x, P(gr.offset[0]), y, ldy, n, gr.d_in, ldy);
    return;
  }
  for (int j = 0; j < gr.count; ++j)
    linear_forward(x, P(gr.offset[j]), y + j * gr.d_out, ldy, n, gr.d_in, gr.d_out);
}

// Weight gradients first (on the lane when it is on, after everything queued so far, dy
// included), then the input gradient dx = sum_j dy_j W_j.
template <typename T>
void CudaReplica<T>::group_backward(const LinearGroup& gr, const T* x, const T* dy, T* dx,
                                    int64_t n) {
  const int64_t ldy = gr.count * gr.d_out;
  if (gr.fused) {
    const int64_t made = linear_backward_weight(dy, ldy, x, G(gr.offset[0]), n, gr.d_in, ldy, 1.0f);
    for (int j = 0; j < gr.count; ++j) report(gr.index[j], made);
    linear_backward_data(dy, ldy, P(gr.offset[0]), dx, n, gr.d_in, ldy, 1.0f, false);
    return;
  }
  for (int j = 0; j < gr.count; ++j)
    report(gr.index[j], linear_backward_weight(dy + j * gr.d_out, ldy, x, G(gr.offset[j]), n,
                                               gr.d_in, gr.d_out, 1.0f));
  for (int j = 0; j < gr.count; ++j)
    linear_backward_data(dy + j * gr.d_out, ldy, P(gr.offset[j]), dx, n, gr.d_in, gr.d_out, 1.0f,
                         j > 0);
}

template <typename T>
void CudaReplica<T>::attention_layer_forward(BlockActs& a, int64_t B, int64_t seq) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (flash_) {
      flash_attention_forward(a.q, a.k, a.v, a.att, a.lse, static_cast<int>(B),
                              static_cast<int>(seq), static_cast<int>(H_), static_cast<int>(dh_),
                              stream_.s, FlashKernels::kAuto, {3 * d_, 0});
      return;
    }
  }
  attention_forward(*mm_, a.q, a.k, a.v, a.probs, a.att, scores_, attn_hm_, B, seq, H_, dh_, tf32_,
                    stream_.s);
}

template <typename T>
void CudaReplica<T>::attention_layer_backward(BlockActs& a, const T* datt, int64_t B, int64_t seq) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (flash_) {
      // dq, dk, dv straight into the fused projection's gradient [dv | dk | dq], dq and dk
      // through RoPE's backward already.
      flash_attention_backward(a.q, a.k, a.v, a.att, datt, a.lse, vkq_ + 2 * d_, vkq_ + d_, vkq_,
                               flash_ws_, static_cast<int>(B), static_cast<int>(seq),
                               static_cast<int>(H_), static_cast<int>(dh_), stream_.s,
                               FlashKernels::kAuto, {3 * d_, 3 * d_}, rope_table_,
                               /*dq_acc_zeroed=*/lane_.mm != nullptr);
      return;
    }
  }
  attention_backward(*mm_, a.q, a.k, a.v, a.probs, datt, dq_, dk_, dv_, scores_, attn_hm_, B, seq,
                     H_, dh_, tf32_, stream_.s);
}

// Block l's attention half from its input resid_[l]: ln1, q, k, v (RoPE applied), attention,
// h = x + att Wo^T.
template <typename T>
void CudaReplica<T>::attention_half_forward(int64_t l, int64_t B, int64_t seq) {
  const int64_t n = B * seq, d = d_;
  cudaStream_t s = stream_.s;
  const QkvLayout qkv_layout = flash_ ? QkvLayout::kTokenMajor : QkvLayout::kHeadMajor;
  const BlockParams& p = blocks_[l];
  BlockActs& a = acts_[l];
  rmsnorm_forward(resid_[l], P(p.ln1), a.ln1, a.rstd1, n, d, kRmsEps, s);
  RopeJobs<T> jobs;
  if (flash_) {
    // The projection straight into the block's [v | k | q], q and k rotated in place: attention
    // reads them with row stride 3d, and v needs no copy.
    group_forward(p.vkq, a.ln1, a.v, n);
    jobs.add(a.q, a.q, true);
    jobs.add(a.k, a.k, true);
    rope(jobs, QkvLayout::kTokenMajor, 3 * d, QkvLayout::kTokenMajor, 3 * d, B, seq, H_, dh_,
         rope_table_, false, s);
  } else {
    group_forward(p.vkq, a.ln1, vkq_, n);
    jobs.add(vkq_ + 2 * d, a.q, true);
    jobs.add(vkq_ + d, a.k, true);
    jobs.add(vkq_, a.v, false);
    rope(jobs, QkvLayout::kTokenMajor, 3 * d, qkv_layout, d, B, seq, H_, dh_, rope_table_, false,
         s);
  }
  attention_layer_forward(a, B, seq);
  linear_forward(a.att, P(p.o), a.h, d, n, d, d, resid_[l]);
}

// Block l's feed-forward half up to the gate, from h: ln2, [b | a] = ln2 [W3 | W1]^T,
// g = silu(a) * b. The output projection (x' = h + g W2^T) is the caller's: recompute skips it.
template <typename T>
void CudaReplica<T>::ffn_gate_forward(int64_t l, int64_t n) {
  const BlockParams& p = blocks_[l];
  BlockActs& a = acts_[l];
  rmsnorm_forward(a.h, P(p.ln2), a.ln2, a.rstd2, n, d_, kRmsEps, stream_.s);
  group_forward(p.w31, a.ln2, a.ba, n);
  swiglu_forward(a.ba + f_, a.ba, 2 * f_, a.g, n, f_, stream_.s);
}

template <typename T>
void CudaReplica<T>::run_forward(int64_t B, int64_t seq, bool training,
                                 const ParamsNeededFn& need) {
  const int64_t n = B * seq, d = d_, f = f_;
  const int32_t* ids = tokens_;
  const int32_t* targets = tokens_ + n;
  cudaStream_t s = stream_.s;
  NvtxRange range("forward");
  // Beside an update, the blocks' GEMMs leave --update-sms SMs to it; it has ended by the head.
  const SmTargetReset reset{*mm_};
  blocks_sms_ = training && update_in_flight_ ? forward_sms_ : 0;
  mm_->set_sm_target(blocks_sms_);
  announce(need, off_emb_);
  embedding_forward(ids, P(off_emb_), resid_[0], n, d, s);
  for (int64_t l = 0; l < L_; ++l) {
    NvtxRange layer_range(fwd_names_[l].c_str());
    const BlockParams& p = blocks_[l];
    BlockActs& a = acts_[l];
    announce(need, p.first);
    attention_half_forward(l, B, seq);
    ffn_gate_forward(l, n);
    linear_forward(a.g, P(p.w2), resid_[l + 1], d, n, f, d, a.h);  // x' = h + g W2^T
  }
  NvtxRange head_range("lm_head+loss");
  announce(need, layout_.head_offset());
  mm_->set_sm_target(0);
  rmsnorm_forward(resid_[L_], P(off_lnf_), lnf_, rstdf_, n, d, kRmsEps, s);
  linear_forward(lnf_, P(off_head_), logits_, Vp_, n, d, V_);
  if (training)
    cross_entropy_forward_backward(logits_, Vp_, targets, losses_, loss_sum_, ce_counter_, n, V_,
                                   1.0f, s);
  else
    cross_entropy_forward(logits_, Vp_, targets, losses_, loss_sum_ + 1, ce_counter_, n, V_, s);
}

template <typename T>
void CudaReplica<T>::forward(const MicroBatch& mb, const ParamsNeededFn& need) {
  use_device();
  check_batch(mb);
  stage_tokens(mb);
  run_forward(mb.batch, mb.seq, true, need);
  stage_buckets(mb);
  forwarded(mb.batch, mb.seq);
}

template <typename T>
void CudaReplica<T>::forwarded(int64_t batch, int64_t seq) {
  host_.B = batch;
  host_.seq = seq;
  host_.train_tokens += batch * seq;
  host_.backward_ready = true;
}

template <typename T>
float CudaReplica<T>::take_loss() {
  TRAINER_CHECK(host_.train_tokens > 0, "take_loss() with no forward since the last call");
  use_device();
  auto* host = static_cast<double*>(loss_host_.p);
  CUDA_CHECK(cudaMemcpyAsync(host, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost, stream_.s));
  CUDA_CHECK(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_.s));
  CUDA_CHECK(cudaStreamSynchronize(stream_.s));
  const double mean = host[0] / static_cast<double>(host_.train_tokens);
  host_.train_tokens = 0;
  return static_cast<float>(mean);
}

template <typename T>
float CudaReplica<T>::evaluate(const MicroBatch& mb) {
  use_device();
  check_batch(mb);
  // The evaluation forward reuses the activation buffers: a later backward has nothing to use.
  host_.backward_ready = false;
  stage_tokens(mb);
  run_forward(mb.batch, mb.seq, false, {});
  auto* host = static_cast<double*>(loss_host_.p);
  CUDA_CHECK(
      cudaMemcpyAsync(host + 1, loss_sum_ + 1, sizeof(double), cudaMemcpyDeviceToHost, stream_.s));
  CUDA_CHECK(cudaMemsetAsync(loss_sum_ + 1, 0, sizeof(double), stream_.s));
  CUDA_CHECK(cudaStreamSynchronize(stream_.s));
  return static_cast<float>(host[1] / static_cast<double>(mb.batch * mb.seq));
}

// Backward in the reverse order of forward; dres_ carries d(loss)/d(residual stream), and each
// RMSNorm backward adds its input gradient into it (the skip connections pass it through as is).
// `ready` is called for tensor i right after the last kernel writing its gradient is enqueued;
// the caller orders its collectives after that point through an event on stream().
template <typename T>
void CudaReplica<T>::backward(float scale, const GradReadyFn& ready) {
  // evaluate() and an earlier backward (which overwrites P, dlogits' consumers and the gate
  // inputs in place) leave nothing to backpropagate.
  TRAINER_CHECK(host_.backward_ready,
                "backward without a training forward since the last evaluate or backward");
  host_.backward_ready = false;
  use_device();
  const int64_t B = host_.B, seq = host_.seq, n = B * seq, d = d_, f = f_;
  cudaStream_t s = stream_.s;
  const QkvLayout qkv_layout = flash_ ? QkvLayout::kTokenMajor : QkvLayout::kHeadMajor;
  const RmsnormScratch rms{rms_partial_, rms_counters_};
  ready_ = &ready;
  pending_.clear();
  auto done = [&](int index) { report(index, 0); };
  NvtxRange range("backward");
  // Collectives of earlier buckets hold --comm-sms SMs while later gradients are computed.
  const SmTargetReset reset{*mm_};
  mm_->set_sm_target(backward_sms_);
  if (lane_.mm) lane_.mm->set_sm_target(lane_.sm_target);
  int64_t qkv_made = 0;  // lane products up to the block above's q/k/v weight gradients
  int64_t ws_made = 0;   // lane products up to the last clearing of attention's dq accumulator
  {
    // logits_ holds softmax - onehot; scale enters as the matmuls' alpha.
    NvtxRange head_range("lm_head+loss");
    report(i_head_, linear_backward_weight(logits_, Vp_, lnf_, G(off_head_), n, d, V_, scale));
    ws_made = clear_attention_workspace(B, seq);
    linear_backward_data(logits_, Vp_, P(off_head_), dln_, n, d, V_, scale, false);
    norm_backward(resid_[L_], P(off_lnf_), rstdf_, dln_, dres_, false, off_lnf_, n, rms);
    done(i_lnf_);
  }
  for (int64_t l = L_ - 1; l >= 0; --l) {
    NvtxRange layer_range(bwd_names_[l].c_str());
    const BlockParams& p = blocks_[l];
    BlockActs& a = acts_[l];
    if (options_.recompute != Recompute::kNone) {
      await_lane(lane_.issued);  // the lane may still read the one set of recomputed activations
      // The same kernels on the same inputs as forward, so the same bits: with forward's SM target
      // (another target may select another GEMM algorithm).
      NvtxRange recompute_range("recompute");
      mm_->set_sm_target(blocks_sms_);
      if (options_.recompute == Recompute::kBlock) attention_half_forward(l, B, seq);
      ffn_gate_forward(l, n);
      mm_->set_sm_target(backward_sms_);
    }
    // Feed-forward half: dg = dx' W2, gate backward into [db | da] (over ba), dln2.
    const int64_t w2_made = linear_backward_weight(dres_, d, a.g, G(p.w2), n, f, d, 1.0f);
    report(p.i_w2, w2_made);
    linear_backward_data(dres_, d, P(p.w2), dg_, n, f, d, 1.0f, false);
    swiglu_backward(a.ba + f, a.ba, 2 * f, dg_, a.ba + f, a.ba, 2 * f, n, f, s);
    group_backward(p.w31, a.ln2, a.ba, dln_, n);
    await_lane(w2_made);  // the norm's backward adds into dres_, which dW2 reads
    norm_backward(a.h, P(p.ln2), a.rstd2, dln_, dres_, true, p.ln2, n, rms);
    done(p.i_ln2);  // dres_ is now dL/dh
    // Attention half: datt = dh Wo (into dln_, free again), attention and RoPE backward, dln1.
    const int64_t o_made = linear_backward_weight(dres_, d, a.att, G(p.o), n, d, d, 1.0f);
    report(p.i_o, o_made);
    T* datt = dln_;
    linear_backward_data(dres_, d, P(p.o), datt, n, d, d, 1.0f, false);
    // Attention's backward writes vkq_, which the block above's dWqkv reads, and adds into the dq
    // accumulator the lane clears.
    await_lane(std::max(qkv_made, ws_made));
    attention_layer_backward(a, datt, B, seq);
    if (l > 0) ws_made = clear_attention_workspace(B, seq);  // beside the dX GEMM below
    if (!flash_) {  // flash: dq, dk, dv are in [dv | dk | dq] already, RoPE's backward done
      RopeJobs<T> jobs;
      jobs.add(dq_, vkq_ + 2 * d, true);
      jobs.add(dk_, vkq_ + d, true);
      jobs.add(dv_, vkq_, false);
      rope(jobs, qkv_layout, d, QkvLayout::kTokenMajor, 3 * d, B, seq, H_, dh_, rope_table_, true,
           s);
    }
    group_backward(p.vkq, a.ln1, vkq_, dln_, n);
    qkv_made = lane_.issued;
    await_lane(o_made);  // the norm's backward adds into dres_, which dWo reads
    norm_backward(resid_[l], P(p.ln1), a.rstd1, dln_, dres_, true, p.ln1, n, rms);
    done(p.i_ln1);  // dres_ is now dL/dx of this block's input
  }
  const int32_t* bucket_ids = tokens_ + 2 * n;
  embedding_backward(dres_, bucket_ids, tokens_ + 3 * n, tokens_ + 4 * n + 1, host_.groups,
                     emb_grad_, d, s);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // bf16 gradients: the rows were summed in fp32 (over every micro-step so far); round them.
    if (grad_dtype_ == DType::kBF16)
      cast(emb_grad_, static_cast<T*>(G(off_emb_)), layout_.tensors()[i_emb_].numel, s);
  }
  host_.accumulate_grads = true;
  await_lane(lane_.issued);  // the next forward overwrites what the lane reads
  done(i_emb_);
  ready_ = nullptr;
}

template <typename T>
void CudaReplica<T>::zero_grads() {
  use_device();
  const ParamTensor& emb = layout_.tensors()[i_emb_];
  CUDA_CHECK(cudaMemsetAsync(emb_grad_, 0, emb.numel * sizeof(float), stream_.s));
  host_.accumulate_grads = false;
}

// The slot's tokens, then its grouping for backward: the groups past the last one are made empty,
// because a recorded backward launches as many as the micro-batch could have (one per token).
template <typename T>
void CudaReplica<T>::stage(const MicroBatch& mb, int slot) {
  use_device();
  TRAINER_CHECK(slot >= 0 && slot < static_cast<int>(staged_.size()),
                "stage: slot {} of {} (ReplicaOptions::graph_slots)", slot, staged_.size());
  check_batch(mb);
  CUDA_CHECK(cudaEventSynchronize(staged_read_.e));
  StagedSlot& st = *staged_[static_cast<size_t>(slot)];
  const int64_t n = mb.batch * mb.seq;
  auto* host = static_cast<int32_t*>(st.pinned.p);
  put_tokens(mb, host);
  int32_t* starts = host + 3 * n;
  std::fill(starts + put_buckets(mb, host) + 1, starts + n + 1, static_cast<int32_t>(n));
  st.batch = mb.batch;
  st.seq = mb.seq;
}

template <typename T>
void CudaReplica<T>::forward_staged(int slot, const ParamsNeededFn& need) {
  use_device();
  TRAINER_CHECK(slot >= 0 && slot < static_cast<int>(staged_.size()) && staged_[slot]->batch > 0,
                "forward_staged: slot {} was not staged", slot);
  const StagedSlot& st = *staged_[static_cast<size_t>(slot)];
  const int64_t n = st.batch * st.seq;
  CUDA_CHECK(cudaMemcpyAsync(tokens_, st.pinned.p, (5 * n + 1) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_.s));
  // A recording reads the slot when it is replayed, and replay() marks that.
  if (!capturing_) CUDA_CHECK(cudaEventRecord(staged_read_.e, stream_.s));
  run_forward(st.batch, st.seq, true, need);
  host_.groups = n;
  forwarded(st.batch, st.seq);
}

template <typename T>
void CudaReplica<T>::begin_capture() {
  use_device();
  TRAINER_CHECK(!capturing_, "begin_capture: already recording");
  if (graph_) {
    CUDA_CHECK(cudaGraphExecDestroy(graph_));
    graph_ = nullptr;
  }
  captured_begin_ = host_;
  // Thread-local: a call that is not allowed while recording fails in this thread only.
  CUDA_CHECK(cudaStreamBeginCapture(stream_.s, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

template <typename T>
void CudaReplica<T>::end_capture() {
  use_device();
  TRAINER_CHECK(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_.s, &g);
  if (e != cudaSuccess)
    runtime_error("recording the step as a CUDA graph failed: {}", cudaGetErrorString(e));
  const cudaError_t i = cudaGraphInstantiate(&graph_, g, 0);
  cudaGraphDestroy(g);
  if (i != cudaSuccess)
    runtime_error("instantiating the step's CUDA graph failed: {}", cudaGetErrorString(i));
  // Nothing recorded has run yet: the host state goes back to where the recording began.
  captured_end_ = host_;
  host_ = captured_begin_;
}

template <typename T>
void CudaReplica<T>::replay() {
  use_device();
  TRAINER_CHECK(graph_ && !capturing_, "replay without a recording");
  // A recorded backward overwrites or adds to the gradients as it did when recorded (what it
  // backpropagates is the recording's own forward, whatever the last forward before it was).
  TRAINER_CHECK(host_.accumulate_grads == captured_begin_.accumulate_grads,
                "replay: the gradient state differs from the recording's");
  CUDA_CHECK(cudaGraphLaunch(graph_, stream_.s));
  CUDA_CHECK(cudaEventRecord(staged_read_.e, stream_.s));
  const int64_t tokens = host_.train_tokens;
  host_ = captured_end_;
  host_.train_tokens = tokens + captured_end_.train_tokens - captured_begin_.train_tokens;
}

template <typename T>
void CudaReplica<T>::set_params(const float* host) {
  TRAINER_CHECK(host != nullptr, "set_params: null source");
  use_device();
  if constexpr (std::is_same_v<T, float>) {
    CUDA_CHECK(cudaMemcpyAsync(params_.view().data, host, flat_ * sizeof(float),
                               cudaMemcpyHostToDevice, stream_.s));
  } else {
    // fp32 chunks through the device staging buffer, rounded to bf16 or fp16 on the device.
    // Stream order keeps a chunk's copy behind the previous chunk's cast.
    float* stage = staging_.as<float>();
    for (int64_t off = 0; off < flat_; off += kStagingFloats) {
      const int64_t count = std::min(kStagingFloats, flat_ - off);
      CUDA_CHECK(cudaMemcpyAsync(stage, host + off, count * sizeof(float), cudaMemcpyHostToDevice,
                                 stream_.s));
      cast(stage, params_.as<T>() + off, count, stream_.s);
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_.s));
}

}  // namespace
}  // namespace cuda

std::unique_ptr<Replica> make_cuda_replica(const ModelConfig& c, const ReplicaOptions& o) {
  switch (o.precision) {
    case Precision::kBf16:
      return std::make_unique<cuda::CudaReplica<__nv_bfloat16>>(c, o);
    case Precision::kFp16:
      return std::make_unique<cuda::CudaReplica<__half>>(c, o);
    case Precision::kFp32:
    case Precision::kTf32:
      break;
  }
  return std::make_unique<cuda::CudaReplica<float>>(c, o);
}

}  // namespace trainer
