// What the CPU loop (optim/adamw.cpp, compiled by the host compiler) and the CUDA kernels
// (optim/cuda/adamw.cu) share: the per-element AdamW update and the bf16 / fp16 rounding, written
// once so both backends do the same fp32 operations in the same order, and the CUDA launchers.
//
// Every multiply-add that could be contracted is written as an explicit fmaf, and nothing else is
// contractible, so host (-mfma) and device (nvcc --fmad) code round identically.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/buffer.h"
#include "core/f16.h"

namespace trainer {

// Per-step scalars, computed in double on the host (AdamW::step) and rounded to float once.
struct AdamWStepArgs {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
  float decay;                  // 1 - lr * weight_decay
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float grad_scale;             // clipping factor applied to every gradient
};

// The clipping factor of clip_scale() (optim/schedule.h) for a valid clip, in the same double
// operations on the host and on the device (where a recorded step computes it).
TRAINER_HD inline float clip_factor(double global_norm, double clip) {
  if (clip == 0) return 1.0f;
  const double c = clip / (global_norm + 1e-6);
  // `c < 1 ? c : 1` would turn a NaN norm into 1; keep the NaN like torch's clamp(max=1).
  if (isnan(c)) return static_cast<float>(c);
  return static_cast<float>(c < 1.0 ? c : 1.0);
}

// One element of torch.optim.AdamW (fp32 path):
//   g = g_raw * grad_scale
//   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
//   p = p*decay - step_size * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
TRAINER_HD inline void adamw_update(float& p, float& m, float& v, float g_raw,
                                    const AdamWStepArgs& a) {
  const float g = g_raw * a.grad_scale;
  m = fmaf(a.beta1, m, a.one_minus_beta1 * g);
  v = fmaf(a.beta2, v, (a.one_minus_beta2 * g) * g);
  const float denom = sqrtf(v) / a.bias_correction2_sqrt + a.eps;
  p = fmaf(-a.step_size, m / denom, p * a.decay);
}

// A gradient given as the sum of k bf16 buffers (one per rank), added in index order in fp32,
// starting from 0.0f, on the host and on the device alike.
constexpr int kMaxGradTerms = 8;
struct GradTermsArg {
  const uint16_t* t[kMaxGradTerms] = {};
  int k = 0;
};

namespace cuda {

// Launchers (defined in adamw.cu). Pointers are device pointers; stream is a cudaStream_t or
// nullptr; all calls are asynchronous except sum_squares, which synchronises `stream`.
//
// master, grads: n fp32; out: n elements of out_type (kF32, kBF16 or kF16; the 16-bit
// types rounded to nearest even). out may alias master (fp32). float4 loads are used when every
// pointer allows them, scalar loads otherwise. The step's scalars are `args`, or when
// `device_args` is given the AdamWStepArgs it points to in device memory, read when the kernel
// runs (a recorded step: DeviceStepArgs).
// The moments m and v of the range, n elements each, of `type`: kF32, or kBF16 (read as fp32,
// stored rounded to nearest even).
struct Moments {
  void* m;
  void* v;
  DType type;
};
void adamw_step(float* master, const Moments& mv, const float* grads, void* out, DType out_type,
                int64_t n, const AdamWStepArgs& args, void* stream,
                const AdamWStepArgs* device_args = nullptr);
// The same with the gradient = the sum of grads' bf16 terms, each n elements.
void adamw_step(float* master, const Moments& mv, const GradTermsArg& grads, void* out,
                DType out_type, int64_t n, const AdamWStepArgs& args, void* stream,
                const AdamWStepArgs* device_args = nullptr);

// AdamW's scalars of a step recorded as a CUDA graph (--cuda-graph), in device memory: the host
// sets them before each replay (the schedule's learning rate and the step number), the recording
// uploads them from pinned memory, and OverlappedSumSquares::clip_into() writes the clipping
// factor from the gradient norm, before the update kernels read them.
class DeviceStepArgs {
 public:
  DeviceStepArgs();
  ~DeviceStepArgs();
  DeviceStepArgs(const DeviceStepArgs&) = delete;
  DeviceStepArgs& operator=(const DeviceStepArgs&) = delete;
  // Host side; the last replay must have finished reading them.
  void set(const AdamWStepArgs& a);
  // Enqueues the upload of what set() wrote, as of when the upload runs.
  void upload(void* stream);
  AdamWStepArgs* device() const { return device_; }

