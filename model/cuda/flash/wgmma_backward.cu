// Causal attention backward for Hopper (sm_90a) on warpgroup MMA (wgmma.mma_async):
// the main kernel of the FlashAttention-2 backward (flash_bwd_kernel in flash_attention.cu) with
// the same inputs, outputs and conventions; see wgmma_backward.h. Head dims 64, 80 and 128.
//
// Notation for one (b, h): scale = 1/sqrt(dh), S = scale Q K^T (causal), P = exp(S - lse),
//   dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
//
// Design (the forward's structure, tma_forward.cu, with the backward's products):
//   * One persistent CTA per SM = 3 warpgroups (384 threads) works through key blocks of 128 keys
//     of one (batch, head), in the order of launch.h (head_order: heads in L2-sized groups, key
//     block 0, the most query tiles, first; PersistentSchedule: the next block from a device
//     counter). Warpgroups 0 and 1 are consumers: warpgroup w owns keys [64w, 64w + 64) of the
//     block and keeps their dK and dV (64 x dh fp32 each) in registers for the whole block (240
//     registers per thread after setmaxnreg). Warpgroup 2 is the producer (24 registers): one
//     thread issues the TMA loads, its warp copies lse and D.
//   * K and V of a block are loaded once, the next block's while the consumers write this one's
//     dK and dV. The CTA sweeps the query tiles of BM queries from the
//     one holding its first key to the end of the sequence (tiles entirely before the keys see
//     none of them and are skipped); Q, dO (TMA) and lse, D (the producer warp) of each tile go
//     into a 2-stage ring guarded by mbarriers: "full" completes when the bytes landed and the
//     producer warp arrived, "empty" when all 256 consumer threads released the stage.
//   * Per query tile, per warpgroup, transposed so that the warpgroup's keys are wgmma's M:
//       S^T  = K Q^T             SS, A = K (K-major), B = Q (K-major),  M 64, N BM, K dh
//       dP^T = V dO^T            SS, A = V, B = dO (both K-major),      M 64, N BM, K dh
//       P^T  = exp2(S^T scale log2e - lse log2e), 0 where key > query or query >= T
//       dS^T = P^T o (dP^T - D)
//       dV  += P^T dO            RS, A = P^T (registers, bf16), B = dO MN-major, M 64, N dh, K BM
//       dK  += dS^T Q            RS, A = dS^T (registers),      B = Q MN-major,  M 64, N dh, K BM
//     dS^T (bf16) also goes to shared memory (keys x queries, SW128, 2 buffers), then, after a
//     barrier of the two consumer warpgroups,
//       dQ_tile = dS K           SS, A = dS = (stored dS^T) read MN-major (imm-trans-a = 1),
//                                    B = K MN-major (keys x dh, imm-trans-b = 1), M 64, N 64, K 128
//     and each warpgroup stages its fp32 share in shared memory, from where one thread adds it to
//     dq_acc with a TMA reduction (cp.reduce.async.bulk.tensor, add): per-element atomics from
//     every thread cost about 30% of the kernel at long T. Staging and reductions together still
//     cost about 30% of it at head dim 128 (left out, wrong results: 15.5 against 22.1 ms at
//     T 16384), most of it the stores' place on each warpgroup's way to its next tile, not the
//     reductions themselves (docs/results/log.md, 2026-11-26 06:41). Head dims 80 and 128 store
//     the share's rows permuted within groups of 8, which makes the stores free of bank
//     conflicts (reduce_dq); dq_acc then holds its rows in that order.
//   * Head dims 80 and 128 (BM = 64) defer each tile's dQ product to the next tile's iteration
//     (the block's last one after its loop), so the two warpgroups never wait for each other
//     within a tile: dS^T has 3 buffers with "full" / "empty" mbarriers instead of the barrier
//     before dQ, and the warpgroups take turns issuing S^T and dP^T (named barriers 4 and 5,
//     ping-pong; head dim 80 also dV, dK and dQ), so that one's exponentials and dS^T run while
//     the other's products occupy the tensor cores. 1-4% faster than the barrier
//     (docs/results/log.md); head dim 64 (BM = 128) has no room for a third dS^T buffer and keeps
//     the barrier.
//   * The dQ tile (BM x dh) is split so that each warpgroup does one m64n64 product over all 128
//     keys: dh 128 (BM 64): warpgroup w takes dh columns [64w, 64w + 64) = K panel w (dh 80 the
//     same, K's panel 1 zero beyond column 80, and warpgroup 1's columns >= 80 not written back);
//     dh 64 (BM 128): warpgroup w takes queries [64w, 64w + 64) = dS^T panel w. Both halves need
//     the dS^T of both warpgroups, hence the barrier (which also keeps the warpgroups within one
//     tile of each other, so two dS^T buffers suffice) or, deferred, the "full" mbarriers.
//   * Tiles: dh 128 and 80 use BM = 64 (S^T and dP^T are 32 floats per thread each, dK + dV 128
//     or 80); tiles of dh 80 are stored as two 64-column panels, the second zero beyond column 80;
//     dh 64 uses BM = 128 (S^T, dP^T 64 each, dK + dV 64). Either way ~192 accumulator floats
//     per thread at the peak; ptxas -v: head dim 128 (deferred) spills 40 bytes, the others
//     nothing.
//   * Shared memory (bf16 tiles SW128 in 64-column panels, 1024-byte aligned, see wgmma.cuh):
//     K, V 128 x dh each; 2 stages of Q and dO (BM x dh); 2 (deferred: 3) dS^T buffers 128 x BM; 2
//     dQ shares 64 x 64 fp32 (SW128 panels of 32 columns); 2 stages of lse, D; 10 or 12 mbarriers;
//     the block index. dh 128: 209 KB (3 dS^T buffers) + 1 KB alignment slack; dh 64: 194 KB + 1
//     KB.
//   * Epilogue per block: dK (scaled) and dV are staged as bf16 over the dS^T and dQ buffers (no
//     longer read by the block; K and V are the next block's by then) and written out with
//     16-byte stores, rows >= T skipped.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "model/cuda/flash/launch.h"
#include "model/cuda/flash/tma.cuh"
#include "model/cuda/flash/warp_mma.cuh"
#include "model/cuda/flash/wgmma.cuh"
#include "model/cuda/flash/wgmma_backward.h"

