// GPU tests of optim/: the CUDA AdamW step, sum_squares and the bf16 / fp16 casts against the CPU
// implementation (the reference) on 1e6+3 random elements, with fp32 gradients and with gradients
// given as the sum of bf16 terms. Skipped (exit 77) without a GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/device_buffer.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/cuda/adamw.cuh"
#include "optim/schedule.h"
#include "tests/catch.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

using namespace trainer;

namespace {

constexpr int64_t kN = 1000003;  // not a multiple of 4: the vector kernels' tail is exercised

std::vector<float> random_floats(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

BufferView host_view(std::vector<float>& v) {
  return BufferView{v.data(), static_cast<int64_t>(v.size()), DType::kF32, DeviceKind::kCpu};
}

template <typename T>
std::vector<T> download(BufferView v) {
  std::vector<T> h(static_cast<size_t>(v.count));
  BufferView hv{h.data(), v.count, v.dtype, DeviceKind::kCpu};
  copy(hv, v);
  return h;
}

DeviceBuffer upload(const std::vector<float>& h) {
  DeviceBuffer d(DeviceKind::kCuda, DType::kF32, static_cast<int64_t>(h.size()));
  copy(d.view(),
       BufferView{const_cast<float*>(h.data()), d.count(), DType::kF32, DeviceKind::kCpu});
  return d;
}

// Number of elements where |a - b| > rel * |b| (plus a floor far below any value compared here).
int64_t count_rel_mismatch(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= rel * std::fabs(static_cast<double>(b[i])) + 1e-30)) ++bad;
  }
  return bad;
}

// Elements whose bf16 (or fp16) bit patterns differ by more than one ulp (same sign, adjacent
// codes).
int64_t count_16bit_mismatch(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int d = static_cast<int>(a[i]) - static_cast<int>(b[i]);
    if ((a[i] & 0x8000) != (b[i] & 0x8000) || d > 1 || d < -1) ++bad;
  }
  return bad;
}

// Runs 3 AdamW steps (varying lr, a clip scale) on the GPU and on the CPU from the same random
// start, writing params of `out_dtype`. `offset` shifts the gradient and output views by that many
// elements inside larger buffers, so offset 1 takes the scalar (unaligned) kernel path.
void compare_adamw(DType out_dtype, int64_t offset, DType moments = DType::kF32) {
  AdamWConfig cfg;  // SPEC defaults
  cfg.moments = moments;
  const std::vector<float> p0 = random_floats(kN, 0.02f, 1);
  AdamW cpu(DeviceKind::kCpu, kN, cfg), gpu(DeviceKind::kCuda, kN, cfg);
  copy(cpu.master(), BufferView{const_cast<float*>(p0.data()), kN, DType::kF32, DeviceKind::kCpu});
  copy(gpu.master(), cpu.master());

  DeviceBuffer cpu_out(DeviceKind::kCpu, out_dtype, kN + offset);
  DeviceBuffer gpu_out(DeviceKind::kCuda, out_dtype, kN + offset);
  DeviceBuffer gpu_grads(DeviceKind::kCuda, DType::kF32, kN + offset);
  const double lrs[3] = {3e-4, 1e-3, 5e-4};
  const float scales[3] = {1.0f, 0.25f, 0.8f};
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g = random_floats(kN, 1e-2f, 100 + t);
    g[7] = 0.0f;   // no gradient: pure decay
    g[8] = 1e-9f;  // eps dominates the denominator
    copy(gpu_grads.slice(offset, kN), host_view(g));
    cpu.step(host_view(g), cpu_out.slice(offset, kN), lrs[t - 1], t, scales[t - 1]);
    gpu.step(gpu_grads.slice(offset, kN), gpu_out.slice(offset, kN), lrs[t - 1], t, scales[t - 1]);
  }
  const std::vector<float> cm = download<float>(cpu.master()), gm = download<float>(gpu.master());
  CHECK(count_rel_mismatch(gm, cm, 1e-6) == 0);
  if (moments == DType::kBF16) {  // rounded from the same fp32 values: equal or 1 ulp apart
    CHECK(count_16bit_mismatch(download<uint16_t>(gpu.exp_avg()),
                               download<uint16_t>(cpu.exp_avg())) == 0);
    CHECK(count_16bit_mismatch(download<uint16_t>(gpu.exp_avg_sq()),
                               download<uint16_t>(cpu.exp_avg_sq())) == 0);
  } else {
    CHECK(count_rel_mismatch(download<float>(gpu.exp_avg()), download<float>(cpu.exp_avg()),
                             1e-6) == 0);
    CHECK(count_rel_mismatch(download<float>(gpu.exp_avg_sq()), download<float>(cpu.exp_avg_sq()),
                             1e-6) == 0);
  }
  // The run really moved the parameters (the comparison is not of two untouched copies).
  int64_t moved = 0;
  for (int64_t i = 0; i < kN; ++i) moved += cm[i] != p0[i];
  CHECK(moved > kN / 2);

  if (out_dtype == DType::kF32) {
    CHECK(count_rel_mismatch(download<float>(gpu_out.slice(offset, kN)), cm, 1e-6) == 0);
  } else {
    // GPU 16-bit params vs the CPU's own rounding of its master (exact or within 1 ulp).
    std::vector<uint16_t> cpu_round(kN);
    cast_f32_to_params(cpu.master(), BufferView{cpu_round.data(), kN, out_dtype, DeviceKind::kCpu});
    const std::vector<uint16_t> g16 = download<uint16_t>(gpu_out.slice(offset, kN));
    CHECK(count_16bit_mismatch(g16, cpu_round) == 0);
    CHECK(download<uint16_t>(cpu_out.slice(offset, kN)) == cpu_round);
  }
}

