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

// What one rank tells the others at set-up.
struct Exchange {
  cudaIpcMemHandle_t buffer, counters;
  int64_t bytes;
};

constexpr int64_t kStagingBytes = int64_t{32} << 20;  // per lane: sums go through it in pieces
// A copy engine runs one copy at a time; copies on separate streams use several of them.
constexpr int kMinLanes = 2;

// One copy from a peer's buffer to this rank's, or to this rank's copy of the peer's buffer
// (byte offsets, the same in both buffers).
struct Pull {
  int peer;
  int64_t offset, bytes;
  char* dst = nullptr;  // base of the destination buffer; nullptr: this rank's registered buffer
};

}  // namespace

struct PeerCopy::Impl {
  char* base = nullptr;      // this rank's registered buffer
  std::vector<char*> peers;  // every rank's, mapped (this rank's entry: base)
  int64_t bytes = 0;
  uint32_t* counters = nullptr;          // this rank's [kCounters]
  std::vector<uint32_t*> peer_counters;  // every rank's, mapped (this rank's entry: counters)
  char* staging = nullptr;               // [lanes][kStagingBytes], for sums only
  std::vector<char*>
      copies;  // hold_copies: every rank's buffer as received (own: null); else empty
  std::vector<cudaStream_t> lanes;
  std::vector<cudaEvent_t> join;
  cudaEvent_t fork = nullptr;
  DType dtype = DType::kF32;
  int rank = 0, world = 1, sum_ctas = 0;
  uint32_t n = 0;  // collectives so far (the same on every rank: they are called in one order)
  StreamValueFn write = nullptr, wait = nullptr;

  void post(cudaStream_t s, Counter i) const {
    check(write(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(counters + i), n, 0),
          "cuStreamWriteValue32");
  }
  // Cyclic >= (CU_STREAM_WAIT_VALUE_GEQ): the counters may wrap.
  void await(cudaStream_t s, int peer, Counter i) const {
    check(wait(reinterpret_cast<CUstream>(s),
               reinterpret_cast<CUdeviceptr>(peer_counters[peer] + i), n, CU_STREAM_WAIT_VALUE_GEQ),
          "cuStreamWaitValue32");
  }
  void await_all(cudaStream_t s, Counter i) const {
    for (int p = 0; p < world; ++p)
      if (p != rank) await(s, p, i);
  }
  static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) runtime_error("{} failed (CUresult {})", what, static_cast<int>(r));
  }

  // The lanes start after everything queued on `comm`; `fn()` queues work on them; `comm` then
  // waits for all of them. Events are reused: a wait binds to the record that precedes it.
  template <class Fn>
  void on_lanes(cudaStream_t comm, Fn fn) {
    CUDA_CHECK(cudaEventRecord(fork, comm));
    for (cudaStream_t l : lanes) CUDA_CHECK(cudaStreamWaitEvent(l, fork, 0));
    fn();
    for (size_t l = 0; l < lanes.size(); ++l) {
      CUDA_CHECK(cudaEventRecord(join[l], lanes[l]));
      CUDA_CHECK(cudaStreamWaitEvent(comm, join[l], 0));
    }
  }

  // Copies each pull from its peer to the same bytes of this rank's buffer, in pieces that go
  // round-robin to the lanes so that several copy engines work at once.
  void copy(cudaStream_t comm, const std::vector<Pull>& pulls) {
    on_lanes(comm, [&] {
      size_t lane = 0;
      for (const Pull& p : pulls) {
        const int64_t piece =
            std::min(kStagingBytes, (p.bytes + kMinLanes - 1) / kMinLanes / 256 * 256 + 256);
        for (int64_t at = 0; at < p.bytes; at += piece, lane = (lane + 1) % lanes.size())
          CUDA_CHECK(cudaMemcpyAsync((p.dst ? p.dst : base) + p.offset + at,
                                     peers[p.peer] + p.offset + at, std::min(piece, p.bytes - at),
                                     cudaMemcpyDeviceToDevice, lanes[lane]));
      }
    });
  }

  // Adds every peer's copy of this rank's bytes [offset, offset + len) (fp32) into them: per
  // piece, on one lane, the peers' pieces are copied into that lane's staging and summed in one
  // pass (in rank order).
  void sum(cudaStream_t comm, int64_t offset, int64_t len) {
    const int others = world - 1;
    const int64_t slot = kStagingBytes / others / 256 * 256;
    const int64_t piece = std::min(slot, (len + kMinLanes - 1) / kMinLanes / 256 * 256 + 256);
    on_lanes(comm, [&] {
      size_t lane = 0;
      for (int64_t at = 0; at < len; at += piece, lane = (lane + 1) % lanes.size()) {
        const int64_t chunk = std::min(piece, len - at);
        const float* src[cuda::kMaxAddSources];
        int k = 0;
        for (int p = 0; p < world; ++p) {
          if (p == rank) continue;
          char* dst = staging + lane * kStagingBytes + k * slot;
          CUDA_CHECK(cudaMemcpyAsync(dst, peers[p] + offset + at, chunk, cudaMemcpyDeviceToDevice,
                                     lanes[lane]));
          src[k++] = reinterpret_cast<const float*>(dst);
        }
        cuda::add_f32(reinterpret_cast<float*>(base + offset + at), src, k, chunk / 4, lanes[lane],
                      sum_ctas);
      }
    });
  }

  // Also runs when the constructor stops half-way. Every collective has completed by then (all
  // ranks waited on them), so no copy still reads the mappings; errors are ignored at teardown.
  ~Impl() {
    for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
      if (p == rank) continue;
      if (peers[p]) cudaIpcCloseMemHandle(peers[p]);
      if (peer_counters[p]) cudaIpcCloseMemHandle(peer_counters[p]);
    }
    for (cudaStream_t l : lanes) cudaStreamDestroy(l);
    for (cudaEvent_t e : join) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    cudaFree(staging);
    for (char* c : copies) cudaFree(c);
    cudaFree(counters);
  }
};

