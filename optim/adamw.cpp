#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/cuda/adamw.cuh"

namespace trainer {

namespace {

#ifndef TRAINER_WITH_CUDA
[[noreturn]] void no_cuda(const char* what) {
  runtime_error("{} on a CUDA buffer in a build without the CUDA backend", what);
}
#endif

// The per-step scalars of torch.optim.AdamW, in double, rounded to float once.
AdamWStepArgs make_step_args(const AdamWConfig& cfg, double lr, int64_t t, float grad_scale) {
  const double bias_correction1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(t));
  AdamWStepArgs a;
  a.beta1 = static_cast<float>(cfg.beta1);
  a.beta2 = static_cast<float>(cfg.beta2);
  a.one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
  a.eps = static_cast<float>(cfg.eps);
  a.decay = static_cast<float>(1.0 - lr * cfg.weight_decay);
  a.step_size = static_cast<float>(lr / bias_correction1);
  a.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  a.grad_scale = grad_scale;
  return a;
}

void check_view(const BufferView& v, int64_t count, DeviceKind device, const char* what) {
  TRAINER_CHECK(v.count == count, "{} has {} elements, the optimizer {}", what, v.count, count);
  TRAINER_CHECK(v.device == device, "{} is on another device than the optimizer state", what);
  TRAINER_CHECK(v.count == 0 || v.data != nullptr, "{} is a null view of {} elements", what,
                v.count);
}

// The terms of a gradient: one f32 view, or 1..kMaxGradTerms bf16 views, all alike.
void check_terms(const GradTerms& terms, int64_t count, DeviceKind device) {
  TRAINER_CHECK(!terms.empty(), "a gradient of no terms");
  const DType dt = terms[0].dtype;
  TRAINER_CHECK((dt == DType::kF32 && terms.size() == 1) ||
                    (dt == DType::kBF16 && terms.size() <= static_cast<size_t>(kMaxGradTerms)),
                "a gradient of {} {} terms (one f32, or 1 to {} bf16)", terms.size(),
                dtype_name(dt), kMaxGradTerms);
  for (const BufferView& t : terms) {
    check_view(t, count, device, "gradient view");
    TRAINER_CHECK(t.dtype == dt, "gradient terms of mixed types");
  }
}

GradTermsArg bf16_terms(const GradTerms& terms) {
  GradTermsArg a;
  for (const BufferView& t : terms) a.t[a.k++] = t.as<const uint16_t>();
  return a;
}

// Calls fn(g) with g(i) = element i of the gradient: the f32 term, or the bf16 terms added as the
// CUDA kernels add them. One call per loop, so the loops carry no per-element dispatch.
template <typename Fn>
auto with_gradient(const GradTerms& terms, Fn fn) {
  if (terms[0].dtype == DType::kF32) {
    const float* g = terms[0].as<const float>();
    return fn([g](int64_t i) { return g[i]; });
  }
  const GradTermsArg a = bf16_terms(terms);
  return fn([a](int64_t i) {
    float s = 0.0f;
    for (int j = 0; j < a.k; ++j) s += bf16_bits_to_f32(a.t[j][i]);
    return s;
  });
}

// The CPU update loop: step(i) updates element i and returns its new master value, which is
// stored into params_out (fp32, or rounded to bf16 / fp16 as the CUDA kernels round it).
template <typename Step>
void store_params(BufferView params_out, int64_t n, Step step) {
  auto loop = [&](auto store) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) store(i, step(i));
  };
  if (params_out.dtype == DType::kF32) {
    float* out = params_out.as<float>();
    loop([out](int64_t i, float x) { out[i] = x; });
  } else {
    uint16_t* out = params_out.as<uint16_t>();
    if (params_out.dtype == DType::kBF16)
      loop([out](int64_t i, float x) { out[i] = f32_to_bf16_bits(x); });
    else
      loop([out](int64_t i, float x) { out[i] = f32_to_f16_bits(x); });
  }
}

}  // namespace

