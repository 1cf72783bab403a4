#include "comm/mpi_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string_view>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"

namespace trainer {
namespace {

// MPI counts are ints; larger transfers are split into chunks of this many elements.
constexpr int64_t kMaxChunk = int64_t{1} << 30;

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  runtime_error("rank {}: {} failed: {}", rank, call, std::string(msg, len));
}
#define MPI_CHECK(call) mpi_check((call), #call)
// A blocking call of this communicator's rank, under its watchdog (set_wait_limit).
#define MPI_BLOCKING(call) blocking(#call, [&] { MPI_CHECK(call); })

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kBF16:
      return MPI_UINT16_T;  // moved as bits; summed by bf16_sum below
    case DType::kF16:
      break;  // only CUDA runs in fp16, and its device buffers go through NCCL
  }
  runtime_error("MPI collectives on {} buffers are not supported", dtype_name(t));
}

// MPI has no bf16: sums of bf16 buffers add in fp32 and round each partial sum to bf16, as a
// reduction kernel on bf16 data does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = f32_to_bf16_bits(bf16_bits_to_f32(a[i]) + bf16_bits_to_f32(b[i]));
}

MPI_Op mpi_sum(DType t) {
  if (t != DType::kBF16) return MPI_SUM;
  static const MPI_Op op = [] {
    MPI_Op o;
    MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &o));
    return o;
  }();
  return op;
}

void check_host(const BufferView& b, const char* op) {
  TRAINER_CHECK(b.device == DeviceKind::kCpu, "MPI {} needs a host buffer", op);
}

int as_int_count(int64_t n, const char* op) {
  if (n > INT_MAX)
    runtime_error("MPI {} of {} elements per rank exceeds MPI's int count limit", op, n);
  return static_cast<int>(n);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

void abort_all_ranks(const std::string& why, const std::function<void()>& before_abort) {
  spdlog::critical("{}; aborting every rank (from host {})", why, host_name());
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  // MPI_Abort asks the launcher to kill every rank; should that (or `before_abort`) hang on a dead
  // host, this process exits anyway.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(3);
  }).detach();
  if (before_abort) before_abort();
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

// Watches the blocking MPI call of the rank's main thread (at most one at a time): a thread that
// looks every 100 ms and stops every rank once the call has waited longer than the limit.
struct MpiCommunicator::Watchdog {
  std::atomic<double> limit_s{0};
  std::atomic<int64_t> since_ns{0};  // when the current call began; 0: none is waiting
  std::atomic<const char*> what{""};
  std::atomic<bool> stop{false};
  int rank = 0, world = 1;
  std::thread thread;

  Watchdog(int r, int w) : rank(r), world(w), thread([this] { watch(); }) {}
  ~Watchdog() {
    stop = true;
    thread.join();
  }
  void watch() {
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t since = since_ns.load();
      const double limit = limit_s.load();
      if (since == 0 || limit <= 0) continue;
      const double waited = (now_ns() - since) / 1e9;
      const std::string_view call = what.load();  // "MPI_Bcast(&n, 1, ...)": name the function
      if (waited > limit)
        abort_all_ranks(fmt::format(
            "rank {}/{}: {} has waited {:.0f} s for the other ranks (--comm-timeout {:g}): a peer "
            "rank is dead, stuck or cut off",
            rank, world, call.substr(0, call.find('(')), waited, limit));
    }
  }
};

void MpiCommunicator::set_wait_limit(double seconds) {
  if (!watchdog_ && seconds > 0) watchdog_ = std::make_shared<Watchdog>(rank_, world_);
  if (watchdog_) watchdog_->limit_s = seconds;
}

template <typename F>
void MpiCommunicator::blocking(const char* what, F&& call) const {
  Watchdog* w = watchdog_.get();
  if (!w) return call();
  w->what = what;
  w->since_ns = now_ns();
  struct Done {
    Watchdog* w;
    ~Done() { w->since_ns = 0; }
  } done{w};
  call();
}

class MpiRequest : public CommRequest {
 public:
  MpiRequest(MpiCommunicator* comm, const char* what, std::vector<MPI_Request> reqs,
             std::function<void()> on_done)
      : comm_(comm), what_(what), reqs_(std::move(reqs)), on_done_(std::move(on_done)) {
    comm_->live_.push_back(this);
  }
  ~MpiRequest() override {
    if (!done_) wait();
  }
  void wait() override {
    if (done_) return;
    comm_->blocking(what_, [&] {
      MPI_CHECK(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE));
    });
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(
        MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    auto& live = comm_->live_;
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
    if (on_done_) on_done_();
  }
  MpiCommunicator* comm_;
  const char* what_;  // the collective, for the watchdog's message
  std::vector<MPI_Request> reqs_;
  std::function<void()> on_done_;
  bool done_ = false;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &world_));
}

