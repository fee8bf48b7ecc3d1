// The few vector operations the fp32 kernels need, on L float lanes: AVX-512 (16), AVX2 (8), and GCC/Clang
// vector extensions elsewhere (8; NEON on arm64). Intrinsics on x86 because GCC lowers some vector-
// extension conversions (int8 -> int32) to scalar code there.
#pragma once

#include <cstdint>
#include <cstring>

#include "formats.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gk {
namespace GK_ISA {

#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int L = 16;
using VF = __m512;
using VI = __m512i;
inline VI u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI i8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VI band(VI a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
inline VI bor(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI shr(VI a, int s) { return _mm512_srli_epi32(a, s); }
inline VI shl(VI a, int s) { return _mm512_slli_epi32(a, s); }
// v with 16 added in lane j when bit j of `bits` is set (a 5th code bit): one masked OR
inline VI or_bit4(VI v, uint32_t bits) {
  return _mm512_mask_or_epi32(v, static_cast<__mmask16>(bits), v, _mm512_set1_epi32(16));
}
inline VF cvt(VI a) { return _mm512_cvtepi32_ps(a); }
inline VF fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF set1(float v) { return _mm512_set1_ps(v); }
inline VF zero() { return _mm512_setzero_ps(); }
inline VF loadf(const float* p) { return _mm512_loadu_ps(p); }
inline void storef(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline float vsum(VF v) { return _mm512_reduce_add_ps(v); }
// table lookups: lane j = t[idx[j] & 15] (or of (lo, hi) by idx & 31), one permute instead of cvt + fma
#define GK_LUT 1
inline VF lut16(VI idx, VF t) { return _mm512_permutexvar_ps(idx, t); }
inline VF lut32(VI idx, VF lo, VF hi) { return _mm512_permutex2var_ps(lo, idx, hi); }
inline VF iota(float from) {
  return _mm512_add_ps(_mm512_set1_ps(from), _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}
#elif defined(__AVX2__)
constexpr int L = 8;
using VF = __m256;
using VI = __m256i;
inline VI u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI i8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI band(VI a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
inline VI bor(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI shr(VI a, int s) { return _mm256_srli_epi32(a, s); }
inline VI shl(VI a, int s) { return _mm256_slli_epi32(a, s); }
inline VI or_bit4(VI v, uint32_t bits) {
  const VI b = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>((bits & 0xFF) << 4)),
                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return bor(v, band(b, 16));
}
inline VF cvt(VI a) { return _mm256_cvtepi32_ps(a); }
inline VF fmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF set1(float v) { return _mm256_set1_ps(v); }
inline VF zero() { return _mm256_setzero_ps(); }
inline VF loadf(const float* p) { return _mm256_loadu_ps(p); }
inline void storef(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline float vsum(VF v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#else
constexpr int L = 8;
typedef float VF __attribute__((vector_size(32)));
typedef int32_t VI __attribute__((vector_size(32)));
inline VI u8(const uint8_t* p) {
  VI v;
  for (int j = 0; j < L; ++j) v[j] = p[j];
  return v;
}
inline VI i8(const uint8_t* p) {
  VI v;
  for (int j = 0; j < L; ++j) v[j] = static_cast<int8_t>(p[j]);
  return v;
}
inline VI band(VI a, int m) { return a & m; }
inline VI bor(VI a, VI b) { return a | b; }
inline VI shr(VI a, int s) { return a >> s; }  // codes are non-negative
inline VI shl(VI a, int s) { return a << s; }
inline VI or_bit4(VI v, uint32_t bits) {
  for (int j = 0; j < L; ++j) v[j] |= static_cast<int32_t>(((bits >> j) & 1) << 4);
  return v;
}
inline VF cvt(VI a) { return __builtin_convertvector(a, VF); }
inline VF fmadd(VF a, VF b, VF c) { return a * b + c; }
inline VF mul(VF a, VF b) { return a * b; }
inline VF set1(float v) { return VF{} + v; }
inline VF zero() { return VF{}; }
inline VF loadf(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storef(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }
inline float vsum(VF v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
#endif

// The fp16 values at p + i * stride (and at + 2 into hi, unless null) for i < n, as floats.
inline void f16_cols_scalar(const uint8_t* p, int64_t stride, int64_t n, float* lo, float* hi) {
  for (int64_t i = 0; i < n; ++i, p += stride) {
    lo[i] = f16_at(p);
    if (hi != nullptr) hi[i] = f16_at(p + 2);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline void f16_cols(const uint8_t* p, int64_t stride, int64_t n, float* lo, float* hi) {
  const __m512i off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int>(stride)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // one gather takes 16 blocks' first 4 bytes: both fp16 fields
    const __m512i v = _mm512_i32gather_epi32(off, p + i * stride, 1);
    _mm512_storeu_ps(lo + i, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
    if (hi != nullptr) _mm512_storeu_ps(hi + i, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
  }
  f16_cols_scalar(p + i * stride, stride, n - i, lo + i, hi != nullptr ? hi + i : nullptr);
}

// A K-quant block's 8 (scale, min) pairs (formats.h k_scale_min) in one pass over 16 lanes: lane j < 8
// is scale j, lane 8 + j min j; each is the low bits of one byte, with bits 4..5 from another for j >= 4.
inline void k_scale_min_vec(const uint8_t* s, float d, float dmin, float* a, float* b) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  const __m512i lo = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11), bytes);
  const __m512i hi = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7), bytes);
  const __m512i low_bits = _mm512_and_si512(
      _mm512_srlv_epi32(lo, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4)),
      _mm512_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  const __m512i top = _mm512_maskz_and_epi32(0xF0F0, _mm512_srli_epi32(hi, 2), _mm512_set1_epi32(0x30));
  const __m512 scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d), _mm512_set1_ps(-dmin));
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_or_si512(low_bits, top)), scale);
  _mm256_storeu_ps(a, _mm512_castps512_ps256(v));
  _mm256_storeu_ps(b, _mm512_extractf32x8_ps(v, 1));
}
#else
inline void f16_cols(const uint8_t* p, int64_t stride, int64_t n, float* lo, float* hi) {
  f16_cols_scalar(p, stride, n, lo, hi);
}
inline void k_scale_min_vec(const uint8_t* s, float d, float dmin, float* a, float* b) { k_scale_min(s, d, dmin, a, b); }
#endif

// Bit `bit` of each of 32 bytes, as a 32-bit mask (element i -> bit i).
inline uint32_t bitplane(const uint8_t* q, int bit) {
#if defined(__AVX2__)
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(v, 7 - bit)));
#else
  uint32_t out = 0;
  for (int i = 0; i < 32; ++i) out |= static_cast<uint32_t>((q[i] >> bit) & 1) << i;
  return out;
#endif
}

}  // namespace GK_ISA
}  // namespace gk
