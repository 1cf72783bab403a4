// fp32 <-> bf16 conversion on a stream, for gradient collectives in bf16 (--grad-reduce bf16).
#pragma once

#include <cstdint>

namespace trainer::cuda {
void f32_to_bf16(const float* src, void* dst_bf16, int64_t n, void* stream);
void bf16_to_f32(const void* src_bf16, float* dst, int64_t n, void* stream);
}  // namespace trainer::cuda
