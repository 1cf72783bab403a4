// At the GPU's power cap a kernel costs the step its energy, not its time alone: does another of
// cuBLASLt's algorithms do a training step's products for fewer joules? A developer's probe,
// outside the trainer (results: docs/results/log.md, 2026-11-26 23:28):
//
//   gemm_energy_probe MODEL TOKENS [ALGOS [MS]]      MODEL: small | 2.7B (d, d_ff, layers; vocab
//                                                     10000), TOKENS = batch x ctx
//
// The products are those of one training step in bf16 with fp32 weight gradients, as
// model/cuda/cuda_replica.cu makes them: forward (QKV, output + residual, W1|W3, W2 + residual,
// head), input gradients and weight gradients, on all SMs (the trainer's forward on 2.7B leaves
// some to the update beside it). For each, the first ALGOS (8) of cublasLtMatmulAlgoGetHeuristic
// run back to back for MS (1200) milliseconds each, in two rounds, after 3 s of load that brings
// the GPU to its cap, on random operands (constant ones draw far less power). Each line gives the
// time per product, the SM clock while it ran, the power NVML reports at the window's end (its
// average over the last second), the energy per product (that power times the time; NVML's energy
// counter over the window in the last columns, a cross-check that is coarse over short windows),
// and the product's cost at the power limit (its energy over the limit): what the step would
// spend on it when held at the cap. The summary sums the step's products (blocks x layers) for
// the heuristic's first algorithm, the least energy, and the shortest time. PICKS=FILE writes the
// heuristic ranks of the least-energy and the fastest algorithm of each product.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/device_buffer.h"
#include "runtime/floors.h"
#include "runtime/gpu_energy.h"
#include "runtime/gpu_power.h"
#include "tests/probe_check.h"

