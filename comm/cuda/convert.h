// Element-wise kernels of the gradient collectives: fp32 <-> bf16 conversion (--grad-reduce bf16)
// and the sum of copied peer segments (--grad-transport ce).
#pragma once

#include <cstdint>

namespace trainer::cuda {
void f32_to_bf16(const float* src, void* dst_bf16, int64_t n, void* stream);
void bf16_to_f32(const void* src_bf16, float* dst, int64_t n, void* stream);
constexpr int kMaxAddSources = 7;  // peers of a rank on an 8-GPU host
// dst += src[0] + ... + src[count-1], added left to right, on at most max_ctas CTAs of 256 threads
// (0: 264, two per SM of an H100/H200: it is bound by memory, not by SMs).
void add_f32(float* dst, const float* const* src, int count, int64_t n, void* stream,
             int max_ctas = 0);
}  // namespace trainer::cuda
