// Can an AdamW-like update (bound by memory bandwidth) run beside a forward's GEMMs (bound by the
// tensor cores), and how should its kernel be shaped? A developer's probe, outside the trainer:
//
//   overlap_probe [LAYERS [ELEMENTS]]          the update beside the GEMMs
//   overlap_probe LAYERS ELEMENTS kernels      the update's kernel alone, grid shapes
//
// The GEMMs are 2.7B's forward (2048 tokens, d 2560, d_ff 10240: QKV, output, W1|W3, W2 per layer,
// cuBLASLt's first heuristic), LAYERS times, also planned for fewer SMs than the GPU has
// (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, "SMs N" below); the update reads p, m, v, g (fp32) and
// writes p, m, v and a bf16 copy, 30 bytes per element, over ELEMENTS split into LAYERS parts.
// Overlapped, the GEMMs of layer l wait for part l, as the trainer's forward does
// (--overlap-update), or ("no waits") do not. The update runs either as the trainer's short
// blocks, or as a "lane": N persistent blocks, each alone on an SM, at the highest priority, with
// the GEMMs planned for the other SMs. Each line is the median of 5 timed repetitions after 2
// warm-up, with when each stream finished in the last one; results in docs/results/log.md.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/probe_check.h"

namespace {

template <class V>
__device__ __forceinline__ V load_hint(const V* p, bool cs) {
  return cs ? __ldcs(p) : *p;
}
template <class V>
__device__ __forceinline__ void store_hint(V* p, V x, bool cs) {
  if (cs)
    __stcs(p, x);
  else
    *p = x;
}

// One group of four: the update's arithmetic, then p, m, v and the bf16 copy stored at group i
// (evict-first with cs).
__device__ __forceinline__ void update_group(float* p, float* m, float* v, __nv_bfloat16* out,
                                             int64_t i, float4& p4, float4& m4, float4& v4,
                                             const float4& g4, bool cs) {
  float* pp = &p4.x;
  float* mm = &m4.x;
  float* vv = &v4.x;
  const float* gg = &g4.x;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    mm[k] = 0.9f * mm[k] + 0.1f * gg[k];
    vv[k] = 0.95f * vv[k] + 0.05f * gg[k] * gg[k];
    pp[k] = pp[k] * 0.9999f - 1e-4f * mm[k] / (sqrtf(vv[k]) + 1e-8f);
  }
  store_hint(reinterpret_cast<float4*>(p) + i, p4, cs);
  store_hint(reinterpret_cast<float4*>(m) + i, m4, cs);
  store_hint(reinterpret_cast<float4*>(v) + i, v4, cs);
  __nv_bfloat162 lo = __floats2bfloat162_rn(p4.x, p4.y), hi = __floats2bfloat162_rn(p4.z, p4.w);
  uint2 w;
  w.x = *reinterpret_cast<uint32_t*>(&lo);
  w.y = *reinterpret_cast<uint32_t*>(&hi);
  store_hint(reinterpret_cast<uint2*>(out) + i, w, cs);
}

// The update on groups of four elements: with iters_per_block 0 a grid-stride loop, else each
// block takes iters_per_block * blockDim.x consecutive groups and ends.
__global__ void update_kernel(float* p, float* m, float* v, const float* g, __nv_bfloat16* out,
                              int64_t n4, int iters_per_block) {
  int64_t begin, stride, end;
  if (iters_per_block == 0) {
    begin = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    end = n4;
  } else {
    const int64_t chunk = static_cast<int64_t>(iters_per_block) * blockDim.x;
    begin = blockIdx.x * chunk + threadIdx.x;
    stride = blockDim.x;
    end = min(n4, static_cast<int64_t>(blockIdx.x + 1) * chunk);
  }
  for (int64_t i = begin; i < end; i += stride) {
    float4 p4 = reinterpret_cast<float4*>(p)[i], m4 = reinterpret_cast<float4*>(m)[i],
           v4 = reinterpret_cast<float4*>(v)[i];
    update_group(p, m, v, out, i, p4, m4, v4, reinterpret_cast<const float4*>(g)[i], false);
  }
}