namespace trainer::cuda {
namespace flash::wgbwd {
namespace {

// Built for another architecture, the kernel body is compiled out and nvcc would report the
// members only it uses as unreferenced (#177).
#pragma nv_diagnostic push
#pragma nv_diag_suppress 177
template <int kHeadDim_, int kBlockM_>
struct ConfigBase {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per tile
  // Deferred dQ with ping-pong turns (see the kernel), at BM = 64: a tile's dQ product runs in
  // the next tile's iteration, so the warpgroups need not meet within a tile, and they take turns
  // issuing S^T and dP^T. dS^T then needs 3 buffers, which BM = 128 has no room for.
  static constexpr bool kDeferDq = kBlockM == 64;
  static constexpr int kDsStages = kDeferDq ? 3 : 2;
  // Head dim 80 also takes turns issuing dV, dK and dQ: 8% faster at T = 2048, 1-2% at 16384; at
  // head dim 128 it spilled 108 bytes and was 16-30% slower.
  static constexpr bool kTurnsForDvDk = kDeferDq && kHeadDim == 80;
  // dQ staged in dq_acc_row_slot's row order (reduce_dq below) when T % 8 == 0: 8-9% faster at
  // head dim 80 and 4-5% at 128 (T = 16384), but 2-3% slower at head dim 64 (BM = 128), which
  // keeps the natural order (docs/results/log.md, 2026-11-26 07:59).
  static constexpr bool kPermuteDqRows = kDeferDq;
  static constexpr int kBlockN = 128;  // keys per CTA (64 per warpgroup)
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
  // Registers after the split (setmaxnreg) out of the 384 * 168 the CTA launches with.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // setmaxnreg.inc waits until the registers are free: the split must fit what the CTA launched
  // with, or the consumers never start.
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
                "register split within the launch's 168 per thread");
  static constexpr int kPanelKV = kBlockN * 128;  // bytes of one 64-column panel of K / V / dS^T
  static constexpr int kPanelQ = kBlockM * 128;   // bytes of one 64-column panel of Q / dO
  static constexpr int kPanels = (kHeadDim + 63) / 64;  // 64-column SW128 panels per row
  static constexpr int kTileKV = kBlockN * kPanels * 128;
  static constexpr int kTileQ = kBlockM * kPanels * 128;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kDqBytes = 64 * 64 * 4;  // one warpgroup's fp32 dQ share
  static constexpr int kDqPanel = 64 * 128;     // 32 fp32 columns of it (one SW128 panel)
  // Byte offsets from the 1024-aligned base. Q, dO, lse, D have 2 stages each (stage s at + s *
  // size), dS^T kDsStages.
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kTileKV;
  static constexpr int kOffQ = kOffV + kTileKV;
  static constexpr int kOffDO = kOffQ + 2 * kTileQ;
  static constexpr int kOffDS = kOffDO + 2 * kTileQ;
  static constexpr int kOffDQ = kOffDS + kDsStages * kDsBytes;  // warpgroup w at + w * kDqBytes
  static constexpr int kOffL = kOffDQ + 2 * kDqBytes;
  static constexpr int kOffD = kOffL + 2 * kBlockM * 4;
  static constexpr int kOffBar = kOffD + 2 * kBlockM * 4;
  // K/V full, K/V empty; query tile full x 2; query tile empty x 2; dS^T full x kDsStages, dS^T
  // empty x kDsStages (deferred dQ only)
  static constexpr int kBarriers = 6 + 2 * kDsStages;
  // The epilogue stages dK and dV (bf16, kTileKV each) from kOffDS on, over the dS^T and dQ
  // buffers, which the block no longer uses, so that the next block's K and V can load meanwhile.
  static constexpr int kOffStageDK = kOffDS;
  static constexpr int kOffStageDV = kOffDS + kTileKV;
  static_assert(2 * kTileKV <= kOffL - kOffDS, "dK and dV staging fit in the dS^T and dQ buffers");
  static constexpr int kOffItem = kOffBar + kBarriers * 8;  // the block K and V are for
  static constexpr int kSmemBytes = kOffItem + 8 + 1024;
  // dQ split: true = warpgroups take 64 query rows each (dS^T panel w, all dh = 64 columns);
  // false = warpgroups take 64 dh columns each (K panel w, all BM = 64 queries).
  static constexpr bool kDqSplitRows = kBlockM == 128;
  // Register-lean order of the per-tile work (see the kernel): the fp32 P^T dies once packed to
  // bf16 and dS^T uses that bf16 copy. Needed at BM = 128 to stay within the consumers' registers
  // beside dP^T, which runs while P^T is computed.
  static constexpr bool kEarlyP = kBlockM == 128;
  static_assert(kHeadDim % 16 == 0 && kBlockM % 64 == 0, "whole k-chunks, whole query panels");
  static_assert(kDqSplitRows ? (kHeadDim == 64) : (kBlockM == 64 && kPanels == 2),
                "each warpgroup's share of the dQ tile is one 64 x 64 block");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};
#pragma nv_diagnostic pop

template <int D>
struct Config;
template <>
struct Config<64> : ConfigBase<64, 128> {};
template <>
struct Config<80> : ConfigBase<80, 64> {};
template <>
struct Config<128> : ConfigBase<128, 64> {};

// Named barrier of the two consumer warpgroups (ids 1 and 2 are the epilogue's per-warpgroup ones).
constexpr int kConsumersBarrier = 3;

// The kernel's argument block: TMA descriptors of the four (B, T, H*dh) inputs (built per call on
// the host) and the common backward arguments.
struct Params {
  CUtensorMap q;
  CUtensorMap k;
  CUtensorMap v;
  CUtensorMap dout;
  CUtensorMap dq;  // the fp32 accumulator, 32-column boxes of 64 rows
  BwdParams f;
  HeadOrder order;
  PersistentSchedule sched;
  bool dq_rows_permuted;  // wgmma_backward_permutes_dq_rows (last: the other offsets stay put)
};

// The schedule's counters (launch.h).
__device__ unsigned g_schedule[kScheduleSlots][2];

template <int D>
__global__ void __launch_bounds__(Config<D>::kThreads, 1)
    flash_wgmma_bwd_kernel(const __grid_constant__ Params params) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (launch_kernel)
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Config<D>;
  constexpr bool kDeferDq = Cfg::kDeferDq;
  constexpr bool kPingPong = Cfg::kDeferDq;
  const BwdParams& p = params.f;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kKD = D / 16;      // k-chunks of S^T, dP^T (over dh)
  constexpr int kKM = BM / 16;     // k-chunks of dV, dK (over the tile's queries)
  constexpr int kKN = BN / 16;     // k-chunks of dQ (over the block's keys)
  constexpr int kSRegs = BM / 2;   // S^T / dP^T floats per thread (64 x BM per warpgroup)
  constexpr int kAccRegs = D / 2;  // dK / dV floats per thread (64 x dh per warpgroup)
  using MmaKV = wg::Wgmma<D>;
  using MmaQ = wg::Wgmma<64>;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t s_base = (raw_addr + 1023u) & ~1023u;
  unsigned char* const s_base_ptr = smem_raw + (s_base - raw_addr);
  const uint32_t sK = s_base + Cfg::kOffK;
  const uint32_t sV = s_base + Cfg::kOffV;
  const uint32_t sQ = s_base + Cfg::kOffQ;
  const uint32_t sdO = s_base + Cfg::kOffDO;
  const uint32_t sdS = s_base + Cfg::kOffDS;
  unsigned char* const sdS_ptr = s_base_ptr + Cfg::kOffDS;
  float* const sL = reinterpret_cast<float*>(s_base_ptr + Cfg::kOffL);
  float* const sDs = reinterpret_cast<float*>(s_base_ptr + Cfg::kOffD);

