// CUDA kernels of the optimizer: the AdamW update (memory bound: 16 bytes read and 12-14 written
// per element with fp32 moments, 12 and 8-10 with bf16 ones, so vector loads, one group per
// thread), the deterministic sum of squares behind the gradient norm and, for a recorded step, the
// clipping factor from its partial sums, and the fp32 -> bf16 / fp16 parameter casts. The
// gradient is one fp32 buffer or the sum of bf16 copies, one per rank (--grad-transport ce
// --grad-reduce bf16), added as it is read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda_check.h"
#include "core/debug_spin.h"
#include "core/error.h"
#include "optim/cuda/adamw.cuh"

namespace trainer::cuda {

namespace {

constexpr int kThreads = 256;
// sum_squares uses at most this many blocks, a constant, so the reduction order (and therefore
// the result) depends only on the element count, not on the GPU model or timing.
constexpr int kMaxReduceBlocks = 1024;
// The overlapped norm's partials are added as kSumLanes strided sums (partial i into sum i mod
// kSumLanes, in index order), then those in order: on the host (total()) and on the device
// (clip_into) alike.
constexpr int kSumLanes = 32;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Enough blocks of kThreads to cover `work` items, at most a full wave (8 blocks per SM).
int grid_for(int64_t work) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sms > 0 ? sms : 1) * 8;
  return static_cast<int>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
}

// ---- stores of one or four updated parameters into fp32, bf16 or fp16 ----
__device__ inline void store1(float* out, int64_t i, float p) { out[i] = p; }
__device__ inline void store1(__nv_bfloat16* out, int64_t i, float p) {
  out[i] = __float2bfloat16_rn(p);
}
__device__ inline void store1(__half* out, int64_t i, float p) { out[i] = __float2half_rn(p); }
__device__ inline void store4(float* out, int64_t i4, float4 p) {
  reinterpret_cast<float4*>(out)[i4] = p;
}
// Two 16-bit values as one 4-byte word, a at the lower address (the _rn conversions round to
// nearest even, as the CPU's f32_to_bf16_bits / f32_to_f16_bits do).
__device__ inline __nv_bfloat162 pack2(const __nv_bfloat16*, float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
__device__ inline __half2 pack2(const __half*, float a, float b) { return __floats2half2_rn(a, b); }
// Four bf16 or fp16 as one 8-byte store.
template <typename H>
__device__ inline void store4(H* out, int64_t i4, float4 p) {
  const auto lo = pack2(out, p.x, p.y);
  const auto hi = pack2(out, p.z, p.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(out)[i4] = packed;
}

// ---- moments: fp32, or bf16 read as fp32 and stored rounded ----
__device__ inline float4 load4(const float* p, int64_t i4) {
  return reinterpret_cast<const float4*>(p)[i4];
}
__device__ inline float4 load4(const __nv_bfloat16* p, int64_t i4) {
  const uint2 raw = reinterpret_cast<const uint2*>(p)[i4];
  return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                     __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u));
}
__device__ inline float load1(const float* p, int64_t i) { return p[i]; }
__device__ inline float load1(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// ---- gradient sources: one fp32 buffer, or the sum of bf16 copies (one per rank) ----

// One fp32 gradient.
struct F32Grad {
  const float* __restrict__ g;
  __device__ float4 load4(int64_t i4) const { return reinterpret_cast<const float4*>(g)[i4]; }
  __device__ float load1(int64_t i) const { return g[i]; }
  bool vec_ok() const { return aligned(g, 16); }
};

// The sum of K bf16 gradients, added in term order in fp32 (the same bits on every rank). K is a
// template argument so that the loads of all terms are issued before the adds.
template <int K>
struct Bf16SumGrad {
  GradTermsArg terms;
  __device__ float4 load4(int64_t i4) const {
    uint2 raw[K];
#pragma unroll
    for (int j = 0; j < K; ++j) raw[j] = reinterpret_cast<const uint2*>(terms.t[j])[i4];
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < K; ++j) {
      s.x += __uint_as_float(raw[j].x << 16);
      s.y += __uint_as_float(raw[j].x & 0xffff0000u);
      s.z += __uint_as_float(raw[j].y << 16);
      s.w += __uint_as_float(raw[j].y & 0xffff0000u);
    }
    return s;
  }
  __device__ float load1(int64_t i) const {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) s += __uint_as_float(uint32_t{terms.t[j][i]} << 16);
    return s;
  }
  bool vec_ok() const {
    for (int j = 0; j < K; ++j)
      if (!aligned(terms.t[j], 8)) return false;
    return true;
  }
};

