// Build: `cmake --build BUILD --target wgmma_forward_check` (CUDA architectures listing 90a; not
// part of `all`). It compiles the attention .cu files into itself (their internals are tested)
// and links only the CUDA runtime.
//
// Standalone check of the Hopper attention forward (model/cuda/flash/tma_forward.cu: TMA producer,
// wgmma consumers) on an sm_90 GPU:
//   0. unit tests of the two wgmma paths the kernel uses, with its descriptors and tiles in the
//      SW128 layout its TMA loads produce (written here by cp.async, wgmma_check_common.cuh):
//      S-like C = A B^T (A, B K-major SW128 tiles in shared memory) and O-like C = P V (P from
//      registers in the claimed A-fragment layout, V MN-major SW128). Each result is written back
//      through the claimed accumulator layout, so a wrong layout assumption shows up here in
//      isolation;
//   1. correctness of o and lse against a plain fp32 reference kernel, T in {1, 17, 64, 100, 1000,
//      1024} x dh in {64, 80, 128}, B = 2, H = 3 (o and lse poisoned with NaN before each run, plus
//      a NaN guard after the end of both buffers that must stay untouched). The existing
//      FlashAttention-2 kernel goes through the same check as a sanity check of the harness;
//   2. timing against flash_attention_forward (CUDA events, 5 warm-up runs, median of 20) at
//      B = 4, H = 16, T in {1024 .. 16384}, dh in {64, 80, 128}, with causal TFLOP/s
//      (FLOPs = 4 * B * H * T^2 * dh / 2), plus a cross-check of the two kernels' outputs.
// Exit status: 0 all passed, 1 some check failed, 2 CUDA error, 3 a kernel did not finish in time.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/wgmma_check_common.cuh"

namespace {

using namespace wgmma_check;
namespace fl = trainer::cuda::flash;
namespace wgh = trainer::cuda::flash::wg;
constexpr auto kMmaSync = trainer::cuda::FlashKernels::kMmaSync;

// The TMA / warp-specialised forward (model/cuda/flash/tma_forward.cu), with or without the
// ping-pong turns of its two consumer warpgroups.
void tma_forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int B, int T,
                 int H, int D, cudaStream_t stream, bool ping_pong) {
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  fl::flash_tma_forward(
      fl::FwdParams{q, k, v, o, lse, T, H, scale, scale * fl::kLog2e, static_cast<int64_t>(H) * D},
      B, D, stream, ping_pong);
}

enum class Kernel { kFa2, kTma, kPingPong };
const char* name_of(Kernel kernel) {
  return kernel == Kernel::kFa2 ? "FA2" : kernel == Kernel::kTma ? "TMA" : "TMApp";
}
void run_forward(Kernel kernel, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                 int B, int T, int H, int D, cudaStream_t stream) {
  switch (kernel) {
    case Kernel::kFa2:
      trainer::cuda::flash_attention_forward(q, k, v, o, lse, B, T, H, D, stream, kMmaSync);
      break;
    case Kernel::kTma:
      tma_forward(q, k, v, o, lse, B, T, H, D, stream, false);
      break;
    case Kernel::kPingPong:
      tma_forward(q, k, v, o, lse, B, T, H, D, stream, true);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// 0. Unit tests of the wgmma paths (two warpgroups, 128 rows, exactly as in the kernel).
// ---------------------------------------------------------------------------------------------

// C (128 x 128, fp32) = A (128 x D) B^T with B 128 x D; both row-major with row stride D.
template <int D>
__global__ void __launch_bounds__(256) unit_ss_kernel(const bf16* a, const bf16* b, float* c) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (trainer::cuda::flash::smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base;
  const uint32_t sB = base + 128 * D * 2;
  const int tid = threadIdx.x;
  const int wgi = tid >> 7;
  const int warp = (tid & 127) >> 5;
  const int g = (tid & 31) >> 2;
  const int t = tid & 3;
  wgh::load_tile_sw128<128, D, 256>(sA, a, D, 128, tid);
  wgh::load_tile_sw128<128, D, 256>(sB, b, D, 128, tid);
  trainer::cuda::flash::cp_async_commit();
  trainer::cuda::flash::cp_async_wait<0>();
  wgh::fence_proxy_async_shared();
  __syncthreads();
  const uint64_t desc_a = wgh::make_desc_sw128(sA + wgi * 64 * 128, 16, 1024);
  const uint64_t desc_b = wgh::make_desc_sw128(sB, 16, 1024);
  float d[64];
  wgh::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = wgh::desc_advance(desc_a, wgh::kmajor_chunk_offset<128>(kk));
    const uint64_t db = wgh::desc_advance(desc_b, wgh::kmajor_chunk_offset<128>(kk));
    if (kk == 0) {
      wgh::Wgmma<128>::ss_overwrite(d, da, db);
    } else {
      wgh::Wgmma<128>::ss(d, da, db, 1);
    }
  }
  wgh::commit_group();
  wgh::wait_group<0>();
  wgh::fence_operands(d);
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = wgi * 64 + warp * 16 + g + (e >> 1) * 8;
      const int col = i * 8 + 2 * t + (e & 1);
      c[row * 128 + col] = d[4 * i + e];
    }
#endif
}

