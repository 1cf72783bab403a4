// Device helpers shared by the kernels of model/cuda: element-type conversions, packed (up to
// 16-byte) loads and stores, warp and block reductions, and the launch-side choice of the vector
// width. Only .cu files include this header (it contains device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace trainer::cuda {

constexpr int kWarp = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A well-mixed 32-bit hash of an element's index and a seed: deterministic pseudo-random fills of
// scratch and test operands, the same on every GPU and grid shape.
__device__ __forceinline__ uint32_t hash_index(int64_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32);
  h ^= h >> 15;
  h *= 0x85EBCA77u;
  h ^= h >> 13;
  h *= 0xC2B2AE3Du;
  h ^= h >> 16;
  return h;
}

// ---- programmatic dependent launch (compute capability 9.0 and later) ----
// launch_dependent() lets a kernel's blocks be scheduled while the kernel before it on the stream
// is finishing (cudaLaunchAttributeProgrammaticStreamSerialization). Such a kernel begins with
// wait_for_prior_grid(), which returns once the prior kernel has completed and its writes are
// visible, so it reads and writes nothing earlier; what it saves is the launch latency between the
// two (on an H200, a cuBLASLt GEMM followed by RMSNorm: 6.5 -> 5.0 us). Launched the usual way, or
// on an older GPU, the wait returns at once.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

inline bool dependent_launch_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9;
  }();
  return supported;
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_supported() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The DType of an element type of the model's kernels.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return DType::kBF16;
  } else if constexpr (std::is_same_v<T, __half>) {
    return DType::kF16;
  } else {
    static_assert(std::is_same_v<T, float>, "kernels run on float, __nv_bfloat16 or __half");
    return DType::kF32;
  }
}

// 2^x on the special-function unit (ex2.approx: about 2 ulp, denormal results flushed to zero);
// exp2(-inf) = +0, which attention's masking relies on. e^x is written fast_exp2(x * kLog2e),
// folded into an fma with whatever x is shifted by.
inline constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Row and first column of flat chunk `idx` of an element-wise kernel (`chunks` chunks of kV
// elements per row), by a 32-bit division where the index allows (a few instructions instead of
// the 64-bit division's few dozen).
__device__ __forceinline__ void chunk_position(int64_t idx, int64_t chunks, int kV, int64_t& r,
                                               int64_t& c) {
  if (idx < (int64_t{1} << 32) && chunks < (int64_t{1} << 32)) {
    const auto i = static_cast<uint32_t>(idx), n = static_cast<uint32_t>(chunks);
    const uint32_t q = i / n;
    r = q;
    c = static_cast<int64_t>(i - q * n) * kV;
  } else {
    r = idx / chunks;
    c = (idx % chunks) * kV;
  }
}

// ---- element conversions: all arithmetic happens in fp32 ----
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// ---- packed access: N consecutive elements moved in one instruction (16 bytes at most) ----
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <int N, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}
// Tells the compiler the pack's registers change here (they do not): values it derived from them
// before (say, the floats of a 16-bit pack) are derived again after, instead of being kept live.
// Kernels that keep a row's packs in registers between two passes use it to keep them packed.
template <typename T, int N>
__device__ __forceinline__ void keep_packed(Pack<T, N>& p) {
  static_assert(sizeof(p) % 4 == 0, "whole 32-bit registers");
  auto* w = reinterpret_cast<uint32_t*>(&p);
#pragma unroll
  for (int j = 0; j < static_cast<int>(sizeof(p) / 4); ++j) asm volatile("" : "+r"(w[j]));
}
// Loads that bypass L1 (for data written by other blocks of the same kernel).
__device__ __forceinline__ float load_cg(const float* p) { return __ldcg(p); }

// Elements per 16-byte access.
template <typename T>
constexpr int kPack = 16 / sizeof(T);

// The widest vector width (kPack<T> or 1) usable for rows of `row_elems` elements starting at
// each of `ptrs`: every pointer 16-byte aligned and every row a whole number of vectors.
template <typename T>
int vector_width(std::initializer_list<const void*> ptrs,
                 std::initializer_list<int64_t> row_elems) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  for (int64_t r : row_elems)
    if (r % kPack<T> != 0) return 1;
  return kPack<T>;
}

// ---- reductions ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory. The order of additions is fixed, so the result is
// deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// The "last block done" pattern: each of `expected` blocks calls this once (with every thread)
// after writing its partial results; it returns true in exactly one of them, the last to arrive,
// which may then read every partial (through L2, e.g. __ldcg) and must reset `*counter` to zero
// for the next launch.
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned expected, bool* smem_flag) {
  __threadfence();  // make this thread's partial writes visible device-wide
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const unsigned prev = atomicAdd(counter, 1u);
    *smem_flag = (prev == expected - 1);
  }
  __syncthreads();
  const bool last = *smem_flag;
  if (last) __threadfence();  // order the reads of other blocks' partials after the counter
  return last;
}

// Raises the dynamic shared-memory limit of `kernel` once per device (needed above 48 KB).
template <class Kernel>
void ensure_smem_limit(Kernel kernel, int bytes, std::atomic<uint64_t>& configured) {
  if (bytes <= 48 * 1024) return;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (configured.load(std::memory_order_relaxed) & bit)) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  configured.fetch_or(bit, std::memory_order_relaxed);
}

}  // namespace trainer::cuda
