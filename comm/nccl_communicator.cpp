#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/cuda/convert.h"
#include "comm/peer_copy.h"
#include "core/cuda_check.h"
#include "core/log.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

#define NCCL_CHECK(call, what)                                                                    \
  do {                                                                                            \
    ncclResult_t r_ = (call);                                                                     \
    if (r_ != ncclSuccess)                                                                        \
      runtime_error("rank {}: NCCL {} failed: {} ({})", log_rank(), what, ncclGetErrorString(r_), \
                    ncclGetLastError(nullptr));                                                   \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;  // fp16 parameters under ZeRO-1's all-gather
    case DType::kF64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

std::string describe(const char* op, const BufferView& b) {
  return fmt::format("{} of {:.2f} MiB ({})", op, b.bytes() / 1048576.0, dtype_name(b.dtype));
}

}  // namespace

struct NcclCommunicator::Impl {
  NcclOptions opt;
  int rank = 0, world = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t compute = nullptr, stream = nullptr;
  cudaEvent_t origin = nullptr;
  void* staging = nullptr;                      // bf16 scratch for --grad-reduce bf16
  std::unique_ptr<PeerCopy> peer, peer_gather;  // --grad-transport ce
  std::unique_ptr<PeerCopy> peer_copies;        // and --grad-reduce bf16

  // Events come from a pool that grows only during the first step; a record holds the pair of
  // events of one collective on the comm stream.
  std::vector<cudaEvent_t> pool;
  size_t used = 0;
  struct Pending {
    std::string name;
    size_t start, stop;
  };
  std::vector<Pending> records;

  // Watchdog: collectives in flight, in launch order (the comm stream is FIFO).
  struct InFlight {
    cudaEvent_t done;
    Clock::time_point launched;
    std::string name;
  };
  std::mutex mu;
  std::deque<InFlight> in_flight;
  std::atomic<bool> stop{false};
  std::thread watchdog;

  cudaEvent_t event(size_t i) { return pool[i]; }
  size_t next_event() {
    if (used == pool.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      pool.push_back(e);
    }
    return used++;
  }

  // Orders the comm stream after everything queued on the compute stream so far and records the
  // collective's start; end_collective() records its end and hands out the wait.
  size_t begin_collective(const std::string& name) {
    const size_t ready = next_event();
    CUDA_CHECK(cudaEventRecord(event(ready), compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream, event(ready), 0));
    const size_t start = next_event();
    CUDA_CHECK(cudaEventRecord(event(start), stream));
    records.push_back({name, start, 0});
    return start;
  }
  CommHandle end_collective();

  void watch() {
    CUDA_CHECK(cudaSetDevice(opt.device));
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        abort_ranks(fmt::format("asynchronous NCCL error: {}", ncclGetErrorString(async)));
      std::lock_guard<std::mutex> lock(mu);
      while (!in_flight.empty()) {
        const cudaError_t q = cudaEventQuery(in_flight.front().done);
        if (q == cudaSuccess) {
          in_flight.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady)
          abort_ranks(fmt::format("CUDA error {}", cudaGetErrorString(q)));
        const double waited =
            std::chrono::duration<double>(Clock::now() - in_flight.front().launched).count();
        if (waited > opt.timeout_s)
          abort_ranks(
              fmt::format("{} has not completed after {:.0f} s (--comm-timeout {}): a peer rank "
                          "is dead, stuck or out of step",
                          in_flight.front().name, waited, opt.timeout_s));
        break;
      }
    }
  }

  [[noreturn]] void abort_ranks(const std::string& why) {
    abort_all_ranks(fmt::format("rank {}/{}: {}", rank, world, why),
                    [this] { ncclCommAbort(comm); });
  }
};

class NcclRequest : public CommRequest {
 public:
  NcclRequest(cudaStream_t compute, cudaEvent_t done) : compute_(compute), done_(done) {}
  // The compute stream waits for the collective; the host does not.
  void wait() override {
    if (waited_) return;
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
  }
  bool test() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  cudaStream_t compute_;
  cudaEvent_t done_;
  bool waited_ = false;
};