// C (128 x D, fp32) = P (128 x 128) V (128 x D); P and V row-major.
template <int D>
__global__ void __launch_bounds__(256) unit_rs_kernel(const bf16* p, const bf16* v, float* c) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sV = (trainer::cuda::flash::smem_addr(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x;
  const int wgi = tid >> 7;
  const int warp = (tid & 127) >> 5;
  const int g = (tid & 31) >> 2;
  const int t = tid & 3;
  wgh::load_tile_sw128<128, D, 256>(sV, v, D, 128, tid);
  trainer::cuda::flash::cp_async_commit();
  // A fragments straight from global memory in the claimed layout (two bf16 per register, the
  // lower column in the low half, which is how they lie in memory).
  const int row0 = wgi * 64 + warp * 16 + g;
  uint32_t pa[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const int col = kk * 16 + 2 * t;
    pa[kk][0] = *reinterpret_cast<const uint32_t*>(p + row0 * 128 + col);
    pa[kk][1] = *reinterpret_cast<const uint32_t*>(p + (row0 + 8) * 128 + col);
    pa[kk][2] = *reinterpret_cast<const uint32_t*>(p + row0 * 128 + col + 8);
    pa[kk][3] = *reinterpret_cast<const uint32_t*>(p + (row0 + 8) * 128 + col + 8);
#pragma unroll
    for (int e = 0; e < 4; ++e) wgh::fence_operand(pa[kk][e]);
  }
  trainer::cuda::flash::cp_async_wait<0>();
  wgh::fence_proxy_async_shared();
  __syncthreads();
  const uint64_t desc_v = wgh::make_desc_sw128(sV, 128 * 128, 1024);
  float d[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) d[i] = 0.f;
  wgh::fence_operands(d);
  wgh::fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    wgh::Wgmma<D>::rs_mn(d, pa[kk], wgh::desc_advance(desc_v, wgh::mnmajor_chunk_offset(kk)), 1);
  wgh::commit_group();
  wgh::wait_group<0>();
  wgh::fence_operands(d);
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + (e >> 1) * 8;
      const int col = i * 8 + 2 * t + (e & 1);
      c[row * D + col] = d[4 * i + e];
    }
#endif
}

