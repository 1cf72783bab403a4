// Rotary position embedding on q and k, fused with the split of the fused q/k/v projection and,
// for the simple attention path, the change to head-major layout (host-callable launchers;
// kernels in rope.cu).
//
// Interleaved pairs (x[2j], x[2j+1]) of each head, at position t of its sequence, rotate by the
// angle t * theta^(-2j/dh) (cos c, sin s from a fp32 table built once):
//   forward:  x'[2j] = x[2j] c - x[2j+1] s,    x'[2j+1] = x[2j] s + x[2j+1] c
//   backward: the transpose, dx[2j] = g[2j] c + g[2j+1] s,  dx[2j+1] = -g[2j] s + g[2j+1] c
// A job with rotate == false is a plain copy (v, which RoPE does not touch, changes layout too).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace trainer::cuda {

#ifdef __CUDACC__
// One interleaved pair (x0, x1) rotated by the table entry cs = (cos, sin): RoPE's forward, or
// with `inverse` its backward (the same rotation with sin negated). Shared by rope_kernel and the
// attention backward, which applies RoPE's backward to dq and dk in its epilogues.
__device__ __forceinline__ float2 rope_rotate_pair(float2 cs, float x0, float x1, bool inverse) {
  const float si = inverse ? -cs.y : cs.y;
  return make_float2(x0 * cs.x - x1 * si, x0 * si + x1 * cs.x);
}
#endif

// Where element (b, t, head h, channel e) of an attention operand lives:
//   kTokenMajor: (B, T, d) rows of row stride `ld`, head h at columns [h*dh, (h+1)*dh)
//   kHeadMajor:  (B, H, T, dh) contiguous, so each (b, h) is one (T, dh) matrix
enum class QkvLayout { kTokenMajor, kHeadMajor };

// cos/sin of every (position, pair): table[2 * (t * dh/2 + j)] = cos, [... + 1] = sin, for t in
// [0, ctx). Computed in double and rounded once to fp32, like the CPU reference.
std::vector<float> rope_table(int64_t ctx, int64_t head_dim, double theta);

// Up to three same-shaped matrices handled by one launch (q, k, v).
template <typename T>
struct RopeJobs {
  const T* in[3] = {nullptr, nullptr, nullptr};
  T* out[3] = {nullptr, nullptr, nullptr};
  bool rotate[3] = {false, false, false};
  int count = 0;
  void add(const T* i, T* o, bool r) {
    in[count] = i;
    out[count] = o;
    rotate[count] = r;
    ++count;
  }
};

// Applies RoPE (inverse = false) or its backward (inverse = true) to every job: `in` laid out as
// in_layout (row stride ld_in when token-major), `out` as out_layout (row stride ld_out). B rows
// of T positions, H heads of head_dim channels; `table` is rope_table() on the device, holding at
// least T positions. A job's in and out do not overlap, or are the same tensor in the same layout
// (in place: each thread writes only the channels it read).
void rope(const RopeJobs<float>& jobs, QkvLayout in_layout, int64_t ld_in, QkvLayout out_layout,
          int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim, const float* table,
          bool inverse, cudaStream_t stream);
void rope(const RopeJobs<__nv_bfloat16>& jobs, QkvLayout in_layout, int64_t ld_in,
          QkvLayout out_layout, int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim,
          const float* table, bool inverse, cudaStream_t stream);
void rope(const RopeJobs<__half>& jobs, QkvLayout in_layout, int64_t ld_in, QkvLayout out_layout,
          int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim, const float* table,
          bool inverse, cudaStream_t stream);

// Moves (B, T, H, dh) token-major rows (row stride H*dh) to head-major (B, H, T, dh) and back;
// used around the simple attention's batched matmuls.
void heads_to_head_major(const float* in, float* out, int64_t B, int64_t T, int64_t H,
                         int64_t head_dim, cudaStream_t stream);
void heads_to_head_major(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t B, int64_t T,
                         int64_t H, int64_t head_dim, cudaStream_t stream);
void heads_to_head_major(const __half* in, __half* out, int64_t B, int64_t T, int64_t H,
                         int64_t head_dim, cudaStream_t stream);
void heads_to_token_major(const float* in, float* out, int64_t B, int64_t T, int64_t H,
                          int64_t head_dim, cudaStream_t stream);
void heads_to_token_major(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t B, int64_t T,
                          int64_t H, int64_t head_dim, cudaStream_t stream);
void heads_to_token_major(const __half* in, __half* out, int64_t B, int64_t T, int64_t H,
                          int64_t head_dim, cudaStream_t stream);

}  // namespace trainer::cuda
