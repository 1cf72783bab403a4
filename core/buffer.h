// The small types that model/, comm/ and optim/ share: where a buffer lives, its element type, and
// a non-owning view of a contiguous range of it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace trainer {

enum class DeviceKind { kCpu, kCuda };
// kF16: IEEE binary16, the working parameters and activations of --precision fp16.
enum class DType { kF32, kBF16, kF64, kF16 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF64:
      return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

// A contiguous run of `count` elements of `dtype` on `device`. Views never own memory.
struct BufferView {
  void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::kF32;
  DeviceKind device = DeviceKind::kCpu;

  size_t bytes() const { return static_cast<size_t>(count) * dtype_size(dtype); }

  BufferView slice(int64_t offset, int64_t n) const {
    TRAINER_CHECK(offset >= 0 && n >= 0 && offset + n <= count,
                  "slice [{}, {}) outside a view of {} elements", offset, offset + n, count);
    BufferView v = *this;
    v.data = static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype);
    v.count = n;
    return v;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A half-open range [begin, end) of element offsets into a flat buffer.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  Range intersect(Range o) const {
    Range r{begin > o.begin ? begin : o.begin, end < o.end ? end : o.end};
    if (r.end < r.begin) r.end = r.begin;
    return r;
  }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

}  // namespace trainer
