// Build: `cmake --build BUILD --target wgmma_backward_check` (CUDA architectures listing 90a; not
// part of `all`). It compiles the attention .cu files into itself (their internals are tested)
// and links only the CUDA runtime.
//
// Standalone check of the Hopper wgmma attention backward (model/cuda/flash/wgmma_backward.cu) on
// an sm_90 GPU:
//   0. unit tests of the one wgmma path the backward adds to the forward's (confirmed) ones:
//      m64n64k16 with BOTH operands MN-major in shared memory (imm-trans-a = imm-trans-b = 1),
//      as used for dQ = dS K with dS read from the stored dS^T. Both ways the kernel splits the dQ
//      tile are exercised (warpgroup w on A panel w / on B panel w), with A^T written by plain
//      4-byte st.shared through the kernel's swizzle addressing + fence.proxy.async (exactly how
//      the kernel writes dS^T) and B loaded by cp.async. Results go through the claimed
//      accumulator layout, so a wrong assumption shows up here in isolation;
//   1. correctness: B = 2, H = 3, T in {1, 17, 64, 100, 1000, 1024} x dh in {64, 80, 128}, random
//      q, k, v, dO; o and lse from the FA2 forward (flash_attention_forward, kMmaSync); the full
//      backward with the new main kernel (flash_attention_backward, kAuto) and the FA2 backward
//      (kMmaSync) are compared with an fp32 reference backward
//      (plain GPU kernels) and with each other. dq, dk, dv (plus a guard after each) and the
//      workspace are poisoned with NaN bytes before every run. Pass: max_abs_err / max|ref| < 2e-2
//      for each of dq, dk, dv (new vs reference and new vs FA2; dq and dk divide by at least 1e-3
//      max|dv ref| in both, as at T = 1 they are zero but for rounding), everything
//      finite, guards intact;
//   2. timing of the whole backward (D + memset + main + convert), new vs existing, B = 4, H = 16,
//      T in {1024 .. 16384}, dh in {64, 80, 128}: CUDA events, 5 warm-up, median of 20; TFLOP/s
//      with FLOPs = 2.5 * 4 * B * H * T^2 * dh / 2; plus a cross-check of the two outputs.
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
constexpr auto kMmaSync = trainer::cuda::FlashKernels::kMmaSync;
namespace wgh = trainer::cuda::flash::wg;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// out[0] = max |got - ref| (float bits), out[1] = max |ref|, out[2] = count of non-finite `got`.
// Non-negative floats order like their bit patterns, so atomicMax on the bits is a float max.
template <class TRef>
__global__ void compare_kernel(const bf16* got, const TRef* ref, size_t n, unsigned* out) {
  float err = 0.f, mx = 0.f;
  unsigned bad = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(got[i]);
    const float r = to_float(ref[i]);
    if (!isfinite(g)) {
      ++bad;
    } else {
      err = fmaxf(err, fabsf(g - r));
    }
    mx = fmaxf(mx, fabsf(r));
  }
  for (int o = 16; o > 0; o >>= 1) {
    err = fmaxf(err, __shfl_xor_sync(0xffffffffu, err, o));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&out[0], __float_as_uint(err));
    atomicMax(&out[1], __float_as_uint(mx));
    atomicAdd(&out[2], bad);
  }
}

struct Cmp {
  double abs = 0, rel = 0;
  double max_ref = 0;  // max |ref|
  bool finite = true;
  // The error relative to `scale` instead of max |ref| where that is larger: a gradient that is
  // zero in exact arithmetic (dq and dk at T = 1, where P = 1 and dP = D) has only rounding noise
  // in its reference, and the error against that noise says nothing.
  void floor_scale(double scale) {
    if (scale > max_ref) rel = abs / std::max(scale, 1e-30);
  }
};

