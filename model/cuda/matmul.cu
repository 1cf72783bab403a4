// cuBLASLt wrapper (see matmul.h): row-major problems mapped onto column-major cuBLASLt calls,
// with the plan of every distinct problem cached.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/common.cuh"
#include "model/cuda/matmul.h"

namespace trainer::cuda {
namespace {

// Largest power of two (up to 256) dividing v.
uint32_t pow2_divisor(uint64_t v) {
  if (v == 0) return 256;
  const uint64_t low = v & (~v + 1);
  return low >= 256 ? 256 : static_cast<uint32_t>(low);
}

// What cuBLASLt may assume about the alignment of every row (and batch entry) of an operand:
// the start address, the row stride and, when batched, the batch stride all count.
uint32_t alignment(const void* p, int64_t ld, int64_t stride, bool batched, DType t) {
  const uint64_t es = dtype_size(t);
  uint32_t a = pow2_divisor(reinterpret_cast<uintptr_t>(p));
  a = std::min(a, pow2_divisor(static_cast<uint64_t>(ld) * es));
  if (batched) a = std::min(a, pow2_divisor(static_cast<uint64_t>(stride) * es));
  return a;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      break;
  }
  runtime_error("matmul: unsupported element type {}", dtype_name(t));
}

// The problem as cached: everything the plan depends on.
struct Key {
  bool ta, tb, tf32, in_place;
  DType ab, cd;
  int64_t m, n, k, lda, ldb, ldc, ldd, batch, sa, sb, sc, sd;
  uint32_t align_a, align_b, align_c, align_d;
  int32_t sm_target;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull + (h >> 29); };
    mix(static_cast<uint64_t>(k.ta) | static_cast<uint64_t>(k.tb) << 1 |
        static_cast<uint64_t>(k.tf32) << 2 | static_cast<uint64_t>(k.in_place) << 3 |
        static_cast<uint64_t>(k.ab) << 8 | static_cast<uint64_t>(k.cd) << 16);
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.ldd, k.batch, k.sa, k.sb, k.sc, k.sd})
      mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(k.align_a) | static_cast<uint64_t>(k.align_b) << 16 |
        static_cast<uint64_t>(k.align_c) << 32 | static_cast<uint64_t>(k.align_d) << 48);
    mix(static_cast<uint64_t>(k.sm_target));
    return static_cast<size_t>(h);
  }
};

// Descriptors and the chosen algorithm of one problem.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destruction status is ignored: nothing useful can be done about it in a destructor.
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void check(cublasStatus_t st, const char* call, const Gemm& g) {
  if (st != CUBLAS_STATUS_SUCCESS)
    runtime_error("cuBLASLt call {} failed: {} ({}) for {}", call, cublasLtGetStatusString(st),
                  static_cast<int>(st), describe(g));
}

#define LT_CHECK(call, g) check((call), #call, (g))

// --- Tuning (Matmul::set_tuning) -------------------------------------------------------------
// Candidates are the heuristic's first kTuneCandidates (on an H200 it offers at most 8 for the
// presets' products, so every one); each is timed kTuneRounds times, round robin, over at least
// kTuneMinMs (and kTuneMinReps calls); a candidate replaces the first choice only when its median
// is kTuneMargin faster.
constexpr int kTuneCandidates = 16;
constexpr int kTuneRounds = 3;
constexpr int kTuneMinReps = 3;
constexpr float kTuneMinMs = 0.5f;
constexpr float kTuneMargin = 0.02f;

// Where a row-major matrix of `rows` x `cols` at row stride `ld` lies in a scratch allocation
// (from element `first` on), and its role in the product: kA or kB, with the reduction index k
// along its rows (k_rows) or its columns, k of them; kC for C and D.
struct Region {
  enum Role { kA, kB, kC };
  int64_t first, rows, cols, ld;
  Role role;
  bool k_rows;
  int64_t k;
};

