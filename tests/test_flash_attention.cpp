// GPU test of the FlashAttention kernels: output, lse, dQ, dK and dV against a float64 CPU
// reference of causal softmax attention, on random bf16 inputs, for every supported head dim and
// sequence lengths that exercise single tiles, tails and many tiles, with both kernel choices:
// kAuto (the Hopper wgmma kernels where flash_attention_uses_wgmma says so, FA2 elsewhere) and
// kMmaSync (always FA2, so that path stays tested on Hopper too). Outputs are poisoned with 0xFF
// bytes (NaN) before every run, so anything the kernels fail to write shows up.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/rope.cuh"
#include "tests/catch.h"

namespace {

using trainer::cuda::flash_attention_backward;
using trainer::cuda::flash_attention_backward_clear;
using trainer::cuda::flash_attention_backward_workspace_bytes;
using trainer::cuda::flash_attention_forward;
using trainer::cuda::flash_attention_supports;
using trainer::cuda::flash_attention_uses_wgmma;
using trainer::cuda::FlashKernels;

constexpr FlashKernels kBothKernels[] = {FlashKernels::kAuto, FlashKernels::kMmaSync};

// bf16 <-> float by bit manipulation (round to nearest even), independent of the CUDA headers.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Owning device allocation.
struct DeviceMem {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceMem(size_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1))); }
  ~DeviceMem() { cudaFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  void poison() const { CUDA_CHECK(cudaMemset(ptr, 0xFF, bytes)); }
};

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// Straightforward float64 causal attention and its gradient for (B, T, H*D) inputs:
//   S = q k^T / sqrt(D) (j <= i), P = softmax(S), o = P v, lse = log sum exp S,
//   dP = dO v^T, dS = P o (dP - rowsum(dO o o)), dq = dS k / sqrt(D), dk = dS^T q / sqrt(D),
//   dv = P^T dO.
Reference reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const std::vector<float>& dout, int B,
                              int T, int H, int D) {
  Reference r;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  r.o.assign(n, 0.0);
  r.dq.assign(n, 0.0);
  r.dk.assign(n, 0.0);
  r.dv.assign(n, 0.0);
  r.lse.assign(static_cast<size_t>(B) * H * T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const size_t ld = static_cast<size_t>(H) * D;
  std::vector<double> p(T), ds(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      auto row = [&](int t) {
        return (static_cast<size_t>(b) * T + t) * ld + static_cast<size_t>(h) * D;
      };
      for (int i = 0; i < T; ++i) {
        const size_t ri = row(i);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const size_t rj = row(j);
          double s = 0.0;
          for (int c = 0; c < D; ++c) s += static_cast<double>(q[ri + c]) * k[rj + c];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double l = 0.0;
        for (int j = 0; j <= i; ++j) l += std::exp(p[j] - mx);
        const double lse = mx + std::log(l);
        r.lse[(static_cast<size_t>(b) * H + h) * T + i] = lse;
        for (int j = 0; j <= i; ++j) p[j] = std::exp(p[j] - lse);
        for (int j = 0; j <= i; ++j) {
          const size_t rj = row(j);
          for (int c = 0; c < D; ++c) r.o[ri + c] += p[j] * v[rj + c];
        }
        double di = 0.0;
        for (int c = 0; c < D; ++c) di += static_cast<double>(dout[ri + c]) * r.o[ri + c];
        for (int j = 0; j <= i; ++j) {
          const size_t rj = row(j);
          double dp = 0.0;
          for (int c = 0; c < D; ++c) dp += static_cast<double>(dout[ri + c]) * v[rj + c];
          ds[j] = p[j] * (dp - di);
        }
        for (int j = 0; j <= i; ++j) {
          const size_t rj = row(j);
          for (int c = 0; c < D; ++c) {
            r.dq[ri + c] += scale * ds[j] * k[rj + c];
            r.dk[rj + c] += scale * ds[j] * q[ri + c];
            r.dv[rj + c] += p[j] * dout[ri + c];
          }
        }
      }
    }
  }
  return r;
}

// ||x - ref|| / max(||ref||, 1e-3 * sqrt(n)); NaN if x has a NaN. The floor (an RMS of 1e-3)
// turns the comparison absolute where the reference is exactly zero: with T = 1 every query sees
// only itself, so P = 1, dS = dO.v - dO.o = 0 and dq = dk = 0, while the kernel's dS is a rounding
// residue of two differently ordered fp32 sums.
double rel_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) /
         std::max(std::sqrt(den), 1e-3 * std::sqrt(static_cast<double>(ref.size())));
}