CommHandle NcclCommunicator::Impl::end_collective() {
  const size_t stop_ev = next_event();
  CUDA_CHECK(cudaEventRecord(event(stop_ev), stream));
  records.back().stop = stop_ev;
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.push_back({event(stop_ev), Clock::now(), records.back().name});
  }
  return std::make_unique<NcclRequest>(compute, event(stop_ev));
}

NcclCommunicator::NcclCommunicator(const MpiCommunicator& boot, const NcclOptions& o)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = o;
  m.rank = boot.rank();
  m.world = boot.world();
  m.compute = static_cast<cudaStream_t>(o.compute_stream);
  CUDA_CHECK(cudaSetDevice(o.device));
  ncclUniqueId id;
  if (m.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, boot.comm());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (o.ctas > 0) config.minCTAs = config.maxCTAs = o.ctas;
  NCCL_CHECK(ncclCommInitRankConfig(&m.comm, m.world, id, m.rank, &config),
             "ncclCommInitRankConfig");
  // High priority: bucket collectives get scheduled between backward's kernels.
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&m.stream, cudaStreamNonBlocking, greatest));
  if (o.reduce_in_bf16 && o.staging_elems > 0)
    CUDA_CHECK(cudaMalloc(&m.staging, o.staging_elems * 2));
  if (o.peer_copy.data) m.peer = std::make_unique<PeerCopy>(boot, o.peer_copy, o.device, o.ctas);
  if (o.peer_gather.data) m.peer_gather = std::make_unique<PeerCopy>(boot, o.peer_gather, o.device);
  if (o.peer_copies.data)
    m.peer_copies = std::make_unique<PeerCopy>(boot, o.peer_copies, o.device, 0, true);
  m.watchdog = std::thread([&m] { m.watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  Impl& m = *impl_;
  m.stop = true;
  if (m.watchdog.joinable()) m.watchdog.join();
  cudaStreamSynchronize(m.stream);
  m.peer.reset();
  m.peer_gather.reset();
  m.peer_copies.reset();
  for (cudaEvent_t e : m.pool) cudaEventDestroy(e);
  if (m.staging) cudaFree(m.staging);
  ncclCommDestroy(m.comm);
  cudaStreamDestroy(m.stream);
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::world() const { return impl_->world; }

CommHandle NcclCommunicator::all_reduce_sum(BufferView buf) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda, "NCCL all_reduce needs a device buffer");
  if (m.peer && m.peer->covers(buf)) {
    // Rank r sums the r-th of world equal segments (256-byte aligned; the last takes the rest),
    // then each copies the others' sums.
    std::vector<int64_t> counts(m.world, buf.count / m.world / 64 * 64);
    counts.back() = buf.count - (m.world - 1) * counts[0];
    m.begin_collective(describe("all_reduce", buf) + " by copy engines");
    m.peer->reduce(buf, counts, /*gather=*/true, m.compute, m.stream);
    return m.end_collective();
  }
  const bool via_bf16 = m.opt.reduce_in_bf16 && buf.dtype == DType::kF32;
  m.begin_collective(describe("all_reduce", buf) + (via_bf16 ? " as bf16" : ""));
  if (via_bf16) {
    TRAINER_CHECK(buf.count <= m.opt.staging_elems, "bf16 staging of {} < {}", m.opt.staging_elems,
                  buf.count);
    cuda::f32_to_bf16(buf.as<float>(), m.staging, buf.count, m.stream);
    NCCL_CHECK(
        ncclAllReduce(m.staging, m.staging, buf.count, ncclBfloat16, ncclSum, m.comm, m.stream),
        "all_reduce");
    cuda::bf16_to_f32(m.staging, buf.as<float>(), buf.count, m.stream);
  } else {
    NCCL_CHECK(ncclAllReduce(buf.data, buf.data, buf.count, nccl_type(buf.dtype), ncclSum, m.comm,
                             m.stream),
               "all_reduce");
  }
  return m.end_collective();
}