 private:
  AdamWStepArgs* host_ = nullptr;  // pinned
  AdamWStepArgs* device_ = nullptr;
};
// sum of x[i]^2: each thread accumulates its grid-stride elements in fp32, blocks reduce in double
// in a fixed order, the block partials are summed on the host in index order (no atomics).
double sum_squares(const float* x, int64_t n, void* stream);
// The same over the element-wise sum of x's bf16 terms.
double sum_squares(const GradTermsArg& x, int64_t n, void* stream);
// dst[i] = bf16(src[i]) with round-to-nearest-even.
void cast_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, void* stream);
// dst[i] = fp16(src[i]) with round-to-nearest-even (f32_to_f16_bits' results).
void cast_f32_to_f16(const float* src, uint16_t* dst, int64_t n, void* stream);
// Device-to-device copy of `bytes` bytes on `stream`.
void copy_async(void* dst, const void* src, size_t bytes, void* stream);

// The gradient norm's sum of squares, computed while backward runs (one GPU, fp32 gradients).
// Backward reports tensors in flat-buffer order; once the ready tensors since the last launch
// cover `chunk` elements (or all but the last tensor), their partial sums are launched on a side
// stream after an event on backward's stream, so the pass over the gradient overlaps the remaining
// backward instead of following it. The last tensor, which the step waits for, is summed alone,
// on every SM, on backward's stream. total() waits for the side stream and adds the partials in a
// fixed order (32 strided sums, then those; clip_into's kernel adds them the same way): the chunks
// and their block counts depend only on the layout, so the result is the same on every run.
class OverlappedSumSquares {
 public:
  // grads: n fp32 device elements; tensor_ends: the end offset of each tensor, ascending, the
  // last equal to n; stream: backward's stream.
  OverlappedSumSquares(const float* grads, int64_t n, std::vector<int64_t> tensor_ends,
                       void* stream);
  ~OverlappedSumSquares();
  OverlappedSumSquares(const OverlappedSumSquares&) = delete;
  OverlappedSumSquares& operator=(const OverlappedSumSquares&) = delete;

  // A backward whose gradients are final starts: the next on_ready calls count.
  void begin();
  // Backward has enqueued the last write of tensor `index`'s gradient.
  void on_ready(int index);
  // True between begin() and total().
  bool active() const;
  // Testing hook (--debug-norm-delay-us): the side stream idles `us` microseconds before each of
  // its sums, so that a test sees any reader of the sums that does not wait for them.
  void set_debug_delay(int64_t us);
  // join() makes backward's stream wait for the partial sums of the pass (clip_into reads them;
  // in a CUDA graph's recording a fork must join again besides);
  // after each replay, replayed() makes total() expect that pass's sums (the replay ran them
  // without begin() and on_ready()), or none.
  void join();
  void replayed();
  // After join() (which it needs: it reads the side stream's sums too): a kernel on backward's
  // stream adds the partial sums in total()'s order and writes into args->grad_scale the factor the
  // host would compute, clip_factor(sqrt(sum) / loss_scale, clip) / loss_scale, rounded to float.
  // With `base` it first writes *base (the step's other scalars, passed by value) into *args, so
  // that no host memory is read when the kernel runs.
  void clip_into(AdamWStepArgs* args, double clip, double loss_scale,
                 const AdamWStepArgs* base = nullptr);
  // Waits for the partial sums (every tensor must have been reported) and returns their sum. The
  // side stream first waits for the work queued on backward's stream so far, which covers a
  // replayed recording of them.
  double total();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One GPU: AdamW beside the next step's forward. The update's kernels go on a stream of their own
// (the lowest priority), part by part in the order forward reads the parameters, with an event
// after each part; forward makes the compute stream wait for a part's event just before it first
// reads that part (Run::await_params). Forward thus reads exactly the updated parameters, so the
// numbers are those of the serial update, bit for bit, while the update's memory traffic runs
// under forward's GEMMs. The host never waits for the lane inside a step.
class UpdateLane {
 public:
  // compute: the replica's stream; parts: the most parts one update has.
  UpdateLane(void* compute, int parts);
  ~UpdateLane();
  UpdateLane(const UpdateLane&) = delete;
  UpdateLane& operator=(const UpdateLane&) = delete;

  // Begins an update: the lane's next work follows everything queued on the compute stream so
  // far (backward's last writes of the gradients).
  void begin();
  // The stream the update's kernels go on.
  void* stream() const;
  // Testing hook (--debug-update-delay-us): every update's lane idles `us` microseconds at its
  // start, so that a test sees what would race with a late update.
  void set_debug_delay(int64_t us);
  // Ends the part just enqueued; returns its number for wait().
  int mark();
  // Ends the update (after its last part).
  void end();
  // The compute stream waits (on the GPU) for part `k` of the last update.
  void wait(int k);
  // The updates that have finished since the last call, each as (start, end) in milliseconds
  // after `origin` (a cudaEvent_t recorded earlier, the step timer's), from CUDA events around
  // each update; with `all`, first waits for the last update.
  std::vector<std::pair<double, double>> take_spans(bool all, void* origin);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace trainer
