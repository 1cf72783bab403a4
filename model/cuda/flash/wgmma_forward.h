// Hopper (sm_90a) causal attention forward on warpgroup MMA (wgmma.mma_async). Internal: called by
// flash_attention_forward (flash_attention.cu), which validates the arguments and decides when
// this kernel runs (flash_attention_uses_wgmma). Same tensors and semantics: q, k, v, o bf16
// (B, T, H*dh) row-major with head h at columns [h*dh, (h+1)*dh); lse fp32 (B, H, T), the
// natural-log logsumexp of each row of S = q k^T / sqrt(dh) with keys j > i excluded.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "model/cuda/flash/launch.h"

namespace trainer::cuda::flash {

// p.o and p.lse are overwritten; work is queued on `stream` (no sync). head_dim 64 or 128; q, k,
// v, o 16-byte aligned, lse 4-byte aligned; a compute capability 9.0 device and a build for
// sm_90a (elsewhere the kernel traps).
void flash_wgmma_forward(const FwdParams& p, int B, int head_dim, cudaStream_t stream);

}  // namespace trainer::cuda::flash