CommHandle NcclCommunicator::reduce_scatter_sum(BufferView buf,
                                                const std::vector<int64_t>& counts) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda, "NCCL reduce_scatter needs a device buffer");
  TRAINER_CHECK(static_cast<int>(counts.size()) == m.world, "{} counts for world {}", counts.size(),
                m.world);
  if (m.peer && m.peer->covers(buf)) {
    m.begin_collective(describe("reduce_scatter", buf) + " by copy engines");
    m.peer->reduce(buf, counts, /*gather=*/false, m.compute, m.stream);
    return m.end_collective();
  }
  const bool via_bf16 = m.opt.reduce_in_bf16 && buf.dtype == DType::kF32;
  m.begin_collective(describe("reduce_scatter", buf) + (via_bf16 ? " as bf16" : ""));
  void* data = buf.data;
  ncclDataType_t type = nccl_type(buf.dtype);
  const size_t esize = via_bf16 ? 2 : dtype_size(buf.dtype);
  if (via_bf16) {
    TRAINER_CHECK(buf.count <= m.opt.staging_elems, "bf16 staging of {} < {}", m.opt.staging_elems,
                  buf.count);
    cuda::f32_to_bf16(buf.as<float>(), m.staging, buf.count, m.stream);
    data = m.staging;
    type = ncclBfloat16;
  }
  bool equal = true;
  for (int64_t c : counts) equal = equal && c == counts[0];
  int64_t mine = 0, offset = 0;
  if (equal) {
    // In place: rank r's result lands at its own offset, r * count.
    char* base = static_cast<char*>(data);
    NCCL_CHECK(ncclReduceScatter(base, base + m.rank * counts[0] * esize, counts[0], type, ncclSum,
                                 m.comm, m.stream),
               "reduce_scatter");
    mine = counts[0];
    offset = m.rank * counts[0];
  } else {
    // Uneven parts (a bucket that straddles shard boundaries): one reduce to each owner.
    NCCL_CHECK(ncclGroupStart(), "group start");
    int64_t at = 0;
    for (int r = 0; r < m.world; ++r) {
      if (counts[r] > 0) {
        char* p = static_cast<char*>(data) + at * esize;
        NCCL_CHECK(ncclReduce(p, p, counts[r], type, ncclSum, r, m.comm, m.stream), "reduce");
      }
      if (r == m.rank) offset = at, mine = counts[r];
      at += counts[r];
    }
    NCCL_CHECK(ncclGroupEnd(), "group end");
  }
  if (via_bf16)
    cuda::bf16_to_f32(static_cast<char*>(m.staging) + offset * 2, buf.as<float>() + offset, mine,
                      m.stream);
  return m.end_collective();
}

CommHandle NcclCommunicator::gather_copies(BufferView buf) {
  Impl& m = *impl_;
  TRAINER_CHECK(m.peer_copies && m.peer_copies->covers(buf),
                "gather_copies of a buffer set up without peer copies");
  m.begin_collective(describe("gather_copies", buf) + " by copy engines");
  m.peer_copies->gather_copies(buf, m.compute, m.stream);
  return m.end_collective();
}

BufferView NcclCommunicator::copy_of(int r) const {
  TRAINER_CHECK(impl_->peer_copies, "no peer copies set up");
  return impl_->peer_copies->copy(r);
}

CommHandle NcclCommunicator::all_gather(BufferView buf, const std::vector<Range>& segments) {
  Impl& m = *impl_;
  TRAINER_CHECK(buf.device == DeviceKind::kCuda, "NCCL all_gather needs a device buffer");
  check_segments(segments, m.world, buf.count);
  int64_t gathered = 0;
  for (const Range& r : segments) gathered += r.size();
  if (m.peer_gather && m.peer_gather->covers(buf)) {
    m.begin_collective(describe("all_gather", buf.slice(0, gathered)) + " by copy engines");
    m.peer_gather->gather(buf, segments, m.compute, m.stream);
    return m.end_collective();
  }
  m.begin_collective(describe("all_gather", buf.slice(0, gathered)));
  const size_t esize = dtype_size(buf.dtype);
  char* base = static_cast<char*>(buf.data);
  // ncclAllGather wants equal pieces laid side by side in rank order; anything else (ZeRO-1's
  // parts sit one shard apart) is one broadcast per rank, grouped into one launch. (Grouped
  // ncclSend/ncclRecv to every peer ran as fast on 2 and 4 H200s but NCCL then keeps
  // point-to-point buffers per peer: 0.4 GiB more per GPU on 2 GPUs, 1.2 GiB on 4.)
  bool adjacent = true;
  for (int r = 0; r < m.world; ++r)
    adjacent = adjacent && segments[r].size() == segments[0].size() &&
               segments[r].begin == segments[0].begin + r * segments[0].size();
  if (adjacent) {
    const int64_t n = segments[0].size();
    NCCL_CHECK(
        ncclAllGather(base + segments[m.rank].begin * esize, base + segments[0].begin * esize, n,
                      nccl_type(buf.dtype), m.comm, m.stream),
        "all_gather");
  } else {
    NCCL_CHECK(ncclGroupStart(), "group start");
    for (int r = 0; r < m.world; ++r) {
      char* at = base + segments[r].begin * esize;
      if (!segments[r].empty())
        NCCL_CHECK(
            ncclBroadcast(at, at, segments[r].size(), nccl_type(buf.dtype), r, m.comm, m.stream),
            "broadcast");
    }
    NCCL_CHECK(ncclGroupEnd(), "group end");
  }
  return m.end_collective();
}

