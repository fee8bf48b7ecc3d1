// Integer dot products on int16 activations (XRows, kernels.h), one kernel per format: a weight block's
// codes are widened to int16 once and multiplied with each activation row by vpdpwssd (AVX-512 VNNI on
// 512 bits, AVX-VNNI on 256) or vpmaddwd (AVX2). The K-quants fold their 6/8-bit sub-block scales into the
// codes (products fit int16) and sum a whole 256-block in int32: one float multiply-add per block and row.
#pragma once

#include <cmath>
#include <utility>

#include "formats.h"
#include "kernels.h"
#include "simd.h"
#include "v16.h"

namespace gk {
namespace GK_ISA {
namespace q16 {

inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(GK_AVX512VNNI)
// V: 32 int16 lanes; A: 16 int32 lanes (lane l sums elements 2l, 2l + 1); F: 16 floats
struct V { __m512i v; };
struct A { __m512i v; };
struct F { __m512 v; };
inline V ld(const int16_t* p) { return {_mm512_loadu_si512(p)}; }
inline V u8w(const uint8_t* p) { return {_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline V i8w(const uint8_t* p) { return {_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
// 16 bytes -> lanes 0..15 their low nibbles, lanes 16..31 their high nibbles (Q4_0/Q4_1/Q5 layout)
inline V nib32(const uint8_t* p) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512i sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  return {_mm512_and_si512(_mm512_srlv_epi16(b, sh), _mm512_set1_epi16(15))};
}
// 32 bytes -> their low nibbles (lo) and their high ones (hi), 32 lanes each (Q4_K_R's order, repack.h)
inline void nib64(const uint8_t* p, V& lo, V& hi) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  lo = {_mm512_and_si512(b, _mm512_set1_epi16(15))}, hi = {_mm512_srli_epi16(b, 4)};
}
inline V band(V a, int16_t m) { return {_mm512_and_si512(a.v, _mm512_set1_epi16(m))}; }
inline V bor(V a, V b) { return {_mm512_or_si512(a.v, b.v)}; }
inline V srli(V a, int s) { return {_mm512_srli_epi16(a.v, s)}; }
inline V slli(V a, int s) { return {_mm512_slli_epi16(a.v, s)}; }
inline V subc(V a, int16_t c) { return {_mm512_sub_epi16(a.v, _mm512_set1_epi16(c))}; }
inline V mul(V a, V b) { return {_mm512_mullo_epi16(a.v, b.v)}; }
inline V set1(int16_t a) { return {_mm512_set1_epi16(a)}; }
inline V halves(int16_t a, int16_t b) {
  return {_mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1)};
}
// lane i plus 16 where bit i of `bits` is set (a 5th code bit)
inline V add16(V a, uint32_t bits) {
  return {_mm512_mask_add_epi16(a.v, static_cast<__mmask32>(bits), a.v, _mm512_set1_epi16(16))};
}
constexpr bool kOneChain = false;  // vpdpwssd waits ~5 cycles a link: several chains a row
inline A azero() { return {_mm512_setzero_si512()}; }
inline A dot(A acc, V a, V b) { return {_mm512_dpwssd_epi32(acc.v, a.v, b.v)}; }
inline A add(A a, A b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline F fzero() { return {_mm512_setzero_ps()}; }
inline F fma(A a, float s, F acc) { return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(a.v), _mm512_set1_ps(s), acc.v)}; }
inline F fadd(F a, F b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F fma1(A a, float s, F acc) { return fma(a, s, acc); }
inline float hsum(F a) { return _mm512_reduce_add_ps(a.v); }
// lane j + lane j + 8: the low and the high nibbles' pairs of one sub-block (row_q45kr)
inline __m256 f8_of(A a) {
  return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm512_castsi512_si256(a.v), _mm512_extracti64x4_epi64(a.v, 1)));
}
#endif
#if defined(GK_AVX2)
// 8 floats: the K-quants' per-group min terms
using F8 = __m256;
inline F8 f8zero() { return _mm256_setzero_ps(); }
// acc + m[g] * scale * s[g] for the 8 groups
inline F8 f8_mins(F8 acc, F8 m, float scale, const float* s) {
  return _mm256_fmadd_ps(_mm256_mul_ps(m, _mm256_set1_ps(scale)), _mm256_loadu_ps(s), acc);
}
inline float f8sum(F8 v) { return hsum256(v); }
// 8 signed bytes as floats
inline F8 f8_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// acc + a * b * s, lane by lane
inline F8 f8_fma(F8 a, F8 b, float s, F8 acc) { return _mm256_fmadd_ps(a, _mm256_mul_ps(b, _mm256_set1_ps(s)), acc); }
// out[g] = m[g] * scale
inline void f8_scaled(F8 m, float scale, float* out) { _mm256_store_ps(out, _mm256_mul_ps(m, _mm256_set1_ps(scale))); }
// A Q4_K/Q5_K block's 8 scales (bytes 0..7) and 8 mins (8..15), the generic k_scales' words built in a register
// from one load: stored from general registers, their 8-byte reloads were not forwarded (Q4_K_R 1.15x, Zen 3).
using KS = __m128i;
inline KS k_scales(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));  // 16 of the block's 144/176 bytes
  const __m128i lo = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), hi = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i a = _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 2, 0, 2)),
                                  _mm_setr_epi32(0x3F3F3F3F, 0x30303030, 0x3F3F3F3F, 0x30303030));
  const __m128i b = _mm_and_si128(_mm_srlv_epi32(hi, _mm_setr_epi32(32, 0, 32, 4)), _mm_set1_epi32(0x0F0F0F0F));
  return _mm_or_si128(a, b);  // a shift by 32 clears the scale words' lanes of b
}
inline F8 ks_scales(KS k) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(k)); }
inline F8 ks_mins(KS k) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(k, k))); }
inline void ks_store(KS k, uint8_t* out) { _mm_storeu_si128(reinterpret_cast<__m128i*>(out), k); }
#else
typedef float F8 __attribute__((vector_size(32)));
inline F8 f8zero() { return F8{}; }
inline F8 f8_mins(F8 acc, F8 m, float scale, const float* s) {
  for (int g = 0; g < 8; ++g) acc[g] += m[g] * scale * s[g];
  return acc;
}
inline float f8sum(F8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }
inline F8 f8_i8(const uint8_t* p) {
  F8 r;
  for (int g = 0; g < 8; ++g) r[g] = static_cast<float>(static_cast<int8_t>(p[g]));
  return r;
}
inline F8 f8_fma(F8 a, F8 b, float s, F8 acc) { return acc + a * (b * s); }
inline void f8_scaled(F8 m, float scale, float* out) {
  for (int g = 0; g < 8; ++g) out[g] = m[g] * scale;
}
// A Q4_K/Q5_K block's 8 scales (bytes 0..7) and 8 mins (8..15), unpacked from its 12 bytes at s.
struct KS { uint8_t b[16]; };
inline KS k_scales(const uint8_t* s) {
  const uint32_t u0 = u32(s), u1 = u32(s + 4), u2 = u32(s + 8);
  const uint32_t v[4] = {u0 & 0x3F3F3F3Fu, (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4),
                         u1 & 0x3F3F3F3Fu, ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4)};
  KS k;
  std::memcpy(k.b, v, 16);
  return k;
}
inline F8 ks_scales(const KS& k) {
  F8 r;
  for (int g = 0; g < 8; ++g) r[g] = static_cast<float>(k.b[g]);
  return r;
}
inline F8 ks_mins(const KS& k) {
  F8 r;
  for (int g = 0; g < 8; ++g) r[g] = static_cast<float>(k.b[8 + g]);
  return r;
}
inline void ks_store(const KS& k, uint8_t* out) { std::memcpy(out, k.b, 16); }
#endif

