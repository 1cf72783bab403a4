// Warp-level building blocks of the attention kernels (sm_80+ PTX): asynchronous global->shared
// copies, ldmatrix fragment loads and the bf16 m16n8k16 tensor-core MMA (fast_exp2 is in
// common.cuh).
//
// Fragment layouts of mma.m16n8k16 (lane = 4*g + t, g = lane/4 in 0..7, t = lane%4 in 0..3):
//   A (16x16, row-major), 4 regs of 2 bf16:  a0 = A[g][2t..2t+1]     a1 = A[g+8][2t..2t+1]
//                                            a2 = A[g][2t+8..2t+9]   a3 = A[g+8][2t+8..2t+9]
//   B (16x8, k x n),      2 regs of 2 bf16:  b0 = B[2t..2t+1][g]     b1 = B[2t+8..2t+9][g]
//   C (16x8, fp32),       4 floats:          c0,c1 = C[g][2t..2t+1]  c2,c3 = C[g+8][2t..2t+1]
// Two horizontally adjacent C tiles (columns 16k..16k+15) therefore hold exactly the A fragment of
// k-chunk k once packed to bf16, which lets P = softmax(S) feed the next MMA from registers.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "model/cuda/common.cuh"

namespace trainer::cuda::flash {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte copy global -> shared that bypasses L1; with valid == false the 16 destination bytes are
// zero-filled and `gmem` is not read (it must still be a valid address expression).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4-byte variant (used for the per-row lse / D vectors, whose rows need not be 16-byte aligned).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives
// matrix i with lane (g, t) holding row g, columns 2t and 2t+1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Same, transposed: lane (g, t) receives rows 2t and 2t+1 of column g.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Two matrices (addresses from lanes 0..15; the other lanes' addresses are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

// d += a * b on tensor cores: bf16 operands, fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two bf16 (round to nearest even); `lo` in the low half, which is
// the lower column index in every fragment layout above.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One register of two bf16 -> two floats (a bf16 is the upper half of an fp32).
__device__ __forceinline__ float2 unpack_bf16(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// *addr += (a, b) as one fire-and-forget global reduction (sm_90: a vector RED; older: two).
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

// Copies a tile of kRows rows x kCols bf16 (kCols % 8 == 0) from global rows with stride `ld`
// elements into shared rows with stride kSmemStride, 16 bytes per cp.async. Rows at or beyond
// `valid_rows` are zero-filled (tails of T). All kThreads threads of the block take part.
template <int kRows, int kCols, int kSmemStride, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* smem, const bf16* gmem, int64_t ld,
                                                int valid_rows, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * kThreads;
    if (kChunks % kThreads != 0 && i >= kChunks) break;
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const bool valid = r < valid_rows;
    const bf16* src = valid ? gmem + r * ld + c * 8 : gmem;
    cp_async_16(smem + r * kSmemStride + c * 8, src, valid);
  }
}

// Copies kRows fp32 values (a row of lse or D) into shared memory, zero-filling from valid_rows.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_vec_async(float* smem, const float* gmem, int valid_rows,
                                               int tid) {
  constexpr int kIters = (kRows + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * kThreads;
    if (kRows % kThreads != 0 && i >= kRows) break;
    const bool valid = i < valid_rows;
    cp_async_4(smem + i, valid ? gmem + i : gmem, valid);
  }
}

}  // namespace trainer::cuda::flash