// Calls fn(Bf16SumGrad<K>{terms}) with K = terms.k (1 to kMaxGradTerms).
template <int K = kMaxGradTerms, typename Fn>
auto with_terms(const GradTermsArg& terms, Fn fn) {
  if constexpr (K > 1)
    if (terms.k < K) return with_terms<K - 1>(terms, fn);
  if (terms.k != K) runtime_error("{} bf16 gradient terms (1 to {})", terms.k, kMaxGradTerms);
  return fn(Bf16SumGrad<K>{terms});
}

// ---- AdamW: math in adamw_update() (adamw.cuh), shared with the CPU loop ----

// The step's scalars: by value, or read from device memory when the kernel runs.
struct StepArgsRef {
  AdamWStepArgs value;
  const AdamWStepArgs* device;
  __device__ AdamWStepArgs get() const { return device ? *device : value; }
};

// One group of four elements per thread through float4, and after the n / 4 groups one thread per
// remaining element. A grid of short blocks, not a grid-stride loop over one wave: alone on an
// H200 the update then moves 4.2 instead of 3.8 TB/s (10% less time; tests/overlap_probe.cu,
// docs/results/h200_update_overlap_probe.txt), and beside other kernels its blocks leave SMs as
// soon as they are done. All pointers must be 16-byte aligned (out: 16 for fp32, 8 for bf16 and
// fp16; bf16 gradient terms 8).
template <typename OutT, typename Grad, typename S>
__global__ void adamw_vec4_kernel(float* master, S* m, S* v, Grad g, OutT* out, int64_t n,
                                  StepArgsRef ref) {
  const AdamWStepArgs a = ref.get();
  const int64_t n4 = n / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 p4 = reinterpret_cast<const float4*>(master)[i];
    float4 m4 = load4(m, i);
    float4 v4 = load4(v, i);
    const float4 g4 = g.load4(i);
    adamw_update(p4.x, m4.x, v4.x, g4.x, a);
    adamw_update(p4.y, m4.y, v4.y, g4.y, a);
    adamw_update(p4.z, m4.z, v4.z, g4.z, a);
    adamw_update(p4.w, m4.w, v4.w, g4.w, a);
    reinterpret_cast<float4*>(master)[i] = p4;
    store4(m, i, m4);
    store4(v, i, v4);
    store4(out, i, p4);
    return;
  }
  const int64_t j = 3 * n4 + i;  // = 4 * n4 + (i - n4)
  if (j < n) {
    float mj = load1(m, j), vj = load1(v, j);
    adamw_update(master[j], mj, vj, g.load1(j), a);
    store1(m, j, mj);
    store1(v, j, vj);
    store1(out, j, master[j]);
  }
}

// One element per thread, for views whose offsets do not allow float4.
template <typename OutT, typename Grad, typename S>
__global__ void adamw_scalar_kernel(float* master, S* m, S* v, Grad g, OutT* out, int64_t n,
                                    StepArgsRef ref) {
  const AdamWStepArgs a = ref.get();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float p = master[i], mi = load1(m, i), vi = load1(v, i);
  adamw_update(p, mi, vi, g.load1(i), a);
  master[i] = p;
  store1(m, i, mi);
  store1(v, i, vi);
  store1(out, i, p);
}

// The kernels of the side streams (the norm's sums beside backward, AdamW beside forward) use no
// shared memory and ask for the largest L1 instead (carveout 0). With the default carveout they
// slowed the GEMMs they ran beside: on one H200, small at 4 x 512 took 5.29-5.33 ms a step with
// the default and 5.14-5.16 ms with this (one backward GEMM of the norm's span went from 609 to
// 419 us a step, the sums from 707 to 517 us); xl 62.7-62.9 -> 62.4 ms, medium 14.6 -> 14.4-14.5
// ms (docs/results/log.md). Set once per kernel, before its first launch.
template <typename Kernel>
void prefer_l1(Kernel* kernel) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
}

