// One-row dot products, one thread, weights warm in L2: gmlx's int16 kernels (qdot.h, as the extension compiles
// them for AVX2) against llama.cpp's own ggml_vec_dot_* linked from its build. bench/kernel_vs_ggml.py builds
// and runs this; it prints "<format> <gmlx ns a 256 elements> <ggml ns a 256 elements>".
#define GK_ISA avx2
#define GK_ISA_NAME "avx2"
#include "isa_impl.h"
#include "repack.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
void ggml_cpu_init(void);
void quantize_row_q8_0(const float* x, void* y, int64_t k);
void quantize_row_q8_1(const float* x, void* y, int64_t k);
void quantize_row_q8_K(const float* x, void* y, int64_t k);
void ggml_vec_dot_q4_0_q8_0(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q4_1_q8_1(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q5_0_q8_0(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q8_0_q8_0(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q4_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q5_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q6_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
}

namespace {

using Dot = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
using Quant = void (*)(const float*, void*, int64_t);

struct Format {
  const char* name;
  int type, qk, bytes;
  std::vector<int> fp16_at;  // the block's fp16 fields, given small finite values
  Dot dot;
  Quant quant;
};

const Format kFormats[] = {
    {"Q4_0", 2, 32, 18, {0}, ggml_vec_dot_q4_0_q8_0, quantize_row_q8_0},
    {"Q4_1", 3, 32, 20, {0, 2}, ggml_vec_dot_q4_1_q8_1, quantize_row_q8_1},
    {"Q5_0", 6, 32, 22, {0}, ggml_vec_dot_q5_0_q8_0, quantize_row_q8_0},
    {"Q8_0", 8, 32, 34, {0}, ggml_vec_dot_q8_0_q8_0, quantize_row_q8_0},
    {"Q4_K", 12, 256, 144, {0, 2}, ggml_vec_dot_q4_K_q8_K, quantize_row_q8_K},
    {"Q5_K", 13, 256, 176, {0, 2}, ggml_vec_dot_q5_K_q8_K, quantize_row_q8_K},
    {"Q6_K", 14, 256, 210, {208}, ggml_vec_dot_q6_K_q8_K, quantize_row_q8_K},
};

template <class Fn>
double best_ns(Fn&& fn, int reps) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void run(const Format& f, int64_t k, int64_t n, int reps) {
  std::mt19937 rng(1);
  const int64_t rb = k / f.qk * f.bytes;
  std::vector<uint8_t> w(static_cast<size_t>(rb * n));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t small = 0x2000;  // fp16 2^-7
  for (int64_t i = 0; i < n * (k / f.qk); ++i)
    for (int at : f.fp16_at) std::memcpy(w.data() + i * f.bytes + at, &small, 2);
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
  std::vector<float> y(static_cast<size_t>(n));

  // gmlx: the engine's one-row path (activations to int16, then the format's kernel); the K-quants as the
  // loader repacks them
  int type = f.type;
  const uint8_t* order = nullptr;
  std::vector<uint8_t> packed(w.size());
  const int64_t kblocks = n * (k / 256);
  if (f.type == 12) gk::repack_q4k(w.data(), packed.data(), kblocks), type = gk::kQ4KR, order = gk::kQ4KROrder.at;
  if (f.type == 13) gk::repack_q5k(w.data(), packed.data(), kblocks), type = gk::kQ5KR, order = gk::kQ5KROrder.at;
  if (f.type == 14) gk::repack_q6k(w.data(), packed.data(), kblocks), type = gk::kQ6KR, order = gk::kQ6KROrder.at;
  const uint8_t* gw = order != nullptr ? packed.data() : w.data();
  const int group = f.qk;
  std::vector<int16_t> q(static_cast<size_t>(k));
  std::vector<float> d(static_cast<size_t>(k / 32)), s(static_cast<size_t>(k / 32));
  const gk::XRows xr{q.data(), d.data(), s.data(), k};
  const double ours = best_ns([&] {
    gk::avx2::quantize_q16(x.data(), k, group, order, 0, xr);
    gk::avx2::rows_q16(type, gw, rb, 0, n, xr, 1, y.data(), n);
  }, reps);

  std::vector<uint8_t> xq(static_cast<size_t>(k * 2 + 1024));
  const double theirs = best_ns([&] {
    f.quant(x.data(), xq.data(), k);
    for (int64_t r = 0; r < n; ++r) f.dot(static_cast<int>(k), &y[r], 0, w.data() + r * rb, 0, xq.data(), 0, 1);
  }, reps);
  const double blocks = static_cast<double>(n * k) / 256.0;
  std::printf("%s %.2f %.2f\n", f.name, ours / blocks, theirs / blocks);
}

}  // namespace

int main(int argc, char** argv) {
  ggml_cpu_init();
  const std::string only = argc > 1 ? argv[1] : "";
  for (const Format& f : kFormats)
    if (only.empty() || only.find(f.name) != std::string::npos) run(f, 2048, 128, 2000);
  return 0;
}
