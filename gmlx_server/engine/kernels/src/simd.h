// The few vector operations the fp32 kernels need, on L float lanes: AVX-512 (16), AVX2 (8), and GCC/Clang
// vector extensions elsewhere (8; NEON on arm64). Intrinsics on x86 because GCC lowers some vector-
// extension conversions (int8 -> int32) to scalar code there.
#pragma once

#include <cstdint>
#include <cstring>

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
// lane j: 16 when bit j of `bits` is set (a 5th code bit), else 0
inline VI bit4(uint32_t bits) { return _mm512_maskz_mov_epi32(static_cast<__mmask16>(bits), _mm512_set1_epi32(16)); }
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
inline VI bit4(uint32_t bits) {
  const VI v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>((bits & 0xFF) << 4)),
                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return band(v, 16);
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
inline VI bit4(uint32_t bits) {
  VI v;
  for (int j = 0; j < L; ++j) v[j] = static_cast<int32_t>(((bits >> j) & 1) << 4);
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
