// Warpgroup-level (sm_90a) building blocks of the Hopper attention kernels: wgmma fences and
// groups, shared-memory matrix descriptors, the 128-byte swizzle used to lay tiles out for them,
// and m64nNk16 bf16 -> fp32 wgmma wrappers. Everything here needs -arch sm_90a (wgmma is not part
// of plain sm_90 / compute_90).
//
// Terms. A warpgroup is 4 consecutive warps (128 threads, the first warp index a multiple of 4).
// wgmma.mma_async computes D (64 x N, fp32, registers) (+)= A (64 x 16) * B (16 x N). "K-major"
// means the K index (the reduction index) is contiguous in memory: A row-major, or B stored as
// N rows of K elements (B^T row-major). "MN-major" means M (for A) or N (for B) is contiguous;
// for B that is the natural row-major (K x N) storage and is selected with imm-trans-b = 1.
//
// Register fragments (w = warp index within the warpgroup, lane = 4*g + t):
//   D (64 x N, fp32), N/2 floats per thread; for each 8-column block i in [0, N/8):
//     d[4i + 0], d[4i + 1] = D[16w + g    ][8i + 2t], D[16w + g    ][8i + 2t + 1]
//     d[4i + 2], d[4i + 3] = D[16w + g + 8][8i + 2t], D[16w + g + 8][8i + 2t + 1]
//   A (64 x 16, bf16, A-from-registers form), 4 registers of 2 bf16 (low half = lower column):
//     a[0] = A[16w + g][2t, 2t+1]    a[1] = A[16w + g + 8][2t, 2t+1]
//     a[2] = A[16w + g][2t+8, 2t+9]  a[3] = A[16w + g + 8][2t+8, 2t+9]
// Each warp therefore holds a 16-row slice in exactly the mma.sync.m16n8k16 layouts (see
// warp_mma.cuh), and the D columns 16k..16k+15 of one thread (d[8k .. 8k+7]) are, once packed
// to bf16 pairs as (d[8k], d[8k+1]), (d[8k+2], d[8k+3]), (d[8k+4], d[8k+5]), (d[8k+6], d[8k+7]),
// precisely a[0..3] of the 64 x 16 A operand made of those columns: same rows (g, g + 8), same
// columns (2t, 2t+1 and 8 + 2t, 8 + 2t + 1 within the 16-column chunk), same register order. So a
// softmax P computed in the S accumulator feeds O += P V with no data movement between threads.
//
// Shared-memory tiles (128-byte swizzle, "SW128"). A tile of R rows x 64 bf16 columns (128 bytes
// per row) is a "panel"; it is stored with row r at byte r * 128 of the panel, and its 16-byte
// chunk c (columns 8c .. 8c+7) at chunk position c ^ (r % 8). The hardware applies the same XOR of
// address bits [4, 7) with bits [7, 10) when wgmma reads through a SW128 descriptor, so panels
// must start at a 1024-byte aligned shared address (one swizzle atom = 8 rows x 128 bytes). Wider
// tiles (head dim 128 = 256 bytes per row) are stored as consecutive panels of 64 columns each.
//
// Canonical SW128 layouts as wgmma reads them (T = 8 bf16 = one 16-byte chunk):
//   K-major (A = Q, B = K): rows (M or N) at 128-byte stride inside an 8-row atom, atoms at SBO;
//     the 16 K-columns of one wgmma are 2 chunks of one 128-byte row, so LBO is unused (set to
//     16 bytes, encoded 1). Stepping K by 16 inside the panel = +32 bytes on the start address
//     (the XOR is on absolute address bits, so the advanced start still sees the right pattern;
//     the start stays within the first 128 bytes of a 1024-byte aligned atom, so base offset 0).
//   MN-major (B = V, N = head dim): 64 N-columns contiguous (one 128-byte row of a panel) per K
//     row, K rows at 128 bytes, 8 K rows per atom; SBO = stride between 8-K-row groups (1024 bytes
//     here), LBO = stride between 64-column N panels (the panel size).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "model/cuda/flash/warp_mma.cuh"