#if defined(GK_AVX512VNNI)
#elif defined(GK_AVX2)
struct V { __m256i lo, hi; };  // elements 0..15, 16..31
#if defined(GK_AVXVNNI)
struct A { __m256i lo, hi; };  // vpdpwssd's accumulators, one per half (a chain of two would wait ~10 cycles)
#else
// 8 int32 lanes, each summing 4 products of a 32-element dot (vpmaddwd twice, then adds of 1-cycle latency): four
// rows' accumulators fit the 16 registers beside a block's codes. The widest sum, Q6_K's 128-element half
// block, is 16 products of at most 4096 * 32767 a lane: below 2^31.
struct A { __m256i v; };
#endif
struct F { __m256 lo, hi; };
inline __m256i w16(const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V ld(const int16_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))};
}
inline V u8w(const uint8_t* p) { return {w16(p), w16(p + 16)}; }
inline V i8w(const uint8_t* p) {
  return {_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline V nib32(const uint8_t* p) {
  const __m256i b = w16(p);
  return {_mm256_and_si256(b, _mm256_set1_epi16(15)), _mm256_srli_epi16(b, 4)};
}
inline void nib64(const uint8_t* p, V& lo, V& hi) {
  const __m256i a = w16(p), b = w16(p + 16), m = _mm256_set1_epi16(15);
  lo = {_mm256_and_si256(a, m), _mm256_and_si256(b, m)}, hi = {_mm256_srli_epi16(a, 4), _mm256_srli_epi16(b, 4)};
}
inline V band(V a, int16_t m) {
  const __m256i k = _mm256_set1_epi16(m);
  return {_mm256_and_si256(a.lo, k), _mm256_and_si256(a.hi, k)};
}
inline V bor(V a, V b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
inline V srli(V a, int s) { return {_mm256_srli_epi16(a.lo, s), _mm256_srli_epi16(a.hi, s)}; }
inline V slli(V a, int s) { return {_mm256_slli_epi16(a.lo, s), _mm256_slli_epi16(a.hi, s)}; }
inline V subc(V a, int16_t c) {
  const __m256i k = _mm256_set1_epi16(c);
  return {_mm256_sub_epi16(a.lo, k), _mm256_sub_epi16(a.hi, k)};
}
inline V mul(V a, V b) { return {_mm256_mullo_epi16(a.lo, b.lo), _mm256_mullo_epi16(a.hi, b.hi)}; }
inline V set1(int16_t a) { return {_mm256_set1_epi16(a), _mm256_set1_epi16(a)}; }
inline V halves(int16_t a, int16_t b) { return {_mm256_set1_epi16(a), _mm256_set1_epi16(b)}; }
inline __m256i bits16(uint32_t bits) {  // bit i of the low 16 -> lane i = 16 or 0
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                        static_cast<int16_t>(-32768));
  const __m256i v = _mm256_and_si256(_mm256_set1_epi16(static_cast<int16_t>(bits & 0xFFFF)), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi16(v, bit), _mm256_set1_epi16(16));
}
inline V add16(V a, uint32_t bits) {
  return {_mm256_add_epi16(a.lo, bits16(bits)), _mm256_add_epi16(a.hi, bits16(bits >> 16))};
}
#if defined(GK_AVXVNNI)
constexpr bool kOneChain = false;
inline A azero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline A dot(A acc, V a, V b) {
  return {_mm256_dpwssd_avx_epi32(acc.lo, a.lo, b.lo), _mm256_dpwssd_avx_epi32(acc.hi, a.hi, b.hi)};
}
inline A add(A a, A b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline __m256i whole(A a) { return _mm256_add_epi32(a.lo, a.hi); }
inline F8 f8_of(A a) { return _mm256_cvtepi32_ps(whole(a)); }
inline F fma(A a, float s, F acc) {
  const __m256 k = _mm256_set1_ps(s);
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(a.lo), k, acc.lo), _mm256_fmadd_ps(_mm256_cvtepi32_ps(a.hi), k, acc.hi)};
}
#else
constexpr bool kOneChain = true;  // an accumulator's chain is one add a dot: one per row keeps the ports busy
inline A azero() { return {_mm256_setzero_si256()}; }
inline A dot(A acc, V a, V b) {
  return {_mm256_add_epi32(acc.v, _mm256_add_epi32(_mm256_madd_epi16(a.lo, b.lo), _mm256_madd_epi16(a.hi, b.hi)))};
}
inline A add(A a, A b) { return {_mm256_add_epi32(a.v, b.v)}; }
inline __m256i whole(A a) { return a.v; }
inline F8 f8_of(A a) { return _mm256_cvtepi32_ps(a.v); }
inline F fma(A a, float s, F acc) { return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(a.v), _mm256_set1_ps(s), acc.lo), acc.hi}; }
#endif
inline F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F fadd(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
// one block's dot (both halves share its scale): the int32 halves summed first, one conversion and one FMA
inline F fma1(A a, float s, F acc) {
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(whole(a)), _mm256_set1_ps(s), acc.lo), acc.hi};
}
inline float hsum(F a) { return hsum256(_mm256_add_ps(a.lo, a.hi)); }
#else
// portable: GCC/Clang vector extensions (NEON on arm64)
typedef int16_t i16x32 __attribute__((vector_size(64)));
typedef int32_t i32x32 __attribute__((vector_size(128)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x32 __attribute__((vector_size(64)));
struct V { i16x32 v; };
struct A { i32x16 v; };
struct F { f32x16 v; };
inline V ld(const int16_t* p) {
  V r;
  std::memcpy(&r.v, p, 64);
  return r;
}
inline V u8w(const uint8_t* p) {
  V r;
  for (int i = 0; i < 32; ++i) r.v[i] = p[i];
  return r;
}
inline V i8w(const uint8_t* p) {
  V r;
  for (int i = 0; i < 32; ++i) r.v[i] = static_cast<int8_t>(p[i]);
  return r;
}
inline V nib32(const uint8_t* p) {
  V r;
  for (int i = 0; i < 16; ++i) r.v[i] = p[i] & 15, r.v[i + 16] = p[i] >> 4;
  return r;
}
inline void nib64(const uint8_t* p, V& lo, V& hi) {
  for (int i = 0; i < 32; ++i) lo.v[i] = p[i] & 15, hi.v[i] = p[i] >> 4;
}
inline V band(V a, int16_t m) { return {a.v & m}; }
inline V bor(V a, V b) { return {a.v | b.v}; }
inline V srli(V a, int s) { return {(i16x32)((u16x32)a.v >> s)}; }
inline V slli(V a, int s) { return {a.v << s}; }
inline V subc(V a, int16_t c) { return {a.v - c}; }
inline V mul(V a, V b) { return {a.v * b.v}; }
inline V set1(int16_t a) { return {i16x32{} + a}; }
inline V halves(int16_t a, int16_t b) {
  V r;
  for (int i = 0; i < 32; ++i) r.v[i] = i < 16 ? a : b;
  return r;
}
inline V add16(V a, uint32_t bits) {
  for (int i = 0; i < 32; ++i) a.v[i] += static_cast<int16_t>(((bits >> i) & 1) << 4);
  return a;
}
constexpr bool kOneChain = false;
inline A azero() { return {i32x16{}}; }
inline A dot(A acc, V a, V b) {
  for (int l = 0; l < 16; ++l)
    acc.v[l] += static_cast<int32_t>(a.v[2 * l]) * b.v[2 * l] + static_cast<int32_t>(a.v[2 * l + 1]) * b.v[2 * l + 1];
  return acc;
}
inline A add(A a, A b) { return {a.v + b.v}; }
inline F8 f8_of(A a) {
  F8 r;
  for (int j = 0; j < 8; ++j) r[j] = static_cast<float>(a.v[j] + a.v[j + 8]);
  return r;
}
inline F fzero() { return {f32x16{}}; }
inline F fma(A a, float s, F acc) { return {__builtin_convertvector(a.v, f32x16) * s + acc.v}; }
inline F fadd(F a, F b) { return {a.v + b.v}; }
inline F fma1(A a, float s, F acc) { return fma(a, s, acc); }
inline float hsum(F a) {
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += a.v[i];
  return s;
}
#endif

// max(amax, |v|) as a compare and select: std::fmax's NaN rules made GCC call fmaxf once per activation
inline float amax_step(float amax, float v) {
  const float a = std::fabs(v);
  return a > amax ? a : amax;
}

// max |x[i]| over n (a multiple of 16) elements, 16 lanes at a time (one scalar chain would wait on each)
inline float amax_of(const float* x, int64_t n) {
  vm::v16 m = vm::splat(0.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const vm::v16 v = vm::load16(x + i);
    m = vm::vmax(vm::vmax(v, 0.0f - v), m);  // |v| first: a NaN lane keeps m, as the scalar step does
  }
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) amax = amax_step(amax, m[j]);
  return amax;
}

// --- 32-element blocks: codes (offset folded in, so signed), scale d and, for Q4_1/Q5_1, min m.
struct B4_0 {
  static constexpr int BYTES = 18;
  static constexpr bool MIN = false;
  static V codes(const uint8_t* p) { return subc(nib32(p + 2), 8); }
};
struct B4_1 {
  static constexpr int BYTES = 20;
  static constexpr bool MIN = true;
  static V codes(const uint8_t* p) { return nib32(p + 4); }
};
struct B5_0 {
  static constexpr int BYTES = 22;
  static constexpr bool MIN = false;
  static V codes(const uint8_t* p) { return subc(add16(nib32(p + 6), u32(p + 2)), 16); }
};
struct B5_1 {
  static constexpr int BYTES = 24;
  static constexpr bool MIN = true;
  static V codes(const uint8_t* p) { return add16(nib32(p + 8), u32(p + 4)); }
};
struct B8_0 {
  static constexpr int BYTES = 34;
  static constexpr bool MIN = false;
  static V codes(const uint8_t* p) { return i8w(p + 2); }
};

// Activation rows r0.. of x as the 32-block kernels read them: row r's codes of block j, its scale, and its
// scale times the sum of its codes (what a min multiplies)
struct X32 {
  const int16_t* q;
  const float *d, *s;
  int64_t k, xb;
  X32(const XRows& x, int64_t r0)
      : q(x.q + r0 * x.k), d(x.d + r0 * (x.k / 32)), s(x.s + r0 * (x.k / 32)), k(x.k), xb(x.k / 32) {}
  const int16_t* codes(int r, int64_t j) const { return q + r * k + 32 * j; }
  const float* scale(int r, int64_t j) const { return d + r * xb + j; }
  const float* sums(int r, int64_t j) const { return s + r * xb + j; }
};

// A 32-block's codes and its fp16 scale (and min), converted where they are used: a gather of 8 blocks' scales
// ahead of the loop waited on their cache lines with nothing else in flight (40% of a Q4_1 row on Zen 3)
template <class B>
struct Block32 {
  V c;
  float d, m;
  explicit Block32(const uint8_t* w) : c(B::codes(w)) { f16_pair(w, d, m); }
};

// One weight row against NR activation rows (row r0 + r of x): y[r * ldy]. Two blocks per step, two
// accumulators.
template <class B, int NR>
inline void row32(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  F acc[NR][2];
  float bias[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = fzero(), bias[r][0] = bias[r][1] = 0.0f;
  const X32 xr(x, r0);
  int64_t j = 0;
  for (; j + 2 <= nb; j += 2, w += 2 * B::BYTES) {
    const Block32<B> b0(w), b1(w + B::BYTES);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const int16_t* xc = xr.codes(r, j);
      const float* xd = xr.scale(r, j);
      acc[r][0] = fma1(dot(azero(), b0.c, ld(xc)), b0.d * xd[0], acc[r][0]);
      acc[r][1] = fma1(dot(azero(), b1.c, ld(xc + 32)), b1.d * xd[1], acc[r][1]);
      if constexpr (B::MIN) bias[r][0] += b0.m * xr.sums(r, j)[0], bias[r][1] += b1.m * xr.sums(r, j)[1];
    }
  }
  if (j < nb) {
    const Block32<B> b0(w);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      acc[r][0] = fma1(dot(azero(), b0.c, ld(xr.codes(r, j))), b0.d * *xr.scale(r, j), acc[r][0]);
      if constexpr (B::MIN) bias[r][0] += b0.m * *xr.sums(r, j);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum(fadd(acc[r][0], acc[r][1])) + (bias[r][0] + bias[r][1]);
}

#if defined(GK_AVX2) && !defined(GK_AVX512VNNI)
#define GK_ROW32_PAIRS 1  // 256-bit integer registers: AVX2 and AVX-VNNI
#endif

#if defined(GK_ROW32_PAIRS)
// row32 for several rows on 256 bits: a block pair's two int32 dots interleaved lane by lane (j, j + 1, j, ...),
// so one conversion and one FMA against (d_j x_j, d_j+1 x_j+1) repeated scale both, and one more FMA adds both
// mins. Per row and pair that is 9 ops where two scalar scales took 14: at 4 rows the products, not the weights'
// decode, set the pace.
inline __m256 pair_of(const float* p) {  // (p[0], p[1]) four times
  return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(p)));
}
template <class B, int NR>
inline void row32_pairs(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  __m256 acc[NR], bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = bias[r] = _mm256_setzero_ps();
  const X32 xr(x, r0);
  int64_t j = 0;
  for (; j + 2 <= nb; j += 2, w += 2 * B::BYTES) {
    const Block32<B> b0(w), b1(w + B::BYTES);
    const __m256 dw = _mm256_setr_ps(b0.d, b1.d, b0.d, b1.d, b0.d, b1.d, b0.d, b1.d);
    const __m256 mw = _mm256_setr_ps(b0.m, b1.m, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const int16_t* xc = xr.codes(r, j);
      const __m256i a = whole(dot(azero(), b0.c, ld(xc))), b = whole(dot(azero(), b1.c, ld(xc + 32)));
      const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ab), _mm256_mul_ps(dw, pair_of(xr.scale(r, j))), acc[r]);
      if constexpr (B::MIN) bias[r] = _mm256_fmadd_ps(mw, pair_of(xr.sums(r, j)), bias[r]);
    }
  }
  if (j < nb) {  // the odd block: its products scaled in every lane, its min in lane 0
    const Block32<B> b0(w);
    const __m256 mw = _mm256_setr_ps(b0.m, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 dot32 = _mm256_cvtepi32_ps(whole(dot(azero(), b0.c, ld(xr.codes(r, j)))));
      acc[r] = _mm256_fmadd_ps(dot32, _mm256_set1_ps(b0.d * *xr.scale(r, j)), acc[r]);
      if constexpr (B::MIN) bias[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*xr.sums(r, j)), bias[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum256(B::MIN ? _mm256_add_ps(acc[r], bias[r]) : acc[r]);
}
#endif

// one row: row32 (the pair form measured level there); more: the pairs on 256 bits
template <class B, int NR>
inline void row32_of(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
#if defined(GK_ROW32_PAIRS)
  if constexpr (NR > 1) return row32_pairs<B, NR>(w, nb, x, r0, y, ldy);
#endif
  row32<B, NR>(w, nb, x, r0, y, ldy);
}

// --- K-quants: 256-blocks; codes times their sub-block scales in int16, summed over the block in int32.
// Q4_K / Q5_K codes of chunk c (64 elements): the low nibbles are sub-block 2c, the high ones 2c + 1; Q5_K
// takes each code's fifth bit from qh (bits 2c and 2c + 1 of its 32 bytes).
template <bool Q5>
inline void k45_codes(const uint8_t* w, int c, const V& qh, V& lo, V& hi) {
  const V raw = u8w(w + (Q5 ? 48 : 16) + 32 * c);
  lo = band(raw, 15), hi = srli(raw, 4);
  if constexpr (Q5) {
    lo = bor(lo, slli(band(srli(qh, 2 * c), 1), 4));
    hi = bor(hi, slli(band(srli(qh, 2 * c + 1), 1), 4));
  }
}

// Q4_K / Q5_K: four int32 accumulators per row when few rows (a vpdpwssd chain waits ~5 cycles per link);
// the mins' term is summed per group lane, elementwise, and reduced once at the end.
template <int NR, bool Q5>
inline void row_q45k(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  constexpr int BYTES = Q5 ? 176 : 144, NA = kOneChain ? 1 : NR <= 2 ? 4 : 2;
  F acc[NR];
  F8 bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = fzero(), bias[r] = f8zero();
  const int16_t* xq = x.q + r0 * x.k;
  const int64_t xb = x.k / 256, xs32 = x.k / 32;
  for (int64_t b = 0; b < nb; ++b, w += BYTES) {
    const KS ks = k_scales(w + 4);
    alignas(16) uint8_t sm[16];
    ks_store(ks, sm);
    alignas(16) int16_t sc[8];
    for (int g = 0; g < 8; ++g) sc[g] = sm[g];
    A ai[NR][NA];
    for (int r = 0; r < NR; ++r)
      for (int a = 0; a < NA; ++a) ai[r][a] = azero();
    V qh{};
    if constexpr (Q5) qh = u8w(w + 16);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      V lo, hi;
      k45_codes<Q5>(w, c, qh, lo, hi);
      lo = mul(lo, set1(sc[2 * c]));
      hi = mul(hi, set1(sc[2 * c + 1]));
      const int a0 = (2 * c) % NA, a1 = (2 * c + 1) % NA;
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const int16_t* xr = xq + r * x.k + 256 * b + 64 * c;
        ai[r][a0] = dot(ai[r][a0], lo, ld(xr));
        ai[r][a1] = dot(ai[r][a1], hi, ld(xr + 32));
      }
    }
    const float d = f16_at(w), dmin = f16_at(w + 2);
    const F8 mn = ks_mins(ks);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      A t = ai[r][0];
      for (int a = 1; a < NA; ++a) t = add(t, ai[r][a]);
      acc[r] = fma(t, d * x.d[(r0 + r) * xb + b], acc[r]);
      bias[r] = f8_mins(bias[r], mn, -dmin, x.s + (r0 + r) * xs32 + 8 * b);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum(acc[r]) + f8sum(bias[r]);
}

// Q4_K / Q5_K against one activation row: each sub-block's int32 sum is scaled in fp32 (sc * d * dx), so no
// int16 multiply per code; with several rows the scaled codes are shared instead (row_q45k). 1.10x on Zen 3.
template <bool Q5>
inline void row_q45k_one(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y) {
  constexpr int BYTES = Q5 ? 176 : 144;
  F acc0 = fzero(), acc1 = fzero();
  F8 bias = f8zero();
  const int16_t* xq = x.q + r0 * x.k;
  const float* xd = x.d + r0 * (x.k / 256);
  const float* xs = x.s + r0 * (x.k / 32);
  for (int64_t b = 0; b < nb; ++b, w += BYTES) {
    const KS ks = k_scales(w + 4);
    const float dx = f16_at(w) * xd[b];
    alignas(32) float sf[8];
    f8_scaled(ks_scales(ks), dx, sf);
    V qh{};
    if constexpr (Q5) qh = u8w(w + 16);
    const int16_t* xr = xq + 256 * b;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      V lo, hi;
      k45_codes<Q5>(w, c, qh, lo, hi);
      acc0 = fma1(dot(azero(), lo, ld(xr + 64 * c)), sf[2 * c], acc0);
      acc1 = fma1(dot(azero(), hi, ld(xr + 64 * c + 32)), sf[2 * c + 1], acc1);
    }
    bias = f8_mins(bias, ks_mins(ks), -f16_at(w + 2), xs + 8 * b);
  }
  *y = hsum(fadd(acc0, acc1)) + f8sum(bias);
}