// The n elements of an operand's allocation (t: kBF16, kF16 or kF32).
//
// Inside the matrix: values that make any two algorithms that add the products in different orders
// or groupings, or round partial sums differently (a split of k, a reduction in fp32 against the
// tensor cores' fused accumulation), give different results, even where the output is bf16 and
// hides most fp32 differences. Most values are u 2^e, u uniform in [-1, 1), e in -3..3, one in 8
// zero, one in 8 subnormal. Reduction indices k = 5 (mod 32) and k + 16 form cancelling pairs:
// A's column k + 16 is minus its column k, both 2^10 times larger, and B's rows k and k + 16 are
// equal, so the pair's products cancel exactly while, added at different moments among the small
// ones, they absorb different low bits of those: the order shows in the top bits of the result.
//
// Everywhere else (before the matrix, its rows' padding, after it) NaN: in a step that memory
// holds other tensors or never-written bytes, any of which may be NaN or Inf, and an algorithm
// that loads it and multiplies it by zero (0 x NaN = NaN) must not pass for equal.
__global__ void tune_fill_kernel(void* p, int64_t n, DType t, uint32_t seed, Region m) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t j = i - m.first;
    float v = __int_as_float(0x7FC00000);  // quiet NaN
    if (j >= 0 && j < m.rows * m.ld && j % m.ld < m.cols) {
      float scale = 1.0f;
      if (m.role != Region::kC) {
        const int64_t k = m.k_rows ? j / m.ld : j % m.ld;
        if (k % 32 == 5 && k + 16 < m.k) {
          if (m.role == Region::kA) scale = 1024.0f;
        } else if (k % 32 == 21) {  // the second of a pair: the first's value (A: negated)
          j -= m.k_rows ? 16 * m.ld : 16;
          scale = m.role == Region::kA ? -1024.0f : 1.0f;
        }
      }
      const uint32_t h = hash_index(j, seed);
      v = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
      v = ldexpf(v, static_cast<int>(((h * 0x2C1B3C6Du) >> 28) % 7) - 3);
      if (scale != 1.0f) {
        v *= scale;
      } else if (j % 8 == 5) {
        v = 0.0f;
      } else if (j % 8 == 3) {
        v *= t == DType::kF16 ? 1e-5f : 1e-38f;  // below the smallest normal
      }
    }
    if (t == DType::kF32) {
      static_cast<float*>(p)[i] = v;
    } else if (t == DType::kF16) {
      static_cast<__half*>(p)[i] = __float2half(v);
    } else {
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    }
  }
}

// Counts the 32-bit words in which a and b differ into *diff.
__global__ void tune_diff_kernel(const uint32_t* a, const uint32_t* b, int64_t words,
                                 unsigned long long* diff) {
  unsigned long long n = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    n += a[i] != b[i];
  if (n) atomicAdd(diff, n);
}

// Device memory for one tuning, freed on scope exit; empty when cudaMalloc failed. `bytes` hold
// an operand, `slack` more bytes follow it: an operand in a step has other data after it, and an
// algorithm whose result depends on memory past the matrix (seen: the vocabulary's tail) must
// not pass for equal, so the slack is filled too (tune_fill_kernel). at(align) is a pointer aligned
// to exactly `align` bytes (a power of two up to 256), as the problem's operand is: kernels may
// take other paths for operands aligned otherwise.
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0, slack = 0;
  explicit Scratch(size_t b, size_t after = 0)
      : bytes((b + 3) & ~size_t{3}), slack(((after + 3) & ~size_t{3}) + 256) {
    if (cudaMalloc(&p, bytes + slack) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky: tune nothing, carry on
      p = nullptr;
    }
  }
  ~Scratch() {
    if (p) cudaFree(p);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* at(uint32_t align) const { return static_cast<char*>(p) + (align < 256 ? align : 0); }
};

// Elements a row-major operand of `rows` rows of `cols` at row stride `ld` spans.
int64_t row_span(int64_t rows, int64_t cols, int64_t ld) { return (rows - 1) * ld + cols; }
}  // namespace

Gemm linear_gemm(const void* x, const void* W, void* y, int64_t ldy, int64_t n, int64_t d_in,
                 int64_t d_out, DType ab, DType cd, const void* resid) {
  Gemm g;
  g.trans_b = true;
  g.m = n;
  g.n = d_out;
  g.k = d_in;
  g.a = x;
  g.lda = d_in;
  g.b = W;
  g.ldb = d_in;
  g.d = y;
  g.ldd = ldy;
  if (resid) {
    g.c = resid;
    g.ldc = ldy;
    g.beta = 1.0f;
  }
  g.ab_type = ab;
  g.cd_type = cd;
  return g;
}

