// MpiCommunicator collectives on host buffers, under mpirun with 2 and 3 ranks.
#include <mpi.h>

#include <vector>

#include "comm/mpi_communicator.h"
#include "core/bf16.h"
#include "tests/catch.h"

using namespace trainer;

namespace {
BufferView view(std::vector<float>& v) {
  return {v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

// Segments of counts[0], counts[1], ... elements, side by side from the start of a buffer.
std::vector<Range> consecutive_segments(const std::vector<int64_t>& counts) {
  std::vector<Range> out;
  int64_t at = 0;
  for (int64_t c : counts) {
    out.push_back({at, at + c});
    at += c;
  }
  return out;
}
}  // namespace

TEST_CASE("all_reduce, reduce_scatter, all_gather, broadcast") {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int r = comm.rank(), w = comm.world();
  REQUIRE(w >= 2);

  std::vector<float> a(1000);
  for (int i = 0; i < 1000; ++i) a[i] = static_cast<float>(r * 1000 + i);
  comm.all_reduce_sum(view(a))->wait();
  for (int i = 0; i < 1000; ++i)
    REQUIRE(a[i] == static_cast<float>(1000 * w * (w - 1) / 2 + w * i));

  // Uneven segments, one of them empty: rank k owns counts[k] elements.
  std::vector<int64_t> counts(w);
  for (int k = 0; k < w; ++k) counts[k] = k == 1 ? 0 : 10 + 7 * k;
  int64_t total = 0, mine = 0;
  for (int k = 0; k < w; ++k) {
    if (k == r) mine = total;
    total += counts[k];
  }
  std::vector<float> b(total);
  for (int64_t i = 0; i < total; ++i) b[i] = static_cast<float>(i + r);
  auto h = comm.reduce_scatter_sum(view(b), counts);
  while (!h->test()) comm.progress();
  for (int64_t i = mine; i < mine + counts[r]; ++i)
    REQUIRE(b[i] == static_cast<float>(w * i + w * (w - 1) / 2));

  std::vector<float> c(total, -1.0f);
  for (int64_t i = mine; i < mine + counts[r]; ++i) c[i] = static_cast<float>(100 + r);
  comm.all_gather(view(c), consecutive_segments(counts))->wait();
  int64_t at = 0;
  for (int k = 0; k < w; ++k)
    for (int64_t i = 0; i < counts[k]; ++i) REQUIRE(c[at++] == static_cast<float>(100 + k));

  // Segments apart and out of rank order (ZeRO-1's chunks): rank k owns [50 * (w-1-k) + 5, +9);
  // elements between them are left alone.
  std::vector<Range> seg(w);
  for (int k = 0; k < w; ++k) seg[k] = {50 * (w - 1 - k) + 5, 50 * (w - 1 - k) + 14};
  std::vector<float> e(50 * w, -1.0f);
  for (int64_t i = seg[r].begin; i < seg[r].end; ++i) e[i] = static_cast<float>(i * 10 + r);
  comm.all_gather(view(e), seg)->wait();
  for (int k = 0; k < w; ++k)
    for (int64_t i = seg[k].begin; i < seg[k].end; ++i)
      REQUIRE(e[i] == static_cast<float>(i * 10 + k));
  for (int64_t i = 0; i < 5; ++i) REQUIRE(e[i] == -1.0f);
  REQUIRE_THROWS(comm.all_gather(view(e), std::vector<Range>(w, Range{0, 3})));

  std::vector<float> d(77, static_cast<float>(r));
  comm.broadcast(view(d), w - 1)->wait();
  for (float x : d) REQUIRE(x == static_cast<float>(w - 1));

  REQUIRE(comm.sum(1.5) == 1.5 * w);
  REQUIRE(comm.max(static_cast<double>(r)) == w - 1);
  REQUIRE(comm.broadcast_string(r == 0 ? "hello" : "", 0) == "hello");
  std::vector<float> g(3 * w, 0.0f);
  std::vector<float> mine3 = {float(r), float(r) + 0.5f, float(r) + 0.25f};
  comm.gather_to_root(mine3.data(), 3, g.data());
  if (r == 0)
    for (int k = 0; k < w; ++k) REQUIRE(g[3 * k + 1] == static_cast<float>(k) + 0.5f);
  // Different counts per rank (rank k sends k floats, rank 0 none), back to back in rank order.
  std::vector<float> mine_k(r, static_cast<float>(r));
  std::vector<float> all_k(w * (w - 1) / 2, -1.0f);
  comm.gather_to_root(mine_k.data(), r, all_k.data());
  if (r == 0) {
    size_t at = 0;
    for (int k = 1; k < w; ++k)
      for (int i = 0; i < k; ++i) REQUIRE(all_k[at++] == static_cast<float>(k));
  }
  REQUIRE(local_rank_of(MPI_COMM_WORLD) == r);  // one node
}

TEST_CASE("a usage error on one rank reaches every rank") {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int bad = comm.world() - 1;
  try {
    agree_on_usage_errors(comm, [&] {
      if (comm.rank() == bad) usage_error("file missing on rank {}", bad);
    });
    FAIL("no error raised");
  } catch (const AgreedUsageError& e) {
    REQUIRE(std::string(e.what()).find("file missing on rank " + std::to_string(bad)) !=
            std::string::npos);
  }
  REQUIRE_NOTHROW(agree_on_usage_errors(comm, [] {}));
}

TEST_CASE("bf16 sums over MPI add in fp32 and round to bf16") {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int r = comm.rank(), w = comm.world();
  // Small integers are exact in bf16; 1 + 2^-9 per rank is not, and rounds at every partial sum.
  const int n = 300;
  std::vector<uint16_t> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = f32_to_bf16_bits(static_cast<float>(r + i % 17));
  BufferView va{a.data(), n, DType::kBF16, DeviceKind::kCpu};
  comm.all_reduce_sum(va)->wait();
  for (int i = 0; i < n; ++i)
    REQUIRE(bf16_bits_to_f32(a[i]) == static_cast<float>(w * (w - 1) / 2 + w * (i % 17)));

  std::vector<int64_t> counts(w, 8);
  std::vector<uint16_t> c(8 * w);
  for (int i = 0; i < 8 * w; ++i) c[i] = f32_to_bf16_bits(static_cast<float>(i + 2 * r));
  comm.reduce_scatter_sum({c.data(), 8 * w, DType::kBF16, DeviceKind::kCpu}, counts)->wait();
  for (int i = 8 * r; i < 8 * r + 8; ++i)
    REQUIRE(bf16_bits_to_f32(c[i]) == static_cast<float>(w * i + w * (w - 1)));

  // 256 + 1 is not a bf16 (8 bits of mantissa): the sum rounds, to nearest even, like a kernel's.
  for (int i = 0; i < n; ++i) b[i] = f32_to_bf16_bits(r == 0 ? 256.0f : 1.0f);
  comm.all_reduce_sum({b.data(), n, DType::kBF16, DeviceKind::kCpu})->wait();
  // 2 ranks: 256 + 1 = 257 is a tie between 256 and 258 and rounds to 256 (not 257, fp32's sum).
  // 3 ranks: 256 + 1 + 1 gives 256 or 258 depending on the order MPI adds in.
  const float got = bf16_bits_to_f32(b[0]);
  if (w == 2) REQUIRE(got == 256.0f);
  if (w == 3) REQUIRE((got == 256.0f || got == 258.0f));
  for (int i = 1; i < n; ++i) REQUIRE(b[i] == b[0]);
}
