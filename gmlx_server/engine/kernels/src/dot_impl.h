// The integer dot-product kernels, compiled once per instruction set (dot_*.cpp define GK_ISA and the
// target flags). Activations are quantized per 32 to int8 (XBlock); a weight group's 32 codes times
// those int8 values gives 8 int32 lanes (lane l sums elements 4l..4l+3), scaled per lane in fp32.
#pragma once

#include <cmath>
#include <type_traits>

#include "floats.h"
#include "formats.h"
#include "kernels.h"
#include "qdot.h"
#include "simd.h"

namespace gk {
namespace GK_ISA {

inline i8x32 as_i8(u8x32 v) { return (i8x32)v; }

#if defined(GK_AVX2)
inline __m256i m(u8x32 v) { return (__m256i)v; }
inline __m256i m(i8x32 v) { return (__m256i)v; }

// unsigned codes (< 128) x signed int8 -> 8 int32 lanes of 4 products each
inline i32x8 dot_u(u8x32 q, i8x32 y) {
#if defined(GK_AVXVNNI)
  return (i32x8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), m(q), m(y));
#elif defined(GK_AVX512VNNI)
  return (i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), m(q), m(y));
#else
  // codes < 64 keep maddubs's int16 pair sums (<= 2 * 63 * 127) from saturating
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(m(q), m(y)), _mm256_set1_epi16(1));
#endif
}

// signed codes: |q| times y with q's sign moved onto y (|q| <= 128 fits unsigned)
inline i32x8 dot_s(u8x32 q, i8x32 y) {
  const __m256i qs = m(q);
  const __m256i ax = _mm256_sign_epi8(qs, qs);
  const __m256i sy = _mm256_sign_epi8(m(y), qs);
#if defined(GK_AVXVNNI)
  return (i32x8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy);
#elif defined(GK_AVX512VNNI)
  return (i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#else
  // |q| <= 128 and |y| <= 127: a pair of products stays within int16 (2 * 128 * 127 = 32512)
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
}

#elif defined(GK_NEON_DOT)
inline i32x8 sdot(i8x32 q, i8x32 y) {
  int8x16_t q0, q1, y0, y1;
  std::memcpy(&q0, &q, 16);
  std::memcpy(&q1, reinterpret_cast<const int8_t*>(&q) + 16, 16);
  std::memcpy(&y0, &y, 16);
  std::memcpy(&y1, reinterpret_cast<const int8_t*>(&y) + 16, 16);
  const int32x4_t z = vdupq_n_s32(0);
  int32x4_t r[2] = {vdotq_s32(z, q0, y0), vdotq_s32(z, q1, y1)};
  i32x8 out;
  std::memcpy(&out, r, 32);
  return out;
}
inline i32x8 dot_u(u8x32 q, i8x32 y) { return sdot(as_i8(q), y); }  // codes < 64 are valid int8
inline i32x8 dot_s(u8x32 q, i8x32 y) { return sdot(as_i8(q), y); }

#else
inline i32x8 dot_generic(const int32_t* qv, i8x32 y) {
  i32x8 out = {};
  for (int l = 0; l < 8; ++l)
    for (int k = 0; k < 4; ++k) out[l] += qv[4 * l + k] * static_cast<int32_t>(y[4 * l + k]);
  return out;
}
inline i32x8 dot_u(u8x32 q, i8x32 y) {
  int32_t qv[32];
  for (int i = 0; i < 32; ++i) qv[i] = q[i];
  return dot_generic(qv, y);
}
inline i32x8 dot_s(u8x32 q, i8x32 y) {
  int32_t qv[32];
  for (int i = 0; i < 32; ++i) qv[i] = static_cast<int8_t>(q[i]);
  return dot_generic(qv, y);
}
#endif

inline float hsum(f32x8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// y[r * ldy] = dot(weight row w, activation row r) for NR activation rows sharing one weight decode.
template <class F, int NR>
inline void dot_tile(const uint8_t* w, int64_t nblocks, const XBlock* x, int64_t xstride, float* y, int64_t ldy) {
  f32x8 acc[NR];
  float bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = splat(0.0f), bias[r] = 0.0f;
  for (int64_t b = 0; b < nblocks; ++b, w += F::BYTES) {
    const typename F::State st(w);
    const XBlock* xb = x + b * F::GROUPS;
#pragma GCC unroll 8
    for (int g = 0; g < F::GROUPS; ++g) {
      const Group G = st.group(g);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const XBlock& xr = xb[r * xstride + g];
        i8x32 yq;
        std::memcpy(&yq, xr.q, 32);
        const i32x8 p = F::SIGNED ? dot_s(G.q, yq) : dot_u(G.q, yq);
        acc[r] += __builtin_convertvector(p, f32x8) * (G.a * xr.d);
        bias[r] += G.b0 * xr.s0 + G.b1 * xr.s1;
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum(acc[r]) + bias[r];
}

// Rows [n0, n1) of W against all M activation rows (each `xstride` elements/blocks apart); y is (M, ldy)
// row-major. Tile<F, NR>::run computes NR activation rows against one weight row.
template <class F, template <class, int> class Tile, class X>
void rows_tiled(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const X* x, int64_t m_rows,
                int64_t xstride, float* y, int64_t ldy) {
  const int64_t nblocks = row_bytes / F::BYTES;
  constexpr int64_t MB = 64;  // activation rows kept hot in L2 while the weight rows stream past
  for (int64_t m0 = 0; m0 < m_rows; m0 += MB) {
    const int64_t m1 = m0 + MB < m_rows ? m0 + MB : m_rows;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = w + n * row_bytes;
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) Tile<F, 4>::run(wr, nblocks, x + m * xstride, xstride, y + m * ldy + n, ldy);
      for (; m < m1; ++m) Tile<F, 1>::run(wr, nblocks, x + m * xstride, xstride, y + m * ldy + n, ldy);
    }
  }
}

template <class F, int NR>
struct Int8Tile {
  static void run(const uint8_t* w, int64_t nb, const XBlock* x, int64_t xs, float* y, int64_t ldy) {
    dot_tile<F, NR>(w, nb, x, xs, y, ldy);
  }
};

inline void rows(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XBlock* x,
                 int64_t m_rows, int64_t xstride, float* y, int64_t ldy) {
  with_format(type, [&]<class F>() { rows_tiled<F, Int8Tile>(w, row_bytes, n0, n1, x, m_rows, xstride, y, ldy); });
}

// One activation row of k floats -> k / 32 blocks of symmetric integers, scale = max|x| / LEVELS
// (int8: 127, int16: 32767), with the scaled sums of each 16-element half.
template <class Block, int LEVELS>
inline void quantize_row_to(const float* x, int64_t k, Block* out) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    const float amax = q16::amax_of(x, 32);
    const float d = amax / static_cast<float>(LEVELS);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(x[i] * id));
      out[b].q[i] = static_cast<std::remove_reference_t<decltype(out[b].q[0])>>(q);
      (i < 16 ? s0 : s1) += q;
    }
    out[b].d = d;
    out[b].s0 = d * static_cast<float>(s0);
    out[b].s1 = d * static_cast<float>(s1);
  }
}

inline void quantize_row(const float* x, int64_t k, XBlock* out) { quantize_row_to<XBlock, 127>(x, k, out); }

}  // namespace GK_ISA
}  // namespace gk