template <class TRef>
Cmp compare_dev(const bf16* got, const TRef* ref, size_t n, cudaStream_t stream) {
  static unsigned* out = dev_alloc<unsigned>(3);
  CUDA_CHECK(cudaMemsetAsync(out, 0, 3 * sizeof(unsigned), stream));
  compare_kernel<TRef><<<512, 256, 0, stream>>>(got, ref, n, out);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "compare_kernel");
  unsigned h[3];
  CUDA_CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
  float err, mx;
  std::memcpy(&err, &h[0], 4);
  std::memcpy(&mx, &h[1], 4);
  Cmp c;
  c.abs = err;
  c.max_ref = mx;
  c.rel = err / std::max(static_cast<double>(mx), 1e-30);
  c.finite = h[2] == 0;
  return c;
}

// ---------------------------------------------------------------------------------------------
// 0. Unit test of the new wgmma path: C = A B with A and B both MN-major (SS, trans-a, trans-b).
// ---------------------------------------------------------------------------------------------

// at: A^T, 128 (K) x 64*PA row-major; b: 128 (K) x 64*PB row-major; PA * PB == 2.
// Warpgroup w computes the 64 x 64 block (A panel aw, B panel bw) with aw = PA == 2 ? w : 0,
// bw = PB == 2 ? w : 0 -- the dh 64 (query split) and dh 128 (column split) uses of the kernel --
// and writes it to c (64*PA x 64*PB, row-major) through the accumulator layout of wgmma.cuh.
template <int PA, int PB>
__global__ void __launch_bounds__(256) unit_tt_kernel(const bf16* at, const bf16* b, float* c) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(PA * PB == 2, "one operand split over the two warpgroups");
  constexpr int kPanel = 128 * 128;  // bytes of a 128-row, 64-column SW128 panel
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = fl::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* const base_ptr = smem_raw + (base - raw);
  const uint32_t sA = base;
  const uint32_t sB = base + PA * kPanel;
  const int tid = threadIdx.x;
  const int wgi = tid >> 7;
  const int warp = (tid & 127) >> 5;
  const int g = (tid & 31) >> 2;
  const int t = tid & 3;
  // B by cp.async into the layout the kernel's TMA loads of K produce.
  wgh::load_tile_sw128<128, 64 * PB, 256>(sB, b, 64 * PB, 128, tid);
  fl::cp_async_commit();
  // A^T by 4-byte generic stores through sw128_offset (as the kernel stores dS^T).
  for (int i = tid; i < 128 * 64 * PA / 2; i += 256) {
    const int row = i / (32 * PA);
    const int col = 2 * (i % (32 * PA));
    *reinterpret_cast<uint32_t*>(base_ptr + wgh::sw128_offset<128>(row, col)) =
        *reinterpret_cast<const uint32_t*>(at + row * 64 * PA + col);
  }
  fl::cp_async_wait<0>();
  wgh::fence_proxy_async_shared();
  __syncthreads();
  const int aw = PA == 2 ? wgi : 0;
  const int bw = PB == 2 ? wgi : 0;
  const uint64_t desc_a = wgh::make_desc_sw128(sA + aw * kPanel, kPanel, 1024);
  const uint64_t desc_b = wgh::make_desc_sw128(sB + bw * kPanel, kPanel, 1024);
  float d[32];
  wgh::fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t da = wgh::desc_advance(desc_a, wgh::mnmajor_chunk_offset(kk));
    const uint64_t db = wgh::desc_advance(desc_b, wgh::mnmajor_chunk_offset(kk));
    if (kk == 0) {
      wgh::Wgmma<64>::ss_tt_overwrite(d, da, db);
    } else {
      wgh::Wgmma<64>::ss_tt(d, da, db, 1);
    }
  }
  wgh::commit_group();
  wgh::wait_group<0>();
  wgh::fence_operands(d);
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = aw * 64 + warp * 16 + g + (e >> 1) * 8;
      const int col = bw * 64 + i * 8 + 2 * t + (e & 1);
      c[row * 64 * PB + col] = d[4 * i + e];
    }
#endif
}

