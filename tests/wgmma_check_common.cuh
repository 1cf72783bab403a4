// What the wgmma check programs (tests/wgmma_forward_check.cu, tests/wgmma_backward_check.cu)
// share: the attention .cu files compiled in (their internals are unit-tested), stand-ins for
// core/cuda_check.cpp's error hooks (the programs link only cudart), a deadline on stream syncs,
// deterministic inputs, device buffers, the unit-test report, a block reduction for the reference
// kernels and a median timer. Include once, from the program.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "model/cuda/flash/tma_forward.cu"
#include "model/cuda/flash/wgmma_backward.cu"
#include "model/cuda/flash_attention.cu"

// core/cuda_check.cpp's two functions (the real ones log through spdlog): report and exit 2.
namespace trainer {
void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
  std::printf("CUDA call %s failed at %s:%d: %s\n", call, file, line, cudaGetErrorString(err));
  std::fflush(stdout);
  std::exit(2);
}
void cuda_check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("launch of %s failed at %s:%d: %s\n", kernel, file, line, cudaGetErrorString(err));
    std::fflush(stdout);
    std::exit(2);
  }
}
}  // namespace trainer

// The unit tests' tile loader (the kernels load by TMA; see model/cuda/flash/tma.cuh): cp.async
// into the SW128 layout that wgmma reads, so the layout assumptions are tested on their own.
namespace trainer::cuda::flash::wg {

// 16-byte cp.async to a shared address; with valid == false the destination is zero-filled and
// `gmem` is not read.
__device__ __forceinline__ void cp_async_16_sw(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Copies kRows x kCols bf16 (kCols a multiple of 64) from global rows `ld` elements apart into a
// SW128 tile at shared address `smem` (1024-byte aligned); rows >= valid_rows are zero-filled.
// Consecutive threads take consecutive 16-byte chunks of a row, so the global reads are coalesced
// and each 8-thread phase writes one 128-byte shared row (all 32 banks, conflict-free).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_sw128(uint32_t smem, const bf16* gmem, int64_t ld,
                                                int valid_rows, int tid) {
  static_assert(kCols % 64 == 0, "tiles are whole 64-column panels");
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const bool valid = r < valid_rows;
    const bf16* src = valid ? gmem + r * ld + c * 8 : gmem;
    cp_async_16_sw(
        smem + static_cast<uint32_t>((c >> 3) * (kRows * 128)) + sw128_chunk_offset(r, c & 7), src,
        valid);
  }
}

}  // namespace trainer::cuda::flash::wg

namespace wgmma_check {

using bf16 = __nv_bfloat16;

int g_failures = 0;

// Waits for `stream` with a deadline so that a hung kernel cannot hang the test: on timeout the
// process exits (which tears the context down).
void sync_or_die(cudaStream_t stream, const char* what, double timeout_s = 120.0) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) {
      std::printf("CUDA error after %s: %s\n", what, cudaGetErrorString(err));
      std::fflush(stdout);
      std::exit(2);
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_s) {
      std::printf("TIMEOUT: %s did not finish within %.0f s (hang?)\n", what, timeout_s);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ---------------------------------------------------------------------------------------------
// Inputs and device buffers.
// ---------------------------------------------------------------------------------------------
struct Lcg {
  uint64_t s;
  float uniform() {  // [-1, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xFFFFFF) / 8388608.f - 1.f;
  }
};

std::vector<bf16> random_bf16(size_t n, uint64_t seed, float scale) {
  Lcg rng{seed};
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(scale * rng.uniform());
  return v;
}

__global__ void fill_random_kernel(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = trainer::cuda::hash_index(static_cast<int64_t>(i), seed);
    x[i] = __float2bfloat16(static_cast<float>(h >> 8) / 8388608.f - 1.f);
  }
}

template <class T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

template <class T>
T* dev_upload(const std::vector<T>& h) {
  T* p = dev_alloc<T>(h.size());
  CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

template <class T>
std::vector<T> dev_download(const T* p, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Sum (or max) of x over the block (a multiple of 32 threads); red holds a float per warp.
__device__ float block_reduce(float x, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // red may still be read from the previous call
  if ((threadIdx.x & 31) == 0) red[warp] = x;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
    r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// Prints max |got - ref| / max |ref| and PASS / FAIL; a few mismatches are listed on failure.
bool report_unit(const char* name, const std::vector<float>& got, const std::vector<double>& ref,
                 int cols) {
  double max_err = 0, max_ref = 0;
  bool nan = false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) nan = true;
    max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  const bool ok = !nan && rel < 1e-3;
  std::printf("%-58s max_abs_err %.3e  rel %.3e  %s%s\n", name, max_err, rel,
              nan ? "(non-finite values) " : "", ok ? "PASS" : "FAIL");
  if (!ok) {
    int shown = 0;
    for (size_t i = 0; i < got.size() && shown < 8; ++i) {
      if (!(std::fabs(got[i] - ref[i]) <= 1e-3 * max_ref)) {
        std::printf("    [row %zu, col %zu] got %.5f ref %.5f\n", i / cols, i % cols, got[i],
                    ref[i]);
        ++shown;
      }
    }
    ++g_failures;
  }
  return ok;
}

template <class F>
double median_ms(F&& f, cudaStream_t stream, const char* what) {
  for (int i = 0; i < 5; ++i) f();
  sync_or_die(stream, what);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    sync_or_die(stream, what);
    float x = 0;
    CUDA_CHECK(cudaEventElapsedTime(&x, start, stop));
    ms.push_back(x);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[9] + ms[10]);
}

}  // namespace wgmma_check