// Q4_K and Q5_K repacked at load (repack.h): each 16 code bytes hold 4 elements of every sub-block, so an
// accumulator's int32 lanes (f8_of) each sum one sub-block over the block, and its scale and min apply once a
// block in fp32: no per-sub-block conversion or broadcast (1.3x Q4_K's one-row kernel on Zen 3). Q4_K widens
// 32 bytes at a time (nib64: 3 ops per 64 codes where nib32 took 3 per 32 on AVX-512). Q5_K's fifth bits: bit s
// of qh byte i is lane i's of the 32 codes s (nib32).
template <int s>
inline V fifth_bits(const V& qh) {
  if constexpr (s < 4) return band(slli(qh, 4 - s), 16);
  else if constexpr (s == 4) return band(qh, 16);
  else return band(srli(qh, s - 4), 16);
}

template <int NR, bool Q5>
inline void row_q45kr(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  constexpr int BYTES = Q5 ? 176 : 144, CODES = Q5 ? 48 : 16;
  F8 acc[NR], bias[NR];
  for (int r = 0; r < NR; ++r) acc[r] = f8zero(), bias[r] = f8zero();
  const int16_t* xq = x.q + r0 * x.k;
  const int64_t xb = x.k / 256, xs32 = x.k / 32;
  for (int64_t b = 0; b < nb; ++b, w += BYTES) {
    A ai[NR][2];
    for (int r = 0; r < NR; ++r) ai[r][0] = ai[r][1] = azero();
    if constexpr (Q5) {
      const V qh = u8w(w + 16);
      [&]<int... S>(std::integer_sequence<int, S...>) {
        ([&] {
          const V c = bor(nib32(w + CODES + 16 * S), fifth_bits<S>(qh));
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) ai[r][S & 1] = dot(ai[r][S & 1], c, ld(xq + r * x.k + 256 * b + 32 * S));
        }(), ...);
      }(std::make_integer_sequence<int, 8>{});
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        V lo, hi;
        nib64(w + CODES + 32 * c, lo, hi);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const int16_t* xr = xq + r * x.k + 256 * b + 64 * c;
          ai[r][0] = dot(ai[r][0], lo, ld(xr)), ai[r][1] = dot(ai[r][1], hi, ld(xr + 32));
        }
      }
    }
    const KS ks = k_scales(w + 4);
    const F8 sc = ks_scales(ks), mn = ks_mins(ks);
    const float d = f16_at(w), dmin = f16_at(w + 2);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      acc[r] = f8_fma(f8_of(add(ai[r][0], ai[r][1])), sc, d * x.d[(r0 + r) * xb + b], acc[r]);
      bias[r] = f8_mins(bias[r], mn, -dmin, x.s + (r0 + r) * xs32 + 8 * b);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = f8sum(acc[r] + bias[r]);
}

