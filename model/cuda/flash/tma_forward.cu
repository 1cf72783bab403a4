// Causal attention forward for Hopper (sm_90a): a TMA producer warpgroup feeding two consumer
// warpgroups through mbarrier rings, each consumer overlapping its softmax with the tensor cores
// (FlashAttention-3, Shah et al. 2024, sections 3.1-3.2). Semantics as flash_attention_forward;
// wgmma layouts and the SW128 tile format as in wgmma.cuh. Head dims 64, 80 and 128.
//
// Roles (384 threads, one persistent CTA per SM working through blocks of 128 query rows in the
// order of launch.h: head_order puts heads in L2-sized groups and the query blocks with the most
// keys first; PersistentSchedule hands each CTA its next block from a device counter):
//   * Warpgroup 2, one thread: the producer. Per block, issues one TMA load of Q (128 x dh) and
//     then, for the key tiles from the diagonal down to tile 0, K and V tiles (128 x dh each) into
//     2-stage rings, each stage guarded by a "full" barrier (the copy engine counts the bytes in)
//     and an "empty" barrier (every consumer thread arrives once it no longer reads the stage).
//     The rings and the Q buffer run on from block to block, so the next block's Q and first K/V
//     tiles land while the consumers finish a block and write its O. It never computes, and it
//     gives most of its registers to the consumers (setmaxnreg).
//   * Warpgroups 0 and 1: consumers, 64 query rows each, no CTA-wide barrier after start-up. With
//     kPingPong they take turns issuing their products (named barriers 3 and 4), so one's softmax
//     runs while the other's products occupy the tensor cores; without, they drift freely.
//
// One consumer's pipeline per block (S_j = Q K_j^T, P_j = exp(S_j - m_j), row max m_j, tiles in
// visit order, j = 0 the diagonal):
//     S_0; softmax_0
//     for j = 1 ..: issue S_j, issue O += P_{j-1} V_{j-1}; wait for S_j; softmax_j (while the
//                   tensor cores run P_{j-1} V_{j-1}); wait for O; O *= exp(m_{j-1} - m_j)
//     release Q; O += P_last V_last; O / rowsum to the O buffer, then to global memory
// The rescale waits for the product in flight because that product accumulates into O at the
// old maximum. Registers at the peak: O (dh/2 floats), S_j (64 floats), P_{j-1} (32 words).
//
// Shared memory: Q 128*dh*2, K and V 2 stages of 128*dh*2 each, the O buffer 128*dh*2 (dh
// rounded up to whole 64-column panels: head dim 80 uses two, the second zero beyond column 80),
// 10 barriers, + 1 KB to align the base to 1024: 97 KB (dh 64) / 193 KB (dh 80, 128).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "model/cuda/flash/launch.h"
#include "model/cuda/flash/tma.cuh"
#include "model/cuda/flash/tma_forward.h"
#include "model/cuda/flash/warp_mma.cuh"
#include "model/cuda/flash/wgmma.cuh"