namespace trainer::cuda::flash::wg {

// ---------------------------------------------------------------------------------------------
// Synchronisation.
// ---------------------------------------------------------------------------------------------

// wgmma.fence: orders this warpgroup's earlier register writes (accumulators, A fragments) and
// shared-memory writes before the wgmma.mma_async that follow. Needed before the first wgmma and
// after any ordinary instruction touched registers a following wgmma reads or accumulates into.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the group of wgmma.mma_async issued since the last commit.
__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed groups are still running; their registers are then readable.
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Compiler-only barrier on one accumulator register: makes every later use of `r` depend on a
// point after the preceding wait_group, so no read of an in-flight accumulator can be hoisted
// above the wait (the wgmma asm itself is the only definition the compiler sees).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(r[i]);
}

// Generic-proxy shared-memory writes (st.shared, cp.async) -> async-proxy reads (wgmma operands),
// and the reverse. Issued by the writing threads after their writes completed and before the
// barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Named barrier over `threads` threads (a multiple of 32); id 0 is __syncthreads'.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at named barrier `id` without waiting (the threads that bar.sync on it wait for these).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Ping-pong turns of two consumer warpgroups (FlashAttention-3): each takes its turn before
// issuing its products and passes it to the other after, so that one's element-wise work runs
// while the other's products occupy the tensor cores. Named barrier first_id + w (256 threads) is
// warpgroup w's turn; warpgroup 0 goes first. Both must take the same number of turns; finish()
// then balances the barrier. With kOn false every call is a no-op.
template <bool kOn>
struct Turns {
  int wg;        // this warpgroup: 0 or 1
  int first_id;  // named barriers first_id and first_id + 1
  __device__ __forceinline__ void start() const {
    if constexpr (kOn)
      if (wg == 1) named_barrier_arrive(first_id, 256);
  }
  __device__ __forceinline__ void take() const {
    if constexpr (kOn) named_barrier(first_id + wg, 256);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (kOn) named_barrier_arrive(first_id + (wg ^ 1), 256);
  }
  // Warpgroup 1's last pass has no taker left: warpgroup 0 takes it.
  __device__ __forceinline__ void finish() const {
    if constexpr (kOn)
      if (wg == 0) named_barrier(first_id, 256);
  }
};

// Moves registers between the warpgroups of a CTA (setmaxnreg): every thread of the warpgroup
// executes it, and the CTA's total must stay within what it was launched with. ptxas allocates
// the code after an increase with the new limit.
template <int kRegs>
__device__ __forceinline__ void set_max_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void set_max_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptor (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory
// Layout" > "Matrix Descriptor", section 9.7.15.5.1 in ISA 8.x; anchor
// #asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor). 64 bits:
//   bits  0..13  matrix start address, (shared address & 0x3FFFF) >> 4
//   bits 16..29  leading dimension byte offset (LBO) >> 4
//   bits 32..45  stride dimension byte offset (SBO) >> 4
//   bits 49..51  matrix base offset (0: every start address here has address bits 7..9 = 0)
//   bits 62..63  swizzle mode: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
// All other bits zero.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= uint64_t{1} << 62;
  return d;
}

// The descriptor of the same layout starting `bytes` further (a multiple of 16, and the result
// stays below 256 KB so the 14-bit address field cannot carry into the LBO field).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// ---------------------------------------------------------------------------------------------
// SW128 tile addressing.
// ---------------------------------------------------------------------------------------------

// Byte offset of the 16-byte chunk `chunk` (0..7, columns 8*chunk .. 8*chunk+7) of row `row` in a
// 64-column panel.
__device__ __forceinline__ uint32_t sw128_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of element (row, col) in a tile of kRows rows stored as 64-column SW128 panels.
template <int kRows>
__device__ __forceinline__ uint32_t sw128_offset(int row, int col) {
  return static_cast<uint32_t>((col >> 6) * (kRows * 128)) +
         sw128_chunk_offset(row, (col & 63) >> 3) + static_cast<uint32_t>((col & 7) * 2);
}

// Byte offset, inside a SW128 tile of kRows rows, of the k-chunk kk (columns 16kk .. 16kk+15) of
// a K-major operand (Q, K, V or dO as A or B of a product over dh): panel kk / 4, then 32 bytes
// per chunk inside the 128-byte row. The swizzle is applied by the hardware on the absolute
// address, so this plain offset is all the descriptor needs.
template <int kRows>
__device__ __forceinline__ uint32_t kmajor_chunk_offset(int kk) {
  return static_cast<uint32_t>((kk >> 2) * (kRows * 128) + (kk & 3) * 32);
}