CommHandle NcclCommunicator::broadcast(BufferView buf, int root) {
  Impl& m = *impl_;
  m.begin_collective(describe("broadcast", buf));
  NCCL_CHECK(
      ncclBroadcast(buf.data, buf.data, buf.count, nccl_type(buf.dtype), root, m.comm, m.stream),
      "broadcast");
  return m.end_collective();
}

void NcclCommunicator::barrier() {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  MPI_Barrier(MPI_COMM_WORLD);
}

void NcclCommunicator::set_origin(void* e) { impl_->origin = static_cast<cudaEvent_t>(e); }

std::vector<CollectiveRecord> NcclCommunicator::take_records() {
  Impl& m = *impl_;
  // The collectives that have finished, a prefix (the comm stream is FIFO). Those still running
  // (ZeRO-1's all-gathers overlap the next forward) keep their events for the next call.
  size_t done = 0;
  for (; done < m.records.size(); ++done) {
    const cudaError_t q = cudaEventQuery(m.event(m.records[done].stop));
    if (q == cudaErrorNotReady) break;
    CUDA_CHECK(q);
  }
  std::vector<CollectiveRecord> out;
  for (size_t i = 0; i < done; ++i) {
    const auto& r = m.records[i];
    CollectiveRecord c;
    c.name = r.name;
    float a = 0, b = 0;
    if (m.origin) {
      CUDA_CHECK(cudaEventElapsedTime(&a, m.origin, m.event(r.start)));
      CUDA_CHECK(cudaEventElapsedTime(&b, m.origin, m.event(r.stop)));
    } else {
      CUDA_CHECK(cudaEventElapsedTime(&b, m.event(r.start), m.event(r.stop)));
    }
    c.start_ms = a;
    c.end_ms = b;
    out.push_back(std::move(c));
  }
  // Every other event may be recorded again: the kept records' events move to the front of the
  // pool. (An event a comm-stream wait was enqueued on may be re-recorded: the wait is bound to
  // the record it saw.)
  std::vector<Impl::Pending> kept(m.records.begin() + static_cast<std::ptrdiff_t>(done),
                                  m.records.end());
  std::vector<cudaEvent_t> pool;
  std::vector<bool> moved(m.pool.size(), false);
  for (auto& r : kept)
    for (size_t* i : {&r.start, &r.stop}) {
      pool.push_back(m.pool[*i]);
      moved[*i] = true;
      *i = pool.size() - 1;
    }
  m.used = pool.size();
  for (size_t i = 0; i < m.pool.size(); ++i)
    if (!moved[i]) pool.push_back(m.pool[i]);
  m.pool = std::move(pool);
  m.records = std::move(kept);
  {
    // The watchdog must not see a finished collective's event once it is recorded again; the
    // kept collectives are the newest entries, and still in flight.
    std::lock_guard<std::mutex> lock(m.mu);
    while (m.in_flight.size() > m.records.size()) m.in_flight.pop_front();
  }
  return out;
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const MpiCommunicator& boot,
                                                         const NcclOptions& o) {
  return std::make_unique<NcclCommunicator>(boot, o);
}

}  // namespace trainer
