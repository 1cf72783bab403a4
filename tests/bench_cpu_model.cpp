// Steps per second of the CPU reference on the tiny preset: forward + backward + a plain SGD
// update (p -= lr * g, then zero g) at batch 8 x ctx 64, for vocab 10000 and 256.
// Usage: OMP_NUM_THREADS=2 bench_cpu_model [steps=20] [warmup=3]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/config.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/replica.h"

using namespace trainer;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
  double fwd, bwd, upd, step;
};

void bench(int64_t vocab, int steps, int warmup) {
  ModelConfig c = preset("tiny");
  c.vocab = vocab;
  c.ctx = 64;
  const int64_t B = 8, T = c.ctx;
  const ParamLayout L(c);
  ReplicaOptions o;
  o.max_batch = B;
  o.flat_elems = L.total();
  auto replica = make_cpu_replica(c, o);
  std::vector<float> init(L.total());
  init_params(L, 1, init.data());
  replica->set_params(init.data());

  // Fixed pseudo-random tokens; targets are the inputs shifted by one, as in training.
  std::vector<int32_t> tokens(B * (T + 1));
  uint64_t s = 12345;
  for (auto& t : tokens) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      in[b * T + t] = tokens[b * (T + 1) + t];
      tg[b * T + t] = tokens[b * (T + 1) + t + 1];
    }
  const MicroBatch mb{in.data(), tg.data(), B, T};

  float* p = replica->params().as<float>();
  float* g = replica->grads().as<float>();
  const int64_t n = replica->params().count;
  const float lr = 1e-3f, scale = 1.0f / static_cast<float>(B * T);
  std::vector<Timing> times;
  float first_loss = 0, last_loss = 0;
  for (int it = 0; it < warmup + steps; ++it) {
    const double t0 = now_s();
    replica->forward(mb);
    const double t1 = now_s();
    replica->backward(scale, {});
    const double t2 = now_s();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      p[i] -= lr * g[i];
      g[i] = 0.0f;
    }
    const double t3 = now_s();
    const float loss = replica->take_loss();
    if (it == 0) first_loss = loss;
    last_loss = loss;
    if (it >= warmup) times.push_back({t1 - t0, t2 - t1, t3 - t2, t3 - t0});
  }
  auto median = [&](double Timing::*f) {
    std::vector<double> v;
    for (const Timing& t : times) v.push_back(t.*f);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double step = median(&Timing::step);
  const double flop = flops_per_token(c, T) * static_cast<double>(B * T);
  std::printf(
      "tiny vocab %6lld  batch %lld x ctx %lld  threads %d: %6.2f steps/s  (median step %.1f ms: "
      "fwd %.1f bwd %.1f update %.1f; %.1f GFLOP/s; loss %.3f -> %.3f; activations %.1f MiB)\n",
      static_cast<long long>(vocab), static_cast<long long>(B), static_cast<long long>(T),
      omp_get_max_threads(), 1.0 / step, step * 1e3, median(&Timing::fwd) * 1e3,
      median(&Timing::bwd) * 1e3, median(&Timing::upd) * 1e3, flop / step * 1e-9, first_loss,
      last_loss, static_cast<double>(replica->activation_bytes()) / (1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 3;
  if (steps <= 0 || warmup < 0) {
    std::fprintf(stderr, "usage: %s [steps > 0] [warmup >= 0]\n", argv[0]);
    return 2;
  }
  bench(10000, steps, warmup);
  bench(256, steps, warmup);
  return 0;
}