void validate(const AdamWConfig& cfg) {
  if (!std::isfinite(cfg.lr) || cfg.lr < 0)
    usage_error("--lr must be a finite number >= 0, got {}", cfg.lr);
  if (!(cfg.beta1 >= 0 && cfg.beta1 < 1))
    usage_error("--beta1 must lie in [0, 1), got {}", cfg.beta1);
  if (!(cfg.beta2 >= 0 && cfg.beta2 < 1))
    usage_error("--beta2 must lie in [0, 1), got {}", cfg.beta2);
  // eps = 0 would turn 0 / 0 into NaN for every parameter whose gradient has been zero so far.
  if (!std::isfinite(cfg.eps) || cfg.eps <= 0)
    usage_error("--eps must be a finite number > 0, got {}", cfg.eps);
  if (!std::isfinite(cfg.weight_decay) || cfg.weight_decay < 0)
    usage_error("--wd must be a finite number >= 0, got {}", cfg.weight_decay);
}

AdamW::AdamW(DeviceKind device, int64_t count, AdamWConfig cfg)
    : device_(device), count_(count), cfg_(cfg) {
  validate(cfg_);
  TRAINER_CHECK(count >= 0, "AdamW over {} elements", count);
  master_ = DeviceBuffer(device, DType::kF32, count);
  TRAINER_CHECK(cfg.moments == DType::kF32 || cfg.moments == DType::kBF16,
                "AdamW moments in {} (f32 or bf16)", dtype_name(cfg.moments));
  exp_avg_ = DeviceBuffer(device, cfg.moments, count);
  exp_avg_sq_ = DeviceBuffer(device, cfg.moments, count);
}

void AdamW::step(BufferView grads, BufferView params_out, double lr, int64_t t, float grad_scale,
                 void* stream) {
  step_part({0, count_}, grads, params_out, lr, t, grad_scale, stream);
}

void AdamW::step_part(Range part, BufferView grads, BufferView params_out, double lr, int64_t t,
                      float grad_scale, void* stream) {
  step_part(part, GradTerms{grads}, params_out, lr, t, grad_scale, stream);
}

AdamWStepArgs AdamW::step_args(double lr, int64_t t, float grad_scale) const {
  TRAINER_CHECK(t >= 1, "AdamW step number {} (steps count from 1)", t);
  TRAINER_CHECK(std::isfinite(lr) && lr >= 0, "AdamW learning rate {}", lr);
  return make_step_args(cfg_, lr, t, grad_scale);
}

void AdamW::step_part(Range part, const GradTerms& grads, BufferView params_out, double lr,
                      int64_t t, float grad_scale, void* stream) {
  update(part, grads, params_out, step_args(lr, t, grad_scale), nullptr, stream);
}

void AdamW::step_part_recorded(Range part, const GradTerms& grads, BufferView params_out,
                               const AdamWStepArgs* device_args, void* stream) {
  TRAINER_CHECK(device_ == DeviceKind::kCuda && device_args,
                "AdamW: scalars in device memory need the CUDA backend");
  update(part, grads, params_out, AdamWStepArgs{}, device_args, stream);
}

// AdamW update over the part; the element math is adamw_update() in optim/cuda/adamw.cuh.
void AdamW::update(Range part, const GradTerms& grads, BufferView params_out,
                   const AdamWStepArgs& a, const AdamWStepArgs* device_args, void* stream) {
  TRAINER_CHECK(part.begin >= 0 && part.begin <= part.end && part.end <= count_,
                "AdamW part [{}, {}) of {} elements", part.begin, part.end, count_);
  check_terms(grads, part.size(), device_);
  check_view(params_out, part.size(), device_, "parameter view");
  TRAINER_CHECK(params_out.dtype == DType::kF32 || params_out.dtype == DType::kBF16 ||
                    params_out.dtype == DType::kF16,
                "AdamW writes f32, bf16 or f16 parameters, not {}", dtype_name(params_out.dtype));
  if (part.empty()) return;
  float* p = master_.as<float>() + part.begin;
  const BufferView mv = exp_avg_.view().slice(part.begin, part.size());
  const BufferView vv = exp_avg_sq_.view().slice(part.begin, part.size());
  const int64_t n = part.size();
  const DType out_type = params_out.dtype;

  if (device_ == DeviceKind::kCuda) {
#ifdef TRAINER_WITH_CUDA
    const cuda::Moments moments{mv.data, vv.data, cfg_.moments};
    if (grads[0].dtype == DType::kF32)
      cuda::adamw_step(p, moments, grads[0].as<const float>(), params_out.data, out_type, n, a,
                       stream, device_args);
    else
      cuda::adamw_step(p, moments, bf16_terms(grads), params_out.data, out_type, n, a, stream,
                       device_args);
    return;
#else
    (void)stream;
    (void)device_args;
    no_cuda("AdamW::step");
#endif
  }
  if (cfg_.moments == DType::kBF16)
    return with_gradient(grads, [&](auto g) {
      uint16_t* m = mv.as<uint16_t>();
      uint16_t* v = vv.as<uint16_t>();
      store_params(params_out, n, [&](int64_t i) {
        float mi = bf16_bits_to_f32(m[i]), vi = bf16_bits_to_f32(v[i]);
        adamw_update(p[i], mi, vi, g(i), a);
        m[i] = f32_to_bf16_bits(mi);
        v[i] = f32_to_bf16_bits(vi);
        return p[i];
      });
    });
  with_gradient(grads, [&](auto g) {
    float* m = mv.as<float>();
    float* v = vv.as<float>();
    store_params(params_out, n, [&](int64_t i) {
      adamw_update(p[i], m[i], v[i], g(i), a);
      return p[i];
    });
  });
}

