// GPU tests of the CUDA replica against the CPU reference replica on the tiny preset (vocab 37 and
// 10000): loss and every parameter's gradient (two micro-batches accumulated after zero_grads,
// with another batch's gradients left in the buffer before it) in fp32 (1e-5 relative per tensor),
// bf16 (loss 2e-2, gradients 5e-2) and fp16 (loss 5e-3, gradients 2e-2, backward on the loss
// scaled by 1024 as loss scaling does), the order of the gradient-ready callbacks, evaluate(), user
// errors, activation recompute (bit-identical gradients, fewer activation bytes), and 20 AdamW
// training steps whose losses match the CPU's: to 1e-4 in fp32, to 1e-2 in fp16. Skipped (exit 77)
// without a GPU.
#ifdef TRAINER_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "model/config.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/replica.h"
#include "optim/adamw.h"
#include "runtime/floors.h"
#include "runtime/gpu_power.h"
#include "tests/catch.h"
#include "tests/forward_announcements.h"

using namespace trainer;

namespace {

ModelConfig tiny(int64_t vocab, int64_t ctx) {
  ModelConfig c = preset("tiny");
  c.vocab = vocab;
  c.ctx = ctx;
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  int64_t batch = 0, seq = 0;
  MicroBatch mb() const { return {inputs.data(), targets.data(), batch, seq}; }
  int64_t tokens() const { return batch * seq; }
};

Batch make_batch(int64_t batch, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  Batch b;
  b.batch = batch;
  b.seq = seq;
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(dist(rng));
    b.targets.push_back(dist(rng));
  }
  return b;
}

std::vector<float> fresh_params(const ModelConfig& c, uint64_t seed) {
  const ParamLayout L(c);
  std::vector<float> flat(static_cast<size_t>(L.total()), 0.0f);
  init_params(L, seed, flat.data());
  return flat;
}

ReplicaOptions options(const ModelConfig& c, int64_t max_batch, Precision p,
                       const std::string& attention = "simple", DType grads = DType::kF32) {
  ReplicaOptions o;
  o.grad_dtype = grads;
  o.max_batch = max_batch;
  o.flat_elems = ParamLayout(c).total();
  o.precision = p;
  o.attention = attention;
  return o;
}

BufferView host_view(std::vector<float>& v) {
  return BufferView{v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

// The gradients as fp32 on the host (bf16 ones widened exactly).
std::vector<float> host_grads(Replica& r) {
  r.synchronize();
  std::vector<float> h(static_cast<size_t>(r.grads().count));
  if (r.grads().dtype == DType::kBF16) {
    std::vector<uint16_t> bits(h.size());
    copy(BufferView{bits.data(), r.grads().count, DType::kBF16, DeviceKind::kCpu}, r.grads());
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&h[i], &u, sizeof(float));
    }
    return h;
  }
  copy(host_view(h), r.grads());
  return h;
}