size_t count_nan(const std::vector<float>& x) {
  return static_cast<size_t>(
      std::count_if(x.begin(), x.end(), [](float f) { return std::isnan(f); }));
}

std::vector<float> download_bf16(const DeviceMem& m, size_t n) {
  std::vector<uint16_t> raw(n);
  CUDA_CHECK(cudaMemcpy(raw.data(), m.ptr, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = from_bf16(raw[i]);
  return out;
}

// Random N(0, 1) values rounded to bf16: `f` holds the exact values the GPU sees.
struct Bf16Tensor {
  std::vector<float> f;
  std::vector<uint16_t> bits;
  Bf16Tensor(size_t n, std::mt19937& gen) : f(n), bits(n) {
    std::normal_distribution<float> dist(0.f, 1.f);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = to_bf16(dist(gen));
      f[i] = from_bf16(bits[i]);
    }
  }
  void upload(const DeviceMem& m) const {
    CUDA_CHECK(cudaMemcpy(m.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
};

// Random q, k, v and dO of n elements each (Bf16Tensor's values, drawn in that order), on the
// device only.
struct DeviceInputs {
  DeviceMem q, k, v, dout;
  DeviceInputs(size_t n, std::mt19937& gen) : q(n * 2), k(n * 2), v(n * 2), dout(n * 2) {
    for (const DeviceMem* m : {&q, &k, &v, &dout}) Bf16Tensor(n, gen).upload(*m);
  }
};

// The kernel flash attention runs for head dim D under `kernels`.
const char* kernel_name(FlashKernels kernels, int D, bool backward) {
  if (kernels != FlashKernels::kAuto || !flash_attention_uses_wgmma(D)) return "mma.sync";
  return backward ? "wgmma" : "tma";
}

void check_against_reference(int B, int T, int H, int D, unsigned seed, FlashKernels kernels) {
  INFO("B=" << B << " T=" << T << " H=" << H << " head_dim=" << D << " forward "
            << kernel_name(kernels, D, false) << " backward " << kernel_name(kernels, D, true));
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const size_t n_rows = static_cast<size_t>(B) * H * T;
  std::mt19937 gen(seed);
  const Bf16Tensor q(n, gen), k(n, gen), v(n, gen), dout(n, gen);

  DeviceMem d_q(n * 2), d_k(n * 2), d_v(n * 2), d_dout(n * 2), d_o(n * 2), d_lse(n_rows * 4);
  DeviceMem d_dq(n * 2), d_dk(n * 2), d_dv(n * 2);
  DeviceMem work(flash_attention_backward_workspace_bytes(B, T, H, D));
  q.upload(d_q);
  k.upload(d_k);
  v.upload(d_v);
  dout.upload(d_dout);
  for (const DeviceMem* m : {&d_o, &d_lse, &d_dq, &d_dk, &d_dv, &work}) m->poison();

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  using bf = __nv_bfloat16;
  flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), d_o.as<bf>(), d_lse.as<float>(),
                          B, T, H, D, stream, kernels);
  flash_attention_backward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), d_o.as<bf>(), d_dout.as<bf>(),
                           d_lse.as<float>(), d_dq.as<bf>(), d_dk.as<bf>(), d_dv.as<bf>(), work.ptr,
                           B, T, H, D, stream, kernels);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));

  const std::vector<float> o = download_bf16(d_o, n);
  std::vector<float> lse(n_rows);
  CUDA_CHECK(cudaMemcpy(lse.data(), d_lse.ptr, n_rows * 4, cudaMemcpyDeviceToHost));
  const std::vector<float> dq = download_bf16(d_dq, n);
  const std::vector<float> dk = download_bf16(d_dk, n);
  const std::vector<float> dv = download_bf16(d_dv, n);

  const Reference ref = reference_attention(q.f, k.f, v.f, dout.f, B, T, H, D);
  CHECK(count_nan(o) == 0);
  CHECK(count_nan(lse) == 0);
  CHECK(count_nan(dq) == 0);
  CHECK(count_nan(dk) == 0);
  CHECK(count_nan(dv) == 0);
  const double e_o = rel_error(o, ref.o), e_lse = rel_error(lse, ref.lse);
  const double e_dq = rel_error(dq, ref.dq), e_dk = rel_error(dk, ref.dk);
  const double e_dv = rel_error(dv, ref.dv);
  INFO("relative errors: o " << e_o << " lse " << e_lse << " dq " << e_dq << " dk " << e_dk
                             << " dv " << e_dv);
  CHECK(e_o < 2e-2);
  CHECK(e_lse < 2e-2);
  CHECK(e_dq < 2e-2);
  CHECK(e_dk < 2e-2);
  CHECK(e_dv < 2e-2);
}

}  // namespace