// Weight bytes prefetched ahead, into L2 (prefetcht1): into L1 (t0) the lines evicted the activation row a long
// row reads with each block (k = 8960: 18 -> 22 GB/s on Zen 4; 1.5B decode 19-20 -> 23-25 tok/s)
constexpr int64_t kAheadBytes = 8192;
constexpr int kAheadLocality = 2;
// Q4_K_R, one activation row against the two weight rows at w and w + rb (y[0], y[1]): each block's activation
// codes are loaded once for both. A long row's codes (k = 8960: 17.5 KB) fall out of L1 as the weights stream
// past, and their L2 reads then paced the kernel.
inline void pair_q4kr(const uint8_t* w, int64_t rb, int64_t nb, const XRows& x, float* y) {
  F8 acc[2] = {f8zero(), f8zero()}, bias[2] = {f8zero(), f8zero()};
  for (int64_t b = 0; b < nb; ++b) {
    A ai[2][2] = {{azero(), azero()}, {azero(), azero()}};
    const int16_t* xr = x.q + 256 * b;
    for (int i = 0; i < 2; ++i)
      for (int l = 0; l < 192; l += 64) __builtin_prefetch(w + i * rb + 144 * b + kAheadBytes + l, 0, kAheadLocality);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const V x0 = ld(xr + 64 * c), x1 = ld(xr + 64 * c + 32);
#pragma GCC unroll 2
      for (int i = 0; i < 2; ++i) {
        V lo, hi;
        nib64(w + i * rb + 144 * b + 16 + 32 * c, lo, hi);
        ai[i][0] = dot(ai[i][0], lo, x0), ai[i][1] = dot(ai[i][1], hi, x1);
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
      const uint8_t* blk = w + i * rb + 144 * b;
      const KS ks = k_scales(blk + 4);
      acc[i] = f8_fma(f8_of(add(ai[i][0], ai[i][1])), ks_scales(ks), f16_at(blk) * x.d[b], acc[i]);
      bias[i] = f8_mins(bias[i], ks_mins(ks), -f16_at(blk + 2), x.s + 8 * b);
    }
  }
  y[0] = f8sum(acc[0] + bias[0]), y[1] = f8sum(acc[1] + bias[1]);
}