CommHandle MpiCommunicator::all_reduce_sum(BufferView buf) {
  check_host(buf, "all_reduce");
  std::vector<MPI_Request> reqs;
  const size_t esize = dtype_size(buf.dtype);
  for (int64_t off = 0; off < buf.count; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, buf.count - off));
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(buf.data) + off * esize, n,
                             mpi_type(buf.dtype), mpi_sum(buf.dtype), comm_, &r));
    reqs.push_back(r);
  }
  return std::make_unique<MpiRequest>(this, "MPI_Iallreduce", std::move(reqs), nullptr);
}

CommHandle MpiCommunicator::reduce_scatter_sum(BufferView buf, const std::vector<int64_t>& counts) {
  check_host(buf, "reduce_scatter");
  TRAINER_CHECK(static_cast<int>(counts.size()) == world_, "{} counts for world {}", counts.size(),
                world_);
  std::vector<int> icounts(world_);
  int64_t total = 0, my_offset = 0;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) my_offset = total;
    icounts[r] = as_int_count(counts[r], "reduce_scatter");
    total += counts[r];
  }
  TRAINER_CHECK(total == buf.count, "reduce_scatter counts sum to {} for a buffer of {}", total,
                buf.count);
  // MPI writes this rank's result to the start of a receive buffer; copy it into place after.
  const size_t esize = dtype_size(buf.dtype);
  auto recv = std::make_shared<std::vector<char>>(std::max<size_t>(1, counts[rank_] * esize));
  MPI_Request r;
  MPI_CHECK(MPI_Ireduce_scatter(buf.data, recv->data(), icounts.data(), mpi_type(buf.dtype),
                                mpi_sum(buf.dtype), comm_, &r));
  const int64_t mine = counts[rank_];
  char* dst = static_cast<char*>(buf.data) + my_offset * esize;
  return std::make_unique<MpiRequest>(
      this, "MPI_Ireduce_scatter", std::vector<MPI_Request>{r},
      [recv, dst, mine, esize] { std::memcpy(dst, recv->data(), mine * esize); });
}

CommHandle MpiCommunicator::all_gather(BufferView buf, const std::vector<Range>& segments) {
  check_host(buf, "all_gather");
  check_segments(segments, world_, buf.count);
  std::vector<int> icounts(world_), displs(world_);
  for (int r = 0; r < world_; ++r) {
    icounts[r] = as_int_count(segments[r].size(), "all_gather");
    displs[r] = as_int_count(segments[r].begin, "all_gather");
  }
  MPI_Request r;
  MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data, icounts.data(),
                            displs.data(), mpi_type(buf.dtype), comm_, &r));
  return std::make_unique<MpiRequest>(this, "MPI_Iallgatherv", std::vector<MPI_Request>{r},
                                      nullptr);
}

CommHandle MpiCommunicator::broadcast(BufferView buf, int root) {
  check_host(buf, "broadcast");
  // Bytes, so any dtype (bf16 included) can be broadcast.
  std::vector<MPI_Request> reqs;
  const int64_t bytes = static_cast<int64_t>(buf.bytes());
  for (int64_t off = 0; off < bytes; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
    MPI_Request r;
    MPI_CHECK(MPI_Ibcast(static_cast<char*>(buf.data) + off, n, MPI_BYTE, root, comm_, &r));
    reqs.push_back(r);
  }
  return std::make_unique<MpiRequest>(this, "MPI_Ibcast", std::move(reqs), nullptr);
}

void MpiCommunicator::barrier() { MPI_BLOCKING(MPI_Barrier(comm_)); }

void MpiCommunicator::progress() {
  // test() may remove the request from live_, so walk a copy.
  std::vector<CommRequest*> live = live_;
  for (CommRequest* r : live) r->test();
}

double MpiCommunicator::sum(double x) const {
  double out = 0;
  MPI_BLOCKING(MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_SUM, comm_));
  return out;
}

double MpiCommunicator::max(double x) const {
  double out = 0;
  MPI_BLOCKING(MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, comm_));
  return out;
}