TEST_CASE("flash attention matches a float64 reference", "[gpu][flash_attention]") {
  for (FlashKernels kernels : kBothKernels) {
    unsigned seed = 1;
    for (int D : {16, 32, 64, 80, 128})
      for (int T : {1, 17, 64, 100, 1000}) check_against_reference(2, T, 3, D, seed++, kernels);
  }
}

TEST_CASE("flash attention with many heads and a single sequence", "[gpu][flash_attention]") {
  // B*H spread over grid.x, several key/query blocks per head, T not a multiple of any tile.
  for (FlashKernels kernels : kBothKernels) {
    check_against_reference(1, 333, 20, 64, 101, kernels);
    check_against_reference(3, 257, 2, 80, 102, kernels);
    check_against_reference(1, 300, 12, 128, 103, kernels);
  }
}

TEST_CASE("flash attention runs the wgmma kernels where they are faster",
          "[gpu][flash_attention]") {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  for (int d : {16, 32}) CHECK_FALSE(flash_attention_uses_wgmma(d));
#ifdef TRAINER_SM90A
  const bool hopper = major == 9 && minor == 0;
#else
  const bool hopper = false;  // not built for sm_90a: FA2 everywhere
#endif
  if (!hopper) {
    for (int d : {64, 80, 128}) CHECK_FALSE(flash_attention_uses_wgmma(d));
    WARN("wgmma dispatch not checked: needs a build for sm_90a and compute capability 9.0, device "
         << major << "." << minor);
    return;
  }
  for (int d : {64, 80, 128}) CHECK(flash_attention_uses_wgmma(d));
}

TEST_CASE("flash attention forward is deterministic", "[gpu][flash_attention]") {
  // On Hopper both head dims run the TMA forward (kAuto); elsewhere FA2.
  const int D = GENERATE(64, 128);
  const int B = 2, T = 300, H = 4;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  std::mt19937 gen(7);
  const Bf16Tensor q(n, gen), k(n, gen), v(n, gen);
  DeviceMem d_q(n * 2), d_k(n * 2), d_v(n * 2), o1(n * 2), o2(n * 2);
  DeviceMem l1(static_cast<size_t>(B) * H * T * 4), l2(static_cast<size_t>(B) * H * T * 4);
  q.upload(d_q);
  k.upload(d_k);
  v.upload(d_v);
  o1.poison();
  o2.poison();
  using bf = __nv_bfloat16;
  flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o1.as<bf>(), l1.as<float>(), B,
                          T, H, D, nullptr);
  flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o2.as<bf>(), l2.as<float>(), B,
                          T, H, D, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> a(n), b(n);
  CUDA_CHECK(cudaMemcpy(a.data(), o1.ptr, n * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), o2.ptr, n * 2, cudaMemcpyDeviceToHost));
  CHECK(a == b);
}

