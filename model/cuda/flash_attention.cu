// FlashAttention-2 style causal attention (bf16 in, fp32 accumulation) on tensor cores with
// mma.sync.m16n8k16, ldmatrix fragment loads, cp.async double buffering and padded shared memory.
//
// Notation for one (batch b, head h): Q, K, V, O, dO are T x dh, scale = 1/sqrt(dh),
//   S = scale * Q K^T,  S_ij = -inf for j > i (causal),  P = softmax_rows(S),  O = P V,
//   lse_i = log sum_j exp(S_ij).
// Backward:  D_i = sum_c dO_ic O_ic,  dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D),
//   dQ = scale * dS K,  dK = scale * dS^T Q.
//
// Shared-memory rows are padded by 8 bf16 (16 bytes): a row stride of (dh + 8) * 2 bytes is an odd
// multiple of 16 for every supported dh, so the 8 row addresses of an ldmatrix phase fall in 8
// distinct 16-byte bank groups (no bank conflicts) whether dh is a power of two or 80.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/flash/launch.h"
#include "model/cuda/flash/tma_forward.h"
#include "model/cuda/flash/warp_mma.cuh"
#include "model/cuda/flash/wgmma_backward.h"
#include "model/cuda/flash_attention.h"

namespace trainer::cuda {
namespace flash {
namespace {

// ---------------------------------------------------------------------------------------------
// Tile configurations. Every warp owns 16 * kMTiles query rows (forward) or 16 key rows
// (backward), so the O / dK / dV accumulators stay in registers for the whole kernel.
// ---------------------------------------------------------------------------------------------
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, bool kQInRegs_, int kMinBlocks_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kQInRegs = kQInRegs_;     // Q fragments kept in registers
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM asked of the register allocator
  static constexpr int kBlockM = kBlockM_;        // query rows per CTA
  static constexpr int kBlockN = kBlockN_;        // keys per K/V tile
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kBlockM / (16 * kWarps);  // 16-row MMA tiles per warp
  static constexpr int kStride = kHeadDim + 8;             // padded smem row, elements
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kStride * 2;  // Q + 2x(K, V)
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "MMA k/n chunks are 16 wide");
  static_assert(kMTiles >= 1 && kBlockM == 16 * kWarps * kMTiles, "rows split evenly over warps");
};

// Forward choices (registers per thread from `nvcc -Xptxas -v`, sm_90a, no spills):
//   dh <= 64: 4 warps x 32 rows, Q in registers (each K/V fragment read from shared memory feeds
//             two MMAs); 128-255 registers, 2 CTAs per SM.
//   dh 80:    8 warps x 16 rows, Q re-read from shared memory; 128 registers, 2 CTAs per SM.
//   dh 128:   8 warps x 16 rows, Q in registers; ~217 registers, 1 CTA (8 warps) per SM.
//             (Alternatives that also compile without spills: <128, 128, 32, 8, false, 2> at 128
//             registers and <128, 128, 32, 4, false, 2>; 4 warps x 32 rows with 64-key tiles
//             spills.)
template <int D>
struct FwdTraits;
template <>
struct FwdTraits<16> : FwdConfig<16, 128, 64, 4, true, 2> {};
template <>
struct FwdTraits<32> : FwdConfig<32, 128, 64, 4, true, 2> {};
template <>
struct FwdTraits<64> : FwdConfig<64, 128, 64, 4, true, 2> {};
template <>
struct FwdTraits<80> : FwdConfig<80, 128, 64, 8, false, 2> {};
template <>
struct FwdTraits<128> : FwdConfig<128, 128, 64, 8, true, 1> {};

template <int kHeadDim_, int kBlockM_, int kWarps_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per inner iteration
  static constexpr int kWarps = kWarps_;
  static constexpr int kBlockN = 16 * kWarps;  // keys per CTA (16 per warp)
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = kHeadDim + 8;   // padded smem row of Q, dO, K, V
  static constexpr int kDsStride = kBlockM + 8;  // padded smem row of dS^T
  // dQ = dS K over the CTA: kWarpsM x kWarpsN warps, each kQTilesM 16-row tiles x kQTilesN 8-col.
  static constexpr int kWarpsM = (kBlockM / 16) < kWarps ? (kBlockM / 16) : kWarps;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kQTilesM = kBlockM / 16 / kWarpsM;
  static constexpr int kQTilesN = kHeadDim / 8 / kWarpsN;
  static constexpr int kSmemBytes =
      (2 * kBlockN + 4 * kBlockM) * kStride * 2  // K, V, 2 stages of Q and dO
      + kBlockN * kDsStride * 2                  // dS^T
      + 4 * kBlockM * 4;                         // 2 stages of lse and D
  static_assert(kHeadDim % 16 == 0 && kBlockM % 16 == 0, "MMA k/n chunks are 16 wide");
  static_assert(kWarpsM * kWarpsN == kWarps && kQTilesM * kWarpsM * 16 == kBlockM &&
                    kQTilesN * kWarpsN * 8 == kHeadDim,
                "dQ tiles split evenly over warps");
};

