// What the attention launchers share: flash_attention.cu (FlashAttention-2 on mma.sync, the public
// entry points, which validate arguments and dispatch) and the Hopper wgmma kernels in this folder:
// kernel parameter blocks and host helpers. Only .cu files include this header (launch_kernel
// uses the <<<>>> syntax).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/common.cuh"
#include "model/cuda/flash/tma.cuh"
#include "model/cuda/flash_attention.h"
#include "model/cuda/rope.cuh"

namespace trainer::cuda::flash {

using cuda::kLog2e;  // common.cuh, beside fast_exp2

// Kernel arguments of one forward / one backward main kernel (FA2 and wgmma take the same ones).
// q, k, v, o, dout, dk, dv: bf16 (B, T, H*dh) rows, q, k, v and dk, dv with the row strides below
// (>= H*dh: they may be columns of a wider buffer); lse, dsum: fp32 (B, H, T); dq_acc: fp32 (B, T,
// H, dh). B is the grid's x extent divided by H, head_dim the kernel's template argument.
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
  int64_t ld_qkv;    // row stride of q, k, v (elements); o's is H * dh
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
  int64_t ld_qkv;    // row stride of q, k, v (elements); dout's and dq_acc's are H * dh
  int64_t ld_dkv;    // row stride of dk, dv
  // RoPE's table (rope_table(): cos, sin per position and channel pair), or null. Given, dq and dk
  // leave through RoPE's backward: the kernels write the gradients of the un-rotated q and k.
  const float2* rope;
};

// The wgmma backward may keep dq_acc's rows permuted (wgmma_backward_permutes_dq_rows): row g
// (0..7) of each aligned group of 8 rows of a sequence at row dq_acc_row_slot(g) of the group.
// dq_acc_row_of_slot is the inverse.
__host__ __device__ constexpr int dq_acc_row_slot(int g) { return 2 * (g & 3) + (g >> 2); }
__host__ __device__ constexpr int dq_acc_row_of_slot(int s) { return 4 * (s & 1) + (s >> 1); }
constexpr bool dq_acc_row_order_is_a_permutation() {
  for (int g = 0; g < 8; ++g)
    if (dq_acc_row_slot(g) < 0 || dq_acc_row_slot(g) > 7 ||
        dq_acc_row_of_slot(dq_acc_row_slot(g)) != g)
      return false;
  return true;
}
static_assert(dq_acc_row_order_is_a_permutation(), "dq_acc's row order within a group of 8");

// RoPE's backward of one interleaved channel pair at (position, pair) of `table` (rope_table()
// layout, head_dim / 2 pairs per position): (g0, g1) -> (g0 c + g1 s, g1 c - g0 s), the rotation
// by -theta that undoes the forward's.
__device__ __forceinline__ float2 rope_backward_pair(const float2* table, int half_dim, int pos,
                                                     int pair, float g0, float g1) {
  return rope_rotate_pair(table[static_cast<int64_t>(pos) * half_dim + pair], g0, g1, true);
}

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

// The row stride `stride` (argument `name` of `what`) resolved: 0 means H * head_dim; otherwise at
// least that and a multiple of 8 elements (16-byte rows, as TMA and the vector loads need).
inline int64_t row_stride(int64_t stride, int H, int head_dim, const char* name, const char* what) {
  const int64_t row = static_cast<int64_t>(H) * head_dim;
  if (stride == 0) return row;
  if (stride < row || stride % 8 != 0)
    fail("{}: {} = {} must be 0 or a multiple of 8 that is at least H * head_dim = {}", what, name,
         stride, row);
  return stride;
}