  const uint32_t bar_kv = s_base + Cfg::kOffBar;
  const uint32_t kv_empty = bar_kv + 8u;
  volatile int* const s_item = reinterpret_cast<volatile int*>(s_base_ptr + Cfg::kOffItem);
  auto q_full = [&](int stage) { return bar_kv + 8u * (2 + stage); };
  auto q_empty = [&](int stage) { return bar_kv + 8u * (4 + stage); };
  auto ds_full = [&](int buf) { return bar_kv + 8u * (6 + buf); };
  auto ds_empty = [&](int buf) { return bar_kv + 8u * (6 + Cfg::kDsStages + buf); };

  const int tid = threadIdx.x;
  const int T = p.T;
  const int m_end = (T + BM - 1) / BM;
  // Key block `item` of the schedule: its head and first key; its query tiles run from the first
  // one holding a query >= that key to m_end.
  struct Item : OrderedBlock {
    int n0, m_begin;
  };
  auto item_at = [&](int item) {
    Item it{head_order_block(params.order, item, p.H), 0, 0};
    it.n0 = it.rank * BN;  // rank 0: key block 0, the most query tiles
    it.m_begin = it.n0 / BM;
    return it;
  };

  if (tid == Cfg::kConsumerThreads) {
    tma::prefetch_map(&params.q);
    tma::prefetch_map(&params.k);
    tma::prefetch_map(&params.v);
    tma::prefetch_map(&params.dout);
    tma::prefetch_map(&params.dq);
    tma::barrier_init(bar_kv, 1);
    tma::barrier_init(kv_empty, Cfg::kConsumerThreads);
    for (int s = 0; s < 2; ++s) {
      tma::barrier_init(q_full(s), 1 + 32);  // the TMA bytes' arrival + the lse / D warp
      tma::barrier_init(q_empty(s), Cfg::kConsumerThreads);
    }
    for (int s = 0; s < Cfg::kDsStages; ++s) {
      tma::barrier_init(ds_full(s), Cfg::kConsumerThreads);
      tma::barrier_init(ds_empty(s), Cfg::kConsumerThreads);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (tid >= Cfg::kConsumerThreads) {
    wg::set_max_registers_dec<Cfg::kProducerRegs>();
    // Producer: its first warp. Lane 0 issues the TMA loads of K and V (once per key block) and
    // of Q and dO per query tile; all 32 lanes copy the tile's lse and D (rows >= T as 0) and then
    // arrive, so the tile's "full" barrier completes when both the bytes and the 32 arrivals are
    // in. The qt-th query tile of the CTA (blocks in schedule order) goes to stage qt % 2; from
    // qt = 2 on it waits for the consumers' release of that stage. A block's K and V wait for the
    // release of the block before's (after its last products), come with the block's index in
    // s_item, and are issued after its first query tile, so that both land while the consumers
    // write the block before's dK and dV. Index -1 (an arrival without bytes) tells them there is
    // no block left.
    if (tid < Cfg::kConsumerThreads + 32) {
      unsigned* const counters = g_schedule[params.sched.slot];
      const int lane = tid & 31;
      int qt = 0;
      int blocks_done = 0;
      for (int item = blockIdx.x; item < params.sched.items; ++blocks_done) {
        const Item blk = item_at(item);
        const float* lse = p.lse + static_cast<int64_t>(blk.bh) * T;
        const float* dsum = p.dsum + static_cast<int64_t>(blk.bh) * T;
        for (int m = blk.m_begin; m < m_end; ++m, ++qt) {
          const int stage = qt & 1;
          const int m0 = m * BM;
          if (qt >= 2) tma::wait(q_empty(stage), ((qt >> 1) - 1) & 1);
          if (lane == 0) {
            tma::arrive_expect_tx(q_full(stage), 2 * Cfg::kTileQ);
            tma::load_head_tile<BM, D>(sQ + stage * Cfg::kTileQ, &params.q, q_full(stage), blk.b,
                                       blk.h, m0);
            tma::load_head_tile<BM, D>(sdO + stage * Cfg::kTileQ, &params.dout, q_full(stage),
                                       blk.b, blk.h, m0);
          }
          for (int i = lane; i < BM; i += 32) {
            const bool valid = m0 + i < T;
            sL[stage * BM + i] = valid ? lse[m0 + i] : 0.f;
            sDs[stage * BM + i] = valid ? dsum[m0 + i] : 0.f;
          }
          tma::arrive(q_full(stage));
          if (m == blk.m_begin && lane == 0) {
            hand_over_block(kv_empty, blocks_done, s_item, item);
            tma::arrive_expect_tx(bar_kv, 2 * Cfg::kTileKV);
            tma::load_head_tile<BN, D>(sK, &params.k, bar_kv, blk.b, blk.h, blk.n0);
            tma::load_head_tile<BN, D>(sV, &params.v, bar_kv, blk.b, blk.h, blk.n0);
          }
          __syncwarp();
        }
        int next = 0;
        if (lane == 0) next = params.sched.claim(counters);
        item = __shfl_sync(0xffffffffu, next, 0);
      }
      if (lane == 0) {
        hand_over_block(kv_empty, blocks_done, s_item, -1);
        tma::arrive(bar_kv);
        params.sched.finish(counters);
      }
    }
    return;
  }

  // Consumers.
  wg::set_max_registers_inc<Cfg::kConsumerRegs>();
  const int wgi = tid >> 7;    // warpgroup (0 or 1)
  const int wtid = tid & 127;  // thread within the warpgroup
  const int warp = wtid >> 5;  // warp within the warpgroup
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t ld = p.ld_dkv;  // dk, dv rows
  unsigned char* const dq_buf = s_base_ptr + Cfg::kOffDQ + wgi * Cfg::kDqBytes;
  const uint32_t sdQ = s_base + Cfg::kOffDQ + wgi * Cfg::kDqBytes;
  const int key_l = wgi * 64 + warp * 16 + g;  // this thread's key rows in the block: key_l, +8

  // Descriptors (SW128, wgmma.cuh).
  //  K-major A of S^T / dP^T: this warpgroup's 64 key rows of K / V (row 64w starts at byte
  //    64w * 128 = 8 whole atoms in, so 1024-aligned), 8-row atoms 1024 bytes apart.
  //  K-major B of S^T / dP^T: the BM query rows of Q / dO (+ stage offset).
  //  MN-major B of dV / dK: dO / Q as (K = queries) x (N = dh), LBO = panel size (dh 128 spans two
  //    64-column panels), SBO = 1024 (8 query rows).
  //  dQ: A = dS^T tile as MN-major A (M = queries contiguous within a 128-byte row, K = keys at
  //    128 bytes); B = K as MN-major (N = dh contiguous, K = keys). Each warpgroup's 64 x 64 share
  //    starts at a panel boundary: dS^T panel w (query split) or K panel w (column split).
  const uint64_t desc_k = wg::make_desc_sw128(sK + wgi * 64 * 128, 16, 1024);
  const uint64_t desc_v = wg::make_desc_sw128(sV + wgi * 64 * 128, 16, 1024);
  const uint64_t desc_q = wg::make_desc_sw128(sQ, 16, 1024);
  const uint64_t desc_do = wg::make_desc_sw128(sdO, 16, 1024);
  const uint64_t desc_q_mn = wg::make_desc_sw128(sQ, Cfg::kPanelQ, 1024);
  const uint64_t desc_do_mn = wg::make_desc_sw128(sdO, Cfg::kPanelQ, 1024);
  const uint64_t desc_ds =
      wg::make_desc_sw128(sdS + (Cfg::kDqSplitRows ? wgi * Cfg::kPanelKV : 0), Cfg::kPanelKV, 1024);
  const uint64_t desc_k_mn =
      wg::make_desc_sw128(sK + (Cfg::kDqSplitRows ? 0 : wgi * Cfg::kPanelKV), Cfg::kPanelKV, 1024);
  // This warpgroup's share of the dQ tile: rows [dq_row0, +64), columns [dq_col0, +64).
  const int dq_row0 = Cfg::kDqSplitRows ? wgi * 64 : 0;
  const int dq_col0 = Cfg::kDqSplitRows ? 0 : wgi * 64;

  float acc_dk[kAccRegs];
  float acc_dv[kAccRegs];

  // dP^T = V dO^T (raw fp32), K-major A = V rows of this warpgroup, K-major B = dO.
  auto issue_dp = [&](float(&acc)[kSRegs], uint32_t q_off) {
    wg::ss_kmajor<kKD, BN, BM, BM>(acc, desc_v, wg::desc_advance(desc_do, q_off));
  };
  // dV += P^T dO. k-chunk kk = queries 16kk .. 16kk+15 = rows 16kk.. of every 64-column panel of
  // dO: + 16kk * 128 bytes (the same holds for Q in dK += dS^T Q).
  auto issue_dv = [&](const uint32_t(&a)[kKM][4], uint32_t q_off) {
#pragma unroll
    for (int kk = 0; kk < kKM; ++kk)
      MmaKV::rs_mn(acc_dv, a[kk],
                   wg::desc_advance(desc_do_mn, q_off + wg::mnmajor_chunk_offset(kk)), 1);
  };

  // dQ share of one tile = dS K over the block's 128 keys, from the dS^T buffer at ds_off. k-chunk
  // kk = keys 16kk .. 16kk+15 = rows 16kk.. of the dS^T panel and of the K panel: + 16kk * 128
  // bytes on both descriptors.
  auto issue_dq = [&](float(&dq)[32], uint32_t ds_off) {
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk) {
      const uint64_t da_desc = wg::desc_advance(desc_ds, ds_off + wg::mnmajor_chunk_offset(kk));
      const uint64_t db_desc = wg::desc_advance(desc_k_mn, wg::mnmajor_chunk_offset(kk));
      if (kk == 0) {
        MmaQ::ss_tt_overwrite(dq, da_desc, db_desc);
      } else {
        MmaQ::ss_tt(dq, da_desc, db_desc, 1);
      }
    }
  };
  // dq[4i + e] = dQ[m0 + dq_row0 + 16 warp + g + 8 (e >> 1)][dq_col0 + 8i + 2t + (e & 1)]. The
  // share goes to this warpgroup's buffer as two SW128 panels of 32 fp32 columns (16-byte chunk c
  // of row r at chunk position c ^ (r % 8)), and one thread adds it into dq_acc with a TMA
  // reduction, which leaves rows >= T out. Per-element atomics from every thread cost the kernel
  // about 30% here. Rows in their natural order would put each half-warp's float2 stores (rows
  // g = 0..3 or 4..7, two chunks per row) on 4 of the 8 chunk positions, a 2-way bank conflict;
  // so with T a multiple of 8 (wgmma_backward_permutes_dq_rows) row g of each 8-row group is at
  // row dq_acc_row_slot(g) = 2 (g % 4) + g / 4, whose swizzles 0, 2, 4, 6 (1, 3, 5, 7) spread the
  // half-warp over all 8, and dq_acc holds its rows in that order (convert_dq puts them back).
  // Head dim 64 keeps the natural order (see Config::kPermuteDqRows).
  const int dq_slot = Cfg::kPermuteDqRows && params.dq_rows_permuted ? dq_acc_row_slot(g) : g;
  auto reduce_dq = [&](const float(&dq)[32], int b, int h, int m0) {
    if (wtid == 0) tma::bulk_wait_group_read<0>();  // the previous tile's reduction read it
    wg::named_barrier(1 + wgi, 128);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + dq_slot + r * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int col = 8 * i + 2 * t;
        const uint32_t off = (col >> 5) * Cfg::kDqPanel + row * 128 +
                             ((((col & 31) >> 2) ^ (row & 7)) << 4) + (col & 3) * 4;
        *reinterpret_cast<float2*>(dq_buf + off) =
            make_float2(dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
      }
    }
    wg::fence_proxy_async_shared();
    wg::named_barrier(1 + wgi, 128);
    if (wtid == 0) {
      tma::reduce_add_4d(&params.dq, sdQ, dq_col0, h, m0 + dq_row0, b);
      if (dq_col0 + 32 < D)  // head dim 80: warpgroup 1's columns 96.. lie outside dQ
        tma::reduce_add_4d(&params.dq, sdQ + Cfg::kDqPanel, dq_col0 + 32, h, m0 + dq_row0, b);
      tma::bulk_commit_group();
    }
  };
  // Deferred dQ: the dS^T of the CTA's qt-th tile goes to buffer qt % 3; "full" completes when
  // all 256 consumer threads stored their part, "empty" when both warpgroups' dQ products that
  // read it completed. The u-th use of a buffer (u = qt / 3) is the u-th phase of both.
  auto ds_buf = [](int tile) { return tile % Cfg::kDsStages; };
  auto ds_parity = [](int tile) { return static_cast<uint32_t>((tile / Cfg::kDsStages) & 1); };