// Backward choices: 128 keys per CTA (8 warps x 16 keys), 64 queries per inner iteration; the
// fp32 dK and dV accumulators (16 x dh per warp) stay in registers (123 registers at dh 16 up to
// 255 at dh 128, no spills; 1 CTA of 8 warps per SM from dh 32 on).
template <int D>
struct BwdTraits : BwdConfig<D, 64, 8> {};

// ---------------------------------------------------------------------------------------------
// Forward.
// One CTA computes kBlockM query rows of one (b, h); it streams K/V tiles from the diagonal tile
// down to tile 0 (only tiles that reach past the CTA's first row need the causal mask; tiles
// entirely above the diagonal are never visited). Per tile, per row, in fp32 with base-2 scores
// s2 = S * log2(e):
//   m_new = max(m, rowmax(s2)),  p = exp2(s2 - m_new),  alpha = exp2(m - m_new),
//   l = alpha * l + rowsum(p),   O = alpha * O + p V.
// At the end O /= l and lse = (m + log2(l)) / log2(e).
// ---------------------------------------------------------------------------------------------
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    flash_fwd_kernel(const FwdParams p) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (launch_kernel)
  constexpr int D = Cfg::kHeadDim;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int MT = Cfg::kMTiles;
  constexpr int S = Cfg::kStride;
  constexpr int KD = D / 16;   // k-chunks of Q K^T
  constexpr int NT = BN / 8;   // 8-column tiles of S
  constexpr int DT = D / 8;    // 8-column tiles of O
  constexpr int KN = BN / 16;  // k-chunks of P V

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + BM * S;      // [2][BN][S]
  bf16* sV = sK + 2 * BN * S;  // [2][BN][S]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int T = p.T;
  const int bh = blockIdx.x;
  const int b = bh / p.H;
  const int h = bh % p.H;
  // Heaviest query blocks (most K/V tiles) are scheduled first.
  const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int64_t ld = p.ld_qkv;  // q, k, v rows; o's: H * D
  const int64_t head_in = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * D;
  const bf16* q = p.q + head_in;
  const bf16* k = p.k + head_in;
  const bf16* v = p.v + head_in;
  const int n_tiles = (min(m0 + BM, T) + BN - 1) / BN;
  const int row_w = warp * MT * 16;  // this warp's first row within the block

  load_tile_async<BM, D, S, Cfg::kThreads>(sQ, q + m0 * ld, ld, T - m0, tid);
  {
    const int n0 = (n_tiles - 1) * BN;
    load_tile_async<BN, D, S, Cfg::kThreads>(sK, k + n0 * ld, ld, T - n0, tid);
    load_tile_async<BN, D, S, Cfg::kThreads>(sV, v + n0 * ld, ld, T - n0, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // Q fragments (A operand of Q K^T): held in registers for the whole K/V sweep, or re-read from
  // shared memory per tile when registers are better spent on occupancy.
  const bf16* sQw = sQ + (row_w + (lane & 15)) * S + (lane >> 4) * 8;
  uint32_t qf[Cfg::kQInRegs ? MT : 1][Cfg::kQInRegs ? KD : 1][4];
  if constexpr (Cfg::kQInRegs) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) ldmatrix_x4(qf[mi][kk], sQw + mi * 16 * S + kk * 16);
  }

  float acc_o[MT][DT][4];
  float row_max[MT][2];  // running max of raw scores q.k (unscaled)
  float row_sum[MT][2];  // this thread's partial sum of p; reduced over the quad at the end
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][j][e] = 0.f;
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.f;
  }

  // Lane offsets of ldmatrix row addresses: B operand without transpose (K as k x n) and with
  // transpose (V as k x n).
  const int b_row = (lane & 7) + ((lane >> 4) << 3);
  const int b_col = ((lane >> 3) & 1) * 8;
  const int bt_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int bt_col = (lane >> 4) * 8;

  for (int it = 0; it < n_tiles; ++it) {
    const int n_tile = n_tiles - 1 - it;
    const int stage = it & 1;
    if (it > 0) {
      cp_async_wait<0>();  // this tile's K/V (issued one iteration ago) has landed ...
      __syncthreads();     // ... for every thread, and nobody still reads the other stage
    }
    if (n_tile > 0) {  // prefetch the next tile while this one is computed
      const int n0 = (n_tile - 1) * BN;
      load_tile_async<BN, D, S, Cfg::kThreads>(sK + (stage ^ 1) * BN * S, k + n0 * ld, ld, T - n0,
                                               tid);
      load_tile_async<BN, D, S, Cfg::kThreads>(sV + (stage ^ 1) * BN * S, v + n0 * ld, ld, T - n0,
                                               tid);
      cp_async_commit();
    }
    const int n0 = n_tile * BN;
    // Tile entirely above the diagonal for this warp's rows: contributes nothing.
    if (n0 > m0 + row_w + MT * 16 - 1) continue;
    const bf16* sKs = sK + stage * BN * S;
    const bf16* sVs = sV + stage * BN * S;

    // S = Q K^T (raw dot products, fp32).
    float s[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        if constexpr (Cfg::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mi][e] = qf[mi][kk][e];
        } else {
          ldmatrix_x4(qa[mi], sQw + mi * 16 * S + kk * 16);
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];
        ldmatrix_x4(bf, sKs + (np * 16 + b_row) * S + kk * 16 + b_col);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_16816(s[mi][2 * np], qa[mi], bf[0], bf[1]);
          mma_16816(s[mi][2 * np + 1], qa[mi], bf[2], bf[3]);
        }
      }
    }

    // Causal mask, only where some key of the tile lies beyond some row of this warp. Keys >= T
    // (zero-filled) are always beyond every valid row, so they are masked here too.
    if (n0 + BN - 1 > m0 + row_w) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + row_w + mi * 16 + g + (e >> 1) * 8;
            const int col = n0 + j * 8 + 2 * t + (e & 1);
            if (col > row) s[mi][j][e] = -INFINITY;
          }
    }

    // Online softmax. Rows g and g+8 of each tile are spread over the 4 lanes of a quad.
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mi][r];
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mi][j][2 * r], s[mi][j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with nothing visible yet keeps max -inf; use 0 so that exp2(-inf - 0) = 0
        // instead of exp2(-inf + inf) = NaN.
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float alpha = fast_exp2((row_max[mi][r] - m_use) * p.scale_log2);
        row_max[mi][r] = mx;
        const float m_scaled = m_use * p.scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const float pv = fast_exp2(fmaf(s[mi][j][e], p.scale_log2, -m_scaled));
            s[mi][j][e] = pv;
            sum += pv;
          }
        row_sum[mi][r] = row_sum[mi][r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          acc_o[mi][j][2 * r] *= alpha;
          acc_o[mi][j][2 * r + 1] *= alpha;
        }
      }
    }

    // O += P V, with P (bf16) taken straight from the score registers.