double rel_err(const float* out, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Runs the same micro-batches through both replicas (gradients accumulated over all of them with
// scale loss_scale/tokens, then divided by loss_scale) and compares the loss and every tensor's
// gradient. A power-of-two loss_scale changes nothing in fp32; in fp16 it keeps the activation
// gradients out of the subnormal range, as --loss-scale does in training.
void compare_with_cpu(const ModelConfig& c, Precision precision, const std::string& attention,
                      double loss_tol, double grad_tol, DType grads = DType::kF32,
                      float loss_scale = 1.0f) {
  const std::vector<Batch> batches = {make_batch(2, 17, c.vocab, 1),
                                      make_batch(1, c.ctx, c.vocab, 2)};
  int64_t tokens = 0;
  for (const Batch& b : batches) tokens += b.tokens();
  const std::vector<float> params = fresh_params(c, 42);

  std::unique_ptr<Replica> cpu = make_cpu_replica(c, options(c, 2, Precision::kFp32));
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 2, precision, attention, grads));
  REQUIRE(gpu->device() == DeviceKind::kCuda);
  REQUIRE(gpu->params().count == ParamLayout(c).total());
  REQUIRE(gpu->params().dtype == (precision == Precision::kBf16   ? DType::kBF16
                                  : precision == Precision::kFp16 ? DType::kF16
                                                                  : DType::kF32));
  REQUIRE(gpu->grads().dtype == grads);
  const int n_tensors = static_cast<int>(cpu->layout().tensors().size());
  const Batch stale = make_batch(2, c.ctx, c.vocab, 3);
  for (Replica* r : {cpu.get(), gpu.get()}) {
    r->set_params(params.data());
    // Gradients of another batch are in the buffer: zero_grads must make them not count.
    r->forward(stale.mb());
    r->backward(1.0f, {});
    r->take_loss();
    r->zero_grads();
    for (const Batch& b : batches) {
      r->forward(b.mb());
      std::vector<int> order;
      r->backward(loss_scale / static_cast<float>(tokens), [&](int i) { order.push_back(i); });
      std::vector<int> expected(n_tensors);
      std::iota(expected.begin(), expected.end(), 0);
      CHECK(order == expected);
    }
  }
  const float loss_cpu = cpu->take_loss(), loss_gpu = gpu->take_loss();
  INFO("vocab " << c.vocab << " loss cpu " << loss_cpu << " gpu " << loss_gpu);
  CHECK_THAT(static_cast<double>(loss_gpu), WithinRel(static_cast<double>(loss_cpu), loss_tol));

  std::vector<float> g_cpu = host_grads(*cpu), g_gpu = host_grads(*gpu);
  for (std::vector<float>* g : {&g_cpu, &g_gpu})
    for (float& x : *g) x /= loss_scale;
  for (const ParamTensor& t : cpu->layout().tensors()) {
    const double err = rel_err(g_gpu.data() + t.offset, g_cpu.data() + t.offset, t.numel);
    INFO("gradient of " << t.name << " rel err " << err);
    CHECK(err < grad_tol);
  }
}

}  // namespace

TEST_CASE("CUDA replica fp32: loss and gradients match the CPU replica", "[cuda][model]") {
  for (int64_t vocab : {int64_t{37}, int64_t{10000}})
    compare_with_cpu(tiny(vocab, 32), Precision::kFp32, "simple", 1e-5, 1e-5);
}

TEST_CASE("CUDA replica tf32: loss and gradients close to the CPU replica", "[cuda][model]") {
  compare_with_cpu(tiny(10000, 32), Precision::kTf32, "simple", 2e-3, 2e-2);
}

TEST_CASE("CUDA replica bf16: loss and gradients close to the CPU replica", "[cuda][model]") {
  // "flash" falls back to the simple path for head dims the flash kernels lack.
  for (const char* attention : {"simple", "flash"})
    for (int64_t vocab : {int64_t{37}, int64_t{10000}}) {
      INFO("attention " << attention);
      compare_with_cpu(tiny(vocab, 32), Precision::kBf16, attention, 2e-2, 5e-2);
    }
}

// fp16 keeps fp32 gradients, and its activation gradients need the loss scaled up: the tiny
// model's per-token gradients at scale 1/tokens sit in fp16's subnormal range. 1024 keeps every
// value far below fp16's 65504. The flash kernels are bf16 only, so "flash" runs the simple path
// and says why.
TEST_CASE("CUDA replica fp16: loss and gradients close to the CPU replica", "[cuda][model]") {
  for (const char* attention : {"simple", "flash"})
    for (int64_t vocab : {int64_t{37}, int64_t{10000}}) {
      INFO("attention " << attention);
      compare_with_cpu(tiny(vocab, 32), Precision::kFp16, attention, 5e-3, 2e-2, DType::kF32,
                       1024.0f);
    }
  const ModelConfig c = tiny(37, 32);
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 2, Precision::kFp16, "flash"));
  CHECK(gpu->grads().dtype == DType::kF32);
  CHECK(gpu->attention_kernel().find(
            "the flash kernels are bf16 only: fp16 uses the simple path") != std::string::npos);
  // Whole bf16 gradients (--grad-transport ce --grad-reduce bf16) are for bf16 runs only.
  CHECK_THROWS_AS(make_cuda_replica(c, options(c, 2, Precision::kFp16, "simple", DType::kBF16)),
                  UsageError);
}