  // Ping-pong (kPingPong, named barriers 4 and 5): the two consumers take turns issuing S^T and
  // dP^T (head dim 80: and again dV, dK and dQ). Both take the same number of turns per query
  // tile, so the turns run on from block to block.
  const wg::Turns<kPingPong> turns{wgi, 4};
  turns.start();

  int qt = 0;  // query tiles so far (as the producer counts them)
  for (int blocks_done = 0;; ++blocks_done) {
    const int item = wait_for_block(bar_kv, blocks_done, s_item);
    if (item < 0) break;
    const Item blk = item_at(item);
    const int b = blk.b;
    const int h = blk.h;
    const int n0 = blk.n0;
    const int key_wg = n0 + wgi * 64;  // first key of this warpgroup
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) acc_dk[i] = acc_dv[i] = 0.f;
    // One query tile m (the CTA's qt-th); kWithDq: with a dQ product (deferred: the previous
    // tile's, so not in a block's first tile). Instantiated per case so that no wgmma group is in
    // flight across a branch (ptxas then serialises every wgmma of the kernel).
    auto tile = [&](int m, auto with_dq) {
      constexpr bool kWithDq = decltype(with_dq)::value;
      const int stage = qt & 1;
      const int m0 = m * BM;
      tma::wait(q_full(stage), (qt >> 1) & 1);
      const uint32_t q_off = stage * Cfg::kTileQ;
      // Not deferred, dS^T has two buffers: a warpgroup may write tile it + 1's while the other
      // still reads tile it's in its dQ product; the barrier before dQ keeps them within one tile
      // of each other.
      const uint32_t ds_off = (kDeferDq ? ds_buf(qt) : stage) * Cfg::kDsBytes;
      const float* sLs = sL + stage * BM;
      const float* sDss = sDs + stage * BM;

      float s[kSRegs];
      float dp[kSRegs];
      uint32_t pa[kKM][4];
      uint32_t da[kKM][4];
      const bool need_mask = (key_wg + 63 > m0) || (m0 + BM > T);
      const int key_rel = n0 + key_l - m0 - 2 * t;  // masked: 8i + (e & 1) - 8 (e >> 1) < key_rel
      const int q_lim = T - m0 - 2 * t;             // masked: 8i + (e & 1) >= q_lim

      // S^T = K Q^T (raw fp32 dot products).
      turns.take();
      wg::fence();
      wg::ss_kmajor<kKD, BN, BM, BM>(s, desc_k, wg::desc_advance(desc_q, q_off));
      wg::commit_group();
      // dP^T = V dO^T in its own group, running while P^T is computed.
      issue_dp(dp, q_off);
      wg::commit_group();
      turns.pass();
      wg::wait_group<1>();
      wg::fence_operands(s);
      // P^T. Accumulator element s[4i + e] is key key_l + 8 (e >> 1), query m0 + 8i + 2t + (e & 1)
      // (wgmma.cuh D layout with rows = keys, columns = queries). Masked: key > query (the causal
      // mask; keys >= T are beyond every query < T) and queries >= T (zero-filled Q rows would give
      // P = exp2(0 - 0) = 1 there).
#pragma unroll
      for (int i = 0; i < BM / 8; ++i) {
        const float2 l2 = *reinterpret_cast<const float2*>(sLs + i * 8 + 2 * t);
        const float lse2[2] = {l2.x * kLog2e, l2.y * kLog2e};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pv = fast_exp2(fmaf(s[4 * i + e], p.scale_log2, -lse2[e & 1]));
          if (need_mask) {
            // key = n0 + key_l + 8 (e >> 1), query = m0 + 8i + 2t + (e & 1), relative to 2t.
            const int qi = i * 8 + (e & 1);
            if (qi - (e >> 1) * 8 < key_rel || qi >= q_lim) pv = 0.f;
          }
          s[4 * i + e] = pv;
        }
      }

