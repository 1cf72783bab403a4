// Benchmark of the causal FlashAttention kernels (bf16, (B, T, H*dh) layout): forward, backward and
// forward+backward latency with CUDA events (median over --iters runs after --warmup runs) and
// TFLOP/s, plus a naive materialised-scores forward (cuBLAS S = Q K^T, softmax kernel, cuBLAS
// O = P V) for comparison and as a cross-check of the flash output on large shapes.
//
// FLOP convention (FlashAttention-2 paper): causal forward = 4 * B * H * T^2 * dh / 2 (two
// matmuls, half the score matrix), backward = 2.5 x forward, forward+backward = 3.5 x forward.
// The naive path computes the full T x T scores but is charged the same causal FLOPs.
//
// --kernels auto (default) runs what training runs: the Hopper wgmma kernels where
// flash_attention_uses_wgmma says so, FA2 (mma.sync) elsewhere; --kernels mma-sync always FA2.
// Each flash row says which kernel ran its forward and its backward (tma: the Hopper forward with a
// TMA producer; wgmma: the Hopper backward; mma.sync: FA2): the last two CSV columns, fwd_kernel
// and bwd_kernel (empty on naive rows).
//
//   bench_attention [--csv out.csv] [--dh 64,128] [--tmin 256] [--tmax 16384] [--batch 4]
//                   [--heads 16] [--iters 20] [--warmup 5] [--naive-max-t 8192]
//                   [--kernels auto|mma-sync]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "model/cuda/common.cuh"
#include "model/cuda/flash_attention.h"

namespace {

using bf16 = __nv_bfloat16;

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t st_ = (call);                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      throw std::runtime_error(std::string("cuBLAS call failed: ") + #call + " status " + \
                               std::to_string(static_cast<int>(st_)));                    \
  } while (0)

struct Options {
  std::string csv;
  std::vector<int> head_dims = {64, 128};
  int tmin = 256;
  int tmax = 16384;
  int batch = 4;
  int heads = 16;
  int iters = 20;
  int warmup = 5;
  int naive_max_t = 8192;
  trainer::cuda::FlashKernels kernels = trainer::cuda::FlashKernels::kAuto;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "bench_attention: %s\nusage: bench_attention [--csv PATH] [--dh 64,128] [--tmin N] "
               "[--tmax N] [--batch B] [--heads H] [--iters N] [--warmup N] [--naive-max-t N] "
               "[--kernels auto|mma-sync]\n",
               msg);
  std::exit(2);
}

int parse_int(const char* flag, const char* s) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > (1L << 30))
    usage((std::string("bad value for ") + flag + ": " + s).c_str());
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--csv") {
      o.csv = next();
    } else if (a == "--dh") {
      o.head_dims.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.head_dims.push_back(parse_int("--dh", item.c_str()));
    } else if (a == "--tmin") {
      o.tmin = parse_int("--tmin", next());
    } else if (a == "--tmax") {
      o.tmax = parse_int("--tmax", next());
    } else if (a == "--batch") {
      o.batch = parse_int("--batch", next());
    } else if (a == "--heads") {
      o.heads = parse_int("--heads", next());
    } else if (a == "--iters") {
      o.iters = parse_int("--iters", next());
    } else if (a == "--warmup") {
      o.warmup = parse_int("--warmup", next());
    } else if (a == "--naive-max-t") {
      o.naive_max_t = parse_int("--naive-max-t", next());
    } else if (a == "--kernels") {
      const std::string k = next();
      if (k == "auto") {
        o.kernels = trainer::cuda::FlashKernels::kAuto;
      } else if (k == "mma-sync") {
        o.kernels = trainer::cuda::FlashKernels::kMmaSync;
      } else {
        usage(("bad value for --kernels: " + k + " (auto or mma-sync)").c_str());
      }
    } else if (a == "--help" || a == "-h") {
      usage("help");
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  if (o.tmin < 1 || o.tmax < o.tmin) usage("need 1 <= --tmin <= --tmax");
  if (o.iters < 1 || o.batch < 1 || o.heads < 1) usage("--iters, --batch, --heads must be >= 1");
  for (int d : o.head_dims)
    if (!trainer::cuda::flash_attention_supports(d))
      usage(("--dh " + std::to_string(d) + " is not supported").c_str());
  return o;
}

