#include "core/device_buffer.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "core/bf16.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace trainer {
namespace {

// Bytes held by live DeviceBuffers, per DeviceKind: the allocator's own count.
std::atomic<int64_t> g_live_bytes[2];

std::atomic<int64_t>& live_bytes(DeviceKind d) { return g_live_bytes[d == DeviceKind::kCuda]; }

}  // namespace

int64_t device_buffer_bytes(DeviceKind device) { return live_bytes(device).load(); }

DeviceBuffer::DeviceBuffer(DeviceKind device, DType dtype, int64_t count) {
  TRAINER_CHECK(count >= 0, "negative buffer size {}", count);
  view_.count = count;
  view_.dtype = dtype;
  view_.device = device;
  const size_t bytes = view_.bytes();
  if (bytes == 0) return;
  if (device == DeviceKind::kCpu) {
    // 64-byte alignment for vector loads; aligned_alloc needs a size multiple of the alignment.
    view_.data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!view_.data) throw std::bad_alloc();
    std::memset(view_.data, 0, bytes);
  } else {
#ifdef TRAINER_WITH_CUDA
    if (const cudaError_t err = cudaMalloc(&view_.data, bytes); err == cudaErrorMemoryAllocation) {
      // Not sticky: clear it, so the caller can report it and every rank can stop cleanly.
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      int gpu = -1;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      cudaGetDevice(&gpu);
      usage_error("out of memory on GPU {} allocating {:.2f} GiB ({:.2f} of {:.2f} GiB free): {}",
                  gpu, bytes / 1073741824.0, free_bytes / 1073741824.0, total_bytes / 1073741824.0,
                  kOutOfMemoryAdvice);
    } else if (err != cudaSuccess) {
      cuda_fail(err, "cudaMalloc", __FILE__, __LINE__);
    }
    CUDA_CHECK(cudaMemset(view_.data, 0, bytes));
    CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any stream uses it
#else
    runtime_error("this binary was built without the CUDA backend");
#endif
  }
  live_bytes(device) += static_cast<int64_t>(bytes);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(view_, o.view_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (!view_.data) return;
  live_bytes(view_.device) -= static_cast<int64_t>(view_.bytes());
  if (view_.device == DeviceKind::kCpu) {
    std::free(view_.data);
  } else {
#ifdef TRAINER_WITH_CUDA
    cudaFree(view_.data);
#endif
  }
}

void copy(BufferView dst, BufferView src) {
  TRAINER_CHECK(dst.count == src.count && dst.dtype == src.dtype, "copy of {} {} into {} {}",
                src.count, dtype_name(src.dtype), dst.count, dtype_name(dst.dtype));
  if (src.bytes() == 0) return;
  if (dst.device == DeviceKind::kCpu && src.device == DeviceKind::kCpu) {
    std::memcpy(dst.data, src.data, src.bytes());
    return;
  }
#ifdef TRAINER_WITH_CUDA
  // Copies happen outside the steps (set-up, checkpoints); the replica's streams do not wait for
  // the legacy default stream, so order against all device work explicitly.
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(dst.data, src.data, src.bytes(), cudaMemcpyDefault));
  CUDA_CHECK(cudaDeviceSynchronize());
#else
  runtime_error("copy to or from a CUDA buffer in a build without CUDA");
#endif
}

void copy_to_f32(float* host, BufferView src) {
  if (src.dtype == DType::kF32)
    return copy(BufferView{host, src.count, DType::kF32, DeviceKind::kCpu}, src);
  TRAINER_CHECK(src.dtype == DType::kBF16, "copy_to_f32 of a {} view", dtype_name(src.dtype));
  std::vector<uint16_t> bits(static_cast<size_t>(src.count));
  copy(BufferView{bits.data(), src.count, DType::kBF16, DeviceKind::kCpu}, src);
  for (size_t i = 0; i < bits.size(); ++i) host[i] = bf16_bits_to_f32(bits[i]);
}

void copy_from_f32(BufferView dst, const float* host) {
  if (dst.dtype == DType::kF32)
    return copy(dst,
                BufferView{const_cast<float*>(host), dst.count, DType::kF32, DeviceKind::kCpu});
  TRAINER_CHECK(dst.dtype == DType::kBF16, "copy_from_f32 into a {} view", dtype_name(dst.dtype));
  std::vector<uint16_t> bits(static_cast<size_t>(dst.count));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16_bits(host[i]);
  copy(dst, BufferView{bits.data(), dst.count, DType::kBF16, DeviceKind::kCpu});
}

void zero(BufferView dst) {
  if (dst.bytes() == 0) return;
  if (dst.device == DeviceKind::kCpu) {
    std::memset(dst.data, 0, dst.bytes());
    return;
  }
#ifdef TRAINER_WITH_CUDA
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemset(dst.data, 0, dst.bytes()));
  CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

int cuda_device_count() {
#ifdef TRAINER_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

namespace {
// The device's properties, or false (and the CUDA error cleared) for an invalid index.
#ifdef TRAINER_WITH_CUDA
bool device_properties(int device, cudaDeviceProp* p) {
  if (cudaGetDeviceProperties(p, device) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}
#endif
}  // namespace

std::string cuda_device_uuid(int device) {
  std::string hex;
#ifdef TRAINER_WITH_CUDA
  cudaDeviceProp p{};
  if (!device_properties(device, &p)) return hex;
  for (char c : p.uuid.bytes) hex += fmt::format("{:02x}", static_cast<unsigned char>(c));
#else
  (void)device;
#endif
  return hex;
}

std::string cuda_device_name(int device) {
#ifdef TRAINER_WITH_CUDA
  cudaDeviceProp p{};
  if (device_properties(device, &p)) return p.name;
#else
  (void)device;
#endif
  return "";
}

std::string cuda_device_pci_bus_id(int device) {
#ifdef TRAINER_WITH_CUDA
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) == cudaSuccess) return id;
  cudaGetLastError();  // as device_properties: an invalid index leaves no sticky error
#else
  (void)device;
#endif
  return "";
}

int64_t memory_in_use(DeviceKind device) {
  if (device == DeviceKind::kCuda) {
#ifdef TRAINER_WITH_CUDA
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return static_cast<int64_t>(total_b - free_b);
#endif
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

}  // namespace trainer