      // P^T and dS^T (bf16) as register A operands of dV / dK (M = keys, K = queries): k-chunk kk =
      // queries 16kk .. 16kk+15 = accumulator 8-column blocks 2kk and 2kk+1 = elements
      // [8kk, 8kk + 8). Packed as pairs (8kk + 2j, 8kk + 2j + 1), j = 0..3, they are
      //   j = 0: key row g,     queries 2t, 2t+1        = a[0]
      //   j = 1: key row g + 8, queries 2t, 2t+1        = a[1]
      //   j = 2: key row g,     queries 8 + 2t, 9 + 2t  = a[2]
      //   j = 3: key row g + 8, queries 8 + 2t, 9 + 2t  = a[3]
      // of the chunk, exactly the A-from-registers layout of wgmma.cuh (same argument as the
      // forward's P). No data moves between threads.
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) pa[kk][j] = pack_bf16(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
      }

      // dV += P^T dO goes with dK below, in one group: issued here, in a group of its own, it made
      // the kernel 25-35% slower at dh 64 and 1-3% slower at dh 128 (docs/results/log.md). In the
      // register-lean order (dh 64) the fp32 P^T dies here and dS^T reads the bf16 copy.
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) wg::fence_operand(pa[kk][j]);
      wg::wait_group<0>();  // dP^T done
      wg::fence_operands(dp);

      // dS^T = P^T o (dP^T - D), same element positions. In the register-lean order P^T is taken
      // back from its bf16 copy (the one dV uses), an extra relative rounding of at most 2^-9.
