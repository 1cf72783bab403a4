// RMSNorm kernels (see rmsnorm.cuh for the math). One warp per row for the row-wise parts; the
// gain gradient is a column reduction done in row groups and finished deterministically.
// Backward reads x and dy from memory once where it can (vector widths, d <= 1490): a fused kernel
// computes dx row by row and sums dy * x * r over its block's rows in shared memory, then a tiny
// kernel adds the blocks' sums in block order. Otherwise separate dx and dw kernels each stream x
// and dy. Blocks and batches depend on n and d only, so dw is the same on every GPU.
#include <algorithm>
#include <atomic>

#include "model/cuda/common.cuh"
#include "model/cuda/rmsnorm.cuh"

namespace trainer::cuda {
namespace {

constexpr int kMaxGroups = 128;  // row groups of the dw reduction (partial sums per column)
constexpr int kRowsY = 8;        // threadIdx.y extent of the dw kernel
// Fused backward: rows per batch (one per warp) and blocks at most (blocks of partial sums).
constexpr int kFusedRows = 16;
constexpr int kFusedThreads = kFusedRows * kWarp;
constexpr int kMaxFusedBlocks = 256;
// Its shared memory, (kFusedRows + 1) * d floats (fused_smem_bytes), at most: 99 KB is what sm_86
// and sm_89 allow a block, so the choice of kernel never depends on the GPU (d <= 1490).
constexpr int64_t kMaxFusedSmem = 99 * 1024;
int64_t fused_smem_bytes(int64_t d) { return (kFusedRows + 1) * d * int64_t{sizeof(float)}; }

// forward: r = 1/sqrt(mean(x^2) + eps); y = x * r * w. One warp per row. With kCached > 0 the
// lane's packs of the row (at most kCached: d <= kCached * 32 * kV) are loaded at once and kept
// in registers for the second pass, so that a row's loads are all in flight together and x is
// read once; otherwise the second pass reads x again. Either way each lane adds its squares in
// the same order, so the results are the same bits.
template <typename T, int kV, int kCached>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       T* __restrict__ y, float* __restrict__ rstd, int64_t n,
                                       int d, float eps) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;  // whole warps leave together
  const T* xr = x + row * d;
  T* yr = y + row * d;
  auto out = [&](int c, const Pack<T, kV>& xp, float r) {
    const Pack<T, kV> wp = load_pack<kV>(w + c);
    Pack<T, kV> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_float<T>(to_float(xp.v[k]) * r * to_float(wp.v[k]));
    store_pack<kV>(yr + c, o);
  };
  float ss = 0.0f;
  if constexpr (kCached > 0) {
    Pack<T, kV> xp[kCached];
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      const int c = (lane + i * kWarp) * kV;
      if (c < d) xp[i] = load_pack<kV>(xr + c);
    }
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      if ((lane + i * kWarp) * kV < d) {
#pragma unroll
        for (int k = 0; k < kV; ++k) ss += to_float(xp[i].v[k]) * to_float(xp[i].v[k]);
      }
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    if (lane == 0 && rstd) rstd[row] = r;
#pragma unroll
    for (int i = 0; i < kCached; ++i) keep_packed(xp[i]);
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      const int c = (lane + i * kWarp) * kV;
      if (c < d) out(c, xp[i], r);
    }
  } else {
    for (int c = lane * kV; c < d; c += kWarp * kV) {
      const Pack<T, kV> p = load_pack<kV>(xr + c);
#pragma unroll
      for (int k = 0; k < kV; ++k) ss += to_float(p.v[k]) * to_float(p.v[k]);
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    if (lane == 0 && rstd) rstd[row] = r;
    for (int c = lane * kV; c < d; c += kWarp * kV) out(c, load_pack<kV>(xr + c), r);
  }
}