// Blocks of kThreads covering `items` threads' work.
unsigned blocks_for(int64_t items) {
  const int64_t b = (items + kThreads - 1) / kThreads;
  TRAINER_CHECK(b < (int64_t{1} << 31), "AdamW over {} items: too many blocks", items);
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

template <typename OutT, typename Grad, typename S>
void launch_adamw(float* master, S* m, S* v, const Grad& g, OutT* out, int64_t n,
                  const StepArgsRef& a, cudaStream_t stream) {
  static const bool carveout = (prefer_l1(adamw_vec4_kernel<OutT, Grad, S>),
                                prefer_l1(adamw_scalar_kernel<OutT, Grad, S>), true);
  (void)carveout;
  const bool vec = aligned(master, 16) && aligned(m, 4 * sizeof(S)) && aligned(v, 4 * sizeof(S)) &&
                   g.vec_ok() && aligned(out, 4 * sizeof(OutT));
  if (vec) {
    adamw_vec4_kernel<OutT>
        <<<blocks_for(n / 4 + n % 4), kThreads, 0, stream>>>(master, m, v, g, out, n, a);
    CUDA_CHECK_LAUNCH("adamw_vec4_kernel");
  } else {
    adamw_scalar_kernel<OutT><<<blocks_for(n), kThreads, 0, stream>>>(master, m, v, g, out, n, a);
    CUDA_CHECK_LAUNCH("adamw_scalar_kernel");
  }
}

template <typename Grad, typename S>
void adamw_any_out(float* master, S* m, S* v, const Grad& g, void* out, DType out_type, int64_t n,
                   const StepArgsRef& args, cudaStream_t s) {
  switch (out_type) {
    case DType::kF32:
      return launch_adamw(master, m, v, g, static_cast<float*>(out), n, args, s);
    case DType::kBF16:
      return launch_adamw(master, m, v, g, static_cast<__nv_bfloat16*>(out), n, args, s);
    case DType::kF16:
      return launch_adamw(master, m, v, g, static_cast<__half*>(out), n, args, s);
    case DType::kF64:
      break;
  }
  runtime_error("AdamW writes f32, bf16 or f16 parameters, not {}", dtype_name(out_type));
}

template <typename Grad>
void adamw_any(float* master, const Moments& mv, const Grad& g, void* out, DType out_type,
               int64_t n, const StepArgsRef& args, void* stream) {
  if (n == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (mv.type == DType::kBF16)
    return adamw_any_out(master, static_cast<__nv_bfloat16*>(mv.m),
                         static_cast<__nv_bfloat16*>(mv.v), g, out, out_type, n, args, s);
  TRAINER_CHECK(mv.type == DType::kF32, "AdamW moments in {}", dtype_name(mv.type));
  adamw_any_out(master, static_cast<float*>(mv.m), static_cast<float*>(mv.v), g, out, out_type, n,
                args, s);
}

// ---- sum of squares: sum_i x[i]^2 ----
// Stage 1 (this kernel): thread t accumulates x[i]^2 in fp32 over its grid-stride elements, the
// block sums its threads in double (warp shuffles, then the warp sums by warp 0) and writes one
// partial. Stage 2 (host): the partials are added in index order in double. No atomics, so the
// result is the same on every run.
template <bool kVec, typename Grad>
__global__ void sum_squares_partials_kernel(Grad x, int64_t n, double* partials) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc = 0.0f;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 q = x.load4(i);
      acc = fmaf(q.x, q.x, acc);
      acc = fmaf(q.y, q.y, acc);
      acc = fmaf(q.z, q.z, acc);
      acc = fmaf(q.w, q.w, acc);
    }
    const int64_t j = 4 * n4 + tid;
    if (j < n) {
      const float q = x.load1(j);
      acc = fmaf(q, q, acc);
    }
  } else {
    for (int64_t i = tid; i < n; i += stride) {
      const float q = x.load1(i);
      acc = fmaf(q, q, acc);
    }
  }
  double s = acc;
  for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_down_sync(0xffffffffu, s, offset);
  __shared__ double warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_down_sync(0xffffffffu, s, offset);
    if (lane == 0) partials[blockIdx.x] = s;
  }
}

// ---- fp32 -> bf16 / fp16 cast of parameters ----
template <typename OutT>
__global__ void cast_vec4_kernel(const float* __restrict__ src, OutT* dst, int64_t n) {
  const int64_t n4 = n / 4;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < n4; i += stride)
    store4(dst, i, reinterpret_cast<const float4*>(src)[i]);
  const int64_t j = 4 * n4 + tid;
  if (j < n) store1(dst, j, src[j]);
}