// --grad-transport ce --grad-reduce bf16: backward writes bf16 gradients (the GEMMs' output, the
// RMSNorm gains rounded once, the embedding summed in fp32 and rounded), accumulating over the
// micro-batches in bf16. Against the CPU with the bf16 tolerances, and against the same replica
// with fp32 gradients, from which it may differ only by bf16 rounding.
TEST_CASE("CUDA replica bf16 with bf16 gradients", "[cuda][model]") {
  for (int64_t vocab : {int64_t{37}, int64_t{10000}})
    compare_with_cpu(tiny(vocab, 32), Precision::kBf16, "flash", 2e-2, 5e-2, DType::kBF16);
  ModelConfig odd = tiny(37, 20);
  odd.d_model = 84;
  odd.n_heads = 2;
  odd.d_ff = 100;
  compare_with_cpu(odd, Precision::kBf16, "simple", 2e-2, 5e-2, DType::kBF16);

  const ModelConfig c = tiny(10000, 32);
  const std::vector<float> params = fresh_params(c, 9);
  std::unique_ptr<Replica> f32 = make_cuda_replica(c, options(c, 2, Precision::kBf16, "flash"));
  std::unique_ptr<Replica> b16 =
      make_cuda_replica(c, options(c, 2, Precision::kBf16, "flash", DType::kBF16));
  const Batch b1 = make_batch(2, 32, c.vocab, 21), b2 = make_batch(2, 32, c.vocab, 22);
  for (Replica* r : {f32.get(), b16.get()}) {
    r->set_params(params.data());
    r->zero_grads();
    for (const Batch* b : {&b1, &b2}) {
      r->forward(b->mb());
      r->backward(1.0f / 128, {});
    }
  }
  CHECK(f32->take_loss() == b16->take_loss());  // forward does not see the gradient type
  const std::vector<float> g32 = host_grads(*f32), g16 = host_grads(*b16);
  for (const ParamTensor& t : f32->layout().tensors()) {
    const double err = rel_err(g16.data() + t.offset, g32.data() + t.offset, t.numel);
    INFO("gradient of " << t.name << " rel err " << err);
    CHECK(err < 1e-2);
    // Rounded to bf16 indeed; an embedding row sums one or two tokens' bf16 gradients, which
    // bf16 may hold exactly.
    if (t.name != "token_embeddings.weight") CHECK(err > 0);
  }

  // fp32 parameters cannot have bf16 gradients.
  CHECK_THROWS_AS(make_cuda_replica(c, options(c, 2, Precision::kFp32, "simple", DType::kBF16)),
                  UsageError);
}

// Activation recompute reruns forward's kernels on forward's inputs: the loss, every gradient and
// the ready() order are bit-identical to keeping everything, in every precision and attention
// path, over accumulated micro-batches and a forward after an evaluate; and the activations
// shrink (ffn less, block most).
TEST_CASE("CUDA replica: recompute ffn and block give the very gradients of none",
          "[cuda][model][recompute]") {
  const ModelConfig c = tiny(10000, 32);
  const std::vector<float> params = fresh_params(c, 21);
  const std::vector<Batch> batches = {make_batch(2, 32, c.vocab, 5), make_batch(1, 17, c.vocab, 6)};
  struct Case {
    Precision precision;
    const char* attention;
  };
  for (const Case& k : {Case{Precision::kFp32, "simple"}, Case{Precision::kBf16, "flash"},
                        Case{Precision::kBf16, "simple"}, Case{Precision::kFp16, "simple"}}) {
    std::vector<float> want_grads;
    float want_loss = 0;
    int64_t last_bytes = 0;
    for (Recompute rc : {Recompute::kNone, Recompute::kFfn, Recompute::kBlock}) {
      INFO("precision " << precision_name(k.precision) << " attention " << k.attention
                        << " recompute " << recompute_name(rc));
      ReplicaOptions o = options(c, 2, k.precision, k.attention);
      o.recompute = rc;
      std::unique_ptr<Replica> r = make_cuda_replica(c, o);
      std::vector<float> p = params;
      r->set_params(p.data());
      r->zero_grads();
      r->evaluate(batches[1].mb());  // leaves the shared buffers holding another batch's values
      for (const Batch& b : batches) {
        r->forward(b.mb());
        std::vector<int> order;
        r->backward(256.0f / 81.0f, [&](int i) { order.push_back(i); });
        std::vector<int> expected(r->layout().tensors().size());
        std::iota(expected.begin(), expected.end(), 0);
        CHECK(order == expected);
      }
      const float loss = r->take_loss();
      const std::vector<float> g = host_grads(*r);
      if (rc == Recompute::kNone) {
        want_grads = g;
        want_loss = loss;
      } else {
        CHECK(loss == want_loss);
        CHECK(g == want_grads);
        CHECK(r->activation_bytes() < last_bytes);
      }
      last_bytes = r->activation_bytes();
    }
  }
}

