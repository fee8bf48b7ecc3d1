// v16: 16 floats, the unit of the attention and activation kernels (vec_kernels.h), with its exp2, horizontal
// max and sum, fp16 widening and 16 x 16 transpose. One zmm on AVX-512. Below it on x86, two 8-lane halves:
// GCC kept a 64-byte vector extension in memory there (a loop's accumulator went through the stack and a
// scalar splat took 16 stores), which made AVX2's attention 10x slower than its scalar loop. Elsewhere (NEON)
// the 64-byte vector extension. Both forms run the same operations lane by lane, in the same order.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "simd.h"

namespace gk {
namespace GK_ISA {
namespace vm {  // its own namespace: formats.h's splat is the 8-lane one

constexpr int W = 16;  // flash.h kFlashWidth

// 2^x lane by lane: x = n + f with n an integer (round to nearest) and |f| <= 1/2; 2^f by its Taylor series
// in f ln 2 to the 7th power (relative error < 1e-7); 2^n in the exponent bits. x is clamped to
// [-127, 127]: 0 below. V: a float vector extension, I: its int32 twin.
template <typename V, typename I>
inline V exp2_lanes(V x) {
  const V lo = V{} - 127.0f, hi = V{} + 127.0f;
  x = x > lo ? x : lo;
  x = x < hi ? x : hi;
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x + magic) - magic;
  const V y = (x - n) * 0.6931471805599453f;
  V p = V{} + 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * y + c;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // n = -127: 0.0
  return p * (V)bits;  // the bits as floats: a cast between vector types of one size (a memcpy went to memory)
}

// One butterfly stage of a transpose over N-lane rows x, y (S apart): lane l of x takes x's lane l where bit S
// of l is clear, else y's lane l - S; y takes x's lane l + S, else y's lane l. Two-input shuffles (one
// vpermt2ps on AVX-512), their indices expanded from the lane numbers at compile time.
template <int S, typename V, int... L>
inline void stage_lanes(V& x, V& y, std::integer_sequence<int, L...>) {
  constexpr int N = sizeof...(L);
  const V a = x, b = y;
  x = __builtin_shufflevector(a, b, ((L & S) ? N + L - S : L)...);
  y = __builtin_shufflevector(a, b, ((L & S) ? N + L : L + S)...);
}
template <int S, int N, typename V>
inline void stage(V& x, V& y) {
  stage_lanes<S>(x, y, std::make_integer_sequence<int, N>{});
}

#if defined(GK_X86) && !defined(GK_AVX512)
#define GK_V16_PAIR 1
// aligned(4): loads from plain float buffers need no 32-byte alignment
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t i32v8 __attribute__((vector_size(32), aligned(4)));
typedef float float_alias __attribute__((may_alias));

struct v16 {
  v8 lo, hi;  // lanes 0..7, 8..15
  float& operator[](int64_t j) { return reinterpret_cast<float_alias*>(this)[j]; }
  float operator[](int64_t j) const { return reinterpret_cast<const float_alias*>(this)[j]; }
};

#define GK_V16_OP(op)                                                                  \
  inline v16 operator op(v16 a, v16 b) { return {a.lo op b.lo, a.hi op b.hi}; }       \
  inline v16 operator op(v16 a, float b) { return {a.lo op b, a.hi op b}; }           \
  inline v16 operator op(float a, v16 b) { return {a op b.lo, a op b.hi}; }           \
  inline v16& operator op##=(v16& a, v16 b) { return a = a op b; }
GK_V16_OP(+)
GK_V16_OP(-)
GK_V16_OP(*)
GK_V16_OP(/)
#undef GK_V16_OP

// The halving steps of a horizontal reduction within 8 lanes (after lanes l and l + 8 meet).
template <typename V, typename Op>
inline float reduce8(V v, Op op) {
  v = op(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
  v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
  v = op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  return v[0];
}

// 16 floats from and to plain buffers, a vmovups a half (a memcpy of the struct went through the stack)
inline v16 load16(const float* p) { return {*reinterpret_cast<const v8*>(p), *reinterpret_cast<const v8*>(p + 8)}; }
inline void store16(float* p, v16 v) {
  *reinterpret_cast<v8*>(p) = v.lo;
  *reinterpret_cast<v8*>(p + 8) = v.hi;
}

inline v16 splat(float x) { return {v8{} + x, v8{} + x}; }
inline v16 vmax(v16 a, v16 b) { return {a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi}; }
inline v16 vmin(v16 a, v16 b) { return {a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi}; }
inline float hmax(v16 v) {
  return reduce8(v.lo > v.hi ? v.lo : v.hi, [](v8 a, v8 b) { return a > b ? a : b; });
}
inline float hsum(v16 v) {
  return reduce8(v.lo + v.hi, [](v8 a, v8 b) { return a + b; });
}
inline v16 exp2v(v16 x) { return {exp2_lanes<v8, i32v8>(x.lo), exp2_lanes<v8, i32v8>(x.hi)}; }

inline v16 h2f16(const uint16_t* p) {  // F16C: one vcvtph2ps a half
  v16 out;
#if defined(GK_F16C)
  const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  out.lo = (v8)lo;  // a register's bits as they are (a memcpy went through memory)
  out.hi = (v8)hi;
#else
  for (int i = 0; i < W; ++i) out[i] = h2f(p[i]);
#endif
  return out;
}

inline v8 load8(const float* p) { return *reinterpret_cast<const v8*>(p); }
inline v8 load8(const uint16_t* p) {
#if defined(GK_F16C)
  return (v8)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  v8 out;
  for (int i = 0; i < 8; ++i) out[i] = h2f(p[i]);
  return out;
#endif
}

// The 16 x 16 block whose row j starts at p + j * stride (float, or fp16 bits), transposed into dst (rows of
// W floats), as four 8 x 8 transposes in registers: a whole 16 x 16 needs 32 ymm registers, AVX2 has 16.
template <typename T>
inline void transpose_block(const T* p, int64_t stride, float* dst) {
  for (int h = 0; h < 4; ++h) {
    const int rows = 8 * (h & 1), cols = 8 * (h >> 1);
    v8 r[8];
    for (int j = 0; j < 8; ++j) r[j] = load8(p + (rows + j) * stride + cols);
    for (const int i : {0, 1, 2, 3}) stage<4, 8>(r[i], r[i + 4]);
    for (const int i : {0, 1, 4, 5}) stage<2, 8>(r[i], r[i + 2]);
    for (int i = 0; i < 8; i += 2) stage<1, 8>(r[i], r[i + 1]);
    for (int i = 0; i < 8; ++i) *reinterpret_cast<v8*>(dst + (cols + i) * W + rows) = r[i];
  }
}
#else
// aligned(4): loads from plain float buffers need no 64-byte alignment
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i32v16 __attribute__((vector_size(64), aligned(4)));

inline v16 load16(const float* p) { return *reinterpret_cast<const v16*>(p); }
inline void store16(float* p, v16 v) { *reinterpret_cast<v16*>(p) = v; }

inline v16 splat(float x) { return v16{} + x; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline v16 vmin(v16 a, v16 b) { return a < b ? a : b; }
// Horizontal max and sum in four halving steps.
inline float hmax(v16 v) {
  v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return v[0];
}
inline float hsum(v16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}
inline v16 exp2v(v16 x) { return exp2_lanes<v16, i32v16>(x); }

// r[i][j] -> r[j][i] in registers: 64 shuffles where a scalar transpose stores each of the 256 floats alone
inline void transpose16(v16 (&r)[W]) {
  for (int i = 0; i < 8; ++i) stage<8, W>(r[i], r[i + 8]);
  for (const int i : {0, 1, 2, 3, 8, 9, 10, 11}) stage<4, W>(r[i], r[i + 4]);
  for (const int i : {0, 1, 4, 5, 8, 9, 12, 13}) stage<2, W>(r[i], r[i + 2]);
  for (int i = 0; i < W; i += 2) stage<1, W>(r[i], r[i + 1]);
}

// 16 fp16 values widened: one vcvtph2ps on AVX-512, h2f's per-value conversion elsewhere (arm64's __fp16;
// the bits on a baseline x86 build)
inline v16 h2f16(const uint16_t* p) {
  v16 out;
#if defined(GK_AVX512)
  const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  out = (v16)f;
#else
  for (int i = 0; i < W; ++i) out[i] = h2f(p[i]);
#endif
  return out;
}

inline v16 row16(const float* p) { return load16(p); }
inline v16 row16(const uint16_t* p) { return h2f16(p); }

// The 16 x 16 block whose row j starts at p + j * stride (float, or fp16 bits), transposed into dst (rows of
// W floats) through registers.
template <typename T>
inline void transpose_block(const T* p, int64_t stride, float* dst) {
  v16 r[W];
  for (int j = 0; j < W; ++j) r[j] = row16(p + j * stride);
  transpose16(r);
  for (int i = 0; i < W; ++i) store16(dst + i * W, r[i]);
}
#endif

}  // namespace vm
}  // namespace GK_ISA
}  // namespace gk
