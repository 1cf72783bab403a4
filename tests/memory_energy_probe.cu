// What does a byte of memory-bound work cost in joules, kernel by kernel? `--floors-at-cap`
// prices the step's elementwise and optimizer bytes at a device-to-device cudaMemcpy's joules per
// GB; this developer's probe, outside the trainer, sets that copy beside SM kernels that move the
// same kind of bytes (results: docs/results/log.md, 2026-11-27 01:41):
//
//   memory_energy_probe [MS]
//
// Each case runs back to back for 1 s, then for MS (1200) milliseconds more, after which NVML's
// power reading (its average over the last second: this case's alone) times the time per call is
// the energy per call. The cases:
//   memcpy         cudaMemcpyAsync device to device, 256 MiB
//   copy all SMs   a float4 grid-stride copy kernel, 8 blocks of 256 threads per SM
//   copy N SMs     the same on N SMs only: one block of 1024 threads per SM (its shared memory
//                  keeps a second block off), 4 loads in flight per thread
//   adamw fp32     the trainer's AdamW kernel (optim/cuda/adamw.cuh) over 64 M elements: reads
//                  p, m, v, g (fp32), writes p, m, v and the bf16 copy, 30 bytes per element
//   adamw bf16     the same with bf16 moments (--adam-state bf16), 22 bytes per element
//   sum squares    the gradient norm's pass (4 bytes per element, 256 M elements)
//   swiglu fwd/bwd the trainer's gate kernels at small 16 x 1024's shape (16384 x 3072)
// Operands are pseudo-random (the power a kernel draws depends on its data's bits).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/mix64.h"
#include "model/cuda/swiglu.cuh"
#include "optim/cuda/adamw.cuh"
#include "runtime/gpu_energy.h"
#include "runtime/gpu_power.h"
#include "tests/probe_check.h"

namespace {

// Uniform in [lo, hi), as T (float or bf16).
template <class T>
__global__ void fill(T* x, int64_t n, uint32_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = static_cast<T>(lo + (hi - lo) * (trainer::mix64(seed * trainer::kGolden + i) >> 40) *
                                   0x1p-24f);
}

// Grid-stride float4 copy; with kUnroll loads issued before the first store.
template <int kUnroll>
__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
    float4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = r[u];
  }
  for (; i < n4; i += stride) dst[i] = src[i];
}