// k bf16 gradient terms of n elements (random, rounded), on the host.
std::vector<std::vector<uint16_t>> bf16_terms(int k, int64_t n, uint32_t seed) {
  std::vector<std::vector<uint16_t>> terms;
  for (int j = 0; j < k; ++j) {
    std::vector<float> f = random_floats(n, 1e-2f, seed + j);
    std::vector<uint16_t> t(static_cast<size_t>(n));
    cast_f32_to_params(host_view(f), BufferView{t.data(), n, DType::kBF16, DeviceKind::kCpu});
    terms.push_back(std::move(t));
  }
  return terms;
}

// The gradient as the sum of k bf16 terms (--grad-transport ce --grad-reduce bf16): 2 AdamW
// steps and the sum of squares on the GPU against the CPU, with the views `offset` elements into
// their buffers (offset 1: the scalar kernels).
void compare_terms(int k, int64_t offset) {
  const AdamWConfig cfg;
  const std::vector<float> p0 = random_floats(kN, 0.02f, 3);
  AdamW cpu(DeviceKind::kCpu, kN, cfg), gpu(DeviceKind::kCuda, kN, cfg);
  copy(cpu.master(), BufferView{const_cast<float*>(p0.data()), kN, DType::kF32, DeviceKind::kCpu});
  copy(gpu.master(), cpu.master());
  DeviceBuffer cpu_out(DeviceKind::kCpu, DType::kBF16, kN);
  DeviceBuffer gpu_out(DeviceKind::kCuda, DType::kBF16, kN);
  std::vector<DeviceBuffer> device_terms;
  for (int t = 1; t <= 2; ++t) {
    std::vector<std::vector<uint16_t>> host = bf16_terms(k, kN, 50 * t);
    GradTerms on_cpu, on_gpu;
    device_terms.clear();
    for (auto& h : host) {
      on_cpu.push_back(BufferView{h.data(), kN, DType::kBF16, DeviceKind::kCpu});
      device_terms.emplace_back(DeviceKind::kCuda, DType::kBF16, kN + offset);
      copy(device_terms.back().slice(offset, kN), on_cpu.back());
      on_gpu.push_back(device_terms.back().slice(offset, kN));
    }
    const double sq_cpu = sum_squares(on_cpu), sq_gpu = sum_squares(on_gpu);
    CHECK_THAT(sq_gpu, WithinRel(sq_cpu, 1e-6));
    CHECK(sq_cpu > 0);
    cpu.step_part({0, kN}, on_cpu, cpu_out.view(), 1e-3, t, 0.5f);
    gpu.step_part({0, kN}, on_gpu, gpu_out.view(), 1e-3, t, 0.5f);
  }
  const std::vector<float> cm = download<float>(cpu.master());
  CHECK(count_rel_mismatch(download<float>(gpu.master()), cm, 1e-6) == 0);
  CHECK(count_rel_mismatch(download<float>(gpu.exp_avg_sq()), download<float>(cpu.exp_avg_sq()),
                           1e-6) == 0);
  int64_t moved = 0;
  for (int64_t i = 0; i < kN; ++i) moved += cm[i] != p0[i];
  CHECK(moved > kN / 2);
}

}  // namespace

TEST_CASE("GPU AdamW and sum_squares over bf16 gradient terms match the CPU") {
  for (int k : {1, 2, 3})
    for (int64_t offset : {0, 1}) {
      INFO(k << " terms, offset " << offset);
      compare_terms(k, offset);
    }
}

