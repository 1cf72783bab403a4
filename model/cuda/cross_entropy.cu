// Fused softmax + cross-entropy (see cross_entropy.cuh for the math). One block per row; an
// online (max, sum) pass, a block reduction, then the optional gradient pass over the same row.
#include <atomic>

#include "model/cuda/common.cuh"
#include "model/cuda/cross_entropy.cuh"
#include "model/cuda/flash/tma.cuh"

namespace trainer::cuda {
namespace {

// e^x is computed as 2^(x log2 e) on the special-function unit (fast_exp2, kLog2e), two
// instructions where expf takes about eight; with one expf per logit in each pass, expf made the
// kernel instruction-bound (80% of issue slots busy, DRAM at 37%). ln(2) turns lse2 back.
constexpr float kLn2 = 0.6931471805599453f;

// Running softmax statistics: max m and sum s of exp(x - m) over the values seen.
struct MaxSum {
  float m = -INFINITY, s = 0.0f;
  __device__ void add(float x) {
    if (x > m) {
      s = s * fast_exp2((m - x) * kLog2e) + 1.0f;
      m = x;
    } else {
      s += fast_exp2((x - m) * kLog2e);
    }
  }
  // kV values at once: one rescale of the running sum per pack.
  template <typename T, int kV>
  __device__ void add_pack(const Pack<T, kV>& p) {
    float mx = to_float(p.v[0]);
#pragma unroll
    for (int k = 1; k < kV; ++k) mx = fmaxf(mx, to_float(p.v[k]));
    if (!(mx <= m)) {  // a larger max, or NaN (which then spreads to s)
      s *= fast_exp2((m - mx) * kLog2e);
      m = mx;
    }
    if (m == -INFINITY) return;  // every value so far is -inf
    const float m2 = m * kLog2e;
#pragma unroll
    for (int k = 0; k < kV; ++k) s += fast_exp2(fmaf(to_float(p.v[k]), kLog2e, -m2));
  }
  __device__ static MaxSum merge(MaxSum a, MaxSum b) {
    MaxSum r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == -INFINITY) return r;  // both empty
    r.s = a.s * fast_exp2((a.m - r.m) * kLog2e) + b.s * fast_exp2((b.m - r.m) * kLog2e);
    return r;
  }
};

__device__ MaxSum warp_max_sum(MaxSum v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    MaxSum other;
    other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    v = MaxSum::merge(v, other);
  }
  return v;
}

// Merged over the block: each warp by shuffles, then warp 0 over the warps' results (a fixed
// order, so deterministic); every thread gets the result.
__device__ MaxSum block_max_sum(MaxSum v, float* sm, float* ss) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max_sum(v);
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? MaxSum{sm[lane], ss[lane]} : MaxSum{};
    v = warp_max_sum(v);
    if (lane == 0) {
      sm[kWarp] = v.m;
      ss[kWarp] = v.s;
    }
  }
  __syncthreads();
  return MaxSum{sm[kWarp], ss[kWarp]};
}

__device__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row i = blockIdx.x. kV logits per access on [0, V/kV*kV), then one at a time. kStaged (16-byte
// packs): one thread first has the copy engine bring the whole row into shared memory (a bulk
// copy, every byte of it in flight at once) and both passes read it there; otherwise each pass
// reads global memory, a pack per thread at a time, and waits on memory latency more than on
// bandwidth (Nsight Compute: 9.6 of 21.9 cycles between issues). The arithmetic is the same.
template <typename T, int kV, bool kGrad, bool kStaged>
__global__ void cross_entropy_kernel(T* logits, int64_t ld, const int32_t* __restrict__ targets,
                                     float* __restrict__ losses, double* loss_sum,
                                     unsigned* counter, int64_t n, int V, float scale) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ uint64_t landed;
  __shared__ float sm[kWarp + 1], ss[kWarp + 1];
  __shared__ double sd[32];
  __shared__ bool last;
  const int64_t row = blockIdx.x;
  T* l = logits + row * ld;
  const T* r = l;  // where the passes read the row
  if constexpr (kStaged) {
    static_assert(kV * sizeof(T) == 16, "a staged row is copied in 16-byte units");
    const auto bar = static_cast<uint32_t>(__cvta_generic_to_shared(&landed));
    if (threadIdx.x == 0) {
      flash::tma::barrier_init(bar, 1);
      flash::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const auto bytes = static_cast<uint32_t>((V + kV - 1) / kV * kV * sizeof(T));
      flash::tma::arrive_expect_tx(bar, bytes);
      flash::tma::load_bytes(static_cast<uint32_t>(__cvta_generic_to_shared(staged)), l, bytes,
                             bar);
    }
    flash::tma::wait(bar, 0);
    r = reinterpret_cast<const T*>(staged);
  }
  const int t = targets[row];
  // Read before the block barrier inside block_max_sum: nothing overwrites it before then.
  const float lt = to_float(r[t]);
  const int v_vec = V / kV * kV;
  MaxSum acc;
  for (int c = threadIdx.x * kV; c < v_vec; c += blockDim.x * kV) {
    acc.add_pack(load_pack<kV>(r + c));
  }
  for (int c = v_vec + threadIdx.x; c < V; c += blockDim.x) acc.add(to_float(r[c]));
  const MaxSum tot = block_max_sum(acc, sm, ss);
  // log-sum-exp in base 2, as the gradient's exponent uses it: m log2 e + log2 s.
  const float lse2 = fmaf(tot.m, kLog2e, log2f(tot.s));
  if (threadIdx.x == 0) losses[row] = lse2 * kLn2 - lt;

  if constexpr (kGrad) {
    // scale * softmax = 2^(x log2 e - lse2 + log2 scale): the scale rides in the exponent's
    // offset (scale > 0; the launcher checks), and the target's -scale is applied to the one pack
    // that holds it, so a logit costs an fma and an exp2.
    const float offset = log2f(scale) - lse2;
    for (int c = threadIdx.x * kV; c < v_vec; c += blockDim.x * kV) {
      Pack<T, kV> p = load_pack<kV>(r + c);
      float g[kV];
#pragma unroll
      for (int k = 0; k < kV; ++k) g[k] = fast_exp2(fmaf(to_float(p.v[k]), kLog2e, offset));
      if (static_cast<unsigned>(t - c) < static_cast<unsigned>(kV)) {
#pragma unroll
        for (int k = 0; k < kV; ++k)
          if (c + k == t) g[k] -= scale;
      }
#pragma unroll
      for (int k = 0; k < kV; ++k) p.v[k] = from_float<T>(g[k]);
      store_pack<kV>(l + c, p);
    }
    for (int c = v_vec + threadIdx.x; c < V; c += blockDim.x) {
      const float g = fast_exp2(fmaf(to_float(r[c]), kLog2e, offset));
      l[c] = from_float<T>(c == t ? g - scale : g);
    }
  }

  if (loss_sum == nullptr) return;  // uniform over the grid
  if (!arrive_last(counter, gridDim.x, &last)) return;
  // The last block: sum every row's loss in a fixed order (strided per thread, then a fixed tree).
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += load_cg(losses + i);
  s = warp_sum_double(s);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) sd[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += sd[w];
    *loss_sum += total;
    *counter = 0;
  }
}