template <int PA, int PB>
void unit_test_tt(cudaStream_t stream) {
  constexpr int M = 64 * PA;
  constexpr int N = 64 * PB;
  constexpr int K = 128;
  const auto at = random_bf16(K * M, 31 + PA, 1.f);
  const auto b = random_bf16(K * N, 41 + PB, 1.f);
  bf16* d_at = dev_upload(at);
  bf16* d_b = dev_upload(b);
  float* d_c = dev_alloc<float>(M * N);
  CUDA_CHECK(cudaMemsetAsync(d_c, 0xFF, M * N * sizeof(float), stream));
  const int smem = (PA + PB) * 128 * 128 + 1024;
  CUDA_CHECK(cudaFuncSetAttribute(unit_tt_kernel<PA, PB>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  unit_tt_kernel<PA, PB><<<1, 256, smem, stream>>>(d_at, d_b, d_c);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "unit_tt_kernel");
  const auto c = dev_download(d_c, M * N);
  std::vector<double> ref(M * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = 0;
      for (int x = 0; x < K; ++x)
        acc +=
            static_cast<double>(__bfloat162float(at[x * M + i])) * __bfloat162float(b[x * N + j]);
      ref[i * N + j] = acc;
    }
  char name[128];
  std::snprintf(name, sizeof name, "unit: wgmma SS A MN-major x B MN-major  (M=%d, N=%d, K=128)", M,
                N);
  report_unit(name, c, ref, N);
  CUDA_CHECK(cudaFree(d_at));
  CUDA_CHECK(cudaFree(d_b));
  CUDA_CHECK(cudaFree(d_c));
}

// ---------------------------------------------------------------------------------------------
// 1. Reference backward, fp32 throughout (one block of 128 threads per query row / per key).
// ---------------------------------------------------------------------------------------------
__device__ float dot_bf16(const bf16* a, const bf16* b, int n) {
  float acc = 0.f;
  for (int c = 0; c < n; ++c) acc = fmaf(__bfloat162float(a[c]), __bfloat162float(b[c]), acc);
  return acc;
}

// Per query row i: lse_i, D_i = dO_i . O_i (O in fp32), dq_i = scale * sum_j dS_ij k_j.
__global__ void __launch_bounds__(128)
    reference_rows_kernel(const bf16* q, const bf16* k, const bf16* v, const bf16* dout, float* dq,
                          float* lse, float* dsum, int T, int H, int D, float scale) {
  extern __shared__ float sh[];  // T probabilities, T dP / dS values, 32 floats of scratch
  float* pr = sh;
  float* ds = sh + T;
  float* red = sh + 2 * T;
  const int i = blockIdx.x;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int64_t ld = static_cast<int64_t>(H) * D;
  auto row = [&](const bf16* x, int r) {
    return x + (static_cast<int64_t>(b) * T + r) * ld + static_cast<int64_t>(h) * D;
  };
  const bf16* qi = row(q, i);
  const bf16* doi = row(dout, i);
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    pr[j] = dot_bf16(qi, row(k, j), D) * scale;
    mx = fmaxf(mx, pr[j]);
  }
  mx = block_reduce(mx, red, true);
  float sum = 0.f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    pr[j] = expf(pr[j] - mx);
    sum += pr[j];
  }
  sum = block_reduce(sum, red, false);
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    pr[j] /= sum;
    ds[j] = dot_bf16(doi, row(v, j), D);  // dP_ij
  }
  __syncthreads();
  float part = 0.f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float o = 0.f;
    for (int j = 0; j <= i; ++j) o = fmaf(pr[j], __bfloat162float(row(v, j)[c]), o);
    part = fmaf(__bfloat162float(doi[c]), o, part);
  }
  const float dval = block_reduce(part, red, false);
  for (int j = threadIdx.x; j <= i; j += blockDim.x) ds[j] = pr[j] * (ds[j] - dval);
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j <= i; ++j) acc = fmaf(ds[j], __bfloat162float(row(k, j)[c]), acc);
    dq[(static_cast<int64_t>(b) * T + i) * ld + static_cast<int64_t>(h) * D + c] = acc * scale;
  }
  if (threadIdx.x == 0) {
    lse[static_cast<int64_t>(bh) * T + i] = mx + logf(sum);
    dsum[static_cast<int64_t>(bh) * T + i] = dval;
  }
}

