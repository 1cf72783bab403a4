// CUDA implementation of SideStream: one non-blocking stream and a pool of events that grows only
// in the first step.
#include <cuda_runtime.h>

#include <vector>

#include "core/cuda_check.h"
#include "runtime/side_stream.h"

namespace trainer {
namespace {

class CudaSideStream : public SideStream {
 public:
  explicit CudaSideStream(void* main) : main_(static_cast<cudaStream_t>(main)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
  }
  ~CudaSideStream() override {
    cudaStreamSynchronize(side_);
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    cudaEventDestroy(forked_);
    cudaStreamDestroy(side_);
  }
  void* stream() override { return side_; }
  void fork() override {
    CUDA_CHECK(cudaEventRecord(forked_, main_));
    CUDA_CHECK(cudaStreamWaitEvent(side_, forked_, 0));
    used_ =
        0;  // a wait enqueued on an event is bound to the record it saw, so events may be reused
  }
  void* mark() override {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      pool_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(pool_[used_], side_));
    return pool_[used_++];
  }
  void wait(void* mark) override {
    CUDA_CHECK(cudaStreamWaitEvent(main_, static_cast<cudaEvent_t>(mark), 0));
  }

 private:
  cudaStream_t main_, side_ = nullptr;
  cudaEvent_t forked_ = nullptr;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<SideStream> make_side_stream(void* main) {
  return std::make_unique<CudaSideStream>(main);
}

}  // namespace trainer