template <typename OutT>
__global__ void cast_scalar_kernel(const float* __restrict__ src, OutT* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store1(dst, i, src[i]);
}

template <typename OutT>
void launch_cast(const float* src, uint16_t* dst, int64_t n, void* stream) {
  if (n == 0) return;
  const cudaStream_t s = as_stream(stream);
  auto* out = reinterpret_cast<OutT*>(dst);
  if (aligned(src, 16) && aligned(dst, 8)) {
    cast_vec4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(src, out, n);
    CUDA_CHECK_LAUNCH("cast_vec4_kernel");
  } else {
    cast_scalar_kernel<<<grid_for(n), kThreads, 0, s>>>(src, out, n);
    CUDA_CHECK_LAUNCH("cast_scalar_kernel");
  }
}

}  // namespace

void adamw_step(float* master, const Moments& mv, const float* grads, void* out, DType out_type,
                int64_t n, const AdamWStepArgs& args, void* stream,
                const AdamWStepArgs* device_args) {
  adamw_any(master, mv, F32Grad{grads}, out, out_type, n, StepArgsRef{args, device_args}, stream);
}

void adamw_step(float* master, const Moments& mv, const GradTermsArg& grads, void* out,
                DType out_type, int64_t n, const AdamWStepArgs& args, void* stream,
                const AdamWStepArgs* device_args) {
  with_terms(grads, [&](const auto& g) {
    adamw_any(master, mv, g, out, out_type, n, StepArgsRef{args, device_args}, stream);
  });
}

DeviceStepArgs::DeviceStepArgs() {
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), sizeof(AdamWStepArgs)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), sizeof(AdamWStepArgs)));
}

DeviceStepArgs::~DeviceStepArgs() {
  cudaFree(device_);
  cudaFreeHost(host_);
}

void DeviceStepArgs::set(const AdamWStepArgs& a) { *host_ = a; }

void DeviceStepArgs::upload(void* stream) {
  CUDA_CHECK(cudaMemcpyAsync(device_, host_, sizeof(AdamWStepArgs), cudaMemcpyHostToDevice,
                             as_stream(stream)));
}

namespace {

// Stage 1 of the sum of squares of x[0, n): `blocks` partials into partials[0, blocks) on `s`.
template <typename Grad>
void launch_partials(const Grad& x, int64_t n, int blocks, double* partials, cudaStream_t s) {
  static const bool carveout = (prefer_l1(sum_squares_partials_kernel<true, Grad>),
                                prefer_l1(sum_squares_partials_kernel<false, Grad>), true);
  (void)carveout;
  if (x.vec_ok()) {
    sum_squares_partials_kernel<true><<<blocks, kThreads, 0, s>>>(x, n, partials);
    CUDA_CHECK_LAUNCH("sum_squares_partials_kernel<vec4>");
  } else {
    sum_squares_partials_kernel<false><<<blocks, kThreads, 0, s>>>(x, n, partials);
    CUDA_CHECK_LAUNCH("sum_squares_partials_kernel<scalar>");
  }
}

template <typename Grad>
double sum_squares_of(const Grad& x, int64_t n, void* stream) {
  if (n == 0) return 0.0;
  const cudaStream_t s = as_stream(stream);
  const int64_t wanted = (n + 4 * kThreads - 1) / (4 * kThreads);
  const int blocks = static_cast<int>(wanted < kMaxReduceBlocks ? wanted : kMaxReduceBlocks);
  double* partials = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), blocks * sizeof(double), s));
  launch_partials(x, n, blocks, partials, s);
  std::vector<double> host(static_cast<size_t>(blocks));
  CUDA_CHECK(
      cudaMemcpyAsync(host.data(), partials, blocks * sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaFreeAsync(partials, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  double total = 0.0;
  for (double p : host) total += p;
  return total;
}

}  // namespace

double sum_squares(const float* x, int64_t n, void* stream) {
  return sum_squares_of(F32Grad{x}, n, stream);
}

double sum_squares(const GradTermsArg& x, int64_t n, void* stream) {
  return with_terms(x, [&](const auto& g) { return sum_squares_of(g, n, stream); });
}

void cast_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, void* stream) {
  launch_cast<__nv_bfloat16>(src, dst, n, stream);
}

void cast_f32_to_f16(const float* src, uint16_t* dst, int64_t n, void* stream) {
  launch_cast<__half>(src, dst, n, stream);
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}

