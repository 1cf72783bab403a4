// Hopper (sm_90a) causal attention forward with a TMA producer warpgroup and pipelined
// warpgroup MMA: the FlashAttention-3 structure. Internal: called by flash_attention_forward
// (flash_attention.cu), which validates the arguments and decides when it runs. Same tensors and
// semantics as every forward: q, k, v, o bf16 (B, T, H*dh), lse fp32 (B, H, T).
#pragma once

#include <cuda_runtime.h>

#include "model/cuda/flash/launch.h"

namespace trainer::cuda::flash {

// p.o and p.lse are overwritten; work is queued on `stream` (no sync). head_dim 64, 80 or 128; q,
// k, v, o 16-byte aligned, lse 4-byte aligned; a compute capability 9.0 device and a build for
// sm_90a (elsewhere the kernel traps). Builds three TMA descriptors on the host per call.
// ping_pong: the two consumer warpgroups take turns issuing their products. One H200, B 4, H 16,
// T 1024-16384: 3-9% faster at head dims 64 and 80, -8% to +3% at 128; the dispatch uses it at 64
// and 80 (flash_attention.cu).
void flash_tma_forward(const FwdParams& p, int B, int head_dim, cudaStream_t stream,
                       bool ping_pong);

}  // namespace trainer::cuda::flash