template <class T>
T* alloc(int64_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  const double window_ms = argc > 1 ? std::atof(argv[1]) : 1200.0;
  if (!(window_ms >= 100)) {
    std::printf("usage: memory_energy_probe [MS >= 100]\n");
    return 2;
  }
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  char bus[32] = {};
  CK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  std::string why;
  std::unique_ptr<trainer::PowerSampler> power = trainer::make_power_sampler(bus, 20, &why);
  if (!power) {
    std::printf("no NVML: %s\n", why.c_str());
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, limit %.0f W, window %.0f ms\n", prop.name, sms, power->limit_watts(),
              window_ms);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Buffers: 256 MiB copy pair; AdamW over 64 M elements; 256 M fp32 for the norm; SwiGLU's ba
  // (16384 x 6144), its gate and gradient (16384 x 3072), bf16.
  const int64_t copy_n = int64_t{64} << 20;  // floats: 256 MiB
  float* csrc = alloc<float>(copy_n);
  float* cdst = alloc<float>(copy_n);
  const int64_t n = int64_t{64} << 20;
  float* p = alloc<float>(n);
  float* m = alloc<float>(n);
  float* v = alloc<float>(n);
  float* g = alloc<float>(n);
  __nv_bfloat16* out = alloc<__nv_bfloat16>(n);
  __nv_bfloat16* m16 = alloc<__nv_bfloat16>(n);
  __nv_bfloat16* v16 = alloc<__nv_bfloat16>(n);
  const int64_t norm_n = int64_t{256} << 20;
  float* big = alloc<float>(norm_n);
  const int64_t rows = 16384, cols = 3072;
  __nv_bfloat16* ba = alloc<__nv_bfloat16>(rows * 2 * cols);
  __nv_bfloat16* gate = alloc<__nv_bfloat16>(rows * cols);
  __nv_bfloat16* dgate = alloc<__nv_bfloat16>(rows * cols);
  const unsigned fill_grid = static_cast<unsigned>(sms) * 8;
  fill<<<fill_grid, 256, 0, s>>>(csrc, copy_n, 1, -1.f, 1.f);
  fill<<<fill_grid, 256, 0, s>>>(p, n, 2, -0.05f, 0.05f);
  fill<<<fill_grid, 256, 0, s>>>(m, n, 3, -1e-3f, 1e-3f);
  fill<<<fill_grid, 256, 0, s>>>(v, n, 4, 1e-8f, 1e-6f);
  fill<<<fill_grid, 256, 0, s>>>(g, n, 5, -1e-3f, 1e-3f);
  fill<<<fill_grid, 256, 0, s>>>(m16, n, 6, -1e-3f, 1e-3f);
  fill<<<fill_grid, 256, 0, s>>>(v16, n, 7, 1e-8f, 1e-6f);
  fill<<<fill_grid, 256, 0, s>>>(big, norm_n, 8, -1e-3f, 1e-3f);
  fill<<<fill_grid, 256, 0, s>>>(ba, rows * 2 * cols, 9, -3.f, 3.f);
  fill<<<fill_grid, 256, 0, s>>>(dgate, rows * cols, 10, -1e-2f, 1e-2f);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));

  // An update that leaves the state where it was in distribution: the probe repeats it.
  trainer::AdamWStepArgs args{};
  args.beta1 = 0.9f;
  args.beta2 = 0.95f;
  args.one_minus_beta1 = 0.1f;
  args.one_minus_beta2 = 0.05f;
  args.eps = 1e-8f;
  args.decay = 1.0f - 1e-4f * 0.1f;
  args.step_size = 1e-6f;
  args.bias_correction2_sqrt = 1.0f;
  args.grad_scale = 1.0f;

  constexpr int kOneBlockSmem = 160 * 1024;  // one 1024-thread block per SM
  CK(cudaFuncSetAttribute(copy_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kOneBlockSmem));

  struct Case {
    std::string name;
    double gb;  // read + written per call
    std::function<void()> run;
  };
  const double copy_gb = 2.0 * copy_n * 4 * 1e-9;
  std::vector<Case> cases;
  cases.push_back({"memcpy d2d 256 MiB", copy_gb, [&] {
                     CK(cudaMemcpyAsync(cdst, csrc, copy_n * 4, cudaMemcpyDeviceToDevice, s));
                   }});
  cases.push_back({"copy kernel, all SMs", copy_gb, [&] {
                     copy_kernel<1><<<fill_grid, 256, 0, s>>>(reinterpret_cast<const float4*>(csrc),
                                                              reinterpret_cast<float4*>(cdst),
                                                              copy_n / 4);
                   }});
  for (int k : {24, 48, 66, sms}) {
    cases.push_back({"copy kernel, " + std::to_string(k) + " SMs", copy_gb, [&, k] {
                       copy_kernel<4><<<k, 1024, kOneBlockSmem, s>>>(
                           reinterpret_cast<const float4*>(csrc), reinterpret_cast<float4*>(cdst),
                           copy_n / 4);
                     }});
  }
  cases.push_back({"adamw fp32 moments", 30.0 * n * 1e-9, [&] {
                     trainer::cuda::adamw_step(p, {m, v, trainer::DType::kF32}, g, out,
                                               trainer::DType::kBF16, n, args, s);
                   }});
  cases.push_back({"adamw bf16 moments", 22.0 * n * 1e-9, [&] {
                     trainer::cuda::adamw_step(p, {m16, v16, trainer::DType::kBF16}, g, out,
                                               trainer::DType::kBF16, n, args, s);
                   }});
  cases.push_back({"sum squares (sync)", 4.0 * norm_n * 1e-9,
                   [&] { (void)trainer::cuda::sum_squares(big, norm_n, s); }});
  cases.push_back({"swiglu forward 16384x3072", 3.0 * rows * cols * 2 * 1e-9, [&] {
                     trainer::cuda::swiglu_forward(ba + cols, ba, 2 * cols, gate, rows, cols, s);
                   }});
  // In place, as the trainer runs it (da, db over a, b); the values drift, the bytes do not.
  cases.push_back({"swiglu backward 16384x3072", 5.0 * rows * cols * 2 * 1e-9, [&] {
                     trainer::cuda::swiglu_backward(ba + cols, ba, 2 * cols, dgate, ba + cols, ba,
                                                    2 * cols, rows, cols, s);
                   }});

  std::printf("%-28s %9s %9s %8s %9s %8s %9s\n", "case", "ms/call", "GB/s", "W", "SM MHz", "capped",
              "J/GB");
  for (const Case& c : cases) {
    trainer::energy_per_call(s, *power, 1000.0, c.run);  // settles NVML's one-second average
    power->begin();
    const trainer::CallEnergy e = trainer::energy_per_call(s, *power, window_ms, c.run);
    const trainer::PowerSummary sum = power->end();
    std::printf("%-28s %9.4f %9.1f %8.1f %9.0f %7.0f%% %9.4f\n", c.name.c_str(), e.ms,
                c.gb / (e.ms * 1e-3), e.watts, sum.sm_mhz_median, 100 * sum.capped_fraction,
                e.joules() / c.gb);
  }
  return 0;
}
