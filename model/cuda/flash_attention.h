// FlashAttention-2 style causal attention for bf16 on tensor cores.
//
// q, k, v, o, dO, dq, dk, dv: bf16 in the (B, T, d) layout the rest of the model produces, with
// head h at columns [h*dh, (h+1)*dh) (row stride d = H*dh). lse: fp32 (B, H, T), the natural-log
// logsumexp of each query row of the scaled, masked scores S = q k^T / sqrt(dh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace trainer::cuda {

// True for the head dimensions the kernels are built for (16, 32, 64, 80, 128).
bool flash_attention_supports(int head_dim);

// o and lse are overwritten; lse feeds the backward. Work is queued on `stream` (no sync).
void flash_attention_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                             __nv_bfloat16* o, float* lse, int B, int T, int H, int head_dim,
                             cudaStream_t stream);

// Scratch the backward needs: an fp32 dq accumulator (B*T*H*dh floats) and D = rowsum(dO * O)
// (B*H*T floats), each rounded up to 256 bytes.
size_t flash_attention_backward_workspace_bytes(int B, int T, int H, int head_dim);

// dq, dk, dv are overwritten. `workspace` holds at least the bytes asked for above; its contents
// need not be initialised (the backward clears what it uses). dk and dv are bitwise
// deterministic; dq is summed over key blocks with fp32 atomics, so its last bits may vary from
// run to run. All pointers 16-byte aligned (lse: 4), head_dim as flash_attention_supports().
void flash_attention_backward(const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const __nv_bfloat16* o,
                              const __nv_bfloat16* dout, const float* lse, __nv_bfloat16* dq,
                              __nv_bfloat16* dk, __nv_bfloat16* dv, void* workspace, int B, int T,
                              int H, int head_dim, cudaStream_t stream);

}  // namespace trainer::cuda
