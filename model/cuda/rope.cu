// RoPE and attention-operand layout changes (see rope.cuh for the math).
#include <algorithm>
#include <cmath>

#include "model/cuda/common.cuh"
#include "model/cuda/rope.cuh"

namespace trainer::cuda {
namespace {

// Entry `job` of one of RopeJobs' arrays, indexed by constants only: indexing a kernel parameter's
// array with a runtime value (the block's job) would copy it to local memory in every thread.
template <typename E>
__device__ __forceinline__ E job_entry(const E (&entries)[3], int job) {
  return job == 0 ? entries[0] : job == 1 ? entries[1] : entries[2];
}

// forward:  (x0, x1) -> (x0 c - x1 s, x0 s + x1 c)
// backward: (g0, g1) -> (g0 c + g1 s, -g0 s + g1 c)   (the same with s negated)
// One thread moves kV consecutive channels (kV/2 pairs) of one head, in kRows rows of one job
// (its loads issued together, so that enough bytes are in flight for a copy-like kernel).
// Threads (x: packs of a head, y: heads, z: rows), blocks (x: row groups, y: head groups, z: job):
// the indices need no division but one 32-bit split of each row into (b, t).
template <typename T, int kV, int kRows>
__global__ void rope_kernel(RopeJobs<T> jobs, bool in_head_major, int64_t ld_in,
                            bool out_head_major, int64_t ld_out, int64_t n, int T_, int H, int dh,
                            const float2* __restrict__ table, bool inverse) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  const int job = blockIdx.z;
  const T* in = job_entry(jobs.in, job);
  T* out = job_entry(jobs.out, job);
  const bool rotate = job_entry(jobs.rotate, job);
  const int h = blockIdx.y * blockDim.y + threadIdx.y;
  if (h >= H) return;
  const int e = threadIdx.x * kV;
  const int c = h * dh + e;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows * blockDim.z + threadIdx.z;
  Pack<T, kV> x[kRows];
  int t[kRows];
  int64_t dst[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int64_t row = row0 + static_cast<int64_t>(u) * blockDim.z;
    t[u] = -1;
    if (row >= n) continue;
    const unsigned b = static_cast<unsigned>(row) / static_cast<unsigned>(T_);  // n < 2^31
    t[u] = static_cast<int>(static_cast<unsigned>(row) - b * static_cast<unsigned>(T_));
    const int64_t hm = ((static_cast<int64_t>(b) * H + h) * T_ + t[u]) * dh + e;  // head-major
    dst[u] = out_head_major ? hm : row * ld_out + c;
    x[u] = load_pack<kV>(in + (in_head_major ? hm : row * ld_in + c));
  }
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    if (t[u] < 0) continue;
    if (rotate) {
      const float2* cs = table + static_cast<int64_t>(t[u]) * (dh / 2) + e / 2;
#pragma unroll
      for (int p = 0; p < kV / 2; ++p) {
        const float2 r =
            rope_rotate_pair(cs[p], to_float(x[u].v[2 * p]), to_float(x[u].v[2 * p + 1]), inverse);
        x[u].v[2 * p] = from_float<T>(r.x);
        x[u].v[2 * p + 1] = from_float<T>(r.y);
      }
    }
    store_pack<kV>(out + dst[u], x[u]);
  }
}

