// RMSNorm, forward and backward (host-callable launchers; kernels in rmsnorm.cu).
// Statistics are computed in fp32 whatever the activation type.
//
//   forward:  r_i = 1 / sqrt(mean_c x[i,c]^2 + eps),  y[i,c] = x[i,c] * r_i * w[c]
//             rstd[i] = r_i (fp32, saved for backward)
//   backward: dx[i,c] (+)= r_i * (w[c] dy[i,c] - x[i,c] * r_i^2 * mean_c'(x[i,c'] w[c'] dy[i,c']))
//             dw[c]    += sum_i dy[i,c] * x[i,c] * r_i                      (fp32, accumulates)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::cuda {

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t n, int64_t d,
                     float eps, cudaStream_t stream);
void rmsnorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, float* rstd,
                     int64_t n, int64_t d, float eps, cudaStream_t stream);
void rmsnorm_forward(const __half* x, const __half* w, __half* y, float* rstd, int64_t n, int64_t d,
                     float eps, cudaStream_t stream);

// Scratch for the deterministic dw reduction: blocks of rows write fp32 column sums, added up in
// block order by a second kernel (the fused dx + dw pass) or by the last row group to finish a
// column tile (the separate dw kernel, which counts arrivals). `partial` holds
// rmsnorm_backward_partial_floats(d) floats; `counters` holds rmsnorm_backward_counters(d)
// zero-initialised unsigned ints, which every launch leaves at zero again.
int64_t rmsnorm_backward_partial_floats(int64_t d);
int64_t rmsnorm_backward_counters(int64_t d);

struct RmsnormScratch {
  float* partial = nullptr;
  unsigned* counters = nullptr;
};

// dx (dw) is overwritten when accumulate_dx (accumulate_dw) is false, else added to. dx must not
// alias x or dy. dw is fp32, or bf16 for bf16 gradients (--grad-reduce bf16 with copy engines);
// the column sums are fp32 either way and rounded once.
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                      bool accumulate_dx, float* dw, bool accumulate_dw, int64_t n, int64_t d,
                      RmsnormScratch scratch, cudaStream_t stream);
void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, bool accumulate_dx, float* dw,
                      bool accumulate_dw, int64_t n, int64_t d, RmsnormScratch scratch,
                      cudaStream_t stream);
void rmsnorm_backward(const __half* x, const __half* w, const float* rstd, const __half* dy,
                      __half* dx, bool accumulate_dx, float* dw, bool accumulate_dw, int64_t n,
                      int64_t d, RmsnormScratch scratch, cudaStream_t stream);
void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, bool accumulate_dx,
                      __nv_bfloat16* dw, bool accumulate_dw, int64_t n, int64_t d,
                      RmsnormScratch scratch, cudaStream_t stream);

}  // namespace trainer::cuda