#pragma unroll
      for (int i = 0; i < BM / 8; ++i) {
        const float2 d2 = *reinterpret_cast<const float2*>(sDss + i * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          float p0, p1;
          if constexpr (Cfg::kEarlyP) {
            // Element 4i + e = 8 (i / 2) + 2j with j = 2 (i % 2) + e / 2.
            const float2 pf = unpack_bf16(pa[i >> 1][2 * (i & 1) + (e >> 1)]);
            p0 = pf.x;
            p1 = pf.y;
          } else {
            p0 = s[4 * i + e];
            p1 = s[4 * i + e + 1];
          }
          dp[4 * i + e] = p0 * (dp[4 * i + e] - d2.x);
          dp[4 * i + e + 1] = p1 * (dp[4 * i + e + 1] - d2.y);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          da[kk][j] = pack_bf16(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);

      // dS^T to shared memory for the dQ product: row = key (block-local), column = query
      // (tile-local), SW128 panels of 64 queries (panel size 128 rows * 128 bytes). Register j of
      // chunk kk holds key row key_l + 8 (j & 1), queries 16kk + 8 (j >> 1) + 2t, +1 (see above).
      // For one (kk, j) the warp's 8 rows g land in 8 different 16-byte chunk positions of their
      // 128-byte rows and t picks the 4-byte word: all 32 banks, no conflict. Deferred, the
      // buffer's previous tile must have been read by both warpgroups' dQ products first.
      if constexpr (kDeferDq)
        if (qt >= Cfg::kDsStages) tma::wait(ds_empty(ds_buf(qt)), ds_parity(qt) ^ 1);
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int row = key_l + 8 * (j & 1);
          const int col = 16 * kk + 8 * (j >> 1) + 2 * t;
          *reinterpret_cast<uint32_t*>(sdS_ptr + ds_off + wg::sw128_offset<BN>(row, col)) =
              da[kk][j];
        }
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wg::fence_operand(pa[kk][j]);
          wg::fence_operand(da[kk][j]);
        }
      // Publish dS^T (generic-proxy stores) to both warpgroups' wgmma (async proxy); the producer
      // does not take part.
      wg::fence_proxy_async_shared();
      if constexpr (kDeferDq) tma::arrive(ds_full(ds_buf(qt)));

      // dV += P^T dO and dK += dS^T Q, one group.
      if constexpr (Cfg::kTurnsForDvDk) turns.take();
      wg::fence_operands(acc_dk);
      wg::fence_operands(acc_dv);
      wg::fence();
      issue_dv(pa, q_off);
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
        MmaKV::rs_mn(acc_dk, da[kk],
                     wg::desc_advance(desc_q_mn, q_off + wg::mnmajor_chunk_offset(kk)), 1);
      wg::commit_group();

      // The dQ product: deferred, the previous tile's (both warpgroups stored its dS^T long
      // before, unless one runs ahead by a tile; waiting for that before dV and dK instead was
      // 1-4% slower); else this tile's, after both warpgroups stored theirs.
      float dq[32];
      const int dq_tile = kDeferDq ? qt - 1 : qt;
      if constexpr (kWithDq) {
        if constexpr (kDeferDq) {
          tma::wait(ds_full(ds_buf(dq_tile)), ds_parity(dq_tile));
        } else {
          wg::named_barrier(kConsumersBarrier, Cfg::kConsumerThreads);
        }
        issue_dq(dq, (kDeferDq ? ds_buf(dq_tile) : stage) * Cfg::kDsBytes);
        wg::commit_group();
      }
      if constexpr (Cfg::kTurnsForDvDk) turns.pass();
      wg::wait_group<0>();
      if constexpr (kWithDq) wg::fence_operands(dq);
      wg::fence_operands(acc_dv);
      wg::fence_operands(acc_dk);