// backward, input gradient of one row, by one warp: m = mean(x * w * dy);
// dx (+)= r * (w * dy - x * r^2 * m). `each(c, xp, gp)` sees the row's x and dy at columns
// [c, c + kV) as they go by (the fused kernel's dw products).
template <typename T, int kV, typename Each>
__device__ __forceinline__ void backward_row(const T* __restrict__ xr, const T* __restrict__ w,
                                             float r, const T* __restrict__ dyr,
                                             T* __restrict__ dxr, bool accumulate, int d, int lane,
                                             Each each) {
  float dot = 0.0f;
  for (int c = lane * kV; c < d; c += kWarp * kV) {
    const Pack<T, kV> xp = load_pack<kV>(xr + c);
    const Pack<T, kV> wp = load_pack<kV>(w + c);
    const Pack<T, kV> gp = load_pack<kV>(dyr + c);
#pragma unroll
    for (int k = 0; k < kV; ++k) dot += to_float(xp.v[k]) * to_float(wp.v[k]) * to_float(gp.v[k]);
  }
  const float mean = warp_sum(dot) / static_cast<float>(d);
  const float r2m = r * r * mean;
  for (int c = lane * kV; c < d; c += kWarp * kV) {
    const Pack<T, kV> xp = load_pack<kV>(xr + c);
    const Pack<T, kV> wp = load_pack<kV>(w + c);
    const Pack<T, kV> gp = load_pack<kV>(dyr + c);
    Pack<T, kV> o;
    if (accumulate) o = load_pack<kV>(dxr + c);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      float g = r * (to_float(wp.v[k]) * to_float(gp.v[k]) - to_float(xp.v[k]) * r2m);
      if (accumulate) g += to_float(o.v[k]);
      o.v[k] = from_float<T>(g);
    }
    store_pack<kV>(dxr + c, o);
    each(c, xp, gp);
  }
}

// backward, input gradient alone: one warp per row.
template <typename T, int kV>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                           const float* __restrict__ rstd, const T* __restrict__ dy,
                                           T* __restrict__ dx, bool accumulate, int64_t n, int d) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  backward_row<T, kV>(x + row * d, w, rstd[row], dy + row * d, dx + row * d, accumulate, d, lane,
                      [](int, const Pack<T, kV>&, const Pack<T, kV>&) {});
}

// backward, gain gradient: dw[c] += sum_i dy[i,c] * x[i,c] * r_i.
// Block (32, kRowsY) = one column tile of 32*kV columns x one row group. Each group writes its
// column sums to partial[group]; the last group to finish a tile adds the partials of every group
// in group order, so the result is deterministic.
template <typename T, int kV, typename DW>
__global__ void rmsnorm_backward_dw_kernel(const T* __restrict__ x, const float* __restrict__ rstd,
                                           const T* __restrict__ dy, DW* __restrict__ dw,
                                           bool accumulate, int64_t n, int d,
                                           int64_t rows_per_group, float* __restrict__ partial,
                                           unsigned* __restrict__ counters) {
  __shared__ float red[kRowsY][kWarp * kV];
  __shared__ bool last;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kWarp + tx) * kV;
  const int64_t r0 = blockIdx.y * rows_per_group;
  const int64_t r1 = min(n, r0 + rows_per_group);
  float acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.0f;
  if (c < d) {
#pragma unroll 4
    for (int64_t i = r0 + ty; i < r1; i += kRowsY) {
      const float r = rstd[i];
      const Pack<T, kV> xp = load_pack<kV>(x + i * d + c);
      const Pack<T, kV> gp = load_pack<kV>(dy + i * d + c);
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] += to_float(gp.v[k]) * to_float(xp.v[k]) * r;
    }
  }
#pragma unroll
  for (int k = 0; k < kV; ++k) red[ty][tx * kV + k] = acc[k];
  __syncthreads();
  if (ty == 0 && c < d) {
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      float s = 0.0f;
      for (int j = 0; j < kRowsY; ++j) s += red[j][tx * kV + k];
      partial[blockIdx.y * static_cast<int64_t>(d) + c + k] = s;
    }
  }
  if (!arrive_last(&counters[blockIdx.x], gridDim.y, &last)) return;
    // The last group of this tile: thread (tx, ty) sums groups ty, ty + kRowsY, ...; then row 0 of
    // the block adds the kRowsY sums in order.
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = 0.0f;
  if (c < d)
#pragma unroll 4  // 4 groups' loads in flight: this tail is a chain of L2 round trips
    for (unsigned g = ty; g < gridDim.y; g += kRowsY) {
      const float* p = partial + static_cast<int64_t>(g) * d + c;
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] += load_cg(p + k);  // kV loads in flight per group
    }