namespace {

// One product in the trainer's row-major convention (matmul.h): D[m,n] = alpha op(A) op(B) +
// beta C, A/B bf16, C/D bf16 or fp32.
struct Prob {
  std::string name;
  int per_step;  // calls per step
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  bool c_separate;  // C is another buffer (the residual), beta 1
  bool d_f32;
  float alpha, beta;
};

uint32_t pow2_align(int64_t ld, int es) {
  const uint64_t v = static_cast<uint64_t>(ld) * es;
  const uint64_t low = v & (~v + 1);
  return low >= 256 ? 256 : static_cast<uint32_t>(low);
}

struct Plan {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{}, d{};
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

Plan plan(cublasLtHandle_t h, const Prob& p, int want, size_t ws) {
  Plan pl;
  CB(cublasLtMatmulDescCreate(&pl.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CB(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const cudaDataType_t cd = p.d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  CB(cublasLtMatrixLayoutCreate(&pl.a, CUDA_R_16BF, p.tb ? p.k : p.n, p.tb ? p.n : p.k, p.ldb));
  CB(cublasLtMatrixLayoutCreate(&pl.b, CUDA_R_16BF, p.ta ? p.m : p.k, p.ta ? p.k : p.m, p.lda));
  CB(cublasLtMatrixLayoutCreate(&pl.c, cd, p.n, p.m, p.ldd));
  CB(cublasLtMatrixLayoutCreate(&pl.d, cd, p.n, p.m, p.ldd));
  cublasLtMatmulPreference_t pref{};
  CB(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = ws;
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                          sizeof wsb));
  const int es = p.d_f32 ? 4 : 2;
  const uint32_t al[4] = {pow2_align(p.ldb, 2), pow2_align(p.lda, 2), pow2_align(p.ldd, es),
                          pow2_align(p.ldd, es)};
  const cublasLtMatmulPreferenceAttributes_t at[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    CB(cublasLtMatmulPreferenceSetAttribute(pref, at[i], &al[i], sizeof al[i]));
  pl.algos.resize(want);
  int found = 0;
  CB(cublasLtMatmulAlgoGetHeuristic(h, pl.op, pl.a, pl.b, pl.c, pl.d, pref, want, pl.algos.data(),
                                    &found));
  pl.algos.resize(found);
  cublasLtMatmulPreferenceDestroy(pref);
  return pl;
}

std::string describe_algo(const cublasLtMatmulAlgo_t& a) {
  int id = 0, tile = 0, stages = 0, split = 0, swz = 0, cluster = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split,
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz,
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                       sizeof cluster, &w);
  char buf[96];
  std::snprintf(buf, sizeof buf, "id%d tile%d st%d split%d swz%d cl%d", id, tile, stages, split,
                swz, cluster);
  return buf;
}

struct Result {
  double us = 0, mj = 0, mj_counter = 0, mhz = 0, watts = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::printf("usage: gemm_energy_probe small|2.7B TOKENS [ALGOS [MS]]\n");
    return 2;
  }
  const std::string model = argv[1];
  const int64_t n = std::atoll(argv[2]);
  const int want = argc > 3 ? std::atoi(argv[3]) : 8;
  const double window_ms = argc > 4 ? std::atof(argv[4]) : 1200;
  int64_t d = 768, f = 3072, L = 12;
  if (model == "2.7B") d = 2560, f = 10240, L = 32;
  const int64_t V = 10000, Vp = 10000;
  std::string why;
  const auto nv = trainer::make_power_sampler(trainer::cuda_device_pci_bus_id(0), 5, &why);
  if (!nv) {
    std::printf("NVML unavailable: %s\n", why.c_str());
    return 1;
  }
  const double limit_w = nv->limit_watts();

  const float scale = 1.0f / static_cast<float>(n);
  // name, per step, ta, tb, m, n, k, lda, ldb, ldd, C separate, D fp32, alpha, beta
  std::vector<Prob> probs = {
      {"fwd qkv", (int)L, false, true, n, 3 * d, d, d, d, 3 * d, false, false, 1, 0},
      {"fwd o+res", (int)L, false, true, n, d, d, d, d, d, true, false, 1, 1},
      {"fwd w1|w3", (int)L, false, true, n, 2 * f, d, d, d, 2 * f, false, false, 1, 0},
      {"fwd w2+res", (int)L, false, true, n, d, f, f, f, d, true, false, 1, 1},
      {"fwd head", 1, false, true, n, V, d, d, d, Vp, false, false, 1, 0},
      {"dx head", 1, false, false, n, d, V, Vp, d, d, false, false, scale, 0},
      {"dW head", 1, true, false, V, d, n, Vp, d, d, false, true, scale, 0},
      {"dx w2", (int)L, false, false, n, f, d, d, f, f, false, false, 1, 0},
      {"dW w2", (int)L, true, false, d, f, n, d, f, f, false, true, 1, 0},
      {"dx o", (int)L, false, false, n, d, d, d, d, d, false, false, 1, 0},
      {"dW o", (int)L, true, false, d, d, n, d, d, d, false, true, 1, 0},
      {"dx w1|w3", (int)L, false, false, n, d, 2 * f, 2 * f, d, d, false, false, 1, 0},
      {"dW w1|w3", (int)L, true, false, 2 * f, d, n, 2 * f, d, d, false, true, 1, 0},
      {"dx qkv", (int)L, false, false, n, d, 3 * d, 3 * d, d, d, false, false, 1, 0},
      {"dW qkv", (int)L, true, false, 3 * d, d, n, 3 * d, d, d, false, true, 1, 0},
  };

  cublasLtHandle_t h{};
  CB(cublasLtCreate(&h));
  const size_t ws_bytes = size_t{32} << 20;
  void *ws = nullptr, *A = nullptr, *B = nullptr, *C = nullptr, *D = nullptr;
  size_t amax = 0, bmax = 0, dmax = 0;
  for (const Prob& p : probs) {
    amax = std::max(amax, size_t(p.ta ? p.k : p.m) * p.lda * 2);
    bmax = std::max(bmax, size_t(p.tb ? p.n : p.k) * p.ldb * 2);
    dmax = std::max(dmax, size_t(p.m) * p.ldd * (p.d_f32 ? 4 : 2));
  }
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMalloc(&A, amax));
  CK(cudaMalloc(&B, bmax));
  CK(cudaMalloc(&C, dmax));
  CK(cudaMalloc(&D, dmax));
  // Random bf16 in (-1, 1): a tensor core's power depends on how many bits toggle, and constant
  // operands (a memset) draw little more than half of what real activations do.
  {
    const std::vector<uint16_t> a = trainer::random_bf16_bits(amax / 2, 1);
    const std::vector<uint16_t> b = trainer::random_bf16_bits(bmax / 2, 2);
    CK(cudaMemcpy(A, a.data(), amax, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, b.data(), bmax, cudaMemcpyHostToDevice));
  }
  CK(cudaMemset(C, 0, dmax));
  cudaStream_t s{};
  CK(cudaStreamCreate(&s));
  std::vector<Plan> plans;
  for (const Prob& p : probs) plans.push_back(plan(h, p, want, ws_bytes));

  auto run = [&](size_t pi, size_t ai) {
    const Prob& p = probs[pi];
    const Plan& pl = plans[pi];
    CB(cublasLtMatmul(h, pl.op, &p.alpha, B, pl.a, A, pl.b, &p.beta, p.c_separate ? C : D, pl.c, D,
                      pl.d, &pl.algos[ai].algo, ws, ws_bytes, s));
  };
  // One window: products back to back for `ms`, the clock sampled meanwhile, the energy counter
  // around it.
  auto measure = [&](size_t pi, size_t ai, double ms) {
    CK(cudaStreamSynchronize(s));
    const double j0 = nv->energy_joules();
    nv->begin();
    const trainer::CallEnergy e = trainer::energy_per_call(s, *nv, ms, [&] { run(pi, ai); });
    Result r;
    r.mhz = nv->end().sm_mhz_median;
    const double j1 = nv->energy_joules();
    r.us = 1e3 * e.ms;
    r.watts = e.watts;
    r.mj = 1e3 * e.joules();
    r.mj_counter = 1e3 * (j1 - j0) / e.calls;
    return r;
  };

  std::printf(
      "model %s tokens %lld d %lld d_ff %lld layers %lld; power limit %.0f W; %d algos, "
      "%.0f ms windows\n",
      model.c_str(), (long long)n, (long long)d, (long long)f, (long long)L, limit_w, want,
      window_ms);
  // Load until the cap holds: the first product's first algorithm for 3 s.
  {
    const Result w = measure(2, 0, 3000.0);
    std::printf("warm-up: %.1f us/product at %.0f MHz, %.0f W\n", w.us, w.mhz, w.watts);
  }

  // results[round][problem][algo]
  const int rounds = 2;
  std::vector<std::vector<std::vector<Result>>> res(rounds,
                                                    std::vector<std::vector<Result>>(probs.size()));
  for (int round = 0; round < rounds; ++round)
    for (size_t pi = 0; pi < probs.size(); ++pi)
      for (size_t ai = 0; ai < plans[pi].algos.size(); ++ai)
        res[round][pi].push_back(measure(pi, ai, window_ms));

  // PICKS=FILE: one line per product, "m n k ta tb d_f32 least-energy fastest" (heuristic ranks).
  FILE* picks = std::getenv("PICKS") ? std::fopen(std::getenv("PICKS"), "w") : nullptr;
  double step_first = 0, step_least_e = 0, step_fastest = 0;
  double step_first_us = 0, step_least_e_us = 0, step_fastest_us = 0;
  for (size_t pi = 0; pi < probs.size(); ++pi) {
    const Prob& p = probs[pi];
    const double gflop = 2.0 * p.m * p.n * p.k * 1e-9;
    std::printf("\n%s: m %lld n %lld k %lld%s%s, %d per step, %.1f GFLOP\n", p.name.c_str(),
                (long long)p.m, (long long)p.n, (long long)p.k, p.ta ? " A^T" : "",
                p.tb ? " B^T" : "", p.per_step, gflop);
    std::printf("  %-2s %-38s %7s %7s %7s %7s %5s %5s %7s %s\n", "#", "algo", "us r1", "us r2",
                "mJ r1", "mJ r2", "MHz", "W", "us@cap", "TFLOP/s, counter mJ r1 r2");
    size_t least_e = 0, fastest = 0;
    std::vector<double> mj_avg, us_avg;
    for (size_t ai = 0; ai < plans[pi].algos.size(); ++ai) {
      const Result& a = res[0][pi][ai];
      const Result& b = res[1][pi][ai];
      mj_avg.push_back(0.5 * (a.mj + b.mj));
      us_avg.push_back(0.5 * (a.us + b.us));
      std::printf("  %-2zu %-38s %7.1f %7.1f %7.2f %7.2f %5.0f %5.0f %7.1f %4.0f, %.2f %.2f\n", ai,
                  describe_algo(plans[pi].algos[ai].algo).c_str(), a.us, b.us, a.mj, b.mj,
                  0.5 * (a.mhz + b.mhz), 0.5 * (a.watts + b.watts), 1e3 * mj_avg.back() / limit_w,
                  gflop / (us_avg.back() * 1e-6) * 1e-3, a.mj_counter, b.mj_counter);
      if (mj_avg[ai] < mj_avg[least_e]) least_e = ai;
      if (us_avg[ai] < us_avg[fastest]) fastest = ai;
    }
    std::printf("  least energy #%zu (%.1f%% of #0's), fastest #%zu\n", least_e,
                100.0 * mj_avg[least_e] / mj_avg[0], fastest);
    if (picks)
      std::fprintf(picks, "%lld %lld %lld %d %d %d %zu %zu\n", (long long)p.m, (long long)p.n,
                   (long long)p.k, p.ta, p.tb, p.d_f32, least_e, fastest);
    step_first += p.per_step * mj_avg[0];
    step_least_e += p.per_step * mj_avg[least_e];
    step_fastest += p.per_step * mj_avg[fastest];
    step_first_us += p.per_step * us_avg[0];
    step_least_e_us += p.per_step * us_avg[least_e];
    step_fastest_us += p.per_step * us_avg[fastest];
  }
  std::printf(
      "\nstep's products: heuristic's first %.1f J (%.2f ms alone, %.2f ms at %.0f W); "
      "least energy %.1f J (%.2f ms alone, %.2f ms at the cap); fastest %.1f J (%.2f ms "
      "alone, %.2f ms at the cap)\n",
      step_first * 1e-3, step_first_us * 1e-3, step_first / limit_w, limit_w, step_least_e * 1e-3,
      step_least_e_us * 1e-3, step_least_e / limit_w, step_fastest * 1e-3, step_fastest_us * 1e-3,
      step_fastest / limit_w);
  if (picks) std::fclose(picks);
  return 0;
}