// Byte offset of the k-chunk kk (rows 16kk .. 16kk+15) of an MN-major operand: two whole 8-row
// swizzle atoms, so always 1024-byte aligned.
__device__ __forceinline__ uint32_t mnmajor_chunk_offset(int kk) {
  return static_cast<uint32_t>(kk * 16 * 128);
}

// The epilogues' copy-out: rows [row0, row0 + 64) of a SW128 tile of kRows rows x kCols bf16 at
// `tile` (generic pointer) to global memory, tile row r going to gmem + r * ld; rows r >=
// valid_rows are skipped. One warpgroup (wtid = thread within it), 16-byte chunks, consecutive
// threads on consecutive chunks of a row (coalesced).
template <int kRows, int kCols>
__device__ __forceinline__ void store_rows_sw128(bf16* gmem, int64_t ld, const unsigned char* tile,
                                                 int row0, int valid_rows, int wtid) {
  constexpr int kChunksPerRow = kCols / 8;
#pragma unroll
  for (int i = wtid; i < 64 * kChunksPerRow; i += 128) {
    const int row = row0 + i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    if (row < valid_rows) {
      const uint32_t off = (c >> 3) * (kRows * 128) + sw128_chunk_offset(row, c & 7);
      *reinterpret_cast<uint4*>(gmem + row * ld + c * 8) =
          *reinterpret_cast<const uint4*>(tile + off);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async m64nNk16, bf16 inputs, fp32 accumulators (imm-scale-a = imm-scale-b = 1).
// scale_d == 0 gives D = A * B (the old D is ignored), otherwise D += A * B. All 128 threads of
// the warpgroup must issue the same instruction with the same descriptors.
// ---------------------------------------------------------------------------------------------
// Operand lists of the wgmma asm statements below: the N/2 accumulator registers d[0..N/2) with
// constraint C ("+f": D is read and written; "=f": written only, for scale-d = 0, so the old D
// need not be live) and the matching PTX vector "{%0, ..., %(N/2 - 1)}".
#define TRAINER_WG_ACC_8(C, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define TRAINER_WG_ACC_40(C)                                               \
  TRAINER_WG_ACC_8(C, 0), TRAINER_WG_ACC_8(C, 8), TRAINER_WG_ACC_8(C, 16), \
      TRAINER_WG_ACC_8(C, 24), TRAINER_WG_ACC_8(C, 32)
#define TRAINER_WG_ACC_32(C) \
  TRAINER_WG_ACC_8(C, 0), TRAINER_WG_ACC_8(C, 8), TRAINER_WG_ACC_8(C, 16), TRAINER_WG_ACC_8(C, 24)
#define TRAINER_WG_ACC_64(C)                                                                       \
  TRAINER_WG_ACC_32(C), TRAINER_WG_ACC_8(C, 32), TRAINER_WG_ACC_8(C, 40), TRAINER_WG_ACC_8(C, 48), \
      TRAINER_WG_ACC_8(C, 56)
#define TRAINER_WG_ACC_REGS_32                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TRAINER_WG_ACC_REGS_40                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39}"
#define TRAINER_WG_ACC_REGS_64                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"

template <int N>
struct Wgmma;

template <>
struct Wgmma<64> {
  static constexpr int kAccRegs = 32;

  // D (+)= A * B with A (64 x 16) and B (16 x 64) both K-major in shared memory.
  __device__ __forceinline__ static void ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc,
                                            int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_32
        ", "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : TRAINER_WG_ACC_32("+f")
        : "l"(a_desc), "l"(b_desc), "r"(scale_d)
        : "memory");
  }

  // D = A * B (scale-d false; the old D is neither read nor kept), A and B as in ss().
  __device__ __forceinline__ static void ss_overwrite(float (&d)[32], uint64_t a_desc,
                                                      uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_32
        ", "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : TRAINER_WG_ACC_32("=f")
        : "l"(a_desc), "l"(b_desc), "r"(0)
        : "memory");
  }

  // D (+)= A * B with A (64 x 16) in registers (fragment layout above) and B (16 x 64)
  // MN-major ("transposed", imm-trans-b = 1) in shared memory.
  __device__ __forceinline__ static void rs_mn(float (&d)[32], const uint32_t (&a)[4],
                                               uint64_t b_desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_32
        ", "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : TRAINER_WG_ACC_32("+f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
        : "memory");
  }
  // Backward (dQ = dS K): D (+)= A * B with BOTH operands MN-major in shared memory
  // (imm-trans-a = 1, imm-trans-b = 1; bf16 allows the transpose of either operand). An MN-major A
  // (64 x 16) is described like an MN-major B: the 64 M indices of one K row are one 128-byte row
  // of a SW128 panel (contiguous), consecutive K rows 128 bytes apart, SBO = stride between groups
  // of 8 K rows, LBO = stride between 64-wide M panels (never used at M = 64). In the backward, A
  // is dS stored as dS^T (keys x queries, row-major), i.e. exactly this layout.
  __device__ __forceinline__ static void ss_tt(float (&d)[32], uint64_t a_desc, uint64_t b_desc,
                                               int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_32
        ", "
        "%32, %33, p, 1, 1, 1, 1;\n}\n"
        : TRAINER_WG_ACC_32("+f")
        : "l"(a_desc), "l"(b_desc), "r"(scale_d)
        : "memory");
  }

  // D = A * B (scale-d false), A and B as in ss_tt().
  __device__ __forceinline__ static void ss_tt_overwrite(float (&d)[32], uint64_t a_desc,
                                                         uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_32
        ", "
        "%32, %33, p, 1, 1, 1, 1;\n}\n"
        : TRAINER_WG_ACC_32("=f")
        : "l"(a_desc), "l"(b_desc), "r"(0)
        : "memory");
  }
};