#pragma unroll
    for (int kk = 0; kk < KN; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        pa[mi][0] = pack_bf16(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        pa[mi][1] = pack_bf16(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        pa[mi][2] = pack_bf16(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        pa[mi][3] = pack_bf16(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, sVs + (kk * 16 + bt_row) * S + dp * 16 + bt_col);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_16816(acc_o[mi][2 * dp], pa[mi], bf[0], bf[1]);
          mma_16816(acc_o[mi][2 * dp + 1], pa[mi], bf[2], bf[3]);
        }
      }
    }
  }

  // Epilogue: normalise, stage this warp's rows in its own part of sQ (only this warp ever read
  // those rows), then write 16-byte chunks; lse from one lane per quad.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mi][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // Every row, tail rows included, sees key 0, so l >= 1.
      const float inv = 1.f / l;
      const int row_l = row_w + mi * 16 + g + r * 8;
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        *reinterpret_cast<uint32_t*>(sQ + row_l * S + j * 8 + 2 * t) =
            pack_bf16(acc_o[mi][j][2 * r] * inv, acc_o[mi][j][2 * r + 1] * inv);
      }
      const int row = m0 + row_l;
      if (t == 0 && row < T)
        p.lse[static_cast<int64_t>(bh) * T + row] = row_max[mi][r] * p.scale + logf(l);
    }
  }
  __syncwarp();
  const int64_t ld_o = static_cast<int64_t>(p.H) * D;
  bf16* o = p.o + static_cast<int64_t>(b) * T * ld_o + static_cast<int64_t>(h) * D;
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int i = lane; i < MT * 16 * kChunksPerRow; i += 32) {
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const int row = m0 + row_w + r;
    if (row < T)
      *reinterpret_cast<uint4*>(o + row * ld_o + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + (row_w + r) * S + c * 8);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: D_i = sum_c dO_ic * O_ic (fp32) for every (b, t, h) row. A block takes
// kRows = 256 / (dh/8) consecutive rows (contiguous in memory); each thread reduces one 16-byte
// chunk, so the loads are fully coalesced, then one thread per row adds the row's chunks. Each
// thread also zeroes its 8 elements of the fp32 dQ accumulator (same row layout), which step 2
// adds into: one kernel fewer than a memset before it. With dq_acc null the caller has zeroed it
// (flash_attention_backward_clear, on a side stream).
// ---------------------------------------------------------------------------------------------
template <int D>
struct DotConfig {
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kThreads = 256;
  static constexpr int kRows = kThreads / kChunks;
};

template <int D>
__global__ void __launch_bounds__(DotConfig<D>::kThreads)
    flash_bwd_dot_do_o_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout,
                              float* __restrict__ dsum, float* __restrict__ dq_acc, int B, int T,
                              int H) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  constexpr int C = DotConfig<D>::kChunks;
  constexpr int R = DotConfig<D>::kRows;
  __shared__ float partial[R * C];
  const int64_t rows = static_cast<int64_t>(B) * T * H;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const int tid = threadIdx.x;
  if (tid < R * C) {
    const int64_t row = row0 + tid / C;
    float acc = 0.f;
    if (row < rows) {
      const int64_t off = row * D + (tid % C) * 8;  // == (row0 * C + tid) * 8
      const uint4 a = *reinterpret_cast<const uint4*>(o + off);
      const uint4 d = *reinterpret_cast<const uint4*>(dout + off);
      if (dq_acc != nullptr) {
        float4* zero = reinterpret_cast<float4*>(dq_acc + off);
        zero[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        zero[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      const uint32_t aw[4] = {a.x, a.y, a.z, a.w};
      const uint32_t dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 af = unpack_bf16(aw[e]);
        const float2 df = unpack_bf16(dw[e]);
        acc = fmaf(af.x, df.x, acc);
        acc = fmaf(af.y, df.y, acc);
      }
    }
    partial[tid] = acc;
  }
  __syncthreads();
  if (tid < R) {
    const int64_t row = row0 + tid;
    if (row >= rows) return;
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc += partial[tid * C + c];
    const int64_t h = row % H;
    const int64_t bt = row / H;  // b * T + t
    const int64_t b = bt / T;
    const int64_t t = bt % T;
    dsum[(b * H + h) * T + t] = acc;
  }
}

// acc (16 x 8*NT, this warp's C tiles) = A B^T over k = 16 * KD, both operands row-major in
// shared memory with row stride S: A's 16 rows start at `a`, B's 8*NT rows at `b`. a_row/a_col and
// b_row/b_col are the lane's ldmatrix offsets (A fragments, and B without transpose).
template <int NT, int KD, int S>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[NT][4], const bf16* a, const bf16* b,
                                             int a_row, int a_col, int b_row, int b_col) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, a + a_row * S + kk * 16 + a_col);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, b + (np * 16 + b_row) * S + kk * 16 + b_col);
      mma_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2 (FA2): one CTA per (b, h, block of kBlockN keys); warp w owns keys
