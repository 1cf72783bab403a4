// cuBLASLt wrapper (see matmul.h): row-major problems mapped onto column-major cuBLASLt calls,
// with the plan of every distinct problem cached.
#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "core/cuda_check.h"
#include "core/error.h"
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

struct Matmul::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  int sm_target = 0;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;

  const Plan& plan(const Key& key, const Gemm& g);
};

const Plan& Matmul::Impl::plan(const Key& key, const Gemm& g) {
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

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->d, pref, 1, &result,
                                          &found),
           g);
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    runtime_error("cuBLASLt has no algorithm for {}", describe(g));
  p->algo = result.algo;
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
  const Plan& p = impl_->plan(key, g);
  LT_CHECK(cublasLtMatmul(impl_->handle, p.op, &g.alpha, g.b, p.a, g.a, p.b, &g.beta, c, p.c, g.d,
                          p.d, &p.algo, impl_->workspace.view().data, kWorkspaceBytes, stream),
           g);
  if (g_recorded) g_recorded->push_back(g);
}

}  // namespace trainer::cuda
