// The per-row math GKRMSNorm, GKRoPE and GKHeads share, so a fused layer rounds exactly as the separate ops do.
#pragma once

#include <cmath>
#include <cstdint>

namespace gk {

// y = x * rsqrt(mean(x^2) + eps) (* w when w is given), the sum of squares in double
inline void norm_row(const float* x, const float* w, float eps, int64_t d, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
  if (w != nullptr) {
    for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * w[i];
  } else {
    for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv;
  }
}

// cos and sin of position `pos` (already scaled) over the half-width periods
inline void rope_angles(float pos, const float* periods, int half, float* c, float* s) {
  for (int i = 0; i < half; ++i) {
    const float theta = pos / periods[i];
    c[i] = std::cos(theta);
    s[i] = std::sin(theta);
  }
}

// One head's row rotated over its first `dims` features (pairs 2i, 2i + 1 when traditional, else i, i + dims/2);
// the rest copied. `in` and `y` may not overlap.
inline void rope_row(const float* in, const float* c, const float* s, int dims, bool trad, int64_t D, float* y) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t i1 = trad ? 2 * i : i, i2 = trad ? 2 * i + 1 : i + half;
    const float x1 = in[i1], x2 = in[i2];
    y[i1] = x1 * c[i] - x2 * s[i];
    y[i2] = x1 * s[i] + x2 * c[i];
  }
  for (int64_t d = dims; d < D; ++d) y[d] = in[d];
}

}  // namespace gk