// The flash path's case: token-major rows in and out at one row stride (q and k rotated in place
// in the projection's output). A thread rotates one 16-byte pack of kRows consecutive rows, its
// loads issued together, with the table's (cos, sin) pairs read as float4s. rope_kernel, which
// also works out head-major offsets, holds 64 registers and ran this case at 41% occupancy; this
// one at 36 registers (kRows 2) takes 15% less time (Nsight Compute, small 16 x 1024, one H100).
template <typename T, int kRows>
__global__ void rope_rows_kernel(RopeJobs<T> jobs, int64_t ld, int n, int T_, int d, int dh,
                                 const float4* __restrict__ table, bool inverse) {
  wait_for_prior_grid();  // launched dependent on the kernel before it (common.cuh)
  constexpr int kV = kPack<T>;
  const int job = blockIdx.y;
  const T* in = job_entry(jobs.in, job);
  T* out = job_entry(jobs.out, job);
  const auto packs = static_cast<unsigned>(d / kV);
  const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned group = idx / packs;
  const int c = static_cast<int>(idx - group * packs) * kV;
  const int row0 = static_cast<int>(group) * kRows;
  if (row0 >= n) return;
  const int e = c % dh;
  Pack<T, kV> x[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u)
    if (row0 + u < n) x[u] = load_pack<kV>(in + static_cast<int64_t>(row0 + u) * ld + c);
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int row = row0 + u;
    if (row >= n) break;
    const int t = row % T_;
    // Pairs e/2 .. e/2 + kV/2 - 1 of position t: an even float2 index, so float4-aligned.
    const float4* cs = table + (t * (dh / 2) + e / 2) / 2;
#pragma unroll
    for (int q = 0; q < kV / 4; ++q) {
      const float4 w = cs[q];
      const float2 r0 = rope_rotate_pair(make_float2(w.x, w.y), to_float(x[u].v[4 * q]),
                                         to_float(x[u].v[4 * q + 1]), inverse);
      const float2 r1 = rope_rotate_pair(make_float2(w.z, w.w), to_float(x[u].v[4 * q + 2]),
                                         to_float(x[u].v[4 * q + 3]), inverse);
      x[u].v[4 * q] = from_float<T>(r0.x);
      x[u].v[4 * q + 1] = from_float<T>(r0.y);
      x[u].v[4 * q + 2] = from_float<T>(r1.x);
      x[u].v[4 * q + 3] = from_float<T>(r1.y);
    }
    store_pack<kV>(out + static_cast<int64_t>(row) * ld + c, x[u]);
  }
}

template <typename T>
void rope_impl(const RopeJobs<T>& jobs, QkvLayout in_layout, int64_t ld_in, QkvLayout out_layout,
               int64_t ld_out, int64_t B, int64_t T_, int64_t H, int64_t dh, const float* table,
               bool inverse, cudaStream_t stream) {
  const int64_t d = H * dh, n = B * T_;
  const bool in_hm = in_layout == QkvLayout::kHeadMajor;
  const bool out_hm = out_layout == QkvLayout::kHeadMajor;
  TRAINER_CHECK(jobs.count >= 0 && jobs.count <= 3, "rope: {} jobs", jobs.count);
  TRAINER_CHECK(B >= 0 && T_ > 0 && H > 0 && dh > 0 && dh % 2 == 0 && d < (1 << 30),
                "rope: B {} T {} H {} head_dim {}", B, T_, H, dh);
  TRAINER_CHECK((in_hm || ld_in >= d) && (out_hm || ld_out >= d),
                "rope: row strides {} / {} below d {}", ld_in, ld_out, d);
  bool any_rotate = false, all_rotate = true;
  for (int j = 0; j < jobs.count; ++j) {
    TRAINER_CHECK(jobs.in[j] && jobs.out[j], "rope: null pointer in job {}", j);
    any_rotate = any_rotate || jobs.rotate[j];
    all_rotate = all_rotate && jobs.rotate[j];
  }
  TRAINER_CHECK(!any_rotate || table, "rope: rotation without a cos/sin table");
  if (n == 0 || jobs.count == 0) return;
  // 16-byte packs when every row start and head boundary allows it, else one pair per thread.
  bool wide =
      dh % kPack<T> == 0 && (in_hm || ld_in % kPack<T> == 0) && (out_hm || ld_out % kPack<T> == 0);
  for (int j = 0; j < jobs.count; ++j)
    wide = wide && vector_width<T>({jobs.in[j], jobs.out[j]}, {}) == kPack<T>;
  if (wide && !in_hm && !out_hm && ld_in == ld_out && all_rotate && dh % 4 == 0 &&
      n * d < (int64_t{1} << 31)) {
    constexpr int kRows = 2;
    const int64_t threads = ceil_div(n, kRows) * (d / kPack<T>);
    const dim3 grid(static_cast<unsigned>(ceil_div(threads, 256)),
                    static_cast<unsigned>(jobs.count));
    return launch_dependent(rope_rows_kernel<T, kRows>, grid, dim3(256), 0, stream, jobs, ld_in,
                            static_cast<int>(n), static_cast<int>(T_), static_cast<int>(d),
                            static_cast<int>(dh), reinterpret_cast<const float4*>(table), inverse);
  }
  const int vec = wide ? kPack<T> : 2;
  // About 256 threads a block: a head's packs, as many heads as fit (split evenly), then rows.
  const int64_t bx = dh / vec;
  TRAINER_CHECK(bx <= 1024 && n < (int64_t{1} << 31), "rope: head_dim {} or {} rows too large", dh,
                n);
  const int64_t splits = ceil_div(H, std::max<int64_t>(1, 256 / bx));
  const int64_t hy = ceil_div(H, splits);
  const int64_t rz = std::clamp<int64_t>(256 / (bx * hy), 1, 64);
  const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(hy), static_cast<unsigned>(rz));
  constexpr int kRows = 4;
  const dim3 grid(static_cast<unsigned>(ceil_div(n, rz * kRows)), static_cast<unsigned>(splits),
                  static_cast<unsigned>(jobs.count));
  const auto* t2 = reinterpret_cast<const float2*>(table);
  const int Ti = static_cast<int>(T_), Hi = static_cast<int>(H), dhi = static_cast<int>(dh);
  if (wide)
    launch_dependent(rope_kernel<T, kPack<T>, kRows>, grid, block, 0, stream, jobs, in_hm, ld_in,
                     out_hm, ld_out, n, Ti, Hi, dhi, t2, inverse);
  else
    launch_dependent(rope_kernel<T, 2, kRows>, grid, block, 0, stream, jobs, in_hm, ld_in, out_hm,
                     ld_out, n, Ti, Hi, dhi, t2, inverse);
}

