// Causal attention forward for Hopper (sm_90a) on warpgroup MMA (wgmma.mma_async):
// bf16 in, fp32 accumulation, head dims 64 and 128. Semantics as flash_attention_forward.
//
// Design (kept as simple as correctness allows; no producer warp, no TMA, no mbarriers):
//   * One CTA = 128 query rows of one (batch, head) = 2 warpgroups (256 threads), warpgroup w
//     owning rows [64w, 64w + 64) of the block. Grid (B*H, ceil(T/128)); blockIdx.y is reversed so
//     that the query blocks with the most key tiles (the last ones) are scheduled first.
//   * Keys in tiles of 128, visited from the diagonal tile down to tile 0 (tiles above the diagonal
//     are never touched). K and V tiles go through a 2-stage shared-memory ring filled with
//     cp.async by all 256 threads: while tile j is computed, tile j-1 is loaded into the other
//     stage; one __syncthreads per tile publishes the new tile and retires the old one.
//   * Q (128 x dh) stays in shared memory for the whole sweep and is wgmma's A operand of
//     S = Q K^T (m64n128k16, A and B K-major from shared memory, dh/16 instructions).
//   * Online softmax in fp32 on the S accumulator (exp2 with the scale folded in), then P is packed
//     to bf16 in registers and used as the register A operand of O += P V (m64n{dh}k16, 8
//     instructions, B = V MN-major with imm-trans-b = 1). The S accumulator layout of 16 adjacent
//     columns is exactly the A fragment layout (see wgmma.cuh), so no shuffles are needed.
//   * Every tile in shared memory is laid out with the 128-byte swizzle in 64-column panels
//     (wgmma.cuh); Q's rows of a warpgroup are reused at the end to stage its bf16 output for
//     coalesced 16-byte stores.
// Shared memory: Q 128*dh*2 + 2 stages * (K + V) 128*dh*2 each, + 1 KB to align the base to 1024:
// 81 KB (dh 64) / 161 KB (dh 128); 1 CTA (8 warps) per SM.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "model/cuda/flash/launch.h"
#include "model/cuda/flash/warp_mma.cuh"
#include "model/cuda/flash/wgmma.cuh"
#include "model/cuda/flash/wgmma_forward.h"

namespace trainer::cuda {
namespace flash::wgfwd {
namespace {

template <int kHeadDim_>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;  // query rows per CTA
  static constexpr int kBlockN = 128;  // keys per K/V tile
  static constexpr int kWarpgroups = kBlockM / 64;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one K or one V tile
  static constexpr int kSmemBytes = kQBytes + 4 * kTileBytes + 1024;
  static_assert(kHeadDim % 64 == 0, "tiles are whole 64-column swizzle panels");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N of S = Q K^T");
};

template <int D>
__global__ void __launch_bounds__(Config<D>::kThreads, 1)
    flash_wgmma_fwd_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Config<D>;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kKD = D / 16;        // k-chunks of S = Q K^T
  constexpr int kKN = BN / 16;       // k-chunks of O += P V
  constexpr int kSRegs = BN / 2;     // S accumulator floats per thread (64 x BN per warpgroup)
  constexpr int kORegs = D / 2;      // O accumulator floats per thread (64 x D per warpgroup)
  constexpr int kPanelQ = BM * 128;  // bytes of one 64-column panel of Q
  constexpr int kPanelKV = BN * 128;
  using MmaS = wg::Wgmma<BN>;
  using MmaO = wg::Wgmma<D>;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzle atoms must sit on 1024-byte boundaries of the shared address space; align by hand
  // (the launch asks for 1 KB of slack).
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t s_base = (raw_addr + 1023u) & ~1023u;
  unsigned char* const s_base_ptr = smem_raw + (s_base - raw_addr);
  const uint32_t sQ = s_base;
  const uint32_t sK = sQ + Cfg::kQBytes;         // stage s at sK + s * kTileBytes
  const uint32_t sV = sK + 2 * Cfg::kTileBytes;  // stage s at sV + s * kTileBytes