std::string describe(const Gemm& g) {
  return fmt::format(
      "gemm m={} n={} k={} op(A)={} op(B)={} lda={} ldb={} ldc={} ldd={} batch={} strides "
      "({}, {}, {}, {}) A/B {} C/D {}{} alpha={} beta={}",
      g.m, g.n, g.k, g.trans_a ? "A^T" : "A", g.trans_b ? "B^T" : "B", g.lda, g.ldb, g.ldc, g.ldd,
      g.batch, g.stride_a, g.stride_b, g.stride_c, g.stride_d, dtype_name(g.ab_type),
      dtype_name(g.cd_type), g.tf32 ? " tf32" : "", g.alpha, g.beta);
}

namespace {
std::vector<Gemm>* g_recorded = nullptr;
}  // namespace

void record_gemms(std::vector<Gemm>* sink) { g_recorded = sink; }

namespace {
// Tuning's picks for the process: (device, problem) -> index into the heuristic's results, which
// are the same for the same descriptors. A Matmul planning a problem another one tuned (the
// benchmark's floors replaying the step's products) takes that pick instead of timing again.
class PickCache {
 public:
  std::optional<int> find(int device, const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto& picks = by_device_[device];
    const auto it = picks.find(key);
    if (it == picks.end()) return std::nullopt;
    return it->second;
  }
  void keep(int device, const Key& key, int pick) {
    std::lock_guard<std::mutex> lock(mu_);
    by_device_[device].emplace(key, pick);
  }

 private:
  std::mutex mu_;
  std::map<int, std::unordered_map<Key, int, KeyHash>> by_device_;
};

PickCache& pick_cache() {
  static PickCache cache;
  return cache;
}
}  // namespace

struct Matmul::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  int sm_target = 0;
  bool tune = false;
  TuneStats stats;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;

  const Plan& plan(const Key& key, const Gemm& g, cudaStream_t stream);
  // D = alpha op(A) op(B) + beta C (c: C's pointer, g.d when in place) with p's descriptors.
  cublasStatus_t launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Gemm& g,
                        const void* c, cudaStream_t stream) const {
    return cublasLtMatmul(handle, p.op, &g.alpha, g.b, p.a, g.a, p.b, &g.beta, c, p.c, g.d, p.d,
                          &algo, workspace.view().data, kWorkspaceBytes, stream);
  }
  // Index into `results` of the algorithm to use: the fastest (alone, on scratch operands of the
  // problem's shape) of those whose outputs equal results[0]'s bit for bit on scratch operands
  // with beta 0 and 1 and on g's own operands; 0 when none is kTuneMargin faster; -1 when it
  // could not tell (scratch memory short, the first choice refused to run).
  int tuned_pick(const Plan& p, const Key& key, const Gemm& g,
                 const cublasLtMatmulHeuristicResult_t* results, int found, cudaStream_t stream);
};