// [16w, 16w + 16) of the block and keeps dK, dV for them in registers. It sweeps the query blocks
// that can see those keys (i >= first key), working on transposed tiles so each warp's keys are
// MMA rows:
//   S^T = K Q^T,  P^T = exp2(S^T * scale * log2e - lse * log2e)  (0 where key > query),
//   dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T o (dP^T - D),  dK += dS^T Q,
//   dS^T -> shared memory;  dQ_acc += dS K  (fp32 atomicAdd into the workspace; no separate pass).
// scale is applied to dK here and to dQ in the conversion kernel.
// ---------------------------------------------------------------------------------------------
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_bwd_kernel(const BwdParams p) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (launch_kernel)
  constexpr int D = Cfg::kHeadDim;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int S = Cfg::kStride;
  constexpr int SS = Cfg::kDsStride;
  constexpr int KD = D / 16;   // k-chunks over dh
  constexpr int QT = BM / 8;   // 8-column tiles of S^T (queries)
  constexpr int DT = D / 8;    // 8-column tiles of dK, dV
  constexpr int KQ = BM / 16;  // k-chunks over queries
  constexpr int kThreads = Cfg::kThreads;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);         // [BN][S]
  bf16* sV = sK + BN * S;                               // [BN][S]
  bf16* sQ = sV + BN * S;                               // [2][BM][S]
  bf16* sdO = sQ + 2 * BM * S;                          // [2][BM][S]
  bf16* sdS = sdO + 2 * BM * S;                         // [BN][SS], dS^T (keys x queries)
  float* sL = reinterpret_cast<float*>(sdS + BN * SS);  // [2][BM] lse
  float* sDs = sL + 2 * BM;                             // [2][BM] D

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int T = p.T;
  const int bh = blockIdx.x;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int n0 = blockIdx.y * BN;  // block 0 has the most query blocks: scheduled first
  const int64_t ld = static_cast<int64_t>(p.H) * D;  // dout and dq_acc rows
  const int64_t ld_in = p.ld_qkv;                    // q, k, v rows
  const int64_t head_off = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * D;
  const int64_t head_in = static_cast<int64_t>(b) * T * ld_in + static_cast<int64_t>(h) * D;
  const bf16* q = p.q + head_in;
  const bf16* k = p.k + head_in;
  const bf16* v = p.v + head_in;
  const bf16* dout = p.dout + head_off;
  const float* lse = p.lse + static_cast<int64_t>(bh) * T;
  const float* dsum = p.dsum + static_cast<int64_t>(bh) * T;
  float* dq_acc = p.dq_acc + head_off;
  const int m_begin = n0 / BM;  // first query block that sees any of these keys
  const int m_end = (T + BM - 1) / BM;
  const int key_w = warp * 16;  // this warp's first key within the block

  auto load_query_block = [&](int m, int stage) {
    const int m0 = m * BM;
    load_tile_async<BM, D, S, kThreads>(sQ + stage * BM * S, q + m0 * ld_in, ld_in, T - m0, tid);
    load_tile_async<BM, D, S, kThreads>(sdO + stage * BM * S, dout + m0 * ld, ld, T - m0, tid);
    load_vec_async<BM, kThreads>(sL + stage * BM, lse + m0, T - m0, tid);
    load_vec_async<BM, kThreads>(sDs + stage * BM, dsum + m0, T - m0, tid);
  };
  load_tile_async<BN, D, S, kThreads>(sK, k + n0 * ld_in, ld_in, T - n0, tid);
  load_tile_async<BN, D, S, kThreads>(sV, v + n0 * ld_in, ld_in, T - n0, tid);
  load_query_block(m_begin, 0);
  cp_async_commit();

  float acc_dk[DT][4];
  float acc_dv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[j][e] = acc_dv[j][e] = 0.f;

  // ldmatrix lane offsets: A without transpose (K, V rows), B without transpose (Q, dO as k x n
  // for S^T / dP^T), B transposed (dO, Q, K as k x n), A transposed (dS from dS^T).
  const int a_row = lane & 15;
  const int a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3);
  const int b_col = ((lane >> 3) & 1) * 8;
  const int bt_row = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int bt_col = (lane >> 4) * 8;
  const int at_row = (lane & 7) + ((lane >> 4) << 3);
  const int at_col = ((lane >> 3) & 1) * 8;
  constexpr int WM = Cfg::kWarpsM;
  constexpr int QTM = Cfg::kQTilesM;
  constexpr int QTN = Cfg::kQTilesN;
  const int wm = warp % WM;
  const int wn = warp / WM;

  for (int m = m_begin, it = 0; m < m_end; ++m, ++it) {
    const int stage = it & 1;
    const int m0 = m * BM;
    cp_async_wait<0>();
    __syncthreads();  // this block's tiles are visible; the other stage and sdS are free again
    if (m + 1 < m_end) {
      load_query_block(m + 1, stage ^ 1);
      cp_async_commit();
    }
    const bf16* sQs = sQ + stage * BM * S;
    const bf16* sdOs = sdO + stage * BM * S;
    const float* sLs = sL + stage * BM;
    const float* sDss = sDs + stage * BM;

    if (n0 + key_w > m0 + BM - 1) {
      // Every key of this warp lies beyond every query of the block: P = dS = 0.
#pragma unroll
      for (int j = 0; j < QT; ++j) {
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g) * SS + j * 8 + 2 * t) = 0u;
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g + 8) * SS + j * 8 + 2 * t) = 0u;
      }
    } else {
      // S^T = K Q^T for this warp's 16 keys x BM queries.
      float s[QT][4];
      warp_mma_abt<QT, KD, S>(s, sK + key_w * S, sQs, a_row, a_col, b_row, b_col);

      // P^T = exp(S^T * scale - lse), zero where key > query or the query row is past T.
      const bool need_mask = (n0 + key_w + 15 > m0) || (m0 + BM > T);
#pragma unroll
      for (int j = 0; j < QT; ++j) {
        const float2 l2 = *reinterpret_cast<const float2*>(sLs + j * 8 + 2 * t);
        const float lse2[2] = {l2.x * kLog2e, l2.y * kLog2e};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pv = fast_exp2(fmaf(s[j][e], p.scale_log2, -lse2[e & 1]));
          if (need_mask) {
            const int key = n0 + key_w + g + (e >> 1) * 8;
            const int query = m0 + j * 8 + 2 * t + (e & 1);
            if (key > query || query >= T) pv = 0.f;
          }
          s[j][e] = pv;
        }
      }

      // dV += P^T dO.
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        uint32_t pa[4];
        pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, sdOs + (kk * 16 + bt_row) * S + dp * 16 + bt_col);
          mma_16816(acc_dv[2 * dp], pa, bf[0], bf[1]);
          mma_16816(acc_dv[2 * dp + 1], pa, bf[2], bf[3]);
        }
      }

      // dP^T = V dO^T.
      float dpt[QT][4];
      warp_mma_abt<QT, KD, S>(dpt, sV + key_w * S, sdOs, a_row, a_col, b_row, b_col);

      // dS^T = P^T o (dP^T - D), kept in dpt.