template <int D>
void unit_tests(cudaStream_t stream) {
  {  // S-like: C = A B^T
    const auto a = random_bf16(128 * D, 11 + D, 1.f);
    const auto b = random_bf16(128 * D, 12 + D, 1.f);
    bf16* da = dev_upload(a);
    bf16* db = dev_upload(b);
    float* dc = dev_alloc<float>(128 * 128);
    CUDA_CHECK(cudaMemsetAsync(dc, 0xFF, 128 * 128 * sizeof(float), stream));
    const int smem = 2 * 128 * D * 2 + 1024;
    CUDA_CHECK(
        cudaFuncSetAttribute(unit_ss_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    unit_ss_kernel<D><<<1, 256, smem, stream>>>(da, db, dc);
    CUDA_CHECK(cudaGetLastError());
    sync_or_die(stream, "unit_ss_kernel");
    const auto c = dev_download(dc, 128 * 128);
    std::vector<double> ref(128 * 128);
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < 128; ++j) {
        double acc = 0;
        for (int x = 0; x < D; ++x)
          acc +=
              static_cast<double>(__bfloat162float(a[i * D + x])) * __bfloat162float(b[j * D + x]);
        ref[i * 128 + j] = acc;
      }
    char name[96];
    std::snprintf(name, sizeof name, "unit: wgmma SS K-major x K-major  (K=%d)", D);
    report_unit(name, c, ref, 128);
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dc));
  }
  {  // O-like: C = P V
    const auto pm = random_bf16(128 * 128, 21 + D, 1.f);
    const auto v = random_bf16(128 * D, 22 + D, 1.f);
    bf16* dp = dev_upload(pm);
    bf16* dv = dev_upload(v);
    float* dc = dev_alloc<float>(128 * D);
    CUDA_CHECK(cudaMemsetAsync(dc, 0xFF, 128 * D * sizeof(float), stream));
    const int smem = 128 * D * 2 + 1024;
    CUDA_CHECK(
        cudaFuncSetAttribute(unit_rs_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    unit_rs_kernel<D><<<1, 256, smem, stream>>>(dp, dv, dc);
    CUDA_CHECK(cudaGetLastError());
    sync_or_die(stream, "unit_rs_kernel");
    const auto c = dev_download(dc, 128 * D);
    std::vector<double> ref(128 * D);
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (int x = 0; x < 128; ++x)
          acc += static_cast<double>(__bfloat162float(pm[i * 128 + x])) *
                 __bfloat162float(v[x * D + j]);
        ref[i * D + j] = acc;
      }
    char name[96];
    std::snprintf(name, sizeof name, "unit: wgmma RS x MN-major B        (N=%d)", D);
    report_unit(name, c, ref, D);
    CUDA_CHECK(cudaFree(dp));
    CUDA_CHECK(cudaFree(dv));
    CUDA_CHECK(cudaFree(dc));
  }
}

// ---------------------------------------------------------------------------------------------
// 1. Reference attention: one block of 128 threads per (query row, b*h), fp32 throughout.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(128)
    reference_attention_kernel(const bf16* q, const bf16* k, const bf16* v, float* o, float* lse,
                               int T, int H, int D, float scale) {
  extern __shared__ float sc[];  // T scores, then 32 floats of reduction scratch
  float* red = sc + T;
  const int i = blockIdx.x;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int64_t ld = static_cast<int64_t>(H) * D;
  const bf16* qi = q + (static_cast<int64_t>(b) * T + i) * ld + static_cast<int64_t>(h) * D;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const bf16* kj = k + (static_cast<int64_t>(b) * T + j) * ld + static_cast<int64_t>(h) * D;
    float dot = 0.f;
    for (int c = 0; c < D; ++c) dot = fmaf(__bfloat162float(qi[c]), __bfloat162float(kj[c]), dot);
    sc[j] = dot * scale;
    mx = fmaxf(mx, sc[j]);
  }
  mx = block_reduce(mx, red, true);
  float sum = 0.f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    sc[j] = expf(sc[j] - mx);
    sum += sc[j];
  }
  sum = block_reduce(sum, red, false);  // its barriers also publish sc[]
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j <= i; ++j)
      acc = fmaf(sc[j],
                 __bfloat162float(
                     v[(static_cast<int64_t>(b) * T + j) * ld + static_cast<int64_t>(h) * D + c]),
                 acc);
    o[(static_cast<int64_t>(b) * T + i) * ld + static_cast<int64_t>(h) * D + c] = acc / sum;
  }
  if (threadIdx.x == 0) lse[static_cast<int64_t>(bh) * T + i] = mx + logf(sum);
}