// The Hopper kernels are persistent: one CTA per SM works through the blocks, taking the next
// one from a device counter (flash/launch.h, PersistentSchedule), and at long T the blocks go in
// groups of heads that share the L2 (head_order), the last group smaller than the others. Every
// head and every block must still be computed: kAuto (Hopper) against kMmaSync (FA2) on the same
// inputs, forward and backward, poisoned outputs. Shape 0: B * H = 70 heads at T = 4096
// (grouped). Shape 1: 30 heads at T = 2000, 480 blocks of 128 rows, 3-4 per CTA on 132 SMs. The
// checked run comes after kFlashScheduleSlots unchecked ones, so that its kernels use counters
// that an earlier launch used and reset.
TEST_CASE(
    "flash attention: the persistent, grouped schedule of the Hopper kernels covers every "
    "block",
    "[gpu][flash_attention]") {
  const int D = GENERATE(64, 80, 128);
  const int shape = GENERATE(0, 1);
  if (!flash_attention_uses_wgmma(D)) {
    WARN("not a Hopper run: kAuto is FA2 here, nothing to compare for dh " << D);
    return;
  }
  const int B = shape == 0 ? 5 : 3, T = shape == 0 ? 4096 : 2000, H = shape == 0 ? 14 : 10;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  std::mt19937 gen(11);
  const DeviceInputs in(n, gen);
  const DeviceMem &d_q = in.q, &d_k = in.k, &d_v = in.v, &d_do = in.dout;
  DeviceMem work(flash_attention_backward_workspace_bytes(B, T, H, D));
  using bf = __nv_bfloat16;
  struct Out {
    std::vector<float> o, lse, dq, dk, dv;
  };
  DeviceMem o(n * 2), lse(n_lse * 4), dq(n * 2), dk(n * 2), dv(n * 2);
  auto launch = [&](FlashKernels kernels) {
    for (const DeviceMem* m : {&o, &lse, &dq, &dk, &dv}) m->poison();
    flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o.as<bf>(), lse.as<float>(),
                            B, T, H, D, nullptr, kernels);
    flash_attention_backward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o.as<bf>(), d_do.as<bf>(),
                             lse.as<float>(), dq.as<bf>(), dk.as<bf>(), dv.as<bf>(), work.ptr, B, T,
                             H, D, nullptr, kernels);
  };
  auto run = [&](FlashKernels kernels) {
    launch(kernels);
    CUDA_CHECK(cudaDeviceSynchronize());
    Out out{download_bf16(o, n), std::vector<float>(n_lse), download_bf16(dq, n),
            download_bf16(dk, n), download_bf16(dv, n)};
    CUDA_CHECK(cudaMemcpy(out.lse.data(), lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    return out;
  };
  for (int i = 0; i < trainer::cuda::kFlashScheduleSlots; ++i) launch(FlashKernels::kAuto);
  const Out hopper = run(FlashKernels::kAuto);
  const Out fa2 = run(FlashKernels::kMmaSync);
  auto as_double = [](const std::vector<float>& x) {
    return std::vector<double>(x.begin(), x.end());
  };
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>
      outputs[] = {{"o", {&hopper.o, &fa2.o}},
                   {"lse", {&hopper.lse, &fa2.lse}},
                   {"dq", {&hopper.dq, &fa2.dq}},
                   {"dk", {&hopper.dk, &fa2.dk}},
                   {"dv", {&hopper.dv, &fa2.dv}}};
  for (const auto& [name, pair] : outputs) {
    INFO("dh " << D << ", B " << B << ", T " << T << ", H " << H << ", " << name
               << ": Hopper kernels against FA2");
    CHECK(count_nan(*pair.first) == 0);
    CHECK(rel_error(*pair.first, as_double(*pair.second)) < 1e-2);
  }
}

// q, k, v as columns of one (B, T, ld) buffer, [v | k | q | pad] as the model's fused projection
// writes them, and dq, dk, dv into columns of another: the same bits as with whole-head rows (dq up
// to its summation order), and the columns between them untouched. Both kernel families.
TEST_CASE("flash attention reads and writes heads inside wider rows", "[gpu][flash_attention]") {
  const int D = GENERATE(32, 64, 80, 128);
  const int B = 2, T = 300, H = 4;
  const int64_t d = static_cast<int64_t>(H) * D, ld = 3 * d + 8;
  const size_t n = static_cast<size_t>(B) * T * d, n_wide = static_cast<size_t>(B) * T * ld;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  std::mt19937 gen(21);
  const Bf16Tensor wide(n_wide, gen), dout(n, gen);
  DeviceMem d_wide(n_wide * 2), d_do(n * 2), d_q(n * 2), d_k(n * 2), d_v(n * 2);
  wide.upload(d_wide);
  dout.upload(d_do);
  using bf = __nv_bfloat16;
  const bf* V = d_wide.as<bf>();
  const bf* K = V + d;
  const bf* Q = V + 2 * d;
  // The same q, k, v with whole-head rows.
  for (int j = 0; j < 3; ++j)
    CUDA_CHECK(cudaMemcpy2D((j == 0   ? d_v
                             : j == 1 ? d_k
                                      : d_q)
                                .ptr,
                            d * 2, V + j * d, ld * 2, d * 2, static_cast<size_t>(B) * T,
                            cudaMemcpyDeviceToDevice));
  DeviceMem work(flash_attention_backward_workspace_bytes(B, T, H, D));
  for (FlashKernels kernels : kBothKernels) {
    INFO("dh " << D << (kernels == FlashKernels::kAuto ? ", kAuto" : ", kMmaSync"));
    DeviceMem o1(n * 2), o2(n * 2), l1(n_lse * 4), l2(n_lse * 4);
    DeviceMem dq(n * 2), dk(n * 2), dv(n * 2), dwide(n_wide * 2);
    for (const DeviceMem* m : {&o1, &o2, &l1, &l2, &dq, &dk, &dv, &dwide}) m->poison();
    flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o1.as<bf>(), l1.as<float>(),
                            B, T, H, D, nullptr, kernels);
    flash_attention_forward(Q, K, V, o2.as<bf>(), l2.as<float>(), B, T, H, D, nullptr, kernels,
                            {ld, 0});
    flash_attention_backward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o1.as<bf>(), d_do.as<bf>(),
                             l1.as<float>(), dq.as<bf>(), dk.as<bf>(), dv.as<bf>(), work.ptr, B, T,
                             H, D, nullptr, kernels);
    bf* dV = dwide.as<bf>();
    flash_attention_backward(Q, K, V, o2.as<bf>(), d_do.as<bf>(), l2.as<float>(), dV + 2 * d,
                             dV + d, dV, work.ptr, B, T, H, D, nullptr, kernels, {ld, ld});
    CUDA_CHECK(cudaDeviceSynchronize());
    auto bits = [](const DeviceMem& m, size_t count) {
      std::vector<uint16_t> h(count);
      CUDA_CHECK(cudaMemcpy(h.data(), m.ptr, count * 2, cudaMemcpyDeviceToHost));
      return h;
    };
    CHECK(bits(o1, n) == bits(o2, n));
    CHECK(bits(l1, 2 * n_lse) == bits(l2, 2 * n_lse));
    const std::vector<uint16_t> w = bits(dwide, n_wide);
    std::vector<uint16_t> col[3];  // dv, dk, dq out of the wide rows
    bool pad_untouched = true;
    for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r) {
      for (int j = 0; j < 3; ++j)
        col[j].insert(col[j].end(), w.begin() + r * ld + j * d, w.begin() + r * ld + (j + 1) * d);
      for (int64_t c = 3 * d; c < ld; ++c) pad_untouched &= w[r * ld + c] == 0xFFFF;
    }
    CHECK(pad_untouched);
    CHECK(col[0] == bits(dv, n));
    CHECK(col[1] == bits(dk, n));
    std::vector<double> dq_wide(n);
    for (size_t i = 0; i < n; ++i) dq_wide[i] = from_bf16(col[2][i]);
    CHECK(rel_error(download_bf16(dq, n), dq_wide) < 5e-3);
  }
}