#pragma unroll
      for (int j = 0; j < QT; ++j) {
        const float2 d2 = *reinterpret_cast<const float2*>(sDss + j * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[j][e] = s[j][e] * (dpt[j][e] - ((e & 1) ? d2.y : d2.x));
      }

      // dK += dS^T Q, and dS^T (bf16) to shared memory for the dQ product.
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        uint32_t da[4];
        da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
        da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
        da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g) * SS + kk * 16 + 2 * t) = da[0];
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g + 8) * SS + kk * 16 + 2 * t) = da[1];
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g) * SS + kk * 16 + 8 + 2 * t) = da[2];
        *reinterpret_cast<uint32_t*>(sdS + (key_w + g + 8) * SS + kk * 16 + 8 + 2 * t) = da[3];
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, sQs + (kk * 16 + bt_row) * S + dp * 16 + bt_col);
          mma_16816(acc_dk[2 * dp], da, bf[0], bf[1]);
          mma_16816(acc_dk[2 * dp + 1], da, bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // dS^T of all warps is in shared memory

    // dQ_acc[m block] += dS K: this warp's QTM x 16 rows and QTN x 8 columns, k over the BN keys.
    {
      float acc_dq[QTM][QTN][4];
#pragma unroll
      for (int mi = 0; mi < QTM; ++mi)
#pragma unroll
        for (int j = 0; j < QTN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[mi][j][e] = 0.f;
      const int col_w = wn * QTN * 8;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t af[QTM][4];
#pragma unroll
        for (int mi = 0; mi < QTM; ++mi)
          ldmatrix_x4_trans(af[mi], sdS + (kk * 16 + at_row) * SS + (wm * QTM + mi) * 16 + at_col);
#pragma unroll
        for (int np = 0; np < QTN / 2; ++np) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, sK + (kk * 16 + bt_row) * S + col_w + np * 16 + bt_col);
#pragma unroll
          for (int mi = 0; mi < QTM; ++mi) {
            mma_16816(acc_dq[mi][2 * np], af[mi], bf[0], bf[1]);
            mma_16816(acc_dq[mi][2 * np + 1], af[mi], bf[2], bf[3]);
          }
        }
        if constexpr (QTN % 2 == 1) {
          uint32_t bf[2];
          ldmatrix_x2_trans(bf, sK + (kk * 16 + bt_row) * S + col_w + (QTN - 1) * 8);
#pragma unroll
          for (int mi = 0; mi < QTM; ++mi) mma_16816(acc_dq[mi][QTN - 1], af[mi], bf[0], bf[1]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < QTM; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = m0 + (wm * QTM + mi) * 16 + g + r * 8;
          if (row >= T) continue;
          float* dst = dq_acc + row * ld + col_w + 2 * t;
#pragma unroll
          for (int j = 0; j < QTN; ++j) {
            red_add_f32x2(dst + j * 8, acc_dq[mi][j][2 * r], acc_dq[mi][j][2 * r + 1]);
          }
        }
    }
  }

  // Epilogue: every warp has finished reading sK (dQ product), so each warp stages its 16 rows of
  // dK (scaled) and dV in sK / sV and writes them with 16-byte stores.
  // With a RoPE table, dK (key row n0 + row_l, channel pair 4j + t) goes through RoPE's backward.
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row_l = key_w + g + r * 8;
    const bool rotate = p.rope != nullptr && n0 + row_l < T;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      float2 gk = make_float2(acc_dk[j][2 * r] * p.scale, acc_dk[j][2 * r + 1] * p.scale);
      if (rotate) gk = rope_backward_pair(p.rope, D / 2, n0 + row_l, 4 * j + t, gk.x, gk.y);
      *reinterpret_cast<uint32_t*>(sK + row_l * S + j * 8 + 2 * t) = pack_bf16(gk.x, gk.y);
      *reinterpret_cast<uint32_t*>(sV + row_l * S + j * 8 + 2 * t) =
          pack_bf16(acc_dv[j][2 * r], acc_dv[j][2 * r + 1]);
    }
  }
  __syncwarp();
  const int64_t ld_out = p.ld_dkv;
  const int64_t head_out = static_cast<int64_t>(b) * T * ld_out + static_cast<int64_t>(h) * D;
  bf16* dk = p.dk + head_out;
  bf16* dv = p.dv + head_out;
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int i = lane; i < 16 * kChunksPerRow; i += 32) {
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const int row = n0 + key_w + r;
    if (row < T) {
      *reinterpret_cast<uint4*>(dk + row * ld_out + c * 8) =
          *reinterpret_cast<const uint4*>(sK + (key_w + r) * S + c * 8);
      *reinterpret_cast<uint4*>(dv + row * ld_out + c * 8) =
          *reinterpret_cast<const uint4*>(sV + (key_w + r) * S + c * 8);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: dQ = scale * dQ_acc converted to bf16 (8 elements per thread).
// ---------------------------------------------------------------------------------------------
// acc: rows (b, t) of row_elems = H * dh floats (permuted: in the order of dq_acc_row_slot within
// each group of 8); dq: the rows in their natural order with stride ld_dq. With a RoPE table
// (BwdParams::rope) each channel pair goes through RoPE's backward after the scale.
template <int D>
__global__ void flash_bwd_convert_dq_kernel(const float* __restrict__ acc, bf16* __restrict__ dq,
                                            int64_t n8, int64_t row_elems, int64_t ld_dq,
                                            float scale, const float2* __restrict__ rope, int T,
                                            bool permuted) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const int64_t acc_row = 8 * i / row_elems;
  const int64_t col = 8 * i - acc_row * row_elems;
  const int64_t row =
      permuted ? (acc_row & ~int64_t{7}) | dq_acc_row_of_slot(static_cast<int>(acc_row & 7))
               : acc_row;
  const float4 a = reinterpret_cast<const float4*>(acc)[2 * i];
  const float4 c = reinterpret_cast<const float4*>(acc)[2 * i + 1];
  float g[8] = {a.x * scale, a.y * scale, a.z * scale, a.w * scale,
                c.x * scale, c.y * scale, c.z * scale, c.w * scale};
  if (rope != nullptr) {
    const int pos = static_cast<int>(row % T);
    const int pair0 = static_cast<int>(col % D) / 2;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 r = rope_backward_pair(rope, D / 2, pos, pair0 + j, g[2 * j], g[2 * j + 1]);
      g[2 * j] = r.x;
      g[2 * j + 1] = r.y;
    }
  }
  uint4 out;
  out.x = pack_bf16(g[0], g[1]);
  out.y = pack_bf16(g[2], g[3]);
  out.z = pack_bf16(g[4], g[5]);
  out.w = pack_bf16(g[6], g[7]);
  *reinterpret_cast<uint4*>(dq + row * ld_dq + col) = out;
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

template <int D>
void launch_forward(const FwdParams& p, int B, cudaStream_t stream) {
  using Cfg = FwdTraits<D>;
  launch_over_heads<flash_fwd_kernel<Cfg>>(p, B, Cfg::kBlockM, Cfg::kThreads, Cfg::kSmemBytes,
                                           stream, "flash_fwd_kernel");
}

template <int D>
void launch_backward(const BwdParams& p, const bf16* o, float* dsum, bf16* dq, int64_t ld_dq, int B,
                     bool wgmma, bool dq_acc_zeroed, cudaStream_t stream) {
  using Cfg = BwdTraits<D>;
  // The wgmma kernel may stage dQ without bank conflicts in permuted rows; the dot kernel zeroes
  // dq_acc whole and the rows stay within the sequence, so only the conversion needs to know.
  const bool permuted = wgmma && wgmma_backward_permutes_dq_rows(D, p.T);
  const int64_t rows = static_cast<int64_t>(B) * p.T * p.H;
  const int64_t elems = rows * D;
  {
    using Dot = DotConfig<D>;
    const auto blocks = static_cast<unsigned>((rows + Dot::kRows - 1) / Dot::kRows);
    launch_dependent(flash_bwd_dot_do_o_kernel<D>, dim3(blocks), dim3(Dot::kThreads), 0, stream, o,
                     p.dout, dsum, dq_acc_zeroed ? nullptr : p.dq_acc, B, p.T, p.H);
  }
  if (wgmma) {
    flash_wgmma_backward_main(p, B, D, stream);
  } else {
    launch_over_heads<flash_bwd_kernel<Cfg>>(p, B, Cfg::kBlockN, Cfg::kThreads, Cfg::kSmemBytes,
                                             stream, "flash_bwd_kernel");
  }
  {
    constexpr int kThreads = 256;
    const int64_t n8 = elems / 8;
    const auto blocks = static_cast<unsigned>((n8 + kThreads - 1) / kThreads);
    launch_dependent(flash_bwd_convert_dq_kernel<D>, dim3(blocks), dim3(kThreads), 0, stream,
                     p.dq_acc, dq, n8, static_cast<int64_t>(p.H) * D, ld_dq, p.scale, p.rope, p.T,
                     permuted);
  }
}

void check_common(int B, int T, int H, int head_dim, const char* what) {
  if (B <= 0 || T <= 0 || H <= 0)
    fail("{}: batch, sequence length and heads must be positive (got B={}, T={}, H={})", what, B, T,
         H);
  if (!flash_attention_supports(head_dim))
    fail("{}: head dim {} is not supported (supported: 16, 32, 64, 80, 128)", what, head_dim);
  // Query / key blocks of 64 rows or more run along grid.y (at most 65535 blocks).
  constexpr int kMaxT = 65535 * 64;
  if (T > kMaxT || static_cast<int64_t>(B) * H > (int64_t{1} << 31) - 1)
    fail("{}: shape B={}, T={}, H={} is too large (T <= {}, B*H < 2^31)", what, B, T, H, kMaxT);
}

#ifdef TRAINER_SM90A
// Compute capability exactly 9.0 (H100, H200): the only devices the sm_90a wgmma code runs on.
bool current_device_is_sm90() {
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error behind for the next CUDA_CHECK_LAUNCH
    return false;
  }
  return major == 9 && minor == 0;
}
#endif

}  // namespace
}  // namespace flash

