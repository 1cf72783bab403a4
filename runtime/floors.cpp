#include "runtime/floors.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/mix64.h"
#include "runtime/gpu_power.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/matmul.h"
#include "runtime/gpu_energy.h"
#endif

namespace trainer {

double attention_flops(int64_t B, int64_t T, int64_t H, int64_t dh, bool backward) {
  const double per = static_cast<double>(B) * H * static_cast<double>(T) * T * dh;
  return (backward ? 5.0 : 2.0) * per;
}

namespace {
// Element i of a pseudo-random sequence uniform in [-1, 1), 24 random bits.
float uniform_pm1(uint64_t seed, size_t i) {
  return static_cast<float>(mix64(seed * kGolden + i) >> 40) * 0x1p-23f - 1.0f;
}
}  // namespace

std::vector<uint16_t> random_bf16_bits(size_t count, uint64_t seed) {
  std::vector<uint16_t> bits(count);
  for (size_t i = 0; i < count; ++i) bits[i] = f32_to_bf16_bits(uniform_pm1(seed, i));
  return bits;
}

#ifndef TRAINER_WITH_CUDA

PhaseFloors measure_floors(Replica&, const ModelConfig&, const MicroBatch&, int64_t, int, bool,
                           bool, PowerSampler*, bool) {
  PhaseFloors f;
  f.note = "floors are measured on GPUs only";
  return f;
}

#else

namespace {

// Stops recording products when it goes out of scope (an exception included).
struct Recording {
  explicit Recording(std::vector<cuda::Gemm>* sink) { cuda::record_gemms(sink); }
  ~Recording() { cuda::record_gemms(nullptr); }
};

// `cost` of each distinct problem of `gemms` (measured once, kept in `per_call`), summed over the
// calls.
template <class F>
double per_problem_sum(const std::vector<cuda::Gemm>& gemms,
                       std::map<std::string, double>& per_call, F&& cost) {
  double total = 0;
  for (const cuda::Gemm& g : gemms) {
    const std::string key = cuda::describe(g) + (g.c ? " +C" : "");
    auto it = per_call.find(key);
    if (it == per_call.end()) it = per_call.emplace(key, cost(g)).first;
    total += it->second;
  }
  return total;
}

void fill_random_bf16(const DeviceBuffer& b, uint64_t seed) {
  const std::vector<uint16_t> host = random_bf16_bits(static_cast<size_t>(b.count()), seed);
  CUDA_CHECK(cudaMemcpy(b.view().data, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
}

// Random fp32 values: the first MiB made on the host, then doubled on the device until the
// buffer is full (a 256 MiB buffer costs 8 device copies, not 0.15 s of host work and 256 MB).
void fill_random_f32(const DeviceBuffer& b, uint64_t seed) {
  const size_t n = static_cast<size_t>(b.count());
  std::vector<float> host(std::min<size_t>(n, size_t{1} << 18));
  for (size_t i = 0; i < host.size(); ++i) host[i] = uniform_pm1(seed, i);
  float* d = b.as<float>();
  CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  for (size_t done = host.size(); done < n; done *= 2)
    CUDA_CHECK(cudaMemcpy(d + done, d, std::min(done, n - done) * 4, cudaMemcpyDeviceToDevice));
}

// 256 MiB copied device to device (read and written), the measure of memory-bound work. The
// source holds random fp32 values, as the optimizer's state and gradients do: moving zeros (fresh
// memory) costs a quarter fewer joules, 0.112 against 0.150 J per GB on one H200 at 1980 MHz
// (docs/results/log.md, 2026-11-27 16:11).
struct CopyTest {
  static constexpr int64_t kBytes = int64_t{256} << 20;
  DeviceBuffer src{DeviceKind::kCuda, DType::kF32, kBytes / 4};
  DeviceBuffer dst{DeviceKind::kCuda, DType::kF32, kBytes / 4};
  static constexpr double kMovedGb = 2.0 * static_cast<double>(kBytes) * 1e-9;
  CopyTest() { fill_random_f32(src, 7); }
  void run(cudaStream_t s) const {
    CUDA_CHECK(
        cudaMemcpyAsync(dst.view().data, src.view().data, kBytes, cudaMemcpyDeviceToDevice, s));
  }
};

// Flash attention's tensors for one shape: q, k, v, o, dO, dq, dk, dv, lse and the backward's
// workspace; filled with a constant, or with random values (the power a kernel draws depends on
// its operands' bits).
struct AttentionTest {
  int B, T, H, dh;
  std::vector<DeviceBuffer> t;
  DeviceBuffer lse, ws;
  AttentionTest(int B_, int T_, int H_, int dh_, bool random)
      : B(B_),
        T(T_),
        H(H_),
        dh(dh_),
        lse(DeviceKind::kCuda, DType::kF32, int64_t{B_} * H_ * T_),
        ws(DeviceKind::kCuda, DType::kF32,
           static_cast<int64_t>(
               cuda::flash_attention_backward_workspace_bytes(B_, T_, H_, dh_) / 4 + 1)) {
    for (int i = 0; i < 8; ++i) {
      t.emplace_back(DeviceKind::kCuda, DType::kBF16, int64_t{B} * T * H * dh);
      if (random)
        fill_random_bf16(t.back(), static_cast<uint64_t>(i + 1));
      else
        CUDA_CHECK(cudaMemset(t.back().view().data, 0x3c, t.back().bytes()));  // 0.0115
    }
  }
  __nv_bfloat16* p(int i) const { return t[i].as<__nv_bfloat16>(); }
  void forward(cudaStream_t s) const {
    cuda::flash_attention_forward(p(0), p(1), p(2), p(3), lse.as<float>(), B, T, H, dh, s);
  }
  void backward(cudaStream_t s) const {
    cuda::flash_attention_backward(p(0), p(1), p(2), p(3), p(4), lse.as<float>(), p(5), p(6), p(7),
                                   ws.view().data, B, T, H, dh, s);
  }
};

// Each part at the power cap runs longer than NVML's one-second power average, after a load long
// enough for the GPU to reach its limit.
constexpr double kCapWindowMs = 1200;
constexpr double kCapWarmMs = 2500;

// The parts of the step at the power cap (floors.h): fills f's joules. The GEMMs replay the
// recorded products on the replica's buffers through `mm`, the Matmul that timed them alone.
void measure_at_cap(PhaseFloors& f, PowerSampler& power, cuda::Matmul& mm,
                    const std::vector<cuda::Gemm>& fwd, const std::vector<cuda::Gemm>& bwd,
                    const ModelConfig& c, const MicroBatch& mb, bool flash, bool backward,
                    cudaStream_t s, std::vector<std::string>& missing) {
  // The heaviest product brings the GPU to its limit.
  const cuda::Gemm* heavy = nullptr;
  for (const auto* list : {&fwd, &bwd})
    for (const cuda::Gemm& g : *list)
      if (!heavy || g.m * g.n * g.k * g.batch > heavy->m * heavy->n * heavy->k * heavy->batch)
        heavy = &g;
  if (!heavy) return;
  // `mm` planned (and tuned) every product the windows measure when it timed them alone, so no
  // window counts a plan or a tuning.
  energy_per_call(s, power, kCapWarmMs, [&] { mm.run(*heavy, s); });
  std::map<std::string, double> per_call;
  auto gemm_j = [&](const cuda::Gemm& g) {
    return energy_per_call(s, power, kCapWindowMs, [&] { mm.run(g, s); }).joules();
  };
  f.gemm_forward_j = per_problem_sum(fwd, per_call, gemm_j);
  f.gemm_backward_j = per_problem_sum(bwd, per_call, gemm_j);
  try {
    const CopyTest copy;
    // The price comes with the SM clock it was paid at (the copy, memory-bound, runs at the top
    // clock even after the GEMMs held the GPU at its limit).
    power.begin();
    const CallEnergy e = energy_per_call(s, power, kCapWindowMs, [&] { copy.run(s); });
    f.copy_sm_mhz = power.end().sm_mhz_median;
    f.copy_j_per_gb = e.joules() / CopyTest::kMovedGb;
  } catch (const UsageError&) {
    missing.push_back("no room for the copy at the cap: its bytes left out there");
  }
  if (flash) {
    try {
      const AttentionTest a(static_cast<int>(mb.batch), static_cast<int>(mb.seq),
                            static_cast<int>(c.n_heads), static_cast<int>(c.head_dim()),
                            /*random=*/true);
      const double L = static_cast<double>(c.n_layers);
      f.attention_forward_j =
          L * energy_per_call(s, power, kCapWindowMs, [&] { a.forward(s); }).joules();
      if (backward)
        f.attention_backward_j =
            L * energy_per_call(s, power, kCapWindowMs, [&] { a.backward(s); }).joules();
    } catch (const UsageError&) {
      missing.push_back("no room for attention at the cap: left out there");
    }
  }
  f.limit_watts = power.limit_watts();
  f.cap_window_s = kCapWindowMs * 1e-3;
  f.at_cap = true;
}

}  // namespace

PhaseFloors measure_floors(Replica& r, const ModelConfig& c, const MicroBatch& mb,
                           int64_t optimizer_elems, int moment_bytes, bool backward,
                           bool norm_beside_backward, PowerSampler* power, bool gemm_tune) {
  PhaseFloors f;
  if (r.device() != DeviceKind::kCuda) {
    f.note = "floors are measured on GPUs only";
    return f;
  }
  r.synchronize();
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{s};
  std::vector<std::string> missing;

  // 1. One forward (and backward) with every product recorded, then each replayed alone.
  std::vector<cuda::Gemm> fwd, bwd;
  r.zero_grads();
  {
    Recording on(&fwd);
    r.forward(mb);
  }
  if (backward) {
    Recording on(&bwd);
    r.backward(1.0f / static_cast<float>(mb.batch * mb.seq), {});
  }
  r.take_loss();
  r.synchronize();
  // A Matmul of its own picks the algorithm the step's would for the same problem and alignments
  // (tuned as the step's are), planned for the whole GPU: products the step plans for fewer SMs
  // (--update-sms, --wgrad-stream) are timed here on all of them. The parts at the cap reuse it.
  cuda::Matmul mm;
  mm.set_tuning(gemm_tune);
  {
    std::map<std::string, double> per_call;
    auto alone_ms = [&](const cuda::Gemm& g) { return time_ms(s, 2, 5, [&] { mm.run(g, s); }); };
    f.gemm_forward_ms = per_problem_sum(fwd, per_call, alone_ms);
    f.gemm_backward_ms = per_problem_sum(bwd, per_call, alone_ms);
    f.gemm_forward_calls = static_cast<int64_t>(fwd.size());
    f.gemm_backward_calls = static_cast<int64_t>(bwd.size());
  }

  // 2. Copy bandwidth: 256 MiB device to device, read and written, after 300 ms of rest. Timed
  // right after the GEMMs above, it read 4% low in 3 of 6 runs on two H200s (4010 against 4170
  // GB/s), and 3 of 3 read 4170-4185 after the rest, which the host-side fill of the copy's source
  // used to give (docs/results/log.md, 2026-11-27 16:56 to 17:14).
  try {
    const CopyTest copy;
    CUDA_CHECK(cudaDeviceSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    f.copy_gb_s = CopyTest::kMovedGb * 1e3 / time_ms(s, 2, 10, [&] { copy.run(s); });
  } catch (const UsageError&) {
    missing.push_back("no room for the copy test's 512 MiB: no memory floors");
  }

  // 3. Flash attention's throughput at T = 4096 (B 4, 16 heads, this model's head dim).
  const int dh = static_cast<int>(c.head_dim());
  const bool flash = r.uses_flash_attention();
  if (flash) {
    const int Bt = 4, Tt = 4096, Ht = 16;
    try {
      const AttentionTest a(Bt, Tt, Ht, dh, /*random=*/false);
      const double fms = time_ms(s, 1, 3, [&] { a.forward(s); });
      f.attention_forward_tflops = attention_flops(Bt, Tt, Ht, dh, false) / (fms * 1e9);
      if (backward) {
        const double bms = time_ms(s, 1, 3, [&] { a.backward(s); });
        f.attention_backward_tflops = attention_flops(Bt, Tt, Ht, dh, true) / (bms * 1e9);
      }
    } catch (const UsageError&) {
      missing.push_back("no room for the attention test's tensors: attention left out");
    }
  }
  const int64_t L = c.n_layers, H = c.n_heads;
  if (f.attention_forward_tflops > 0)
    f.attention_forward_ms =
        L * attention_flops(mb.batch, mb.seq, H, dh, false) / (f.attention_forward_tflops * 1e9);
  if (f.attention_backward_tflops > 0)
    f.attention_backward_ms =
        L * attention_flops(mb.batch, mb.seq, H, dh, true) / (f.attention_backward_tflops * 1e9);

  // 4. Bytes at the copy bandwidth. Elementwise, per token (estimated from the shapes; element
  // size e): forward reads and writes the embedding row (2d), per block two norms (4d), RoPE over
  // v, k, q (6d) and the gate (read 2f, write f), the final norm (2d), and the fused
  // cross-entropy reads and writes a logits row (2 Vp); backward per block two norm backwards
  // (about 4d each), RoPE (6d), the gate (read 3f, write 2f), and the final norm and the
  // embedding (6d). The optimizer moves 4 + 8 + 8 + 8 bytes (gradient; master, m, v read and
  // written) and writes a working parameter (e) per element, and the gradient-norm pass reads the
  // gradient again (4): in the optimizer phase, or beside backward and then in its floor.
  if (f.copy_gb_s > 0) {
    const double e = static_cast<double>(dtype_size(r.params().dtype));
    const double d = static_cast<double>(c.d_model), ff = static_cast<double>(c.d_ff);
    const double Vp = static_cast<double>(align_up(c.vocab, 8));  // the replica's logits rows
    const double tokens = static_cast<double>(mb.batch * mb.seq);
    const double fwd_bytes = tokens * e * (2 * d + L * (4 * d + 6 * d + 3 * ff) + 2 * d + 2 * Vp);
    const double norm_bytes = 4.0 * static_cast<double>(optimizer_elems);
    const double bwd_bytes = tokens * e * (L * (8 * d + 6 * d + 5 * ff) + 6 * d) +
                             (norm_beside_backward ? norm_bytes : 0.0);
    f.elementwise_forward_bytes = fwd_bytes;
    if (backward) f.elementwise_backward_bytes = bwd_bytes;
    f.elementwise_forward_ms = fwd_bytes / (f.copy_gb_s * 1e6);
    if (backward) f.elementwise_backward_ms = bwd_bytes / (f.copy_gb_s * 1e6);
    // Read the gradient (4), read and write the master (8) and both moments, write the weights.
    const double per_elem = 12.0 + 4.0 * moment_bytes + e;
    f.optimizer_bytes =
        static_cast<double>(optimizer_elems) * per_elem + (norm_beside_backward ? 0 : norm_bytes);
    f.optimizer_ms = f.optimizer_bytes / (f.copy_gb_s * 1e6);
  }
  if (power) measure_at_cap(f, *power, mm, fwd, bwd, c, mb, flash, backward, s, missing);
  for (size_t i = 0; i < missing.size(); ++i) f.note += (i ? "; " : "") + missing[i];
  if (!flash)
    f.note += std::string(f.note.empty() ? "" : "; ") +
              "attention runs as GEMMs (simple path): counted with the GEMMs";
  f.measured = true;
  return f;
}

#endif

}  // namespace trainer