// The update as a lane of `gridDim.x` persistent blocks of T threads, one per SM (the dynamic
// shared memory the launch asks for keeps a second block, or a GEMM's, off that SM), each thread
// with U groups of four elements in flight per pass: bytes in flight, not SMs, bound a memory
// stream, so a few SMs with deep loads can move what the whole GPU moves with shallow ones.
// CS: loads and stores marked evict-first (ld/st.global.cs), so the streamed state does not push
// the GEMMs' operands out of L2.
template <int U, int T, bool CS = false>
__global__ void __launch_bounds__(T, 1)
    lane_kernel(float* p, float* m, float* v, const float* g, __nv_bfloat16* out, int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; base < n4;
       base += U * stride) {
    float4 p4[U], m4[U], v4[U], g4[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * stride;
      if (i < n4) {
        p4[u] = load_hint(reinterpret_cast<float4*>(p) + i, CS);
        m4[u] = load_hint(reinterpret_cast<float4*>(m) + i, CS);
        v4[u] = load_hint(reinterpret_cast<float4*>(v) + i, CS);
        g4[u] = load_hint(reinterpret_cast<const float4*>(g) + i, CS);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * stride;
      if (i >= n4) break;
      update_group(p, m, v, out, i, p4[u], m4[u], v4[u], g4[u], CS);
    }
  }
}
constexpr int kLaneSmem = 120 << 10;  // more than half an SM's shared memory

// How the update's kernel is launched.
struct Shape {
  int threads;
  int iters;          // per block; 0: grid-stride
  int blocks_per_sm;  // grid-stride: blocks per SM (0: `sms` blocks in all)
  int sms;
  int unroll = 0;   // > 0: lane_kernel<unroll, threads> on `sms` blocks
  bool cs = false;  // lane_kernel: evict-first loads and stores
  int grid(int64_t n4, int device_sms) const {
    if (iters > 0)
      return static_cast<int>((n4 + int64_t{iters} * threads - 1) / (int64_t{iters} * threads));
    return blocks_per_sm > 0 ? device_sms * blocks_per_sm : sms;
  }
};

struct Gemm {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
};