#pragma unroll
  for (int k = 0; k < kV; ++k) red[ty][tx * kV + k] = acc[k];
  __syncthreads();
  if (ty == 0 && c < d) {
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      float s = 0.0f;
      for (int j = 0; j < kRowsY; ++j) s += red[j][tx * kV + k];
      dw[c + k] = from_float<DW>(accumulate ? to_float(dw[c + k]) + s : s);
    }
  }
  if (tx == 0 && ty == 0) counters[blockIdx.x] = 0;
}

// backward, both gradients in one pass over x and dy. Block = kFusedRows warps; it owns
// rows_per_block rows (a multiple of kFusedRows) and takes them kFusedRows at a time, one per warp.
// dx is computed by the same backward_row as rmsnorm_backward_dx_kernel's (bit-identical). Each
// warp also writes its row's dy * x * r to prod[warp]; then each thread adds the batch's rows of
// its columns in row order to acc. The block's column sums go to partial[block], which
// rmsnorm_dw_finish_kernel adds up. Shared memory: prod[kFusedRows][d], acc[d].
template <typename T, int kV>
__global__ void __launch_bounds__(kFusedThreads)
    rmsnorm_backward_fused_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                  const float* __restrict__ rstd, const T* __restrict__ dy,
                                  T* __restrict__ dx, bool accumulate, int64_t n, int d,
                                  int64_t rows_per_block, float* __restrict__ partial) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  static_assert(kV % 4 == 0, "prod is written in 16-byte stores");
  extern __shared__ __align__(16) float smem[];
  float* prod = smem;
  float* acc = smem + kFusedRows * d;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* pw = prod + warp * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) acc[c] = 0.0f;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(n, r0 + rows_per_block);
  for (int64_t b0 = r0; b0 < r1; b0 += kFusedRows) {
    const int64_t row = b0 + warp;
    if (row < r1) {
      const float r = rstd[row];
      backward_row<T, kV>(x + row * d, w, r, dy + row * d, dx + row * d, accumulate, d, lane,
                          [&](int c, const Pack<T, kV>& xp, const Pack<T, kV>& gp) {
#pragma unroll
                            for (int k = 0; k < kV; k += 4) {
                              Pack<float, 4> p;
#pragma unroll
                              for (int j = 0; j < 4; ++j)
                                p.v[j] = to_float(gp.v[k + j]) * to_float(xp.v[k + j]) * r;
                              store_pack<4>(pw + c + k, p);
                            }
                          });
    } else {
      // No row for this warp in the last batch: zeros keep the column sums' order fixed.
      for (int c = lane; c < d; c += kWarp) pw[c] = 0.0f;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kFusedRows; ++j) s += prod[j * d + c];
      acc[c] += s;
    }
    __syncthreads();  // prod is rewritten by the next batch
  }
  float* out = partial + static_cast<int64_t>(blockIdx.x) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[c] = acc[c];
}

// dw (+)= the sum of the fused kernel's `blocks` partial column sums, in block order. Block
// (32, 32) = 32 columns: thread (tx, ty) sums blocks ty, ty + 32, ...; then row 0 adds the 32 sums.
template <typename DW>
__global__ void rmsnorm_dw_finish_kernel(const float* __restrict__ partial, DW* __restrict__ dw,
                                         bool accumulate, int blocks, int d) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  __shared__ float red[kWarp][kWarp + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kWarp + tx;
  float s = 0.0f;
  if (c < d)
#pragma unroll 4  // independent loads in flight
    for (int g = ty; g < blocks; g += kWarp) s += partial[static_cast<int64_t>(g) * d + c];
  red[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < d) {
    float t = 0.0f;
    for (int j = 0; j < kWarp; ++j) t += red[j][tx];
    dw[c] = from_float<DW>(accumulate ? to_float(dw[c]) + t : t);
  }
}