// N = 80 (head dim 80: O += P V only).
template <>
struct Wgmma<80> {
  static constexpr int kAccRegs = 40;

  // D (+)= A * B with A (64 x 16) in registers and B (16 x 80) MN-major in shared memory (80
  // columns = one 64-column SW128 panel and 16 columns of the next, LBO apart).
  __device__ __forceinline__ static void rs_mn(float (&d)[40], const uint32_t (&a)[4],
                                               uint64_t b_desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_40
        ", "
        "{%40, %41, %42, %43}, %44, p, 1, 1, 1;\n}\n"
        : TRAINER_WG_ACC_40("+f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
        : "memory");
  }
};

template <>
struct Wgmma<128> {
  static constexpr int kAccRegs = 64;

  // D (+)= A * B with A (64 x 16) and B (16 x 128) both K-major in shared memory.
  __device__ __forceinline__ static void ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc,
                                            int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_64
        ", "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : TRAINER_WG_ACC_64("+f")
        : "l"(a_desc), "l"(b_desc), "r"(scale_d)
        : "memory");
  }

  // D = A * B (scale-d false; the old D is neither read nor kept), A and B as in ss().
  __device__ __forceinline__ static void ss_overwrite(float (&d)[64], uint64_t a_desc,
                                                      uint64_t b_desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_64
        ", "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : TRAINER_WG_ACC_64("=f")
        : "l"(a_desc), "l"(b_desc), "r"(0)
        : "memory");
  }

  // D (+)= A * B with A (64 x 16) in registers (fragment layout above) and B (16 x 128)
  // MN-major ("transposed", imm-trans-b = 1) in shared memory.
  __device__ __forceinline__ static void rs_mn(float (&d)[64], const uint32_t (&a)[4],
                                               uint64_t b_desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TRAINER_WG_ACC_REGS_64
        ", "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : TRAINER_WG_ACC_64("+f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
        : "memory");
  }
};

// D = A B^T over K = kChunks * 16 columns, A (64 rows) and B (N rows) K-major SW128 tiles of
// kRowsA and kRowsB rows whose descriptors point at the operand's first row (S = Q K^T and the
// backward's S^T, dP^T). One group of kChunks wgmma; the caller fences before and commits after.
template <int kChunks, int kRowsA, int kRowsB, int N>
__device__ __forceinline__ void ss_kmajor(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
  for (int kk = 0; kk < kChunks; ++kk) {
    const uint64_t da = desc_advance(desc_a, kmajor_chunk_offset<kRowsA>(kk));
    const uint64_t db = desc_advance(desc_b, kmajor_chunk_offset<kRowsB>(kk));
    if (kk == 0) {
      Wgmma<N>::ss_overwrite(d, da, db);
    } else {
      Wgmma<N>::ss(d, da, db, 1);
    }
  }
}

#undef TRAINER_WG_ACC_8
#undef TRAINER_WG_ACC_32
#undef TRAINER_WG_ACC_40
#undef TRAINER_WG_ACC_64
#undef TRAINER_WG_ACC_REGS_32
#undef TRAINER_WG_ACC_REGS_40
#undef TRAINER_WG_ACC_REGS_64

}  // namespace trainer::cuda::flash::wg