int64_t MpiCommunicator::max(int64_t x) const {
  int64_t out = 0;
  MPI_BLOCKING(MPI_Allreduce(&x, &out, 1, MPI_INT64_T, MPI_MAX, comm_));
  return out;
}

std::string MpiCommunicator::broadcast_string(const std::string& s, int root) const {
  int64_t n = static_cast<int64_t>(s.size());
  MPI_BLOCKING(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_));
  std::string out = rank_ == root ? s : std::string(n, '\0');
  MPI_BLOCKING(MPI_Bcast(out.data(), as_int_count(n, "broadcast_string"), MPI_CHAR, root, comm_));
  return out;
}

std::vector<std::vector<double>> MpiCommunicator::gather_to_root(
    const std::vector<double>& mine) const {
  const int n = static_cast<int>(mine.size());
  std::vector<double> all(rank_ == 0 ? static_cast<size_t>(n) * world_ : 0);
  MPI_BLOCKING(MPI_Gather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, comm_));
  std::vector<std::vector<double>> rows;
  if (rank_ == 0)
    for (int r = 0; r < world_; ++r)
      rows.emplace_back(all.begin() + r * n, all.begin() + (r + 1) * n);
  return rows;
}

void MpiCommunicator::gather_to_root(const float* mine, int64_t n, float* root_out) const {
  const int count = as_int_count(n, "gather_to_root");
  std::vector<int> counts(world_), displs(world_);
  MPI_BLOCKING(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_));
  int64_t total = 0;
  for (int r = 0; r < world_; ++r)
    displs[r] = as_int_count(total, "gather_to_root"), total += counts[r];
  MPI_BLOCKING(MPI_Gatherv(mine, count, MPI_FLOAT, root_out, counts.data(), displs.data(),
                           MPI_FLOAT, 0, comm_));
}

std::vector<std::string> MpiCommunicator::gather_strings_to_root(const std::string& mine) const {
  const int n = as_int_count(static_cast<int64_t>(mine.size()), "gather_strings");
  std::vector<int> sizes(world_), displs(world_);
  MPI_BLOCKING(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_));
  int64_t total = 0;
  for (int r = 0; r < world_; ++r)
    displs[r] = as_int_count(total, "gather_strings"), total += sizes[r];
  std::string all(rank_ == 0 ? total : 0, '\0');
  MPI_BLOCKING(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(),
                           MPI_CHAR, 0, comm_));
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int r = 0; r < world_; ++r) out.push_back(all.substr(displs[r], sizes[r]));
  return out;
}

int lowest_rank_where(const MpiCommunicator& comm, bool mine) {
  return static_cast<int>(-comm.max(mine ? int64_t{-comm.rank()} : int64_t{-comm.world()}));
}

void agree_on_error_message(const MpiCommunicator& comm, const std::string& my_error) {
  const int first_bad = lowest_rank_where(comm, !my_error.empty());
  if (first_bad >= comm.world()) return;  // nobody failed
  const std::string msg = comm.broadcast_string(my_error, first_bad);
  if (!my_error.empty()) throw AgreedUsageError(my_error);
  throw AgreedUsageError(fmt::format("rank {}: {}", first_bad, msg));
}

NodeRanks node_ranks_of(MPI_Comm comm) {
  // Ranks that share memory share a node, whatever the launcher (mpirun, srun, ...).
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  NodeRanks n;
  MPI_CHECK(MPI_Comm_rank(node, &n.rank));
  MPI_CHECK(MPI_Comm_size(node, &n.size));
  MPI_CHECK(MPI_Comm_free(&node));
  return n;
}

void wait_all(std::vector<CommHandle>& handles) {
  for (auto& h : handles) h->wait();
  handles.clear();
}

void check_segments(const std::vector<Range>& segments, int world, int64_t count) {
  TRAINER_CHECK(static_cast<int>(segments.size()) == world, "{} all_gather segments for world {}",
                segments.size(), world);
  std::vector<Range> sorted = segments;
  std::sort(sorted.begin(), sorted.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  int64_t end = 0;
  for (const Range& r : sorted) {
    TRAINER_CHECK(r.begin >= end && r.end >= r.begin && r.end <= count,
                  "all_gather segment [{}, {}) overlaps another or leaves a buffer of {}", r.begin,
                  r.end, count);
    end = r.end;
  }
}

}  // namespace trainer