int Matmul::Impl::tuned_pick(const Plan& p, const Key& key, const Gemm& g,
                             const cublasLtMatmulHeuristicResult_t* results, int found,
                             cudaStream_t stream) {
  const size_t es_ab = dtype_size(key.ab), es_cd = dtype_size(key.cd);
  const int64_t a_elems =
      key.ta ? row_span(key.k, key.m, key.lda) : row_span(key.m, key.k, key.lda);
  const int64_t b_elems =
      key.tb ? row_span(key.n, key.k, key.ldb) : row_span(key.k, key.n, key.ldb);
  const int64_t d_elems = row_span(key.m, key.n, key.ldd);
  const int64_t c_elems = key.in_place ? d_elems : row_span(key.m, key.n, key.ldc);
  // 128 rows of slack after each operand that kernels read, 512 after the output: an algorithm
  // that writes past the matrix (a whole tile of rows, say) must not pass for equal, so the
  // output's whole allocation, slack included, starts from the same bytes for every candidate
  // (d0) and is compared whole.
  Scratch a(a_elems * es_ab, 128 * key.lda * es_ab), b(b_elems * es_ab, 128 * key.ldb * es_ab),
      c(key.in_place ? 4 : c_elems * es_cd, key.in_place ? 0 : 128 * key.ldc * es_cd),
      d(d_elems * es_cd, 512 * key.ldd * es_cd), d0(d.bytes, d.slack - 256),
      out(d.bytes, d.slack - 256), ref(d.bytes, d.slack - 256),
      diff(sizeof(unsigned long long) * 3 * found);
  for (const Scratch* m : {&a, &b, &c, &d, &d0, &out, &ref, &diff})
    if (!m->p) return -1;
  for (const Scratch* m : {&out, &ref, &diff})
    CUDA_CHECK(cudaMemsetAsync(m->p, 0, m->bytes + m->slack, stream));
  const size_t d_all = d.bytes + d.slack;  // d, d0, out and ref alike
  // The problem on scratch operands, each aligned as the call's is.
  Gemm t = g;
  t.a = a.at(key.align_a);
  t.b = b.at(key.align_b);
  t.d = d.at(key.align_d);
  t.c = key.in_place ? nullptr : c.at(key.align_c);
  void* const cp = key.in_place ? t.d : c.at(key.align_c);
  // Every byte of the operands' allocations, slack included: random inside the matrices, NaN
  // around them. d0 is the output's initial contents (its C when in place).
  auto region = [](uint32_t align, size_t es, int64_t rows, int64_t cols, int64_t ld,
                   Region::Role role = Region::kC, bool k_rows = false, int64_t k = 0) {
    return Region{
        align < 256 ? static_cast<int64_t>(align / es) : 0, rows, cols, ld, role, k_rows, k};
  };
  const struct {
    const Scratch* s;
    DType type;
    Region m;
  } fills[] = {{&a, key.ab,
                region(key.align_a, es_ab, key.ta ? key.k : key.m, key.ta ? key.m : key.k, key.lda,
                       Region::kA, key.ta, key.k)},
               {&b, key.ab,
                region(key.align_b, es_ab, key.tb ? key.n : key.k, key.tb ? key.k : key.n, key.ldb,
                       Region::kB, !key.tb, key.k)},
               {&c, key.cd, region(key.align_c, es_cd, key.in_place ? 0 : key.m, key.n, key.ldc)},
               {&d0, key.cd, region(key.align_d, es_cd, key.m, key.n, key.ldd)}};
  uint32_t seed = 0x5EED;
  for (const auto& f : fills) {
    const int64_t n = static_cast<int64_t>((f.s->bytes + f.s->slack) / dtype_size(f.type));
    tune_fill_kernel<<<256, 256, 0, stream>>>(f.s->p, n, f.type, seed += 0x9E37, f.m);
    CUDA_CHECK(cudaGetLastError());
  }
  auto* counts = static_cast<unsigned long long*>(diff.p);
  std::vector<bool> ok(found, true);
  // Passes 0 and 1: the scratch operands with beta 0 and 1. Pass 2: this first call's own
  // operands and beta, its output going to d (aligned as the call's, starting from the call's D).
  Gemm own = g;
  own.d = t.d;
  if (key.in_place) own.c = nullptr;
  const void* const own_c = key.in_place ? own.d : g.c;
  for (int pass = 0; pass < 3; ++pass) {
    t.beta = static_cast<float>(pass);
    for (int i = 0; i < found; ++i) {
      if (!ok[i]) continue;
      CUDA_CHECK(cudaMemcpyAsync(d.p, d0.p, d_all, cudaMemcpyDeviceToDevice, stream));
      if (pass == 2)
        CUDA_CHECK(cudaMemcpyAsync(own.d, g.d, d_elems * es_cd, cudaMemcpyDeviceToDevice, stream));
      if (results[i].state != CUBLAS_STATUS_SUCCESS ||
          (pass < 2 ? launch(p, results[i].algo, t, cp, stream)
                    : launch(p, results[i].algo, own, own_c, stream)) != CUBLAS_STATUS_SUCCESS) {
        if (i == 0) return -1;
        ok[i] = false;
        continue;
      }
      CUDA_CHECK(
          cudaMemcpyAsync(i == 0 ? ref.p : out.p, d.p, d_all, cudaMemcpyDeviceToDevice, stream));
      if (i > 0) {
        tune_diff_kernel<<<256, 256, 0, stream>>>(
            static_cast<const uint32_t*>(ref.p), static_cast<const uint32_t*>(out.p),
            static_cast<int64_t>(d_all / 4), counts + 3 * i + pass);
        CUDA_CHECK(cudaGetLastError());
      }
    }
  }
  std::vector<unsigned long long> host(3 * found);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), counts, diff.bytes, cudaMemcpyDeviceToHost, stream));
  // Timed alone: nothing else of this process runs on the GPU meanwhile.
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int> same;
  for (int i = 0; i < found; ++i)
    if (ok[i] && host[3 * i] == 0 && host[3 * i + 1] == 0 && host[3 * i + 2] == 0)
      same.push_back(i);
  stats.offered += found - 1;
  stats.identical += static_cast<int>(same.size()) - 1;
  if (same.size() < 2) return 0;

  // Each candidate kTuneRounds times, round robin, reps calls a time, on the call's own beta.
  t.beta = g.beta;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  struct EventGuard {
    cudaEvent_t a, b;
    ~EventGuard() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  } guard{e0, e1};
  auto time_calls = [&](int i, int reps) {
    CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int r = 0; r < reps; ++r) LT_CHECK(launch(p, results[i].algo, t, cp, stream), g);
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / static_cast<float>(reps);
  };
  time_calls(0, 1);  // warm-up
  const float one = time_calls(0, 1);
  const int reps =
      std::clamp(static_cast<int>(kTuneMinMs / std::max(one, 1e-3f)) + 1, kTuneMinReps, 100);
  std::vector<std::vector<float>> ms(same.size());
  for (int r = 0; r < kTuneRounds; ++r)
    for (size_t j = 0; j < same.size(); ++j) ms[j].push_back(time_calls(same[j], reps));
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  size_t best = 0;
  std::vector<float> med(same.size());
  for (size_t j = 0; j < same.size(); ++j) {
    med[j] = median(ms[j]);
    if (med[j] < med[best]) best = j;
  }
  ++stats.tuned;
  if (best == 0 || med[best] >= med[0] * (1.0f - kTuneMargin)) return 0;
  ++stats.switched;
  stats.first_ms += med[0];
  stats.picked_ms += med[best];
  return same[best];
}