// Per key j: dk_j = scale * sum_{i >= j} dS_ij q_i, dv_j = sum_{i >= j} P_ij dO_i.
__global__ void __launch_bounds__(128)
    reference_cols_kernel(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                          const float* lse, const float* dsum, float* dk, float* dv, int T, int H,
                          int D, float scale) {
  extern __shared__ float sh[];  // T probabilities, T dS values
  float* pr = sh;
  float* ds = sh + T;
  const int j = blockIdx.x;
  const int bh = blockIdx.y;
  const int b = bh / H;
  const int h = bh % H;
  const int64_t ld = static_cast<int64_t>(H) * D;
  auto row = [&](const bf16* x, int r) {
    return x + (static_cast<int64_t>(b) * T + r) * ld + static_cast<int64_t>(h) * D;
  };
  const bf16* kj = row(k, j);
  const bf16* vj = row(v, j);
  for (int i = j + threadIdx.x; i < T; i += blockDim.x) {
    const float p =
        expf(dot_bf16(row(q, i), kj, D) * scale - lse[static_cast<int64_t>(bh) * T + i]);
    const float dp = dot_bf16(row(dout, i), vj, D);
    pr[i] = p;
    ds[i] = p * (dp - dsum[static_cast<int64_t>(bh) * T + i]);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float ak = 0.f, av = 0.f;
    for (int i = j; i < T; ++i) {
      ak = fmaf(ds[i], __bfloat162float(row(q, i)[c]), ak);
      av = fmaf(pr[i], __bfloat162float(row(dout, i)[c]), av);
    }
    const int64_t off = (static_cast<int64_t>(b) * T + j) * ld + static_cast<int64_t>(h) * D + c;
    dk[off] = ak * scale;
    dv[off] = av;
  }
}

// The full backward through the new main kernel: flash_attention_backward picks it for dh 64 and
// 128 on compute capability 9.0 (main() checks flash_attention_uses_wgmma); kMmaSync is FA2.
void backward(bool wgmma, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
              const bf16* dout, const float* lse, bf16* dq, bf16* dk, bf16* dv, void* workspace,
              int B, int T, int H, int D, cudaStream_t stream) {
  trainer::cuda::flash_attention_backward(
      q, k, v, o, dout, lse, dq, dk, dv, workspace, B, T, H, D, stream,
      wgmma ? trainer::cuda::FlashKernels::kAuto : trainer::cuda::FlashKernels::kMmaSync);
}

struct GradErrors {
  Cmp dq, dk, dv;
  bool guard_ok = true;
  bool ok(double tol) const {
    return guard_ok && dq.finite && dk.finite && dv.finite && dq.rel < tol && dk.rel < tol &&
           dv.rel < tol;
  }
  // dq and dk measured against at least 1e-3 of the case's largest reference dv: at T = 1 they
  // are zero but for rounding (see Cmp::floor_scale), which any equivalent change, a differently
  // rounded D for one, moves by its own relative amount.
  void floor_dq_dk(double dv_ref_max) {
    dq.floor_scale(1e-3 * dv_ref_max);
    dk.floor_scale(1e-3 * dv_ref_max);
  }
};

bool guard_intact(const bf16* p, size_t n, size_t guard) {
  const auto g = dev_download(p + n, guard);
  for (const bf16& x : g) {
    uint16_t bits;
    std::memcpy(&bits, &x, 2);
    if (bits != 0xFFFFu) return false;
  }
  return true;
}