struct Errors {
  double o_abs = 0, o_rel = 0, lse_abs = 0;
  bool non_finite = false;
  bool guard_ok = true;
};

// o_dev / lse_dev were allocated with `guard` extra elements poisoned with 0xFF bytes.
Errors compare(const bf16* o_dev, const float* lse_dev, const std::vector<float>& o_ref,
               const std::vector<float>& lse_ref, size_t guard) {
  Errors e;
  const auto o = dev_download(o_dev, o_ref.size() + guard);
  const auto lse = dev_download(lse_dev, lse_ref.size() + guard);
  double max_ref = 0;
  for (size_t i = 0; i < o_ref.size(); ++i) {
    const float x = __bfloat162float(o[i]);
    if (!std::isfinite(x)) e.non_finite = true;
    e.o_abs = std::max(e.o_abs, static_cast<double>(std::fabs(x - o_ref[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(o_ref[i])));
  }
  e.o_rel = e.o_abs / std::max(max_ref, 1e-30);
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    if (!std::isfinite(lse[i])) e.non_finite = true;
    e.lse_abs = std::max(e.lse_abs, static_cast<double>(std::fabs(lse[i] - lse_ref[i])));
  }
  for (size_t i = 0; i < guard; ++i) {
    uint16_t ob;
    uint32_t lb;
    std::memcpy(&ob, &o[o_ref.size() + i], 2);
    std::memcpy(&lb, &lse[lse_ref.size() + i], 4);
    if (ob != 0xFFFFu || lb != 0xFFFFFFFFu) e.guard_ok = false;
  }
  return e;
}

bool errors_ok(const Errors& e) {
  return !e.non_finite && e.guard_ok && e.o_rel < 2e-2 && e.lse_abs < 1e-3;
}

// On failure: which (row, column) positions of o are wrong, summarised, to tell layout errors
// (whole column blocks, whole row groups) from numerical ones.
void describe_o_failure(const bf16* o_dev, const std::vector<float>& o_ref, int B, int T, int H,
                        int D) {
  const auto o = dev_download(o_dev, o_ref.size());
  double max_ref = 0;
  for (float x : o_ref) max_ref = std::max(max_ref, static_cast<double>(std::fabs(x)));
  std::vector<int> bad_col(D, 0), bad_row_mod128(128, 0);
  int shown = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const size_t i = ((static_cast<size_t>(b) * T + t) * H + h) * D + c;
          const float x = __bfloat162float(o[i]);
          if (!(std::fabs(x - o_ref[i]) <= 2e-2 * max_ref)) {
            ++bad_col[c];
            ++bad_row_mod128[t % 128];
            if (shown++ < 6)
              std::printf("      o[b=%d t=%d h=%d c=%d] got %.5f ref %.5f\n", b, t, h, c, x,
                          o_ref[i]);
          }
        }
  std::printf("      bad columns:");
  for (int c = 0; c < D; ++c)
    if (bad_col[c]) std::printf(" %d", c);
  std::printf("\n      bad rows (t mod 128):");
  for (int r = 0; r < 128; ++r)
    if (bad_row_mod128[r]) std::printf(" %d", r);
  std::printf("\n");
}