const Plan& Matmul::Impl::plan(const Key& key, const Gemm& g, cudaStream_t stream) {
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CHECK(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F), g);
  // Column-major view: D^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
           g);
  LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
           g);
  if (key.sm_target > 0)
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                            &key.sm_target, sizeof(key.sm_target)),
             g);
  const cudaDataType_t ab = cuda_type(key.ab), cd = cuda_type(key.cd);
  // The row-major B is cuBLASLt's A: stored (n x k) column-major when not transposed.
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, key.tb ? key.k : key.n, key.tb ? key.n : key.k,
                                      key.ldb),
           g);
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, key.ta ? key.m : key.k, key.ta ? key.k : key.m,
                                      key.lda),
           g);
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, cd, key.n, key.m, key.ldc), g);
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->d, cd, key.n, key.m, key.ldd), g);
  if (key.batch > 1) {
    const int32_t count = static_cast<int32_t>(key.batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {
        {p->a, key.sb}, {p->b, key.sa}, {p->c, key.sc}, {p->d, key.sd}};
    for (const auto& [layout, stride] : strided) {
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)),
               g);
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)),
               g);
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), g);
  // The preference is destroyed whatever happens below.
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t ws = kWorkspaceBytes;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof(ws)),
           g);
  // cuBLASLt assumes 256-byte aligned pointers unless told otherwise.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, value] : aligns)
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), g);

  // Tuned: 16-bit inputs, one matrix, and not while the stream is being captured into a graph
  // (the tuning synchronises the device).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool tuned =
      tune && key.ab != DType::kF32 && key.batch == 1 && capture == cudaStreamCaptureStatusNone;
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->d, pref,
                                          tuned ? kTuneCandidates : 1, results, &found),
           g);
  if (found == 0 || results[0].state != CUBLAS_STATUS_SUCCESS)
    runtime_error("cuBLASLt has no algorithm for {}", describe(g));
  ++stats.problems;
  int pick = 0;
  if (tuned && found > 1) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (const std::optional<int> known = pick_cache().find(device, key)) {
      pick = *known < found ? *known : 0;
      ++stats.reused;
    } else if ((pick = tuned_pick(*p, key, g, results, found, stream)) >= 0) {
      pick_cache().keep(device, key, pick);
    } else {
      pick = 0;  // not decided: the first choice, and the next Matmul tries again
    }
  }
  p->algo = results[pick].algo;
  return *plans.emplace(key, std::move(p)).first->second;
}

