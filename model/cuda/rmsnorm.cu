// RMSNorm kernels (see rmsnorm.cuh for the math). One warp per row for the row-wise parts; the
// gain gradient is a column reduction done in row groups and finished deterministically.
#include <algorithm>

#include "model/cuda/common.cuh"
#include "model/cuda/rmsnorm.cuh"

namespace trainer::cuda {
namespace {

constexpr int kMaxGroups = 128;  // row groups of the dw reduction (partial sums per column)
constexpr int kRowsY = 8;        // threadIdx.y extent of the dw kernel

// forward: r = 1/sqrt(mean(x^2) + eps); y = x * r * w. One warp per row.
template <typename T, int kV>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       T* __restrict__ y, float* __restrict__ rstd, int64_t n,
                                       int d, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;  // whole warps leave together
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float ss = 0.0f;
  for (int c = lane * kV; c < d; c += kWarp * kV) {
    const Pack<T, kV> p = load_pack<kV>(xr + c);
#pragma unroll
    for (int k = 0; k < kV; ++k) ss += to_float(p.v[k]) * to_float(p.v[k]);
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (lane == 0 && rstd) rstd[row] = r;
  for (int c = lane * kV; c < d; c += kWarp * kV) {
    const Pack<T, kV> xp = load_pack<kV>(xr + c);
    const Pack<T, kV> wp = load_pack<kV>(w + c);
    Pack<T, kV> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_float<T>(to_float(xp.v[k]) * r * to_float(wp.v[k]));
    store_pack<kV>(yr + c, o);
  }
}

// backward, input gradient: m = mean(x * w * dy); dx (+)= r * (w * dy - x * r^2 * m).
// One warp per row.
template <typename T, int kV>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                           const float* __restrict__ rstd, const T* __restrict__ dy,
                                           T* __restrict__ dx, bool accumulate, int64_t n, int d) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const T* xr = x + row * d;
  const T* dyr = dy + row * d;
  T* dxr = dx + row * d;
  float dot = 0.0f;
  for (int c = lane * kV; c < d; c += kWarp * kV) {
    const Pack<T, kV> xp = load_pack<kV>(xr + c);
    const Pack<T, kV> wp = load_pack<kV>(w + c);
    const Pack<T, kV> gp = load_pack<kV>(dyr + c);
#pragma unroll
    for (int k = 0; k < kV; ++k) dot += to_float(xp.v[k]) * to_float(wp.v[k]) * to_float(gp.v[k]);
  }
  const float mean = warp_sum(dot) / static_cast<float>(d);
  const float r = rstd[row];
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
  }
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

template <typename T>
void forward_impl(const T* x, const T* w, T* y, float* rstd, int64_t n, int64_t d, float eps,
                  cudaStream_t stream) {
  TRAINER_CHECK(n >= 0 && d > 0 && d < (1 << 30), "rmsnorm_forward: n {} d {}", n, d);
  TRAINER_CHECK(x && w && y, "rmsnorm_forward: null pointer");
  if (n == 0) return;
  const int threads = 256, rows_per_block = threads / kWarp;
  const int64_t blocks = ceil_div(n, rows_per_block);
  const int di = static_cast<int>(d);
  if (vector_width<T>({x, w, y}, {d}) == kPack<T>)
    rmsnorm_forward_kernel<T, kPack<T>><<<blocks, threads, 0, stream>>>(x, w, y, rstd, n, di, eps);
  else
    rmsnorm_forward_kernel<T, 1><<<blocks, threads, 0, stream>>>(x, w, y, rstd, n, di, eps);
  CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
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

int64_t rmsnorm_backward_partial_floats(int64_t d) { return kMaxGroups * d; }
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