// ---- the sum of squares beside backward ----

namespace {
// Elements per side-stream launch at least, and launches per step at most (with many small
// tensors, per-tensor launches would cost the host more than the overlap saves).
constexpr int64_t kMinChunk = int64_t{8} << 20;
constexpr int64_t kMaxChunks = 64;
// Blocks per launch at most: a wave's worth leaves backward's kernels most of the SMs.
constexpr int kOverlapBlocks = 128;

// The last tensor (the embedding, which backward finishes last) is summed alone, after backward,
// on every SM: the step waits for it.
int chunk_blocks(int64_t n, bool last) {
  const int64_t most = last ? kMaxReduceBlocks : kOverlapBlocks;
  const int64_t wanted = (n + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<int>(wanted < most ? wanted : most);
}

// Whether tensor t ends a chunk that began at `begin`: a chunk holds at least `chunk`
// elements, and the last tensor is a chunk of its own.
bool ends_chunk(const std::vector<int64_t>& ends, size_t t, int64_t begin, int64_t chunk) {
  return ends[t] - begin >= chunk || t + 2 >= ends.size();
}
}  // namespace

struct OverlappedSumSquares::Impl {
  const float* grads = nullptr;
  int64_t n = 0, chunk = 0;
  std::vector<int64_t> ends;
  cudaStream_t compute = nullptr, side = nullptr;
  std::vector<cudaEvent_t> events;  // one per launch of a step
  double* partials = nullptr;       // device, one per block of every launch
  double* host = nullptr;           // pinned copy
  int64_t partial_count = 0;        // of this step
  int64_t launched_to = 0;          // buffer elements covered so far
  int64_t launches = 0;             // of this step
  int next_tensor = 0;
  bool active = false;
  bool recorded = false;       // a recording holds a whole pass (join() after on_ready's last)
  int64_t debug_delay_us = 0;  // set_debug_delay()
  cudaEvent_t joined = nullptr, queued = nullptr;  // side -> compute, compute -> side
};

OverlappedSumSquares::OverlappedSumSquares(const float* grads, int64_t n,
                                           std::vector<int64_t> tensor_ends, void* stream)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TRAINER_CHECK(!tensor_ends.empty() && tensor_ends.back() == n,
                "overlapped sum of squares: tensor ends must finish at the buffer's {}", n);
  m.grads = grads;
  m.n = n;
  m.ends = std::move(tensor_ends);
  m.chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
  m.compute = as_stream(stream);
  // Bound the launches and their partials from the layout, as on_ready will split it.
  int64_t begin = 0, launches = 0, max_partials = 0;
  for (size_t t = 0; t < m.ends.size(); ++t)
    if (ends_chunk(m.ends, t, begin, m.chunk)) {
      max_partials += chunk_blocks(m.ends[t] - begin, t + 1 == m.ends.size());
      ++launches;
      begin = m.ends[t];
    }
  // The compute stream's priority: the pass shares the GPU with backward as before when forward
  // and backward run above an update beside them (UpdateLane).
  int priority = 0;
  CUDA_CHECK(cudaStreamGetPriority(m.compute, &priority));
  CUDA_CHECK(cudaStreamCreateWithPriority(&m.side, cudaStreamNonBlocking, priority));
  m.events.resize(static_cast<size_t>(launches));
  for (cudaEvent_t& e : m.events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&m.joined, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&m.queued, cudaEventDisableTiming));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m.partials), max_partials * sizeof(double)));
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.host), max_partials * sizeof(double)));
}

OverlappedSumSquares::~OverlappedSumSquares() {
  Impl& m = *impl_;
  if (m.side) cudaStreamSynchronize(m.side);
  for (cudaEvent_t e : m.events) cudaEventDestroy(e);
  if (m.joined) cudaEventDestroy(m.joined);
  if (m.queued) cudaEventDestroy(m.queued);
  cudaFree(m.partials);
  cudaFreeHost(m.host);
  if (m.side) cudaStreamDestroy(m.side);
}

void OverlappedSumSquares::begin() {
  Impl& m = *impl_;
  m.active = true;
  m.partial_count = 0;
  m.launched_to = 0;
  m.launches = 0;
  m.next_tensor = 0;
}

bool OverlappedSumSquares::active() const { return impl_->active; }

