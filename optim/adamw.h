// AdamW with the semantics of torch.optim.AdamW (SPEC.md), over one contiguous range of the flat
// parameter buffer: the whole model for plain data parallelism, one rank's slice under ZeRO-1.
// The state lives on the device of the buffers it updates; the CPU path is an OpenMP loop, the
// CUDA path a vectorised kernel, and both do the same fp32 arithmetic per element.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/device_buffer.h"

namespace trainer {

struct AdamWStepArgs;  // optim/cuda/adamw.cuh

// A gradient as the optimizer reads it: the element-wise sum of its terms, added in order in fp32.
// Either one f32 view (the reduced gradient), or 1 to 8 bf16 views, one per rank, when the ranks
// exchange their bf16 gradients whole and sum them here (--grad-transport ce --grad-reduce bf16).
// Every rank adds the same terms in the same order, so they all apply the same update.
using GradTerms = std::vector<BufferView>;

// Hyper-parameters; the defaults are SPEC.md's. Weight decay applies to every parameter.
// `moments`: how m and v are stored, kF32 (SPEC.md) or, opt-in (--adam-state bf16), kBF16: each
// step still computes in fp32 and rounds m and v to bf16 (nearest even) when it stores them.
struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  DType moments = DType::kF32;
};

// Throws UsageError naming the flag (--lr, --beta1, --beta2, --eps, --wd) of a value out of
// range: lr and weight_decay finite and >= 0, eps finite and > 0, betas in [0, 1).
void validate(const AdamWConfig& cfg);

// The AdamW state of one contiguous range of the flat parameter buffer, on the device the buffers
// live on (CPU loop or CUDA kernel): fp32 master weights, m, v. For step t (1, 2, ...), per element
// with gradient g (already multiplied by grad_scale):
//   p = p * (1 - lr*wd)
//   m = beta1*m + (1-beta1)*g
//   v = beta2*v + (1-beta2)*g^2
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The bias corrections are computed in double on the host and passed to the loop as floats; the
// per-element math is fp32, like PyTorch's fp32 path. With bf16 moments (AdamWConfig::moments)
// m and v are read as fp32, updated, and stored rounded.
class AdamW {
 public:
  // Allocates 3 * count fp32 zeros on `device` (the current CUDA device for kCuda). The caller
  // fills master() with the initial parameters. Throws UsageError for a bad cfg.
  AdamW(DeviceKind device, int64_t count, AdamWConfig cfg);

  // fp32 master weights (the parameters the updates accumulate into), count elements.
  BufferView master() const { return master_.view(); }
  // First moment m, count elements of config().moments (torch's "exp_avg").
  BufferView exp_avg() const { return exp_avg_.view(); }
  // Second moment v, likewise (torch's "exp_avg_sq").
  BufferView exp_avg_sq() const { return exp_avg_sq_.view(); }
  // Bytes of optimizer state per element: 4 (fp32 master) + 2 moments.
  static int64_t state_bytes_per_elem(DType moments) { return 4 + 2 * dtype_size(moments); }
  int64_t state_bytes() const { return state_bytes_per_elem(cfg_.moments) * count_; }
  int64_t count() const { return count_; }
  DeviceKind device() const { return device_; }
  const AdamWConfig& config() const { return cfg_; }

  // One step (t >= 1) with learning rate lr: grads (fp32, count elements, multiplied by grad_scale
  // first — that is how clipping is applied), then the updated master is written into params_out
  // (fp32, bf16 or fp16, count elements; round-to-nearest-even for the 16-bit types). stream:
  // cudaStream_t or nullptr. On CUDA the call is asynchronous on `stream`; on the CPU it returns
  // when done. All views must be on this optimizer's device. cfg.lr is not used here: the
  // schedule's lr is passed in.
  void step(BufferView grads, BufferView params_out, double lr, int64_t t, float grad_scale,
            void* stream = nullptr);
  // The same update for elements [part.begin, part.end) of this optimizer's range only; grads and
  // params_out hold part.size() elements. Updating in parts gives the same result as one step()
  // (the math is per element); ZeRO-1 sends each updated part on while the next is computed.
  void step_part(Range part, BufferView grads, BufferView params_out, double lr, int64_t t,
                 float grad_scale, void* stream = nullptr);
  // The same with the gradient given as terms (GradTerms), each part.size() elements.
  void step_part(Range part, const GradTerms& grads, BufferView params_out, double lr, int64_t t,
                 float grad_scale, void* stream = nullptr);
  // The scalars of step t at learning rate lr, as the update uses them (double, rounded once).
  AdamWStepArgs step_args(double lr, int64_t t, float grad_scale) const;
  // step_part() in a step recorded as a CUDA graph: the scalars are read from device memory when
  // the kernels run (cuda::DeviceStepArgs). CUDA only.
  void step_part_recorded(Range part, const GradTerms& grads, BufferView params_out,
                          const AdamWStepArgs* device_args, void* stream);

 private:
  void update(Range part, const GradTerms& grads, BufferView params_out, const AdamWStepArgs& a,
              const AdamWStepArgs* device_args, void* stream);

  DeviceKind device_;
  int64_t count_;
  AdamWConfig cfg_;
  DeviceBuffer master_, exp_avg_, exp_avg_sq_;
};

// Sum of squares of an fp32 buffer, accumulated in double on the CPU and in fp32 blocks then double
// on CUDA; returns it on the host (synchronises the stream on CUDA). The result is deterministic:
// the reduction order depends only on the element count (and, on CUDA, the pointer alignment).
double sum_squares(BufferView x, void* stream = nullptr);
// The sum of squares of the gradient the terms add up to (each element summed first, in order).
double sum_squares(const GradTerms& x, void* stream = nullptr);

// dst = src, where src is fp32 and dst fp32 (a copy), bf16 or fp16 (round-to-nearest-even, NaN ->
// the canonical 0x7FFF of either type); both on the same device, same count. Refreshes working
// parameters from fp32 masters. Asynchronous on `stream` (cudaStream_t or nullptr) on CUDA.
void cast_f32_to_params(BufferView src_f32, BufferView dst, void* stream = nullptr);

}  // namespace trainer