// With RoPE's table, the backward hands out dq and dk through RoPE's backward (each channel pair
// (g0, g1) of position t -> (g0 c + g1 s, g1 c - g0 s)): the same as rotating the plain backward's
// dq and dk on the host, up to the one bf16 rounding the fused path saves; dv bit for bit as
// without. Both kernel families, the table exactly T positions long.
TEST_CASE("flash attention backward applies RoPE's backward to dq and dk",
          "[gpu][flash_attention]") {
  const int D = GENERATE(16, 32, 64, 80, 128);
  const int B = 2, T = 300, H = 3;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  std::mt19937 gen(31);
  const DeviceInputs in(n, gen);
  const DeviceMem &d_q = in.q, &d_k = in.k, &d_v = in.v, &d_do = in.dout;
  const std::vector<float> table = trainer::cuda::rope_table(T, D, 10000.0);
  DeviceMem d_table(table.size() * 4);
  CUDA_CHECK(cudaMemcpy(d_table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  DeviceMem work(flash_attention_backward_workspace_bytes(B, T, H, D));
  using bf = __nv_bfloat16;
  for (FlashKernels kernels : kBothKernels) {
    INFO("dh " << D << (kernels == FlashKernels::kAuto ? ", kAuto" : ", kMmaSync"));
    DeviceMem o(n * 2), lse(n_lse * 4), dq0(n * 2), dk0(n * 2), dv0(n * 2), dq1(n * 2), dk1(n * 2),
        dv1(n * 2);
    for (const DeviceMem* m : {&o, &lse, &dq0, &dk0, &dv0, &dq1, &dk1, &dv1}) m->poison();
    flash_attention_forward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o.as<bf>(), lse.as<float>(),
                            B, T, H, D, nullptr, kernels);
    flash_attention_backward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o.as<bf>(), d_do.as<bf>(),
                             lse.as<float>(), dq0.as<bf>(), dk0.as<bf>(), dv0.as<bf>(), work.ptr, B,
                             T, H, D, nullptr, kernels);
    flash_attention_backward(d_q.as<bf>(), d_k.as<bf>(), d_v.as<bf>(), o.as<bf>(), d_do.as<bf>(),
                             lse.as<float>(), dq1.as<bf>(), dk1.as<bf>(), dv1.as<bf>(), work.ptr, B,
                             T, H, D, nullptr, kernels, {}, d_table.as<float>());
    CUDA_CHECK(cudaDeviceSynchronize());
    // RoPE's backward on the host, in double, of the plain backward's (B, T, H, D) gradients.
    auto rotate_back = [&](const std::vector<float>& g) {
      std::vector<double> r(g.size());
      for (size_t row = 0; row < static_cast<size_t>(B) * T; ++row) {
        const size_t t = row % T;
        for (int h = 0; h < H; ++h)
          for (int j = 0; j < D / 2; ++j) {
            const size_t i = (row * H + h) * D + 2 * j;
            const double c = table[2 * (t * (D / 2) + j)], sn = table[2 * (t * (D / 2) + j) + 1];
            r[i] = g[i] * c + g[i + 1] * sn;
            r[i + 1] = g[i + 1] * c - g[i] * sn;
          }
      }
      return r;
    };
    const std::vector<float> dq_plain = download_bf16(dq0, n), dk_plain = download_bf16(dk0, n);
    const std::vector<double> dq_ref = rotate_back(dq_plain), dk_ref = rotate_back(dk_plain);
    const std::vector<float> dq_rope = download_bf16(dq1, n), dk_rope = download_bf16(dk1, n);
    CHECK(count_nan(dq_rope) == 0);
    CHECK(count_nan(dk_rope) == 0);
    CHECK(rel_error(dq_rope, dq_ref) < 4e-3);
    CHECK(rel_error(dk_rope, dk_ref) < 4e-3);
    // The rotation is not a no-op here: the plain gradients are far from the rotated ones.
    CHECK(rel_error(dq_plain, dq_ref) > 0.2);
    CHECK(rel_error(dk_plain, dk_ref) > 0.2);
    std::vector<uint16_t> v0(n), v1(n);
    CUDA_CHECK(cudaMemcpy(v0.data(), dv0.ptr, n * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v1.data(), dv1.ptr, n * 2, cudaMemcpyDeviceToHost));
    CHECK(v0 == v1);
  }
}