void OverlappedSumSquares::set_debug_delay(int64_t us) { impl_->debug_delay_us = us; }

namespace {
// The partials added in total()'s order (kSumLanes strided sums, then those in lane order), then
// the factor. One warp: each lane's adds depend on each other, the lanes' do not (small at
// 16 x 1024 on an H200: 6 us, against 33 us when one thread added all partials in index order).
__global__ void clip_from_partials_kernel(const double* partials, int64_t count, double clip,
                                          double loss_scale, AdamWStepArgs* args,
                                          AdamWStepArgs base, bool write_base) {
  static_assert(kSumLanes == 32, "one warp, one lane per strided sum");
  const int lane = threadIdx.x;
  double acc = 0.0;
  for (int64_t i = lane; i < count; i += kSumLanes) acc += partials[i];
  __shared__ double lanes[kSumLanes];
  lanes[lane] = acc;
  __syncwarp();
  if (lane != 0) return;
  double sum = 0.0;
  for (int j = 0; j < kSumLanes; ++j) sum += lanes[j];
  const double norm = sqrt(sum) / loss_scale;
  if (write_base) *args = base;
  args->grad_scale = static_cast<float>(clip_factor(norm, clip) / loss_scale);
}
}  // namespace

void OverlappedSumSquares::clip_into(AdamWStepArgs* args, double clip, double loss_scale,
                                     const AdamWStepArgs* base) {
  Impl& m = *impl_;
  TRAINER_CHECK(m.active && m.launched_to == m.n,
                "overlapped sum of squares: clip_into before every tensor was reported");
  clip_from_partials_kernel<<<1, kSumLanes, 0, m.compute>>>(
      m.partials, m.partial_count, clip, loss_scale, args, base ? *base : AdamWStepArgs{},
      base != nullptr);
  CUDA_CHECK_LAUNCH("clip_from_partials_kernel");
}

void OverlappedSumSquares::join() {
  Impl& m = *impl_;
  m.recorded = m.active;
  if (!m.active) return;  // nothing was forked
  TRAINER_CHECK(m.launched_to == m.n, "overlapped sum of squares: {} of {} elements recorded",
                m.launched_to, m.n);
  CUDA_CHECK(cudaEventRecord(m.joined, m.side));
  CUDA_CHECK(cudaStreamWaitEvent(m.compute, m.joined, 0));
}

void OverlappedSumSquares::replayed() { impl_->active = impl_->recorded; }

void OverlappedSumSquares::on_ready(int index) {
  Impl& m = *impl_;
  if (!m.active) return;
  TRAINER_CHECK(index == m.next_tensor,
                "overlapped sum of squares: tensor {} reported, {} expected", index, m.next_tensor);
  ++m.next_tensor;
  const int64_t end = m.ends[static_cast<size_t>(index)];
  if (!ends_chunk(m.ends, static_cast<size_t>(index), m.launched_to, m.chunk)) return;
  // [launched_to, end) is final on the compute stream: sum it on the side stream, but the last
  // tensor on the compute stream itself, which has nothing else left to do (a launch on the side
  // stream after an event starts 10-30 us later).
  const int64_t count = end - m.launched_to;
  const bool last = end == m.n;
  cudaStream_t stream = m.compute;
  if (!last) {
    cudaEvent_t ev = m.events.at(static_cast<size_t>(m.launches++));
    CUDA_CHECK(cudaEventRecord(ev, m.compute));
    CUDA_CHECK(cudaStreamWaitEvent(m.side, ev, 0));
    debug_spin(m.side, m.debug_delay_us);
    stream = m.side;
  }
  const int blocks = chunk_blocks(count, last);
  launch_partials(F32Grad{m.grads + m.launched_to}, count, blocks, m.partials + m.partial_count,
                  stream);
  m.partial_count += blocks;
  m.launched_to = end;
}

