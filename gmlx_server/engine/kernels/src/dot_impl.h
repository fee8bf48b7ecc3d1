// The integer dot-product kernels, compiled once per instruction set (dot_*.cpp define GK_ISA and the
// target flags). Activations are quantized per 32 to int8 (XBlock); a weight group's 32 codes times
// those int8 values gives 8 int32 lanes (lane l sums elements 4l..4l+3), scaled per lane in fp32.
#pragma once

#include <cmath>
#include <type_traits>

#include "floats.h"
#include "formats.h"
#include "kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace gk {
namespace GK_ISA {

inline i8x32 as_i8(u8x32 v) { return (i8x32)v; }

#if defined(__AVX2__)
inline __m256i m(u8x32 v) { return (__m256i)v; }
inline __m256i m(i8x32 v) { return (__m256i)v; }

// unsigned codes (< 128) x signed int8 -> 8 int32 lanes of 4 products each
inline i32x8 dot_u(u8x32 q, i8x32 y) {
#if defined(GK_AVXVNNI)
  return (i32x8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), m(q), m(y));
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
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
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (i32x8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#else
  // |q| <= 128 and |y| <= 127: a pair of products stays within int16 (2 * 128 * 127 = 32512)
  return (i32x8)_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
}

#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
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
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
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

// --- int16 activations: 256x finer than int8 (a block's outlier no longer erases its neighbours), and
// still integer dot products: pairs of int16 products summed into int32 lanes (VNNI vpdpwssd or pmaddwd).
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

struct Codes16 {
  i16x16 lo, hi;  // elements 0..15 and 16..31, widened
};

template <bool SIGNED>
inline Codes16 widen(u8x32 q) {
  const u8x16 lo = __builtin_shufflevector(q, q, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const u8x16 hi = __builtin_shufflevector(q, q, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  if constexpr (SIGNED) {
    typedef int8_t i8x16 __attribute__((vector_size(16)));
    return {__builtin_convertvector((i8x16)lo, i16x16), __builtin_convertvector((i8x16)hi, i16x16)};
  }
  return {__builtin_convertvector(lo, i16x16), __builtin_convertvector(hi, i16x16)};
}

// acc + 8 int32 lanes, lane l = c[2l] * x[2l] + c[2l + 1] * x[2l + 1]
inline i32x8 dot16(i32x8 acc, i16x16 c, i16x16 x) {
#if defined(GK_AVXVNNI)
  return (i32x8)_mm256_dpwssd_avx_epi32((__m256i)acc, (__m256i)c, (__m256i)x);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (i32x8)_mm256_dpwssd_epi32((__m256i)acc, (__m256i)c, (__m256i)x);
#elif defined(__AVX2__)
  return acc + (i32x8)_mm256_madd_epi16((__m256i)c, (__m256i)x);
#else
  const i32x16 p = __builtin_convertvector(c, i32x16) * __builtin_convertvector(x, i32x16);
  return acc + __builtin_shufflevector(p, p, 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(p, p, 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
// AVX-512: one vpdpwssd covers a whole 32-element group (16 lanes: 0-7 the first half, 8-15 the second).
template <class F, int NR>
inline void dot_tile16(const uint8_t* w, int64_t nblocks, const XBlock16* x, int64_t xstride, float* y,
                       int64_t ldy) {
  __m512 acc[NR];
  float bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps(), bias[r] = 0.0f;
  for (int64_t b = 0; b < nblocks; ++b, w += F::BYTES) {
    const typename F::State st(w);
    const XBlock16* xb = x + b * F::GROUPS;
#pragma GCC unroll 8
    for (int g = 0; g < F::GROUPS; ++g) {
      const Group G = st.group(g);
      const __m512i c = F::SIGNED ? _mm512_cvtepi8_epi16((__m256i)G.q) : _mm512_cvtepu8_epi16((__m256i)G.q);
      const __m512 a = F::HALF_SCALES ? _mm512_insertf32x8(_mm512_set1_ps(G.a[0]), _mm256_set1_ps(G.a[4]), 1)
                                      : _mm512_set1_ps(G.a[0]);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const XBlock16& xr = xb[r * xstride + g];
        const __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), c, _mm512_loadu_si512(xr.q));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(a, _mm512_set1_ps(xr.d)), acc[r]);
        bias[r] += G.b0 * xr.s0 + G.b1 * xr.s1;
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = _mm512_reduce_add_ps(acc[r]) + bias[r];
}
#else
template <class F, int NR>
inline void dot_tile16(const uint8_t* w, int64_t nblocks, const XBlock16* x, int64_t xstride, float* y,
                       int64_t ldy) {
  f32x8 acc[NR];
  float bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = splat(0.0f), bias[r] = 0.0f;
  const i32x8 zero = {};
  for (int64_t b = 0; b < nblocks; ++b, w += F::BYTES) {
    const typename F::State st(w);
    const XBlock16* xb = x + b * F::GROUPS;
#pragma GCC unroll 8
    for (int g = 0; g < F::GROUPS; ++g) {
      const Group G = st.group(g);
      const Codes16 c = widen<F::SIGNED>(G.q);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const XBlock16& xr = xb[r * xstride + g];
        i16x16 x0, x1;
        std::memcpy(&x0, xr.q, 32);
        std::memcpy(&x1, xr.q + 16, 32);
        if constexpr (F::HALF_SCALES) {
          acc[r] += __builtin_convertvector(dot16(zero, c.lo, x0), f32x8) * (G.a[0] * xr.d) +
                    __builtin_convertvector(dot16(zero, c.hi, x1), f32x8) * (G.a[4] * xr.d);
        } else {
          acc[r] += __builtin_convertvector(dot16(dot16(zero, c.lo, x0), c.hi, x1), f32x8) * (G.a[0] * xr.d);
        }
        bias[r] += G.b0 * xr.s0 + G.b1 * xr.s1;
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum(acc[r]) + bias[r];
}
#endif

template <class F, int NR>
struct Int16Tile {
  static void run(const uint8_t* w, int64_t nb, const XBlock16* x, int64_t xs, float* y, int64_t ldy) {
    dot_tile16<F, NR>(w, nb, x, xs, y, ldy);
  }
};

inline void rows16(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XBlock16* x,
                   int64_t m_rows, int64_t xstride, float* y, int64_t ldy) {
  with_format(type, [&]<class F>() { rows_tiled<F, Int16Tile>(w, row_bytes, n0, n1, x, m_rows, xstride, y, ldy); });
}

inline void quantize_row16(const float* x, int64_t k, XBlock16* out) {
  quantize_row_to<XBlock16, 32767>(x, k, out);
}

inline const Isa table = {GK_ISA_NAME, &rows, &rows16, &rows_f, &quantize_row, &quantize_row16, &dequant_row};

}  // namespace GK_ISA
}  // namespace gk
