#include "comm/peer_copy.h"

#include <cuda.h>
#include <mpi.h>

#include <algorithm>
#include <string>

#include "comm/cuda/convert.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"

namespace trainer {
namespace {

// Stream memory operations come from the driver API; the runtime hands out their entry points,
// so the binary does not link libcuda directly.
using StreamValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

StreamValueFn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
    runtime_error("CUDA driver entry point {} is not available ({})", name,
                  cudaGetErrorString(err));
  return reinterpret_cast<StreamValueFn>(fn);
}

enum Counter { kPosted = 0, kReduced = 1, kConsumed = 2, kCounters = 3 };

// What one rank tells the other at set-up.
struct Exchange {
  cudaIpcMemHandle_t buffer, counters;
  int64_t bytes;
};

constexpr int64_t kStagingFloats = int64_t{8} << 20;  // 32 MiB per chunk of a segment
// A copy engine runs one copy at a time; copies on separate streams use several of them.
constexpr int kLanes = 2;

}  // namespace

struct PeerCopy::Impl {
  char* base = nullptr;  // this rank's registered buffer
  char* peer = nullptr;  // the peer's, mapped
  int64_t bytes = 0;
  uint32_t* counters = nullptr;       // this rank's [kCounters]
  uint32_t* peer_counters = nullptr;  // the peer's, mapped
  float* staging = nullptr;           // [kLanes][kStagingFloats]
  cudaStream_t lanes[kLanes] = {};
  cudaEvent_t fork = nullptr, join[kLanes] = {};
  int rank = 0;
  uint32_t n = 0;  // collectives so far (the same on both ranks: they are called in one order)
  StreamValueFn write = nullptr, wait = nullptr;

  CUdeviceptr at(uint32_t* c, Counter i) const { return reinterpret_cast<CUdeviceptr>(c + i); }
  void post(cudaStream_t s, Counter i) const {
    check(write(reinterpret_cast<CUstream>(s), at(counters, i), n, 0), "cuStreamWriteValue32");
  }
  // Cyclic >= (CU_STREAM_WAIT_VALUE_GEQ): the counters may wrap.
  void await(cudaStream_t s, Counter i) const {
    check(wait(reinterpret_cast<CUstream>(s), at(peer_counters, i), n, CU_STREAM_WAIT_VALUE_GEQ),
          "cuStreamWaitValue32");
  }
  static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) runtime_error("{} failed (CUresult {})", what, static_cast<int>(r));
  }

  // Also runs when the constructor stops half-way. Every collective has completed by then (both
  // ranks waited on them), so no copy still reads the mappings; errors are ignored at teardown.
  ~Impl() {
    if (peer) cudaIpcCloseMemHandle(peer);
    if (peer_counters) cudaIpcCloseMemHandle(peer_counters);
    for (int l = 0; l < kLanes; ++l) {
      if (lanes[l]) cudaStreamDestroy(lanes[l]);
      if (join[l]) cudaEventDestroy(join[l]);
    }
    if (fork) cudaEventDestroy(fork);
    cudaFree(staging);
    cudaFree(counters);
  }
};

