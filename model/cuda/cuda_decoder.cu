// The CUDA decoder: the replica's forward kernels on the new rows only, with each block's keys
// (after RoPE) and values kept in a cache of ctx positions. Per fed chunk of n tokens at
// position p (n = 1 when decoding):
//
//   x    = embedding(ids)
//   per block:  ln1 = rmsnorm(x);  [v | k | q] = ln1 [Wv; Wk; Wq]^T
//               q, cache_k[p .. p+n), cache_v[p .. p+n) = rope(q, k) at positions p.., v
//               att = decode_attention(q, cache 0 .. p+n)
//               h = att Wo^T + x;  ln2 = rmsnorm(h);  [b | a] = ln2 [W3; W1]^T
//               x = (silu(a) * b) W2^T + h
//   logits = rmsnorm(x) Whead^T, in fp32, for the last row (or every row)
//
// The logits are copied to pinned host memory and the host waits for them: the sampler needs
// them before the next token exists.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/cuda_check.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "model/cuda/common.cuh"
#include "model/cuda/decode_attention.cuh"
#include "model/cuda/embedding.cuh"
#include "model/cuda/handles.h"
#include "model/cuda/matmul.h"
#include "model/cuda/residual.cuh"
#include "model/cuda/rmsnorm.cuh"
#include "model/cuda/rope.cuh"
#include "model/cuda/swiglu.cuh"
#include "model/decoder.h"
#include "model/layout.h"

namespace trainer {
namespace cuda {
namespace {

constexpr float kRmsEps = 1e-5f;
constexpr double kRopeTheta = 10000.0;

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024)); }
std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024)); }

template <typename T>
class CudaDecoder final : public Decoder {
 public:
  CudaDecoder(const ModelConfig& c, const float* params, int device);
  ~CudaDecoder() override {
    if (stream_.s) cudaStreamSynchronize(stream_.s);
  }

  const ModelConfig& config() const override { return cfg_; }
  int64_t position() const override { return pos_; }
  void reset() override { pos_ = 0; }
  std::string describe() const override {
    return fmt::format("CUDA decoder on GPU {} ({}), key/value cache for {} positions ({})",
                       device_, kName, cfg_.ctx,
                       mib(static_cast<double>(2 * cache_elems_ * sizeof(T))));
  }
  const float* feed(const int32_t* ids, int64_t count, bool all_positions) override;

 private:
  static constexpr DType kType = dtype_of<T>();
  static constexpr const char* kName = kType == DType::kF32    ? "fp32"
                                       : kType == DType::kBF16 ? "bf16"
                                                               : "fp16";

  const T* P(int64_t offset) const { return params_.as<T>() + offset; }
  // y[n, d_out] (row stride ldy) = x W^T (+ resid), W the tensor at flat offset `w`.
  void linear(const T* x, int64_t w, void* y, int64_t ldy, int64_t n, int64_t d_in, int64_t d_out,
              const T* resid = nullptr, DType out = kType) {
    mm_->run(linear_gemm(x, P(w), y, ldy, n, d_in, d_out, kType, out, resid), stream_.s);
  }
  // Linear layers with one input whose outputs sit side by side in y (row stride ldy), in the
  // order of `offsets`: one matmul when their weights are adjacent in the flat buffer.
  void linear_group(const T* x, std::initializer_list<int64_t> offsets, T* y, int64_t ldy,
                    int64_t n, int64_t d_in, int64_t d_out) {
    const int64_t* w = offsets.begin();
    bool adjacent = true;
    for (size_t j = 1; j < offsets.size(); ++j)
      adjacent = adjacent && w[j] == w[j - 1] + d_in * d_out;
    if (adjacent) return linear(x, w[0], y, ldy, n, d_in, ldy);
    for (size_t j = 0; j < offsets.size(); ++j) linear(x, w[j], y + j * d_out, ldy, n, d_in, d_out);
  }
  // Room for `rows` rows of logits on the device and the host.
  void reserve_logits(int64_t rows);

  ModelConfig cfg_;
  ParamLayout layout_;
  int device_;
  int64_t d_, f_, V_, Vp_, H_, dh_;
  std::vector<BlockOffsets> blocks_;
  int64_t off_emb_, off_lnf_, off_head_;
  int64_t cache_elems_ = 0;  // per cache (keys or values): layers * ctx * d

