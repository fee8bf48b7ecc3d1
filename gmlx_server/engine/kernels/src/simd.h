// The one SIMD header. Each translation unit is compiled for one instruction set (the per-ISA files
// isa_*.cpp get their target flags from CMakeLists.txt; dispatch.cpp picks one at run time by cpuid): this
// header turns the compiler's flags into GK_* macros, includes the intrinsics headers, and holds the vector
// kits the kernels are written in. Nothing else includes <immintrin.h> or <arm_neon.h> or tests __AVX2__.
//   L-lane floats (VF/VI): AVX-512 (16), AVX2 (8), GCC/Clang vector extensions elsewhere (8; NEON on arm64).
//   Intrinsics on x86 because GCC lowers some vector-extension conversions (int8 -> int32) to scalar code.
//   v16: 16 floats as a vector extension (one zmm, two ymm or four NEON quads) and its exp2, for attention
//   and the activations.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#if defined(__x86_64__) || defined(_M_X64)
#define GK_X86 1
#include <immintrin.h>
#if defined(__AVX2__) && defined(__FMA__)
#define GK_AVX2 1
#endif
#if defined(__F16C__)
#define GK_F16C 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define GK_AVX512 1
#endif
#if defined(GK_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define GK_AVX512VNNI 1
#endif
#if defined(__AVXVNNI__) && !defined(GK_AVX512VNNI)
#define GK_AVXVNNI 1  // vpdpbusd/vpdpwssd on 256 bits, VEX-encoded
#endif
#elif defined(__aarch64__) || defined(_M_ARM64)
#define GK_ARM64 1
#include <arm_neon.h>
#define GK_NEON 1
#if defined(__ARM_FEATURE_DOTPROD)
#define GK_NEON_DOT 1
#endif
#endif

#ifndef GK_ISA
#define GK_ISA base  // the drivers' copy; each isa_*.cpp has its own (own target flags, no ODR clash)
#endif

namespace gk {
namespace GK_ISA {

// fp16 -> fp32: F16C's conversion, arm64's __fp16, or by the bits.
inline float h2f(uint16_t h) {
#if defined(GK_F16C)
  return _cvtsh_ss(h);
#elif defined(GK_ARM64)
  __fp16 f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp == 0) {
    float f = static_cast<float>(man) * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
#endif
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h2f(h);
}

// the fp16 pair at p, p + 2 (a block's scale and min) in one conversion
inline void f16_pair(const uint8_t* p, float& a, float& b) {
#if defined(GK_F16C)
  uint32_t v;
  std::memcpy(&v, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
  a = _mm_cvtss_f32(f);
  b = _mm_cvtss_f32(_mm_movehdup_ps(f));
#else
  a = f16_at(p);
  b = f16_at(p + 2);
#endif
}

// A spin-wait hint for the thread pool's hand-offs.
inline void cpu_relax() {
#if defined(GK_X86)
  _mm_pause();
#elif defined(GK_ARM64)
  asm volatile("yield");
#endif
}

#if defined(GK_AVX2)
// The sum of 8 floats (every 256-bit kit's horizontal add).
inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

#if defined(GK_AVX512)
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
#elif defined(GK_AVX2)
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
inline float vsum(VF v) { return hsum256(v); }
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

#if defined(GK_AVX512)
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
#define GK_SCALE_MIN_VEC 1  // floats.h takes k_scale_min_vec over formats.h's scalar k_scale_min
#elif defined(GK_AVX2) && defined(GK_F16C)
// The low 16 bits of each 32-bit lane, in order: bytes 0,1,4,5,... of each 128-bit half, then the halves'
// low quadwords side by side.
inline __m128i low16(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08));
}

// 8 blocks at a time in registers: a scalar conversion per field stored its floats one by one, and the vector
// load that read them back waited on store forwarding (a tenth of a Q4_1 row's time on an AMD Zen 3)
inline void f16_cols(const uint8_t* p, int64_t stride, int64_t n, float* lo, float* hi) {
  const __m256i off = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(static_cast<int>(stride)));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // one gather takes 8 blocks' first 4 bytes: both fp16 fields
    const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p + i * stride), off, 1);
    _mm256_storeu_ps(lo + i, _mm256_cvtph_ps(low16(v)));
    if (hi != nullptr) _mm256_storeu_ps(hi + i, _mm256_cvtph_ps(low16(_mm256_srli_epi32(v, 16))));
  }
  f16_cols_scalar(p + i * stride, stride, n - i, lo + i, hi != nullptr ? hi + i : nullptr);
}
#else
inline void f16_cols(const uint8_t* p, int64_t stride, int64_t n, float* lo, float* hi) {
  f16_cols_scalar(p, stride, n, lo, hi);
}
#endif

// Bit `bit` of each of 32 bytes, as a 32-bit mask (element i -> bit i).
inline uint32_t bitplane(const uint8_t* q, int bit) {
#if defined(GK_AVX2)
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