// Deterministic pseudo-random bf16 values, uniform with unit variance.
__global__ void fill_random_kernel(bf16* x, int64_t n, uint32_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t h = trainer::cuda::hash_index(i, seed);
  const float u = (h >> 8) * (1.f / 16777216.f);  // [0, 1)
  x[i] = __float2bfloat16((2.f * u - 1.f) * 1.7320508f);
}

void fill_random(bf16* x, int64_t n, uint32_t seed) {
  fill_random_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(x, n, seed);
  CUDA_CHECK_LAUNCH("fill_random_kernel");
}

// Naive path: row-wise causal softmax of fp32 scores (already scaled) into bf16 probabilities,
// zero above the diagonal. One block per row of S, S and P laid out (H, T, T) for one batch entry.
__global__ void causal_softmax_kernel(const float* __restrict__ s, bf16* __restrict__ p, int T) {
  const int64_t row = blockIdx.x;  // h * T + i
  const int i = static_cast<int>(row % T);
  const float* sr = s + row * T;
  bf16* pr = p + row * T;
  __shared__ float red[32];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0.f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += __expf(sr[j] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) sum += red[w];
  const float inv = 1.f / sum;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    pr[j] = __float2bfloat16(j <= i ? __expf(sr[j] - mx) * inv : 0.f);
}