// The dq accumulator zeroed beforehand by flash_attention_backward_clear (the model does so on its
// weight-gradient stream) and the backward told so: the same bits as the backward zeroing it
// itself. The flag is what skips the zeroing: a poisoned workspace left as it is makes dq NaN.
// T = 64: one key block, so dq's sums have one order. Both kernel families.
TEST_CASE("flash attention backward after its dq accumulator was cleared beforehand",
          "[gpu][flash_attention]") {
  const int D = GENERATE(16, 64, 128);
  const int B = 2, T = 64, H = 3;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const size_t n_lse = static_cast<size_t>(B) * H * T;
  std::mt19937 gen(37);
  const DeviceInputs in(n, gen);
  DeviceMem work(flash_attention_backward_workspace_bytes(B, T, H, D));
  using bf = __nv_bfloat16;
  for (FlashKernels kernels : kBothKernels) {
    INFO("dh " << D << (kernels == FlashKernels::kAuto ? ", kAuto" : ", kMmaSync"));
    DeviceMem o(n * 2), lse(n_lse * 4);
    flash_attention_forward(in.q.as<bf>(), in.k.as<bf>(), in.v.as<bf>(), o.as<bf>(),
                            lse.as<float>(), B, T, H, D, nullptr, kernels);
    auto backward = [&](bool clear, bool zeroed) {
      DeviceMem dq(n * 2), dk(n * 2), dv(n * 2);
      for (const DeviceMem* m : {&dq, &dk, &dv, &work}) m->poison();
      if (clear) flash_attention_backward_clear(work.ptr, B, T, H, D, nullptr);
      flash_attention_backward(in.q.as<bf>(), in.k.as<bf>(), in.v.as<bf>(), o.as<bf>(),
                               in.dout.as<bf>(), lse.as<float>(), dq.as<bf>(), dk.as<bf>(),
                               dv.as<bf>(), work.ptr, B, T, H, D, nullptr, kernels, {}, nullptr,
                               zeroed);
      CUDA_CHECK(cudaDeviceSynchronize());
      const DeviceMem* out[] = {&dq, &dk, &dv};
      std::array<std::vector<uint16_t>, 3> bits;
      for (int i = 0; i < 3; ++i) {
        bits[i].resize(n);
        CUDA_CHECK(cudaMemcpy(bits[i].data(), out[i]->ptr, n * 2, cudaMemcpyDeviceToHost));
      }
      return std::make_pair(bits, download_bf16(dq, n));
    };
    const auto [itself, dq_itself] = backward(false, false);
    const auto [cleared, dq_cleared] = backward(true, true);
    CHECK(count_nan(dq_cleared) == 0);
    const auto [left, dq_left] = backward(false, true);
    CHECK(count_nan(dq_itself) == 0);
    CHECK(cleared[0] == itself[0]);
    CHECK(cleared[1] == itself[1]);
    CHECK(cleared[2] == itself[2]);
    CHECK(count_nan(dq_left) == n);
    CHECK(left[1] == itself[1]);
    CHECK(left[2] == itself[2]);
  }
}