// --benchmark's floors: one step's products are recorded (per block the fused v/k/q, the output
// projection, the fused w3/w1 and w2, then lm_head; backward a weight and a data product for each;
// the simple attention adds 2 batched products forward and 4 backward per block) and timed alone;
// the copy bandwidth and, with flash, the attention throughput are measured; the optimizer's bytes
// are 32 + the working type's size per element (28 + it with the norm's pass beside backward).
TEST_CASE("benchmark floors record the step's products and measure their parts", "[cuda][floors]") {
  const ModelConfig c = tiny(10000, 64);
  const int64_t L = c.n_layers, flat = ParamLayout(c).total();
  const std::vector<float> params = fresh_params(c, 5);
  const Batch b = make_batch(2, 64, c.vocab, 9);
  for (Precision p : {Precision::kBf16, Precision::kFp32}) {
    const bool flash = p == Precision::kBf16;
    INFO("precision " << precision_name(p));
    std::unique_ptr<Replica> r = make_cuda_replica(c, options(c, 2, p, "flash"));
    r->set_params(params.data());
    const PhaseFloors f =
        measure_floors(*r, c, b.mb(), flat, /*moment_bytes=*/4, /*backward=*/true);
    INFO(f.note);
    REQUIRE(f.measured);
    CHECK(f.gemm_forward_calls == 4 * L + 1 + (flash ? 0 : 2 * L));
    CHECK(f.gemm_backward_calls == 8 * L + 2 + (flash ? 0 : 4 * L));
    CHECK(f.gemm_forward_ms > 0);
    CHECK(f.gemm_backward_ms > f.gemm_forward_ms);
    CHECK(f.copy_gb_s > 100);
    CHECK((f.attention_forward_tflops > 0) == flash);
    CHECK((f.attention_backward_tflops > 0) == flash);
    CHECK((f.attention_forward_ms > 0) == flash);
    CHECK(f.elementwise_forward_ms > 0);
    CHECK(f.optimizer_bytes == static_cast<double>(flat) * (flash ? 34 : 36));
    CHECK(f.optimizer_ms > 0);
    // With the norm's pass beside backward, its 4 bytes per element move to backward's floor.
    const PhaseFloors beside = measure_floors(*r, c, b.mb(), flat, 4, true, true);
    CHECK(beside.optimizer_bytes == static_cast<double>(flat) * (flash ? 30 : 32));
    // bf16 moments (--adam-state bf16): 2 bytes read and 2 written less for each of m and v.
    const PhaseFloors bf16_moments = measure_floors(*r, c, b.mb(), flat, 2, true, true);
    CHECK(bf16_moments.optimizer_bytes == static_cast<double>(flat) * (flash ? 22 : 24));
    CHECK(beside.elementwise_backward_ms > f.elementwise_backward_ms);
    // A forward-only benchmark records no backward.
    const PhaseFloors fwd_only = measure_floors(*r, c, b.mb(), flat, 4, /*backward=*/false);
    CHECK(fwd_only.gemm_backward_calls == 0);
    CHECK(fwd_only.gemm_forward_calls == f.gemm_forward_calls);
  }
}