PeerCopy::PeerCopy(const MpiCommunicator& boot, BufferView buf, int device, int sum_ctas,
                   bool hold_copies)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda, "peer copies need a device buffer");
  agree_on_usage_errors(boot, [&] {
    const int on_node = node_ranks_of(boot.comm()).size;
    if (on_node != boot.world())
      usage_error(
          "--grad-transport ce needs every rank on one host (this job: {} ranks, {} on this "
          "host); use --grad-transport nccl",
          boot.world(), on_node);
    if (boot.world() - 1 > cuda::kMaxAddSources)
      usage_error("--grad-transport ce supports at most {} ranks (this job: {})",
                  cuda::kMaxAddSources + 1, boot.world());
  });

  CUDA_CHECK(cudaSetDevice(device));
  m.rank = boot.rank();
  m.world = boot.world();
  m.sum_ctas = sum_ctas;
  m.write = driver_entry("cuStreamWriteValue32");
  m.wait = driver_entry("cuStreamWaitValue32");
  m.base = static_cast<char*>(buf.data);
  m.bytes = static_cast<int64_t>(buf.bytes());
  CUDA_CHECK(cudaMalloc(&m.counters, kCounters * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(m.counters, 0, kCounters * sizeof(uint32_t)));
  m.dtype = buf.dtype;
  const int lanes = std::max(kMinLanes, m.world - 1);
  if (buf.dtype == DType::kF32) CUDA_CHECK(cudaMalloc(&m.staging, lanes * kStagingBytes));
  if (hold_copies) {
    m.copies.assign(m.world, nullptr);
    for (int p = 0; p < m.world; ++p)
      if (p != m.rank) CUDA_CHECK(cudaMalloc(&m.copies[p], m.bytes));
  }
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  m.lanes.assign(lanes, nullptr);
  m.join.assign(lanes, nullptr);
  for (int l = 0; l < lanes; ++l) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&m.lanes[l], cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&m.join[l], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&m.fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaDeviceSynchronize());

  Exchange mine{};
  CUDA_CHECK(cudaIpcGetMemHandle(&mine.buffer, m.base));
  CUDA_CHECK(cudaIpcGetMemHandle(&mine.counters, m.counters));
  mine.bytes = m.bytes;
  std::vector<Exchange> all(m.world);
  MPI_Allgather(&mine, sizeof(Exchange), MPI_BYTE, all.data(), sizeof(Exchange), MPI_BYTE,
                boot.comm());
  m.peers.assign(m.world, nullptr);
  m.peer_counters.assign(m.world, nullptr);
  m.peers[m.rank] = m.base;
  m.peer_counters[m.rank] = m.counters;
  agree_on_usage_errors(boot, [&] {
    for (int p = 0; p < m.world; ++p) {
      if (p == m.rank) continue;
      if (all[p].bytes != m.bytes)
        usage_error("--grad-transport ce: the ranks' buffers differ in size ({} vs {} bytes)",
                    m.bytes, all[p].bytes);
      void* ptr = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&ptr, all[p].buffer, cudaIpcMemLazyEnablePeerAccess);
      if (e == cudaSuccess) {
        m.peers[p] = static_cast<char*>(ptr);
        e = cudaIpcOpenMemHandle(&ptr, all[p].counters, cudaIpcMemLazyEnablePeerAccess);
        if (e == cudaSuccess) m.peer_counters[p] = static_cast<uint32_t*>(ptr);
      }
      if (e != cudaSuccess) {
        cudaGetLastError();  // clear the error so later calls are unaffected
        usage_error(
            "--grad-transport ce: GPU {} cannot map the memory of rank {}'s GPU ({}); use "
            "--grad-transport nccl",
            device, p, cudaGetErrorString(e));
      }
    }
  });
  spdlog::debug("peer copies: {:.1f} MiB ({}) mapped from {} peer GPU(s)", m.bytes / 1048576.0,
                dtype_name(m.dtype), m.world - 1);
}

