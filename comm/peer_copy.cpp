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

constexpr int64_t kStagingBytes = int64_t{32} << 20;  // per lane: sums go through it in pieces
// A copy engine runs one copy at a time; copies on separate streams use several of them.
constexpr int kLanes = 2;

}  // namespace

struct PeerCopy::Impl {
  char* base = nullptr;  // this rank's registered buffer
  char* peer = nullptr;  // the peer's, mapped
  int64_t bytes = 0;
  uint32_t* counters = nullptr;       // this rank's [kCounters]
  uint32_t* peer_counters = nullptr;  // the peer's, mapped
  char* staging = nullptr;            // [kLanes][kStagingBytes], for sums only
  cudaStream_t lanes[kLanes] = {};
  cudaEvent_t fork = nullptr, join[kLanes] = {};
  DType dtype = DType::kF32;
  int rank = 0, sum_ctas = 0;
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

  // Copies `bytes` from the peer's `remote` to this rank's `local` (with `sum`: adds them, fp32,
  // into local through the staging buffer), after everything queued on `comm`; `comm` then waits
  // for it. Pieces of at most the staging size go round-robin to the lanes (copy, then add, on one
  // lane) so that several copy engines work at once. Events are reused: a wait binds to the record
  // that precedes it.
  void pull(cudaStream_t comm, char* local, const char* remote, int64_t bytes, bool sum) {
    CUDA_CHECK(cudaEventRecord(fork, comm));
    for (int l = 0; l < kLanes; ++l) CUDA_CHECK(cudaStreamWaitEvent(lanes[l], fork, 0));
    const int64_t piece = std::min(kStagingBytes, (bytes + kLanes - 1) / kLanes / 256 * 256 + 256);
    int lane = 0;
    for (int64_t at = 0; at < bytes; at += piece, lane = (lane + 1) % kLanes) {
      const int64_t len = std::min(piece, bytes - at);
      cudaStream_t s = lanes[lane];
      char* dst = sum ? staging + lane * kStagingBytes : local + at;
      CUDA_CHECK(cudaMemcpyAsync(dst, remote + at, len, cudaMemcpyDeviceToDevice, s));
      if (sum)
        cuda::add_f32(reinterpret_cast<float*>(local + at), reinterpret_cast<const float*>(dst),
                      len / 4, s, sum_ctas);
    }
    for (int l = 0; l < kLanes; ++l) {
      CUDA_CHECK(cudaEventRecord(join[l], lanes[l]));
      CUDA_CHECK(cudaStreamWaitEvent(comm, join[l], 0));
    }
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

PeerCopy::PeerCopy(const MpiCommunicator& boot, BufferView buf, int device, int sum_ctas)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda, "peer copies need a device buffer");
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
  m.sum_ctas = sum_ctas;
  m.write = driver_entry("cuStreamWriteValue32");
  m.wait = driver_entry("cuStreamWaitValue32");
  m.base = static_cast<char*>(buf.data);
  m.bytes = static_cast<int64_t>(buf.bytes());
  CUDA_CHECK(cudaMalloc(&m.counters, kCounters * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(m.counters, 0, kCounters * sizeof(uint32_t)));
  m.dtype = buf.dtype;
  if (buf.dtype == DType::kF32) CUDA_CHECK(cudaMalloc(&m.staging, kLanes * kStagingBytes));
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
      usage_error("--grad-transport ce: the ranks' buffers differ in size ({} vs {} bytes)",
                  m.bytes, theirs.bytes);
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
  spdlog::debug("peer copies: {:.1f} MiB ({}) mapped from the peer GPU", m.bytes / 1048576.0,
                dtype_name(m.dtype));
}

PeerCopy::~PeerCopy() = default;

bool PeerCopy::covers(const BufferView& v) const {
  const char* p = static_cast<const char*>(v.data);
  return v.device == DeviceKind::kCuda && v.dtype == impl_->dtype && p >= impl_->base &&
         p + v.bytes() <= impl_->base + impl_->bytes;
}

void PeerCopy::reduce(const BufferView& v, int64_t split, bool gather, cudaStream_t compute,
                      cudaStream_t comm) {
  Impl& m = *impl_;
  TRAINER_CHECK(v.dtype == DType::kF32 && covers(v) && split >= 0 && split <= v.count,
                "peer sum of a view outside the registered fp32 buffer");
  const Range first{0, split}, second{split, v.count};
  const Range mine = m.rank == 0 ? first : second, theirs = m.rank == 0 ? second : first;
  ++m.n;
  // Byte offsets in both ranks' buffers of element 0 of v.
  const int64_t offset = static_cast<char*>(v.data) - m.base;
  char* local = m.base + offset;
  const char* remote = m.peer + offset;
  m.post(compute, kPosted);
  m.await(comm, kPosted);
  if (!mine.empty())
    m.pull(comm, local + mine.begin * 4, remote + mine.begin * 4, mine.size() * 4, /*sum=*/true);
  m.post(comm, kReduced);
  if (gather && !theirs.empty()) {
    m.await(comm, kReduced);
    m.pull(comm, local + theirs.begin * 4, remote + theirs.begin * 4, theirs.size() * 4, false);
  }
  m.post(comm, kConsumed);
  m.await(comm, kConsumed);
}

void PeerCopy::gather(const BufferView& buf, Range theirs, cudaStream_t compute,
                      cudaStream_t comm) {
  Impl& m = *impl_;
  TRAINER_CHECK(covers(buf) && theirs.begin >= 0 && theirs.end <= buf.count,
                "peer gather outside the registered buffer");
  ++m.n;
  const size_t esize = dtype_size(buf.dtype);
  const int64_t offset = static_cast<char*>(buf.data) - m.base + theirs.begin * esize;
  m.post(compute, kPosted);
  m.await(comm, kPosted);
  m.pull(comm, m.base + offset, m.peer + offset, theirs.size() * esize, /*sum=*/false);
  m.post(comm, kConsumed);
  m.await(comm, kConsumed);
}

}  // namespace trainer