void correctness_case(int T, int D, cudaStream_t stream) {
  constexpr int B = 2;
  constexpr int H = 3;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  const size_t guard = 128 * static_cast<size_t>(H) * D;
  const auto hq = random_bf16(n, 1000 + T * 7 + D, 2.f);  // larger q: peakier softmax rows
  const auto hk = random_bf16(n, 2000 + T * 7 + D, 1.f);
  const auto hv = random_bf16(n, 3000 + T * 7 + D, 1.f);
  bf16* q = dev_upload(hq);
  bf16* k = dev_upload(hk);
  bf16* v = dev_upload(hv);
  bf16* o = dev_alloc<bf16>(n + guard);
  float* lse = dev_alloc<float>(n_lse + guard);
  float* o_ref_d = dev_alloc<float>(n);
  float* lse_ref_d = dev_alloc<float>(n_lse);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  reference_attention_kernel<<<dim3(T, B * H), 128, (T + 32) * sizeof(float), stream>>>(
      q, k, v, o_ref_d, lse_ref_d, T, H, D, scale);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "reference_attention_kernel");
  const auto o_ref = dev_download(o_ref_d, n);
  const auto lse_ref = dev_download(lse_ref_d, n_lse);

  auto run = [&](Kernel kernel) {
    CUDA_CHECK(cudaMemsetAsync(o, 0xFF, (n + guard) * sizeof(bf16), stream));
    CUDA_CHECK(cudaMemsetAsync(lse, 0xFF, (n_lse + guard) * sizeof(float), stream));
    run_forward(kernel, q, k, v, o, lse, B, T, H, D, stream);
    sync_or_die(stream, name_of(kernel));
    return compare(o, lse, o_ref, lse_ref, guard);
  };

  const Errors fa2 = run(Kernel::kFa2);
  for (Kernel kernel : {Kernel::kTma, Kernel::kPingPong}) {
    const Errors e = run(kernel);
    const bool ok = errors_ok(e);
    std::printf(
        "T=%5d dh=%3d  %-5s: o max_abs %.3e rel %.3e  lse max_abs %.3e%s%s  %s   "
        "(FA2 sanity: o rel %.3e lse %.3e %s)\n",
        T, D, name_of(kernel), e.o_abs, e.o_rel, e.lse_abs, e.non_finite ? "  NON-FINITE" : "",
        e.guard_ok ? "" : "  GUARD-OVERWRITTEN", ok ? "PASS" : "FAIL", fa2.o_rel, fa2.lse_abs,
        errors_ok(fa2) ? "ok" : "BAD");
    if (!ok) {
      ++g_failures;
      // Re-run the kernel so that o holds its output, then summarise the wrong positions.
      run(kernel);
      describe_o_failure(o, o_ref, B, T, H, D);
    }
  }
  std::fflush(stdout);
  for (void* p :
       {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
        static_cast<void*>(lse), static_cast<void*>(o_ref_d), static_cast<void*>(lse_ref_d)})
    CUDA_CHECK(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------
// 2. Timing.
// ---------------------------------------------------------------------------------------------
void timing(cudaStream_t stream) {
  constexpr int B = 4;
  constexpr int H = 16;
  constexpr int kMaxT = 16384;
  constexpr int kMaxD = 128;
  const size_t n_max = static_cast<size_t>(B) * kMaxT * H * kMaxD;
  const size_t lse_max = static_cast<size_t>(B) * H * kMaxT;
  bf16* q = dev_alloc<bf16>(n_max);
  bf16* k = dev_alloc<bf16>(n_max);
  bf16* v = dev_alloc<bf16>(n_max);
  bf16* o_new = dev_alloc<bf16>(n_max);
  bf16* o_fa2 = dev_alloc<bf16>(n_max);
  float* lse_new = dev_alloc<float>(lse_max);
  float* lse_fa2 = dev_alloc<float>(lse_max);
  fill_random_kernel<<<1024, 256, 0, stream>>>(q, n_max, 1u);
  fill_random_kernel<<<1024, 256, 0, stream>>>(k, n_max, 2u);
  fill_random_kernel<<<1024, 256, 0, stream>>>(v, n_max, 3u);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "fill_random_kernel");

  std::printf(
      "\nTiming: B=%d H=%d causal, median of 20 after 5 warm-up (TFLOP/s = 4*B*H*T^2*dh/2)\n", B,
      H);
  std::printf("%4s %6s | %10s %8s | %10s %8s | %7s | %s\n", "dh", "T", "TMA ms", "TFLOP/s",
              "FA2 ms", "TFLOP/s", "speedup", "TMA vs FA2 (o rel, lse abs)");
  for (int D : {64, 80, 128}) {
    for (int T : {1024, 2048, 4096, 8192, 16384}) {
      const double flops = 4.0 * B * H * static_cast<double>(T) * T * D / 2.0;
      double ms[3];
      for (Kernel kernel : {Kernel::kTma, Kernel::kPingPong, Kernel::kFa2}) {
        bf16* o = kernel == Kernel::kFa2 ? o_fa2 : o_new;
        float* lse = kernel == Kernel::kFa2 ? lse_fa2 : lse_new;
        ms[static_cast<int>(kernel)] =
            median_ms([&] { run_forward(kernel, q, k, v, o, lse, B, T, H, D, stream); }, stream,
                      name_of(kernel));
      }
      std::printf("%4d %6d | %10.3f %8.1f | pp %8.3f | %10.3f %8.1f | %6.2fx |", D, T, ms[1],
                  flops / ms[1] * 1e-9, ms[2], ms[0], flops / ms[0] * 1e-9, ms[0] / ms[1]);
      // Cross-check of each Hopper kernel's output against FA2's on the timed shape.
      const size_t n = static_cast<size_t>(B) * T * H * D;
      const size_t nl = static_cast<size_t>(B) * H * T;
      const auto b = dev_download(o_fa2, n);
      const auto lb = dev_download(lse_fa2, nl);
      for (Kernel kernel : {Kernel::kTma, Kernel::kPingPong}) {
        run_forward(kernel, q, k, v, o_new, lse_new, B, T, H, D, stream);
        sync_or_die(stream, name_of(kernel));
        const auto a = dev_download(o_new, n);
        const auto la = dev_download(lse_new, nl);
        double max_diff = 0, max_ref = 0, lse_diff = 0;
        bool finite = true;
        for (size_t i = 0; i < n; ++i) {
          const float x = __bfloat162float(a[i]);
          const float y = __bfloat162float(b[i]);
          if (!std::isfinite(x)) finite = false;
          max_diff = std::max(max_diff, static_cast<double>(std::fabs(x - y)));
          max_ref = std::max(max_ref, static_cast<double>(std::fabs(y)));
        }
        for (size_t i = 0; i < nl; ++i) {
          if (!std::isfinite(la[i])) finite = false;
          lse_diff = std::max(lse_diff, static_cast<double>(std::fabs(la[i] - lb[i])));
        }
        const double rel = max_diff / std::max(max_ref, 1e-30);
        const bool ok = finite && rel < 2e-2 && lse_diff < 1e-3;
        if (!ok) ++g_failures;
        std::printf(" %.2e %.2e %s", rel, lse_diff, ok ? "ok" : "MISMATCH");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(o_new), static_cast<void*>(o_fa2), static_cast<void*>(lse_new),
                  static_cast<void*>(lse_fa2)})
    CUDA_CHECK(cudaFree(p));
}

}  // namespace

int main() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("device %d: %s, compute capability %d.%d, %d SMs\n", device, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount);
  if (!trainer::cuda::flash_attention_uses_wgmma(128)) {
    std::printf("FAIL: the wgmma forward needs a compute capability 9.0 device\n");
    return 1;
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("\n0. wgmma unit tests (kernel's layouts and descriptors, 2 warpgroups)\n");
  unit_tests<64>(stream);
  unit_tests<128>(stream);

  std::printf(
      "\n1. correctness vs fp32 reference (B=2, H=3; pass: o rel < 2e-2, lse abs < 1e-3)\n");
  for (int D : {64, 80, 128})
    for (int T : {1, 17, 64, 100, 1000, 1024}) correctness_case(T, D, stream);

  timing(stream);

  CUDA_CHECK(cudaStreamDestroy(stream));
  if (g_failures > 0) {
    std::printf("\n%d check(s) FAILED\n", g_failures);
    return 1;
  }
  std::printf("\nall checks PASSED\n");
  return 0;
}