// O = softmax(Q K^T * scale) V for every (b, h) with materialised scores.
struct NaiveAttention {
  cublasHandle_t handle = nullptr;
  float* s = nullptr;  // (H, T, T) fp32
  bf16* p = nullptr;   // (H, T, T) bf16
  NaiveAttention(int T, int H) {
    CUBLAS_CHECK(cublasCreate(&handle));
    const size_t tt = static_cast<size_t>(H) * T * T;
    CUDA_CHECK(cudaMalloc(&s, tt * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&p, tt * sizeof(bf16)));
  }
  ~NaiveAttention() {
    cudaFree(s);
    cudaFree(p);
    cublasDestroy(handle);
  }
  void run(const bf16* q, const bf16* k, const bf16* v, bf16* o, int B, int T, int H, int dh,
           cudaStream_t stream) {
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const int64_t ld = static_cast<int64_t>(H) * dh;
    const float scale = 1.f / std::sqrt(static_cast<float>(dh));
    const float one = 1.f, zero = 0.f;
    for (int b = 0; b < B; ++b) {
      const int64_t off = static_cast<int64_t>(b) * T * ld;
      // Column-major view: S^T (T x T, ld T) = K_h (as op T of the dh x T matrix) x Q_h (dh x T),
      // i.e. row-major S[i][j] = q_i . k_j * scale.
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, dh, &scale, k + off, CUDA_R_16BF,
          static_cast<int>(ld), dh, q + off, CUDA_R_16BF, static_cast<int>(ld), dh, &zero, s,
          CUDA_R_32F, T, static_cast<int64_t>(T) * T, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      causal_softmax_kernel<<<static_cast<unsigned>(static_cast<int64_t>(H) * T), 256, 0, stream>>>(
          s, p, T);
      CUDA_CHECK_LAUNCH("causal_softmax_kernel");
      // O^T (dh x T, ld) = V^T (dh x T, ld) x P^T (T x T, ld T).
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, dh, T, T, &one, v + off, CUDA_R_16BF,
          static_cast<int>(ld), dh, p, CUDA_R_16BF, T, static_cast<int64_t>(T) * T, &zero, o + off,
          CUDA_R_16BF, static_cast<int>(ld), dh, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
};

// Median latency in ms of `fn` on `stream`, each run bracketed by its own pair of events.
double median_ms(const std::function<void()>& fn, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms[i] = t;
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
}

// ||a - b|| / ||b|| over two bf16 device tensors.
double rel_diff(const bf16* a, const bf16* b, size_t n) {
  std::vector<bf16> ha(n), hb(n);
  CUDA_CHECK(cudaMemcpy(ha.data(), a, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hb.data(), b, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

struct Row {
  std::string impl;
  int dh, T;
  double fwd_ms, bwd_ms, fwdbwd_ms, check;  // < 0: not measured
  std::string fwd_kernel, bwd_kernel;       // "tma", "wgmma" or "mma.sync"; empty for naive rows
};

// The kernel flash_attention_forward / _backward run for head dim `dh` under `kernels`.
const char* kernel_name(trainer::cuda::FlashKernels kernels, int dh, bool backward) {
  return kernels == trainer::cuda::FlashKernels::kAuto &&
                 trainer::cuda::flash_attention_uses_wgmma(dh)
             ? (backward ? "wgmma" : "tma")
             : "mma.sync";
}

std::string fmt_num(double v, const char* f) {
  if (v < 0) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

int run(const Options& opt) {
  cudaDeviceProp prop{};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  std::printf(
      "causal attention, bf16, batch %d, heads %d, median of %d runs after %d warm-up runs\n"
      "FLOPs: fwd = 4*B*H*T^2*dh/2 (causal), bwd = 2.5 x fwd, fwd+bwd = 3.5 x fwd (FA2 "
      "convention)\n"
      "check: ||O_flash - O_naive|| / ||O_naive|| (naive: cuBLAS scores + softmax + cuBLAS, fwd "
      "only, T <= %d)\n\n",
      opt.batch, opt.heads, opt.iters, opt.warmup, opt.naive_max_t);

  const int B = opt.batch, H = opt.heads;
  const int dh_max = *std::max_element(opt.head_dims.begin(), opt.head_dims.end());
  const size_t n_max = static_cast<size_t>(B) * opt.tmax * H * dh_max;
  bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv, *o_naive;
  float* lse;
  for (bf16** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
    CUDA_CHECK(cudaMalloc(p, n_max * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&lse, static_cast<size_t>(B) * H * opt.tmax * sizeof(float)));
  size_t ws_max = 0;
  for (int d : opt.head_dims)
    ws_max = std::max(ws_max,
                      trainer::cuda::flash_attention_backward_workspace_bytes(B, opt.tmax, H, d));
  void* ws;
  CUDA_CHECK(cudaMalloc(&ws, ws_max));
  const int naive_t = std::min(opt.tmax, opt.naive_max_t);
  NaiveAttention* naive = nullptr;
  if (naive_t >= opt.tmin) {
    naive = new NaiveAttention(naive_t, H);
    CUDA_CHECK(cudaMalloc(&o_naive, static_cast<size_t>(B) * naive_t * H * dh_max * sizeof(bf16)));
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));

  std::vector<Row> rows;
  std::printf("%-6s %4s %6s %10s %10s %10s %9s %9s %9s %9s %-8s %-8s\n", "impl", "dh", "T",
              "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_TF/s", "bwd_TF/s", "all_TF/s", "check",
              "fwd_kern", "bwd_kern");
  for (int dh : opt.head_dims) {
    for (int T = opt.tmin; T <= opt.tmax; T *= 2) {
      const int64_t n = static_cast<int64_t>(B) * T * H * dh;
      fill_random(q, n, 1);
      fill_random(k, n, 2);
      fill_random(v, n, 3);
      fill_random(dout, n, 4);
      auto fwd = [&] {
        trainer::cuda::flash_attention_forward(q, k, v, o, lse, B, T, H, dh, stream, opt.kernels);
      };
      auto bwd = [&] {
        trainer::cuda::flash_attention_backward(q, k, v, o, dout, lse, dq, dk, dv, ws, B, T, H, dh,
                                                stream, opt.kernels);
      };
      Row r{"flash",
            dh,
            T,
            -1,
            -1,
            -1,
            -1,
            kernel_name(opt.kernels, dh, false),
            kernel_name(opt.kernels, dh, true)};
      r.fwd_ms = median_ms(fwd, opt.warmup, opt.iters, stream);
      r.bwd_ms = median_ms(bwd, opt.warmup, opt.iters, stream);  // o, lse from the runs above
      r.fwdbwd_ms = median_ms(
          [&] {
            fwd();
            bwd();
          },
          opt.warmup, opt.iters, stream);
      Row nr{"naive", dh, T, -1, -1, -1, -1, "", ""};
      if (naive && T <= naive_t) {
        nr.fwd_ms = median_ms([&] { naive->run(q, k, v, o_naive, B, T, H, dh, stream); },
                              opt.warmup, opt.iters, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        r.check = rel_diff(o, o_naive, static_cast<size_t>(n));
      }
      const double fwd_flop = 2.0 * B * H * static_cast<double>(T) * T * dh;
      for (const Row& x : {r, nr}) {
        if (x.fwd_ms < 0) continue;
        auto tf = [](double flop, double ms) { return ms < 0 ? -1.0 : flop / (ms * 1e-3) / 1e12; };
        std::printf("%-6s %4d %6d %10s %10s %10s %9s %9s %9s %9s %-8s %-8s\n", x.impl.c_str(), dh,
                    T, fmt_num(x.fwd_ms, "%.4f").c_str(), fmt_num(x.bwd_ms, "%.4f").c_str(),
                    fmt_num(x.fwdbwd_ms, "%.4f").c_str(),
                    fmt_num(tf(fwd_flop, x.fwd_ms), "%.1f").c_str(),
                    fmt_num(tf(2.5 * fwd_flop, x.bwd_ms), "%.1f").c_str(),
                    fmt_num(tf(3.5 * fwd_flop, x.fwdbwd_ms), "%.1f").c_str(),
                    fmt_num(x.check, "%.2e").c_str(), x.fwd_kernel.c_str(), x.bwd_kernel.c_str());
        rows.push_back(x);
      }
      std::fflush(stdout);
    }
  }

  if (!opt.csv.empty()) {
    FILE* f = std::fopen(opt.csv.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_attention: cannot write %s: %s\n", opt.csv.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "impl,batch,heads,head_dim,seq_len,fwd_ms,bwd_ms,fwd_bwd_ms,fwd_tflops,bwd_tflops,"
                 "fwd_bwd_tflops,check_rel_err,fwd_kernel,bwd_kernel\n");
    for (const Row& x : rows) {
      const double fwd_flop = 2.0 * B * H * static_cast<double>(x.T) * x.T * x.dh;
      auto tf = [](double flop, double ms) { return ms < 0 ? -1.0 : flop / (ms * 1e-3) / 1e12; };
      auto cell = [](double v) { return v < 0 ? std::string() : fmt_num(v, "%.6g"); };
      std::fprintf(f, "%s,%d,%d,%d,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", x.impl.c_str(), B, H, x.dh,
                   x.T, cell(x.fwd_ms).c_str(), cell(x.bwd_ms).c_str(), cell(x.fwdbwd_ms).c_str(),
                   cell(tf(fwd_flop, x.fwd_ms)).c_str(), cell(tf(2.5 * fwd_flop, x.bwd_ms)).c_str(),
                   cell(tf(3.5 * fwd_flop, x.fwdbwd_ms)).c_str(), cell(x.check).c_str(),
                   x.fwd_kernel.c_str(), x.bwd_kernel.c_str());
    }
    std::fclose(f);
    std::printf("\nwrote %s\n", opt.csv.c_str());
  }

  delete naive;
  if (naive_t >= opt.tmin) cudaFree(o_naive);
  for (bf16* p : {q, k, v, o, dout, dq, dk, dv}) cudaFree(p);
  cudaFree(lse);
  cudaFree(ws);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}