PeerCopy::~PeerCopy() = default;

bool PeerCopy::covers(const BufferView& v) const {
  const char* p = static_cast<const char*>(v.data);
  return v.device == DeviceKind::kCuda && v.dtype == impl_->dtype && p >= impl_->base &&
         p + v.bytes() <= impl_->base + impl_->bytes;
}

void PeerCopy::reduce(const BufferView& v, const std::vector<int64_t>& counts, bool gather,
                      cudaStream_t compute, cudaStream_t comm) {
  Impl& m = *impl_;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  TRAINER_CHECK(v.dtype == DType::kF32 && covers(v) && static_cast<int>(counts.size()) == m.world &&
                    total == v.count,
                "peer sum of a view outside the registered fp32 buffer, or of other counts");
  ++m.n;
  // Byte offset, in every rank's buffer, of each rank's segment of v.
  std::vector<int64_t> offset(m.world + 1);
  offset[0] = static_cast<char*>(v.data) - m.base;
  for (int r = 0; r < m.world; ++r) offset[r + 1] = offset[r] + counts[r] * 4;
  m.post(compute, kPosted);
  m.await_all(comm, kPosted);
  if (counts[m.rank] > 0) m.sum(comm, offset[m.rank], counts[m.rank] * 4);
  m.post(comm, kReduced);
  if (gather) {
    m.await_all(comm, kReduced);
    std::vector<Pull> pulls;
    for (int p = 0; p < m.world; ++p)
      if (p != m.rank && counts[p] > 0) pulls.push_back({p, offset[p], counts[p] * 4});
    m.copy(comm, pulls);
  }
  m.post(comm, kConsumed);
  m.await_all(comm, kConsumed);
}

void PeerCopy::gather_copies(const BufferView& v, cudaStream_t compute, cudaStream_t comm) {
  Impl& m = *impl_;
  TRAINER_CHECK(covers(v), "peer copy of a view outside the registered buffer");
  TRAINER_CHECK(!m.copies.empty(), "gather_copies without hold_copies");
  ++m.n;
  const int64_t offset = static_cast<char*>(v.data) - m.base;
  std::vector<Pull> pulls;
  for (int p = 0; p < m.world; ++p)
    if (p != m.rank && v.count > 0)
      pulls.push_back({p, offset, static_cast<int64_t>(v.bytes()), m.copies[p]});
  m.post(compute, kPosted);
  m.await_all(comm, kPosted);
  m.copy(comm, pulls);
  m.post(comm, kConsumed);
  m.await_all(comm, kConsumed);
}

BufferView PeerCopy::copy(int r) const {
  const Impl& m = *impl_;
  TRAINER_CHECK(r >= 0 && r < m.world, "rank {} of {}", r, m.world);
  TRAINER_CHECK(r == m.rank || !m.copies.empty(), "no copy of rank {}'s buffer (hold_copies)", r);
  char* data = r == m.rank ? m.base : m.copies[r];
  return BufferView{data, m.bytes / static_cast<int64_t>(dtype_size(m.dtype)), m.dtype,
                    DeviceKind::kCuda};
}

void PeerCopy::gather(const BufferView& buf, const std::vector<Range>& segments,
                      cudaStream_t compute, cudaStream_t comm) {
  Impl& m = *impl_;
  TRAINER_CHECK(covers(buf) && static_cast<int>(segments.size()) == m.world,
                "peer gather outside the registered buffer");
  ++m.n;
  const size_t esize = dtype_size(buf.dtype);
  const int64_t offset = static_cast<char*>(buf.data) - m.base;
  std::vector<Pull> pulls;
  for (int p = 0; p < m.world; ++p) {
    TRAINER_CHECK(segments[p].begin >= 0 && segments[p].end <= buf.count,
                  "peer gather outside the registered buffer");
    if (p != m.rank && !segments[p].empty())
      pulls.push_back({p, offset + segments[p].begin * static_cast<int64_t>(esize),
                       segments[p].size() * static_cast<int64_t>(esize)});
  }
  m.post(compute, kPosted);
  m.await_all(comm, kPosted);
  m.copy(comm, pulls);
  m.post(comm, kConsumed);
  m.await_all(comm, kConsumed);
}

}  // namespace trainer
