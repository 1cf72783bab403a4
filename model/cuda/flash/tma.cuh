// Hopper (sm_90) asynchronous copies for the attention kernels: TMA tensor maps of one head's
// (rows x dh) tiles, bulk tensor loads into SW128 shared-memory panels, and the mbarriers that
// tell a consumer a tile has landed and a producer that a stage is free again.
//
// A TMA load is one instruction from one thread: the copy engine fetches a box of the tensor the
// map describes, writes it to shared memory with the 128-byte swizzle (exactly the SW128 panel
// layout of wgmma.cuh when the destination is 1024-byte aligned), zero-fills what lies outside
// the tensor, and counts the bytes it wrote onto an mbarrier ("complete_tx"). A consumer waits on
// the barrier's phase bit; no thread of the CTA spends instructions or registers on the copy.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only; the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace trainer::cuda::flash::tma {

// ---------------------------------------------------------------------------------------------
// mbarriers (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier").
// `bar` is the shared address of an 8-byte aligned uint64_t.
// ---------------------------------------------------------------------------------------------

// Arrival count `count` per phase. Made visible to the async proxy (TMA) and the other threads by
// fence_barrier_init() and a CTA barrier.
__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA transactions for the current phase: the phase
// completes when all arrivals came and all announced bytes landed.
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One arrival (release semantics: this thread's earlier shared-memory reads are done).
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase with parity `parity` completed (acquire semantics: what the phase
// published, TMA writes included, is visible afterwards).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---------------------------------------------------------------------------------------------
// Bulk tensor load: the box of `map` at coordinates (c0 innermost .. c3) to shared address `dst`,
// completion counted on `bar`. `map` is the address of a __grid_constant__ kernel parameter.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                        int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Bulk copy of `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) from
// global `src` to shared address `dst`, completion counted on `bar`.
__device__ __forceinline__ void load_bytes(uint32_t dst, const void* src, uint32_t bytes,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Loads rows [row0, row0 + kRows) x all kCols columns of head h of batch b as ceil(kCols / 64)
// SW128 panels of kRows x 64 at dst, dst + kRows * 128, ... (dst 1024-byte aligned). Rows >= T and
// columns >= kCols (head dim 80: the second panel's last 48) are zero-filled by the copy engine;
// the barrier counts whole panels, kRows * 128 bytes each.
template <int kRows, int kCols>
__device__ __forceinline__ void load_head_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                               int b, int h, int row0) {
#pragma unroll
  for (int panel = 0; panel < (kCols + 63) / 64; ++panel)
    load_4d(dst + panel * kRows * 128, map, bar, panel * 64, h, row0, b);
}

// Bulk tensor reduction: adds the box at shared address `src` (laid out as the map's box, with its
// swizzle) into the tensor at coordinates (c0 innermost .. c3); elements outside the tensor are
// dropped. Asynchronous: completion is tracked per thread with bulk groups (below).
__device__ __forceinline__ void reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                              int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Closes the bulk operations this thread issued since the last commit into one group.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's bulk groups have not yet finished reading their shared
// memory (the source may then be overwritten).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Waits until at most N of this thread's bulk groups are still running (writes included).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Starts fetching the tensor map itself into the cache (the first load would stall on it).
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Host: the tensor map of a (B, T, H*dh) activation with rows `ld` elements apart (>= H*dh: the
// heads may be columns of a wider buffer) seen as 4-D (dh, H, T, B), innermost first, with boxes of
// (box_cols, 1, box_rows, 1) and the 128-byte swizzle, so box_cols * elem_bytes must be 128: one
// SW128 panel of box_rows rows of one head.
// ---------------------------------------------------------------------------------------------
inline CUtensorMap head_map(const void* base, CUtensorMapDataType type, int elem_bytes, int B,
                            int T, int H, int head_dim, int64_t ld, int box_cols, int box_rows) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  // The driver's encoder, found once through the runtime (no link against libcuda).
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      cudaGetLastError();
      throw RuntimeError("flash attention: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<Encode>(fn);
  }();
  const auto eb = static_cast<cuuint64_t>(elem_bytes);
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(B)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(ld) * eb;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(head_dim) * eb, row_bytes,
                                 row_bytes * static_cast<cuuint64_t>(T)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), 1,
                             static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult res =
      encode(&map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw RuntimeError(fmt::format(fmt::runtime("flash attention: cuTensorMapEncodeTiled failed "
                                                "({}) for B={} T={} H={} dh={}"),
                                   static_cast<int>(res), B, T, H, head_dim));
  return map;
}

// bf16 activations (q, k, v, dO): 64-column panels.
inline CUtensorMap head_tile_map(const __nv_bfloat16* base, int B, int T, int H, int head_dim,
                                 int64_t ld, int box_rows) {
  return head_map(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, B, T, H, head_dim, ld, 64, box_rows);
}

// The backward's fp32 dQ accumulator: 32-column panels.
inline CUtensorMap head_tile_map_f32(const float* base, int B, int T, int H, int head_dim,
                                     int box_rows) {
  return head_map(base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, B, T, H, head_dim,
                  static_cast<int64_t>(H) * head_dim, 32, box_rows);
}

}  // namespace trainer::cuda::flash::tma