TEST_CASE("flash attention supports exactly the built head dims", "[gpu][flash_attention]") {
  for (int d : {16, 32, 64, 80, 128}) CHECK(flash_attention_supports(d));
  for (int d : {0, 8, 24, 48, 96, 112, 160, 256}) CHECK_FALSE(flash_attention_supports(d));
}

TEST_CASE("flash attention rejects bad arguments", "[gpu][flash_attention]") {
  const int B = 1, T = 16, H = 2, D = 64;
  const size_t n = static_cast<size_t>(B) * T * H * D;
  DeviceMem q(n * 2), k(n * 2), v(n * 2), o(n * 2), lse(static_cast<size_t>(B) * H * T * 4);
  DeviceMem dq(n * 2), dk(n * 2), dv(n * 2),
      work(flash_attention_backward_workspace_bytes(B, T, H, D));
  using bf = __nv_bfloat16;
  bf* Q = q.as<bf>();
  bf* K = k.as<bf>();
  bf* V = v.as<bf>();
  bf* O = o.as<bf>();
  float* L = lse.as<float>();
  CHECK_THROWS_AS(flash_attention_forward(Q, K, V, O, L, B, T, H, 48, nullptr),
                  trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_forward(Q, K, V, O, L, 0, T, H, D, nullptr), trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_forward(Q, K, V, O, L, B, -1, H, D, nullptr),
                  trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_forward(nullptr, K, V, O, L, B, T, H, D, nullptr),
                  trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_forward(Q + 1, K, V, O, L, B, T, H, D, nullptr),
                  trainer::UsageError);  // 2-byte offset: not 16-byte aligned
  CHECK_THROWS_AS(flash_attention_backward_workspace_bytes(B, T, H, 100), trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_backward(Q, K, V, O, O, L, dq.as<bf>(), dk.as<bf>(), nullptr,
                                           work.ptr, B, T, H, D, nullptr),
                  trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_backward(Q, K, V, O, O, L, dq.as<bf>(), dk.as<bf>(), dv.as<bf>(),
                                           nullptr, B, T, H, D, nullptr),
                  trainer::UsageError);
  // Row strides below a row of heads, or not a multiple of 8 elements.
  CHECK_THROWS_AS(flash_attention_forward(Q, K, V, O, L, B, T, H, D, nullptr, FlashKernels::kAuto,
                                          {H * D - 8, 0}),
                  trainer::UsageError);
  CHECK_THROWS_AS(flash_attention_forward(Q, K, V, O, L, B, T, H, D, nullptr, FlashKernels::kAuto,
                                          {H * D + 4, 0}),
                  trainer::UsageError);
  CHECK_THROWS_AS(
      flash_attention_backward(Q, K, V, O, O, L, dq.as<bf>(), dk.as<bf>(), dv.as<bf>(), work.ptr, B,
                               T, H, D, nullptr, FlashKernels::kAuto, {0, -8}),
      trainer::UsageError);
  // Nothing was launched by the rejected calls; the device is still healthy.
  CUDA_CHECK(cudaDeviceSynchronize());
}