Matmul::Matmul() : impl_(std::make_unique<Impl>()) {
  const cublasStatus_t st = cublasLtCreate(&impl_->handle);
  if (st != CUBLAS_STATUS_SUCCESS)
    runtime_error("cuBLASLt call cublasLtCreate failed: {} ({})", cublasLtGetStatusString(st),
                  static_cast<int>(st));
  impl_->workspace = DeviceBuffer(DeviceKind::kCuda, DType::kF32, kWorkspaceBytes / 4);
}

Matmul::~Matmul() {
  impl_->plans.clear();
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

size_t Matmul::plans() const { return impl_->plans.size(); }

void Matmul::set_tuning(bool on) { impl_->tune = on; }

Matmul::TuneStats Matmul::tune_stats() const { return impl_->stats; }

void Matmul::set_sm_target(int sms) {
  TRAINER_CHECK(sms >= 0, "matmul: negative SM target {}", sms);
  impl_->sm_target = sms;
}

void Matmul::run(const Gemm& g, cudaStream_t stream) {
  TRAINER_CHECK(g.m > 0 && g.n > 0 && g.k > 0 && g.batch >= 1, "matmul: bad sizes in {}",
                describe(g));
  TRAINER_CHECK(g.a && g.b && g.d, "matmul: null operand in {}", describe(g));
  TRAINER_CHECK(g.lda >= (g.trans_a ? g.m : g.k) && g.ldb >= (g.trans_b ? g.k : g.n) &&
                    g.ldd >= g.n && (!g.c || g.ldc >= g.n),
                "matmul: row stride too small in {}", describe(g));
  TRAINER_CHECK(g.ab_type == DType::kF32 || g.ab_type == DType::kBF16 || g.ab_type == DType::kF16,
                "matmul: A/B type must be f32, bf16 or f16 in {}", describe(g));
  TRAINER_CHECK(g.cd_type == DType::kF32 || g.cd_type == g.ab_type,
                "matmul: C/D type must be f32 or the A/B type in {}", describe(g));
  TRAINER_CHECK(!g.tf32 || g.ab_type == DType::kF32, "matmul: tf32 needs fp32 inputs in {}",
                describe(g));
  TRAINER_CHECK(g.batch < (int64_t{1} << 31), "matmul: batch too large in {}", describe(g));
  const void* c = g.c ? g.c : g.d;
  const int64_t ldc = g.c ? g.ldc : g.ldd;
  const int64_t stride_c = g.c ? g.stride_c : g.stride_d;
  const bool in_place = c == g.d;
  TRAINER_CHECK(!in_place || ldc == g.ldd, "matmul: in-place C needs ldc == ldd in {}",
                describe(g));
  const bool batched = g.batch > 1;
  const Key key{g.trans_a,
                g.trans_b,
                g.tf32,
                in_place,
                g.ab_type,
                g.cd_type,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                ldc,
                g.ldd,
                g.batch,
                batched ? g.stride_a : 0,
                batched ? g.stride_b : 0,
                batched ? stride_c : 0,
                batched ? g.stride_d : 0,
                alignment(g.a, g.lda, g.stride_a, batched, g.ab_type),
                alignment(g.b, g.ldb, g.stride_b, batched, g.ab_type),
                alignment(c, ldc, stride_c, batched, g.cd_type),
                alignment(g.d, g.ldd, g.stride_d, batched, g.cd_type),
                impl_->sm_target};
  const Plan& p = impl_->plan(key, g, stream);
  LT_CHECK(impl_->launch(p, p.algo, g, c, stream), g);
  if (g_recorded) g_recorded->push_back(g);
}

}  // namespace trainer::cuda