// --floors-at-cap: each part alone at the power limit, priced in joules (NVML's power reading);
// some 20 s on a GPU. Without a power reader nothing is measured there.
TEST_CASE("benchmark floors at the power cap price every part in joules", "[cuda][floors]") {
  std::string why;
  auto power = make_power_sampler(cuda_device_pci_bus_id(0), 20, &why);
  if (!power) {
    SUCCEED("NVML unavailable here: " + why);
    return;
  }
  const ModelConfig c = tiny(10000, 64);
  const int64_t flat = ParamLayout(c).total();
  const std::vector<float> params = fresh_params(c, 5);
  const Batch b = make_batch(2, 64, c.vocab, 9);
  std::unique_ptr<Replica> r = make_cuda_replica(c, options(c, 2, Precision::kBf16, "flash"));
  r->set_params(params.data());
  const PhaseFloors plain = measure_floors(*r, c, b.mb(), flat, 4, true, true);
  CHECK_FALSE(plain.at_cap);
  CHECK(plain.gemm_forward_j == 0);
  const PhaseFloors f = measure_floors(*r, c, b.mb(), flat, 4, true, true, power.get());
  INFO(f.note);
  REQUIRE(f.at_cap);
  CHECK(f.limit_watts > 0);
  CHECK(f.cap_window_s >= 1.0);  // longer than NVML's one-second average
  CHECK(f.gemm_forward_j > 0);
  CHECK(f.gemm_backward_j > 0);
  CHECK(f.attention_forward_j > 0);
  CHECK(f.attention_backward_j > 0);
  // A copy moves a GB for some tenths of a joule on an H100 or H200 (HBM3 at 3-5 TB/s, a few
  // hundred W): between a hundredth and ten.
  CHECK(f.copy_j_per_gb > 0.01);
  CHECK(f.copy_j_per_gb < 10);
  CHECK(f.copy_sm_mhz > 100);  // sampled while the copy ran: some hundreds of MHz at least
  CHECK(f.copy_sm_mhz < 5000);
  CHECK(f.elementwise_forward_j() == f.elementwise_forward_bytes * 1e-9 * f.copy_j_per_gb);
  CHECK(f.optimizer_j() == f.optimizer_bytes * 1e-9 * f.copy_j_per_gb);
  const double parts = f.gemm_forward_j + f.attention_forward_j + f.elementwise_forward_j() +
                       f.gemm_backward_j + f.attention_backward_j + f.elementwise_backward_j() +
                       f.optimizer_j();
  CHECK(std::abs(f.step_j(true, true) - parts) <= 1e-12 * parts);
  CHECK(f.step_j(false, false) < f.step_j(true, false));
  // The plain floors are those of the run without the cap.
  CHECK(f.gemm_forward_calls == plain.gemm_forward_calls);
  CHECK(f.optimizer_bytes == plain.optimizer_bytes);
}

TEST_CASE("CUDA replica: head dim 80 and an odd vocabulary", "[cuda][model]") {
  ModelConfig c = tiny(37, 24);
  c.d_model = 160;
  c.n_heads = 2;  // head dim 80
  c.d_ff = 200;
  compare_with_cpu(c, Precision::kFp32, "simple", 1e-5, 1e-5);
  compare_with_cpu(c, Precision::kBf16, "flash", 2e-2, 5e-2);
  compare_with_cpu(c, Precision::kFp16, "flash", 5e-3, 2e-2, DType::kF32, 1024.0f);
}

TEST_CASE("CUDA replica: widths that defeat the fused and vector paths", "[cuda][model]") {
  // d = 84 and d_ff = 100: q/k/v and w3/w1 are not adjacent in the flat buffer (d*d and d*d_ff
  // are not multiples of the 64-element alignment), so they take separate matmuls; head dim 42
  // and rows of 84 elements take the scalar and pair paths of the kernels.
  ModelConfig c = tiny(37, 20);
  c.d_model = 84;
  c.n_heads = 2;
  c.d_ff = 100;
  compare_with_cpu(c, Precision::kFp32, "simple", 1e-5, 1e-5);
  compare_with_cpu(c, Precision::kBf16, "simple", 2e-2, 5e-2);
  compare_with_cpu(c, Precision::kFp16, "simple", 5e-3, 2e-2, DType::kF32, 1024.0f);
}

