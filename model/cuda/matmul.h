// cuBLASLt matrix multiplication in the row-major convention of the rest of the model.
//
//   D[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C[m, n]      (per batch entry)
//
// Every matrix is row-major with a row stride (ld). cuBLASLt is column-major, and a row-major X
// is the column-major X^T, so the call computes D^T = op(B)^T op(A)^T: A and B swap places and
// m and n swap roles; no data moves. C may differ from D (e.g. the residual add fused into the
// output projection: D = x W^T + resid).
//
// Precision modes: fp32 A/B/C/D with CUBLAS_COMPUTE_32F (true fp32, no TF32), the same with
// tf32 = true (CUBLAS_COMPUTE_32F_FAST_TF32), or bf16 (fp16) A/B with bf16 (fp16) or fp32 C/D and
// fp32 accumulation (CUBLAS_COMPUTE_32F). The algorithm of each distinct problem (shape, strides,
// types, pointer alignments) is chosen once with cublasLtMatmulAlgoGetHeuristic and cached with
// its descriptors, so repeated calls do no host-side set-up and never allocate on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/device_buffer.h"

namespace trainer::cuda {

struct Gemm {
  bool trans_a = false;  // op(A) = A^T, A stored (k, m)
  bool trans_b = false;  // op(B) = B^T, B stored (n, k)
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  const void* c = nullptr;  // nullptr: C is D (beta != 0 then accumulates into D)
  int64_t ldc = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1;  // strided batch: entry i starts i * stride_x elements after entry 0
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;
  DType ab_type = DType::kF32;  // kF32, kBF16 or kF16
  DType cd_type = DType::kF32;  // kF32, or ab_type when that is kBF16 or kF16
  bool tf32 = false;            // fp32 A/B only: let the tensor cores round inputs to TF32
};

// The product of a Linear layer: y[n, d_out] (row stride ldy) = x[n, d_in] W[d_out, d_in]^T, plus
// resid (same row stride as y) when given. x and W are of type `ab`, y and resid of type `cd`.
Gemm linear_gemm(const void* x, const void* W, void* y, int64_t ldy, int64_t n, int64_t d_in,
                 int64_t d_out, DType ab, DType cd, const void* resid = nullptr);

// One-line description of a problem, for error messages.
std::string describe(const Gemm& g);

// While `sink` is set, every product any Matmul of this process runs is appended to it (the
// benchmark's floors time a step's products alone); nullptr stops recording.
void record_gemms(std::vector<Gemm>* sink);

class Matmul {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Creates the cuBLASLt handle and the workspace on the current CUDA device.
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Enqueues the product on `stream`. Throws RuntimeError naming the call and the problem when
  // cuBLASLt rejects it or has no algorithm for it.
  void run(const Gemm& g, cudaStream_t stream);

  // Number of distinct problems planned so far.
  size_t plans() const;

  // From now on, each new problem with bf16 or fp16 inputs (one matrix, not a batch) is tuned when
  // it is planned: of cuBLASLt's first few heuristic algorithms, those whose products equal its
  // first choice's bit for bit are timed alone, and the fastest serves the problem when it is 2%
  // faster than the first choice. Equal means: on scratch operands of the problem's shape and
  // alignment, made so that any other order or grouping of the additions shows (matmul.cu,
  // tune_fill_kernel) and surrounded by NaN, with beta 0 and 1, the whole output allocation is
  // the same; and so it is on the first call's own operands. Planning then synchronises the
  // device and briefly holds scratch memory (none to be had: the first choice). Picks are kept
  // for the process, per device: another Matmul planning the same problem (the benchmark's floors
  // replaying the step's products) takes the pick without timing again. Off by default; never
  // while the stream is being captured into a graph.
  void set_tuning(bool on);

  // What tuning did so far: problems planned, heuristic alternatives offered and found equal bit
  // for bit, problems timed, problems that took another algorithm and the per-call times (ms,
  // alone) of the first choice and of the pick for those; `reused`: problems that took a pick
  // made earlier in the process.
  struct TuneStats {
    int problems = 0, offered = 0, identical = 0, tuned = 0, switched = 0, reused = 0;
    double first_ms = 0, picked_ms = 0;
    TuneStats& operator+=(const TuneStats& o) {
      problems += o.problems, offered += o.offered, identical += o.identical, tuned += o.tuned;
      switched += o.switched, reused += o.reused;
      first_ms += o.first_ms, picked_ms += o.picked_ms;
      return *this;
    }
  };
  TuneStats tune_stats() const;

  // SMs the following products are planned for (cuBLASLt's SM_COUNT_TARGET); 0 = the whole GPU.
  // Set below the SM count while collectives run beside the products, so that a GEMM sized for
  // every SM does not leave a second, nearly empty wave behind the SMs NCCL holds.
  void set_sm_target(int sms);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::cuda