namespace trainer::cuda {
namespace flash::tmafwd {
namespace {

// The kernel's argument block: the three TMA descriptors (built per call on the host) and the
// common forward arguments.
struct Params {
  CUtensorMap q;
  CUtensorMap k;
  CUtensorMap v;
  FwdParams f;
  HeadOrder order;
  PersistentSchedule sched;
};

#pragma nv_diagnostic push
#pragma nv_diag_suppress 177  // members only the sm_90a kernel body uses
template <int kHeadDim_>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;  // query rows per CTA
  static constexpr int kBlockN = 128;  // keys per K/V tile
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kConsumerThreads = kConsumers * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
  // Registers per thread after the split (setmaxnreg): the producer gives back what the consumers
  // take; 128 * 24 + 256 * 240 = 64512 of the SM's 65536. At launch every thread has
  // 65536 / 384 = 168.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kStages = 2;
  static constexpr int kPanels = (kHeadDim + 63) / 64;  // 64-column SW128 panels per row
  static constexpr int kQBytes = kBlockM * kPanels * 128;
  static constexpr int kTileBytes = kBlockN * kPanels * 128;  // one K or one V tile
  static constexpr int kOffK = kQBytes;                       // stage s at + s * kTileBytes
  static constexpr int kOffV = kOffK + kStages * kTileBytes;
  static constexpr int kOffO = kOffV + kStages * kTileBytes;  // the epilogue's bf16 O rows
  static constexpr int kOffBar = kOffO + kQBytes;
  // Q full, Q empty; K full, K empty, V full, V empty per stage
  static constexpr int kBarriers = 2 + 4 * kStages;
  static constexpr int kOffItem = kOffBar + kBarriers * 8;  // the block the Q buffer is for
  static constexpr int kSmemBytes = kOffItem + 8 + 1024;
  static_assert(kHeadDim % 16 == 0, "whole k-chunks of S = Q K^T and wgmma N of O += P V");
  static_assert(kBlockM == kBlockN, "only the first (diagonal) tile needs the causal mask");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};
#pragma nv_diagnostic pop

// The schedule's counters (launch.h).
__device__ unsigned g_schedule[kScheduleSlots][2];

template <int D, bool kPingPong>
__global__ void __launch_bounds__(Config<D>::kThreads, 1)
    flash_tma_fwd_kernel(const __grid_constant__ Params p) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (launch_kernel)
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Config<D>;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKD = D / 16;     // k-chunks of S = Q K^T
  constexpr int kKN = BN / 16;    // k-chunks of O += P V
  constexpr int kSRegs = BN / 2;  // S accumulator floats per thread
  constexpr int kORegs = D / 2;   // O accumulator floats per thread
  constexpr int kPanelKV = BN * 128;
  using MmaO = wg::Wgmma<D>;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t s_base = (raw_addr + 1023u) & ~1023u;  // SW128 atoms on 1024-byte boundaries
  unsigned char* const s_base_ptr = smem_raw + (s_base - raw_addr);
  const uint32_t sQ = s_base;
  const uint32_t sK = s_base + Cfg::kOffK;
  const uint32_t sV = s_base + Cfg::kOffV;
  const uint32_t bar_q = s_base + Cfg::kOffBar;
  const uint32_t q_empty = bar_q + 8u;
  volatile int* const s_item = reinterpret_cast<volatile int*>(s_base_ptr + Cfg::kOffItem);
  auto k_full = [&](int s) { return bar_q + 8u * (2 + s); };
  auto k_empty = [&](int s) { return bar_q + 8u * (2 + kStages + s); };
  auto v_full = [&](int s) { return bar_q + 8u * (2 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return bar_q + 8u * (2 + 3 * kStages + s); };
  // The ring stage of the kv-th K or V tile this CTA passes through, and the parity of that use.
  auto stage_of = [](int kv) { return kv % kStages; };
  auto parity_of = [](int kv) { return static_cast<uint32_t>((kv / kStages) & 1); };

  const int tid = threadIdx.x;
  const int T = p.f.T;
  // Block `item` of the schedule: its head, first query row and number of key tiles.
  struct Item : OrderedBlock {
    int m0, n_tiles;
  };
  auto item_at = [&](int item) {
    Item it{head_order_block(p.order, item, p.f.H), 0, 0};
    it.m0 = (p.order.blocks - 1 - it.rank) * BM;  // rank 0: the last rows, the most keys
    it.n_tiles = (min(it.m0 + BM, T) + BN - 1) / BN;
    return it;
  };

  if (tid == Cfg::kConsumerThreads) {
    tma::prefetch_map(&p.q);
    tma::prefetch_map(&p.k);
    tma::prefetch_map(&p.v);
    tma::barrier_init(bar_q, 1);
    tma::barrier_init(q_empty, Cfg::kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(k_full(s), 1);
      tma::barrier_init(v_full(s), 1);
      tma::barrier_init(k_empty(s), Cfg::kConsumerThreads);
      tma::barrier_init(v_empty(s), Cfg::kConsumerThreads);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (tid >= Cfg::kConsumerThreads) {
    wg::set_max_registers_dec<Cfg::kProducerRegs>();
    // Producer. The kv-th K/V tile of the CTA (blocks in schedule order, tiles in visit order)
    // goes to stage kv % kStages; from its second use on, a stage waits for the consumers' release
    // of the use before. A block's Q waits for the release of the block before's, which the
    // consumers give after their last S, and comes with the block's index in s_item; all three
    // land while the consumers finish the block before. Index -1 (an arrival without bytes) tells
    // them there is no block left.
    if (tid == Cfg::kConsumerThreads) {
      unsigned* const counters = g_schedule[p.sched.slot];
      int kv = 0;
      int blocks_done = 0;
      for (int item = blockIdx.x; item < p.sched.items; ++blocks_done) {
        const Item it = item_at(item);
        for (int j = 0; j < it.n_tiles; ++j, ++kv) {
          const int s = stage_of(kv);
          const int n0 = (it.n_tiles - 1 - j) * BN;
          if (kv >= kStages) tma::wait(k_empty(s), parity_of(kv) ^ 1);
          tma::arrive_expect_tx(k_full(s), Cfg::kTileBytes);
          tma::load_head_tile<BN, D>(sK + s * Cfg::kTileBytes, &p.k, k_full(s), it.b, it.h, n0);
          if (kv >= kStages) tma::wait(v_empty(s), parity_of(kv) ^ 1);
          tma::arrive_expect_tx(v_full(s), Cfg::kTileBytes);
          tma::load_head_tile<BN, D>(sV + s * Cfg::kTileBytes, &p.v, v_full(s), it.b, it.h, n0);
          if (j == 0) {
            hand_over_block(q_empty, blocks_done, s_item, item);
            tma::arrive_expect_tx(bar_q, Cfg::kQBytes);
            tma::load_head_tile<BM, D>(sQ, &p.q, bar_q, it.b, it.h, it.m0);
          }
        }
        item = p.sched.claim(counters);
      }
      hand_over_block(q_empty, blocks_done, s_item, -1);
      tma::arrive(bar_q);
      p.sched.finish(counters);
    }
    return;
  }

  // Consumers.
  wg::set_max_registers_inc<Cfg::kConsumerRegs>();
  const int wgi = tid >> 7;    // warpgroup: query rows [64 wgi, 64 wgi + 64) of the block
  const int wtid = tid & 127;  // thread within the warpgroup
  const int warp = wtid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row_w = wgi * 64 + warp * 16 + g;  // this thread's rows in the block: row_w, row_w + 8
  const float scale_log2 = p.f.scale_log2;

  // Descriptors (SW128, wgmma.cuh): Q's 64 rows of this warpgroup and K, K-major, 8-row atoms
  // 1024 bytes apart; V MN-major, LBO = the distance between 64-column panels.
  const uint64_t desc_q = wg::make_desc_sw128(sQ + wgi * 64 * 128, 16, 1024);
  const uint64_t desc_k = wg::make_desc_sw128(sK, 16, 1024);
  const uint64_t desc_v = wg::make_desc_sw128(sV, kPanelKV, 1024);

  float acc_o[kORegs];
  float row_max[2];     // running max of raw scores q.k (unscaled)
  float row_sum[2];     // this thread's partial sum of p; quad-reduced at the end
  float s[kSRegs];      // S_j, then P_j in fp32
  uint32_t pa[kKN][4];  // P_{j-1} in bf16: the register A operand of O += P V

  // S = Q K^T of the tile in `stage` (raw dot products, fp32).
  auto issue_s = [&](int stage) {
    wg::fence();
    wg::ss_kmajor<kKD, BM, BN, BN>(s, desc_q, wg::desc_advance(desc_k, stage * Cfg::kTileBytes));
    wg::commit_group();
  };
  // O += P V with V in `stage`: k-chunk kk = keys 16kk .. 16kk+15 = rows 16kk.. of every V panel.
  auto issue_pv = [&](int stage) {
    const uint32_t off = stage * Cfg::kTileBytes;
    wg::fence_operands(acc_o);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk)
      MmaO::rs_mn(acc_o, pa[kk], wg::desc_advance(desc_v, off + wg::mnmajor_chunk_offset(kk)), 1);
    wg::commit_group();
  };
  // Online softmax of s in place (s becomes P, unnormalised); alpha[r] = exp(m_old - m_new) for
  // this thread's row r (row_w + 8r), whose elements s[4i + 2r], s[4i + 2r + 1] it shares with
  // the 3 other lanes of its quad. The diagonal tile comes first and shows every row its key m0,
  // so the maximum is finite from the first tile on.
  auto softmax = [&](float(&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
        mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      alpha[r] = fast_exp2((row_max[r] - mx) * scale_log2);  // 0 on the first tile
      row_max[r] = mx;
      const float m_scaled = mx * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const float pv = fast_exp2(fmaf(s[4 * i + e], scale_log2, -m_scaled));
          s[4 * i + e] = pv;
          sum += pv;
        }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  };
  // P to bf16 A fragments: k-chunk kk = accumulator columns 16kk..16kk+15 = s[8kk .. 8kk+7]
  // (layout argument in wgmma.cuh).
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pa[kk][j] = pack_bf16(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
        wg::fence_operand(pa[kk][j]);
      }
    }
  };

