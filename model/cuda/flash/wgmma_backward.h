// Hopper (sm_90a) causal attention backward on warpgroup MMA (wgmma.mma_async): the main kernel
// only (dK, dV and the fp32 dQ accumulation). Internal: flash_attention_backward
// (flash_attention.cu) validates the arguments, zeroes dq_acc, computes D, runs this in place of
// its flash_bwd_kernel when flash_attention_uses_wgmma says so, and converts dq. Conventions:
//   q, k, v, dout: bf16 (B, T, H*dh) row-major, head h at columns [h*dh, (h+1)*dh);
//   lse: fp32 (B, H, T), natural-log logsumexp of the scaled, causally masked scores;
//   dsum: fp32 (B, H, T), D = rowsum(dO * O) (flash_bwd_dot_do_o_kernel);
//   dq_acc: fp32 (B, T, H, dh), zeroed before the call; receives dS K UNSCALED through fp32
//           TMA reductions (the caller then multiplies by 1/sqrt(dh) and converts to bf16), its
//           rows permuted (dq_acc_row_slot, launch.h) where wgmma_backward_permutes_dq_rows says
//           so;
//   dk = dS^T Q / sqrt(dh), dv = P^T dO: bf16 (B, T, H*dh), overwritten (rows < T only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "model/cuda/flash/launch.h"

namespace trainer::cuda::flash {

// Queues the main backward kernel on `stream` (no sync); p.scale = 1/sqrt(head_dim). head_dim 64,
// 80 or 128; q, k, v, dout, dk, dv, dq_acc 16-byte aligned; lse, dsum 4-byte; a
// compute capability 9.0 device and a build for sm_90a (elsewhere the kernel traps).
void flash_wgmma_backward_main(const BwdParams& p, int B, int head_dim, cudaStream_t stream);

// Whether the kernel for head_dim stages dQ in the permuted row order of dq_acc_row_slot
// (launch.h), given T: head dims 80 and 128 (free of bank conflicts, 4-9% faster), T a multiple
// of 8. Head dim 64 was 2-3% slower with it and keeps the natural order.
bool wgmma_backward_permutes_dq_rows(int head_dim, int T);

}  // namespace trainer::cuda::flash
