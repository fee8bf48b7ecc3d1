// mlx/random.cpp's categorical_inverse_cdf for one row, as MLX's CPU backend computes it (its scalar exp
// polynomial, sequential sums): entries at -inf weigh 0 there and add nothing to a sum, so the kept tokens
// alone give the same bits. tests/unit/test_draw.py holds it to MLX's own draws.
#include "draw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace gk {

namespace {

// Threefry-2x32, 20 rounds, as mlx/random.cpp's threefry2x32_hash.
std::pair<uint32_t, uint32_t> threefry(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1) {
  static constexpr uint32_t kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t x = c0 + ks[0], y = c1 + ks[1];
  for (uint32_t i = 0; i < 5; ++i) {
    for (uint32_t r : kRot[i % 2]) {
      x += y;
      y = (y << r) | (y >> (32 - r));
      y ^= x;
    }
    x += ks[(i + 1) % 3];
    y += ks[(i + 2) % 3] + i + 1;
  }
  return {x, y};
}

// MLX's CPU exp (backend/cpu/simd/math.h on one lane): Cephes' polynomial for 2^fraction, the integer part
// in the exponent bits; floor(x + 0.5) runs in double there, as its scalar operator promotes.
float mlx_exp(float x_init) {
  const float x2 = x_init * 1.442695f;
  const float ipart = static_cast<float>(std::floor(static_cast<double>(x2) + 0.5));
  const float fpart = x2 - ipart;
  float p = 1.535336188319500e-4f;
  for (float c : {1.339887440266574e-3f, 9.618437357674640e-3f, 5.550332471162809e-2f, 2.402264791363012e-1f,
                  6.931472028550421e-1f, 1.000000000000000f})
    p = std::fma(p, fpart, c);
  const int32_t bits = (static_cast<int32_t>(ipart) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float r = std::isnan(x_init) ? x_init : scale * p;
  if (x_init > 88.0f) r = std::numeric_limits<float>::infinity();
  if (x_init < -88.0f) r = 0.0f;
  return r;
}

// mx.random.uniform((1,), key): RandomBits of one element hashes counters (0, 0); / 2^32, kept below one.
float uniform_one(uint32_t k0, uint32_t k1) {
  const float bits = static_cast<float>(threefry(k0, k1, 0, 0).first);
  return std::min(bits / static_cast<float>(UINT32_MAX), std::nextafter(1.0f, 0.0f));
}

}  // namespace

std::array<uint32_t, 4> split_key(uint32_t k0, uint32_t k1) {
  // RandomBits((2, 2)): 4 elements hashed in pairs (0, 2) and (1, 3); the rows are the two keys
  const auto a = threefry(k0, k1, 0, 2), b = threefry(k0, k1, 1, 3);
  return {a.first, b.first, a.second, b.second};
}

int64_t categorical_at(uint32_t k0, uint32_t k1, int64_t n, const int64_t* idx, const float* vals, int64_t m) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < m; ++j) top = std::max(top, vals[j]);
  // cdf, exclusive: every position from just after kept token j-1 up to token j holds partial[j]
  std::vector<float> partial(static_cast<size_t>(m) + 1);
  float total = 0.0f;
  for (int64_t j = 0; j < m; ++j) {
    partial[j] = total;
    total += mlx_exp(vals[j] - top);
  }
  partial[m] = total;
  const float u = uniform_one(k0, k1) * total;
  // searchsorted(cdf, u, "right") - 1: the last position whose cdf is <= u
  const int64_t j = std::upper_bound(partial.begin(), partial.end(), u) - partial.begin() - 1;
  return j < m ? idx[j] : n - 1;
}

}  // namespace gk
