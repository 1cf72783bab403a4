// The backend seam: one rank's replica of the model on one device.
//
// The training loop, the gradient synchronisers and ZeRO-1 only see this interface; the CPU
// reference (model/cpu) and the CUDA backend (model/cuda) implement it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/recompute.h"

namespace trainer {

// Called by backward as the gradient of tensor `index` (into ParamLayout::tensors()) becomes
// final; indices arrive in increasing order, so tensors [0, index] are then all final.
using GradReadyFn = std::function<void(int index)>;
// Called by forward before it first reads the parameters at flat-buffer offsets >= `offset`.
// Forward runs from the embedding (last in the buffer) to lm_head (offset 0), so offsets arrive in
// decreasing order, once per block and once each for the embedding and the head: everything from
// `offset` to the end must then be current. (ZeRO-1 lets its all-gathers finish meanwhile.)
using ParamsNeededFn = std::function<void(int64_t offset)>;
// Forward's announcement: tells `need`, when there is one, that parameters from `offset` on are
// about to be read.
inline void announce(const ParamsNeededFn& need, int64_t offset) {
  if (need) need(offset);
}

struct ReplicaOptions {
  int64_t max_batch = 1;   // sequences per micro-batch the buffers are sized for
  int64_t flat_elems = 0;  // size of the flat buffers (>= layout.total(); padding for shards)
  Precision precision = Precision::kFp32;
  std::string attention = "flash";  // CUDA: "flash" or "simple"
  int device_index = 0;             // CUDA device ordinal
  int comm_sms = 0;  // CUDA: SMs backward's GEMMs leave to collectives running beside it
  // CUDA: elements of AdamW state this rank will hold (its ZeRO-1 shard, or flat_elems), counted
  // in the check that the run fits in the GPU's memory before anything is allocated.
  int64_t optimizer_elems = -1;           // -1: flat_elems
  int64_t optimizer_bytes_per_elem = 12;  // fp32 master, m and v (8 with bf16 moments)
  // Gradient storage: kF32, or (CUDA at bf16 precision) kBF16, written by backward's kernels
  // directly, for ranks that exchange their gradients whole in bf16 (--grad-transport ce
  // --grad-reduce bf16). Micro-steps then accumulate in bf16, except the embedding's rows, which
  // are summed in an fp32 scratch and rounded once per backward.
  DType grad_dtype = DType::kF32;
  // CUDA: bf16 copies of the whole gradient that the communicator will hold (one per peer),
  // counted in the fit check.
  int64_t grad_copies = 0;
  // What forward keeps for backward and what backward recomputes (model/recompute.h).
  Recompute recompute = Recompute::kNone;
  // CUDA: pinned slots for stage(), one per micro-batch of a step captured as a graph (0: none).
  int graph_slots = 0;
  // CUDA: the compute stream at the highest priority, so that work on lower streams beside it
  // (the update beside the next forward) takes only the SMs its kernels leave.
  bool urgent_stream = false;
  // CUDA: SMs forward's GEMMs leave to the update beside them, while one is in flight
  // (Replica::set_update_in_flight).
  int update_sms = 0;
  // CUDA: backward's weight-gradient GEMMs on a second stream, planned for this many SMs fewer
  // than the rest of backward's (-1: on the compute stream, in order).
  int wgrad_sms = -1;
  // CUDA: matrix products tuned among cuBLASLt's algorithms equal bit for bit to its first choice
  // (Matmul::set_tuning).
  bool gemm_tune = false;
  // Testing hook (--debug-wgrad-delay-us): the weight-gradient stream idles this long before each
  // of its products, so that a test sees any compute-stream write that does not wait for them.
  int64_t debug_wgrad_delay_us = 0;
};

// One line of the memory report: what a buffer holds, and its bytes as allocated.
struct MemoryItem {
  std::string category;
  int64_t bytes = 0;
};

inline int64_t total_bytes(const std::vector<MemoryItem>& items) {
  int64_t sum = 0;
  for (const MemoryItem& m : items) sum += m.bytes;
  return sum;
}

// A micro-batch in host memory: `batch` rows of `seq` token ids each.
struct MicroBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  int64_t batch = 0;
  int64_t seq = 0;
};