// Q6_K repacked at load (repack.h): per quarter q of the block, 32 bytes P give one V of codes (bits 0..5) and,
// with the 16 nibble bytes N, another (N's nibbles, P's bits 6..7 on top); halves g of the block fill two
// accumulators whose lanes sum sub-blocks 8g..8g + 7 (1.6x Q6_K's one-row kernel on Zen 3).
template <int NR>
inline void row_q6kr(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  F8 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = f8zero();
  const int16_t* xq = x.q + r0 * x.k;
  const int64_t xb = x.k / 256;
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    const float d = f16_at(w + 208);
#pragma GCC unroll 2
    for (int g = 0; g < 2; ++g) {
      A ai[NR][2];
      for (int r = 0; r < NR; ++r) ai[r][0] = ai[r][1] = azero();
#pragma GCC unroll 2
      for (int q = 2 * g; q < 2 * g + 2; ++q) {
        const V p = u8w(w + 32 * q);
        const V a = subc(band(p, 63), 32);
        const V c = subc(bor(nib32(w + 128 + 16 * q), band(srli(p, 2), 0x30)), 32);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const int16_t* xr = xq + r * x.k + 256 * b + 64 * q;
          ai[r][0] = dot(ai[r][0], a, ld(xr));
          ai[r][1] = dot(ai[r][1], c, ld(xr + 32));
        }
      }
      const F8 sc = f8_i8(w + 192 + 8 * g);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r] = f8_fma(f8_of(add(ai[r][0], ai[r][1])), sc, d * x.d[(r0 + r) * xb + b], acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = f8sum(acc[r]);
}