// On failure: which key rows (t mod 128) and columns of a gradient are wrong, to tell layout
// errors (whole column blocks, whole row groups) from numerical ones.
void describe_failure(const char* name, const bf16* got_dev, const float* ref_dev, int B, int T,
                      int H, int D) {
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const auto got = dev_download(got_dev, n);
  const auto ref = dev_download(ref_dev, n);
  double max_ref = 0;
  for (float x : ref) max_ref = std::max(max_ref, static_cast<double>(std::fabs(x)));
  std::vector<int> bad_col(D, 0), bad_row(128, 0);
  int shown = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
          const size_t i = ((static_cast<size_t>(b) * T + t) * H + h) * D + c;
          const float x = __bfloat162float(got[i]);
          if (!(std::fabs(x - ref[i]) <= 2e-2 * max_ref)) {
            ++bad_col[c];
            ++bad_row[t % 128];
            if (shown++ < 4)
              std::printf("      %s[b=%d t=%d h=%d c=%d] got %.5f ref %.5f\n", name, b, t, h, c, x,
                          ref[i]);
          }
        }
  std::printf("      %s bad columns:", name);
  for (int c = 0; c < D; ++c)
    if (bad_col[c]) std::printf(" %d", c);
  std::printf("\n      %s bad rows (t mod 128):", name);
  for (int r = 0; r < 128; ++r)
    if (bad_row[r]) std::printf(" %d", r);
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
  const auto hdo = random_bf16(n, 4000 + T * 7 + D, 1.f);
  bf16* q = dev_upload(hq);
  bf16* k = dev_upload(hk);
  bf16* v = dev_upload(hv);
  bf16* dout = dev_upload(hdo);
  bf16* o = dev_alloc<bf16>(n);
  float* lse = dev_alloc<float>(n_lse);
  bf16* dq = dev_alloc<bf16>(n + guard);
  bf16* dk = dev_alloc<bf16>(n + guard);
  bf16* dv = dev_alloc<bf16>(n + guard);
  const size_t ws_bytes = trainer::cuda::flash_attention_backward_workspace_bytes(B, T, H, D);
  void* ws = dev_alloc<char>(ws_bytes);
  float* dq_ref = dev_alloc<float>(n);
  float* dk_ref = dev_alloc<float>(n);
  float* dv_ref = dev_alloc<float>(n);
  float* lse_ref = dev_alloc<float>(n_lse);
  float* dsum_ref = dev_alloc<float>(n_lse);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  trainer::cuda::flash_attention_forward(q, k, v, o, lse, B, T, H, D, stream, kMmaSync);
  reference_rows_kernel<<<dim3(T, B * H), 128, (2 * T + 32) * sizeof(float), stream>>>(
      q, k, v, dout, dq_ref, lse_ref, dsum_ref, T, H, D, scale);
  CUDA_CHECK(cudaGetLastError());
  reference_cols_kernel<<<dim3(T, B * H), 128, 2 * T * sizeof(float), stream>>>(
      q, k, v, dout, lse_ref, dsum_ref, dk_ref, dv_ref, T, H, D, scale);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "forward + reference backward");

  auto run = [&](bool wgmma) {
    for (bf16* p : {dq, dk, dv})
      CUDA_CHECK(cudaMemsetAsync(p, 0xFF, (n + guard) * sizeof(bf16), stream));
    CUDA_CHECK(cudaMemsetAsync(ws, 0xFF, ws_bytes, stream));
    backward(wgmma, q, k, v, o, dout, lse, dq, dk, dv, ws, B, T, H, D, stream);
    sync_or_die(stream, wgmma ? "wgmma backward" : "flash_attention_backward");
    GradErrors e;
    e.dq = compare_dev(dq, dq_ref, n, stream);
    e.dk = compare_dev(dk, dk_ref, n, stream);
    e.dv = compare_dev(dv, dv_ref, n, stream);
    e.floor_dq_dk(e.dv.max_ref);
    e.guard_ok =
        guard_intact(dq, n, guard) && guard_intact(dk, n, guard) && guard_intact(dv, n, guard);
    return e;
  };

  // FA2 first; its outputs are kept to compare the new kernel's with.
  const GradErrors fa2 = run(false);
  bf16* fa2_out[3] = {dev_alloc<bf16>(n), dev_alloc<bf16>(n), dev_alloc<bf16>(n)};
  CUDA_CHECK(cudaMemcpy(fa2_out[0], dq, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(fa2_out[1], dk, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(fa2_out[2], dv, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
  const GradErrors e = run(true);
  GradErrors x;  // new vs FA2
  x.dq = compare_dev(dq, fa2_out[0], n, stream);
  x.dk = compare_dev(dk, fa2_out[1], n, stream);
  x.dv = compare_dev(dv, fa2_out[2], n, stream);
  x.floor_dq_dk(e.dv.max_ref);  // the reference's dv: FA2's is rounded like ours
  const bool ok = e.ok(2e-2) && x.ok(2e-2);
  std::printf(
      "T=%5d dh=%3d  new vs ref: dq %.2e dk %.2e dv %.2e%s%s | new vs FA2: dq %.2e dk %.2e dv "
      "%.2e | FA2 vs ref: dq %.2e dk %.2e dv %.2e %s  %s\n",
      T, D, e.dq.rel, e.dk.rel, e.dv.rel,
      (e.dq.finite && e.dk.finite && e.dv.finite) ? "" : " NON-FINITE",
      e.guard_ok ? "" : " GUARD-OVERWRITTEN", x.dq.rel, x.dk.rel, x.dv.rel, fa2.dq.rel, fa2.dk.rel,
      fa2.dv.rel, fa2.ok(2e-2) ? "ok" : "BAD", ok ? "PASS" : "FAIL");
  if (!ok) {
    ++g_failures;
    if (e.dq.rel >= 2e-2 || !e.dq.finite) describe_failure("dq", dq, dq_ref, B, T, H, D);
    if (e.dk.rel >= 2e-2 || !e.dk.finite) describe_failure("dk", dk, dk_ref, B, T, H, D);
    if (e.dv.rel >= 2e-2 || !e.dv.finite) describe_failure("dv", dv, dv_ref, B, T, H, D);
  }
  std::fflush(stdout);
  for (void* p :
       {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
        static_cast<void*>(dout), static_cast<void*>(o), static_cast<void*>(lse),
        static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv), ws,
        static_cast<void*>(dq_ref), static_cast<void*>(dk_ref), static_cast<void*>(dv_ref),
        static_cast<void*>(lse_ref), static_cast<void*>(dsum_ref), static_cast<void*>(fa2_out[0]),
        static_cast<void*>(fa2_out[1]), static_cast<void*>(fa2_out[2])})
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
  bf16* dout = dev_alloc<bf16>(n_max);
  bf16* o = dev_alloc<bf16>(n_max);
  float* lse = dev_alloc<float>(lse_max);
  bf16* g_new[3] = {dev_alloc<bf16>(n_max), dev_alloc<bf16>(n_max), dev_alloc<bf16>(n_max)};
  bf16* g_fa2[3] = {dev_alloc<bf16>(n_max), dev_alloc<bf16>(n_max), dev_alloc<bf16>(n_max)};
  void* ws =
      dev_alloc<char>(trainer::cuda::flash_attention_backward_workspace_bytes(B, kMaxT, H, kMaxD));
  fill_random_kernel<<<1024, 256, 0, stream>>>(q, n_max, 1u);
  fill_random_kernel<<<1024, 256, 0, stream>>>(k, n_max, 2u);
  fill_random_kernel<<<1024, 256, 0, stream>>>(v, n_max, 3u);
  fill_random_kernel<<<1024, 256, 0, stream>>>(dout, n_max, 4u);
  CUDA_CHECK(cudaGetLastError());
  sync_or_die(stream, "fill_random_kernel");

  std::printf(
      "\nTiming: whole backward (D + memset + main + convert), B=%d H=%d causal, median of 20 "
      "after 5 warm-up (TFLOP/s = 2.5*4*B*H*T^2*dh/2)\n",
      B, H);
  std::printf("%4s %6s | %10s %8s | %10s %8s | %7s | %s\n", "dh", "T", "new ms", "TFLOP/s",
              "FA2 ms", "TFLOP/s", "speedup", "new vs FA2 rel (dq, dk, dv)");
  for (int D : {64, 80, 128}) {
    for (int T : {1024, 2048, 4096, 8192, 16384}) {
      const double flops = 2.5 * 4.0 * B * H * static_cast<double>(T) * T * D / 2.0;
      trainer::cuda::flash_attention_forward(q, k, v, o, lse, B, T, H, D, stream, kMmaSync);
      sync_or_die(stream, "flash_attention_forward (timing inputs)");
      const double ms_new = median_ms(
          [&] {
            backward(true, q, k, v, o, dout, lse, g_new[0], g_new[1], g_new[2], ws, B, T, H, D,
                     stream);
          },
          stream, "wgmma backward (timing)");
      const double ms_fa2 = median_ms(
          [&] {
            backward(false, q, k, v, o, dout, lse, g_fa2[0], g_fa2[1], g_fa2[2], ws, B, T, H, D,
                     stream);
          },
          stream, "flash_attention_backward (timing)");
      const size_t n = static_cast<size_t>(B) * T * H * D;
      Cmp c[3];
      bool ok = true;
      for (int i = 0; i < 3; ++i) {
        c[i] = compare_dev(g_new[i], g_fa2[i], n, stream);
        ok = ok && c[i].finite && c[i].rel < 2e-2;
      }
      if (!ok) ++g_failures;
      std::printf("%4d %6d | %10.3f %8.1f | %10.3f %8.1f | %6.2fx | %.2e %.2e %.2e %s\n", D, T,
                  ms_new, flops / ms_new * 1e-9, ms_fa2, flops / ms_fa2 * 1e-9, ms_fa2 / ms_new,
                  c[0].rel, c[1].rel, c[2].rel, ok ? "ok" : "MISMATCH");
      std::fflush(stdout);
    }
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(dout), static_cast<void*>(o), static_cast<void*>(lse),
                  static_cast<void*>(g_new[0]), static_cast<void*>(g_new[1]),
                  static_cast<void*>(g_new[2]), static_cast<void*>(g_fa2[0]),
                  static_cast<void*>(g_fa2[1]), static_cast<void*>(g_fa2[2]), ws})
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
  if (!trainer::cuda::flash_attention_uses_wgmma(64) ||
      !trainer::cuda::flash_attention_uses_wgmma(128)) {
    std::printf("FAIL: the wgmma backward needs a compute capability 9.0 device\n");
    return 1;
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("\n0. wgmma unit test of the new path (dQ = dS K: A and B MN-major)\n");
  unit_test_tt<2, 1>(stream);  // dh 64 use: warpgroup w on dS^T panel w (64 queries each)
  unit_test_tt<1, 2>(stream);  // dh 128 use: warpgroup w on K panel w (64 dh columns each)

  std::printf(
      "\n1. correctness vs fp32 reference and vs FA2 backward (B=2, H=3; pass: rel < 2e-2 for "
      "dq, dk, dv)\n");
  for (int D : {64, 80, 128})
    for (int T : {1, 17, 64, 100, 1000, 1024}) correctness_case(T, D, stream);

  if (g_failures > 0)
    std::printf("\n%d check(s) FAILED so far; timing runs anyway (speeds of a wrong kernel)\n",
                g_failures);
  timing(stream);

  CUDA_CHECK(cudaStreamDestroy(stream));
  if (g_failures > 0) {
    std::printf("\n%d check(s) FAILED\n", g_failures);
    return 1;
  }
  std::printf("\nall checks PASSED\n");
  return 0;
}