  const int tid = threadIdx.x;
  const int wgi = tid >> 7;    // warpgroup of this thread (0 or 1)
  const int wtid = tid & 127;  // thread within the warpgroup
  const int warp = wtid >> 5;  // warp within the warpgroup
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int T = p.T;
  const int bh = blockIdx.x;
  const int b = bh / p.H;
  const int h = bh % p.H;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int64_t ld = static_cast<int64_t>(p.H) * D;
  const int64_t head_off = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * D;
  const bf16* q = p.q + head_off;
  const bf16* k = p.k + head_off;
  const bf16* v = p.v + head_off;
  const int n_tiles = (min(m0 + BM, T) + BN - 1) / BN;
  const int row_wg = m0 + wgi * 64;          // first query row of this warpgroup
  const int row_t = row_wg + warp * 16 + g;  // this thread's rows: row_t and row_t + 8

  // Q and the diagonal K/V tile (stage 0) in one cp.async group.
  wg::load_tile_sw128<BM, D, kThreads>(sQ, q + m0 * ld, ld, T - m0, tid);
  {
    const int n0 = (n_tiles - 1) * BN;
    wg::load_tile_sw128<BN, D, kThreads>(sK, k + n0 * ld, ld, T - n0, tid);
    wg::load_tile_sw128<BN, D, kThreads>(sV, v + n0 * ld, ld, T - n0, tid);
  }
  cp_async_commit();

  // Descriptors (SW128, see wgmma.cuh). Q: this warpgroup's 64 rows, K-major, 8-row atoms 1024
  // bytes apart. K: 128 key rows, K-major, same strides. V: MN-major, LBO = distance between
  // 64-column panels (only used for dh 128), SBO = distance between 8-key groups.
  const uint64_t desc_q = wg::make_desc_sw128(sQ + wgi * 64 * 128, 16, 1024);
  const uint64_t desc_k = wg::make_desc_sw128(sK, 16, 1024);
  const uint64_t desc_v = wg::make_desc_sw128(sV, kPanelKV, 1024);

  float acc_o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of raw scores q.k (unscaled)
  float row_sum[2] = {0.f, 0.f};  // this thread's partial sum of p; quad-reduced at the end

  for (int it = 0; it < n_tiles; ++it) {
    const int n_tile = n_tiles - 1 - it;
    const int stage = it & 1;
    // This tile's K/V (and at it == 0 Q) landed for every thread; the fence hands the generic-
    // proxy writes to wgmma's async proxy; the barrier also guarantees that both warpgroups are
    // done with the other stage (their wgmma of the previous tile completed) before it is refilled.
    cp_async_wait<0>();
    wg::fence_proxy_async_shared();
    __syncthreads();
    if (n_tile > 0) {
      const int n0 = (n_tile - 1) * BN;
      const uint32_t off = (stage ^ 1) * Cfg::kTileBytes;
      wg::load_tile_sw128<BN, D, kThreads>(sK + off, k + n0 * ld, ld, T - n0, tid);
      wg::load_tile_sw128<BN, D, kThreads>(sV + off, v + n0 * ld, ld, T - n0, tid);
      cp_async_commit();
    }
    const int n0 = n_tile * BN;
    const uint32_t stage_off = stage * Cfg::kTileBytes;

    // S = Q K^T (raw dot products, fp32). k-chunk kk of dh lies in panel kk / 4 at byte
    // 32 * (kk % 4) of each row.
    float s[kSRegs];
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      const uint64_t da = wg::desc_advance(desc_q, wg::kmajor_chunk_offset<BM>(kk));
      const uint64_t db = wg::desc_advance(desc_k, stage_off + wg::kmajor_chunk_offset<BN>(kk));
      if (kk == 0) {
        MmaS::ss_overwrite(s, da, db);
      } else {
        MmaS::ss(s, da, db, 1);
      }
    }
    wg::commit_group();
    wg::wait_group<0>();
    wg::fence_operands(s);

    // Causal mask where some key of the tile lies beyond some row of this warpgroup (only the
    // diagonal tile here). Keys >= T (zero-filled) are beyond every row < T, so this masks them
    // too; rows >= T are computed on zeros and never stored.
    if (n0 + BN - 1 > row_wg) {
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_t + (e >> 1) * 8;
          const int col = n0 + i * 8 + 2 * t + (e & 1);
          if (col > row) s[4 * i + e] = -INFINITY;
        }
    }