TEST_CASE("GPU AdamW matches the CPU reference, fp32 params, aligned and unaligned") {
  compare_adamw(DType::kF32, 0);
  compare_adamw(DType::kF32, 1);
}

TEST_CASE("GPU AdamW matches the CPU reference, bf16 params, aligned and unaligned") {
  compare_adamw(DType::kBF16, 0);
  compare_adamw(DType::kBF16, 1);
}

TEST_CASE("GPU AdamW matches the CPU reference, fp16 params, aligned and unaligned") {
  compare_adamw(DType::kF16, 0);
  compare_adamw(DType::kF16, 1);
}

TEST_CASE("GPU AdamW with bf16 moments matches the CPU reference, aligned and unaligned") {
  compare_adamw(DType::kBF16, 0, DType::kBF16);
  compare_adamw(DType::kBF16, 1, DType::kBF16);
  compare_adamw(DType::kF32, 0, DType::kBF16);
}

TEST_CASE("GPU sum_squares matches the CPU and is deterministic") {
  std::vector<float> h = random_floats(kN, 0.5f, 7);
  DeviceBuffer d = upload(h);
  const double want = sum_squares(host_view(h));
  const double got = sum_squares(d.view());
  CHECK_THAT(got, WithinRel(want, 1e-6));
  CHECK(sum_squares(d.view()) == got);  // bit-identical on a second run
  // Unaligned view (scalar kernel) and a short one (a single partial block).
  CHECK_THAT(sum_squares(d.slice(1, kN - 1)),
             WithinRel(sum_squares(host_view(h).slice(1, kN - 1)), 1e-6));
  CHECK_THAT(sum_squares(d.slice(3, 5)), WithinRel(sum_squares(host_view(h).slice(3, 5)), 1e-6));
  CHECK(sum_squares(d.slice(0, 0)) == 0.0);
#ifdef TRAINER_WITH_CUDA
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(sum_squares(d.view(), stream) == got);
  CUDA_CHECK(cudaStreamDestroy(stream));
#endif
}

