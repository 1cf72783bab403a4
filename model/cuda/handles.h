// RAII for the raw CUDA handles the backends hold (buffers are DeviceBuffers), and an NVTX range
// for the lifetime of an object.
#pragma once

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

namespace trainer::cuda {

struct StreamHandle {
  cudaStream_t s = nullptr;
  ~StreamHandle() {
    if (s) cudaStreamDestroy(s);
  }
};
struct EventHandle {
  cudaEvent_t e = nullptr;
  ~EventHandle() {
    if (e) cudaEventDestroy(e);
  }
};
struct PinnedHandle {
  void* p = nullptr;
  ~PinnedHandle() {
    if (p) cudaFreeHost(p);
  }
  PinnedHandle() = default;
  PinnedHandle(const PinnedHandle&) = delete;
  PinnedHandle& operator=(const PinnedHandle&) = delete;
};

struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace trainer::cuda
