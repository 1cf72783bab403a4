// The CPU reference replica: fp32 flat buffers in host memory around CpuTransformer<float>.
#include <fmt/format.h>

#include <memory>

#include "core/device_buffer.h"
#include "core/error.h"
#include "model/cpu/transformer.h"
#include "model/replica.h"

namespace trainer {
namespace {

class CpuReplica final : public Replica {
 public:
  CpuReplica(const ModelConfig& c, const ReplicaOptions& o)
      : config_(c), layout_(c), model_(c, o.max_batch, o.recompute) {
    if (o.precision != Precision::kFp32)
      usage_error("--precision {}: the CPU backend computes in fp32 only (use --precision fp32)",
                  precision_name(o.precision));
    TRAINER_CHECK(o.flat_elems >= layout_.total(), "flat buffers of {} elements < layout total {}",
                  o.flat_elems, layout_.total());
    TRAINER_CHECK(o.grad_dtype == DType::kF32, "the CPU replica keeps fp32 gradients");
    params_ = DeviceBuffer(DeviceKind::kCpu, DType::kF32, o.flat_elems);
    grads_ = DeviceBuffer(DeviceKind::kCpu, DType::kF32, o.flat_elems);
  }

  DeviceKind device() const override { return DeviceKind::kCpu; }
  const ModelConfig& config() const override { return config_; }
  const ParamLayout& layout() const override { return layout_; }
  BufferView params() override { return params_.view(); }
  BufferView grads() override { return grads_.view(); }

  void forward(const MicroBatch& mb, const ParamsNeededFn& need) override {
    TRAINER_CHECK(mb.inputs != nullptr && mb.targets != nullptr,
                  "forward needs inputs and targets");
    const float mean =
        model_.forward(params_.as<float>(), mb.inputs, mb.targets, mb.batch, mb.seq, need);
    const int64_t tokens = mb.batch * mb.seq;
    loss_sum_ += static_cast<double>(mean) * static_cast<double>(tokens);
    loss_tokens_ += tokens;
    backward_ready_ = true;
  }

  float take_loss() override {
    TRAINER_CHECK(loss_tokens_ > 0, "take_loss() with no forward since the last call");
    const double mean = loss_sum_ / static_cast<double>(loss_tokens_);
    loss_sum_ = 0;
    loss_tokens_ = 0;
    return static_cast<float>(mean);
  }

  void backward(float scale, const GradReadyFn& ready) override {
    // evaluate() reuses the activation storage, so only a training forward can be backpropagated.
    TRAINER_CHECK(backward_ready_, "backward without a training forward since the last evaluate");
    model_.backward(params_.as<float>(), grads_.as<float>(), scale, ready);
  }

  // Runs forward in the same storage (the CPU has no memory to save); it does not count towards
  // take_loss() and invalidates the saved activations of an earlier forward.
  float evaluate(const MicroBatch& mb) override {
    TRAINER_CHECK(mb.inputs != nullptr && mb.targets != nullptr,
                  "evaluate needs inputs and targets");
    backward_ready_ = false;
    return model_.forward(params_.as<float>(), mb.inputs, mb.targets, mb.batch, mb.seq);
  }

  void zero_grads() override { zero(grads_.view()); }

  void set_params(const float* host) override {
    TRAINER_CHECK(host != nullptr, "set_params: null source");
    copy(params_.view(),
         BufferView{const_cast<float*>(host), params_.count(), DType::kF32, DeviceKind::kCpu});
  }

  int64_t activation_bytes() const override { return model_.activation_bytes(); }
  std::vector<MemoryItem> memory_plan() const override {
    return {{"working weights (fp32)", static_cast<int64_t>(params_.bytes())},
            {"gradients (fp32)", static_cast<int64_t>(grads_.bytes())},
            {fmt::format("activations and backward scratch (--recompute {})",
                         recompute_name(model_.recompute())),
             model_.activation_bytes()}};
  }
  std::string attention_kernel() const override { return "fp32 reference (materialised scores)"; }

 private:
  ModelConfig config_;
  ParamLayout layout_;
  cpu::CpuTransformer<float> model_;
  DeviceBuffer params_, grads_;
  double loss_sum_ = 0;
  int64_t loss_tokens_ = 0;
  bool backward_ready_ = false;
};

}  // namespace

std::unique_ptr<Replica> make_cpu_replica(const ModelConfig& c, const ReplicaOptions& o) {
  return std::make_unique<CpuReplica>(c, o);
}

}  // namespace trainer