#ifdef TRAINER_WITH_CUDA
// The norm's pass beside backward: tensors reported in order launch their partial sums in chunks
// (here 21 M elements in 40 tensors of uneven sizes, an odd total: several launches, unaligned
// starts); the total equals sum_squares over the buffer to fp32-accumulation accuracy and is the
// same on every run; reports out of order, a total before every tensor, and reports outside a
// begin() are refused or ignored.
TEST_CASE("the overlapped sum of squares equals sum_squares and is deterministic") {
  std::vector<int64_t> ends;
  int64_t n = 0;
  for (int t = 0; t < 40; ++t) {
    n += (t % 7 == 3) ? 3 : 300000 + 37 * t + (t % 5) * 1500000;
    ends.push_back(n);
  }
  const std::vector<float> h = random_floats(n, 0.01f, 17);
  const DeviceBuffer d = upload(h);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double want = sum_squares(d.view());
  cuda::OverlappedSumSquares norm(d.as<const float>(), n, ends, stream);
  double first = 0;
  for (int run = 0; run < 2; ++run) {
    CHECK(!norm.active());
    norm.on_ready(0);  // ignored: no begin()
    norm.begin();
    CHECK(norm.active());
    for (int t = 0; t < 40; ++t) norm.on_ready(t);
    const double got = norm.total();
    CHECK_THAT(got, WithinRel(want, 1e-6));
    if (run == 0) first = got;
    CHECK(got == first);
  }
  norm.begin();
  norm.on_ready(0);
  CHECK_THROWS_AS(norm.on_ready(2), RuntimeError);
  CHECK_THROWS_AS(norm.total(), RuntimeError);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// A step recorded as a CUDA graph (--cuda-graph) reads AdamW's scalars from device memory, and
// computes the clipping factor there from the overlapped norm's partials: the same bits as the
// host's clip_scale() and the by-value update. So does an update queued beside the next forward
// (Run::queue_update_on_device), whose clipping kernel writes the scalars passed by value too.
TEST_CASE("AdamW with its scalars and clipping factor on the device equals the host's") {
  const int64_t n = 3 * 300007;
  const std::vector<int64_t> ends = {300007, 2 * 300007, n};
  const std::vector<float> g = random_floats(n, 0.05f, 23), p0 = random_floats(n, 1.0f, 24);
  const DeviceBuffer grads = upload(g);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (double clip : {0.0, 0.5, 1e6}) {
    INFO("clip " << clip);
    AdamW host(DeviceKind::kCuda, n, AdamWConfig{}), device(DeviceKind::kCuda, n, AdamWConfig{});
    AdamW by_value(DeviceKind::kCuda, n, AdamWConfig{});
    DeviceBuffer out_host(DeviceKind::kCuda, DType::kBF16, n);
    DeviceBuffer out_device(DeviceKind::kCuda, DType::kBF16, n);
    DeviceBuffer out_by_value(DeviceKind::kCuda, DType::kBF16, n);
    const DeviceBuffer p = upload(p0);
    for (AdamW* o : {&host, &device, &by_value})
      CUDA_CHECK(cudaMemcpy(o->master().data, p.view().data, n * 4, cudaMemcpyDeviceToDevice));
    cuda::OverlappedSumSquares norm(grads.as<const float>(), n, ends, stream);
    cuda::DeviceStepArgs args, args_by_value;
    for (int64_t t = 1; t <= 3; ++t) {
      const double lr = 1e-3 * static_cast<double>(t);
      norm.begin();
      for (int i = 0; i < 3; ++i) norm.on_ready(i);
      norm.join();
      args.set(device.step_args(lr, t, 1.0f));
      args.upload(stream);
      norm.clip_into(args.device(), clip, 1.0);
      device.step_part_recorded({0, n}, GradTerms{grads.view()}, out_device.view(), args.device(),
                                stream);
      // NaN in every scalar unless the kernel writes them all.
      CUDA_CHECK(cudaMemsetAsync(args_by_value.device(), 0xff, sizeof(AdamWStepArgs), stream));
      const AdamWStepArgs base = by_value.step_args(lr, t, 1.0f);
      norm.clip_into(args_by_value.device(), clip, 1.0, &base);
      by_value.step_part_recorded({0, n}, GradTerms{grads.view()}, out_by_value.view(),
                                  args_by_value.device(), stream);
      const float factor = clip_scale(std::sqrt(norm.total()), clip);
      host.step_part({0, n}, GradTerms{grads.view()}, out_host.view(), lr, t, factor, stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (AdamW* o : {&device, &by_value}) {
      CHECK(download<float>(o->master()) == download<float>(host.master()));
      CHECK(download<float>(o->exp_avg()) == download<float>(host.exp_avg()));
      CHECK(download<float>(o->exp_avg_sq()) == download<float>(host.exp_avg_sq()));
    }
    CHECK(download<uint16_t>(out_device.view()) == download<uint16_t>(out_host.view()));
    CHECK(download<uint16_t>(out_by_value.view()) == download<uint16_t>(out_host.view()));
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}
#endif

TEST_CASE("GPU cast_f32_to_params: bf16 and fp16 rounding equal the CPU's, fp32 is a copy") {
  std::vector<float> h = random_floats(kN, 3.0f, 11);
  h[0] = 1.0f + std::ldexp(1.0f, -8);  // ties to even in bf16
  h[1] = 1.0f + 3 * std::ldexp(1.0f, -8);
  h[2] = std::numeric_limits<float>::max();
  h[3] = -std::numeric_limits<float>::infinity();
  h[4] = std::numeric_limits<float>::quiet_NaN();
  h[5] = 1.0f + std::ldexp(1.0f, -11);  // ties to even in fp16
  h[6] = 65520.0f;                      // fp16's overflow tie: inf
  h[7] = std::ldexp(1.0f, -25);         // fp16's subnormal tie: 0
  h[8] = -3 * std::ldexp(1.0f, -26);    // the smallest fp16 subnormal, negative
  for (int64_t i = 9; i < 200; ++i) h[i] = std::ldexp(h[i], -20);  // fp16 subnormals
  DeviceBuffer d = upload(h);
  for (DType t : {DType::kBF16, DType::kF16})
    for (int64_t offset : {0, 1}) {
      INFO(dtype_name(t) << " offset " << offset);
      const int64_t n = kN - offset;
      std::vector<uint16_t> want(n);
      cast_f32_to_params(host_view(h).slice(offset, n),
                         BufferView{want.data(), n, t, DeviceKind::kCpu});
      DeviceBuffer d16(DeviceKind::kCuda, t, n);
      cast_f32_to_params(d.slice(offset, n), d16.view());
      CHECK(download<uint16_t>(d16.view()) == want);
    }
  for (int64_t offset : {0, 1}) {
    const int64_t n = kN - offset;
    DeviceBuffer d32(DeviceKind::kCuda, DType::kF32, n);
    cast_f32_to_params(d.slice(offset, n), d32.view());
    const std::vector<float> back = download<float>(d32.view());
    CHECK(std::memcmp(back.data(), h.data() + offset, n * sizeof(float)) == 0);
  }
}