// Q6_K: ql[128] qh[64] int8 scales[16] d (formats.h); codes - 32 times signed scales, |product| <= 4096:
// each half-block's int32 sums stay below 2^31, so the halves convert separately.
template <int NR>
inline void row_q6k(const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  F acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = fzero();
  const int16_t* xq = x.q + r0 * x.k;
  const int64_t xb = x.k / 256;
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = f16_at(w + 208);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      A ai[NR][2];
      for (int r = 0; r < NR; ++r) ai[r][0] = ai[r][1] = azero();
      const V qh = u8w(w + 128 + 32 * h);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const V ql = u8w(w + 64 * h + 32 * half);
        // groups k = half (low nibbles) and k = half + 2 (high nibbles) of this half-block
#pragma GCC unroll 2
        for (int hiq = 0; hiq < 2; ++hiq) {
          const int k = half + 2 * hiq, g = 4 * h + k;
          const V hb = band(k < 2 ? slli(qh, 4 - 2 * k) : srli(qh, 2 * k - 4), 0x30);  // bits 2k, 2k+1 at 4, 5
          const V q = bor(hiq ? srli(ql, 4) : band(ql, 15), hb);
          const V c = mul(subc(q, 32), halves(sc[2 * g], sc[2 * g + 1]));
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) ai[r][hiq] = dot(ai[r][hiq], c, ld(xq + r * x.k + 256 * b + 32 * g));
        }
      }
      // each accumulator holds two groups: within int32 (the four of a half would be, too)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r] = fma(add(ai[r][0], ai[r][1]), d * x.d[(r0 + r) * xb + b], acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * ldy] = hsum(acc[r]);
}