#pragma unroll
      for (int kk = 0; kk < kKM; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wg::fence_operand(pa[kk][j]);
          wg::fence_operand(da[kk][j]);
        }
      // Every read of this stage (Q, dO by the products, lse and D) is done: release it.
      tma::arrive(q_empty(stage));
      if constexpr (kWithDq) {
        if constexpr (kDeferDq) tma::arrive(ds_empty(ds_buf(dq_tile)));
        reduce_dq(dq, b, h, kDeferDq ? m0 - BM : m0);
      }
    };
    int m = blk.m_begin;
    if constexpr (kDeferDq) {  // the block's first tile: no previous dQ
      tile(m++, std::false_type{});
      ++qt;
    }
    for (; m < m_end; ++m, ++qt) tile(m, std::true_type{});
    if constexpr (kDeferDq) {
      // The block's last tile's dQ (it reads K, so before the next block's K may load).
      const int dq_tile = qt - 1;
      float dq[32];
      tma::wait(ds_full(ds_buf(dq_tile)), ds_parity(dq_tile));
      wg::fence();
      issue_dq(dq, ds_buf(dq_tile) * Cfg::kDsBytes);
      wg::commit_group();
      wg::wait_group<0>();
      wg::fence_operands(dq);
      tma::arrive(ds_empty(ds_buf(dq_tile)));
      reduce_dq(dq, b, h, (m_end - 1) * BM);
    }

    // Both warpgroups' products of the block completed (each waited for its last dQ product, which
    // reads all of K): the producer may load the next block's K and V.
    tma::arrive(kv_empty);

    // With a RoPE table, dK (key n0 + row_l, channel pair 4i + t) goes through RoPE's backward,
    // here, before the barrier below, so that the table's loads overlap the wait.
    float dk_scale = p.scale;
    if (p.rope != nullptr) {
#pragma unroll
      for (int r2 = 0; r2 < 2; ++r2) {
        const int key = n0 + key_l + r2 * 8;
        if (key >= T) continue;  // not stored; the table may end at T
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          float* g = acc_dk + 4 * i + 2 * r2;
          const float2 r =
              rope_backward_pair(p.rope, D / 2, key, 4 * i + t, g[0] * p.scale, g[1] * p.scale);
          g[0] = r.x;
          g[1] = r.y;
        }
      }
      dk_scale = 1.f;
    }

    // Epilogue. Each warpgroup stages its 64 rows of dK (scaled) and dV as bf16 over the dS^T and
    // dQ buffers (SW128 panels of BN rows, as K and V: the 8 rows g of a warp hit 8 different chunk
    // positions, conflict-free), then copies them out in 16-byte chunks. The first barrier waits
    // for both warpgroups' last dQ products (async-proxy reads of dS^T, ordered before these
    // generic writes by the fence) and their last reductions' reads of the dQ buffers; the last
    // keeps the next block's dS^T and dQ writes behind both warpgroups' reads of the staged rows.
    if (wtid == 0) tma::bulk_wait_group_read<0>();
    wg::fence_proxy_async_shared();
    wg::named_barrier(kConsumersBarrier, Cfg::kConsumerThreads);
    unsigned char* const stage_dk = s_base_ptr + Cfg::kOffStageDK;
    unsigned char* const stage_dv = s_base_ptr + Cfg::kOffStageDV;
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int row_l = key_l + r2 * 8;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        const uint32_t off = wg::sw128_offset<BN>(row_l, 8 * i + 2 * t);
        *reinterpret_cast<uint32_t*>(stage_dk + off) =
            pack_bf16(acc_dk[4 * i + 2 * r2] * dk_scale, acc_dk[4 * i + 2 * r2 + 1] * dk_scale);
        *reinterpret_cast<uint32_t*>(stage_dv + off) =
            pack_bf16(acc_dv[4 * i + 2 * r2], acc_dv[4 * i + 2 * r2 + 1]);
      }
    }
    wg::named_barrier(1 + wgi, 128);  // this warpgroup's rows are staged
    const int64_t head_off = static_cast<int64_t>(b) * T * ld + static_cast<int64_t>(h) * D;
    wg::store_rows_sw128<BN, D>(p.dk + head_off + n0 * ld, ld, stage_dk, wgi * 64, T - n0, wtid);
    wg::store_rows_sw128<BN, D>(p.dv + head_off + n0 * ld, ld, stage_dv, wgi * 64, T - n0, wtid);
    wg::named_barrier(kConsumersBarrier, Cfg::kConsumerThreads);
  }
  turns.finish();
  if (wtid == 0) tma::bulk_wait_group<0>();  // the last reduction is done with shared memory
