#include "runtime/floors.h"

#include <fmt/format.h>

#include <map>
#include <vector>

#include "core/device_buffer.h"
#include "core/error.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/matmul.h"
#endif

namespace trainer {

double attention_flops(int64_t B, int64_t T, int64_t H, int64_t dh, bool backward) {
  const double per = static_cast<double>(B) * H * static_cast<double>(T) * T * dh;
  return (backward ? 5.0 : 2.0) * per;
}

#ifndef TRAINER_WITH_CUDA

PhaseFloors measure_floors(Replica&, const ModelConfig&, const MicroBatch&, int64_t, int, bool,
                           bool) {
  PhaseFloors f;
  f.note = "floors are measured on GPUs only";
  return f;
}

#else

namespace {

// Mean ms of `reps` calls of `run` on `s` after `warm` untimed ones.
template <class F>
double time_ms(cudaStream_t s, int warm, int reps, F&& run) {
  for (int i = 0; i < warm; ++i) run();
  cudaEvent_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; ++i) run();
  CUDA_CHECK(cudaEventRecord(b, s));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

// Stops recording products when it goes out of scope (an exception included).
struct Recording {
  explicit Recording(std::vector<cuda::Gemm>* sink) { cuda::record_gemms(sink); }
  ~Recording() { cuda::record_gemms(nullptr); }
};

// Each distinct problem of `gemms` timed alone (same plans: a Matmul picks the same algorithm
// for the same problem and alignments), summed over the calls.
double replay_ms(const std::vector<cuda::Gemm>& gemms, cuda::Matmul& mm, cudaStream_t s,
                 std::map<std::string, double>& per_call) {
  double total = 0;
  for (const cuda::Gemm& g : gemms) {
    const std::string key = cuda::describe(g) + (g.c ? " +C" : "");
    auto it = per_call.find(key);
    if (it == per_call.end())
      it = per_call.emplace(key, time_ms(s, 2, 5, [&] { mm.run(g, s); })).first;
    total += it->second;
  }
  return total;
}

}  // namespace

PhaseFloors measure_floors(Replica& r, const ModelConfig& c, const MicroBatch& mb,
                           int64_t optimizer_elems, int moment_bytes, bool backward,
                           bool norm_beside_backward) {
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
  {
    cuda::Matmul mm;
    std::map<std::string, double> per_call;
    f.gemm_forward_ms = replay_ms(fwd, mm, s, per_call);
    f.gemm_backward_ms = replay_ms(bwd, mm, s, per_call);
    f.gemm_forward_calls = static_cast<int64_t>(fwd.size());
    f.gemm_backward_calls = static_cast<int64_t>(bwd.size());
  }

  // 2. Copy bandwidth: 256 MiB device to device, read and written.
  const int64_t copy_bytes = int64_t{256} << 20;
  try {
    const DeviceBuffer src(DeviceKind::kCuda, DType::kF32, copy_bytes / 4);
    const DeviceBuffer dst(DeviceKind::kCuda, DType::kF32, copy_bytes / 4);
    const double ms = time_ms(s, 2, 10, [&] {
      CUDA_CHECK(cudaMemcpyAsync(dst.view().data, src.view().data, copy_bytes,
                                 cudaMemcpyDeviceToDevice, s));
    });
    f.copy_gb_s = 2.0 * static_cast<double>(copy_bytes) / (ms * 1e6);
  } catch (const UsageError&) {
    missing.push_back("no room for the copy test's 512 MiB: no memory floors");
  }

  // 3. Flash attention's throughput at T = 4096 (B 4, 16 heads, this model's head dim).
  const int dh = static_cast<int>(c.head_dim());
  const bool flash = r.uses_flash_attention();
  if (flash) {
    const int Bt = 4, Tt = 4096, Ht = 16;
    const int64_t n = int64_t{Bt} * Tt * Ht * dh;
    try {
      std::vector<DeviceBuffer> t;
      for (int i = 0; i < 8; ++i) t.emplace_back(DeviceKind::kCuda, DType::kBF16, n);
      for (DeviceBuffer& b : t) CUDA_CHECK(cudaMemset(b.view().data, 0x3c, b.bytes()));  // 0.0115
      const DeviceBuffer lse(DeviceKind::kCuda, DType::kF32, int64_t{Bt} * Ht * Tt);
      const size_t ws_bytes = cuda::flash_attention_backward_workspace_bytes(Bt, Tt, Ht, dh);
      const DeviceBuffer ws(DeviceKind::kCuda, DType::kF32, static_cast<int64_t>(ws_bytes / 4 + 1));
      auto p = [&](int i) { return t[i].as<__nv_bfloat16>(); };
      const double fms = time_ms(s, 1, 3, [&] {
        cuda::flash_attention_forward(p(0), p(1), p(2), p(3), lse.as<float>(), Bt, Tt, Ht, dh, s);
      });
      f.attention_forward_tflops = attention_flops(Bt, Tt, Ht, dh, false) / (fms * 1e9);
      if (backward) {
        const double bms = time_ms(s, 1, 3, [&] {
          cuda::flash_attention_backward(p(0), p(1), p(2), p(3), p(4), lse.as<float>(), p(5), p(6),
                                         p(7), ws.view().data, Bt, Tt, Ht, dh, s);
        });
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
    f.elementwise_forward_ms = fwd_bytes / (f.copy_gb_s * 1e6);
    if (backward) f.elementwise_backward_ms = bwd_bytes / (f.copy_gb_s * 1e6);
    // Read the gradient (4), read and write the master (8) and both moments, write the weights.
    const double per_elem = 12.0 + 4.0 * moment_bytes + e;
    f.optimizer_bytes =
        static_cast<double>(optimizer_elems) * per_elem + (norm_beside_backward ? 0 : norm_bytes);
    f.optimizer_ms = f.optimizer_bytes / (f.copy_gb_s * 1e6);
  }
  for (size_t i = 0; i < missing.size(); ++i) f.note += (i ? "; " : "") + missing[i];
  if (!flash)
    f.note += std::string(f.note.empty() ? "" : "; ") +
              "attention runs as GEMMs (simple path): counted with the GEMMs";
  f.measured = true;
  return f;
}

#endif

}  // namespace trainer