template <class F>
float median_ms(cudaStream_t s, F&& work) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a, s));
    work(a);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (rep >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int L = argc > 1 ? std::atoi(argv[1]) : 32;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 3355443200LL;  // 2.7B's parameters
  const bool kernels_alone = argc > 3 && std::string(argv[3]) == "kernels";
  const int M = 2048, D = 2560, F = 10240;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *p, *m, *v, *g;
  __nv_bfloat16* out;
  for (float** b : {&p, &m, &v, &g}) {
    CK(cudaMalloc(b, 4 * n));
    CK(cudaMemset(*b, 0, 4 * n));
  }
  CK(cudaMalloc(&out, 2 * n));
  for (auto* f : {lane_kernel<1, 1024>, lane_kernel<2, 1024>, lane_kernel<4, 512>,
                  lane_kernel<2, 1024, true>})
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kLaneSmem));
  auto update = [&](cudaStream_t s, const Shape& k, int64_t b4, int64_t e4) {
    if (k.unroll > 0) {
      auto* f = k.unroll == 1   ? lane_kernel<1, 1024>
                : k.unroll == 2 ? (k.cs ? lane_kernel<2, 1024, true> : lane_kernel<2, 1024>)
                                : lane_kernel<4, 512>;
      f<<<k.sms, k.threads, kLaneSmem, s>>>(p + 4 * b4, m + 4 * b4, v + 4 * b4, g + 4 * b4,
                                            out + 4 * b4, e4 - b4);
      CK(cudaGetLastError());
      return;
    }
    update_kernel<<<k.grid(e4 - b4, sms), k.threads, 0, s>>>(
        p + 4 * b4, m + 4 * b4, v + 4 * b4, g + 4 * b4, out + 4 * b4, e4 - b4, k.iters);
    CK(cudaGetLastError());
  };

  if (kernels_alone) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const std::vector<Shape> shapes = {
        {256, 0, 8, 0},  {256, 0, 4, 0}, {512, 0, 4, 0}, {1024, 0, 2, 0}, {256, 1, 0, 0},
        {256, 2, 0, 0},  {256, 4, 0, 0}, {256, 8, 0, 0}, {256, 16, 0, 0}, {256, 32, 0, 0},
        {128, 16, 0, 0}, {512, 4, 0, 0}, {512, 8, 0, 0}, {512, 16, 0, 0}, {1024, 4, 0, 0}};
    for (const int64_t elems : {n, n / 27}) {
      for (const Shape& k : shapes) {
        const float ms = median_ms(s, [&](cudaEvent_t) { update(s, k, 0, elems / 4); });
        std::printf("n %11lld threads %4d %s %2d: median %8.3f ms (%6.0f GB/s at 30 B/elem)\n",
                    static_cast<long long>(elems), k.threads,
                    k.iters ? "iters/block" : "blocks/SM  ", k.iters ? k.iters : k.blocks_per_sm,
                    ms, 30.0 * static_cast<double>(elems) / (ms * 1e-3) / 1e9);
        std::fflush(stdout);
      }
    }
    return 0;
  }

  // y[M, N] = x[M, K] w[N, K]^T in row-major terms: column-major C[N, M] = op(W)[N, K] X[K, M].
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  size_t ws_bytes = size_t{64} << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  auto make = [&](int N, int K, int32_t sm_target) {
    Gemm G{};
    CB(cublasLtMatmulDescCreate(&G.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(G.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                      sizeof(sm_target)));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(G.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CB(cublasLtMatmulDescSetAttribute(G.op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    CB(cublasLtMatrixLayoutCreate(&G.a, CUDA_R_16BF, K, N, K));
    CB(cublasLtMatrixLayoutCreate(&G.b, CUDA_R_16BF, K, M, K));
    CB(cublasLtMatrixLayoutCreate(&G.c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, G.op, G.a, G.b, G.c, G.c, pref, 1, &r, &found));
    if (found == 0) {
      std::printf("no cuBLASLt algorithm for N %d K %d\n", N, K);
      std::exit(1);
    }
    G.algo = r.algo;
    return G;
  };
  // Plans per SM target (0: all of the GPU's).
  const std::vector<int> reserve = {0, 16, 24, 32, 40, 48, 64};
  std::vector<int> targets;
  for (const int r : reserve) targets.push_back(r ? sms - r : 0);
  std::vector<std::vector<Gemm>> plans;
  for (const int tg : targets)
    plans.push_back({make(3 * D, D, tg), make(D, D, tg), make(2 * F, D, tg), make(D, F, tg)});
  __nv_bfloat16 *x, *w, *y;
  CK(cudaMalloc(&x, sizeof(__nv_bfloat16) * M * F * 2));
  CK(cudaMalloc(&w, sizeof(__nv_bfloat16) * F * 2 * D));
  CK(cudaMalloc(&y, sizeof(__nv_bfloat16) * M * F * 2));
  CK(cudaMemset(x, 0, sizeof(__nv_bfloat16) * M * F * 2));
  CK(cudaMemset(w, 0, sizeof(__nv_bfloat16) * F * 2 * D));
  const float alpha = 1, beta = 0;
  auto gemms = [&](cudaStream_t s, int plan) {
    for (Gemm& G : plans[plan])
      CB(cublasLtMatmul(lt, G.op, &alpha, w, G.a, x, G.b, &beta, y, G.c, y, G.c, &G.algo, ws,
                        ws_bytes, s));
  };
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));

  struct Variant {
    std::string name;
    bool gemm, upd, overlap;
    Shape k;
    bool urgent;               // the GEMMs' stream at the highest priority
    int plan = 0;              // index into targets
    bool lane_urgent = false;  // the update's stream at the highest priority
    bool waits = true;         // the GEMMs of layer l wait for part l of the update
  };
  const Shape short16{256, 16, 0, 0};
  std::vector<Variant> variants;
  for (int i = 0; i < static_cast<int>(targets.size()); ++i)
    variants.push_back({"gemms only", true, false, false, short16, false, i});
  variants.push_back({"update only short 256x16", false, true, false, short16, false});
  for (const int n_sms : {32, 48, sms})
    for (const bool cs : {false, true})
      variants.push_back(
          {"update only lane " + std::to_string(n_sms) + " SMs x1024 unroll 2" + (cs ? " cs" : ""),
           false, true, false, Shape{1024, 0, 0, n_sms, 2, cs}, false});
  variants.push_back({"serial short 256x16", true, true, false, short16, false});
  variants.push_back({"overlap short 256x16, prio", true, true, true, short16, true, 0});
  // The lane on `reserve[i]` SMs at the highest priority, the GEMMs planned for the rest; with and
  // without the GEMMs of layer l waiting for part l.
  for (int i = 2; i < static_cast<int>(targets.size()) - 1; ++i)
    for (const bool cs : {false, true})
      for (const bool waits : {true, false})
        variants.push_back({"overlap lane " + std::to_string(reserve[i]) + " SMs unroll 2" +
                                (cs ? " cs" : "") + (waits ? "" : ", no waits"),
                            true, true, true, Shape{1024, 0, 0, reserve[i], 2, cs}, false, i, true,
                            waits});
  const int64_t n4 = n / 4, per = (n4 + L - 1) / L;
  std::vector<cudaEvent_t> done(L);
  for (cudaEvent_t& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // lane_end and gemm_end against t0: when each stream finished, in the last repetition.
  cudaEvent_t lane_end, gemm_end, t0;
  for (cudaEvent_t* e : {&lane_end, &gemm_end, &t0}) CK(cudaEventCreate(e));
  for (const Variant& V : variants) {
    cudaStream_t c, u;
    CK(cudaStreamCreateWithPriority(&c, cudaStreamNonBlocking, V.urgent ? greatest : least));
    CK(cudaStreamCreateWithPriority(&u, cudaStreamNonBlocking, V.lane_urgent ? greatest : least));
    const float ms = median_ms(c, [&](cudaEvent_t start) {
      CK(cudaStreamWaitEvent(u, start, 0));
      CK(cudaEventRecord(t0, c));
      cudaStream_t us = V.overlap ? u : c;
      if (V.upd) {
        for (int l = 0; l < L; ++l) {
          update(us, V.k, l * per, std::min(n4, (l + 1) * per));
          CK(cudaEventRecord(done[l], us));
        }
        CK(cudaEventRecord(lane_end, us));
      }
      if (V.gemm)
        for (int l = 0; l < L; ++l) {
          if (V.upd && V.overlap && V.waits) CK(cudaStreamWaitEvent(c, done[l], 0));
          gemms(c, V.plan);
        }
      CK(cudaEventRecord(gemm_end, c));
      if (V.upd) CK(cudaStreamWaitEvent(c, lane_end, 0));
    });
    float lane_ms = 0, gemm_ms = 0;
    if (V.upd) CK(cudaEventElapsedTime(&lane_ms, t0, lane_end));
    if (V.gemm) CK(cudaEventElapsedTime(&gemm_ms, t0, gemm_end));
    std::printf("%-44s GEMMs on SMs %3d: median %8.3f ms (last: update done %7.3f, GEMMs %7.3f)\n",
                V.name.c_str(), targets[V.plan] ? targets[V.plan] : sms, ms, lane_ms, gemm_ms);
    std::fflush(stdout);
    CK(cudaStreamDestroy(c));
    CK(cudaStreamDestroy(u));
  }
  return 0;
}