template <typename T>
void forward_impl(const T* x, const T* w, T* y, float* rstd, int64_t n, int64_t d, float eps,
                  cudaStream_t stream) {
  TRAINER_CHECK(n >= 0 && d > 0 && d < (1 << 30), "rmsnorm_forward: n {} d {}", n, d);
  TRAINER_CHECK(x && w && y, "rmsnorm_forward: null pointer");
  if (n == 0) return;
  const int threads = 256, rows_per_block = threads / kWarp;
  const int64_t blocks = ceil_div(n, rows_per_block);
  const int di = static_cast<int>(d);
  auto run = [&](auto kernel) {
    launch_dependent(kernel, dim3(blocks), dim3(threads), 0, stream, x, w, y, rstd, n, di, eps);
  };
  // Rows of up to 4, 8 or 12 packs per lane stay in registers (bf16: d <= 1024, 2048, 3072:
  // every preset's); the fewer the registers held, the more warps per SM.
  const int64_t packs = ceil_div(d, kWarp * kPack<T>);
  if (vector_width<T>({x, w, y}, {d}) != kPack<T>)
    run(rmsnorm_forward_kernel<T, 1, 0>);
  else if (packs <= 4)
    run(rmsnorm_forward_kernel<T, kPack<T>, 4>);
  else if (packs <= 8)
    run(rmsnorm_forward_kernel<T, kPack<T>, 8>);
  else if (packs <= 12)
    run(rmsnorm_forward_kernel<T, kPack<T>, 12>);
  else
    run(rmsnorm_forward_kernel<T, kPack<T>, 0>);
}

template <typename T, int kV, typename DW>
void launch_dw(const T* x, const float* rstd, const T* dy, DW* dw, bool accumulate, int64_t n,
               int64_t d, RmsnormScratch s, cudaStream_t stream) {
  const int64_t tiles = ceil_div(d, kWarp * kV);
  // About 1024 blocks in all (8 per SM: the column sums are a stream of loads, which needs many
  // in flight), at most kMaxGroups groups, and at least 32 rows per group (4 per thread), so that
  // the last block's pass over the groups' partials stays short when there are few rows.
  int64_t groups = std::clamp<int64_t>(ceil_div(1024, tiles), 1, kMaxGroups);
  groups = std::min(groups, std::max<int64_t>(1, ceil_div(n, 32)));
  const int64_t rows_per_group = ceil_div(n, groups);
  groups = ceil_div(n, rows_per_group);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(groups));
  const dim3 block(kWarp, kRowsY);
  rmsnorm_backward_dw_kernel<T, kV, DW><<<grid, block, 0, stream>>>(
      x, rstd, dy, dw, accumulate, n, static_cast<int>(d), rows_per_group, s.partial, s.counters);
  CUDA_CHECK_LAUNCH("rmsnorm_backward_dw_kernel");
}

// The fused backward and its dw finish. Rows per block: a multiple of kFusedRows giving at most
// kMaxFusedBlocks blocks (more rows per block would mean more partials to add at the end).
template <typename T, int kV, typename DW>
void launch_fused(const T* x, const T* w, const float* rstd, const T* dy, T* dx, bool accumulate,
                  DW* dw, bool accumulate_dw, int64_t n, int64_t d, RmsnormScratch s,
                  cudaStream_t stream) {
  const int64_t rows_per_block = std::max<int64_t>(
      kFusedRows, ceil_div(ceil_div(n, kMaxFusedBlocks), kFusedRows) * kFusedRows);
  const int64_t blocks = ceil_div(n, rows_per_block);
  const auto bytes = static_cast<size_t>(fused_smem_bytes(d));
  static std::atomic<uint64_t> configured{0};
  ensure_smem_limit(rmsnorm_backward_fused_kernel<T, kV>, static_cast<int>(kMaxFusedSmem),
                    configured);
  const int di = static_cast<int>(d);
  launch_dependent(rmsnorm_backward_fused_kernel<T, kV>, dim3(blocks), dim3(kFusedThreads), bytes,
                   stream, x, w, rstd, dy, dx, accumulate, n, di, rows_per_block, s.partial);
  launch_dependent(rmsnorm_dw_finish_kernel<DW>, dim3(ceil_div(d, kWarp)), dim3(kWarp, kWarp), 0,
                   stream, s.partial, dw, accumulate_dw, static_cast<int>(blocks), di);
}