template <int NR>
inline void row_any(int type, const uint8_t* w, int64_t nb, const XRows& x, int64_t r0, float* y, int64_t ldy) {
  switch (type) {
    case Q4_0: return row32_of<B4_0, NR>(w, nb, x, r0, y, ldy);
    case Q4_1: return row32_of<B4_1, NR>(w, nb, x, r0, y, ldy);
    case Q5_0: return row32_of<B5_0, NR>(w, nb, x, r0, y, ldy);
    case Q5_1: return row32_of<B5_1, NR>(w, nb, x, r0, y, ldy);
    case Q8_0: return row32_of<B8_0, NR>(w, nb, x, r0, y, ldy);
    case Q4_K:
      if constexpr (NR == 1) return row_q45k_one<false>(w, nb, x, r0, y);
      else return row_q45k<NR, false>(w, nb, x, r0, y, ldy);
    case Q5_K:
      if constexpr (NR == 1) return row_q45k_one<true>(w, nb, x, r0, y);
      else return row_q45k<NR, true>(w, nb, x, r0, y, ldy);
    case Q6_K: return row_q6k<NR>(w, nb, x, r0, y, ldy);
    case Q4_KR: return row_q45kr<NR, false>(w, nb, x, r0, y, ldy);
    case Q5_KR: return row_q45kr<NR, true>(w, nb, x, r0, y, ldy);
    case Q6_KR: return row_q6kr<NR>(w, nb, x, r0, y, ldy);
    default: return;
  }
}

}  // namespace q16