template <typename T, bool kGrad>
void launch(T* logits, int64_t ld, const int32_t* targets, float* losses, double* loss_sum,
            unsigned* counter, int64_t n, int64_t V, float scale, cudaStream_t stream) {
  TRAINER_CHECK(n >= 0 && V > 0 && V < (1 << 30) && ld >= V, "cross_entropy: n {} V {} ld {}", n, V,
                ld);
  TRAINER_CHECK(logits && targets && losses, "cross_entropy: null pointer");
  TRAINER_CHECK((loss_sum == nullptr) == (counter == nullptr),
                "cross_entropy: loss_sum and counter go together");
  TRAINER_CHECK(n < (int64_t{1} << 31), "cross_entropy: {} rows", n);
  TRAINER_CHECK(!kGrad || scale > 0, "cross_entropy: gradient scale {} (must be positive)", scale);
  if (n == 0) return;
  const int threads = V >= 16384 ? 512 : (V >= 1024 ? 256 : 128);
  const int Vi = static_cast<int>(V);
  const dim3 grid(static_cast<unsigned>(n));
  if (vector_width<T>({logits}, {ld}) != kPack<T>)
    return launch_dependent(cross_entropy_kernel<T, 1, kGrad, false>, grid, dim3(threads), 0,
                            stream, logits, ld, targets, losses, loss_sum, counter, n, Vi, scale);
  // Rows staged in shared memory up to GPT-2's vocabulary in bf16 (100.5 KB: two blocks per SM).
  constexpr int64_t kMaxStaged = 112 * 1024;
  const int64_t staged = ceil_div(V, kPack<T>) * kPack<T> * static_cast<int64_t>(sizeof(T));
  if (staged <= kMaxStaged && dependent_launch_supported()) {  // 9.0+, as the bulk copy needs
    auto* kernel = cross_entropy_kernel<T, kPack<T>, kGrad, true>;
    static std::atomic<uint64_t> configured{0};
    ensure_smem_limit(kernel, static_cast<int>(kMaxStaged), configured);
    return launch_dependent(kernel, grid, dim3(threads), static_cast<size_t>(staged), stream,
                            logits, ld, targets, losses, loss_sum, counter, n, Vi, scale);
  }
  launch_dependent(cross_entropy_kernel<T, kPack<T>, kGrad, false>, grid, dim3(threads), 0, stream,
                   logits, ld, targets, losses, loss_sum, counter, n, Vi, scale);
}

}  // namespace

void cross_entropy_forward(const float* logits, int64_t ld, const int32_t* targets, float* losses,
                           double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream) {
  // The forward-only instantiation never writes through the pointer.
  launch<float, false>(const_cast<float*>(logits), ld, targets, losses, loss_sum, counter, n, V,
                       0.0f, stream);
}
void cross_entropy_forward(const __nv_bfloat16* logits, int64_t ld, const int32_t* targets,
                           float* losses, double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream) {
  launch<__nv_bfloat16, false>(const_cast<__nv_bfloat16*>(logits), ld, targets, losses, loss_sum,
                               counter, n, V, 0.0f, stream);
}
void cross_entropy_forward(const __half* logits, int64_t ld, const int32_t* targets, float* losses,
                           double* loss_sum, unsigned* counter, int64_t n, int64_t V,
                           cudaStream_t stream) {
  launch<__half, false>(const_cast<__half*>(logits), ld, targets, losses, loss_sum, counter, n, V,
                        0.0f, stream);
}
void cross_entropy_forward_backward(float* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream) {
  launch<float, true>(logits, ld, targets, losses, loss_sum, counter, n, V, scale, stream);
}
void cross_entropy_forward_backward(__nv_bfloat16* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream) {
  launch<__nv_bfloat16, true>(logits, ld, targets, losses, loss_sum, counter, n, V, scale, stream);
}
void cross_entropy_forward_backward(__half* logits, int64_t ld, const int32_t* targets,
                                    float* losses, double* loss_sum, unsigned* counter, int64_t n,
                                    int64_t V, float scale, cudaStream_t stream) {
  launch<__half, true>(logits, ld, targets, losses, loss_sum, counter, n, V, scale, stream);
}

}  // namespace trainer::cuda
