// The floor of each phase of a benchmark step on this GPU (--benchmark on CUDA): how long the phase
// would take if nothing but its unavoidable work ran, each part at a throughput measured here.
//
//   forward, backward: the step's own GEMMs (recorded during one step, then each distinct problem
//     timed alone, planned for the whole GPU), plus flash attention's FLOPs at the throughput the
//     flash kernels reach at T = 4096, plus the elementwise kernels' bytes (norms, RoPE, the gate,
//     embedding, cross-entropy; estimated from the shapes) at the copy bandwidth;
//   optimizer: the bytes AdamW (and the gradient-norm pass, unless it runs beside backward) must
//     move, at the copy bandwidth; beside backward, the norm's bytes count in backward's floor.
//
// measured / floor then says how much of a phase is overhead (launch gaps, kernels below their
// roofline, synchronisation): the next gap to close.
//
// At the power cap (--floors-at-cap): an H100 or H200 under a training load runs at its power
// limit, where a step's time is its energy over that limit, and work beside other work (an update
// beside forward, a copy beside a GEMM) still costs its joules. Each part then runs alone, back
// to back, for longer than NVML's one-second power average, on the same GPU held at the cap: the
// step's own GEMMs (its buffers and data), flash attention at the step's shape (random inputs:
// power depends on the operands' bits), and a device-to-device copy, whose joules per GB price the
// elementwise and optimizer bytes above. The parts' joules over the power limit are the shortest
// step this GPU allows at that limit with these kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/replica.h"

namespace trainer {

struct PhaseFloors {
  bool measured = false;
  std::string note;  // what could not be measured, and why
  // Parts, ms.
  double gemm_forward_ms = 0, gemm_backward_ms = 0;
  int64_t gemm_forward_calls = 0, gemm_backward_calls = 0;
  double attention_forward_ms = 0, attention_backward_ms = 0;      // 0 without flash attention
  double elementwise_forward_ms = 0, elementwise_backward_ms = 0;  // estimated bytes / bandwidth
  double optimizer_ms = 0;
  // What they rest on.
  double copy_gb_s = 0;  // device-to-device copy, read + write
  double attention_forward_tflops = 0, attention_backward_tflops = 0;
  double optimizer_bytes = 0;
  double elementwise_forward_bytes = 0, elementwise_backward_bytes = 0;
  // At the power cap (measured only when asked for): joules per step, each part alone.
  bool at_cap = false;
  double limit_watts = 0;
  double cap_window_s = 0;  // how long each part ran
  double gemm_forward_j = 0, gemm_backward_j = 0;
  double attention_forward_j = 0, attention_backward_j = 0;  // 0 without flash attention
  double copy_j_per_gb = 0;                                  // per GB read + written
  double copy_sm_mhz = 0;  // the SM clock while the copy ran (its samples' median; 0: unsampled)
  double elementwise_forward_j() const { return elementwise_forward_bytes * 1e-9 * copy_j_per_gb; }
  double elementwise_backward_j() const {
    return elementwise_backward_bytes * 1e-9 * copy_j_per_gb;
  }
  double optimizer_j() const { return optimizer_bytes * 1e-9 * copy_j_per_gb; }
  double step_j(bool backward, bool optimizer) const {
    double j = gemm_forward_j + attention_forward_j + elementwise_forward_j();
    if (backward) j += gemm_backward_j + attention_backward_j + elementwise_backward_j();
    if (optimizer) j += optimizer_j();
    return j;
  }
  double forward_ms() const {
    return gemm_forward_ms + attention_forward_ms + elementwise_forward_ms;
  }
  double backward_ms() const {
    return gemm_backward_ms + attention_backward_ms + elementwise_backward_ms;
  }
};

// `count` bf16 values (their bits) uniform in (-1, 1), the same for a seed: the operands of the
// floors' timed GEMMs and of the energy probes (a GEMM's power depends on how many bits toggle).
std::vector<uint16_t> random_bf16_bits(size_t count, uint64_t seed);

// Causal attention FLOPs of one layer, as the flash kernels compute them: forward 2 B H T^2 dh
// (QK^T and PV, half of each masked), backward 5 B H T^2 dh (S recomputed, dV, dP, dQ, dK).
double attention_flops(int64_t B, int64_t T, int64_t H, int64_t dh, bool backward);

// Measures the floors for one micro-batch `mb` of `r` (a CUDA replica; CPU: returns
// measured = false) whose optimizer updates `optimizer_elems` elements (moments of
// `moment_bytes` each: 4, or 2 with --adam-state bf16), after the timed steps:
// runs one more forward and backward (the replica's buffers are overwritten), then the timings.
// The GPU must have room for two 256 MiB copy buffers and the attention test's tensors; what does
// not fit is left out and named in `note`.
// norm_beside_backward: the gradient norm's pass runs during backward (one GPU), not in the
// optimizer phase. power: the GPU's NVML reader, to measure the parts at the power cap as well
// (some 20-40 s); null: not. gemm_tune: the products are tuned as the step's are (--gemm-tune).
class PowerSampler;
PhaseFloors measure_floors(Replica& r, const ModelConfig& c, const MicroBatch& mb,
                           int64_t optimizer_elems, int moment_bytes, bool backward,
                           bool norm_beside_backward = false, PowerSampler* power = nullptr,
                           bool gemm_tune = false);

}  // namespace trainer