  // Ping-pong (kPingPong, named barriers 3 and 4): the two consumers take turns issuing their
  // products. The turns run on from block to block (both warpgroups take the same number per
  // block).
  const wg::Turns<kPingPong> turns{wgi, 3};
  turns.start();

  int kv = 0;  // K/V tiles passed through the rings so far (as the producer counts them)
  for (int blocks_done = 0;; ++blocks_done) {
    const int item = wait_for_block(bar_q, blocks_done, s_item);
    if (item < 0) break;
    const Item it = item_at(item);
    const int m0 = it.m0;
    const int n_tiles = it.n_tiles;
#pragma unroll
    for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    // Tile 0, the diagonal: S, the causal mask (keys >= T, zero-filled, lie beyond every row < T;
    // rows >= T are computed on zeros and never stored), softmax. O is still zero: no rescale.
    {
      const int sk = stage_of(kv);
      tma::wait(k_full(sk), parity_of(kv));
      turns.take();
      issue_s(sk);
      turns.pass();
      wg::wait_group<0>();
      wg::fence_operands(s);
      tma::arrive(k_empty(sk));
      const int n0 = (n_tiles - 1) * BN;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + row_w + (e >> 1) * 8;
          const int col = n0 + i * 8 + 2 * t + (e & 1);
          if (col > row) s[4 * i + e] = -INFINITY;
        }
      float alpha[2];
      softmax(alpha);
      pack_p();
    }