TEST_CASE("CUDA replica: forward announces each part of the parameters before reading it",
          "[cuda][model]") {
  // As under ZeRO-1, whose all-gathers may still be running, parameters arrive only when forward
  // asks for them; until then they are NaN, so a kernel that reads them earlier changes the loss.
  ModelConfig c = tiny(10000, 64);
  c.d_model = 128;
  c.n_heads = 2;  // head dim 64: the flash kernels, as in training
  c.d_ff = 384;
  const ParamLayout L(c);
  const int64_t n = L.total();
  const std::vector<float> params = fresh_params(c, 11);
  const std::vector<float> nan(static_cast<size_t>(n), std::nanf(""));
  const Batch b = make_batch(2, 64, c.vocab, 5);
  std::unique_ptr<Replica> src = make_cuda_replica(c, options(c, 2, Precision::kBf16, "flash"));
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 2, Precision::kBf16, "flash"));
  src->set_params(params.data());
  src->forward(b.mb());
  const float expected = src->take_loss();
  REQUIRE(std::isfinite(expected));

  gpu->set_params(nan.data());
  std::vector<int64_t> offsets;
  gpu->forward(b.mb(), [&](int64_t offset) {
    offsets.push_back(offset);
    gpu->synchronize();  // what forward queued so far has run, on whatever was there
    copy(gpu->params().slice(offset, n - offset), src->params().slice(offset, n - offset));
  });
  CHECK(gpu->take_loss() == expected);
  check_forward_announcements(L, c.n_layers, offsets);
}

TEST_CASE("CUDA replica: evaluate keeps the training loss separate", "[cuda][model]") {
  const ModelConfig c = tiny(10000, 32);
  const std::vector<float> params = fresh_params(c, 7);
  std::unique_ptr<Replica> cpu = make_cpu_replica(c, options(c, 2, Precision::kFp32));
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 2, Precision::kFp32));
  const Batch train = make_batch(2, 32, c.vocab, 3), val = make_batch(1, 20, c.vocab, 4);
  float eval[2], loss[2];
  int i = 0;
  for (Replica* r : {cpu.get(), gpu.get()}) {
    r->set_params(params.data());
    r->forward(train.mb());
    eval[i] = r->evaluate(val.mb());
    loss[i] = r->take_loss();
    ++i;
  }
  CHECK_THAT(eval[1], WithinRel(eval[0], 1e-5f));
  CHECK_THAT(loss[1], WithinRel(loss[0], 1e-5f));
  CHECK(eval[1] != loss[1]);
  // evaluate() used the activation buffers: there is nothing left to backpropagate.
  CHECK_THROWS_AS(gpu->backward(1.0f, {}), RuntimeError);
}

TEST_CASE("CUDA replica: user errors are UsageErrors naming the problem", "[cuda][model]") {
  const ModelConfig c = tiny(37, 16);
  CHECK_THROWS_AS(make_cuda_replica(c, options(c, 1, Precision::kFp32, "fast")), UsageError);
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 1, Precision::kFp32));
  const Batch too_many = make_batch(2, 16, c.vocab, 5);
  CHECK_THROWS_AS(gpu->forward(too_many.mb()), UsageError);
  const Batch too_long = make_batch(1, 17, c.vocab, 5);
  CHECK_THROWS_AS(gpu->forward(too_long.mb()), UsageError);
  Batch bad = make_batch(1, 16, c.vocab, 6);
  bad.inputs[5] = 37;
  CHECK_THROWS_AS(gpu->forward(bad.mb()), UsageError);

  // A model far beyond any GPU's memory is refused before it allocates, with the sizes.
  ModelConfig xl = preset("xl");
  xl.ctx = 2048;
  try {
    make_cuda_replica(xl, options(xl, 256, Precision::kBf16, "simple"));
    FAIL("an impossible model was accepted");
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("model does not fit") != std::string::npos);
    CHECK(msg.find("activations") != std::string::npos);
    CHECK(msg.find("GiB free on GPU 0") != std::string::npos);
  }
}

