// An owning, zero-initialised allocation on the CPU or a CUDA device, made once at start-up.
#pragma once

#include <cstdint>
#include <string>

#include "core/buffer.h"

namespace trainer {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceKind device, DType dtype, int64_t count);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  BufferView view() const { return view_; }
  BufferView slice(int64_t offset, int64_t n) const { return view_.slice(offset, n); }
  int64_t count() const { return view_.count; }
  size_t bytes() const { return view_.bytes(); }
  template <typename T>
  T* as() const {
    return view_.as<T>();
  }

 private:
  BufferView view_;
};

// Copies between views of equal size and dtype on any devices. Synchronous, and ordered after
// all work queued on the device: for set-up and checkpoints, not for the hot path.
void copy(BufferView dst, BufferView src);
// Copies src (fp32, or bf16 widened exactly) into host fp32 memory, src.count elements.
void copy_to_f32(float* host, BufferView src);
// Copies host fp32 values into dst (fp32, or bf16 rounded to nearest even), dst.count elements.
void copy_from_f32(BufferView dst, const float* host);
// Sets every element to zero.
void zero(BufferView dst);

// True when the binary has the CUDA backend and a device is visible.
bool cuda_available();
// Number of visible CUDA devices (0 without the CUDA backend).
int cuda_device_count();
// The device's UUID as hex (the same GPU gives the same string in every process, whatever
// CUDA_VISIBLE_DEVICES numbers it); "" without the CUDA backend or for an invalid index.
std::string cuda_device_uuid(int device);
// The device's marketing name ("NVIDIA H200"); "" without the CUDA backend or for an invalid index.
std::string cuda_device_name(int device);
// The device's PCI bus id ("0000:19:00.0"), by which NVML finds it; "" without the CUDA backend or
// for an invalid index.
std::string cuda_device_pci_bus_id(int device);
// Bytes held now by the DeviceBuffers of this process on `device` (the allocator's own count).
int64_t device_buffer_bytes(DeviceKind device);
// Memory in use: on CUDA the device's used bytes (total - free, as cudaMemGetInfo sees it); on
// the CPU the process's peak resident set.
int64_t memory_in_use(DeviceKind device);

}  // namespace trainer