class Replica {
 public:
  virtual ~Replica() = default;

  virtual DeviceKind device() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;

  // Working parameters (what forward reads: fp32 on the CPU, bf16, fp16 or fp32 on CUDA) and the
  // gradient accumulator (ReplicaOptions::grad_dtype); both are flat buffers of
  // ReplicaOptions::flat_elems elements.
  virtual BufferView params() = 0;
  virtual BufferView grads() = 0;

  // Forward of one micro-batch; keeps what backward needs. The token losses are summed on the
  // device (no host synchronisation); take_loss() reads them. `need` (may be empty) is told before
  // each part of the parameters is first read.
  virtual void forward(const MicroBatch& mb, const ParamsNeededFn& need = {}) = 0;
  // Mean token loss over every micro-batch forwarded since the last call; waits for the device.
  virtual float take_loss() = 0;
  // Backward of the last forward: grads += scale * d(sum of this micro-batch's token losses)/dp.
  // `ready` (may be empty) is told as each tensor's gradient is final.
  virtual void backward(float scale, const GradReadyFn& ready) = 0;
  // Mean token loss without keeping activations (validation).
  virtual float evaluate(const MicroBatch& mb) = 0;
  // Starts a new accumulation: the next backward acts on zero gradients. (The CUDA replica does not
  // clear the buffer: that backward writes every tensor's gradient instead of adding to it, so
  // grads() holds old values until then.) Elements outside every tensor stay zero throughout.
  virtual void zero_grads() = 0;

  // Sets the working parameters from fp32 values of the whole flat buffer (host memory).
  virtual void set_params(const float* host) = 0;

  // Bytes of activation memory held for the configured max batch and ctx.
  virtual int64_t activation_bytes() const = 0;
  // Everything this replica allocated, by category (working weights, gradients, activations kept
  // per block, attention workspace, logits, scratch, library workspaces): the replica's lines of
  // the memory report, summing to its whole allocation.
  virtual std::vector<MemoryItem> memory_plan() const = 0;
  // Which attention implementation forward and backward use, and why when it is not the one
  // asked for (for the start-up log).
  virtual std::string attention_kernel() const = 0;
  // Whether that is one of the flash kernels (their names start with "flash").
  bool uses_flash_attention() const { return attention_kernel().rfind("flash", 0) == 0; }

  // CUDA graphs (--cuda-graph): a step's forwards and backwards recorded once, then replayed.
  // stage() is forward's host work for micro-batch `slot` of the next step: it checks the ids and
  // puts them, with backward's embedding grouping, into pinned slot `slot` (after the last replay
  // has read it). forward_staged() is forward's device work on that slot; it may be captured.
  // Between begin_capture() and end_capture() the work enqueued on stream(), and on streams that
  // fork from it and join it again, is recorded instead of run; replay() runs the recording and
  // re-applies the host-side effects of the calls recorded (the loss's token count, which
  // gradients backward overwrites). The CPU replica has none of them.
  virtual void stage(const MicroBatch& mb, int slot);
  virtual void forward_staged(int slot, const ParamsNeededFn& need = {});
  virtual void begin_capture();
  virtual void end_capture();
  virtual void replay();

  // What the tuning of matrix products did so far, for the log ("" where there is none).
  virtual std::string gemm_tuning() const { return ""; }

  // Makes the host wait for all work queued on this replica's device (no-op on the CPU).
  virtual void synchronize() {}
  // The compute stream (a cudaStream_t on CUDA, nullptr on the CPU): collectives on gradients
  // are ordered after the work queued on it.
  virtual void* stream() { return nullptr; }
  // Whether an update runs beside the next forward (ReplicaOptions::update_sms; no-op on the
  // CPU).
  virtual void set_update_in_flight(bool) {}
};

// The CPU reference replica (fp32).
std::unique_ptr<Replica> make_cpu_replica(const ModelConfig& c, const ReplicaOptions& o);
// The CUDA replica; throws RuntimeError in a build without CUDA.
std::unique_ptr<Replica> make_cuda_replica(const ModelConfig& c, const ReplicaOptions& o);

}  // namespace trainer