constexpr size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The 1-D grid of the Hopper kernels: one CTA per (block of `block_rows` rows, batch * head).
// Two wishes pull apart. The CTAs resident together should share few heads, so that those heads'
// K and V (forward) or fp32 dQ accumulator (backward) stay in L2 instead of streaming from HBM
// (10-15% of the time at T >= 8192). And the blocks with the most work should start first: causal
// blocks differ up to T / block_rows times in work, and a long block started late is a tail. So
// heads go in groups (HeadOrder::group), each group's working set within half the L2, and inside
// a group the blocks run longest first across its heads. The last group's longest blocks start
// late, which costs up to one block's work out of an SM's share of the grid: grouping is used
// only when the grid has 8 or more blocks per SM (else all heads form one group, the plain
// longest-first order). On an H100 with the persistent kernels (docs/results/log.md, 2026-11-25
// 22:57), 8 instead of 16 took small's training step at 16 x 1024 (192 heads, T 1024: 11.6
// blocks per SM) from 30.35 to 29.47 ms, all of it in the attention backward, whose fp32 dQ
// accumulator (50 MB) no longer streams through the L2 from every head at once; head dim 128 at
// T 4096 (B 4, H 16: 15.5 per SM) ran 4-10% faster. The earlier threshold, 16, came from an H200
// before the kernels were persistent, where T 1024-4096 lost 5-15% when grouped.
struct HeadOrder {
  int blocks;  // row blocks per head
  int group;   // heads per group
  int heads;   // B * H
  unsigned ctas() const { return static_cast<unsigned>(blocks) * static_cast<unsigned>(heads); }
};

// The current device's L2 size and SM count, looked up once per process.
struct DeviceShape {
  int64_t l2_bytes = 0;
  int sms = 1;
};
inline const DeviceShape& device_shape() {
  static const DeviceShape shape = [] {
    DeviceShape d;
    int id = 0, l2 = 0, sms = 0;
    if (cudaGetDevice(&id) == cudaSuccess &&
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, id) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, id) == cudaSuccess) {
      d.l2_bytes = l2;
      d.sms = std::max(sms, 1);
    }
    cudaGetLastError();
    return d;
  }();
  return shape;
}

inline HeadOrder head_order(int B, int H, int T, int block_rows, int64_t bytes_per_head_row,
                            const char* what) {
  const DeviceShape& device = device_shape();
  const int64_t blocks = (T + block_rows - 1) / block_rows;
  const int64_t heads = static_cast<int64_t>(B) * H;
  if (blocks * heads > int64_t{0x7fffffff})
    fail("{}: B={}, T={}, H={} needs {} blocks (at most 2^31 - 1)", what, B, T, H, blocks * heads);
  int64_t group = heads;
  if (blocks * heads >= 8 * int64_t{device.sms}) {
    const int64_t per_head = std::max<int64_t>(1, bytes_per_head_row * T);
    group = std::clamp<int64_t>(device.l2_bytes / 2 / per_head, 1, heads);
  }
  return {static_cast<int>(blocks), static_cast<int>(group), static_cast<int>(heads)};
}

// Block `item` of the blocks * heads blocks in the order above: its batch b, head h (bh = b * H +
// h) and rank among its head's blocks, 0 = the one with the most work.
struct OrderedBlock {
  int b, h, bh, rank;
};
__device__ __forceinline__ OrderedBlock head_order_block(const HeadOrder& o, int item, int H) {
  const int per_group = o.blocks * o.group;
  const int g = item / per_group;
  const int j = item - g * per_group;
  const int size = min(o.group, o.heads - g * o.group);  // the last group may be smaller
  const int rank = j / size;
  const int bh = g * o.group + (j - rank * size);
  return {bh / H, bh % H, bh, rank};
}