  StreamHandle stream_;
  std::unique_ptr<Matmul> mm_;
  DeviceBuffer params_, k_cache_, v_cache_, acts_, rstd_, rope_table_, ids_dev_;
  DeviceBuffer logits_;  // fp32 (rows, Vp)
  int64_t logit_rows_ = 0;
  PinnedHandle ids_host_, logits_host_;
  T *x_, *ln_, *vkq_, *q_, *att_, *h_, *ba_, *g_;  // carved from acts_, ctx rows each
  int64_t pos_ = 0;
};

template <typename T>
CudaDecoder<T>::CudaDecoder(const ModelConfig& c, const float* params, int device)
    : cfg_(c), layout_(c), device_(device) {
  validate(c);
  // 0 when the driver is missing or too old for this runtime: a user error, not a crash.
  const int devices = cuda_device_count();
  if (device < 0 || device >= devices)
    usage_error("GPU {} does not exist: {} CUDA device(s) visible", device, devices);
  CUDA_CHECK(cudaSetDevice(device));
  d_ = c.d_model;
  f_ = c.d_ff;
  V_ = c.vocab;
  Vp_ = align_up(c.vocab, 8);
  H_ = c.n_heads;
  dh_ = c.head_dim();
  const int64_t n = c.ctx;
  if (n > decode_attention_max_len(dh_))
    usage_error("context {} is longer than the decoder's attention kernel holds ({} positions)", n,
                decode_attention_max_len(dh_));
  for (int l = 0; l < c.n_layers; ++l) blocks_.push_back(layout_.block_offsets(l));
  off_emb_ = layout_.find("token_embeddings.weight").offset;
  off_lnf_ = layout_.find("ln_final.weight").offset;
  off_head_ = layout_.find("lm_head.weight").offset;

  // Activations, one set of ctx rows reused by every block: x, ln, vkq (3d), q, att, h, ba (2f), g.
  const int64_t act_elems = n * (8 * d_ + 3 * f_);
  cache_elems_ = c.n_layers * n * d_;
  const int64_t need =
      static_cast<int64_t>(sizeof(T)) * (layout_.total() + 2 * cache_elems_ + act_elems) +
      static_cast<int64_t>(Matmul::kWorkspaceBytes) + n * Vp_ * 4;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > static_cast<int64_t>(free_bytes))
    usage_error("the model and its cache for {} positions need {}, {} free on GPU {}", n,
                gib(static_cast<double>(need)), gib(static_cast<double>(free_bytes)), device);

  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_.s, cudaStreamNonBlocking));
  mm_ = std::make_unique<Matmul>();
  params_ = DeviceBuffer(DeviceKind::kCuda, kType, layout_.total());
  if constexpr (std::is_same_v<T, float>) {
    CUDA_CHECK(cudaMemcpy(params_.as<float>(), params, layout_.total() * sizeof(float),
                          cudaMemcpyHostToDevice));
  } else {
    // fp32 chunks through a device staging buffer, rounded to bf16 or fp16 on the device.
    constexpr int64_t kChunk = int64_t{16} << 20;
    const DeviceBuffer stage(DeviceKind::kCuda, DType::kF32, std::min(kChunk, layout_.total()));
    for (int64_t off = 0; off < layout_.total(); off += kChunk) {
      const int64_t count = std::min(kChunk, layout_.total() - off);
      CUDA_CHECK(cudaMemcpy(stage.as<float>(), params + off, count * sizeof(float),
                            cudaMemcpyHostToDevice));
      cast(stage.as<float>(), params_.as<T>() + off, count, nullptr);
    }
  }
  k_cache_ = DeviceBuffer(DeviceKind::kCuda, kType, cache_elems_);
  v_cache_ = DeviceBuffer(DeviceKind::kCuda, kType, cache_elems_);
  acts_ = DeviceBuffer(DeviceKind::kCuda, kType, act_elems);
  T* a = acts_.as<T>();
  for (T** p : {&x_, &ln_, &q_, &att_, &h_}) {
    *p = a;
    a += n * d_;
  }
  vkq_ = a;
  a += n * 3 * d_;
  ba_ = a;
  a += n * 2 * f_;
  g_ = a;
  rstd_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, n);
  const std::vector<float> table = rope_table(n, dh_, kRopeTheta);
  rope_table_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, static_cast<int64_t>(table.size()));
  CUDA_CHECK(cudaMemcpy(rope_table_.as<float>(), table.data(), table.size() * sizeof(float),
                        cudaMemcpyHostToDevice));
  ids_dev_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, n);  // 4-byte slots for int32 ids
  CUDA_CHECK(cudaHostAlloc(&ids_host_.p, n * sizeof(int32_t), cudaHostAllocDefault));
  reserve_logits(1);
  CUDA_CHECK(cudaDeviceSynchronize());  // the zero fills ran on the legacy stream
}