double sum_squares(BufferView x, void* stream) {
  TRAINER_CHECK(x.dtype == DType::kF32, "sum_squares of a {} buffer (needs f32)",
                dtype_name(x.dtype));
  return sum_squares(GradTerms{x}, stream);
}

double sum_squares(const GradTerms& x, void* stream) {
  TRAINER_CHECK(!x.empty(), "a gradient of no terms");
  check_terms(x, x[0].count, x[0].device);
  const int64_t count = x[0].count;
  if (count == 0) return 0.0;
  if (x[0].device == DeviceKind::kCuda) {
#ifdef TRAINER_WITH_CUDA
    return x[0].dtype == DType::kF32 ? cuda::sum_squares(x[0].as<const float>(), count, stream)
                                     : cuda::sum_squares(bf16_terms(x), count, stream);
#else
    (void)stream;
    no_cuda("sum_squares");
#endif
  }
  // Fixed chunks summed in double, then the chunk sums in order: the result does not depend on
  // the number of threads (an OpenMP reduction clause would combine in arrival order).
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  with_gradient(x, [&](auto g) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t end = std::min(count, (c + 1) * kChunk);
      double s = 0.0;
      for (int64_t i = c * kChunk; i < end; ++i) {
        const double e = g(i);
        s += e * e;
      }
      partial[static_cast<size_t>(c)] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void cast_f32_to_params(BufferView src_f32, BufferView dst, void* stream) {
  TRAINER_CHECK(src_f32.dtype == DType::kF32, "cast source is {}, needs f32",
                dtype_name(src_f32.dtype));
  TRAINER_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16 || dst.dtype == DType::kF16,
                "cast target is {}, needs f32, bf16 or f16", dtype_name(dst.dtype));
  TRAINER_CHECK(src_f32.count == dst.count, "cast of {} elements into {}", src_f32.count,
                dst.count);
  TRAINER_CHECK(src_f32.device == dst.device, "cast between different devices");
  const int64_t n = src_f32.count;
  // Nothing to do for an empty range or an fp32 copy onto itself (memcpy must not overlap).
  if (n == 0 || (dst.dtype == DType::kF32 && dst.data == src_f32.data)) return;
  if (dst.device == DeviceKind::kCuda) {
#ifdef TRAINER_WITH_CUDA
    if (dst.dtype == DType::kF32)
      cuda::copy_async(dst.data, src_f32.data, dst.bytes(), stream);
    else if (dst.dtype == DType::kBF16)
      cuda::cast_f32_to_bf16(src_f32.as<const float>(), dst.as<uint16_t>(), n, stream);
    else
      cuda::cast_f32_to_f16(src_f32.as<const float>(), dst.as<uint16_t>(), n, stream);
    return;
#else
    (void)stream;
    no_cuda("cast_f32_to_params");
#endif
  }
  if (dst.dtype == DType::kF32) {
    copy(dst, src_f32);
    return;
  }
  const float* src = src_f32.as<const float>();
  uint16_t* out = dst.as<uint16_t>();
  if (dst.dtype == DType::kBF16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16_bits(src[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16_bits(src[i]);
  }
}

}  // namespace trainer