template <typename T, typename DW>
void backward_impl(const T* x, const T* w, const float* rstd, const T* dy, T* dx, bool accumulate,
                   DW* dw, bool accumulate_dw, int64_t n, int64_t d, RmsnormScratch s,
                   cudaStream_t stream) {
  TRAINER_CHECK(n >= 0 && d > 0 && d < (1 << 30), "rmsnorm_backward: n {} d {}", n, d);
  TRAINER_CHECK(x && w && rstd && dy && dx && dw && s.partial && s.counters,
                "rmsnorm_backward: null pointer");
  TRAINER_CHECK(dx != dy && dx != x, "rmsnorm_backward: dx aliases an input");
  if (n == 0) return;
  const int threads = 256, rows_per_block = threads / kWarp;
  const int64_t blocks = ceil_div(n, rows_per_block);
  const int di = static_cast<int>(d);
  const bool vec = vector_width<T>({x, w, dy, dx, s.partial}, {d}) == kPack<T>;
  if (vec && fused_smem_bytes(d) <= kMaxFusedSmem) {
    launch_fused<T, kPack<T>, DW>(x, w, rstd, dy, dx, accumulate, dw, accumulate_dw, n, d, s,
                                  stream);
    return;
  }
  if (vec)
    rmsnorm_backward_dx_kernel<T, kPack<T>>
        <<<blocks, threads, 0, stream>>>(x, w, rstd, dy, dx, accumulate, n, di);
  else
    rmsnorm_backward_dx_kernel<T, 1>
        <<<blocks, threads, 0, stream>>>(x, w, rstd, dy, dx, accumulate, n, di);
  CUDA_CHECK_LAUNCH("rmsnorm_backward_dx_kernel");
  if (vec)
    launch_dw<T, kPack<T>, DW>(x, rstd, dy, dw, accumulate_dw, n, d, s, stream);
  else
    launch_dw<T, 1, DW>(x, rstd, dy, dw, accumulate_dw, n, d, s, stream);
}

}  // namespace

int64_t rmsnorm_backward_partial_floats(int64_t d) {
  return std::max(kMaxGroups, kMaxFusedBlocks) * d;
}
int64_t rmsnorm_backward_counters(int64_t d) { return ceil_div(d, kWarp); }

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t n, int64_t d,
                     float eps, cudaStream_t stream) {
  forward_impl(x, w, y, rstd, n, d, eps, stream);
}
void rmsnorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, float* rstd,
                     int64_t n, int64_t d, float eps, cudaStream_t stream) {
  forward_impl(x, w, y, rstd, n, d, eps, stream);
}
void rmsnorm_forward(const __half* x, const __half* w, __half* y, float* rstd, int64_t n, int64_t d,
                     float eps, cudaStream_t stream) {
  forward_impl(x, w, y, rstd, n, d, eps, stream);
}
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                      bool accumulate_dx, float* dw, bool accumulate_dw, int64_t n, int64_t d,
                      RmsnormScratch scratch, cudaStream_t stream) {
  backward_impl(x, w, rstd, dy, dx, accumulate_dx, dw, accumulate_dw, n, d, scratch, stream);
}
void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, bool accumulate_dx, float* dw,
                      bool accumulate_dw, int64_t n, int64_t d, RmsnormScratch scratch,
                      cudaStream_t stream) {
  backward_impl(x, w, rstd, dy, dx, accumulate_dx, dw, accumulate_dw, n, d, scratch, stream);
}
void rmsnorm_backward(const __half* x, const __half* w, const float* rstd, const __half* dy,
                      __half* dx, bool accumulate_dx, float* dw, bool accumulate_dw, int64_t n,
                      int64_t d, RmsnormScratch scratch, cudaStream_t stream) {
  backward_impl(x, w, rstd, dy, dx, accumulate_dx, dw, accumulate_dw, n, d, scratch, stream);
}
void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, bool accumulate_dx,
                      __nv_bfloat16* dw, bool accumulate_dw, int64_t n, int64_t d,
                      RmsnormScratch scratch, cudaStream_t stream) {
  backward_impl(x, w, rstd, dy, dx, accumulate_dx, dw, accumulate_dw, n, d, scratch, stream);
}

}  // namespace trainer::cuda