bool flash_attention_supports(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 80 || head_dim == 128;
}

bool flash_attention_uses_wgmma(int head_dim) {
#ifdef TRAINER_SM90A
  return (head_dim == 64 || head_dim == 80 || head_dim == 128) && flash::current_device_is_sm90();
#else
  (void)head_dim;
  return false;
#endif
}

void flash_attention_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                             __nv_bfloat16* o, float* lse, int B, int T, int H, int head_dim,
                             cudaStream_t stream, FlashKernels kernels, FlashStrides strides) {
  constexpr const char* kWhat = "flash_attention_forward";
  flash::check_common(B, T, H, head_dim, kWhat);
  const int64_t ld_qkv = flash::row_stride(strides.qkv, H, head_dim, "strides.qkv", kWhat);
  flash::check_tensor(q, "q", kWhat, 16);
  flash::check_tensor(k, "k", kWhat, 16);
  flash::check_tensor(v, "v", kWhat, 16);
  flash::check_tensor(o, "o", kWhat, 16);
  flash::check_tensor(lse, "lse", kWhat, 4);
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const flash::FwdParams p{q, k, v, o, lse, T, H, scale, scale * flash::kLog2e, ld_qkv};
  if (kernels == FlashKernels::kAuto && flash_attention_uses_wgmma(head_dim)) {
    flash::flash_tma_forward(p, B, head_dim, stream, /*ping_pong=*/head_dim != 128);
    return;
  }
  switch (head_dim) {
    case 16:
      flash::launch_forward<16>(p, B, stream);
      break;
    case 32:
      flash::launch_forward<32>(p, B, stream);
      break;
    case 64:
      flash::launch_forward<64>(p, B, stream);
      break;
    case 80:
      flash::launch_forward<80>(p, B, stream);
      break;
    case 128:
      flash::launch_forward<128>(p, B, stream);
      break;
    default:
      flash::fail("{}: head dim {} is not supported", kWhat, head_dim);
  }
}