#else
  // Built for an architecture without wgmma: never launched (flash_attention_uses_wgmma is false).
  __trap();
#endif
}

template <int D>
void launch(const BwdParams& f, int B, cudaStream_t stream) {
  using Cfg = Config<D>;
  Params p;
  const int64_t ld_dout = static_cast<int64_t>(f.H) * D;
  p.q = tma::head_tile_map(f.q, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockM);
  p.dout = tma::head_tile_map(f.dout, B, f.T, f.H, D, ld_dout, Cfg::kBlockM);
  p.k = tma::head_tile_map(f.k, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockN);
  p.v = tma::head_tile_map(f.v, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockN);
  p.dq = tma::head_tile_map_f32(f.dq_acc, B, f.T, f.H, D, 64);
  p.f = f;
  p.dq_rows_permuted = wgmma_backward_permutes_dq_rows(D, f.T);
  // The working set of a head: its fp32 dQ accumulator (read-modify-written by every key block),
  // Q and dO.
  p.order = head_order(B, f.H, f.T, Cfg::kBlockN, D * 4 + 2 * D * 2, "flash attention backward");
  p.sched = persistent_schedule(p.order);
  launch_kernel<flash_wgmma_bwd_kernel<D>>(p, static_cast<unsigned>(p.sched.ctas), Cfg::kThreads,
                                           Cfg::kSmemBytes, stream, "flash_wgmma_bwd_kernel");
}

}  // namespace
}  // namespace flash::wgbwd

bool flash::wgmma_backward_permutes_dq_rows(int head_dim, int T) {
  const bool permutes = head_dim == 64    ? wgbwd::Config<64>::kPermuteDqRows
                        : head_dim == 80  ? wgbwd::Config<80>::kPermuteDqRows
                        : head_dim == 128 ? wgbwd::Config<128>::kPermuteDqRows
                                          : false;
  return permutes && T % 8 == 0;
}

void flash::flash_wgmma_backward_main(const BwdParams& p, int B, int head_dim,
                                      cudaStream_t stream) {
  TRAINER_CHECK(head_dim == 64 || head_dim == 80 || head_dim == 128, "wgmma backward: head dim {}",
                head_dim);
  if (head_dim == 64) {
    wgbwd::launch<64>(p, B, stream);
  } else if (head_dim == 80) {
    wgbwd::launch<80>(p, B, stream);
  } else {
    wgbwd::launch<128>(p, B, stream);
  }
}

}  // namespace trainer::cuda