TEST_CASE("CUDA replica: the fit check counts this rank's optimizer shard; OOM is a UsageError",
          "[cuda][model]") {
  ModelConfig c = preset("small");  // 124M parameters: 12 B each of AdamW state, 1.5 GB
  c.vocab = 50304;
  c.ctx = 128;
  const ReplicaOptions full = options(c, 2, Precision::kBf16);
  ReplicaOptions shard = full;
  shard.optimizer_elems = full.flat_elems / 4;  // a ZeRO-1 shard of 4 ranks
  int64_t activations = 0;
  {
    auto probe = make_cuda_replica(c, shard);
    activations = probe->activation_bytes();
  }
  // Leave free what the sharded run needs plus half of what the unsharded one needs on top.
  const int64_t flat = full.flat_elems;
  const int64_t sharded_need = flat * 2 + flat * 4 + activations + shard.optimizer_elems * 12;
  const int64_t margin = (flat - shard.optimizer_elems) * 12 / 2;  // 560 MB
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t block = static_cast<int64_t>(free_bytes) - sharded_need - margin;
  REQUIRE(block > 0);
  DeviceBuffer blocker(DeviceKind::kCuda, DType::kF32, block / 4);
  try {
    make_cuda_replica(c, full);
    FAIL("the unsharded run was accepted without the memory for its optimizer state");
  } catch (const UsageError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("model does not fit") != std::string::npos);
    CHECK(std::string(e.what()).find("--shard-optim") != std::string::npos);
  }
  CHECK_NOTHROW(make_cuda_replica(c, shard));

  // An allocation beyond the free memory is a UsageError naming the sizes, and the failure does
  // not stick: the next allocation succeeds.
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  try {
    DeviceBuffer too_big(DeviceKind::kCuda, DType::kF32,
                         (static_cast<int64_t>(free_bytes) >> 2) + (1 << 28));
    FAIL("an allocation beyond the free memory succeeded");
  } catch (const UsageError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("out of memory on GPU") != std::string::npos);
  }
  CHECK_NOTHROW(DeviceBuffer(DeviceKind::kCuda, DType::kF32, 1024));
}

namespace {

// 20 AdamW steps from the same start on both replicas; the GPU's backward runs on the loss times
// loss_scale, which its update divides out again (the optimizer's gradient multiplier, as
// --loss-scale does). The GPU's losses must stay within `tol` of the CPU's, and the model learns.
void train_against_cpu(Precision precision, float loss_scale, float tol) {
  const ModelConfig c = tiny(10000, 32);
  const int64_t flat = ParamLayout(c).total();
  std::vector<float> params = fresh_params(c, 11);
  std::unique_ptr<Replica> cpu = make_cpu_replica(c, options(c, 2, Precision::kFp32));
  std::unique_ptr<Replica> gpu = make_cuda_replica(c, options(c, 2, precision));
  AdamWConfig cfg;
  cfg.lr = 1e-3;
  AdamW opt_cpu(DeviceKind::kCpu, flat, cfg), opt_gpu(DeviceKind::kCuda, flat, cfg);
  copy(opt_cpu.master(), host_view(params));
  copy(opt_gpu.master(), host_view(params));
  cpu->set_params(params.data());
  gpu->set_params(params.data());
  // copy() runs on the legacy default stream, which the replica's non-blocking stream does not
  // wait for.
  CUDA_CHECK(cudaDeviceSynchronize());
  float first = 0, last = 0;
  for (int64_t step = 1; step <= 20; ++step) {
    const Batch b = make_batch(2, 32, c.vocab, static_cast<uint32_t>(100 + step % 4));
    float loss[2];
    int i = 0;
    for (auto [r, opt] : {std::pair{cpu.get(), &opt_cpu}, std::pair{gpu.get(), &opt_gpu}}) {
      const float scale = r == gpu.get() ? loss_scale : 1.0f;
      r->zero_grads();
      r->forward(b.mb());
      r->backward(scale / static_cast<float>(b.tokens()), {});
      opt->step(r->grads(), r->params(), cfg.lr, step, 1.0f / scale, r->stream());
      loss[i++] = r->take_loss();
    }
    INFO("step " << step << " loss cpu " << loss[0] << " gpu " << loss[1]);
    CHECK_THAT(loss[1], WithinRel(loss[0], tol));
    if (step == 1) first = loss[0];
    last = loss[0];
  }
  CHECK(last < first);  // the four batches repeat, so the model learns them
}

}  // namespace

TEST_CASE("CUDA replica fp32: 20 AdamW steps reproduce the CPU losses", "[cuda][model][train]") {
  train_against_cpu(Precision::kFp32, 1.0f, 1e-4f);
}

// The update writes the fp16 working parameters from the fp32 masters; the loss is scaled by 1024
// and unscaled by the update, as dynamic loss scaling does.
TEST_CASE("CUDA replica fp16: 20 AdamW steps follow the CPU losses", "[cuda][model][train]") {
  train_against_cpu(Precision::kFp16, 1024.0f, 1e-2f);
}

#endif  // TRAINER_WITH_CUDA
