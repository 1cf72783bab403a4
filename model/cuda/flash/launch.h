// What the attention launchers share: flash_attention.cu (FlashAttention-2 on mma.sync, the public
// entry points, which validate arguments and dispatch) and the Hopper wgmma kernels in this folder:
// kernel parameter blocks and host helpers. Only .cu files include this header (launch_over_heads
// uses the <<<>>> syntax).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"

namespace trainer::cuda::flash {

inline constexpr float kLog2e = 1.4426950408889634f;

// Kernel arguments of one forward / one backward main kernel (FA2 and wgmma take the same ones).
// q, k, v, o, dout, dk, dv: bf16 (B, T, H*dh); lse, dsum: fp32 (B, H, T); dq_acc: fp32 (B, T, H,
// dh). B is the grid's x extent divided by H, head_dim the kernel's template argument.
struct FwdParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* o;
  float* lse;
  int T;
  int H;
  float scale;       // 1/sqrt(dh)
  float scale_log2;  // scale * log2(e)
};

struct BwdParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const __nv_bfloat16* dout;
  const float* lse;   // (B, H, T)
  const float* dsum;  // D = rowsum(dO * O), (B, H, T), written before the main kernel
  float* dq_acc;      // (B, T, H, dh) fp32, zeroed before the main kernel; gets dS K unscaled
  __nv_bfloat16* dk;
  __nv_bfloat16* dv;
  int T;
  int H;
  float scale;       // 1/sqrt(dh)
  float scale_log2;  // scale * log2(e)
};

// Throws UsageError. Messages are formatted with fmt::runtime so that this compiles whatever
// fmt's compile-time format checking makes of nvcc.
template <typename... Args>
[[noreturn]] void fail(const char* format, const Args&... args) {
  throw UsageError(fmt::format(fmt::runtime(format), args...));
}

// `ptr` (argument `name` of `what`) must be non-null and `align`-byte aligned.
inline void check_tensor(const void* ptr, const char* name, const char* what, size_t align) {
  if (ptr == nullptr) fail("{}: tensor {} is a null pointer", what, name);
  if (reinterpret_cast<uintptr_t>(ptr) % align != 0)
    fail("{}: tensor {} at {} is not {}-byte aligned", what, name, ptr, align);
}

constexpr size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

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

// Launches kKernel(p) on the grid every attention kernel uses: x = batch * head, y = blocks of
// `block_rows` rows (queries or keys) of the p.T of one head; `threads` threads and `smem_bytes`
// of dynamic shared memory per CTA. `name` is for the launch error message.
template <auto kKernel, class Params>
void launch_over_heads(const Params& p, int B, int block_rows, int threads, int smem_bytes,
                       cudaStream_t stream, const char* name) {
  static std::atomic<uint64_t> configured{0};  // one per kernel
  ensure_smem_limit(kKernel, smem_bytes, configured);
  const dim3 grid(static_cast<unsigned>(B) * p.H, (p.T + block_rows - 1) / block_rows);
  kKernel<<<grid, threads, smem_bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace trainer::cuda::flash