// Activation rows sharing each weight block's decode: four, a row's int32 accumulator one register (AVX-512 and
// AVX2; AVX-VNNI's are register pairs). An ISA may set fewer.
#ifndef GK_Q16_TILE
#define GK_Q16_TILE 4
#endif

// Weight rows [n0, n1) against the m_rows activation rows of x; y is (m_rows, ldy). GK_Q16_TILE activation
// rows share each weight block's decode; 64 at a time stay in L2 while the weight rows stream past.
inline void rows_q16(int type, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const XRows& x,
                     int64_t m_rows, float* y, int64_t ldy) {
  const int64_t nb = row_bytes / block_bytes(type);
  constexpr int64_t MB = 64;
  const uint8_t* end = w + n1 * row_bytes;
  const auto ahead = [&](const uint8_t* wr, int64_t bytes) {
    // the hardware prefetcher alone left cold matrices at 0.7-0.8x the fp32 path's GB/s
    for (const uint8_t* p = wr + q16::kAheadBytes; p < wr + q16::kAheadBytes + bytes && p < end; p += 64)
      __builtin_prefetch(p, 0, q16::kAheadLocality);
  };
  if (m_rows == 1 && type == Q4_KR) {  // decode: weight rows in pairs
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) {
      q16::pair_q4kr(w + n * row_bytes, row_bytes, nb, x, y + n);
    }
    if (n < n1) q16::row_any<1>(type, w + n * row_bytes, nb, x, 0, y + n, ldy);
    return;
  }
  for (int64_t m0 = 0; m0 < m_rows; m0 += MB) {
    const int64_t m1 = m0 + MB < m_rows ? m0 + MB : m_rows;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = w + n * row_bytes;
      ahead(wr, row_bytes);
      int64_t m = m0;
      for (; m + GK_Q16_TILE <= m1; m += GK_Q16_TILE)
        q16::row_any<GK_Q16_TILE>(type, wr, nb, x, m, y + m * ldy + n, ldy);
      switch (m1 - m) {
        case 3: q16::row_any<3>(type, wr, nb, x, m, y + m * ldy + n, ldy); break;
        case 2: q16::row_any<2>(type, wr, nb, x, m, y + m * ldy + n, ldy); break;
        case 1: q16::row_any<1>(type, wr, nb, x, m, y + m * ldy + n, ldy); break;
        default: break;
      }
    }
  }
}

// Row `row` of x (k floats) -> int16 codes with one scale per `group` elements (32, or a K-quant's 256):
// d = max|x| / full, q = round-half-even(x / d); s[j] = d * (sum of the codes of 32-group j). With `order`
// (256-groups), group position p holds the code of its element order[p] (a repacked format's, repack.h).
inline void quantize_q16(const float* x, int64_t k, int group, const uint8_t* order, int64_t row, const XRows& out,
                         int full) {
  int16_t* q = out.q + row * k;
  float* d = out.d + row * (k / group);
  float* s = out.s + row * (k / 32);
  alignas(32) int16_t natural[256];
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    const float amax = q16::amax_of(x + g0, group);
    const float dg = amax / static_cast<float>(full);
    const float id = dg != 0.0f ? 1.0f / dg : 0.0f;
    d[g0 / group] = dg;
    int16_t* codes = order != nullptr ? natural : q + g0;
    for (int64_t j = 0; j < group; j += 32) {
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int v = static_cast<int>(std::nearbyint(x[g0 + j + i] * id));
        codes[j + i] = static_cast<int16_t>(v);
        sum += v;
      }
      s[(g0 + j) / 32] = dg * static_cast<float>(sum);
    }
    if (order != nullptr)
      for (int p = 0; p < 256; ++p) q[g0 + p] = natural[order[p]];
  }
}

}  // namespace GK_ISA
}  // namespace gk