template <typename T>
void CudaDecoder<T>::reserve_logits(int64_t rows) {
  if (rows <= logit_rows_) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_.s));
  logits_ = DeviceBuffer(DeviceKind::kCuda, DType::kF32, rows * Vp_);
  if (logits_host_.p) CUDA_CHECK(cudaFreeHost(logits_host_.p));
  logits_host_.p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&logits_host_.p, rows * V_ * sizeof(float), cudaHostAllocDefault));
  logit_rows_ = rows;
}

template <typename T>
const float* CudaDecoder<T>::feed(const int32_t* ids, int64_t count, bool all_positions) {
  check_feed(cfg_, pos_, ids, count);
  CUDA_CHECK(cudaSetDevice(device_));
  NvtxRange range("decode");
  const int64_t n = count, d = d_, f = f_, p0 = pos_, ctx = cfg_.ctx;
  const int64_t first = all_positions ? 0 : n - 1, rows = n - first;
  reserve_logits(rows);
  cudaStream_t s = stream_.s;
  std::memcpy(ids_host_.p, ids, n * sizeof(int32_t));
  CUDA_CHECK(cudaMemcpyAsync(ids_dev_.as<int32_t>(), ids_host_.p, n * sizeof(int32_t),
                             cudaMemcpyHostToDevice, s));
  embedding_forward(ids_dev_.as<int32_t>(), P(off_emb_), x_, n, d, s);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const BlockOffsets& b = blocks_[l];
    T* kc = k_cache_.as<T>() + static_cast<int64_t>(l) * ctx * d;
    T* vc = v_cache_.as<T>() + static_cast<int64_t>(l) * ctx * d;
    rmsnorm_forward(x_, P(b.ln1), ln_, rstd_.as<float>(), n, d, kRmsEps, s);
    linear_group(ln_, {b.v, b.k, b.q}, vkq_, 3 * d, n, d, d);
    RopeJobs<T> jobs;
    jobs.add(vkq_ + 2 * d, q_, true);
    jobs.add(vkq_ + d, kc + p0 * d, true);
    jobs.add(vkq_, vc + p0 * d, false);
    // The table from position p0 on: rows of dh floats (cos, sin of dh/2 pairs) per position.
    rope(jobs, QkvLayout::kTokenMajor, 3 * d, QkvLayout::kTokenMajor, d, 1, n, H_, dh_,
         rope_table_.as<float>() + p0 * dh_, false, s);
    decode_attention(q_, d, kc, vc, att_, n, p0, H_, dh_, s);
    linear(att_, b.o, h_, d, n, d, d, x_);  // h = x + att Wo^T
    rmsnorm_forward(h_, P(b.ln2), ln_, rstd_.as<float>(), n, d, kRmsEps, s);
    linear_group(ln_, {b.w3, b.w1}, ba_, 2 * f, n, d, f);
    swiglu_forward(ba_ + f, ba_, 2 * f, g_, n, f, s);
    linear(g_, b.w2, x_, d, n, f, d, h_);  // x' = h + g W2^T
  }
  rmsnorm_forward(x_ + first * d, P(off_lnf_), ln_, rstd_.as<float>(), rows, d, kRmsEps, s);
  linear(ln_, off_head_, logits_.as<float>(), Vp_, rows, d, V_, nullptr, DType::kF32);
  CUDA_CHECK(cudaMemcpy2DAsync(logits_host_.p, V_ * sizeof(float), logits_.as<float>(),
                               Vp_ * sizeof(float), V_ * sizeof(float), rows,
                               cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  pos_ += n;
  return static_cast<const float*>(logits_host_.p);
}

}  // namespace
}  // namespace cuda

std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig& c, const float* params,
                                           Precision precision, int device) {
  TRAINER_CHECK(params != nullptr, "make_cuda_decoder: null parameters");
  switch (precision) {
    case Precision::kBf16:
      return std::make_unique<cuda::CudaDecoder<__nv_bfloat16>>(c, params, device);
    case Precision::kFp16:
      return std::make_unique<cuda::CudaDecoder<__half>>(c, params, device);
    case Precision::kFp32:
      return std::make_unique<cuda::CudaDecoder<float>>(c, params, device);
    case Precision::kTf32:
      break;
  }
  usage_error("the decoder runs in bf16, fp16 or fp32, not {}", precision_name(precision));
}

}  // namespace trainer