PeerCopy::PeerCopy(const MpiCommunicator& boot, BufferView buf, int device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda && buf.dtype == DType::kF32,
                "peer copies need an fp32 device buffer");
  agree_on_usage_errors(boot, [&] {
    const int on_node = node_ranks_of(boot.comm()).size;
    if (boot.world() != 2 || on_node != 2)
      usage_error(
          "--grad-transport ce needs exactly 2 ranks on one host (this job: {} ranks, {} on this "
          "host)",
          boot.world(), on_node);
  });

  CUDA_CHECK(cudaSetDevice(device));
  m.rank = boot.rank();
  m.write = driver_entry("cuStreamWriteValue32");
  m.wait = driver_entry("cuStreamWaitValue32");
  m.base = static_cast<char*>(buf.data);
  m.bytes = static_cast<int64_t>(buf.bytes());
  CUDA_CHECK(cudaMalloc(&m.counters, kCounters * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(m.counters, 0, kCounters * sizeof(uint32_t)));
  CUDA_CHECK(cudaMalloc(&m.staging, kLanes * kStagingFloats * sizeof(float)));
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int l = 0; l < kLanes; ++l) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&m.lanes[l], cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&m.join[l], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&m.fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaDeviceSynchronize());

  Exchange mine{};
  CUDA_CHECK(cudaIpcGetMemHandle(&mine.buffer, m.base));
  CUDA_CHECK(cudaIpcGetMemHandle(&mine.counters, m.counters));
  mine.bytes = m.bytes;
  Exchange both[2];
  MPI_Allgather(&mine, sizeof(Exchange), MPI_BYTE, both, sizeof(Exchange), MPI_BYTE, boot.comm());
  const Exchange& theirs = both[1 - boot.rank()];
  agree_on_usage_errors(boot, [&] {
    if (theirs.bytes != m.bytes)
      usage_error("--grad-transport ce: gradient buffers differ in size ({} vs {} bytes)", m.bytes,
                  theirs.bytes);
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, theirs.buffer, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) {
      m.peer = static_cast<char*>(p);
      e = cudaIpcOpenMemHandle(&p, theirs.counters, cudaIpcMemLazyEnablePeerAccess);
      if (e == cudaSuccess) m.peer_counters = static_cast<uint32_t*>(p);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error so later calls are unaffected
      usage_error(
          "--grad-transport ce: GPU {} cannot map the peer GPU's memory ({}); use "
          "--grad-transport nccl",
          device, cudaGetErrorString(e));
    }
  });
  spdlog::debug("peer copies: {:.1f} MiB of gradients mapped from the peer GPU",
                m.bytes / 1048576.0);
}

PeerCopy::~PeerCopy() = default;

bool PeerCopy::covers(const BufferView& v) const {
  const char* p = static_cast<const char*>(v.data);
  return v.device == DeviceKind::kCuda && v.dtype == DType::kF32 && p >= impl_->base &&
         p + v.bytes() <= impl_->base + impl_->bytes;
}

void PeerCopy::reduce(const BufferView& v, int64_t split, bool gather, cudaStream_t compute,
                      cudaStream_t comm) {
  Impl& m = *impl_;
  TRAINER_CHECK(covers(v) && split >= 0 && split <= v.count,
                "peer copy of a view outside the registered buffer");
  const Range first{0, split}, second{split, v.count};
  const Range mine = m.rank == 0 ? first : second, theirs = m.rank == 0 ? second : first;
  ++m.n;
  // The peer-side address of element i of v.
  const int64_t offset = static_cast<char*>(v.data) - m.base;
  float* local = v.as<float>();
  const float* remote = reinterpret_cast<const float*>(m.peer + offset);

  m.post(compute, kPosted);
  m.await(comm, kPosted);
  // Pieces of at most the staging size go round-robin to the lanes: copy, then add, on one lane;
  // the lanes run side by side and `comm` joins them. Events are reused: a wait binds to the
  // record that precedes it.
  auto on_lanes = [&](Range r, bool sum) {
    CUDA_CHECK(cudaEventRecord(m.fork, comm));
    for (int l = 0; l < kLanes; ++l) CUDA_CHECK(cudaStreamWaitEvent(m.lanes[l], m.fork, 0));
    const int64_t piece = std::min(kStagingFloats, (r.size() + kLanes - 1) / kLanes / 64 * 64 + 64);
    int lane = 0;
    for (int64_t at = r.begin; at < r.end; at += piece, lane = (lane + 1) % kLanes) {
      const int64_t len = std::min(piece, r.end - at);
      cudaStream_t s = m.lanes[lane];
      float* dst = sum ? m.staging + lane * kStagingFloats : local + at;
      CUDA_CHECK(
          cudaMemcpyAsync(dst, remote + at, len * sizeof(float), cudaMemcpyDeviceToDevice, s));
      if (sum) cuda::add_f32(local + at, dst, len, s);
    }
    for (int l = 0; l < kLanes; ++l) {
      CUDA_CHECK(cudaEventRecord(m.join[l], m.lanes[l]));
      CUDA_CHECK(cudaStreamWaitEvent(comm, m.join[l], 0));
    }
  };
  if (!mine.empty()) on_lanes(mine, true);
  m.post(comm, kReduced);
  if (gather && !theirs.empty()) {
    m.await(comm, kReduced);
    on_lanes(theirs, false);
  }
  m.post(comm, kConsumed);
  m.await(comm, kConsumed);
}

}  // namespace trainer