    // Tiles 1 .. n_tiles - 1 lie wholly below the diagonal: no mask.
    for (int j = 1; j < n_tiles; ++j) {
      const int sk = stage_of(kv + j);
      const int sv = stage_of(kv + j - 1);
      tma::wait(k_full(sk), parity_of(kv + j));
      turns.take();
      issue_s(sk);
      tma::wait(v_full(sv), parity_of(kv + j - 1));
      issue_pv(sv);
      turns.pass();
      wg::wait_group<1>();  // S_j done, P_{j-1} V_{j-1} may still run
      wg::fence_operands(s);
      tma::arrive(k_empty(sk));
      float alpha[2];
      softmax(alpha);
      wg::wait_group<0>();
      wg::fence_operands(acc_o);
      tma::arrive(v_empty(sv));
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        acc_o[4 * i + 0] *= alpha[0];
        acc_o[4 * i + 1] *= alpha[0];
        acc_o[4 * i + 2] *= alpha[1];
        acc_o[4 * i + 3] *= alpha[1];
      }
      pack_p();
    }
    tma::arrive(q_empty);  // every S of the block is done: the producer may load the next Q
    {
      const int sv = stage_of(kv + n_tiles - 1);
      tma::wait(v_full(sv), parity_of(kv + n_tiles - 1));
      turns.take();
      issue_pv(sv);
      turns.pass();
      wg::wait_group<0>();
      wg::fence_operands(acc_o);
      tma::arrive(v_empty(sv));
    }
    kv += n_tiles;