template <typename T>
void relayout(const T* in, T* out, QkvLayout from, QkvLayout to, int64_t B, int64_t T_, int64_t H,
              int64_t dh, cudaStream_t stream) {
  RopeJobs<T> jobs;
  jobs.add(in, out, false);
  rope_impl(jobs, from, H * dh, to, H * dh, B, T_, H, dh, nullptr, false, stream);
}

}  // namespace

std::vector<float> rope_table(int64_t ctx, int64_t head_dim, double theta) {
  TRAINER_CHECK(ctx > 0 && head_dim > 0 && head_dim % 2 == 0, "rope_table: ctx {} head_dim {}", ctx,
                head_dim);
  const int64_t half = head_dim / 2;
  std::vector<float> table(static_cast<size_t>(2 * ctx * half));
  for (int64_t j = 0; j < half; ++j) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(j) / head_dim);
    for (int64_t t = 0; t < ctx; ++t) {
      table[2 * (t * half + j)] = static_cast<float>(std::cos(static_cast<double>(t) * freq));
      table[2 * (t * half + j) + 1] = static_cast<float>(std::sin(static_cast<double>(t) * freq));
    }
  }
  return table;
}

void rope(const RopeJobs<float>& jobs, QkvLayout in_layout, int64_t ld_in, QkvLayout out_layout,
          int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim, const float* table,
          bool inverse, cudaStream_t stream) {
  rope_impl(jobs, in_layout, ld_in, out_layout, ld_out, B, T, H, head_dim, table, inverse, stream);
}
void rope(const RopeJobs<__nv_bfloat16>& jobs, QkvLayout in_layout, int64_t ld_in,
          QkvLayout out_layout, int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim,
          const float* table, bool inverse, cudaStream_t stream) {
  rope_impl(jobs, in_layout, ld_in, out_layout, ld_out, B, T, H, head_dim, table, inverse, stream);
}
void rope(const RopeJobs<__half>& jobs, QkvLayout in_layout, int64_t ld_in, QkvLayout out_layout,
          int64_t ld_out, int64_t B, int64_t T, int64_t H, int64_t head_dim, const float* table,
          bool inverse, cudaStream_t stream) {
  rope_impl(jobs, in_layout, ld_in, out_layout, ld_out, B, T, H, head_dim, table, inverse, stream);
}

void heads_to_head_major(const float* in, float* out, int64_t B, int64_t T, int64_t H,
                         int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kTokenMajor, QkvLayout::kHeadMajor, B, T, H, head_dim, stream);
}
void heads_to_head_major(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t B, int64_t T,
                         int64_t H, int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kTokenMajor, QkvLayout::kHeadMajor, B, T, H, head_dim, stream);
}
void heads_to_head_major(const __half* in, __half* out, int64_t B, int64_t T, int64_t H,
                         int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kTokenMajor, QkvLayout::kHeadMajor, B, T, H, head_dim, stream);
}
void heads_to_token_major(const float* in, float* out, int64_t B, int64_t T, int64_t H,
                          int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kHeadMajor, QkvLayout::kTokenMajor, B, T, H, head_dim, stream);
}
void heads_to_token_major(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t B, int64_t T,
                          int64_t H, int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kHeadMajor, QkvLayout::kTokenMajor, B, T, H, head_dim, stream);
}
void heads_to_token_major(const __half* in, __half* out, int64_t B, int64_t T, int64_t H,
                          int64_t head_dim, cudaStream_t stream) {
  relayout(in, out, QkvLayout::kHeadMajor, QkvLayout::kTokenMajor, B, T, H, head_dim, stream);
}

}  // namespace trainer::cuda