namespace flash {
namespace {
// The backward's workspace: the fp32 dQ accumulator (B, T, H, dh), then D (B, H, T).
size_t dq_acc_bytes(int B, int T, int H, int head_dim) {
  return round_up(static_cast<size_t>(B) * T * H * head_dim * sizeof(float), 256);
}
}  // namespace
}  // namespace flash

size_t flash_attention_backward_workspace_bytes(int B, int T, int H, int head_dim) {
  flash::check_common(B, T, H, head_dim, "flash_attention_backward_workspace_bytes");
  const size_t rows = static_cast<size_t>(B) * T * H;
  return flash::dq_acc_bytes(B, T, H, head_dim) + flash::round_up(rows * sizeof(float), 256);
}

void flash_attention_backward_clear(void* workspace, int B, int T, int H, int head_dim,
                                    cudaStream_t stream) {
  flash::check_common(B, T, H, head_dim, "flash_attention_backward_clear");
  flash::check_tensor(workspace, "workspace", "flash_attention_backward_clear", 16);
  CUDA_CHECK(cudaMemsetAsync(workspace, 0, flash::dq_acc_bytes(B, T, H, head_dim), stream));
}

void flash_attention_backward(const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const __nv_bfloat16* o,
                              const __nv_bfloat16* dout, const float* lse, __nv_bfloat16* dq,
                              __nv_bfloat16* dk, __nv_bfloat16* dv, void* workspace, int B, int T,
                              int H, int head_dim, cudaStream_t stream, FlashKernels kernels,
                              FlashStrides strides, const float* rope_table, bool dq_acc_zeroed) {
  constexpr const char* kWhat = "flash_attention_backward";
  flash::check_common(B, T, H, head_dim, kWhat);
  const int64_t ld_qkv = flash::row_stride(strides.qkv, H, head_dim, "strides.qkv", kWhat);
  const int64_t ld_dqkv = flash::row_stride(strides.dqkv, H, head_dim, "strides.dqkv", kWhat);
  flash::check_tensor(q, "q", kWhat, 16);
  flash::check_tensor(k, "k", kWhat, 16);
  flash::check_tensor(v, "v", kWhat, 16);
  flash::check_tensor(o, "o", kWhat, 16);
  flash::check_tensor(dout, "dout", kWhat, 16);
  flash::check_tensor(lse, "lse", kWhat, 4);
  flash::check_tensor(dq, "dq", kWhat, 16);
  flash::check_tensor(dk, "dk", kWhat, 16);
  flash::check_tensor(dv, "dv", kWhat, 16);
  flash::check_tensor(workspace, "workspace", kWhat, 16);
  if (rope_table != nullptr) flash::check_tensor(rope_table, "rope_table", kWhat, 8);
  float* dq_acc = static_cast<float*>(workspace);
  float* dsum = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                         flash::dq_acc_bytes(B, T, H, head_dim));
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const auto* rope = reinterpret_cast<const float2*>(rope_table);
  const flash::BwdParams p{
      q,      k,       v,   dout, lse, dsum, dq_acc, dk, dv, T, H, scale, scale * flash::kLog2e,
      ld_qkv, ld_dqkv, rope};
  const bool wgmma = kernels == FlashKernels::kAuto && flash_attention_uses_wgmma(head_dim);
  switch (head_dim) {
    case 16:
      flash::launch_backward<16>(p, o, dsum, dq, ld_dqkv, B, wgmma, dq_acc_zeroed, stream);
      break;
    case 32:
      flash::launch_backward<32>(p, o, dsum, dq, ld_dqkv, B, wgmma, dq_acc_zeroed, stream);
      break;
    case 64:
      flash::launch_backward<64>(p, o, dsum, dq, ld_dqkv, B, wgmma, dq_acc_zeroed, stream);
      break;
    case 80:
      flash::launch_backward<80>(p, o, dsum, dq, ld_dqkv, B, wgmma, dq_acc_zeroed, stream);
      break;
    case 128:
      flash::launch_backward<128>(p, o, dsum, dq, ld_dqkv, B, wgmma, dq_acc_zeroed, stream);
      break;
    default:
      flash::fail("{}: head dim {} is not supported", kWhat, head_dim);
  }
}

}  // namespace trainer::cuda