    // Epilogue: normalise, stage this warpgroup's bf16 rows in its rows of the O buffer, then
    // 16-byte coalesced stores. The first barrier keeps the warpgroup's stores of the block
    // before from reading rows this one overwrites.
    wg::named_barrier(1 + wgi, 128);
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      float l = row_sum[r2];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = 1.f / l;         // l >= 1: the row's maximum contributes exp(0)
      const int row_l = row_w + r2 * 8;  // row within the block
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        *reinterpret_cast<uint32_t*>(s_base_ptr + Cfg::kOffO +
                                     wg::sw128_offset<BM>(row_l, 8 * i + 2 * t)) =
            pack_bf16(acc_o[4 * i + 2 * r2] * inv, acc_o[4 * i + 2 * r2 + 1] * inv);
      }
      const int row = m0 + row_l;
      if (t == 0 && row < T)
        p.f.lse[static_cast<int64_t>(it.bh) * T + row] = row_max[r2] * p.f.scale + logf(l);
    }
    wg::named_barrier(1 + wgi, 128);  // this warpgroup's rows are staged
    const int64_t ld = static_cast<int64_t>(p.f.H) * D;
    bf16* o = p.f.o + (static_cast<int64_t>(it.b) * T + m0) * ld + static_cast<int64_t>(it.h) * D;
    wg::store_rows_sw128<BM, D>(o, ld, s_base_ptr + Cfg::kOffO, wgi * 64, T - m0, wtid);
  }
  turns.finish();
#else
  // Built for an architecture without TMA and wgmma: never launched.
  __trap();
#endif
}

template <int D, bool kPingPong>
void launch(const FwdParams& f, int B, cudaStream_t stream) {
  using Cfg = Config<D>;
  Params p;
  p.q = tma::head_tile_map(f.q, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockM);
  p.k = tma::head_tile_map(f.k, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockN);
  p.v = tma::head_tile_map(f.v, B, f.T, f.H, D, f.ld_qkv, Cfg::kBlockN);
  p.f = f;
  // The working set of a head: its K and V.
  p.order = head_order(B, f.H, f.T, Cfg::kBlockM, 2 * D * 2, "flash attention forward");
  p.sched = persistent_schedule(p.order);
  launch_kernel<flash_tma_fwd_kernel<D, kPingPong>>(p, static_cast<unsigned>(p.sched.ctas),
                                                    Cfg::kThreads, Cfg::kSmemBytes, stream,
                                                    "flash_tma_fwd_kernel");
}

}  // namespace
}  // namespace flash::tmafwd

void flash::flash_tma_forward(const FwdParams& p, int B, int head_dim, cudaStream_t stream,
                              bool ping_pong) {
  TRAINER_CHECK(head_dim == 64 || head_dim == 80 || head_dim == 128, "TMA forward: head dim {}",
                head_dim);
  auto run = [&](auto pp) {
    constexpr bool kPingPong = decltype(pp)::value;
    if (head_dim == 64) {
      tmafwd::launch<64, kPingPong>(p, B, stream);
    } else if (head_dim == 80) {
      tmafwd::launch<80, kPingPong>(p, B, stream);
    } else {
      tmafwd::launch<128, kPingPong>(p, B, stream);
    }
  };
  if (ping_pong) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

}  // namespace trainer::cuda