// Persistent kernels: at most one CTA per SM works through the `items` blocks of the order
// above. CTA c starts with block c; every further block goes to whichever CTA asks for one first
// (a ticket from a device counter, asked for when the CTA's producer has issued the last loads
// of its current block), so that blocks go out longest first to the SMs as they come free, as
// the hardware hands out the CTAs of a plain grid. A static assignment (rounds of blocks dealt
// out alternately forwards and backwards) was up to 24% slower at T >= 4096 on an H100 (forward,
// head dim 64, T 8192): it cannot follow blocks that run slower than their tile count says.
//
// The counters (tickets, CTAs finished) live in a kernel file's own __device__ array of
// kScheduleSlots pairs, zero when the module loads; each launch takes the next slot, and the last
// of its CTAs to finish asking resets it, so launches in stream order, CUDA graph replays
// included, always start from zero. Launches that run at the same time need different slots:
// kScheduleSlots of them may be in flight at once.
inline constexpr int kScheduleSlots = kFlashScheduleSlots;

struct PersistentSchedule {
  int items;
  int ctas;
  int slot;
  // The CTA's next block (>= items: none left).
  __device__ __forceinline__ int claim(unsigned* counters) const {
    return ctas + static_cast<int>(atomicAdd(&counters[0], 1u));
  }
  // Once per CTA, after the claim that found no block left.
  __device__ __forceinline__ void finish(unsigned* counters) const {
    __threadfence();  // this CTA's claims before its count
    if (atomicAdd(&counters[1], 1u) == static_cast<unsigned>(ctas) - 1) {
      atomicExch(&counters[0], 0u);
      atomicExch(&counters[1], 0u);
    }
  }
};

// A block's index passes from the producer to the consumers through `slot` in shared memory,
// beside the barrier pair that carries the block's first loads: `full` (its phase completes when
// they landed) and `empty` (the consumers' release of the block before). The producer writes it
// before its arrival on `full`; the consumers read it as soon as that phase completed.
// Producer, before its arrival on `full` for its `blocks_done`-th block (index -1: none left, then
// a bare tma::arrive on `full`): waits until the block before is released, writes the index.
__device__ __forceinline__ void hand_over_block(uint32_t empty, int blocks_done, volatile int* slot,
                                                int item) {
  if (blocks_done > 0) tma::wait(empty, static_cast<uint32_t>((blocks_done - 1) & 1));
  *slot = item;
}
// Consumers: the index of their `blocks_done`-th block, -1 when there is none.
__device__ __forceinline__ int wait_for_block(uint32_t full, int blocks_done,
                                              const volatile int* slot) {
  tma::wait(full, static_cast<uint32_t>(blocks_done & 1));
  return *slot;
}

inline PersistentSchedule persistent_schedule(const HeadOrder& order) {
  static std::atomic<unsigned> next_slot{0};
  const unsigned items = order.ctas();
  return {static_cast<int>(items),
          static_cast<int>(std::min<unsigned>(items, static_cast<unsigned>(device_shape().sms))),
          static_cast<int>(next_slot.fetch_add(1, std::memory_order_relaxed) % kScheduleSlots)};
}

// Launches kKernel(p) on `grid` CTAs of `threads` threads with `smem_bytes` of dynamic shared
// memory each (the kernel's limit raised once per device), dependent on the kernel before it
// (launch_dependent: every attention kernel begins with wait_for_prior_grid). `name` is for the
// launch error message.
template <auto kKernel, class Params>
void launch_kernel(const Params& p, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                   const char* name) {
  static std::atomic<uint64_t> configured{0};  // one per kernel
  ensure_smem_limit(kKernel, smem_bytes, configured);
  launch_dependent(kKernel, grid, dim3(threads), static_cast<size_t>(smem_bytes), stream, p);
  CUDA_CHECK_LAUNCH(name);
}

// The grid of the FA2 kernels: x = batch * head, y = blocks of `block_rows` rows (queries or keys)
// of the p.T of one head.
template <auto kKernel, class Params>
void launch_over_heads(const Params& p, int B, int block_rows, int threads, int smem_bytes,
                       cudaStream_t stream, const char* name) {
  const dim3 grid(static_cast<unsigned>(B) * p.H, (p.T + block_rows - 1) / block_rows);
  launch_kernel<kKernel>(p, grid, threads, smem_bytes, stream, name);
}

}  // namespace trainer::cuda::flash