double OverlappedSumSquares::total() {
  Impl& m = *impl_;
  TRAINER_CHECK(m.active && m.launched_to == m.n,
                "overlapped sum of squares: {} of {} gradient elements were reported",
                m.launched_to, m.n);
  CUDA_CHECK(cudaEventRecord(m.queued, m.compute));
  CUDA_CHECK(cudaStreamWaitEvent(m.side, m.queued, 0));
  CUDA_CHECK(cudaMemcpyAsync(m.host, m.partials, m.partial_count * sizeof(double),
                             cudaMemcpyDeviceToHost, m.side));
  CUDA_CHECK(cudaStreamSynchronize(m.side));
  m.active = false;
  double lanes[kSumLanes] = {};
  for (int64_t i = 0; i < m.partial_count; ++i) lanes[i % kSumLanes] += m.host[i];
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

// ---- the update beside the next forward ----

struct UpdateLane::Impl {
  cudaStream_t compute = nullptr, lane = nullptr;
  cudaEvent_t queued = nullptr;    // compute -> lane
  std::vector<cudaEvent_t> parts;  // lane -> compute, one per part of an update
  int marked = 0;                  // parts of the current update
  struct Span {
    cudaEvent_t start, stop;
  };
  std::vector<Span> pending, spare;  // updates not yet read back; events to reuse
  Span open{};
  int64_t debug_delay_us = 0;  // set_debug_delay()
};

UpdateLane::UpdateLane(void* compute, int parts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.compute = as_stream(compute);
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&m.lane, cudaStreamNonBlocking, least));
  CUDA_CHECK(cudaEventCreateWithFlags(&m.queued, cudaEventDisableTiming));
  m.parts.resize(static_cast<size_t>(parts));
  for (cudaEvent_t& e : m.parts) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

UpdateLane::~UpdateLane() {
  Impl& m = *impl_;
  cudaStreamSynchronize(m.lane);
  for (cudaEvent_t e : m.parts) cudaEventDestroy(e);
  for (const auto* list : {&m.pending, &m.spare})
    for (const Impl::Span& s : *list) {
      cudaEventDestroy(s.start);
      cudaEventDestroy(s.stop);
    }
  cudaEventDestroy(m.queued);
  cudaStreamDestroy(m.lane);
}

void UpdateLane::begin() {
  Impl& m = *impl_;
  CUDA_CHECK(cudaEventRecord(m.queued, m.compute));
  CUDA_CHECK(cudaStreamWaitEvent(m.lane, m.queued, 0));
  if (m.spare.empty()) {
    Impl::Span s{};
    CUDA_CHECK(cudaEventCreate(&s.start));
    CUDA_CHECK(cudaEventCreate(&s.stop));
    m.spare.push_back(s);
  }
  m.open = m.spare.back();
  m.spare.pop_back();
  CUDA_CHECK(cudaEventRecord(m.open.start, m.lane));
  debug_spin(m.lane, m.debug_delay_us);
  m.marked = 0;
}

void UpdateLane::set_debug_delay(int64_t us) { impl_->debug_delay_us = us; }

void* UpdateLane::stream() const { return impl_->lane; }

int UpdateLane::mark() {
  Impl& m = *impl_;
  TRAINER_CHECK(m.marked < static_cast<int>(m.parts.size()), "update lane: more than {} parts",
                m.parts.size());
  CUDA_CHECK(cudaEventRecord(m.parts[m.marked], m.lane));
  return m.marked++;
}

void UpdateLane::end() {
  Impl& m = *impl_;
  CUDA_CHECK(cudaEventRecord(m.open.stop, m.lane));
  m.pending.push_back(m.open);
}

void UpdateLane::wait(int k) {
  Impl& m = *impl_;
  TRAINER_CHECK(k >= 0 && k < m.marked, "update lane: no part {}", k);
  CUDA_CHECK(cudaStreamWaitEvent(m.compute, m.parts[k], 0));
}

std::vector<std::pair<double, double>> UpdateLane::take_spans(bool all, void* origin) {
  Impl& m = *impl_;
  std::vector<std::pair<double, double>> spans;
  size_t done = 0;
  for (; done < m.pending.size(); ++done) {
    const Impl::Span& s = m.pending[done];
    if (all) {
      CUDA_CHECK(cudaEventSynchronize(s.stop));
    } else {
      const cudaError_t q = cudaEventQuery(s.stop);
      if (q == cudaErrorNotReady) break;
      CUDA_CHECK(q);
    }
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventElapsedTime(&a, static_cast<cudaEvent_t>(origin), s.start));
    CUDA_CHECK(cudaEventElapsedTime(&b, static_cast<cudaEvent_t>(origin), s.stop));
    spans.emplace_back(a, b);
    m.spare.push_back(s);
  }
  m.pending.erase(m.pending.begin(), m.pending.begin() + static_cast<std::ptrdiff_t>(done));
  return spans;
}

}  // namespace trainer::cuda
