// FlashAttention-2 style causal attention for bf16 on tensor cores.
//
// q, k, v, o, dO, dq, dk, dv: bf16 in the (B, T, d) layout the rest of the model produces, with
// head h at columns [h*dh, (h+1)*dh) (row stride d = H*dh). lse: fp32 (B, H, T), the natural-log
// logsumexp of each query row of the scaled, masked scores S = q k^T / sqrt(dh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace trainer::cuda {

// True for the head dimensions the kernels are built for (16, 32, 64, 80, 128).
bool flash_attention_supports(int head_dim);

// Which kernels run. Every head dim has FlashAttention-2 kernels on mma.sync (any GPU from sm_80
// on). Hopper also has warpgroup-MMA kernels for head dims 64, 80 and 128, which kAuto runs there
// (H200, B=4, H=16, causal, T 1024..16384):
//   forward (flash/tma_forward.cu, TMA producer + pipelined wgmma consumers): 1.09-1.39x faster
//     than FA2 at head dim 64, 1.25-1.80x at 80, 1.69-2.59x at 128;
//   backward (flash/wgmma_backward.cu, TMA producer, dQ by TMA reductions): the whole backward
//     1.47-1.85x faster than FA2's at head dim 64, 1.32-1.58x at 80, 1.53-1.92x at 128.
// kMmaSync always runs the FA2 kernels (tests and benchmarks keep that path covered on Hopper).
// Both agree to bf16 rounding (the tests hold them to the same tolerances); the backward's D and
// dq-conversion kernels and its workspace are the same either way.
enum class FlashKernels { kAuto, kMmaSync };

// The Hopper kernels are persistent: one CTA per SM takes block after block from a counter in
// device memory, one of kFlashScheduleSlots per kernel used in turn by successive launches. At
// most that many launches may run at the same time (on different streams, or replays of one CUDA
// graph on several); launches in stream order may be any number.
inline constexpr int kFlashScheduleSlots = 16;

// True when kAuto runs the Hopper kernels for this head dim (forward and backward alike): the build
// targets sm_90a (TRAINER_SM90A, set when CMAKE_CUDA_ARCHITECTURES lists 90a), the current device
// has compute capability exactly 9.0, and the head dim is 64, 80 or 128.
bool flash_attention_uses_wgmma(int head_dim);

// Row strides, in elements, of q, k, v (forward and backward) and of dq, dk, dv (backward), for
// tensors that are columns of a wider (B, T, ld) buffer, such as the output of one fused QKV
// projection: 0 means H * head_dim (rows of whole heads, nothing between them). A stride is at
// least H * head_dim and a multiple of 8 (16-byte rows). o, dO and lse are always contiguous.
struct FlashStrides {
  int64_t qkv = 0;
  int64_t dqkv = 0;
};

// o and lse are overwritten; lse feeds the backward. Work is queued on `stream` (no sync).
void flash_attention_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                             __nv_bfloat16* o, float* lse, int B, int T, int H, int head_dim,
                             cudaStream_t stream, FlashKernels kernels = FlashKernels::kAuto,
                             FlashStrides strides = {});

// Scratch the backward needs: an fp32 dq accumulator (B*T*H*dh floats) and D = rowsum(dO * O)
// (B*H*T floats), each rounded up to 256 bytes.
size_t flash_attention_backward_workspace_bytes(int B, int T, int H, int head_dim);

// dq, dk, dv are overwritten. `workspace` holds at least the bytes asked for above; its contents
// need not be initialised (the backward clears what it uses), unless dq_acc_zeroed: then its dq
// accumulator is zero already (flash_attention_backward_clear, ordered before this call), and the
// backward saves that pass. It leaves its dq sums there. dk and dv are bitwise
// deterministic; dq is summed over key blocks with fp32 atomics, so its last bits may vary from
// run to run. All pointers 16-byte aligned (lse: 4), head_dim as flash_attention_supports().
// rope_table: null, or RoPE's table on the device (rope_table() of model/cuda/rope.cuh, at least T
// positions, 8-byte aligned): then dq and dk leave through RoPE's backward, i.e. they are the
// gradients of q and k before the rotation (the forward took rotated q, k), as rope() with
// inverse = true would make them, rounded to bf16 once instead of twice.
void flash_attention_backward(const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const __nv_bfloat16* o,
                              const __nv_bfloat16* dout, const float* lse, __nv_bfloat16* dq,
                              __nv_bfloat16* dk, __nv_bfloat16* dv, void* workspace, int B, int T,
                              int H, int head_dim, cudaStream_t stream,
                              FlashKernels kernels = FlashKernels::kAuto, FlashStrides strides = {},
                              const float* rope_table = nullptr, bool dq_acc_zeroed = false);
// Zeroes the dq accumulator of a backward of this shape in `workspace`, on `stream`: queued on a
// side stream beside other work, it takes a memory-bound pass off the backward's own stream.
void flash_attention_backward_clear(void* workspace, int B, int T, int H, int head_dim,
                                    cudaStream_t stream);

}  // namespace trainer::cuda