    // Online softmax; row r of this thread (row_t + 8r) is spread over the 4 lanes of its quad,
    // elements s[4i + 2r], s[4i + 2r + 1].
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
        mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with nothing visible yet keeps max -inf; use 0 so that exp2(-inf - 0) = 0 instead
      // of exp2(-inf + inf) = NaN.
      const float m_use = mx == -INFINITY ? 0.f : mx;
      const float alpha = fast_exp2((row_max[r] - m_use) * p.scale_log2);
      row_max[r] = mx;
      const float m_scaled = m_use * p.scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const float pv = fast_exp2(fmaf(s[4 * i + e], p.scale_log2, -m_scaled));
          s[4 * i + e] = pv;
          sum += pv;
        }
      row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        acc_o[4 * i + 2 * r] *= alpha;
        acc_o[4 * i + 2 * r + 1] *= alpha;
      }
    }

    // P (bf16) as the register A operand: k-chunk kk = keys 16kk .. 16kk+15 = accumulator 8-column
    // blocks 2kk and 2kk+1 = s[8kk .. 8kk+7] (layout argument in wgmma.cuh).
    uint32_t pa[kKN][4];
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);  // row g,     keys 2t, 2t+1
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);  // row g + 8, keys 2t, 2t+1
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);  // row g,     keys 8+2t, 8+2t+1
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);  // row g + 8, keys 8+2t, 8+2t+1
#pragma unroll
      for (int e = 0; e < 4; ++e) wg::fence_operand(pa[kk][e]);
    }

    // O += P V. k-chunk kk = keys 16kk .. 16kk+15 = two 8-row atoms starting at row 16kk of every
    // V panel: start + 16kk * 128 bytes (1024-aligned).
    wg::fence_operands(acc_o);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk) {
      MmaO::rs_mn(acc_o, pa[kk], wg::desc_advance(desc_v, stage_off + wg::mnmajor_chunk_offset(kk)),
                  1);
    }
    wg::commit_group();
    wg::wait_group<0>();
    wg::fence_operands(acc_o);
  }

  // Epilogue. Normalise, write this warpgroup's bf16 rows into its own (no longer read) rows of the
  // Q tile in the same swizzled layout (4-byte stores; the 8 rows g of a warp hit 8 different
  // chunk positions, so the stores are conflict-free), then copy them out in 16-byte chunks.
  wg::fence_proxy_async_shared();  // wgmma's (async-proxy) reads of Q before the generic writes
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // Every row, tail rows included, sees key 0 unmasked, so l >= 1.
    const float inv = 1.f / l;
    const int row_l = wgi * 64 + warp * 16 + g + r * 8;  // row within the block
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      *reinterpret_cast<uint32_t*>(s_base_ptr + wg::sw128_offset<BM>(row_l, 8 * i + 2 * t)) =
          pack_bf16(acc_o[4 * i + 2 * r] * inv, acc_o[4 * i + 2 * r + 1] * inv);
    }
    const int row = m0 + row_l;
    if (t == 0 && row < T)
      p.lse[static_cast<int64_t>(bh) * T + row] = row_max[r] * p.scale + logf(l);
  }
  wg::named_barrier(1 + wgi, 128);  // this warpgroup's rows are staged
  bf16* o = p.o + head_off;
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int i = wtid; i < 64 * kChunksPerRow; i += 128) {
    const int r = i / kChunksPerRow;
    const int c = i % kChunksPerRow;
    const int row_l = wgi * 64 + r;
    const int row = m0 + row_l;
    if (row < T) {
      const uint32_t off = (c >> 3) * kPanelQ + wg::sw128_chunk_offset(row_l, c & 7);
      *reinterpret_cast<uint4*>(o + row * ld + c * 8) =
          *reinterpret_cast<const uint4*>(s_base_ptr + off);
    }
  }
#else
  // Built for an architecture without wgmma: never launched (flash_attention_uses_wgmma is false).
  __trap();
#endif
}

template <int D>
void launch(const FwdParams& p, int B, cudaStream_t stream) {
  using Cfg = Config<D>;
  launch_over_heads<flash_wgmma_fwd_kernel<D>>(p, B, Cfg::kBlockM, Cfg::kThreads, Cfg::kSmemBytes,
                                               stream, "flash_wgmma_fwd_kernel");
}

}  // namespace
}  // namespace flash::wgfwd

void flash::flash_wgmma_forward(const FwdParams& p, int B, int head_dim, cudaStream_t stream) {
  TRAINER_CHECK(head_dim == 64 || head_dim == 128, "wgmma forward: head dim {}", head_dim);
  if (head_dim == 64) {
    wgfwd::launch<64>(p, B, stream);
  } else {
    wgfwd::launch<128>(p, B, stream);
  }
}

}  // namespace trainer::cuda
